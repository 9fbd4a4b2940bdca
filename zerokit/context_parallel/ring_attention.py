"""Ring attention (Liu et al., arXiv 2310.01889): causal attention over a sequence cut across the ``cp`` ranks.

Each rank holds its tokens' queries, keys and values (the zig-zag chunks of
:mod:`.layout`). Attention needs every key for every query, but no rank ever holds the
whole sequence's keys: the key/value blocks travel around the ring instead. Lifecycle of
one call, on every rank of the cp group at once:

**forward** — cp steps. At step s this rank holds the key/value block of rank r − s. It
posts the block's send to the next rank and the receive of the next block from the
previous one (one ``batch_isend_irecv``, so the transfer overlaps this step's compute),
computes its queries' scores against the block — masked where the key's global position
is after the query's — and folds the block into a running output with the online softmax
(Milakov & Gimelshein; FlashAttention): each block contributes its own log-sum-exp ℓ_b and
normalised output o_b, merged as ℓ ← log(e^ℓ + e^ℓ_b), o ← o·e^(ℓ_old − ℓ) + o_b·e^(ℓ_b − ℓ).
After cp − 1 transfers every block has visited every rank. Saved for backward: this
rank's q, k, v, its output and the final ℓ — its own tokens only, so activations per rank
are 1/cp of the sequence's.

**backward** — two rings: the key/value blocks travel again (cp − 1 transfers, each posted
before the block's compute, as in forward), and each block's dK and dV follow one step
behind. At each step this rank computes its queries' share of the visiting block's dK and
dV (from P = exp(S − ℓ), dV += Pᵀ·dO, dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O)), dK += dSᵀ·Q) and of
its own dQ (+= dS·K); then it waits for the dK, dV the previous ranks accumulated for that
block — posted a step earlier, so their transfer ran during this step's compute — adds its
share and posts the sum onward (cp transfers; the last brings each block's finished dK and
dV home). Only the time a rank still waits after its compute is exposed; each block's
compute is a ``block`` span of the timeline (:func:`zerokit.runtime.timeline.block`), so
:func:`zerokit.runtime.timeline.overlap` measures how much of each transfer it covered.

Bytes on the ``cp`` axis per call (:func:`zerokit.theory.ring_attention_bytes`): forward
(cp − 1)·2·|K| (K and V), backward (cp − 1)·4·|K| + 2·|K|, |K| = this rank's key bytes.
zerokit's choice: scores are computed whole per block (no tiling inside a block, no
skipping of fully masked blocks): the ring, the online softmax and the zig-zag balance are
the point; FlashAttention's kernels do the rest on a GPU.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..runtime import comm, timeline


def _neighbours(group):
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    me = ranks.index(dist.get_rank())
    n = len(ranks)
    return ranks, me, n, ranks[(me + 1) % n], ranks[(me - 1) % n]


def _shift(tensor: torch.Tensor, group, nxt: int, prv: int, tag: str, channel: int = 0):
    """Post: send ``tensor`` to the next rank, receive the previous rank's into a new buffer; (buffer, works)."""
    incoming = torch.empty_like(tensor)
    works = comm.batch_isend_irecv([("send", tensor, nxt, tag), ("recv", incoming, prv, tag)], group=group,
                                   channel=channel)
    return incoming, works


def _arrived(pending):
    """Wait for a posted shift; its received buffer."""
    incoming, works = pending
    for work in works:
        work.wait()
    return incoming


def _scores(q, k, qpos, kpos, scale):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    return s.masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))


def _finite(x: torch.Tensor) -> torch.Tensor:
    """−∞ (a query with no visible key in this block) read as 0 where it is subtracted."""
    return x.masked_fill(torch.isinf(x), 0.0)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, positions, all_positions, group):
        ranks, me, n, nxt, prv = _neighbours(group)
        scale = 1.0 / math.sqrt(q.shape[-1])
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v]).contiguous()
        for step in range(n):
            src = (me - step) % n
            pending = _shift(kv, group, nxt, prv, f"ring attention kv {step}") if step < n - 1 else None
            with timeline.block(f"ring forward block {step}"):
                s = _scores(q.float(), kv[0].float(), positions, all_positions[src], scale)
                block_lse = torch.logsumexp(s, dim=-1)
                p = torch.exp(s - _finite(block_lse)[..., None])
                block_out = torch.matmul(p, kv[1].float())
                merged = torch.logaddexp(lse, block_lse)
                out = out * torch.exp(lse - _finite(merged))[..., None] + block_out * torch.exp(
                    block_lse - _finite(merged))[..., None]
                lse = merged
            if pending is not None:
                kv = _arrived(pending)
        ctx.save_for_backward(q, k, v, out, lse, positions, all_positions)
        ctx.group = group
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, positions, all_positions = ctx.saved_tensors
        group = ctx.group
        ranks, me, n, nxt, prv = _neighbours(group)
        scale = 1.0 / math.sqrt(q.shape[-1])
        dout = dout.float()
        qf = q.float()
        delta = (dout * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(qf)
        kv, grads = torch.stack([k.float(), v.float()]).contiguous(), None
        for step in range(n):
            src = (me - step) % n
            # the next block's K, V leave now and travel while this block is computed (channel 0) …
            pending = _shift(kv, group, nxt, prv, f"ring attention kv {step}") if step < n - 1 else None
            with timeline.block(f"ring backward block {step}"):
                s = _scores(qf, kv[0], positions, all_positions[src], scale)
                p = torch.exp(s - lse[..., None])
                dp = torch.matmul(dout, kv[1].transpose(-1, -2))
                ds = p * (dp - delta)
                dq += torch.matmul(ds, kv[0]) * scale
                mine = torch.stack([torch.matmul(ds.transpose(-1, -2), qf) * scale,
                                    torch.matmul(p.transpose(-1, -2), dout)])
            # … and this block's dK, dV — the sum of the ranks it visited before, posted a step ago, so their
            # transfer ran during the computation above — take this rank's share and move on (channel 1); after
            # the last step what arrives is this rank's own block's, finished
            total = mine if grads is None else _arrived(grads) + mine
            grads = _shift(total, group, nxt, prv, f"ring attention dkv {step}", channel=1) if n > 1 else (total, [])
            if pending is not None:
                kv = _arrived(pending)
        home = _arrived(grads)
        return dq.to(q.dtype), home[0].to(k.dtype), home[1].to(v.dtype), None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                   all_positions: torch.Tensor, group=None) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence's keys (see the module docstring).

    ``q``, ``k``, ``v``: ``[batch, heads, local tokens, head dim]``, this rank's tokens; ``positions``: their global
    positions; ``all_positions[r]``: cp-group rank r's (:func:`.layout.positions`); ``group``: the cp group."""
    if q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"ring_attention: q, k, v must have one shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    return _RingAttention.apply(q, k, v, positions, all_positions, group)
