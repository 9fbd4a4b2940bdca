# %% [markdown]
# # Exercise 13 · ZeRO-3 prefetch under a dynamic graph
#
# **Goal.** ZeRO-3 gathers each unit just before it computes (exercise 06). To hide that
# all-gather, an engine **prefetches**: while unit i computes, the gather of the unit that comes
# next is already in flight. Which unit comes next is not in the model's code — hooks only see
# units begin — so DeepSpeed's ZeRO-3 **records the order** its submodules were fetched in
# during one step (the "trace", forward and backward) and, from then on, prefetches along it.
# A model with a **data-dependent branch** (an early exit, a routed or skipped block) breaks
# the trace: the next unit is not the one recorded. DeepSpeed then invalidates it ("Invalidate
# trace cache @ step …: expected module …, but got module …"), releases what it had
# prefetched, gathers on demand, and records a new trace in the following step. FSDP2 keeps no
# such trace for forward (implicit prefetching, or the modules you name with
# `set_modules_to_forward_prefetch`); its backward prefetches in the reverse of the order this
# step's forward ran. `torch.compile` does not make the branch go away: a branch on a tensor's
# value is a graph break, one on a Python value a guard and a recompile per path, and the
# hooks still see whichever order the step takes. Every rank must take the same branch: the
# gathers are collectives (DeepSpeed checks that the recorded orders agree across ranks).
#
# Your policy, per phase (forward, backward):
#
# 1. **record** the units in the order they begin during a step;
# 2. from the next step on, **trust** that order: when unit i begins at position k and the
#    recorded order has i at k, prefetch the unit at k + 1;
# 3. when the order **diverges** (another unit at k, or more units than recorded), stop
#    trusting it for the rest of the step: **gather on demand**;
# 4. at the end of every step, the order this step took becomes the recorded one
#    (**re-record**), so a branch that stays taken is prefetched again from the next step —
#    this exercise's choice: a diverged step's order is complete, so it is recorded at once,
#    where DeepSpeed spends the next step recording.
#
# **Interface.** `PrefetchTrace()` with `next_unit(phase, i) -> int | None` (unit i's
# `"forward"` or `"backward"` begins: note it, return the unit to prefetch now or None) and
# `end_step()`; in `Zero3Prefetch(blocks, lr, group=None)` (each block a unit; exercise 06's
# hooks given, with `gather(i, async_op)`, `wait(i)`, `free(i)`, `is_gathered(i)` and
# `self.works`, the gathers in flight), `begin(phase, i)`: ask the trace, make unit i
# ready (gather on demand if it is not gathered, wait for it if it was prefetched),
# prefetch the unit ahead (an asynchronous gather, unless it is gathered already).
#
# **What the grader checks** (2 ranks, 4 blocks, block 2 taken in steps 0, 1, 4, 5 and skipped
# in steps 2, 3; SGD, 6 steps; `zerokit.grade.checks("13")`):
# - `same-as-one-process` — every step's gradient shards and the final parameters equal
#   single-process training's, which is what ZeRO-3 without prefetch computes, and no unit
#   computes while its own gather is still in flight;
# - `gathered-once` — read from the all-gathers the ranks made: in every forward and every
#   backward each unit that ran was gathered exactly once, even when the branch changed; a
#   unit that did not run was gathered at most once, only in a pass whose order left the
#   trace (the prefetch the old trace asked for); every unit is freed by the end of the step;
# - `prefetched-ahead` — wherever a pass repeats the previous step's order (steps 1, 3 and 5:
#   the trace holds, re-recorded after the branch changed), the gather of the next unit was
#   launched before each unit began.
#
# **Time.** About 45 minutes.
#
# **How to work.** Replace each `raise NotImplementedError(...)`, run the demo, grade with the
# last cell; `hint(EXERCISE)` unfolds one hint at a time. Cells under
# `if __name__ == "__main__":` do not run when the grader loads your notebook.

# %%
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import zerokit
from zerokit.grade import hint
from zerokit.zero.flat_buffer import FlatUnit

EXERCISE = "13_zero3_prefetch"
PHASES = ("forward", "backward")

# %%
class PrefetchTrace:
    """The order units began in during a step, trusted in the next step for as long as it holds."""

    def __init__(self):
        #: per phase, the order to trust (None: nothing recorded yet, or this step left it)
        self.recorded = {phase: None for phase in PHASES}
        #: per phase, the units this step has begun so far, in order
        self.observed = {phase: [] for phase in PHASES}
        #: how many times a step's order left the recorded one
        self.invalidations = 0

    def next_unit(self, phase: str, i: int) -> Optional[int]:
        """Unit i's forward or backward begins: note it; the unit to prefetch now, or None (gather on demand)."""
        raise NotImplementedError("append i to this step's observed order; with no trusted order, None; if the recorded order has another unit (or none) at this position, stop trusting it (recorded = None, count the invalidation) and return None; else the recorded unit after it (None at the end)")

    def end_step(self) -> None:
        """The step is over: the order it took becomes the recorded one; start observing afresh."""
        raise NotImplementedError("for each phase that saw units, recorded = a copy of this step's order; then empty every observed list")

# %%
class Zero3Prefetch:
    """ZeRO-3 over a list of blocks, one unit each (exercise 06's hooks), with trace-driven prefetch."""

    def __init__(self, blocks: nn.Module, lr: float, group=None):
        self.group = group
        self.world = dist.get_world_size(group)
        rank = dist.get_rank(group)
        self.units = [FlatUnit(list(block.parameters()), self.world, rank, i) for i, block in enumerate(blocks)]
        self.shards = [nn.Parameter(unit.shard(unit.data).clone()) for unit in self.units]
        self.grad_shards = [unit.new_shard() for unit in self.units]
        self.optimizer = torch.optim.SGD(self.shards, lr=lr)
        self.trace = PrefetchTrace()
        #: unit -> the work of its asynchronous gather, until waited for
        self.works = {}
        self.ready = [0] * len(self.units)
        #: units whose gradients were reduce-scattered in this step (a skipped block has none)
        self.reduced = [False] * len(self.units)
        self.backward_begun = False
        for unit in self.units:
            unit.free()
        for i, block in enumerate(blocks):
            block.register_forward_pre_hook(lambda module, args, i=i: self.begin("forward", i))
            block.register_forward_hook(lambda module, args, output, i=i: self.post_forward(i, output))
            for p in self.units[i].params:
                p.register_post_accumulate_grad_hook(lambda p, i=i: self.post_backward(i, p))

    # -- given: gathering, waiting, freeing ---------------------------------------------
    def is_gathered(self, i: int) -> bool:
        """Unit i's memory is there: gathered, or its gather is in flight."""
        return self.units[i].is_materialized

    def gather(self, i: int, async_op: bool = False) -> None:
        """All-gather unit i; asynchronous: the work waits in self.works[i] until wait(i)."""
        unit = self.units[i]
        unit.materialize()
        work = zerokit.comm.all_gather(unit.data, self.shards[i].detach(), group=self.group, async_op=async_op)
        if async_op:
            self.works[i] = work

    def wait(self, i: int) -> None:
        """Wait for unit i's gather if one is in flight."""
        work = self.works.pop(i, None)
        if work is not None:
            work.wait()

    def free(self, i: int) -> None:
        self.wait(i)  # memory in flight belongs to the collective until it finishes
        self.units[i].free()

    def free_unused(self) -> None:
        """Free every unit still gathered: prefetched, and not used after all."""
        for i in range(len(self.units)):
            if self.is_gathered(i):
                self.free(i)

    # -- yours -------------------------------------------------------------------------
    def begin(self, phase: str, i: int) -> None:
        """Unit i's forward or backward is about to run."""
        raise NotImplementedError('ask self.trace.next_unit(phase, i) first; gather unit i now if it is not gathered (on demand), wait for it (a prefetched gather must finish before it computes); then launch the unit ahead asynchronously unless it is gathered already')

    # -- given: exercise 06's lifecycle ------------------------------------------------------
    def post_forward(self, i: int, output: torch.Tensor) -> torch.Tensor:
        self.free(i)
        if output.requires_grad:
            output.register_hook(lambda grad: self.pre_backward(i))
        return output

    def pre_backward(self, i: int) -> None:
        if not self.backward_begun:
            self.backward_begun = True
            self.free_unused()  # what the forward prefetched for a unit that did not run
        self.begin("backward", i)

    def post_backward(self, i: int, p: nn.Parameter) -> None:
        unit = self.units[i]
        self.ready[i] += 1
        if self.ready[i] < len(unit.params):
            return
        bucket = unit.new_flat()
        for q, view in zip(unit.params, unit.views(bucket)):
            view.copy_(q.grad)
            q.grad = None
        bucket.div_(self.world)
        zerokit.comm.reduce_scatter(self.grad_shards[i], bucket, group=self.group)
        self.free(i)
        self.ready[i] = 0
        self.reduced[i] = True

    def step(self) -> None:
        self.free_unused()
        for shard, grad, reduced in zip(self.shards, self.grad_shards, self.reduced):
            shard.grad = grad if reduced else None  # a block the branch skipped has no gradient: SGD leaves it
        self.optimizer.step()
        self.reduced = [False] * len(self.units)
        self.backward_begun = False
        self.trace.end_step()

# %% [markdown]
# Try it: four blocks, block 2 skipped in steps 2 and 3. Per step, the order each pass took,
# the gathers the ranks made, and how often the trace was left.

# %%
if __name__ == "__main__":
    def demo(ctx):
        torch.manual_seed(0)
        blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])
        zero = Zero3Prefetch(blocks, lr=0.1)
        rows = []
        for step, deep in enumerate((True, True, False, False, True)):
            before = zero.trace.invalidations
            h = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
            for k, block in enumerate(blocks):
                if k != 2 or deep:  # the branch: the same on every rank, as ZeRO-3's collectives need
                    h = torch.tanh(block(h))
            F.mse_loss(h, torch.zeros(4, 8)).backward()
            order = dict(zero.trace.observed)
            zero.step()
            rows.append(f"step {step}: forward {order['forward']}, backward {order['backward']}, "
                        f"trace left {zero.trace.invalidations - before}×")
        return rows

    print("\n".join(zerokit.launch(demo, 2)[0]))

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
if __name__ == "__main__":  # check `same-as-one-process`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["same-as-one-process"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `gathered-once`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["gathered-once"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `prefetched-ahead`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["prefetched-ahead"])
    assert report.passed, report
