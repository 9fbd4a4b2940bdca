# %% [markdown]
# # Exercise 02 · Naive data parallelism: average after backward
#
# **Goal.** Train one model on N ranks so that it takes exactly the steps one process would
# take on the whole batch: every rank holds the whole model, trains on its own share of the
# batch, and averages the gradients before the optimizer step (ZeRO §2.1).
#
# **Interface.**
# - `shard_batch(inputs, targets, rank, world_size) -> (inputs, targets)`: this rank's 1/N of
#   the global batch (B rows, B divisible by N);
# - `average_gradients(model, group=None) -> None`: after backward, every `p.grad` becomes the
#   mean of that gradient over the ranks.
#
# **What the grader checks** (2 ranks, a small MLP, 3 SGD steps; `zerokit.grade.checks("02")`):
# - `batch-shards` — each rank trains on its own B/N rows, together the whole batch;
# - `mean-gradient` — after `average_gradients` every rank holds the gradient one process
#   computes on the whole batch;
# - `same-as-one-process` — after 3 steps the parameters equal single-process training's;
# - `traffic` — one all-reduce of every gradient per step: payload Ψ·4 B, ring cost
#   2(N−1)/N·Ψ·4 (`zerokit.theory.comm_bytes_per_step(0, Ψ, N, 4)`).
#
# **Time.** About 25 minutes.
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

EXERCISE = "02_naive_ddp"

# %%
def shard_batch(inputs: torch.Tensor, targets: torch.Tensor, rank: int, world_size: int):
    """This rank's contiguous 1/N of the global batch."""
    raise NotImplementedError("return this rank's rows [rank·B/N, (rank+1)·B/N) of inputs and of targets")


def average_gradients(model: torch.nn.Module, group=None) -> None:
    """Replace every gradient by its mean over the ranks (call after backward)."""
    raise NotImplementedError('all-reduce (sum) every p.grad over the group, then divide it by the number of ranks')

# %% [markdown]
# Try it: two ranks, one step of a linear model; both ranks end with the same weights.

# %%
if __name__ == "__main__":
    def demo(ctx):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        x, y = torch.randn(8, 3, generator=torch.Generator().manual_seed(1)), torch.ones(8, 1)
        xs, ys = shard_batch(x, y, ctx.rank, ctx.world_size)
        F.mse_loss(model(xs), ys).backward()
        average_gradients(model)
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        return model.weight.detach().flatten().tolist()

    print(zerokit.launch(demo, 2))

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
if __name__ == "__main__":  # check `batch-shards`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["batch-shards"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `mean-gradient`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["mean-gradient"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `same-as-one-process`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["same-as-one-process"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `traffic`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["traffic"])
    assert report.passed, report
