"""Exercise 02: naive data parallelism — each rank its share of the batch, gradients averaged after backward.

Interface: ``shard_batch(inputs, targets, rank, world_size)`` returns this rank's 1/N of
the global batch; ``average_gradients(model, group=None)`` makes every ``p.grad`` the mean
over the ranks, after backward. ``shard_batch`` is graded on its own, called as each of 2
ranks would call it (a pure function: an ``average_gradients`` still unwritten fails only the
checks that need it); then three SGD steps of the grader's MLP
(:func:`zerokit.grade.reference.mlp`, described in every message that names one of its
parameters) on 2 ranks against one process training on the whole batch (ZeRO §2.1: DDP), and
the all-reduce traffic against :func:`zerokit.theory.comm_bytes_per_step` (stage 0).
"""
from __future__ import annotations

import torch

from ... import theory
from .. import reference as ref
from ..core import Check, Exercise, Fail, learner_answer, learner_call, Scenario
from .common import per_step_traffic

STEPS = 3
LR = 0.1
#: ranks in both scenarios
N = 2


def _row_of(batch: torch.Tensor, row: torch.Tensor) -> int:
    for i in range(batch.shape[0]):
        if torch.equal(batch[i], row):
            return i
    return -1


def _shards(ctx, ns, probe):
    """Scenario ``shards`` (no ranks, in the submission's process): shard_batch on its own — it is a pure function —
    called as each of the N ranks would call it on step 0's batch, so that an average_gradients still unwritten
    fails only the checks that need it. Each rank's answer: the rows of the global batch it took (-1: not a row of
    it), or what the call raised."""
    x, y = ref.batch(0)
    answers = []
    for rank in range(N):
        outcome = learner_call(ns["shard_batch"], x, y, rank, N)
        if "value" in outcome:
            got = outcome["value"]
            pair = isinstance(got, (tuple, list)) and len(got) == 2
            if pair and all(torch.is_tensor(t) and t.dim() == 2 for t in got):
                outcome = {"value": ([_row_of(x, row) for row in got[0]], [_row_of(y, row) for row in got[1]])}
            else:
                outcome = {"returned": _shape_of(got)}
        answers.append(outcome)
    return answers


def _shape_of(value) -> str:
    """What a call returned, in a few words."""
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}: " + ", ".join(_shape_of(v) for v in value[:3])
    if torch.is_tensor(value):
        return f"a tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _train(ctx, ns, probe):
    model = ref.mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    out = {}
    for step in range(STEPS):
        x, y = ref.batch(step)
        xs, ys = ns["shard_batch"](x, y, ctx.rank, ctx.world_size)
        with probe.phase("backward"):
            ref.mse(model(xs), ys).backward()
        if step == 0:
            out["local_grads"] = ref.named_grads(model)
        with probe.phase("average"):
            ns["average_gradients"](model)
        if step == 0:
            out["grads"] = ref.named_grads(model)
        optimizer.step()
        optimizer.zero_grad()
    return {**out, "params": ref.named_params(model), "calls": probe.calls()}


def reference_run():
    return ref.train_single(ref.mlp, STEPS, lambda p: torch.optim.SGD(p, lr=LR), ref.batch)


def _judge_shard(results, ns):
    n, rows = len(results), ref.batch(0)[0].shape[0]
    seen: dict = {}
    for rank, outcome in enumerate(results):
        if "returned" in outcome:
            raise Fail(f"shard_batch(inputs, targets, rank={rank}, world_size={n}) returned {outcome['returned']}: "
                       f"return the pair (inputs, targets), each this rank's rows of the batch", rank=rank)
        mine, target_rows = learner_answer(outcome, f"shard_batch(inputs, targets, rank={rank}, world_size={n})")
        if len(mine) != rows // n:
            raise Fail(f"rank {rank} trains on {len(mine)} rows of the global batch of {rows}; with N = {n} ranks "
                       f"each takes {rows // n}" + (" — every rank took the whole batch" if len(mine) == rows else ""),
                       rows // n, len(mine), rank)
        if -1 in mine or target_rows != mine:
            raise Fail(f"rank {rank}'s inputs or targets are not rows of the global batch, or they no longer "
                       f"match each other: slice inputs and targets the same way", rank=rank)
        for i in mine:
            if i in seen:
                raise Fail(f"ranks {seen[i]} and {rank} both train on row {i}: the shards must not overlap — rank r "
                           f"takes rows [r·B/N, (r+1)·B/N)", rank=rank)
            seen[i] = rank
    return f"each of the {n} ranks trains on its own {rows // n} rows; together they cover the batch of {rows}"


#: what the grader's model is called where a message describes it
MODEL = "The grader's MLP"


def _never_reduced(r: dict, expected: dict) -> list:
    """The parameters whose gradient after average_gradients is still this rank's own (and not the whole batch's)."""
    return [name for name, want in expected.items()
            if not torch.allclose(r["grads"][name], want, atol=ref.GRAD_ATOL * 10)
            and torch.allclose(r["grads"][name], r["local_grads"][name], atol=1e-7)]


def _judge_mean(results, ns):
    reference = reference_run()
    expected, model = reference["grads"][0], reference["model"]
    n = len(results)
    for rank, r in enumerate(results):
        diff, name = ref.worst(r["grads"], expected)
        if diff <= ref.GRAD_ATOL * 10:
            continue
        if any(g is None for g in r["grads"].values()):
            raise Fail(f"rank {rank}: some p.grad is None after average_gradients", rank=rank)
        got, want = ref.flat(r["grads"]), ref.flat(expected)
        multiple = ref.describe_multiple(ref.ratio(got, want), n)
        own = _never_reduced(r, expected)
        if len(own) == len(expected):
            why = "p.grad still holds this rank's own gradient: nothing was reduced over the ranks"
        elif own:
            rest = len(expected) - len(own)
            raise Fail(f"rank {rank}: {len(own)} of the {len(expected)} gradients were never reduced over the ranks "
                       f"— {', '.join(own)} still hold{'s' if len(own) == 1 else ''} this rank's own gradient, while "
                       f"the other {rest} equal{'s' if rest == 1 else ''} the whole batch's. "
                       f"{ref.describe_model(model, MODEL)}; a parameter is named by its layer's index, e.g. "
                       f"{ref.describe_parameter(model, own[-1])}",
                       f"all {len(expected)} gradients reduced", f"{len(own)} never reduced", rank,
                       hint="every parameter's gradient is a sum over the ranks' shares of the batch, biases too: "
                            "reduce each one that model.parameters() lists — one left out keeps this rank's own "
                            "gradient, and the replicas drift apart")
        else:
            why = multiple or (f"max |Δ| = {diff:.3g} in {ref.describe_parameter(model, name)}. "
                               f"{ref.describe_model(model, MODEL)}")
        raise Fail(f"rank {rank}'s gradients after average_gradients differ from the single-process gradient of "
                   f"the whole batch: {why}", 0.0, f"max |Δ| = {diff:.3g} ({name})", rank)
    return "every rank's gradient equals the whole batch's gradient in one process (max |Δ| ≤ 1e-5)"


def _judge_params(results, ns):
    reference = reference_run()
    expected, model = reference["params"], reference["model"]
    for rank, r in enumerate(results):
        diff, name = ref.worst(r["params"], expected)
        if diff > ref.PARAM_ATOL:
            raise Fail(f"after {STEPS} SGD steps rank {rank}'s {ref.describe_parameter(model, name)}, differs from "
                       f"single-process training by {diff:.3g}. {ref.describe_model(model, MODEL)}",
                       f"≤ {ref.PARAM_ATOL:g}", f"{diff:.3g}", rank)
    return f"after {STEPS} steps every rank's parameters equal single-process training's (max |Δ| ≤ {ref.PARAM_ATOL:g})"


def _judge_traffic(results, ns):
    psi = sum(t.numel() for t in results[0]["params"].values())
    n = len(results)
    expected = theory.comm_bytes_per_step(0, psi, n, 4)
    for rank, r in enumerate(results):
        payload, cost, ops = per_step_traffic(r["calls"], STEPS, "average")
        if ops - {"all_reduce"}:
            raise Fail(f"rank {rank} used {', '.join(sorted(ops))}: average every gradient with one all-reduce "
                       f"(sum), then divide by N", "all_reduce", ", ".join(sorted(ops)), rank)
        if cost != expected:
            what = "nothing" if payload == 0 else f"{payload / (4 * psi):.3g}× the gradients"
            raise Fail(f"rank {rank} all-reduced {payload:,.0f} B of payload per step ({what}); every gradient "
                       f"once is Ψ·4 = {4 * psi:,} B, whose ring cost is 2(N−1)/N·Ψ·4",
                       f"{expected:,} B ring cost", f"{cost:,.0f} B", rank)
    return (f"payload Ψ·4 = {4 * psi:,} B per step; ring cost {expected:,} B = 2(N−1)/N·Ψ·4 "
            f"(theory.comm_bytes_per_step(0, Ψ, N, 4))")


EXERCISE = Exercise(
    key="02_naive_ddp",
    title="Naive data parallelism: average after backward",
    minutes=25,
    needs=("shard_batch", "average_gradients"),
    scenarios={"shards": Scenario("shards", 0, _shards), "train": Scenario("train", N, _train)},
    checks=[
        Check("batch-shards", 2, "shards", _judge_shard,
              "data parallelism splits the global batch: rank r trains on rows [r·B/N, (r+1)·B/N)"),
        Check("mean-gradient", 3, "train", _judge_mean,
              "with a mean loss, the whole batch's gradient is the mean of the ranks' gradients: sum with an "
              "all-reduce, divide by N"),
        Check("same-as-one-process", 3, "train", _judge_params,
              "identical replicas + identical averaged gradients = identical steps: DDP trains exactly like one "
              "process on the whole batch"),
        Check("traffic", 2, "train", _judge_traffic,
              "one all-reduce of every gradient per step: 2(N−1)/N·Ψ·4 bytes sent per rank in fp32"),
    ],
    hints=[
        "Data parallelism: every rank holds the whole model and trains on its own share of the batch; after backward "
        "the ranks' gradients are combined so that every replica takes the step one process would take on the whole "
        "batch.",
        "shard_batch: B rows over N ranks give each rank B/N consecutive rows — rank r takes rows r·B/N up to "
        "(r+1)·B/N, the same rows of the inputs and of the targets.",
        "average_gradients: one all-reduce per gradient sums it over the ranks, in place (dist.all_reduce, with the "
        "group passed along); the mean is that sum divided by the number of ranks in the group. Every parameter that "
        "has a gradient, the biases too.",
        "Why divide by N and not by B: each rank's loss is already a mean over its own rows; with equal shards, the "
        "mean over the ranks of those means is the mean over the whole batch.",
        "The code:\n"
        "def shard_batch(inputs, targets, rank, world_size):\n"
        "    per = inputs.shape[0] // world_size\n"
        "    rows = slice(rank * per, (rank + 1) * per)\n"
        "    return inputs[rows], targets[rows]\n"
        "def average_gradients(model, group=None):\n"
        "    n = dist.get_world_size(group)\n"
        "    for p in model.parameters():\n"
        "        if p.grad is not None:\n"
        "            dist.all_reduce(p.grad, group=group)\n"
        "            p.grad.div_(n)",
    ],
)
