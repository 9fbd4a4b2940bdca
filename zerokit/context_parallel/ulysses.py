"""Ulysses (DeepSpeed-Ulysses, Jacobs et al., arXiv 2309.14509): attention by heads after an all-to-all.

Each rank holds its tokens of every head. An all-to-all regroups them — each rank sends
every other rank that rank's share of the heads for its own tokens — so each rank then holds
the whole sequence for H/cp heads, runs ordinary (causal) attention on them, and a second
all-to-all returns every head's output for its own tokens. Lifecycle of one call: three
all-to-alls (q, k, v) and local attention in forward, one all-to-all of the output; in
backward the same four, reversed (an all-to-all's gradient is the inverse all-to-all). The
heads must divide by cp; the sequence order after the regroup is the ranks' tokens side by
side, so the causal mask compares global positions (:mod:`.layout`), not indices.

Bytes on the ``cp`` axis per call (:func:`zerokit.theory.ulysses_bytes`): each all-to-all
sends (cp − 1)/cp of this rank's tensor; 4 in forward and 4 in backward. Unlike the ring,
that does not grow with cp for a fixed sequence share, but cp cannot exceed the heads.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..runtime import comm


def _group_size(group) -> int:
    return dist.get_world_size(group)


def _heads_out(x: torch.Tensor, group, tag: str) -> torch.Tensor:
    """``[B, H, L, D]`` (every head, this rank's L tokens) → ``[B, H/n, n·L, D]`` (H/n heads, every rank's tokens)."""
    n = _group_size(group)
    b, h, length, d = x.shape
    send = x.reshape(b, n, h // n, length, d).permute(1, 0, 2, 3, 4).contiguous()
    got = torch.empty_like(send)
    comm.all_to_all_single(got, send, group=group, tag=tag)
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * length, d)


def _heads_in(x: torch.Tensor, group, tag: str) -> torch.Tensor:
    """The inverse: ``[B, H/n, n·L, D]`` → ``[B, H, L, D]``."""
    n = _group_size(group)
    b, hn, total, d = x.shape
    length = total // n
    send = x.reshape(b, hn, n, length, d).permute(2, 0, 1, 3, 4).contiguous()
    got = torch.empty_like(send)
    comm.all_to_all_single(got, send, group=group, tag=tag)
    return got.permute(1, 0, 2, 3, 4).reshape(b, n * hn, length, d)


class _HeadsOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, tag):
        ctx.group, ctx.tag = group, tag
        return _heads_out(x, group, tag)

    @staticmethod
    def backward(ctx, grad):
        return _heads_in(grad.contiguous(), ctx.group, f"{ctx.tag} grad"), None, None


class _HeadsIn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, tag):
        ctx.group, ctx.tag = group, tag
        return _heads_in(x, group, tag)

    @staticmethod
    def backward(ctx, grad):
        return _heads_out(grad.contiguous(), ctx.group, f"{ctx.tag} grad"), None, None


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                      all_positions: torch.Tensor, group=None) -> torch.Tensor:
    """Causal attention of this rank's tokens by the Ulysses all-to-all (see the module docstring); arguments as
    :func:`.ring_attention.ring_attention`'s."""
    n = _group_size(group)
    if q.shape[1] % n:
        raise ValueError(f"ulysses_attention: {q.shape[1]} heads do not divide over cp = {n} ranks; Ulysses splits "
                         f"the heads (use cp_attention='ring', or a cp that divides the heads)")
    qh, kh, vh = (_HeadsOut.apply(t.contiguous(), group, f"ulysses {name}") for t, name in ((q, "q"), (k, "k"),
                                                                                             (v, "v")))
    order = all_positions.reshape(-1)  # the regrouped sequence: rank 0's tokens, then rank 1's, …
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    s = s.masked_fill(order[None, :] > order[:, None], float("-inf"))
    y = torch.matmul(torch.softmax(s, dim=-1), vh)
    return _HeadsIn.apply(y, group, "ulysses out")
