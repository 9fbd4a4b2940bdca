"""From any checkpoint to every parameter whole: the bridge between one layout (dp×tp×pp, ZeRO stage) and another.

A checkpoint of a mesh (pp, dp, tp) holds one *replica* per (pp, tp) coordinate: the
parameters of one pipeline rank's stages, cut to one tensor-parallel slice, laid out by
the data-parallel strategy over the dp ranks of that replica (whole under DDP, flat
shards under ZeRO). Lifecycle of :func:`full_state`:

1. the manifest is read and every shard file verified and loaded (:mod:`.files`);
2. per replica, segment by segment of the *saved* layout, the dp ranks' slices are
   concatenated in dp order into the full padded flat tensor — the parameter (its fp32
   master where there was one) and each per-element optimizer state — and cut into
   parameters by the manifest's offsets (scalar states such as Adam's ``step`` from the
   first writer): every parameter of the replica whole *within its tensor-parallel slice*;
3. across ``tp`` a sharded parameter's slices (and its per-element states) are put back
   together along the manifest's shard dimension, block by block for packed q/k/v;
   across ``pp`` a parameter comes from the first pipeline rank that holds it, so a
   weight tied between the first and the last stage comes out as one tensor.

:func:`~.naming.localize` and :func:`~.layout.apply_full` then cut the result in the
*target's* layout, so every change of layout is one path. :func:`check_model` compares
a manifest with a model first, naming the parameter that differs.
:func:`export_full_state_dict` is the plain ``{name: tensor}`` view of it.
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from ..tensor_parallel.sharding import Shard, unshard_tensor
from .files import CheckpointError, read_manifest, read_shard
from .layout import FullState, shard_range


def _replica(segments: list, parts_by_dp: list, dp: int, where: str) -> FullState:
    """One replica's parameters whole within its tensor-parallel slice (step 2 of the module docstring)."""
    out = FullState()
    for i, segment in enumerate(segments):
        writers = [d for d in range(dp) if shard_range(segment, d, dp) is not None]
        parts = [parts_by_dp[d]["segments"].get(str(i)) for d in writers]
        missing = [d for d, part in zip(writers, parts) if part is None]
        if missing:
            raise CheckpointError(f"{where} segment {i} ({segment['params'][0]['name']!r}…): dp rank {missing[0]}'s "
                                  f"file holds no part of it")
        source = "master" if all("master" in p for p in parts) else "tensor"
        value = torch.cat([p[source] for p in parts])
        if value.numel() != segment["padded"]:
            raise CheckpointError(f"{where} segment {i}: the files hold {value.numel()} elements, the manifest says "
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
            out.params[name] = value[a:b].clone()
            out.shapes[name] = list(entry["shape"])
            out.states[name] = {**{k: t[a:b].clone() for k, t in states.items()},
                                **{k: t.clone() for k, t in scalars.items()}}
    out.frozen = dict(parts_by_dp[0].get("frozen", {}))
    out.buffers = dict(parts_by_dp[0].get("buffers", {}))
    return out


def _join(slices: list, shape: list, spec) -> torch.Tensor:
    """The whole flat tensor from its tensor-parallel slices (flat, in tp order)."""
    if spec is None or len(slices) == 1:
        return slices[0]

    local = list(shape)
    local[spec["dim"]] //= len(slices)
    stacked = torch.stack([s.view(local) for s in slices])
    return unshard_tensor(stacked, Shard(spec["dim"], spec["blocks"])).reshape(-1)


def full_state(directory, manifest: dict = None) -> Tuple[FullState, dict, list]:
    """(FullState under the whole model's names and shapes, manifest, the shard files' contents by global rank)."""
    manifest = manifest or read_manifest(directory)
    mesh, world = manifest["mesh"], manifest["world_size"]
    pp, dp, tp = mesh["pp"], mesh["dp"], mesh["tp"]
    shards = [read_shard(directory, manifest, r) for r in range(world)]
    replicas = {}
    for replica in manifest["replicas"]:
        i, j = replica["pp"], replica["tp"]
        ranks = [(i * dp + d) * tp + j for d in range(dp)]
        replicas[i, j] = _replica(replica["segments"], [shards[r] for r in ranks], dp, f"pp={i} tp={j}")
    full = FullState()
    for name, info in manifest["params"].items():
        holder = next((i for i in range(pp) if name in replicas[i, 0].params or name in replicas[i, 0].frozen), None)
        if holder is None:
            raise CheckpointError(f"parameter {name!r} is in the manifest but in no replica's files")
        parts = [replicas[holder, j] for j in range(tp)]
        spec, shape = info["shard"], info["shape"]
        full.shapes[name] = list(shape)
        if not info["trainable"]:
            full.frozen[name] = _join([p.frozen[name].reshape(-1) for p in parts], shape, spec).view(shape)
            continue
        full.params[name] = _join([p.params[name] for p in parts], shape, spec)
        numel = full.params[name].numel()
        full.states[name] = {}
        for key, first in parts[0].states[name].items():
            per_element = first.dim() > 0 and first.numel() * (tp if spec else 1) == numel
            full.states[name][key] = (_join([p.states[name][key] for p in parts], shape, spec) if per_element
                                      else first)
    for i in range(pp):
        for name, value in replicas[i, 0].buffers.items():
            full.buffers.setdefault(name, value)
    return full, manifest, shards


def check_model(manifest: dict, params: Dict[str, dict], where: str) -> None:
    """The model (``params``: :attr:`.naming.Naming.params`, the whole model's) must have the checkpoint's
    parameters, names and full shapes, trainable where they were."""
    saved = manifest["params"]
    missing, unexpected = sorted(set(params) - set(saved)), sorted(set(saved) - set(params))
    if missing or unexpected:
        raise CheckpointError(f"{where} was saved for another model: parameters missing from it {missing[:5]}, "
                              f"not in the model {unexpected[:5]}")
    for name, info in params.items():
        if list(saved[name]["shape"]) != list(info["shape"]):
            raise CheckpointError(f"{where} was saved for another model: parameter {name!r} has shape "
                                  f"{tuple(saved[name]['shape'])} there, {tuple(info['shape'])} in the model")
        if saved[name]["trainable"] != info["trainable"]:
            was = "trainable" if saved[name]["trainable"] else "frozen"
            raise CheckpointError(f"{where}: parameter {name!r} was {was} when saved; the model's requires_grad is "
                                  f"{info['trainable']}")


def export_full_state_dict(directory, optimizer_states: bool = False):
    """A plain ``{name: tensor}`` from any checkpoint of any layout, no process group needed: what the unsharded
    model's ``state_dict()`` holds (parameters in the saved model dtype, shaped, a tied one under each of its
    names; frozen ones; buffers). With ``optimizer_states=True`` also ``{name: {key: tensor}}`` (the fp32
    ``master`` among them in bf16-mixed), as a pair."""
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
