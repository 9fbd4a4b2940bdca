# %% [markdown]
# # Exercise 05 · ZeRO-2: bucketed reduce-scatter with freeing
#
# **Goal.** No rank ever holds all the gradients. As backward produces them, each gradient is
# copied into its unit's flat **bucket** and dropped; a full bucket is **reduce-scattered**
# straight to its owners — rank r keeps the sum of its 1/N — and **freed** as soon as that
# reduction has finished (ZeRO §5.2). "All-reduce everything after backward, then drop what
# you don't own" moves the same bytes but peaks at the full gradients: it is not ZeRO-2.
#
# **Interface.** `Zero2(model, lr, bucket_numel, group=None)`. Given: `self.units` (flat units
# of at most `bucket_numel` elements, last layers first — `zerokit.zero.flat_buffer`),
# `self.unit_of[p]`, `self.position[p]` (p's place in its unit), `self.grad_shards[i]` (this rank's shard of unit i's gradient, what the
# step uses), the fp32 masters and AdamW, one post-accumulate-grad hook per parameter, and
# `step()`. Yours:
# - `on_grad_ready(p)`: copy `p.grad` into its unit's bucket (`self.buckets[i]`, created on
#   the unit's first gradient), drop `p.grad`; when the bucket is full, wait for the
#   reduction already in flight, then launch this bucket's asynchronous reduce-scatter
#   (divided by N) into `self.grad_shards[i]`;
# - `wait_in_flight()`: wait for the reductions in flight and free their buckets;
# - `finish()`: called after backward — the last bucket too, and reset for the next step.
#
# **What the grader checks** (2 ranks, AdamW, 3 steps; `zerokit.grade.checks("05")`):
# - `gradient-shards` — each rank's shards equal its slices of the mean gradient;
# - `reduce-scatter-in-backward` — one reduce-scatter per bucket, launched during backward, no
#   all-reduce; ring cost `theory.comm_bytes_per_step(2, …)`;
# - `buckets-freed` — the gradient bytes alive during backward stay within two buckets, and
#   nothing is left after `finish()`;
# - `freed-after-reduction` — no bucket was freed or written to before its reduce-scatter was
#   waited for (the grader runs asynchronous collectives at their `wait()`, so this shows every
#   time, not by chance);
# - `same-as-one-process` — the parameters equal single-process AdamW's.
#
# **Time.** About 50 minutes.
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
from zerokit.zero.flat_buffer import FlatUnit, assign_units

EXERCISE = "05_zero2"

# %%
class Zero2:
    """Gradients reduce-scattered bucket by bucket during backward; only this rank's shard of them is kept."""

    def __init__(self, model: torch.nn.Module, lr: float, bucket_numel: int, group=None):
        self.group = group
        self.world = dist.get_world_size(group)
        params = list(model.parameters())
        self.units = [FlatUnit([params[k] for k in members], self.world, dist.get_rank(group), i)
                      for i, members in enumerate(assign_units(params, bucket_numel))]
        self.unit_of = {p: unit for unit in self.units for p in unit.params}
        self.position = {p: k for unit in self.units for k, p in enumerate(unit.params)}  # p's index in its unit
        self.grad_shards = [unit.new_shard() for unit in self.units]
        self.masters = [torch.nn.Parameter(unit.shard(unit.data).clone()) for unit in self.units]
        self.optimizer = torch.optim.AdamW(self.masters, lr=lr)
        self.buckets = {}      # unit index -> its flat gradient bucket, alive until its reduction is done
        self.ready = [0] * len(self.units)
        self.in_flight = []    # (unit index, work) of reductions launched and not yet waited for
        for p in params:
            p.register_post_accumulate_grad_hook(self.on_grad_ready)

    def on_grad_ready(self, p: torch.nn.Parameter) -> None:
        raise NotImplementedError("copy p.grad into its unit's bucket and drop it; when the bucket is full: wait_in_flight(), divide it by N, launch its async reduce-scatter into self.grad_shards[i]")

    def wait_in_flight(self) -> None:
        raise NotImplementedError('wait for every reduction in flight, then free its bucket (del self.buckets[i])')

    def finish(self) -> None:
        """After backward: the last reductions waited for and freed, the counters reset."""
        raise NotImplementedError('wait_in_flight(), then reset the counters')

    def step(self) -> None:
        for master, grad in zip(self.masters, self.grad_shards):
            master.grad = grad
        self.optimizer.step()
        for unit, master in zip(self.units, self.masters):
            zerokit.comm.all_gather(unit.data, master.detach(), group=self.group)

# %% [markdown]
# Try it: how many bytes of gradients does a rank keep between backward and the step?

# %%
if __name__ == "__main__":
    def demo(ctx):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        zero = Zero2(model, lr=1e-2, bucket_numel=100)
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(ctx.rank))
        F.mse_loss(model(x), torch.zeros(4, 4)).backward()
        zero.finish()
        kept = sum(s.numel() * 4 for s in zero.grad_shards)
        full = sum(p.numel() * 4 for p in model.parameters())
        zero.step()
        return f"{len(zero.units)} buckets; gradient bytes kept {kept} of {full}"

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
if __name__ == "__main__":  # check `gradient-shards`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["gradient-shards"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `reduce-scatter-in-backward`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["reduce-scatter-in-backward"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `buckets-freed`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["buckets-freed"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `freed-after-reduction`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["freed-after-reduction"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `same-as-one-process`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["same-as-one-process"])
    assert report.passed, report
