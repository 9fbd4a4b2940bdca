"""The conjugate communication operators of tensor and sequence parallelism.

Megatron-LM (arXiv 1909.08053 §3) splits a transformer layer into column-parallel
then row-parallel matmuls and needs only two operators around them, each the other's
conjugate: ``f`` (identity forward, all-reduce backward) enters the tensor-parallel
region, ``g`` (all-reduce forward, identity backward) leaves it. Sequence parallelism
(Korthikanti et al., arXiv 2205.05198 §4.2.2) shards the regions in between along the
sequence and splits each all-reduce in two: its ``g`` all-gathers the sequence forward
and reduce-scatters backward, its ``ḡ`` (``g_bar``) reduce-scatters forward and
all-gathers backward.

Lifecycle: a layer calls one of the functions below on its activations; the forward
collective runs at once, the conjugate one when autograd reaches the node in backward.
Every collective goes through :mod:`zerokit.runtime.comm`, so it lands in the
communication ledger with its axis (``tp``) and a tag naming the layer and operator.
A group of one rank makes every operator the identity. Activations are (batch,
sequence, hidden): the sequence dimension is 1 unless a caller says otherwise.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..runtime import comm

SEQUENCE_DIM = 1


def group_size(group) -> int:
    """Ranks in ``group`` (None: the default group); 1 outside a process group."""
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def group_rank(group) -> int:
    """This rank's index in ``group`` (None: the default group); 0 outside a process group."""
    return dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0


def _check_divisible(x: torch.Tensor, dim: int, n: int, what: str) -> None:
    if x.shape[dim] % n:
        raise ValueError(f"{what}: dimension {dim} of a tensor of shape {tuple(x.shape)} has size {x.shape[dim]}, "
                         f"which the tensor-parallel degree {n} does not divide; uneven shards are not supported "
                         f"(choose sizes that are multiples of {n})")


def all_reduce_sum(x: torch.Tensor, group, tag: str) -> torch.Tensor:
    """The sum of ``x`` over ``group``, in a new tensor."""
    out = x.contiguous().clone()
    comm.all_reduce(out, group=group, tag=tag)
    return out


def all_gather_along(x: torch.Tensor, dim: int, group, tag: str) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim``, in rank order."""
    n = group_size(group)
    dim = dim % x.dim()
    gathered = torch.empty((n, *x.shape), dtype=x.dtype, device=x.device)
    comm.all_gather(gathered.view(-1), x.contiguous().view(-1), group=group, tag=tag)  # gloo wants flat chunks
    return gathered.movedim(0, dim).flatten(dim, dim + 1)


def reduce_scatter_along(x: torch.Tensor, dim: int, group, tag: str) -> torch.Tensor:
    """Sum ``x`` over ``group`` and keep this rank's 1/n slice of ``dim``."""
    n = group_size(group)
    dim = dim % x.dim()
    _check_divisible(x, dim, n, f"reduce-scatter ({tag})")
    chunks = x.unflatten(dim, (n, x.shape[dim] // n)).movedim(dim, 0).contiguous()
    out = torch.empty(chunks.shape[1:], dtype=x.dtype, device=x.device)
    comm.reduce_scatter(out.view(-1), chunks.view(-1), group=group, tag=tag)
    return out


def split_along(x: torch.Tensor, dim: int, group, what: str = "split") -> torch.Tensor:
    """This rank's 1/n slice of ``dim`` (no communication)."""
    n = group_size(group)
    _check_divisible(x, dim, n, what)
    return x.chunk(n, dim=dim)[group_rank(group)].contiguous()


class CopyToTensorParallelRegion(torch.autograd.Function):
    """``f`` in Megatron-LM §3: identity forward, all-reduce of the input gradient backward.

    Placed before a column-parallel layer: every rank holds the whole input, and each
    rank's part of the layer contributes a partial gradient of it.
    """

    @staticmethod
    def forward(ctx, x, group, tag):
        ctx.group, ctx.tag = group, tag
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce_sum(grad, ctx.group, ctx.tag), None, None


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """``g`` in Megatron-LM §3: all-reduce forward, identity backward.

    Placed after a row-parallel layer: each rank's output is a partial sum of the whole.
    """

    @staticmethod
    def forward(ctx, x, group, tag):
        return all_reduce_sum(x, group, tag)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """``g`` of sequence parallelism (Korthikanti §4.2.2): all-gather along the sequence
    forward, reduce-scatter of the gradient backward. Replaces ``f`` before a
    column-parallel layer whose input is sharded along the sequence.
    """

    @staticmethod
    def forward(ctx, x, dim, group, tag):
        ctx.dim, ctx.group, ctx.tag = dim, group, tag
        return all_gather_along(x, dim, group, tag)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_along(grad, ctx.dim, ctx.group, ctx.tag), None, None, None


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """``ḡ`` (g_bar) of sequence parallelism (Korthikanti §4.2.2): reduce-scatter along the
    sequence forward, all-gather of the gradient backward. Replaces ``g`` after a
    row-parallel layer: the partial sums are summed and left sharded along the sequence.
    """

    @staticmethod
    def forward(ctx, x, dim, group, tag):
        ctx.dim, ctx.group, ctx.tag = dim, group, tag
        return reduce_scatter_along(x, dim, group, tag)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along(grad, ctx.dim, ctx.group, ctx.tag), None, None, None


class ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Enter a sequence-parallel region from a replicated tensor: keep this rank's slice of
    the sequence forward, all-gather the gradient backward (Megatron's
    ``scatter_to_sequence_parallel_region``)."""

    @staticmethod
    def forward(ctx, x, dim, group, tag):
        ctx.dim, ctx.group, ctx.tag = dim, group, tag
        return split_along(x, dim, group, f"sequence scatter ({tag})")

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along(grad, ctx.dim, ctx.group, ctx.tag), None, None, None


class GatherFromTensorParallelRegion(torch.autograd.Function):
    """All-gather a column-parallel output along its last (feature) dimension forward,
    keep this rank's slice of the gradient backward (``gather_output`` in Megatron §3)."""

    @staticmethod
    def forward(ctx, x, group, tag):
        ctx.group = group
        return all_gather_along(x, -1, group, tag)

    @staticmethod
    def backward(ctx, grad):
        return split_along(grad, grad.dim() - 1, ctx.group, "gather_output backward"), None, None


def copy_to_tensor_parallel_region(x, group=None, tag: str = "f"):
    """``f``: identity forward, all-reduce backward."""
    return x if group_size(group) == 1 else CopyToTensorParallelRegion.apply(x, group, tag)


def reduce_from_tensor_parallel_region(x, group=None, tag: str = "g"):
    """``g``: all-reduce forward, identity backward."""
    return x if group_size(group) == 1 else ReduceFromTensorParallelRegion.apply(x, group, tag)


def gather_from_sequence_parallel_region(x, group=None, tag: str = "g", dim: int = SEQUENCE_DIM):
    """Sequence-parallel ``g``: all-gather along the sequence forward, reduce-scatter backward."""
    return x if group_size(group) == 1 else GatherFromSequenceParallelRegion.apply(x, dim, group, tag)


def reduce_scatter_to_sequence_parallel_region(x, group=None, tag: str = "g_bar", dim: int = SEQUENCE_DIM):
    """Sequence-parallel ``ḡ``: reduce-scatter along the sequence forward, all-gather backward."""
    return x if group_size(group) == 1 else ReduceScatterToSequenceParallelRegion.apply(x, dim, group, tag)


def scatter_to_sequence_parallel_region(x, group=None, tag: str = "scatter", dim: int = SEQUENCE_DIM):
    """Keep this rank's sequence slice forward, all-gather backward."""
    return x if group_size(group) == 1 else ScatterToSequenceParallelRegion.apply(x, dim, group, tag)


def gather_from_tensor_parallel_region(x, group=None, tag: str = "gather_output"):
    """All-gather the last dimension forward, split it backward."""
    return x if group_size(group) == 1 else GatherFromTensorParallelRegion.apply(x, group, tag)
