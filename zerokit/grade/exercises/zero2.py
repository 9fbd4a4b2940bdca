"""Exercise 05: ZeRO-2's bucketed reduce-scatter with freeing (P_os+g, ZeRO §5.2).

Interface: ``Zero2(model, lr, bucket_numel, group=None)``. Given: the flat units
(:func:`zerokit.zero.flat_buffer.assign_units`, one :class:`FlatUnit` per bucket), the
gradient shards ``self.grad_shards``, the masters and AdamW, the hooks, ``step()``. The
learner writes ``on_grad_ready(p)`` (copy into the unit's bucket, drop ``p.grad``, launch
the bucket's asynchronous reduce-scatter when full, at most one other in flight),
``wait_in_flight()`` (wait, then free each bucket: ``del self.buckets[i]``) and
``finish()``. Graded on 2 ranks: the gradient shards and the parameters against
single-process AdamW, the collectives against :func:`zerokit.theory.comm_bytes_per_step`
(stage 2), the gradient bytes alive during backward, and the probe's check that no bucket
was freed or reused before its reduction was waited for.
"""
from __future__ import annotations

import torch

from ... import theory
from ...zero.flat_buffer import assign_units
from .. import reference as ref
from ..core import Check, Exercise, Fail, Scenario
from .common import by_op, describe_ops, same_params, unwaited

STEPS = 3
LR = 1e-2
N = 2
SIZES = (8, 16, 16, 16, 16, 4)
BUCKET_NUMEL = 300


def _model():
    return ref.mlp(SIZES)


def _alive(t) -> int:
    return 0 if t is None else t.untyped_storage().nbytes()


def _train(ctx, ns, probe):
    model = _model()
    zero = ns["Zero2"](model, LR, BUCKET_NUMEL)
    params = list(model.parameters())
    samples = []

    def sample(_=None):  # registered after the learner's hooks: runs once theirs has
        samples.append(sum(_alive(b) for b in zero.buckets.values()) + sum(_alive(p.grad) for p in params))

    for p in params:
        p.register_post_accumulate_grad_hook(sample)
    rows = ref.local_rows(12, ctx.rank, ctx.world_size)
    out = {}
    for step in range(STEPS):
        x, y = ref.batch(step)
        with probe.phase("backward"):
            ref.mse(model(x[rows]), y[rows]).backward()
        with probe.phase("finish"):
            zero.finish()
        if step == 0:
            out["grad_shards"] = [s.detach().clone() for s in zero.grad_shards]
            out["left_after_finish"] = {"buckets": len(zero.buckets),
                                        "grads": sum(p.grad is not None for p in params)}
        with probe.phase("step"):
            zero.step()
    return {**out, "peak_grad_bytes": max(samples), "params": ref.named_params(model), "calls": probe.calls()}


def reference_run():
    return ref.train_single(_model, STEPS, lambda p: torch.optim.AdamW(p, lr=LR), ref.batch)


def _units():
    params = list(_model().parameters())
    return [[params[i] for i in members] for members in assign_units(params, BUCKET_NUMEL)]


def _judge_shards(results, ns):
    n = len(results)
    grads = list(reference_run()["grads"][0].values())
    units = assign_units(list(_model().parameters()), BUCKET_NUMEL)
    for rank, r in enumerate(results):
        for u, members in enumerate(units):
            flat = torch.cat([grads[k].reshape(-1) for k in members])
            shard = -(-flat.numel() // n)
            padded = torch.zeros(n * shard)
            padded[:flat.numel()] = flat
            mine, got = padded[rank * shard:(rank + 1) * shard], r["grad_shards"][u]
            diff = float((got - mine).abs().max())
            if diff > 1e-6:
                why = ref.describe_multiple(ref.ratio(got, mine), n) or f"max |Δ| = {diff:.3g}"
                if float(got.abs().max()) == 0:
                    why = "it is zero: the bucket's reduce-scatter never wrote into self.grad_shards"
                raise Fail(f"rank {rank}'s gradient shard of unit {u} is not its slice of the mean gradient: {why}",
                           0.0, f"max |Δ| = {diff:.3g}", rank)
    return f"each rank keeps only its shard of every unit's mean gradient ({len(units)} units)"


def _judge_collectives(results, ns):
    n = len(results)
    sizes = [sum(p.numel() for p in unit) for unit in _units()]
    psi = sum(sizes)
    expected = theory.comm_bytes_per_step(2, psi, n, 4, units=sizes)
    for rank, r in enumerate(results):
        backward = [c for c in r["calls"] if c["phase"] in ("backward", "finish")]
        ops = by_op(backward)
        if "all_reduce" in ops:
            raise Fail(f"rank {rank} all-reduces its gradient buckets: every rank then receives the whole mean "
                       f"gradient and drops what it does not own — that is 'all-reduce then drop' (zerokit's "
                       f"zero2-naive), not ZeRO-2, which reduce-scatters each bucket to its owners",
                       "reduce_scatter", describe_ops(ops, STEPS), rank)
        scatters = [c for c in backward if c["op"] == "reduce_scatter"]
        if len(scatters) != STEPS * len(sizes) or not all(c["in_backward"] for c in scatters):
            late = sum(not c["in_backward"] for c in scatters)
            raise Fail(f"rank {rank}: {len(scatters) / STEPS:g} reduce-scatters per step, {late // STEPS} of them "
                       f"after backward; ZeRO-2 launches one per bucket from the hook that fills it",
                       f"{len(sizes)} during backward", f"{len(scatters) / STEPS:g}", rank)
    cost = sum(theory.ring_bytes_sent(c["op"], c["nbytes"], n) for c in results[0]["calls"]
               if c["op"] in ("reduce_scatter", "all_gather")) / STEPS
    if cost != expected:
        raise Fail(f"rank 0's ring cost per step is {cost:,.0f} B", f"{expected:,} B", f"{cost:,.0f} B", 0)
    return (f"{len(sizes)} reduce-scatters per step, launched during backward, + the step's all-gathers: ring cost "
            f"{expected:,} B = theory.comm_bytes_per_step(2, …), DDP's bytes")


def _judge_freed(results, ns):
    sizes = sorted((-(-sum(p.numel() for p in unit) // N) * N * 4 for unit in _units()), reverse=True)
    bound, full = sizes[0] + sizes[1], 4 * sum(p.numel() for p in _model().parameters())
    for rank, r in enumerate(results):
        left = r["left_after_finish"]
        if left["grads"]:
            raise Fail(f"rank {rank} still holds p.grad for {left['grads']} parameters after backward: once a "
                       f"gradient is copied into its bucket, drop it (p.grad = None)", 0, left["grads"], rank)
        if left["buckets"]:
            raise Fail(f"rank {rank} still holds {left['buckets']} bucket(s) after finish(): once a bucket's "
                       f"reduce-scatter has been waited for, free it (del self.buckets[i])", 0, left["buckets"], rank)
        if r["peak_grad_bytes"] > bound:
            raise Fail(f"rank {rank} held {r['peak_grad_bytes']:,} B of gradients at once during backward (all of "
                       f"them are {full:,} B): a bucket must be freed as soon as its reduce-scatter is done, so that "
                       f"at most two are alive — the one filling and the one reducing",
                       f"≤ {bound:,} B (the two largest buckets)", f"{r['peak_grad_bytes']:,} B", rank)
    return (f"peak gradient memory in backward {results[0]['peak_grad_bytes']:,} B ≤ two buckets ({bound:,} B), "
            f"not the full {full:,} B; nothing left after finish()")


def _judge_in_flight(results, ns):
    for rank, r in enumerate(results):
        missing = unwaited(r["calls"])
        if missing:
            raise Fail(f"rank {rank} never waited for {len(missing)} reduce-scatter(s): finish() must wait for "
                       f"every reduction still in flight", 0, len(missing), rank)
    return "every bucket was freed only after its reduce-scatter was waited for, and none was reused in flight"


def _same_params(results) -> str:
    reference = reference_run()
    return same_params(results, reference["params"], STEPS, "AdamW", model=reference["model"])


EXERCISE = Exercise(
    key="05_zero2",
    title="ZeRO-2: bucketed reduce-scatter with freeing",
    minutes=50,
    needs=("Zero2",),
    scenarios={"train": Scenario("train", N, _train)},
    checks=[
        Check("gradient-shards", 3, "train", _judge_shards,
              "each full bucket is divided by N and reduce-scattered: rank r keeps the sum of its chunk only"),
        Check("reduce-scatter-in-backward", 2, "train", _judge_collectives,
              "ZeRO-2 reduces each bucket to its owners during backward (a reduce-scatter), then frees it"),
        Check("buckets-freed", 2, "train", _judge_freed,
              "no rank ever holds all the gradients: a shard + at most two buckets (ZeRO §5.2)"),
        Check("freed-after-reduction", 2, "train", _judge_in_flight,
              "memory handed to an asynchronous collective belongs to it until wait() returns",
              catches=("freed-in-flight", "overwritten-in-flight")),
        Check("same-as-one-process", 2, "train",
              lambda results, ns: _same_params(results),
              "the shards of the mean gradient step the masters; the all-gather brings every rank the update"),
    ],
    hints=[
        "ZeRO-2 shards the gradients too: a unit's gradients live in a full-size bucket only until they are "
        "reduce-scattered to their owners; then the bucket is freed, and each rank keeps only its shard. Reducing "
        "during backward overlaps the communication, and at most two buckets are alive at once.",
        "on_grad_ready: find p's unit; its bucket (a new flat buffer of the unit) is made on the unit's first "
        "gradient. Copy p's gradient into its view of the bucket, drop p's own gradient (set it to None: that memory "
        "is what ZeRO-2 saves) and count it.",
        "When the unit's count reaches its number of parameters: first wait for the reduction already in flight (so at "
        "most two buckets live), then divide the bucket by N and launch its reduce-scatter asynchronously into the "
        "unit's gradient shard, keeping the unit's index and the work.",
        "wait_in_flight: wait for each work, and only then free its bucket — freeing it right after the launch hands "
        "the collective memory it is still reading. finish: wait for the last one, and reset the counters for the next "
        "step.",
        "The code:\n"
        "on_grad_ready(p):\n"
        "    unit = self.unit_of[p]\n"
        "    i = unit.index\n"
        "    if i not in self.buckets:\n"
        "        self.buckets[i] = unit.new_flat()\n"
        "    unit.views(self.buckets[i])[self.position[p]].copy_(p.grad)\n"
        "    p.grad = None\n"
        "    self.ready[i] += 1\n"
        "    if self.ready[i] == len(unit.params):\n"
        "        self.wait_in_flight()\n"
        "        self.buckets[i].div_(self.world)\n"
        "        work = zerokit.comm.reduce_scatter(self.grad_shards[i], self.buckets[i], group=self.group, "
        "async_op=True)\n"
        "        self.in_flight.append((i, work))\n"
        "wait_in_flight:\n"
        "    for i, work in self.in_flight:\n"
        "        work.wait()\n"
        "        del self.buckets[i]\n"
        "    self.in_flight = []\n"
        "finish:\n"
        "    self.wait_in_flight()\n"
        "    self.ready = [0] * len(self.units)",
    ],
)
