"""Which parameters are sharded over ``tp`` and how, and the way back to whole tensors.

Lifecycle: a tensor-parallel layer cuts its slice out of the unsharded model's
parameter with :func:`shard_parameter`, which marks the new parameter with its
:class:`Shard` (Megatron marks ``tensor_model_parallel`` / ``partition_dim`` the same
way); a parameter the plan leaves whole is *replicated*. Under sequence parallelism a
replicated parameter that sees sequence-sharded inputs (LayerNorms, row-parallel
biases, sliced position embeddings) is marked ``sequence_parallel``: each rank's
gradient covers only its slice of the sequence, so after backward
:func:`allreduce_sequence_parallel_gradients` sums them over ``tp`` in one collective
(Megatron's ``allreduce_sequence_parallel_gradients``), or, for strategies that reduce
gradients during backward, :func:`register_sequence_parallel_gradient_hooks` sums each
one as it arrives. For parity checks
:func:`full_parameters` / :func:`full_gradients` all-gather the shards and return
every tensor whole under the unsharded model's names; :func:`parameter_counts` states
model states per rank as sharded/t + replicated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.nn as nn

from ..runtime import comm
from .mappings import group_rank, group_size


@dataclass(frozen=True)
class Shard:
    """A parameter split over ``tp`` along ``dim``; with ``blocks`` > 1 the dimension holds
    that many equal blocks (q, k, v) and each block is split on its own."""

    dim: int
    blocks: int = 1


def shard_tensor(full: torch.Tensor, shard: Shard, rank: int, n: int, what: str = "parameter") -> torch.Tensor:
    """Rank ``rank``'s slice of ``full`` under ``shard`` (a copy, so the whole tensor can be freed)."""
    size = full.shape[shard.dim]
    if size % (shard.blocks * n):
        unit = f"{shard.blocks} blocks × " if shard.blocks > 1 else ""
        raise ValueError(f"{what}: dimension {shard.dim} has size {size}, which {unit}tp={n} does not divide; "
                         f"uneven shards are not supported")
    blocks = full.chunk(shard.blocks, dim=shard.dim)
    return torch.cat([b.chunk(n, dim=shard.dim)[rank] for b in blocks], dim=shard.dim).detach().clone()


def unshard_tensor(gathered: torch.Tensor, shard: Shard) -> torch.Tensor:
    """The whole tensor from every rank's slice stacked on a new leading dimension (n, *local)."""
    dim = shard.dim + 1
    per_block = gathered.shape[dim] // shard.blocks
    # (n, …, blocks·c, …) -> (blocks, n, …, c, …) -> cat: block-major, then rank, then c
    split = gathered.unflatten(dim, (shard.blocks, per_block)).movedim(dim, 0)
    return torch.cat([split[b].movedim(0, shard.dim).flatten(shard.dim, shard.dim + 1)
                      for b in range(shard.blocks)], dim=shard.dim)


def shard_parameter(param: nn.Parameter, shard: Shard, group, memo: Optional[dict] = None,
                    what: str = "parameter") -> nn.Parameter:
    """A new parameter holding this rank's slice of ``param``, marked with ``shard``.

    ``memo`` (id of the whole parameter -> its shard) keeps shared parameters shared: a
    tied embedding and head get the same sharded parameter, and sharding one tensor two
    different ways is refused.
    """
    if memo is not None and id(param) in memo:
        done = memo[id(param)]
        if getattr(done, "tp_shard", None) != shard:
            raise ValueError(f"{what}: this parameter is shared with a module that shards it as "
                             f"{getattr(done, 'tp_shard', None)}, not {shard}; shared parameters must be sharded "
                             f"the same way (a tied embedding and head: vocab_embedding and vocab_head)")
        return done
    out = nn.Parameter(shard_tensor(param.data, shard, group_rank(group), group_size(group), what),
                       requires_grad=param.requires_grad)
    out.tp_shard = shard
    if memo is not None:
        memo[id(param)] = out
    return out


def mark_sequence_parallel(param: nn.Parameter) -> None:
    """Mark a replicated parameter whose inputs are sharded along the sequence."""
    param.sequence_parallel = True


def parameter_layout(model: nn.Module) -> Dict[str, Optional[Shard]]:
    """``{name: Shard}`` for the sharded parameters of a tensor-parallel model, None for the replicated ones."""
    return {name: getattr(p, "tp_shard", None) for name, p in model.named_parameters()}


def sequence_parallel_parameters(model: nn.Module) -> Dict[str, nn.Parameter]:
    """The replicated parameters whose gradients are partial sums over ``tp``: those that see sequence-sharded
    inputs, and a tensor-parallel expert's output bias (added on one tp rank, :mod:`zerokit.expert_parallel.moe`)."""
    return {name: p for name, p in model.named_parameters() if getattr(p, "sequence_parallel", False)}


def allreduce_sequence_parallel_gradients(model: nn.Module, group=None, tag: str = "sequence_parallel_grads") -> int:
    """Sum the gradients of :func:`sequence_parallel_parameters` over ``tp`` in one flat all-reduce
    (call after backward, before the optimizer or the data-parallel reduction). Returns the elements reduced."""
    grads = [p.grad for p in sequence_parallel_parameters(model).values() if p.grad is not None]
    if not grads or group_size(group) == 1:
        return 0
    flat = torch.cat([g.reshape(-1) for g in grads])
    comm.all_reduce(flat, group=group, tag=tag)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    return flat.numel()


def register_sequence_parallel_gradient_hooks(model: nn.Module, group=None,
                                              tag: str = "sequence_parallel_grad") -> list:
    """The alternative to :func:`allreduce_sequence_parallel_gradients` for strategies that reduce
    gradients during backward (ZeRO-2/3): all-reduce each sequence-parallel parameter's incoming
    gradient over ``tp`` *before* it is accumulated, one collective per parameter per backward.
    Register before such a strategy's own hooks. Correct under gradient accumulation (only the new
    contribution is reduced). Returns the handles."""
    if group_size(group) == 1:
        return []

    def hook(grad, name):
        out = grad.contiguous().clone()
        comm.all_reduce(out, group=group, tag=f"{tag}:{name}")
        return out

    return [p.register_hook(lambda grad, name=name: hook(grad, name))
            for name, p in sequence_parallel_parameters(model).items()]


def _gather_whole(t: torch.Tensor, shard: Optional[Shard], group, tag: str) -> torch.Tensor:
    if shard is None or group_size(group) == 1:
        return t.detach().clone()
    gathered = torch.empty((group_size(group), *t.shape), dtype=t.dtype, device=t.device)
    comm.all_gather(gathered.view(-1), t.detach().contiguous().view(-1), group=group, tag=tag)
    return unshard_tensor(gathered, shard)


def full_parameters(model: nn.Module, group=None) -> Dict[str, torch.Tensor]:
    """Every parameter whole, under the unsharded model's names (sharded ones all-gathered over ``tp``)."""
    return {name: _gather_whole(p, getattr(p, "tp_shard", None), group, f"full_parameters:{name}")
            for name, p in model.named_parameters()}


def full_gradients(model: nn.Module, group=None) -> Dict[str, Optional[torch.Tensor]]:
    """Every parameter's gradient whole (None where there is none), under the unsharded model's names."""
    return {name: (None if p.grad is None else
                   _gather_whole(p.grad, getattr(p, "tp_shard", None), group, f"full_gradients:{name}"))
            for name, p in model.named_parameters()}
