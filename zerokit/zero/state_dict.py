"""Whole parameters in and out of any strategy: gather a full state dict on rank 0, load one into any stage.

``full_state_dict(strategy)`` is a collective: with ZeRO-3 every rank takes part in
gathering each unit (phase "setup", so the training ledger is unchanged); rank 0 gets
the model's ``state_dict()`` (tied names and persistent buffers included) on the CPU in
the model's dtype, the other ranks ``None``.
``load_full_state_dict(strategy, state_dict)`` is a collective too: rank 0's dict is
broadcast (the others may pass ``None``), and each rank keeps what it holds under its
stage — whole parameters (DDP, ZeRO-1/2), or only its shard of each unit (ZeRO-3) —
and refreshes the fp32 master copies. Optimizer states (Adam's m, v) are not part of
it: a loaded model starts them afresh.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Dict, Optional

import torch
import torch.distributed as dist

from ..runtime import comm


def _is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def full_state_dict(strategy) -> Optional[Dict[str, torch.Tensor]]:
    """The unwrapped model's ``state_dict()``, whole, on rank 0 (CPU, the model's dtype) — a tied parameter under each
    of its names, the persistent buffers, no non-persistent one — so ``model.load_state_dict(…, strict=True)``
    takes it; None on the other ranks."""
    gathered = getattr(strategy, "gathered", None)
    with comm.phase("setup"), (gathered() if gathered is not None else nullcontext()):
        state = {n: t.detach().cpu().clone() for n, t in strategy.model.state_dict().items()}
    return state if strategy.ctx.rank == 0 else None


def _broadcast_state(strategy, state_dict) -> Dict[str, torch.Tensor]:
    """Rank 0's tensors on every rank, shaped and typed like the model's parameters and persistent buffers. Rank 0's
    dict is the model's ``state_dict()`` layout: every parameter (a tied one under any of its names), persistent
    buffers optional."""
    model = strategy.model
    out = {}
    if strategy.ctx.rank == 0:
        names = {n for n, _ in model.named_parameters()}
        if state_dict is None:
            raise ValueError("load_full_state_dict: rank 0 must pass the state dict")
        known = set(model.state_dict()) | names
        missing, unexpected = sorted(names - set(state_dict)), sorted(set(state_dict) - known)
        if missing or unexpected:
            raise ValueError(f"load_full_state_dict: missing {missing[:5]}, unexpected {unexpected[:5]}")
    group = strategy.group
    for name, p in model.named_parameters():
        t = torch.empty(p.shape, dtype=p.dtype, device=strategy.ctx.device)
        if strategy.ctx.rank == 0:
            source = state_dict[name]
            if tuple(source.shape) != tuple(p.shape):
                raise ValueError(f"load_full_state_dict: {name!r} has shape {tuple(source.shape)}, the model "
                                 f"{tuple(p.shape)}")
            t.copy_(source)
        if _is_distributed():
            with comm.phase("setup"):
                comm.broadcast(t, src=0, group=group, tag=f"load {name}")
        out[name] = t
    return out


@torch.no_grad()
def load_full_state_dict(strategy, state_dict: Optional[Dict[str, torch.Tensor]]) -> None:
    """Load whole parameters (rank 0's) into ``strategy``, whatever its stage; a collective."""
    tensors = _broadcast_state(strategy, state_dict)
    names = {p: n for n, p in strategy.model.named_parameters()}
    units = getattr(strategy, "units", None)
    if units is not None and strategy.stage == 3:
        for unit in units:
            flat = torch.zeros(unit.flat.padded_numel, dtype=unit.shard.dtype, device=unit.flat.device)
            for p, view in zip(unit.flat.params, unit.flat.views(flat)):
                view.copy_(tensors[names[p]])
            unit.shard.copy_(unit.flat.shard(flat))
            if unit.flat.is_materialized:
                unit.flat.data.copy_(flat)
        if strategy.persistent is not None:
            for p in strategy.persistent.params:
                p.copy_(tensors[names[p]])
    else:
        for p, name in names.items():
            p.copy_(tensors[name])  # ZeRO-1/2: a view into its unit, whose shard the optimizer steps
    optimizer = getattr(strategy, "optimizer", None)
    if optimizer is not None and getattr(optimizer, "mixed", False):
        for tensor, master in zip(optimizer.tensors, optimizer.masters):
            master.copy_(tensor.float())
