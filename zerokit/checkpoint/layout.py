"""The layout of what a strategy's optimizer steps, and moving a full per-parameter state in and out of it.

Every strategy steps a list of tensors (``strategy.optimizer.tensors``): whole parameters
(``ddp``), one flat shard per unit (``zero1``/``zero2``: views into the unit's full buffer;
``zero3``: the unit's shard at rest, plus the persistent parameters held whole). Lifecycle:

1. :func:`segments` describes each stepped tensor as a *segment*: a 1-D space of
   ``padded`` elements holding parameters at offsets (``FlatUnit``'s layout; a whole
   parameter is a segment of one), sharded over the N ranks in equal contiguous slices or
   held whole (written by rank 0 alone). This is the manifest's unit layout.
2. :func:`local_state` is this rank's part of each segment it writes: the tensor (model
   dtype), the fp32 master in bf16-mixed, and the optimizer state of that master
   (per-element states such as Adam's ``exp_avg`` flattened; scalars such as ``step`` as
   they are).
3. :func:`apply_full` goes the other way: given every parameter whole (``FullState``, built
   from any checkpoint by :mod:`.reshard`), it fills this rank's segments — model tensor,
   master, optimizer state — in the target's layout, padding with zeros; under ZeRO-1/2
   and DDP every parameter is also written whole (the replicated full buffers). Each state
   goes where torch's ``Optimizer.load_state_dict`` would put it (:func:`place_state`):
   ``step`` stays on the host unless the optimizer is fused or capturable, whose kernels
   read it on the parameter's device.
"""
from __future__ import annotations

from typing import Dict, List

import torch


def names_of(model: torch.nn.Module) -> Dict[torch.nn.Parameter, str]:
    return {p: n for n, p in model.named_parameters()}


def _flat_units(strategy):
    """(FlatUnit, sharded) per stepped tensor, in the optimizer's order; None for DDP (whole parameters)."""
    units = getattr(strategy, "units", None)
    if units is None:
        return None
    if strategy.stage == 3:
        flats = [(u.flat, True) for u in units]
        if strategy.persistent is not None:
            flats.append((strategy.persistent, False))
        return flats
    return [(u, True) for u in units]


def segments(strategy, name_of=None) -> List[dict]:
    """The layout of every stepped tensor (see the module docstring), JSON-ready; ``name_of(param, local_name)``
    gives the name to record (the whole model's, :mod:`.naming`), the module's own name by default."""
    name_of = name_of or (lambda p, local: local)
    flats = _flat_units(strategy)
    if flats is None:
        names = names_of(strategy.model)
        return [{"params": [{"name": name_of(p, names[p]), "shape": list(p.shape), "offset": 0, "numel": p.numel()}],
                 "numel": p.numel(), "padded": p.numel(), "sharded": False} for p in strategy.optimizer.tensors]
    out = []
    for flat, sharded in flats:
        params = [{"name": name_of(p, n), "shape": list(p.shape), "offset": o, "numel": p.numel()}
                  for n, p, o in zip(flat.names, flat.params, flat.offsets)]
        out.append({"params": params, "numel": flat.numel, "padded": flat.padded_numel, "sharded": sharded})
    return out


def shard_range(segment: dict, rank: int, world: int):
    """[lo, hi) of ``segment`` that ``rank`` holds, or None when it writes none of it."""
    if not segment["sharded"]:
        return (0, segment["padded"]) if rank == 0 else None
    size = segment["padded"] // world
    return rank * size, (rank + 1) * size


def _optimizer(strategy):
    optimizer = getattr(strategy, "optimizer", None)
    if optimizer is None or not hasattr(optimizer, "tensors"):
        raise ValueError(f"zerokit.checkpoint: strategy {getattr(strategy, 'name', strategy)!r} has no zerokit "
                         f"optimizer (tensors, masters); supported: ddp, ddp-naive, zero1, zero2, zero3, tp, pp")
    if getattr(optimizer, "pieces", None) is not None:
        raise ValueError("zerokit.checkpoint: an optimizer whose param groups have their own hyperparameters is "
                         "not checkpointed yet; save engine.full_state_dict() (the weights) instead")
    return optimizer


def optimizer_name(strategy) -> str:
    return type(_optimizer(strategy).optimizer).__name__


@torch.no_grad()
def local_state(strategy) -> Dict[str, dict]:
    """This rank's part of each segment it writes: {index: {"tensor", "master"?, "state"}} (CPU copies)."""
    optimizer = _optimizer(strategy)
    layout = segments(strategy)
    out = {}
    for i, (segment, tensor, master) in enumerate(zip(layout, optimizer.tensors, optimizer.masters)):
        if shard_range(segment, strategy.rank, strategy.world) is None:
            continue
        entry = {"tensor": tensor.detach().reshape(-1).cpu().clone()}
        if master.data_ptr() != tensor.data_ptr() or master.dtype != tensor.dtype:
            entry["master"] = master.detach().reshape(-1).float().cpu().clone()
        state = {}
        for key, value in optimizer.optimizer.state.get(master, {}).items():
            if torch.is_tensor(value):
                per_element = value.dim() > 0 and value.numel() == master.numel()
                state[key] = (value.reshape(-1) if per_element else value).detach().cpu().clone()
        entry["state"] = state
        out[str(i)] = entry
    return out


def group_of(optimizer: torch.optim.Optimizer, master: torch.Tensor) -> dict:
    """The param group of ``optimizer`` that steps ``master`` ({} when none does)."""
    return next((g for g in optimizer.param_groups if any(p is master for p in g["params"])), {})


def place_state(master: torch.Tensor, key: str, value, group: dict):
    """A loaded optimizer state ``value`` (read on the host) placed as torch's ``Optimizer.load_state_dict`` places
    it: ``step`` stays where it is, unless the group is ``fused`` or ``capturable`` — then fp32 on the master's
    device (a fused CUDA AdamW refuses a host ``step``); any other state goes to the master's device, floating
    ones in the master's dtype."""
    if not torch.is_tensor(value):
        return value
    if key == "step":
        if group.get("fused") or group.get("capturable"):
            return value.to(dtype=torch.float32, device=master.device)
        return value
    if value.is_floating_point() and master.is_floating_point():
        return value.to(dtype=master.dtype, device=master.device)
    return value.to(device=master.device)


class FullState:
    """Every trainable parameter whole, 1-D: ``param`` (fp32 or better: the master where there was one),
    ``state`` {key: flat per-element tensor or scalar}; ``frozen`` and ``buffers`` {name: tensor}."""

    def __init__(self):
        self.params: Dict[str, torch.Tensor] = {}
        self.states: Dict[str, Dict[str, torch.Tensor]] = {}
        self.shapes: Dict[str, list] = {}
        self.frozen: Dict[str, torch.Tensor] = {}
        self.buffers: Dict[str, torch.Tensor] = {}


@torch.no_grad()
def apply_full(strategy, full: FullState) -> None:
    """Fill ``strategy``'s parameters, masters and optimizer states from ``full`` in its own layout."""
    optimizer = _optimizer(strategy)
    model = strategy.model
    layout = segments(strategy)
    inner = optimizer.optimizer
    for i, (segment, tensor, master) in enumerate(zip(layout, optimizer.tensors, optimizer.masters)):
        padded = segment["padded"]
        value = torch.zeros(padded, dtype=torch.float32)  # host: staged, then copied to the shard
        keys: Dict[str, torch.Tensor] = {}
        scalars: Dict[str, torch.Tensor] = {}
        for entry in segment["params"]:
            name, a, b = entry["name"], entry["offset"], entry["offset"] + entry["numel"]
            value[a:b] = full.params[name].float()
            for key, s in full.states.get(name, {}).items():
                if s.dim() > 0 and s.numel() == entry["numel"]:
                    if key not in keys:
                        keys[key] = torch.zeros(padded, dtype=s.dtype)  # host: staged
                    keys[key][a:b] = s
                else:
                    scalars.setdefault(key, s)
        lo, hi = shard_range(segment, strategy.rank, strategy.world) if segment["sharded"] else (0, padded)
        tensor.view(-1).copy_(value[lo:hi].to(tensor.dtype))
        if master.data_ptr() != tensor.data_ptr() or master.dtype != tensor.dtype:
            master.view(-1).copy_(value[lo:hi])
        inner.state.pop(master, None)
        if keys or scalars:
            group = group_of(inner, master)
            state = {k: place_state(master, k, t[lo:hi].clone().view_as(master), group) for k, t in keys.items()}
            state.update({k: place_state(master, k, t.clone(), group) for k, t in scalars.items()})
            inner.state[master] = state
    by_name = dict(model.named_parameters())
    if strategy.stage == 3:
        for unit in strategy.units:  # a unit at rest holds its shard alone; a gathered one holds every parameter
            if unit.flat.is_materialized:
                for name, p in zip(unit.flat.names, unit.flat.params):
                    p.copy_(full.params[name].view(full.shapes[name]).to(p.dtype))
    else:  # DDP and ZeRO-1/2: the full buffers are replicated, every parameter whole on every rank
        for name, value in full.params.items():
            by_name[name].copy_(value.view(full.shapes[name]).to(by_name[name].dtype))
    for name, value in full.frozen.items():
        by_name[name].copy_(value)
    buffers = dict(model.named_buffers())
    for name, value in full.buffers.items():
        if name in buffers:
            buffers[name].copy_(value)
