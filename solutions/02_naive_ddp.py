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
# **What the grader checks** (`zerokit.grade.checks("02")`): `shard_batch` on its own, then 3 SGD
# steps on 2 ranks of a small MLP whose parameters are named by layer, `0.weight` … `6.bias`:
# `0 Linear(8, 16) → 1 Tanh → 2 Linear(16, 16) → 3 Tanh → 4 Linear(16, 16) → 5 Tanh → 6 Linear(16, 4)`.
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
    # BEGIN SOLUTION: return this rank's rows [rank·B/N, (rank+1)·B/N) of inputs and of targets
    per = inputs.shape[0] // world_size
    rows = slice(rank * per, (rank + 1) * per)
    return inputs[rows], targets[rows]
    # END SOLUTION


def average_gradients(model: torch.nn.Module, group=None) -> None:
    """Replace every gradient by its mean over the ranks (call after backward)."""
    # BEGIN SOLUTION: all-reduce (sum) every p.grad over the group, then divide it by the number of ranks
    n = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad.div_(n)
    # END SOLUTION

# %% [markdown]
# Try it: two ranks, one SGD step of a linear model, each rank on its half of the batch — and, beside them, the
# step one process takes on the whole batch. Ranks that agree with each other can still be wrong together:
# gradients summed but not divided by N give both ranks the same, too large step.

# %%
if __name__ == "__main__":
    def batch():
        return torch.randn(8, 3, generator=torch.Generator().manual_seed(1)), torch.ones(8, 1)

    def demo(ctx):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        xs, ys = shard_batch(*batch(), ctx.rank, ctx.world_size)
        F.mse_loss(model(xs), ys).backward()
        average_gradients(model)
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        return model.weight.detach().flatten().tolist()

    def one_process():
        """The same step in one process on the whole batch: the weights every rank must end with."""
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        F.mse_loss(model(batch()[0]), batch()[1]).backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        return model.weight.detach().flatten().tolist()

    ranks, reference = zerokit.launch(demo, 2), one_process()
    for rank, weights in enumerate(ranks):
        print(f"rank {rank}:                   " + "  ".join(f"{w:+.5f}" for w in weights))
    print("one process, whole batch: " + "  ".join(f"{w:+.5f}" for w in reference))
    # fp32 weights of size ~1 after one step: the ranks sum in another order, a few ulps (1e-7) apart at most
    same = all(torch.allclose(torch.tensor(w), torch.tensor(reference), rtol=0, atol=1e-6) for w in ranks)
    print("every rank took the step one process takes" if same else
          "the ranks' step differs from one process's: is every gradient the mean over the ranks?")

# %%
if __name__ == "__main__":
    hint(EXERCISE)

# %%
if __name__ == "__main__":
    report = zerokit.grade(globals(), EXERCISE)
    print(report)
    assert report.passed  # SOLUTION ONLY
