# %% [markdown]
# # Exercise 11 · CPU offload of the optimizer step (ZeRO-Offload)
#
# **Goal.** Adam's states are the largest model state: with an fp32 master they are
# 12 bytes per parameter of a rank's shard, against the 2–4 bytes of the parameter itself.
# ZeRO-Offload (Ren et al., 2101.06840 §4) keeps them off the accelerator: after backward,
# each rank copies its reduced **gradient shard** to the host (device → host, d2h), the host
# runs the Adam step on the fp32 **master** of that shard, and the updated parameters are
# copied back (host → device, h2d) to be all-gathered as usual. The accelerator then holds
# no optimizer state at all; the host holds the master, m, v and the gradient buffer; the
# link carries the shard twice per step.
#
# **Interface.** `HostAdam(param_shard, lr)` — `param_shard` is this rank's flat shard of
# the parameters, on the device. Yours:
# - in `__init__`: `self.master`, an fp32 `torch.nn.Parameter` on the host holding a copy of
#   the shard; `self.host_grad`, a host buffer for the gradient shard; `self.optimizer`, a
#   `torch.optim.AdamW` over the master alone;
# - `step(grad_shard, param_shard)`: the gradient shard to the host, the Adam step there,
#   the updated master back into `param_shard`.
#
# Every copy between the device and the host goes through `zerokit.offload.transfers`:
# `to_host(t)` (a new host copy, d2h), `host_empty(like)` (a host buffer) and
# `copy(dst, src, "d2h" | "h2d")`, which count the bytes that cross. On this CPU machine
# both sides are the same memory, but the copies and their bytes are real; where a tensor
# lives is told by what it was made from: an optimizer over the device's shard keeps its
# states on the device (torch allocates `exp_avg` next to the parameter). The rest —
# one flat unit, the gradients reduce-scattered to the rank's shard, the all-gather after
# the step — is given (`Zero2Offload`).
#
# **What the grader checks** (2 ranks, AdamW, 3 steps; `zerokit.grade.checks("11")`):
# - `same-as-on-device` — the parameters equal single-process AdamW's (the on-device step's);
# - `no-device-optimizer` — the memory ledger counts 0 bytes of optimizer state on the device;
# - `host-states` — the ledger's host bytes (master, m, v, step; the gradient buffer) equal
#   `theory.offload_model_state_bytes(2, …, precision="fp32")`'s host part;
# - `transfers` — per step one d2h copy of the gradient shard and one h2d copy of the
#   parameter shard, `theory.offload_transfer_bytes(2, shard, 4)`.
#
# **Time.** About 30 minutes.
#
# **How to work.** Replace each `raise NotImplementedError(...)`, run the demo, grade with the
# last cell; `hint(EXERCISE)` unfolds one hint at a time. Cells under
# `if __name__ == "__main__":` do not run when the grader loads your notebook.
# `zerokit/offload/host_optimizer.py` holds the library's version, to compare with afterwards.

# %%
import torch
import torch.distributed as dist
import torch.nn.functional as F

import zerokit
from zerokit.grade import hint
from zerokit.offload.transfers import copy, host_empty, to_host
from zerokit.zero.flat_buffer import FlatUnit

EXERCISE = "11_cpu_offload"

# %%
class HostAdam:
    """AdamW on the host: the fp32 master of this rank's shard, its states, and the copies across."""

    def __init__(self, param_shard: torch.Tensor, lr: float):
        raise NotImplementedError('self.master (a Parameter: the host copy of param_shard, fp32), self.host_grad (a host buffer like it), self.optimizer (AdamW over the master)')

    def step(self, grad_shard: torch.Tensor, param_shard: torch.Tensor) -> None:
        """The gradient shard out (d2h), Adam on the host, the updated parameters back into param_shard (h2d)."""
        raise NotImplementedError('copy the gradient shard into self.host_grad (d2h); step the master with it; copy the master into param_shard (h2d)')

# %%
class Zero2Offload:
    """Given: one flat unit; the mean gradient reduce-scattered to this rank's shard; the step on the host."""

    def __init__(self, model: torch.nn.Module, lr: float, group=None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.unit = FlatUnit(list(model.parameters()), self.world, dist.get_rank(group))
        self.grads = self.unit.new_flat()
        for p, grad in zip(self.unit.params, self.unit.views(self.grads)):
            p.grad = grad  # autograd accumulates into the flat gradient buffer
        self.grad_shard = self.unit.new_shard()                       # on the device: the reduced gradient shard
        self.param_shard = self.unit.shard(self.unit.data).clone()     # on the device: this rank's parameters
        self.host = HostAdam(self.param_shard, lr)

    def step(self) -> None:
        self.grads.div_(self.world)
        zerokit.comm.reduce_scatter(self.grad_shard, self.grads, group=self.group)
        self.host.step(self.grad_shard, self.param_shard)
        zerokit.comm.all_gather(self.unit.data, self.param_shard, group=self.group)
        self.grads.zero_()

# %% [markdown]
# Try it: what crossed the link in one step, and how many bytes of optimizer state the host holds.

# %%
if __name__ == "__main__":
    def demo(ctx):
        from zerokit.offload.transfers import ledger

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        zero = Zero2Offload(model, lr=1e-2)
        ledger().reset()
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(ctx.rank))
        F.mse_loss(model(x), torch.zeros(4, 4)).backward()
        zero.step()
        crossed = {d: sum(r.payload_bytes for r in ledger().select(d, exclude_setup=False)) for d in ("d2h", "h2d")}
        state = sum(t.numel() * t.element_size() for s in zero.host.optimizer.state.values() for t in s.values())
        return f"d2h {crossed['d2h']} B, h2d {crossed['h2d']} B; host Adam states {state} B"

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
if __name__ == "__main__":  # check `same-as-on-device`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["same-as-on-device"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `no-device-optimizer`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["no-device-optimizer"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `host-states`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["host-states"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `transfers`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["transfers"])
    assert report.passed, report
