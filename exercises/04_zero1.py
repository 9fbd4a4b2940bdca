# %% [markdown]
# # Exercise 04 · ZeRO-1: a sharded optimizer step
#
# **Goal.** Cut the biggest part of data parallelism's memory — the optimizer states, 8Ψ bytes
# of AdamW's m and v in fp32 — by N: each rank keeps them for its own 1/N of the parameters
# only, steps that shard, and the ranks exchange the updated shards (ZeRO §5.1, P_os). The
# traffic stays what DDP sends: a reduce-scatter and an all-gather are an all-reduce cut in
# two.
#
# **Interface.** `Zero1(model, lr, group=None)`:
# - given: `self.unit`, one `zerokit.zero.flat_buffer.FlatUnit` holding every parameter — the
#   model's parameters become views into `self.unit.data`, padded to a multiple of N, and
#   rank r owns elements `[r·s, (r+1)·s)` (`self.unit.shard(t)` is that slice of any flat
#   tensor of this layout); `self.grads`, a flat buffer of the same layout that autograd
#   accumulates the gradients into; `zero_grad()`;
# - yours: `self.optimizer`, an AdamW over this rank's shard only, and `step()`: the mean
#   gradient reduce-scattered into the shard, the shard stepped, the shards all-gathered.
#   `zerokit.comm.reduce_scatter(output, input, group=...)` and
#   `zerokit.comm.all_gather(output, input, group=...)` are torch's collectives, recorded in
#   zerokit's communication ledger (the grader counts torch.distributed's calls either way).
#
# **What the grader checks** (2 ranks, AdamW, 3 steps; `zerokit.grade.checks("04")`):
# - `gradient-shard` — the tensor your optimizer steps has, as its gradient, this rank's slice
#   of the mean gradient;
# - `optimizer-states-sharded` — its state is 8·Ψ/N + 4 B (`theory.model_state_bytes(1, …)`);
# - `same-as-one-process` — the parameters equal single-process AdamW's on every rank;
# - `traffic` — one reduce-scatter and one all-gather per step: ring cost 2(N−1)/N·Ψ·4
#   (`theory.comm_bytes_per_step(1, …)`), DDP's.
#
# **Time.** About 35 minutes.
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
from zerokit.zero.flat_buffer import FlatUnit

EXERCISE = "04_zero1"

# %%
class Zero1:
    """Every rank holds the whole model and its gradients; optimizer states only for its shard."""

    def __init__(self, model: torch.nn.Module, lr: float, group=None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.unit = FlatUnit(list(model.parameters()), self.world, dist.get_rank(group))
        self.grads = self.unit.new_flat()
        for p, grad in zip(self.unit.params, self.unit.views(self.grads)):
            p.grad = grad  # autograd accumulates into the flat gradient buffer
        raise NotImplementedError("self.master — a Parameter holding a copy of this rank's shard of the parameters — and self.optimizer = torch.optim.AdamW over it alone")

    def step(self) -> None:
        """Reduce-scatter the mean gradient into the shard, step it, all-gather the updated shards."""
        raise NotImplementedError('divide self.grads by N; reduce-scatter it into a shard-sized gradient for self.master; step; all-gather the master shards into self.unit.data')

    def zero_grad(self) -> None:
        self.grads.zero_()

# %% [markdown]
# Try it: how many bytes of optimizer state does each rank hold, against DDP's 8 per parameter?

# %%
if __name__ == "__main__":
    def demo(ctx):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        zero = Zero1(model, lr=1e-2)
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(ctx.rank))
        F.mse_loss(model(x), torch.zeros(4, 4)).backward()
        zero.step()
        state = sum(t.numel() * t.element_size() for s in zero.optimizer.state.values() for t in s.values())
        psi = sum(p.numel() for p in model.parameters())
        return f"optimizer state {state} B; DDP's AdamW would hold {8 * psi + 4 * 4} B"

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
if __name__ == "__main__":  # check `gradient-shard`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["gradient-shard"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `optimizer-states-sharded`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["optimizer-states-sharded"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `same-as-one-process`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["same-as-one-process"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `traffic`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["traffic"])
    assert report.passed, report
