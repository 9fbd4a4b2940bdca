"""Exercise 03: bucketed, overlapped data parallelism — gradient hooks, buckets, the end-of-backward wait.

Interface: ``make_buckets(params, bucket_numel)`` and ``BucketedDDP(model, bucket_numel,
group=None)`` whose post-accumulate-grad hooks copy each gradient into its bucket and
launch the bucket's asynchronous all-reduce as soon as it is full, and whose ``finish()``
(called after backward) waits for every bucket and copies the averages back into
``p.grad``. ``self.buckets`` (lists of parameters, in reduction order) is part of the
interface. Graded: ``make_buckets`` on its own (a pure function, called in the submission's
process on the grader's MLP: a ``BucketedDDP`` still unwritten fails only the checks that need
it); then on 2 ranks an MLP in 3 buckets, and a model with tied weights (torch's reducer,
picotron's DP wrapper; zerokit's ``ddp`` strategy).
"""
from __future__ import annotations

import torch

from ... import theory
from .. import reference as ref
from ..core import Check, Exercise, Fail, learner_answer, learner_call, Scenario
from ..probe import Mistake
from .common import same_params, unwaited

STEPS = 2
LR = 0.1
BUCKET_NUMEL = 200
TIED_BUCKET_NUMEL = 50


def _run(make_model, get_batch, loss_fn, bucket_numel):
    def fn(ctx, ns, probe):
        model = make_model()
        names = {p: n for n, p in model.named_parameters()}
        holders = {n: [m for m, mod in model.named_modules() if any(q is p for q in mod.parameters(recurse=False))]
                   for p, n in names.items()}
        ddp = ns["BucketedDDP"](model, bucket_numel)
        _refuse_duplicates(ddp.buckets, names, holders)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        out = {"buckets": [[names.get(p, "?") for p in bucket] for bucket in ddp.buckets], "holders": holders}
        rows = ref.local_rows(12, ctx.rank, ctx.world_size)
        for step in range(STEPS):
            x, y = get_batch(step)
            with probe.phase("backward"):
                loss_fn(model(x[rows]), y[rows]).backward()
            with probe.phase("finish"):
                ddp.finish()
            if step == 0:
                out["grads"] = ref.named_grads(model)
            optimizer.step()
            optimizer.zero_grad()
        return {**out, "params": ref.named_params(model), "calls": probe.calls()}
    return fn


def _buckets(ctx, ns, probe):
    """Scenario ``buckets`` (no ranks, in the submission's process): make_buckets on its own — a pure function — on
    the grader's MLP's parameters, so that a BucketedDDP still unwritten fails only the checks that need it. The
    buckets as parameter names, or what the call raised."""
    model = ref.mlp()
    names = {p: n for n, p in model.named_parameters()}

    def buckets():
        return [[names.get(p, "?") for p in bucket] for bucket in ns["make_buckets"](list(model.parameters()),
                                                                                      BUCKET_NUMEL)]

    return learner_call(buckets)


def _refuse_duplicates(buckets, names, holders) -> None:
    """Stop the run (every rank alike, before any collective) if a parameter sits in the buckets twice."""
    listed = [names.get(p, "?") for bucket in buckets for p in bucket]
    for name in dict.fromkeys(listed):
        if listed.count(name) > 1:
            shared = " and ".join(holders.get(name, [])) or "two modules"
            raise Mistake("tied-duplicate", f"parameter {name!r} is in the buckets {listed.count(name)} times: it "
                                            f"is one tensor shared by the modules {shared} (tied weights), so "
                                            f"listing parameters module by module gives it twice — two hooks "
                                            f"would fire for it in one backward and count its bucket wrong. "
                                            f"model.parameters() lists a shared tensor once")


def reference_run(tied: bool = False):
    if tied:
        return ref.train_single(ref.tied_lm, STEPS, lambda p: torch.optim.SGD(p, lr=LR), ref.token_batch,
                                ref.cross_entropy)
    return ref.train_single(ref.mlp, STEPS, lambda p: torch.optim.SGD(p, lr=LR), ref.batch)


def expected_buckets(named_sizes, bucket_numel):
    """The rule: reverse registration order, a bucket closes once it holds at least ``bucket_numel`` elements."""
    buckets, current, size = [], [], 0
    for name, numel in reversed(named_sizes):
        current.append(name)
        size += numel
        if size >= bucket_numel:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def _judge_buckets(results, ns):
    sizes = [(n, p.numel()) for n, p in ref.mlp().named_parameters()]
    expected = expected_buckets(sizes, BUCKET_NUMEL)
    got = learner_answer(results, f"make_buckets(params, bucket_numel={BUCKET_NUMEL})")
    if got != expected:
        why = ""
        if got and got[0] and got[0][0] == sizes[0][0]:
            why = ": the first bucket starts with the first layer — backward produces the last layer's gradients " \
                  "first, so buckets are filled in reverse registration order"
        raise Fail(f"buckets for bucket_numel = {BUCKET_NUMEL} differ from the rule{why}", expected, got)
    return f"{len(expected)} buckets, last layer first: {expected}"


def _judge_gradients(results, ns):
    expected = reference_run()["grads"][0]
    n = len(results)
    for rank, r in enumerate(results):
        diff, name = ref.worst(r["grads"], expected)
        if diff <= 1e-5:
            continue
        missing = unwaited(r["calls"])
        got, want = ref.flat(r["grads"]), ref.flat(expected)
        if missing:
            why = f"{len(missing)} all-reduce(s) were launched but never waited for, so their averages never " \
                  f"arrived (see 'waited-before-step')"
        elif float(got.abs().max()) == 0:
            why = "every gradient is zero: copy the reduced buckets back into p.grad in finish()"
        else:
            model = reference_run()["model"]
            why = ref.describe_multiple(ref.ratio(got, want), n) or \
                f"max |Δ| = {diff:.3g} in {ref.describe_parameter(model, name)} ({ref.describe_model(model)})"
        raise Fail(f"rank {rank}'s gradients after finish() differ from the whole batch's gradient: {why}",
                   0.0, f"max |Δ| = {diff:.3g} ({name})", rank)
    reference = reference_run()
    return same_params(results, reference["params"], STEPS, "SGD", model=reference["model"]) + \
        "; step-0 gradients equal too"


def _step_calls(r):
    return [c for c in r["calls"] if c["op"] in ("all_reduce", "reduce_scatter", "all_gather")]


def _judge_calls(results, ns):
    psi = sum(t.numel() for t in results[0]["params"].values())
    buckets = len(results[0]["buckets"])
    expected_cost = theory.comm_bytes_per_step(0, psi, len(results), 4)
    for rank, r in enumerate(results):
        calls = _step_calls(r)
        ops = {c["op"] for c in calls}
        per_step, payload = len(calls) / STEPS, sum(c["nbytes"] for c in calls) / STEPS
        if ops != {"all_reduce"} or per_step != buckets or payload != 4 * psi:
            raise Fail(f"rank {rank} issued {per_step:g} collective(s) ({', '.join(sorted(ops)) or 'none'}) of "
                       f"{payload:,.0f} B per step; one all-reduce per bucket of every gradient once is {buckets} "
                       f"calls of Ψ·4 = {4 * psi:,} B in all", f"{buckets} calls, {4 * psi:,} B",
                       f"{per_step:g} calls, {payload:,.0f} B", rank)
    return (f"{buckets} all-reduces per step, one per bucket, Ψ·4 = {4 * psi:,} B of payload; ring cost "
            f"{expected_cost:,} B (theory.comm_bytes_per_step(0, Ψ, N, 4))")


def _judge_overlap(results, ns):
    for rank, r in enumerate(results):
        calls = _step_calls(r)
        late = [c for c in calls if not c["in_backward"]]
        blocking = [c for c in calls if c["in_backward"] and not c["async_op"]]
        if late:
            raise Fail(f"rank {rank} launched {len(late)} of {len(calls)} all-reduces after backward had ended: "
                       f"that is bucketing without overlap — launch a bucket from the hook that completes it",
                       "all launched during backward", f"{len(calls) - len(late)} during backward", rank)
        if blocking:
            raise Fail(f"rank {rank}'s hooks ran {len(blocking) // STEPS} all-reduce(s) per step synchronously: "
                       f"backward stops until "
                       f"each finishes, so nothing overlaps — launch with async_op=True, keep the work, wait in "
                       f"finish()", "async_op=True", "async_op=False", rank)
    return "every bucket's all-reduce was launched asynchronously from a gradient hook, during backward"


def _judge_waited(results, ns):
    for rank, r in enumerate(results):
        missing = unwaited(r["calls"])
        if missing:
            raise Fail(f"rank {rank} never waited for {len(missing)} all-reduce(s) (#{missing[0]['index']}, "
                       f"{missing[0]['nbytes']} B, …): the optimizer would step on gradients still in flight — "
                       f"finish() waits for every work before copying the averages back", 0, len(missing), rank)
    return "finish() waited for every all-reduce before the optimizer step"


def _judge_tied(results, ns):
    expected = reference_run(tied=True)
    for rank, r in enumerate(results):
        diff, name = ref.worst(r["grads"], expected["grads"][0])
        if diff > 1e-5:
            raise Fail(f"with tied weights rank {rank}'s gradient of {name} differs from one process by {diff:.3g}",
                       0.0, f"{diff:.3g}", rank)
    return same_params(results, expected["params"], STEPS, "SGD", model=expected["model"]) + \
        " (embedding tied to the head)"


CONCEPT_HOOK = ("p.register_post_accumulate_grad_hook(fn) calls fn(p) once p.grad holds this backward's gradient; "
                "when a bucket's last gradient arrives, launch its all-reduce")
EXERCISE = Exercise(
    key="03_bucketed_ddp",
    title="Bucketed, overlapped data parallelism",
    minutes=50,
    needs=("make_buckets", "BucketedDDP"),
    scenarios={"buckets": Scenario("buckets", 0, _buckets),
               "train": Scenario("train", 2, _run(ref.mlp, ref.batch, ref.mse, BUCKET_NUMEL)),
               "tied": Scenario("tied", 2, _run(ref.tied_lm, ref.token_batch, ref.cross_entropy,
                                                TIED_BUCKET_NUMEL))},
    checks=[
        Check("buckets", 2, "buckets", _judge_buckets,
              "buckets hold parameters in reverse registration order (backward's order); a bucket closes once it "
              "holds bucket_numel elements"),
        Check("same-as-one-process", 3, "train", _judge_gradients,
              "each bucket is divided by N and all-reduced (summed): every rank gets the mean gradient"),
        Check("one-all-reduce-per-bucket", 2, "train", _judge_calls,
              "buckets change the number of calls, never the bytes: one all-reduce per bucket, Ψ·4 B per step"),
        Check("overlap", 2, "train", _judge_overlap, CONCEPT_HOOK),
        Check("waited-before-step", 1, "train", _judge_waited,
              "the end-of-backward wait: every async all-reduce must be waited for before the optimizer reads "
              "p.grad"),
        Check("tied-weights", 2, "tied", _judge_tied,
              "a tensor shared by two modules is one parameter: one slot, one hook, one gradient per backward",
              catches=("tied-duplicate",)),
    ],
    hints=[
        "Overlap communication with backward: gradients become ready last layer first, so parameters are grouped into "
        "buckets in that order and each bucket is reduced as soon as its last gradient arrives, while backward still "
        "computes the earlier layers. Buckets change the number of calls, never the bytes.",
        "make_buckets: walk the parameters from last to first, adding each to the current bucket; close the bucket "
        "once it holds bucket_numel elements or more. The last, partial bucket counts too.",
        "__init__: list the model's parameters once (a tied tensor is one parameter), cut them into buckets, give each "
        "bucket one flat buffer of zeros and each parameter its slot in it (bucket, offset), a counter per bucket, and "
        "on every parameter a post-accumulate-grad hook (p.register_post_accumulate_grad_hook) that calls "
        "on_grad_ready.",
        "on_grad_ready: copy the gradient into its slot and count it; when the bucket's count reaches its length, "
        "divide the buffer by N and launch its all-reduce asynchronously (async_op=True), keeping the work. finish: "
        "wait for every work, copy each slot back into its p.grad, reset the counters and the works. torch's DDP runs "
        "this from a callback queued on the autograd engine, so its users never call it.",
        "The code:\n"
        "make_buckets:\n"
        "    buckets, current, size = [], [], 0\n"
        "    for p in reversed(params):\n"
        "        current.append(p)\n"
        "        size += p.numel()\n"
        "        if size >= bucket_numel:\n"
        "            buckets.append(current)\n"
        "            current, size = [], 0\n"
        "    return buckets + ([current] if current else [])\n"
        "__init__:\n"
        "    params = [p for p in model.parameters() if p.requires_grad]\n"
        "    self.buckets = make_buckets(params, bucket_numel)\n"
        "    self.buffers = [torch.zeros(sum(p.numel() for p in bucket)) for bucket in self.buckets]\n"
        "    self.slot[p] = (b, offset)  # for each p: its bucket, and the elements before it there\n"
        "    p.register_post_accumulate_grad_hook(self.on_grad_ready)  # for each p\n"
        "on_grad_ready(p):\n"
        "    b, offset = self.slot[p]\n"
        "    self.buffers[b][offset:offset + p.numel()].copy_(p.grad.reshape(-1))\n"
        "    self.ready[b] += 1\n"
        "    if self.ready[b] == len(self.buckets[b]):\n"
        "        self.buffers[b].div_(self.world)\n"
        "        self.works.append(dist.all_reduce(self.buffers[b], group=self.group, async_op=True))\n"
        "finish:\n"
        "    for work in self.works:\n"
        "        work.wait()\n"
        "    p.grad.copy_(self.buffers[b][offset:offset + p.numel()].view_as(p))  # for each p\n"
        "    self.works, self.ready = [], [0] * len(self.buckets)",
    ],
)
