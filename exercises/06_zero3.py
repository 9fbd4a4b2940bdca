# %% [markdown]
# # Exercise 06 · ZeRO-3: gather and free, unit by unit
#
# **Goal.** Shard the parameters too: at rest a rank holds only its 1/N of every parameter,
# gradient and optimizer state (16Ψ/N in all). Each block of the model is a **unit**, and
# four hooks give it a lifecycle (ZeRO §5.3; FSDP2's `fully_shard`):
#
# 1. before the block's forward — **all-gather** the unit (its parameters exist again);
# 2. after its forward — **free** it (storage resized to 0 bytes);
# 3. before its backward (a hook on the gradient of the block's output) — **all-gather** it
#    again: the tensors autograd saved share the unit's storage, so they see it come back;
# 4. once every parameter of the unit has its gradient — **reduce-scatter** the gradients into
#    this rank's shard (divided by N) and free the unit.
#
# Traffic per step: two all-gathers and a reduce-scatter of every unit, 3(N−1)/N·Ψ·4 — 1.5×
# DDP, for every N.
#
# **Interface.** `Zero3(model, lr, group=None)` for an `nn.Sequential` of blocks. Given: one
# `FlatUnit` per block (`self.units`, freed at rest), the parameter shards `self.shards[i]`
# (what the optimizer steps), the gradient shards `self.grad_shards[i]`, the hook
# registration, `step()`. Yours: `gather(i)`, `free(i)`, and the four hooks `pre_forward(i)`,
# `post_forward(i, output)`, `pre_backward(i)`, `post_backward(i, p)`. Prefetching the next
# unit is optional: the grader allows two units gathered at once.
#
# **What the grader checks** (2 ranks, 4 blocks, SGD, 2 steps; `zerokit.grade.checks("06")`):
# - `same-as-one-process` — gradient shards and parameters equal single-process training's;
# - `sharded-at-rest` — between steps every unit's storage is 0 bytes and no `p.grad` is left;
# - `freed-after-forward` — at most two units gathered at once during forward, none after it;
# - `gathered-for-backward` — backward never touches a freed unit;
# - `traffic` — 2 all-gathers + 1 reduce-scatter per unit per step: ring cost
#   `theory.comm_bytes_per_step(3, …)`.
#
# **Time.** About 60 minutes.
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

EXERCISE = "06_zero3"

# %%
class Zero3:
    """Each block is a unit: sharded at rest, gathered for its forward and again for its backward."""

    def __init__(self, model: torch.nn.Sequential, lr: float, group=None):
        self.group = group
        self.world = dist.get_world_size(group)
        rank = dist.get_rank(group)
        self.units = [FlatUnit(list(block.parameters()), self.world, rank, i) for i, block in enumerate(model)]
        self.shards = [torch.nn.Parameter(unit.shard(unit.data).clone()) for unit in self.units]
        self.grad_shards = [unit.new_shard() for unit in self.units]
        self.optimizer = torch.optim.SGD(self.shards, lr=lr)
        self.position = {p: k for unit in self.units for k, p in enumerate(unit.params)}
        self.ready = [0] * len(self.units)
        for unit in self.units:
            unit.free()  # at rest: nothing but the shards
        for i, block in enumerate(model):
            block.register_forward_pre_hook(lambda module, args, i=i: self.pre_forward(i))
            block.register_forward_hook(lambda module, args, output, i=i: self.post_forward(i, output))
            for p in self.units[i].params:
                p.register_post_accumulate_grad_hook(lambda p, i=i: self.post_backward(i, p))

    def gather(self, i: int) -> None:
        """Unit i's full parameters from every rank's shard."""
        raise NotImplementedError("allocate the unit's storage again (unit.materialize()), then all-gather self.shards[i] into unit.data")

    def free(self, i: int) -> None:
        raise NotImplementedError("release unit i's full parameters (unit.free() resizes the storage to 0 bytes)")

    def pre_forward(self, i: int) -> None:
        raise NotImplementedError("the unit's parameters are needed now")

    def post_forward(self, i: int, output: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("free the unit, and register a hook on the output's gradient that calls pre_backward(i); return the output")

    def pre_backward(self, i: int) -> None:
        raise NotImplementedError("backward is about to use the unit's parameters")

    def post_backward(self, i: int, p: torch.nn.Parameter) -> None:
        raise NotImplementedError("count p; once the unit's last gradient is in, copy them into a flat bucket, drop every p.grad, divide by N, reduce-scatter into self.grad_shards[i], free the unit, reset the count")

    def step(self) -> None:
        for shard, grad in zip(self.shards, self.grad_shards):
            shard.grad = grad
        self.optimizer.step()

# %% [markdown]
# Try it: how many bytes of parameters does a rank hold at rest, and how many during the
# forward of one block?

# %%
if __name__ == "__main__":
    def demo(ctx):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
        zero = Zero3(model, lr=0.1)
        held = lambda: sum(u.data.untyped_storage().nbytes() for u in zero.units)  # noqa: E731
        during = []
        model[1].register_forward_pre_hook(lambda module, args: during.append(held()))
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(ctx.rank))
        F.mse_loss(model(x), torch.zeros(4, 4)).backward()
        zero.step()
        shards = sum(s.numel() * 4 for s in zero.shards)
        return f"at rest {held()} B gathered + {shards} B of shards; during block 1's forward {during[0]} B gathered"

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
if __name__ == "__main__":  # check `same-as-one-process`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["same-as-one-process"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `sharded-at-rest`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["sharded-at-rest"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `freed-after-forward`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["freed-after-forward"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `gathered-for-backward`, 1 point
    report = zerokit.grade(globals(), EXERCISE, checks=["gathered-for-backward"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `traffic`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["traffic"])
    assert report.passed, report
