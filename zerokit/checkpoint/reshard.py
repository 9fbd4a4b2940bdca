"""From any checkpoint to every parameter whole: the bridge between a layout at N ranks and one at M.

Lifecycle: :func:`full_state` reads the manifest and every shard file (checksums first),
then, segment by segment of the *saved* layout, concatenates the ranks' slices in rank
order into the full padded flat tensor — the parameter (its fp32 master where there was
one), and each per-element optimizer state — and cuts it into parameters by the
manifest's offsets; scalar states (Adam's ``step``) come from the first writer. Frozen
parameters and buffers come from rank 0's file. :func:`~.layout.apply_full` then cuts
the result again in the *target's* layout, so N→M and stage s→s′ are one path.
:func:`check_model` compares the manifest with a model first, naming the parameter
that differs. :func:`export_full_state_dict` is the plain ``{name: tensor}`` view of it.
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from .files import CheckpointError, read_manifest, read_shard
from .layout import FullState, shard_range


def full_state(directory, manifest: dict = None) -> Tuple[FullState, dict, list]:
    """(FullState, manifest, the shard files' contents by rank)."""
    manifest = manifest or read_manifest(directory)
    world = manifest["world_size"]
    shards = [read_shard(directory, manifest, r) for r in range(world)]
    full = FullState()
    for i, segment in enumerate(manifest["segments"]):
        writers = [r for r in range(world) if shard_range(segment, r, world) is not None]
        parts = [shards[r]["segments"].get(str(i)) for r in writers]
        missing = [r for r, part in zip(writers, parts) if part is None]
        if missing:
            raise CheckpointError(f"segment {i} ({segment['params'][0]['name']!r}…): rank {missing[0]}'s file holds "
                                  f"no part of it")
        source = "master" if all("master" in p for p in parts) else "tensor"
        value = torch.cat([p[source] for p in parts])
        if value.numel() != segment["padded"]:
            raise CheckpointError(f"segment {i}: the files hold {value.numel()} elements, the manifest says "
                                  f"{segment['padded']}")
        states: Dict[str, torch.Tensor] = {}
        scalars: Dict[str, torch.Tensor] = {}
        for key, first in parts[0]["state"].items():
            if first.dim() > 0 and first.numel() == parts[0]["tensor"].numel():
                states[key] = torch.cat([p["state"][key] for p in parts])
            else:
                scalars[key] = first
        for entry in segment["params"]:
            name, a, b = entry["name"], entry["offset"], entry["offset"] + entry["numel"]
            full.params[name] = value[a:b].clone()
            full.shapes[name] = list(entry["shape"])
            full.states[name] = {**{k: t[a:b].clone() for k, t in states.items()},
                                 **{k: t.clone() for k, t in scalars.items()}}
    full.frozen = dict(shards[0].get("frozen", {}))
    full.buffers = dict(shards[0].get("buffers", {}))
    return full, manifest, shards


def check_model(manifest: dict, model: torch.nn.Module, where: str) -> None:
    """The model must have the checkpoint's parameters, names and shapes, trainable where they were."""
    saved = {e["name"]: e["shape"] for s in manifest["segments"] for e in s["params"]}
    saved.update(manifest.get("frozen", {}))
    mine = {n: list(p.shape) for n, p in model.named_parameters()}
    missing, unexpected = sorted(set(mine) - set(saved)), sorted(set(saved) - set(mine))
    if missing or unexpected:
        raise CheckpointError(f"{where} was saved for another model: parameters missing from it {missing[:5]}, "
                              f"not in the model {unexpected[:5]}")
    for name, shape in mine.items():
        if list(saved[name]) != shape:
            raise CheckpointError(f"{where} was saved for another model: parameter {name!r} has shape "
                                  f"{tuple(saved[name])} there, {tuple(shape)} in the model")
    for name, p in model.named_parameters():
        if p.requires_grad == (name in manifest.get("frozen", {})):
            was = "frozen" if name in manifest.get("frozen", {}) else "trainable"
            raise CheckpointError(f"{where}: parameter {name!r} was {was} when saved; the model's requires_grad is "
                                  f"{p.requires_grad}")


def export_full_state_dict(directory, optimizer_states: bool = False):
    """A plain ``{name: tensor}`` from any checkpoint, no process group needed: what ``model.state_dict()``
    holds (parameters in the saved model dtype, shaped, a tied one under each of its names; frozen ones; buffers).
    With ``optimizer_states=True`` also ``{name: {key: tensor}}`` (the fp32 ``master`` among them in
    bf16-mixed), as a pair."""
    full, manifest, _ = full_state(directory)
    dtype = getattr(torch, manifest["dtype"])
    out = {name: value.view(full.shapes[name]).to(dtype) for name, value in full.params.items()}
    out.update(full.frozen)
    out.update(full.buffers)
    for alias, name in manifest.get("tied", {}).items():  # a tied weight under each of its names, as state_dict()
        out[alias] = out[name]
    if not optimizer_states:
        return out
    states = {}
    for name, state in full.states.items():
        shape = full.shapes[name]
        states[name] = {k: (t.view(shape) if t.dim() > 0 else t) for k, t in state.items()}
        if manifest["dtype"] != "float32":
            states[name]["master"] = full.params[name].view(shape).float()
    return out, states
