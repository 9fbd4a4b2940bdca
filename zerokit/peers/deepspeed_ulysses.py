"""``deepspeed-ulysses``: context parallelism's attention by DeepSpeed's Ulysses ``DistributedAttention``.

The peer of ``ddp`` with ``parallel={"cp": N}, cp_attention="ulysses"``: the same data-parallel
reduction (zerokit's ``ddp`` over the flattened dp × cp group), the same tokens per rank
(zig-zag chunks, :mod:`zerokit.context_parallel.layout`), and the attention of every layer run by
``deepspeed.sequence.layer.DistributedAttention`` instead of :func:`zerokit.context_parallel.ulysses_attention`.
The pair differs only in who moves the heads, so its step times compare the two Ulysses
implementations. Registered only when ``deepspeed`` imports.

Lifecycle:

1. **setup**: ``deepspeed.init_distributed`` on the process group zerokit's launcher made
   (``DS_ACCELERATOR=cpu`` off CUDA, ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` as DeepSpeed's
   launcher would set them). The training loop has already given each attention core zerokit's
   cp attention (``cp_attention="ulysses"`` is required, so that the loop's formula for the cp
   axis is Ulysses'); the peer replaces it with a ``DistributedAttention`` on the mesh's ``cp``
   group, ``scatter_idx=2`` (heads), ``gather_idx=1`` (sequence), ``batch_dim_idx=0``;
2. **forward**: per layer, DeepSpeed all-to-alls q, k and v from ``[b, s/cp, h, d]`` to
   ``[b, s, h/cp, d]``, calls the local attention, and all-to-alls the output back. The local
   attention is ours (DeepSpeed takes any module): the same computation as zerokit's Ulysses
   (scores, mask, softmax, values; the regrouped sequence is the ranks' zig-zag tokens side by
   side, so the causal mask compares their global positions);
3. **backward**: DeepSpeed's ``_SeqAllToAll`` runs the inverse all-to-alls (4 per layer);
   the weights' gradients are then reduced over dp × cp by zerokit's ``ddp`` buckets.

DeepSpeed calls ``torch.distributed.all_to_all_single``, which zerokit's peer recording does not
wrap; :func:`ledgered_all_to_all` routes each call through :func:`zerokit.runtime.comm.all_to_all_single`,
so the ledger counts it with the same rule (equal chunks: (cp − 1)/cp of the input leaves the rank)
on the ``cp`` axis.
"""
from __future__ import annotations

import importlib.util
import math
import os
import sys
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..context_parallel.apply import attention_modules
from ..context_parallel.ulysses import ulysses_attention
from ..data_parallel.overlap import OverlappedDataParallel
from ..runtime import comm
from ..strategies.base import register


def deepspeed_available() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def init_deepspeed(ctx) -> None:
    """DeepSpeed's communication layer on the process group zerokit's launcher made (as the ZeRO peers do)."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if ctx.device.type == "cuda" else "cpu")
    for key, value in (("RANK", ctx.rank), ("WORLD_SIZE", ctx.world_size),
                       ("LOCAL_RANK", ctx.device.index if ctx.device.type == "cuda" else ctx.rank)):
        os.environ.setdefault(key, str(value))
    import deepspeed

    deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)


def _recording_all_to_all(original, tag: str):
    def wrapper(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        if sys._getframe(1).f_globals.get("__name__") == "zerokit.runtime.comm":  # comm's own call: already recorded
            return original(output, input, output_split_sizes=output_split_sizes,
                            input_split_sizes=input_split_sizes, group=group, async_op=async_op)
        if async_op:
            raise RuntimeError(f"{tag}: an asynchronous all_to_all_single; zerokit's recording times only blocking "
                               f"ones (DeepSpeed's overlapped Ulysses needs an sp_stream, which this peer does not "
                               f"pass)")
        return comm.all_to_all_single(output, input, group=group, tag=f"{tag} all_to_all_single",
                                      output_split_sizes=output_split_sizes, input_split_sizes=input_split_sizes)

    wrapper.__name__ = "all_to_all_single"
    return wrapper


@contextmanager
def ledgered_all_to_all(tag: str):
    """Route ``torch.distributed.all_to_all_single`` through zerokit's ledger while the block runs."""
    saved = [(module, getattr(module, "all_to_all_single")) for module in (dist, c10d)]
    wrapper = _recording_all_to_all(saved[0][1], tag)
    for module, _ in saved:
        setattr(module, "all_to_all_single", wrapper)
    try:
        yield
    finally:
        for module, original in saved:
            setattr(module, "all_to_all_single", original)


class _PositionCausal:
    """The local attention DeepSpeed calls on ``[b, s, h/cp, d]``: causal by the tokens' global positions, computed
    as zerokit's Ulysses computes it (scores, mask, softmax, values), so that the pair differs only in the
    all-to-alls and their layouts."""

    def __init__(self, order: torch.Tensor):
        self.hidden = order[None, :] > order[:, None]  # [s, s]: key j is after query i

    def __call__(self, q, k, v, *args, **kwargs):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, h/cp, s, d]
        s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        y = torch.matmul(torch.softmax(s.masked_fill(self.hidden, float("-inf")), dim=-1), v)
        return y.transpose(1, 2)


class _Core:
    """What the attention core calls (``context(q, k, v)`` on ``[b, h, s/cp, d]``): DeepSpeed's Ulysses."""

    def __init__(self, attention):
        self.attention = attention

    def __call__(self, q, k, v):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # DeepSpeed's layout: [b, s/cp, h, d]
        return self.attention(q, k, v, 0).transpose(1, 2)


class DeepSpeedUlysses(OverlappedDataParallel):
    """zerokit's ``ddp`` over dp × cp with DeepSpeed's ``DistributedAttention`` as every layer's cp attention."""

    name = "deepspeed-ulysses"
    peer = True
    axes = ("dp", "cp")

    def __init__(self, model, ctx, config, **options):
        from deepspeed.sequence.layer import DistributedAttention

        mesh = ctx.mesh
        if mesh.size("cp") < 2:
            raise ValueError("strategy 'deepspeed-ulysses' is context parallelism: use parallel={'cp': 2} (or more) "
                             "and cp_attention='ulysses'")
        cores = attention_modules(model)
        if any(getattr(m.context, "func", None) is not ulysses_attention for m in cores):
            raise ValueError("strategy 'deepspeed-ulysses' runs Ulysses: pass cp_attention='ulysses' (the training "
                             "loop's cp formula follows that option)")
        init_deepspeed(ctx)
        group = mesh.group("cp")
        for m in cores:
            order = m.context.keywords["all_positions"].reshape(-1)  # the regrouped sequence: rank 0's tokens, …
            m.context = _Core(DistributedAttention(_PositionCausal(order), group, scatter_idx=2, gather_idx=1))
        super().__init__(model, ctx, config, **options)

    def forward(self, *args, **kwargs):
        with ledgered_all_to_all(self.name):
            return super().forward(*args, **kwargs)

    def backward(self, loss):
        with ledgered_all_to_all(self.name):
            super().backward(loss)


if deepspeed_available():
    register(DeepSpeedUlysses)
