# %% [markdown]
# # Exercise 10 · Sequence parallelism around a tensor-parallel MLP
#
# **Goal.** Under tensor parallelism alone every rank holds the whole sequence wherever the
# layer is not split — the LayerNorm, the dropout, the residual add — so those activations
# are stored t times over. Megatron's sequence parallelism (Korthikanti et al., 2205.05198
# §4.2.2) splits that region along the **sequence** instead: rank r holds tokens
# [r·s/t, (r+1)·s/t). Entering the tensor-parallel MLP, **g** all-gathers the sequence
# (forward) and reduce-scatters the gradient (backward); leaving it, **ḡ** reduce-scatters
# the row-parallel partial sums (forward) and all-gathers the gradient (backward). The
# all-reduce of plain tensor parallelism is exactly a reduce-scatter followed by an
# all-gather, so the bytes on the wire do not change — only where the halves sit.
# The weights every rank keeps whole (the LayerNorm's, the row-parallel bias) now see only
# 1/t of the tokens each: their gradients are summed over the ranks (an all-reduce; Megatron
# does it once per step, after gradient accumulation; here once per backward).
#
# **Interface.** Activations are (batch, sequence, hidden); the sequence is dimension 1.
# - `all_gather_sequence(x, group=None)`: every rank's `x` concatenated along dimension 1,
#   in rank order; `reduce_scatter_sequence(x, group=None)`: `x` summed over the ranks, then
#   this rank's 1/t of dimension 1;
# - `GatherFromSequenceParallelRegion` (g: all-gather forward, reduce-scatter backward) and
#   `ReduceScatterToSequenceParallelRegion` (ḡ: reduce-scatter forward, all-gather
#   backward), two `torch.autograd.Function`s called as `F.apply(x, group)`;
# - `sequence_parallel_block(x_shard, ln_w, ln_b, w1_shard, b1_shard, w2_shard, b2,
#   group=None)`: `y = x + gelu(LN(x)·w1ᵀ + b1)·w2ᵀ + b2` on this rank's sequence shard,
#   with w1/b1 split by output features and w2 by input features as in exercise 07;
# - `sync_replicated_grads(params, group=None)`: sum the gradients of the replicated
#   weights (`ln_w`, `ln_b`, `b2`) over the ranks, in place.
#
# **What the grader checks** (2 ranks, b = 2, s = 4, h = 8, ffn = 16;
# `zerokit.grade.checks("10")`):
# - `g` — forward, the ranks' shards concatenated along the sequence; backward, the sum of
#   the ranks' gradients, this rank's slice of it;
# - `g-bar` — forward, this rank's slice of the ranks' sum; backward, the gradients
#   concatenated;
# - `same-as-unsharded` — output shard, input gradient and every weight shard's gradient
#   equal the single-process block's;
# - `replicated-grads` — after `sync_replicated_grads`, the LayerNorm's and b2's gradients
#   equal the single-process block's;
# - `traffic` — per block one all-gather and one reduce-scatter of b·s·h forward and again
#   backward, no all-reduce of activations; ring cost
#   `theory.tp_comm_bytes_per_step(b·s, 2h, t, 4)` (an all-reduce's), and one all-reduce of
#   the 3h replicated gradients (`theory.sequence_parallel_grad_bytes`).
#
# **Time.** About 45 minutes.
#
# **How to work.** Replace each `raise NotImplementedError(...)`, run the demo, grade with the
# last cell; `hint(EXERCISE)` unfolds one hint at a time. Cells under
# `if __name__ == "__main__":` do not run when the grader loads your notebook.
# `zerokit/tensor_parallel/mappings.py` holds the library's version, to compare with afterwards.

# %%
import torch
import torch.distributed as dist
import torch.nn.functional as F

import zerokit
from zerokit.grade import hint

EXERCISE = "10_sequence_parallel"

# %%
def all_gather_sequence(x, group=None):
    """Every rank's x (batch, s/t, hidden) concatenated along the sequence: (batch, s, hidden)."""
    raise NotImplementedError('gather into a (t, *x.shape) buffer with zerokit.comm.all_gather (flat views), then move the rank axis next to the sequence and merge them')


def reduce_scatter_sequence(x, group=None):
    """x (batch, s, hidden) summed over the ranks; this rank keeps its (batch, s/t, hidden) slice."""
    raise NotImplementedError('split the sequence into t chunks, put the chunk axis first (contiguous), reduce-scatter the flat buffer with zerokit.comm.reduce_scatter')


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """g: all-gather along the sequence forward, reduce-scatter of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        raise NotImplementedError('remember the group; return the whole sequence')

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("return (this rank's slice of the gradient summed over the ranks, None)")


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """ḡ: reduce-scatter along the sequence forward, all-gather of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        raise NotImplementedError("remember the group; return this rank's slice of the sum")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("return (the ranks' gradient shards concatenated, None)")


def sequence_parallel_block(x_shard, ln_w, ln_b, w1_shard, b1_shard, w2_shard, b2, group=None):
    """x + gelu(LN(x)·w1ᵀ + b1)·w2ᵀ + b2 on this rank's sequence shard: LN on the shard, g, column, GeLU, row, ḡ."""
    raise NotImplementedError('LayerNorm on the shard, g, the column-parallel linear, GeLU, the row-parallel linear, ḡ, then b2 and the residual')


def sync_replicated_grads(params, group=None):
    """Sum the gradients of the weights every rank holds whole (each saw 1/t of the tokens), in place."""
    raise NotImplementedError('one all-reduce of the gradients, flattened together, then copied back')

# %% [markdown]
# Try it: the sequence-parallel block on 2 ranks against the whole block in one process.

# %%
if __name__ == "__main__":
    def demo(ctx):
        g = torch.Generator().manual_seed(0)
        x, w1, b1, w2, b2 = (torch.randn(1, 4, 8, generator=g), torch.randn(16, 8, generator=g),
                             torch.randn(16, generator=g), torch.randn(8, 16, generator=g), torch.randn(8, generator=g))
        ln_w, ln_b = torch.ones(8), torch.zeros(8)
        whole = x + F.linear(F.gelu(F.linear(F.layer_norm(x, (8,), ln_w, ln_b), w1, b1)), w2, b2)
        r, k, s = ctx.rank, 16 // ctx.world_size, 4 // ctx.world_size
        y = sequence_parallel_block(x[:, r * s:(r + 1) * s], ln_w, ln_b, w1[r * k:(r + 1) * k],
                                    b1[r * k:(r + 1) * k], w2[:, r * k:(r + 1) * k], b2)
        return float((y - whole[:, r * s:(r + 1) * s]).abs().max())

    print("max |sequence-parallel − whole| per rank:", zerokit.launch(demo, 2))

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
if __name__ == "__main__":  # check `g`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["g"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `g-bar`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["g-bar"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `same-as-unsharded`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["same-as-unsharded"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `replicated-grads`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["replicated-grads"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `traffic`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["traffic"])
    assert report.passed, report
