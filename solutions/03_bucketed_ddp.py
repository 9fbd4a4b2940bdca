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
    # BEGIN SOLUTION: walk the parameters from last to first; close a bucket once it holds bucket_numel elements or more
    buckets, current, size = [], [], 0
    for p in reversed(params):
        current.append(p)
        size += p.numel()
        if size >= bucket_numel:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets
    # END SOLUTION


class BucketedDDP:
    """Gradients averaged bucket by bucket; each bucket's all-reduce starts from a hook during backward."""

    def __init__(self, model: torch.nn.Module, bucket_numel: int, group=None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.buckets: list = []   # lists of parameters, in reduction order (read by the grader)
        self.works: list = []     # the all-reduces launched this step
        # BEGIN SOLUTION: the parameters (a shared tensor once), self.buckets, one flat buffer per bucket, each parameter's slot, a ready-counter per bucket, and a post-accumulate-grad hook on every parameter
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = make_buckets(params, bucket_numel)
        self.buffers = [torch.zeros(sum(p.numel() for p in bucket), device=bucket[0].device) for bucket in self.buckets]
        self.slot = {}
        for b, bucket in enumerate(self.buckets):
            offset = 0
            for p in bucket:
                self.slot[p] = (b, offset)
                offset += p.numel()
        self.ready = [0] * len(self.buckets)
        for p in params:
            p.register_post_accumulate_grad_hook(self.on_grad_ready)
        # END SOLUTION

    def on_grad_ready(self, p: torch.nn.Parameter) -> None:
        """A gradient hook: p.grad holds this backward's gradient."""
        # BEGIN SOLUTION: copy p.grad into its slot; when its bucket is full, divide the buffer by N and launch an asynchronous all-reduce (keep the work)
        b, offset = self.slot[p]
        self.buffers[b][offset:offset + p.numel()].copy_(p.grad.reshape(-1))
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):
            self.buffers[b].div_(self.world)
            self.works.append(dist.all_reduce(self.buffers[b], group=self.group, async_op=True))
        # END SOLUTION

    def finish(self) -> None:
        """The end-of-backward wait: every bucket reduced, the averages back in p.grad, counters reset."""
        # BEGIN SOLUTION: wait for every launched all-reduce, copy each bucket's slots back into p.grad, reset for the next step
        for work in self.works:
            work.wait()
        self.works = []
        for b, bucket in enumerate(self.buckets):
            for p in bucket:
                _, offset = self.slot[p]
                p.grad.copy_(self.buffers[b][offset:offset + p.numel()].view_as(p))
        self.ready = [0] * len(self.buckets)
        # END SOLUTION

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
    assert report.passed  # SOLUTION ONLY
