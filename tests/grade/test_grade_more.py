"""Exercises 10-12 (sequence parallelism, CPU offload of the optimizer step, a checkpointing policy): the
solution and zerokit's own implementation pass every check, and each planted wrong answer fails the check that
names it, in a learner's words.

One launch per exercise: the solution and its wrong variants are loaded as submissions, and every rank runs the
exercise's scenario on each of them in turn (the grader's fresh seed and probe for each, as
``zerokit.grade.core`` does); each check then judges each submission's measurements. Every wrong answer here
gives wrong numbers, never an error or a hang, so the variants can share the ranks. (``tests/grade/test_grade.py``
grades the solutions and the untouched exercises one by one, through ``zerokit.grade``.)
"""
from __future__ import annotations

import pytest
import torch

from planted import assert_each_named, assert_passes, grade_on_shared_ranks, load_variants, planted, solution

#: key -> {wrong answer: ([(old, new) edits of the solution], the check that must fail, words its message holds)}
WRONG = {
    "10_sequence_parallel": {
        "ḡ as an all-reduce, then a slice": (
            [("        ctx.group = group\n        return reduce_scatter_sequence(x, group)\n",
              "        ctx.group = group\n        total = x.contiguous().clone()\n"
              "        zerokit.comm.all_reduce(total, group=group)\n"
              "        r, n = dist.get_rank(group), dist.get_world_size(group)\n        s = x.shape[1] // n\n"
              "        return total[:, r * s:(r + 1) * s].contiguous()\n")],
            "traffic", "sends twice a reduce-scatter's bytes"),
        "g's backward keeps a slice without summing": (
            [("        return reduce_scatter_sequence(grad, ctx.group), None\n",
              "        r, n = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)\n"
              "        s = grad.shape[1] // n\n        return grad[:, r * s:(r + 1) * s].contiguous(), None\n")],
            "g", "without summing"),
        "the replicated gradients never summed": (
            [("    flat = torch.cat([p.grad.reshape(-1) for p in params])\n"
              "    zerokit.comm.all_reduce(flat, group=group)\n", "    flat = torch.cat([p.grad.reshape(-1) for p in params])\n")],
            "replicated-grads", "this rank's own part"),
        "b2 added on every rank before ḡ": (
            [("    y = ReduceScatterToSequenceParallelRegion.apply(F.linear(h, w2_shard), group)\n"
              "    return x_shard + y + b2\n",
              "    y = ReduceScatterToSequenceParallelRegion.apply(F.linear(h, w2_shard, b2), group)\n"
              "    return x_shard + y\n")],
            "same-as-unsharded", "(N−1)·b2"),
    },
    "11_cpu_offload": {
        "the parameters never copied back": (
            [("        copy(param_shard, self.master.detach().to(param_shard.dtype), \"h2d\", \"params\")\n", "")],
            "same-as-on-device", "never came back"),
        "Adam steps the device's shard": (
            [("        self.master = torch.nn.Parameter(to_host(param_shard.detach(), \"master\").float())\n",
              "        self.master = torch.nn.Parameter(param_shard)\n"),
             ("        copy(param_shard, self.master.detach().to(param_shard.dtype), \"h2d\", \"params\")\n", "")],
            "no-device-optimizer", "optimizer state on the device"),
    },
    "12_checkpoint_policy": {
        "blocks run without Recompute": (
            [("        x = Recompute.apply(run, x, *run.parameters())\n", "        x = run(x)\n")],
            "stored-bytes", "every block's activations are still saved"),
        "the parameters' gradients not returned": (
            [("        grads = torch.autograd.grad(y, (x, *params), grad)\n        return (None, *grads)\n",
              "        (gx,) = torch.autograd.grad(y, (x,), grad)\n        return (None, gx, *[None] * len(params))\n")],
            "same-gradients", "got no gradient"),
        "Chen's √n whatever A is": (
            [("    return min(range(1, n + 1), key=lambda k: (math.ceil(n / k) * boundary_bytes + k * layer_bytes, k))\n",
              "    return max(1, round(math.sqrt(n)))\n")],
            "best-k", "√n is Chen's answer"),
        "the input kept as an attribute of ctx": (
            [("        ctx.save_for_backward(x, *params)\n", "        ctx.kept = (x, *params)\n"),
             ("        x, *params = ctx.saved_tensors\n", "        x, *params = ctx.kept\n")],
            "stored-bytes", "nothing saved"),
        "a recompute that does not restore the RNG state": (
            [("        ctx.rng = torch.get_rng_state()\n", ""),
             ("        with torch.random.fork_rng(), torch.enable_grad():\n            torch.set_rng_state(ctx.rng)\n",
              "        with torch.enable_grad():\n")],
            "rng-state", "other dropout masks"),
        "the short last segment dropped": (
            [("    return [(start, min(start + k, n)) for start in range(0, n, k)]\n",
              "    return [(start, start + k) for start in range(0, n - k + 1, k)]\n")],
            "segments", "are in no segment"),
    },
}


#: key -> the library's own version of what the learner writes, appended to the solution (it replaces the names):
#: the grader must pass zerokit's implementation too
LIBRARY = {
    "10_sequence_parallel": """
from zerokit.tensor_parallel import mappings as _lib


def all_gather_sequence(x, group=None):
    return _lib.all_gather_along(x, 1, group, "g")


def reduce_scatter_sequence(x, group=None):
    return _lib.reduce_scatter_along(x, 1, group, "g_bar")


class GatherFromSequenceParallelRegion:
    apply = staticmethod(_lib.gather_from_sequence_parallel_region)


class ReduceScatterToSequenceParallelRegion:
    apply = staticmethod(_lib.reduce_scatter_to_sequence_parallel_region)
""",
    "11_cpu_offload": """
from zerokit.offload.host_optimizer import HostOptimizer as _Lib
from zerokit.optim import OptimizerSpec as _Spec


class HostAdam:
    def __init__(self, param_shard, lr):
        self.lib = _Lib([param_shard], _Spec("adamw", lr=lr, weight_decay=0.01))
        self.master, self.host_grad, self.optimizer = self.lib.masters[0], self.lib.host_grads[0], self.lib.optimizer

    def step(self, grad_shard, param_shard):
        self.lib.step([grad_shard])
""",
    "12_checkpoint_policy": """
from zerokit.activation_checkpointing import apply_checkpointing as _lib


def checkpointed_forward(blocks, x, k):
    _lib(blocks, "every_k", every=k)
    return blocks(x)
""",
}


def _grade_all(tmp_path, key) -> dict:
    """{submission: {check: CheckResult}} for the solution and each wrong answer, one launch per scenario."""
    source = solution(key)
    variants = {"solution": source, "library": source + LIBRARY[key],
                **{what: planted(source, edits, f"{key}, {what}") for what, (edits, _, _) in WRONG[key].items()}}
    return grade_on_shared_ranks(key, load_variants(tmp_path, key, variants))


@pytest.mark.parametrize("key", list(WRONG))
def test_solution_and_library_pass_and_each_wrong_answer_is_named(tmp_path, key):
    graded = _grade_all(tmp_path, key)
    for right in ("solution", "library"):
        assert_passes(graded, right, f"{key}: ")
    assert_each_named(graded, WRONG[key], f"{key}, ")
