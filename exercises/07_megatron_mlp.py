# %% [markdown]
# # Exercise 07 · Megatron's f and g, and a column → row parallel MLP
#
# **Goal.** Split one MLP across t ranks so that no rank holds its whole weight matrices, with
# just two communication operators around it (Megatron-LM §3): **f** enters the
# tensor-parallel region (identity forward, all-reduce backward), **g** leaves it (all-reduce
# forward, identity backward). Between them, the first linear is split by its output features
# (column-parallel) and the second by its input features (row-parallel), so the GeLU needs no
# communication at all.
#
# **Interface.**
# - `CopyToTensorParallelRegion` (f) and `ReduceFromTensorParallelRegion` (g): two
#   `torch.autograd.Function`s, called as `F.apply(x, group)`;
# - `shard_mlp(w1, b1, w2, rank, world_size) -> (w1_shard, b1_shard, w2_shard)` for
#   `y = gelu(x·w1ᵀ + b1)·w2ᵀ + b2` (`w1`: ffn × h, `w2`: h × ffn, as `nn.Linear` stores them);
# - `parallel_mlp(x, w1_shard, b1_shard, w2_shard, b2, group=None)`: the MLP on this rank's
#   shards, equal to the unsharded MLP on every rank.
#
# **What the grader checks** (2 ranks, b = 2, s = 3, h = 8, ffn = 16; `zerokit.grade.checks("07")`):
# - `f` — identity forward; backward, the sum of every rank's gradient;
# - `g` — forward, the sum of every rank's input; identity backward;
# - `shards` — w1 and b1 by rows, w2 by the same columns;
# - `same-as-unsharded` — output, input gradient and every shard's gradient equal the
#   unsharded MLP's;
# - `traffic` — one all-reduce of b·s·h forward and one backward
#   (`theory.tp_comm_bytes_per_step(b·s, 2h, t, 4)`).
#
# **Time.** About 40 minutes.
#
# **How to work.** Replace each `raise NotImplementedError(...)`, run the demo, grade with the
# last cell; `hint(EXERCISE)` unfolds one hint at a time. Cells under
# `if __name__ == "__main__":` do not run when the grader loads your notebook.

# %%
import torch
import torch.distributed as dist
import torch.nn.functional as F

import zerokit
from zerokit.grade import hint

EXERCISE = "07_megatron_mlp"

# %%
class CopyToTensorParallelRegion(torch.autograd.Function):
    """f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        raise NotImplementedError('remember the group; return x unchanged (x.view_as(x))')

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError('return (the gradient summed over the ranks, None)')


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        raise NotImplementedError('return x summed over the ranks (in a new tensor)')

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError('return (grad, None)')


def shard_mlp(w1, b1, w2, rank: int, world_size: int):
    """This rank's column shard of the first linear (w1, b1) and row shard of the second (w2)."""
    raise NotImplementedError('rows [r·k, (r+1)·k) of w1 and b1, the same columns of w2, with k = ffn / world_size')


def parallel_mlp(x, w1_shard, b1_shard, w2_shard, b2, group=None):
    """gelu(x·w1ᵀ + b1)·w2ᵀ + b2 with the weights split over the ranks: f, column, GeLU, row, g."""
    raise NotImplementedError('f, the column-parallel linear, GeLU, the row-parallel linear, g, then b2 once')

# %% [markdown]
# Try it: the sharded MLP on 2 ranks against the whole MLP in one process.

# %%
if __name__ == "__main__":
    def demo(ctx):
        g = torch.Generator().manual_seed(0)
        x, w1, b1, w2, b2 = (torch.randn(2, 8, generator=g), torch.randn(16, 8, generator=g),
                             torch.randn(16, generator=g), torch.randn(8, 16, generator=g), torch.randn(8, generator=g))
        whole = F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
        y = parallel_mlp(x, *shard_mlp(w1, b1, w2, ctx.rank, ctx.world_size), b2)
        return float((y - whole).abs().max())

    print("max |sharded − whole| per rank:", zerokit.launch(demo, 2))

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
if __name__ == "__main__":  # check `f`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["f"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `g`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["g"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `shards`, 1 point
    report = zerokit.grade(globals(), EXERCISE, checks=["shards"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `same-as-unsharded`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["same-as-unsharded"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `traffic`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["traffic"])
    assert report.passed, report
