"""Replica check: do the ranks of a data-parallel group still hold the same model?

A bug that makes replicas differ raises nothing: ranks that built their models from
different seeds and never broadcast, an optimizer step taken on some ranks only, a
gradient clipped on rank 0 only — each rank trains its own model, the losses drift,
and no collective notices, because every all-reduce still has the right size.

Lifecycle of :func:`check_replicas` (a collective: every rank of the group calls it,
at the same point, e.g. every k steps or once after the first step): each rank
checksums its parameters (two float64 numbers per tensor, its sum and a
position-weighted sum, :func:`parameter_checksums`), the
ranks all-gather them (phase ``setup``, tagged ``replica check``) and, if any rank's
differ from the group's first rank, every rank raises :class:`ReplicasDiverged`
naming that rank, the first parameter that differs, the two checksums and the step.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from . import comm
from .context import backend_device

__all__ = ["check_replicas", "ReplicasDiverged"]


def parameter_checksums(model: torch.nn.Module, experts: bool = False) -> torch.Tensor:
    """Two float64 numbers per parameter tensor: its sum, and a position-weighted sum.

    The weighted sum catches permuted values that a plain sum misses. Ranks holding the
    same bits compute the same checksums exactly. ``experts``: the expert-parallel experts'
    parameters (marked ``_zerokit_expert``) instead of the rest — ranks of one ep group hold
    different experts, so those are checked over the ranks that hold the same ones.
    """
    sums = []
    with torch.no_grad():
        for p in model.parameters():
            if getattr(p, "_zerokit_expert", False) != experts:
                continue
            x = p.detach().reshape(-1).to(torch.float64)
            weights = torch.linspace(1.0, 2.0, x.numel(), dtype=torch.float64, device=x.device)
            sums.append(torch.stack([x.sum(), (x * weights).sum()]))
    if not sums:
        return torch.zeros(0, dtype=torch.float64)  # host: no parameters; check_replicas_match moves them to the device
    return torch.cat(sums).cpu()


class ReplicasDiverged(ValueError):
    """The ranks of a data-parallel group hold different parameters. ``rank`` is the first that differs from the
    group's first rank, ``parameter`` the first parameter that does."""

    def __init__(self, message: str, rank: int, parameter: str):
        super().__init__(message)
        self.rank, self.parameter = rank, parameter

    def __reduce__(self):
        return type(self), (str(self), self.rank, self.parameter)


def check_replicas(module: torch.nn.Module, group=None, step: Optional[int] = None) -> None:
    """Raise :class:`ReplicasDiverged` on every rank when any rank's parameters differ from the group's first rank.

    ``group``: the data-parallel group (None: the whole world). ``step`` only goes into the message.
    Parameters that differ on purpose (tensor-parallel shards) belong to another group: check the
    data-parallel one.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"check_replicas(module=…) needs an nn.Module, got {type(module).__name__}")
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return
    n = dist.get_world_size(group)
    mine = parameter_checksums(module)
    device = backend_device(str(dist.get_backend(group)))  # NCCL: this rank's GPU, wherever the model is
    mine = mine.to(device)
    gathered = torch.empty(n * mine.numel(), dtype=torch.float64, device=device)
    with comm.phase("setup"):
        comm.all_gather(gathered, mine, group=group, tag="replica check")
    rows = gathered.cpu().view(n, -1)
    members = dist.get_process_group_ranks(group) if group is not None else list(range(n))
    names = [name for name, _ in module.named_parameters()]
    for i in range(1, n):
        same = (rows[i] == rows[0]) | (rows[i].isnan() & rows[0].isnan())
        if bool(same.all()):
            continue
        first = int((~same).nonzero()[0])
        name = names[first // 2]
        differing = [members[j] for j in range(1, n) if not bool(((rows[j] == rows[0]) | (rows[j].isnan()
                                                                                         & rows[0].isnan())).all())]
        when = f" at step {step}" if step is not None else ""
        raise ReplicasDiverged(
            f"replicas differ{when}: rank {members[i]}'s parameter {name!r} has checksum {float(rows[i][first]):.17g}, "
            f"rank {members[0]}'s {float(rows[0][first]):.17g} (ranks differing from rank {members[0]}: "
            f"{differing}). Data-parallel ranks must hold the same model: build it from the same seed or "
            f"broadcast rank {members[0]}'s parameters first (zerokit.DistributedDataParallel does), and take "
            f"every optimizer step, clipping and update on every rank", members[i], name)
