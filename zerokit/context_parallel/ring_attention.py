"""Ring attention (Liu et al., arXiv 2310.01889): causal attention over a sequence cut across the ``cp`` ranks.

Each rank holds its tokens' queries, keys and values (the zig-zag chunks of
:mod:`.layout`). Attention needs every key for every query, but no rank ever holds the
whole sequence's keys: the key/value blocks travel around the ring instead. Lifecycle of
one call, on every rank of the cp group at once:

**plan** — which part of each rank's block this rank's queries see (:func:`block_plan`, from
the positions alone, once per set of positions): the rows (queries) that see any of its keys,
the columns (keys) any of them sees, and the mask left on that part — none (all visible), causal
(the diagonal block: the same positions) or, for a layout other than :mod:`.layout`'s, an
explicit one. What the causal mask hides entirely is never computed: under the zig-zag cut, a
block from a rank before this one is seen by every query but only in its early chunk's keys, a
block from a rank after it only by the late chunk's queries — half a block each; under a
contiguous cut, the blocks of later ranks not at all.

**forward** — cp steps. At step s this rank holds the key/value block of rank r − s. It
posts the block's send to the next rank and the receive of the next block from the
previous one (one ``batch_isend_irecv``, so the transfer overlaps this step's compute),
computes its queries' attention over the visible part of the block with a block kernel
(:mod:`.block_kernels`: torch's fused kernel that returns the log-sum-exp where torch has one
for the inputs, else the explicit math — scores masked where the key's global position is after
the query's, softmax, times V) and folds the block into a running output with the online softmax
(Milakov & Gimelshein; FlashAttention): each block contributes its own log-sum-exp ℓ_b and
normalised output o_b, merged as ℓ ← log(e^ℓ + e^ℓ_b), o ← o·e^(ℓ_old − ℓ) + o_b·e^(ℓ_b − ℓ).
After cp − 1 transfers every block has visited every rank. Saved for backward: this
rank's q, k, v, its output and the final ℓ — its own tokens only, so activations per rank
are 1/cp of the sequence's. The output is the first block's, merged into in place: from the
CPU's fused kernel laid out tokens-first, so the attention's output projection reads a view of
it, as on one process; from the explicit math heads-first, and the projection's input is a copy.

**backward** — two rings: the key/value blocks travel again (cp − 1 transfers, each posted
before the block's compute, as in forward), and each block's dK and dV follow one step
behind. At each step this rank computes, with the same block kernel over the same visible part,
its queries' share of the visiting block's dK and dV (from P = exp(S − ℓ), dV += Pᵀ·dO,
dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O)), dK += dSᵀ·Q) and of its own dQ (+= dS·K); then it waits for
the dK, dV the previous ranks accumulated for that block — posted a step earlier, so their
transfer ran during this step's compute — adds its share and posts the sum onward (cp transfers;
the last brings each block's finished dK and dV home). Only the time a rank still waits after
its compute is exposed; each block's compute is a ``block`` span of the timeline
(:func:`zerokit.runtime.timeline.block`), so :func:`zerokit.runtime.timeline.overlap` measures
how much of each transfer it covered.

Bytes on the ``cp`` axis per call (:func:`zerokit.theory.ring_attention_bytes`): forward
(cp − 1)·2·|K| (K and V), backward (cp − 1)·4·|K| + 2·|K|, |K| = this rank's key bytes.
The whole block travels whatever part of it a rank computes: a block visits every rank.
``kernel="explicit"`` computes every block with the math lesson 15 and exercise 15 teach (still
only its visible part); the default, ``"auto"``, is torch's choice for its own ring attention on
the same device, the fused kernel per block (zerokit's choice: the explicit math where torch has
no fused kernel for the inputs, where torch would refuse).
"""
from __future__ import annotations

import math
import weakref
from typing import List, NamedTuple, Optional, Union

import torch
import torch.distributed as dist

from ..runtime import comm, timeline
from . import block_kernels
from .block_kernels import CAUSAL


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


Index = Union[slice, torch.Tensor]


class Block(NamedTuple):
    """The part of one rank's key/value block this rank's queries see: ``rows`` of the queries, ``cols`` of the keys
    (a slice where they are consecutive, else an index tensor), the ``mask`` left on that part (None, ``CAUSAL`` or a
    boolean matrix, True where hidden) and the (query, key) pairs computed, ``len(rows) · len(cols)``."""
    rows: Index
    cols: Index
    mask: Union[None, str, torch.Tensor]
    pairs: int


def _index(keep: torch.Tensor, device) -> Index:
    at = keep.nonzero().flatten()
    first, last = int(at[0]), int(at[-1])
    return slice(first, last + 1) if last - first + 1 == len(at) else at.to(device)


def block_plan(qpos: torch.Tensor, kpos: torch.Tensor, device=None) -> Optional[Block]:
    """What queries at positions ``qpos`` compute of a block of keys at positions ``kpos`` under the causal mask (key
    visible iff its position ≤ the query's): None where they see none of it."""
    qpos, kpos = qpos.cpu(), kpos.cpu()
    hidden = kpos[None, :] > qpos[:, None]
    rows, cols = ~hidden.all(1), ~hidden.all(0)
    if not rows.any():
        return None
    part = hidden[rows][:, cols]
    n, m = part.shape
    if not part.any():
        mask = None
    elif n == m and torch.equal(part, torch.ones(n, m, dtype=torch.bool).triu(1)):  # host: the plan's own
        mask = CAUSAL
    else:
        mask = part.to(device)
    return Block(_index(rows, device), _index(cols, device), mask, n * m)


#: plans of the positions seen lately: (id(positions), id(all_positions), device) -> (weak refs, versions, plans)
_plans: dict = {}


def ring_plan(positions: torch.Tensor, all_positions: torch.Tensor, device) -> List[Optional[Block]]:
    """:func:`block_plan` of this rank's queries over every rank's block (``all_positions[r]``), computed once per
    positions tensors (kept while they live unchanged: on a GPU, reading positions would sync the host)."""
    key = (id(positions), id(all_positions), str(device))
    versions = (positions._version, all_positions._version)
    hit = _plans.get(key)
    if hit is not None and hit[0]() is positions and hit[1]() is all_positions and hit[2] == versions:
        return hit[3]
    plans = [block_plan(positions, kpos, device) for kpos in all_positions]
    if len(_plans) >= 64:
        _plans.clear()
    _plans[key] = (weakref.ref(positions), weakref.ref(all_positions), versions, plans)
    return plans


def _whole(index: Index, t: torch.Tensor) -> bool:
    return isinstance(index, slice) and index == slice(0, t.shape[-2])


def _rows(t: torch.Tensor, index: Index) -> torch.Tensor:
    """``t[..., index, :]`` of a ``[b, h, len, d]`` tensor (``[..., index]`` of a ``[b, h, len]`` one)."""
    return t[:, :, index]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, positions, all_positions, group, kernel):
        ranks, me, n, nxt, prv = _neighbours(group)
        scale = 1.0 / math.sqrt(q.shape[-1])
        plans = ring_plan(positions, all_positions, q.device)
        out = lse = state = None
        kv = torch.stack([k, v]).contiguous()
        for step in range(n):
            src = (me - step) % n
            pending = _shift(kv, group, nxt, prv, f"ring attention kv {step}") if step < n - 1 else None
            with timeline.block(f"ring forward block {step}"):
                block = plans[src]
                if block is not None:
                    compute = kernel if kernel.supports(block.mask) else block_kernels.EXPLICIT
                    block_out, block_lse, made = compute.forward(_rows(q, block.rows), _rows(kv[0], block.cols),
                                                                 _rows(kv[1], block.cols), scale, block.mask)
                    state = made if made is not None else state
                    out, lse = _merge(out, lse, block.rows, block_out, block_lse, q.shape)
            if pending is not None:
                kv = _arrived(pending)
        ctx.save_for_backward(q, k, v, out, lse, positions, all_positions)
        ctx.group, ctx.kernel, ctx.state = group, kernel, state
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, positions, all_positions = ctx.saved_tensors
        group, kernel = ctx.group, ctx.kernel
        ranks, me, n, nxt, prv = _neighbours(group)
        scale = 1.0 / math.sqrt(q.shape[-1])
        plans = ring_plan(positions, all_positions, q.device)
        dq = None
        kv, grads = torch.stack([k.float(), v.float()]).contiguous(), None
        for step in range(n):
            src = (me - step) % n
            # the next block's K, V leave now and travel while this block is computed (channel 0) …
            pending = _shift(kv, group, nxt, prv, f"ring attention kv {step}") if step < n - 1 else None
            with timeline.block(f"ring backward block {step}"):
                block = plans[src]
                if block is not None:
                    compute = kernel if kernel.supports(block.mask) else block_kernels.EXPLICIT
                    r, c = block.rows, block.cols
                    dq_b, dk_b, dv_b = compute.backward(_rows(dout, r), _rows(q, r), _rows(kv[0], c),
                                                        _rows(kv[1], c), _rows(out, r), _rows(lse, r), scale,
                                                        block.mask, ctx.state)
                    if dq is None and _whole(r, q):  # the first block, every query: dq = its share
                        dq = dq_b.float()
                    else:
                        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if dq is None else dq
                        dq[:, :, r] += dq_b
            # … and this block's dK, dV — the sum of the ranks it visited before, posted a step ago, so their
            # transfer ran during the computation above — take this rank's share and move on (channel 1); after
            # the last step what arrives is this rank's own block's, finished
            if grads is None and block is not None and _whole(c, k):  # the first: this rank's share alone
                total = torch.stack([dk_b, dv_b]).float()
            else:
                total = torch.zeros_like(kv) if grads is None else _arrived(grads)
                if block is not None:
                    total[0][:, :, c] += dk_b
                    total[1][:, :, c] += dv_b
            grads = _shift(total, group, nxt, prv, f"ring attention dkv {step}", channel=1) if n > 1 else (total, [])
            if pending is not None:
                kv = _arrived(pending)
        home = _arrived(grads)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if dq is None else dq
        return dq.to(q.dtype), home[0].to(k.dtype), home[1].to(v.dtype), None, None, None, None


def _merge(out, lse, rows: Index, block_out, block_lse, shape):
    """Fold a block's (o_b, ℓ_b) of queries ``rows`` into the running (o, ℓ), fp32 (None before the first block)."""
    if out is None and isinstance(rows, slice) and rows == slice(0, shape[-2]):
        return block_out.float(), block_lse  # the first block, every query: (o, ℓ) = (o_b, ℓ_b)
    if out is None:
        out = torch.zeros(shape, dtype=torch.float32, device=block_out.device)
        lse = torch.full(shape[:-1], float("-inf"), dtype=torch.float32, device=block_out.device)
    old = _rows(lse, rows)
    merged = torch.logaddexp(old, block_lse)
    finite = merged.masked_fill(torch.isinf(merged), 0.0)  # rows no block has shown a key yet: −∞ − 0
    out[:, :, rows] = (_rows(out, rows) * torch.exp(old - finite)[..., None]
                       + block_out.float() * torch.exp(block_lse - finite)[..., None])
    lse[:, :, rows] = merged
    return out, lse


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                   all_positions: torch.Tensor, group=None, kernel: str = "auto") -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence's keys (see the module docstring).

    ``q``, ``k``, ``v``: ``[batch, heads, local tokens, head dim]``, this rank's tokens; ``positions``: their global
    positions; ``all_positions[r]``: cp-group rank r's (:func:`.layout.positions`); ``group``: the cp group;
    ``kernel``: each block's kernel, :data:`.block_kernels.KERNELS` ("auto": torch's fused kernel where it has one
    for the inputs, else the explicit math; "fused": refused where it has none; "explicit": the math of lesson 15)."""
    if q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"ring_attention: q, k, v must have one shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    return _RingAttention.apply(q, k, v, positions, all_positions, group, block_kernels.choose(kernel, q, k, v))
