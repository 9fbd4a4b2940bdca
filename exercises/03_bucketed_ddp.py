# %% [markdown]
# # Exercise 03 · Bucketed, overlapped data parallelism
#
# **Goal.** Make data parallelism cheap in calls and hidden behind backward, as torch's DDP
# does: gradients are packed into a few flat **buckets**, and each bucket's all-reduce is
# launched **from a gradient hook** the moment its last gradient is ready, while backward
# goes on computing earlier layers; one **wait at the end of backward** makes sure every
# bucket has arrived before the optimizer step.
#
# **Interface.**
# - `make_buckets(params, bucket_numel) -> list[list[Parameter]]`: buckets in reverse
#   registration order (backward's order); a bucket closes as soon as it holds at least
#   `bucket_numel` elements.
# - `BucketedDDP(model, bucket_numel, group=None)`: registers one post-accumulate-grad hook
#   per parameter; `self.buckets` is the list `make_buckets` returned (the grader reads it).
#   `on_grad_ready(p)` copies `p.grad` into its bucket and launches the bucket's
#   asynchronous all-reduce (divided by N) when it is full; `finish()`, called after
#   backward, waits for every bucket and copies the averages back into `p.grad`.
#
# **What the grader checks** (2 ranks, SGD, 2 steps; `zerokit.grade.checks("03")`):
# - `buckets` — the buckets of an MLP for `bucket_numel = 200` follow the rule;
# - `same-as-one-process` — gradients and parameters equal single-process training's;
# - `one-all-reduce-per-bucket` — one all-reduce per bucket per step, Ψ·4 B of payload in all;
# - `overlap` — every all-reduce is launched asynchronously, during backward;
# - `waited-before-step` — every all-reduce is waited for before the step;
# - `tied-weights` — a model whose output head is its embedding trains correctly: the shared
#   tensor has one slot and one hook.
#
# **Time.** About 50 minutes.
#
# **How to work.** Replace each `raise NotImplementedError(...)`, run the demo, grade with the
# last cell; `hint(EXERCISE)` unfolds one hint at a time. Cells under
# `if __name__ == "__main__":` do not run when the grader loads your notebook. (The grader
# runs asynchronous collectives when they are waited for, so a bucket that is never waited
# for shows up every time, not by chance.)

# %%
import torch
import torch.distributed as dist
import torch.nn.functional as F

import zerokit
from zerokit.grade import hint

EXERCISE = "03_bucketed_ddp"

# %%
def make_buckets(params: list, bucket_numel: int) -> list:
    """Parameters in reverse order, cut into buckets of at least `bucket_numel` elements (the last may be smaller)."""
    raise NotImplementedError('walk the parameters from last to first; close a bucket once it holds bucket_numel elements or more')


class BucketedDDP:
    """Gradients averaged bucket by bucket; each bucket's all-reduce starts from a hook during backward."""

    def __init__(self, model: torch.nn.Module, bucket_numel: int, group=None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.buckets: list = []   # lists of parameters, in reduction order (read by the grader)
        self.works: list = []     # the all-reduces launched this step
        raise NotImplementedError("the parameters (a shared tensor once), self.buckets, one flat buffer per bucket, each parameter's slot, a ready-counter per bucket, and a post-accumulate-grad hook on every parameter")

    def on_grad_ready(self, p: torch.nn.Parameter) -> None:
        """A gradient hook: p.grad holds this backward's gradient."""
        raise NotImplementedError('copy p.grad into its slot; when its bucket is full, divide the buffer by N and launch an asynchronous all-reduce (keep the work)')

    def finish(self) -> None:
        """The end-of-backward wait: every bucket reduced, the averages back in p.grad, counters reset."""
        raise NotImplementedError("wait for every launched all-reduce, copy each bucket's slots back into p.grad, reset for the next step")

# %% [markdown]
# Try it: a 4-layer MLP on 2 ranks — how many buckets, and do both ranks end with the same
# gradient?

# %%
if __name__ == "__main__":
    def demo(ctx):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        ddp = BucketedDDP(model, bucket_numel=64)
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(ctx.rank))
        F.mse_loss(model(x), torch.zeros(4, 4)).backward()
        ddp.finish()
        return len(ddp.buckets), float(model[0].weight.grad.sum())

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
if __name__ == "__main__":  # check `buckets`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["buckets"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `same-as-one-process`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["same-as-one-process"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `one-all-reduce-per-bucket`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["one-all-reduce-per-bucket"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `overlap`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["overlap"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `waited-before-step`, 1 point
    report = zerokit.grade(globals(), EXERCISE, checks=["waited-before-step"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `tied-weights`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["tied-weights"])
    assert report.passed, report
