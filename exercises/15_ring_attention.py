# %% [markdown]
# # Exercise 15 · Ring attention's online softmax
#
# **Goal.** Under context parallelism each of the cp ranks holds a share of the sequence —
# its queries, keys and values — and no rank ever holds the whole sequence's keys. Ring
# attention (Liu et al., arXiv 2310.01889) passes the key/value blocks around the ring
# instead: at step s rank r holds the block of rank r − s, computes its queries' scores
# against it, and folds the block into a running output with the **online softmax**
# (Milakov & Gimelshein; FlashAttention). A block b of keys gives each query its own
# log-sum-exp ℓ_b = log Σ_j e^(s_j) and its own normalised output o_b = Σ_j e^(s_j − ℓ_b)·v_j;
# two such partial results merge exactly:
#
#     ℓ = log(e^ℓ_a + e^ℓ_b),    o = o_a·e^(ℓ_a − ℓ) + o_b·e^(ℓ_b − ℓ)
#
# so after cp blocks the output is the softmax over every key, as if one process had held
# them all. The sequence is cut into zig-zag chunks (rank r holds chunks r and 2cp − 1 − r of
# 2cp, lesson 15), so the causal mask must compare **global positions**, not local indices.
# A query that sees no key of a block (every score −∞) has ℓ_b = −∞ and contributes nothing:
# the merge must give e^(−∞) = 0 there, never −∞ − (−∞) = NaN.
#
# **Interface.** Tensors are `[batch, heads, local tokens, head dim]`, fp32.
# - `merge(out, lse, block_out, block_lse)` → `(out, lse)`: the merge above; `lse` and
#   `block_lse` are `[batch, heads, local tokens]` and may hold −∞ (nothing seen yet, or a
#   fully masked block);
# - `ring_forward(q, k, v, positions, all_positions, group=None)` → `(out, lse)`: the ring
#   loop's forward on this rank — cp steps; at each step post the block's transfer to the
#   next rank with the given `ring_shift` (except at the last step: cp − 1 transfers), score
#   this rank's queries against the block it holds (scaled by 1/√d, masked where the key's
#   global position is after the query's), fold it in with `merge`, then wait and move on
#   to the block that arrived. `positions`: this rank's tokens' global positions;
#   `all_positions[r]`: rank r's.
# - Given: `ring_shift(tensor, group)` (send to the next rank, receive from the previous,
#   through `zerokit.comm`, one `batch_isend_irecv`), the backward (the same ring, each
#   block's dK and dV travelling with it) and `ring_attention(q, k, v, positions,
#   all_positions, group=None)`, the autograd function around both.
#
# **What the grader checks** (2 ranks, b = 2, 2 heads, 16 tokens, head dim 8, zig-zag
# chunks of 4; `zerokit.grade.checks("15")`):
# - `merge` — two blocks merged from nothing (`out` 0, `lse` −∞) give the softmax over
#   both blocks' keys, with rows where one block is fully masked;
# - `same-as-one-process` — every rank's output, put back in sequence order, equals one
#   process's causal attention (`F.scaled_dot_product_attention(…, is_causal=True)`);
# - `same-gradients` — dQ, dK and dV from the given backward (which uses your `out` and
#   `lse`) equal one process's;
# - `ring-bytes` — the bytes each rank sent on the ring, forward and backward, equal
#   `theory.ring_attention_bytes(cp, |K|)`: (cp − 1)·2·|K| forward, |K| this rank's key bytes.
#
# **Time.** About 40 minutes.
#
# **How to work.** Replace each `raise NotImplementedError(...)`, run the demo, grade with the
# last cell; `hint(EXERCISE)` unfolds one hint at a time. Cells under
# `if __name__ == "__main__":` do not run when the grader loads your notebook.
# `zerokit/context_parallel/ring_attention.py` holds the library's version, to compare with afterwards.

# %%
import math

import torch
import torch.distributed as dist

import zerokit
from zerokit.grade import hint

EXERCISE = "15_ring_attention"

# %%
def merge(out, lse, block_out, block_lse):
    """The running (out, lse) with one more block's (block_out, block_lse) folded in: the softmax over both."""
    raise NotImplementedError('ℓ = logaddexp(ℓ_a, ℓ_b); rescale each output by e^(its ℓ − ℓ) and add them; where ℓ is −∞ (nothing seen) subtract 0 instead, so no −∞ − (−∞)')


def ring_forward(q, k, v, positions, all_positions, group=None):
    """Causal attention of this rank's queries over every rank's keys, the blocks passed around the ring: (out, lse)."""
    raise NotImplementedError("out = 0, lse = −∞; for step in range(cp): the block you hold came from rank (me − step) mod cp; post ring_shift of the stacked (k, v) unless it is the last step; scores q·kᵀ/√d masked where all_positions[src] > positions; the block's logsumexp and softmax·v (a fully masked row: subtract 0, not −∞); merge; wait for the transfer and take the block that arrived")

# %%
def ring_shift(tensor, group=None):
    """Post: send ``tensor`` to the next rank of the ring, receive the previous rank's; returns (buffer, works)."""
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    me, n = ranks.index(dist.get_rank()), len(ranks)
    incoming = torch.empty_like(tensor)
    works = zerokit.comm.batch_isend_irecv([("send", tensor.contiguous(), ranks[(me + 1) % n], "ring"),
                                            ("recv", incoming, ranks[(me - 1) % n], "ring")], group=group)
    return incoming, works


class RingAttention(torch.autograd.Function):
    """Forward: your ring_forward. Backward (given): the ring again, each block's dK and dV travelling with it."""

    @staticmethod
    def forward(ctx, q, k, v, positions, all_positions, group):
        out, lse = ring_forward(q, k, v, positions, all_positions, group)
        ctx.save_for_backward(q, k, v, out, lse, positions, all_positions)
        ctx.group = group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, positions, all_positions = ctx.saved_tensors
        group = ctx.group
        me, n = dist.get_rank(group), dist.get_world_size(group)
        scale = 1.0 / math.sqrt(q.shape[-1])
        delta = (dout * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(q)
        travelling = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)]).contiguous()
        for step in range(n):
            src = (me - step) % n
            kb, vb = travelling[0], travelling[1]
            s = torch.matmul(q, kb.transpose(-1, -2)) * scale
            s = s.masked_fill(all_positions[src][None, :] > positions[:, None], float("-inf"))
            p = torch.exp(s - lse[..., None])
            ds = p * (torch.matmul(dout, vb.transpose(-1, -2)) - delta)
            dq += torch.matmul(ds, kb) * scale
            travelling[2] += torch.matmul(ds.transpose(-1, -2), q) * scale
            travelling[3] += torch.matmul(p.transpose(-1, -2), dout)
            if step < n - 1:
                incoming, works = ring_shift(travelling, group)
                for work in works:
                    work.wait()
                travelling = incoming
        if n > 1:  # the last block's dK and dV go home, one rank on
            home, works = ring_shift(travelling[2:].contiguous(), group)
            for work in works:
                work.wait()
        else:
            home = travelling[2:]
        return dq, home[0], home[1], None, None, None


def ring_attention(q, k, v, positions, all_positions, group=None):
    return RingAttention.apply(q, k, v, positions, all_positions, group)

# %% [markdown]
# Try it on 2 ranks: each rank takes its zig-zag chunks of one sequence, runs the ring, and
# the outputs, put back in order, are held against one process's causal attention.

# %%
def demo(ctx):
    import torch.nn.functional as F

    from zerokit.context_parallel import layout

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 8, generator=g) for _ in range(3))
    cp, r = ctx.world_size, ctx.rank
    mine = [layout.split(t, r, cp, dim=2) for t in (q, k, v)]
    every = torch.stack([layout.positions(i, cp, 16) for i in range(cp)])
    out = ring_attention(*mine, every[r], every)
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return float((out - layout.split(whole, r, cp, dim=2)).abs().max())


if __name__ == "__main__":
    print("largest |ring − one process| per rank:", zerokit.launch(demo, 2))

# %%
if __name__ == "__main__":
    hint(EXERCISE)

# %%
if __name__ == "__main__":
    report = zerokit.grade(globals(), EXERCISE)
    print(report)

# %% [markdown]
# **Autograded cells** (nbgrader's): one per check, worth that check's points. A teacher who grades with
# nbgrader runs them (`nbgrader autograde`); each asks `zerokit.grade` what the cell above reports, one
# check at a time. Leave them as they are.

# %%
if __name__ == "__main__":  # check `merge`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["merge"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `same-as-one-process`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["same-as-one-process"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `same-gradients`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["same-gradients"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `ring-bytes`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["ring-bytes"])
    assert report.passed, report
