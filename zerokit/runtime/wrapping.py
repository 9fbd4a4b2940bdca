"""What every wrapper does first: find this rank's context, refuse a model already wrapped, start the replicas equal.

Lifecycle of a wrapper's construction (``zerokit.DistributedDataParallel``, ``fully_shard``,
``ShardedOptimizer``, ``initialize``, ``parallelize_module``): :func:`rank_context` (a clear
error when no process group exists yet), :func:`mark_wrapped` (a module owned by one
data-parallel wrapper is refused by every other: its gradients would be reduced twice),
then :func:`broadcast_from_first` (rank 0's parameters and buffers on every rank of the
group, phase ``setup``).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from . import comm
from .context import RankContext, current


def rank_context(who: str) -> RankContext:
    """This rank's context, or a clear error when no process group exists yet."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{who} needs a process group, and none exists in this process: run your loop inside "
                           f"zerokit.launch(fn, world_size) (from a notebook cell too), or start the script with "
                           f"torchrun --nproc-per-node N and call torch.distributed.init_process_group('gloo') first")
    return current()


def wrapper_kind(module) -> str:
    """What data-parallel wrapper ``module`` is (torch's DDP, zerokit's, FSDP2's ``fully_shard``), or "".

    zerokit's own wrappers say so with a class attribute ``data_parallel_wrapper`` (their name)."""
    if isinstance(module, TorchDDP):
        return "torch's DistributedDataParallel"
    own = getattr(type(module), "data_parallel_wrapper", "")
    if own:
        return own
    fsdp = getattr(torch.distributed, "fsdp", None)
    if fsdp is not None and isinstance(module, getattr(fsdp, "FSDPModule", ())):
        return "FSDP2's fully_shard"
    return ""


def mark_wrapped(module: nn.Module, who: str) -> None:
    """Refuse a module some zerokit wrapper (or engine) already owns, or a data-parallel wrapper itself: each reduces
    the gradients, so two of them would reduce every gradient twice."""
    kind = wrapper_kind(module)
    if kind:
        raise ValueError(f"{who}: the module is already wrapped by {kind}, which reduces its gradients; a second "
                         f"wrapper would reduce them again. Pass the original model (the wrapper's .module), once")
    owner = getattr(module, "_zerokit_wrapped_by", None)
    if owner is not None:
        raise ValueError(f"{who}: this module is already wrapped by {owner}; wrap the original module once "
                         f"(use the existing wrapper, or rebuild the model)")
    module._zerokit_wrapped_by = who


def broadcast_from_first(module: nn.Module, ctx, group_and_src: Optional[tuple] = None,
                         skip: frozenset = frozenset()) -> None:
    """The first rank's parameters and buffers of ``module``, on every rank of the group: the mesh's data-parallel
    group by default, or ``group_and_src`` = (group, first rank's global rank); ``skip``: ids of tensors to leave
    alone (shards another ``fully_shard`` call holds, which differ by rank)."""
    group, src = group_and_src if group_and_src is not None else (ctx.mesh.group("dp"), ctx.mesh.ranks("dp")[0])
    with torch.no_grad(), comm.phase("setup"):
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if id(t) not in skip:
                comm.broadcast(t.data, src, group, tag=f"broadcast {name}")
