"""Exercise 06: ZeRO-3's gather/free hooks (P_os+g+p, ZeRO §5.3; FSDP2's hook lifecycle).

Interface: ``Zero3(model, lr, group=None)`` for an ``nn.Sequential`` of blocks, one
:class:`FlatUnit` per block (``self.units``), parameter shards ``self.shards`` and gradient
shards ``self.grad_shards``; the learner writes ``gather``, ``free`` and the four hooks.
Graded on 2 ranks: the gradient shards and the parameters (reassembled from every rank's
shards) against single-process SGD, the units' storage at rest / during / after forward,
backward never touching a freed unit, and the traffic against
:func:`zerokit.theory.comm_bytes_per_step` (stage 3).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ... import theory
from .. import reference as ref
from ..core import Check, Exercise, Fail, Scenario
from ..probe import Mistake
from .common import by_op, describe_ops

STEPS = 2
LR = 0.1
N = 2


def blocks() -> nn.Sequential:
    """Four blocks (Linear + tanh), the unit of ZeRO-3's gather and free, from a fixed seed."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.Tanh()), nn.Sequential(nn.Linear(16, 16), nn.Tanh()),
                         nn.Sequential(nn.Linear(16, 16), nn.Tanh()), nn.Linear(16, 4))


def _held(unit) -> int:
    return unit.data.untyped_storage().nbytes()


def _train(ctx, ns, probe):
    model = blocks()
    zero = ns["Zero3"](model, LR)
    units = zero.units
    during = []
    for block in model:  # after the learner's pre-hook: the unit should be gathered now
        block.register_forward_pre_hook(lambda module, args: during.append(sum(_held(u) > 0 for u in units)))
    rows = ref.local_rows(12, ctx.rank, ctx.world_size)
    out = {"at_rest": [[_held(u) for u in units]], "after_forward": [], "grads_left": []}
    for step in range(STEPS):
        x, y = ref.batch(step)
        with probe.phase("forward"):
            loss = ref.mse(model(x[rows]), y[rows])
        out["after_forward"].append(sum(_held(u) > 0 for u in units))
        with probe.phase("backward"):
            try:
                loss.backward()
            except RuntimeError as e:
                if "storage of size 0" in str(e) or "not allocated" in str(e):
                    raise Mistake("used-while-freed", "backward needed a unit's parameters while they were freed "
                                                      "(its storage had 0 bytes): gather the unit again before its "
                                                      "backward — a hook on the gradient of the block's output") from e
                raise
        out["grads_left"].append(sum(p.grad is not None for p in model.parameters()))
        if step == 0:
            out["grad_shards"] = [g.detach().clone() for g in zero.grad_shards]
        with probe.phase("step"):
            zero.step()
        out["at_rest"].append([_held(u) for u in units])
    out["shards"] = [s.detach().clone() for s in zero.shards]
    out["peak_during_forward"] = max(during) if during else 0
    return {**out, "calls": probe.calls()}


def reference_run():
    return ref.train_single(blocks, STEPS, lambda p: torch.optim.SGD(p, lr=LR), ref.batch)


def _unit_flats(tensors: dict) -> list:
    """The reference's tensors laid out unit by unit (one unit per block), each flattened."""
    model = blocks()
    names = {id(p): n for n, p in model.named_parameters()}
    return [torch.cat([tensors[names[id(p)]].reshape(-1) for p in block.parameters()]) for block in model]


def _shard_of(flat: torch.Tensor, rank: int, n: int) -> torch.Tensor:
    shard = -(-flat.numel() // n)
    padded = torch.zeros(n * shard)
    padded[:flat.numel()] = flat
    return padded[rank * shard:(rank + 1) * shard]


def _judge_parity(results, ns):
    n = len(results)
    expected = reference_run()
    grads, params = _unit_flats(expected["grads"][0]), _unit_flats(expected["params"])
    for rank, r in enumerate(results):
        for u, flat in enumerate(grads):
            got, want = r["grad_shards"][u], _shard_of(flat, rank, n)
            diff = float((got - want).abs().max())
            if diff > 1e-6:
                why = ref.describe_multiple(ref.ratio(got, want), n) or f"max |Δ| = {diff:.3g}"
                raise Fail(f"rank {rank}'s gradient shard of unit {u} is not its slice of the mean gradient: {why}",
                           0.0, f"max |Δ| = {diff:.3g}", rank)
    for u, flat in enumerate(params):
        whole = torch.cat([r["shards"][u] for r in results])[:flat.numel()]
        diff = float((whole - flat).abs().max())
        if diff > ref.PARAM_ATOL:
            raise Fail(f"after {STEPS} SGD steps unit {u}'s parameters (every rank's shard put together) differ from "
                       f"single-process training by {diff:.3g}", f"≤ {ref.PARAM_ATOL:g}", f"{diff:.3g}")
    return f"gradient shards and, after {STEPS} SGD steps, the parameters equal single-process training's"


def _judge_rest(results, ns):
    for rank, r in enumerate(results):
        for when, held in enumerate(r["at_rest"]):
            if any(held):
                moment = "before the first step" if when == 0 else f"after step {when}"
                raise Fail(f"rank {rank} holds gathered parameters {moment}: units {[u for u, b in enumerate(held) if b]}"
                           f" are not freed (a unit's storage is resized to 0 bytes once its backward is done)",
                           "0 B per unit", f"{held} B", rank)
        if any(r["grads_left"]):
            raise Fail(f"rank {rank} keeps p.grad for {max(r['grads_left'])} parameters after backward: once a "
                       f"unit's gradients are reduce-scattered into its shard, drop them", 0, max(r["grads_left"]),
                       rank)
    return "between steps every unit's storage is 0 bytes and no p.grad is left: only the shards remain"


def _judge_forward(results, ns):
    for rank, r in enumerate(results):
        if max(r["after_forward"]):
            raise Fail(f"rank {rank} still holds {max(r['after_forward'])} gathered unit(s) after the forward: free "
                       f"each unit once its forward is done (and gather it again for backward) — keeping it is "
                       f"ZeRO-2's memory (FSDP's reshard_after_forward=False)", 0, max(r["after_forward"]), rank)
        if r["peak_during_forward"] > 2:
            raise Fail(f"rank {rank} held {r['peak_during_forward']} units gathered at once during forward",
                       "at most 2 (this one and a prefetched one)", r["peak_during_forward"], rank)
    return (f"at most {results[0]['peak_during_forward']} unit(s) gathered at once during forward, none after it")


def _judge_backward(results, ns):
    units = len(results[0]["shards"])
    for rank, r in enumerate(results):
        gathers = sum(1 for c in r["calls"] if c["op"] == "all_gather" and c["phase"] == "backward") / STEPS
        if gathers < units:
            kept = " — the units were still gathered from the forward (see 'freed-after-forward')" \
                if max(r["after_forward"]) else ""
            raise Fail(f"rank {rank} gathered {gathers:g} units per backward{kept}", units, gathers, rank)
    return f"every unit gathered again before its backward ({units} all-gathers per backward)"


def _judge_traffic(results, ns):
    n = len(results)
    sizes = [sum(p.numel() for p in block.parameters()) for block in blocks()]
    expected = theory.comm_bytes_per_step(3, sum(sizes), n, 4, units=sizes)
    for rank, r in enumerate(results):
        ops = by_op(r["calls"])
        if "all_reduce" in ops:
            raise Fail(f"rank {rank} all-reduces: ZeRO-3 reduce-scatters each unit's gradients to their owners",
                       "all_gather + reduce_scatter", describe_ops(ops, STEPS), rank)
        gathers = ops.get("all_gather", {}).get("calls", 0) / STEPS
        scatters = ops.get("reduce_scatter", {}).get("calls", 0) / STEPS
        cost = sum(theory.ring_bytes_sent(c["op"], c["nbytes"], n) for c in r["calls"]) / STEPS
        if gathers != 2 * len(sizes) or scatters != len(sizes) or cost != expected:
            raise Fail(f"rank {rank} per step: {describe_ops(ops, STEPS)}; ZeRO-3 gathers every unit twice "
                       f"(forward and backward) and reduce-scatters it once", f"{expected:,} B ring cost",
                       f"{cost:,.0f} B", rank)
    return (f"2 all-gathers + 1 reduce-scatter of each of {len(sizes)} units per step: ring cost {expected:,} B = "
            f"3(N−1)/N·Ψ·4 (theory.comm_bytes_per_step(3, …)), 1.5 × DDP")


EXERCISE = Exercise(
    key="06_zero3",
    title="ZeRO-3: gather and free, unit by unit",
    minutes=60,
    needs=("Zero3",),
    scenarios={"train": Scenario("train", N, _train)},
    checks=[
        Check("same-as-one-process", 3, "train", _judge_parity,
              "gathered parameters compute exactly what the unsharded model computes; the reduce-scatter leaves "
              "each rank the mean gradient of its shard"),
        Check("sharded-at-rest", 2, "train", _judge_rest,
              "at rest a rank holds only its shards: 16Ψ/N of model states (ZeRO §5.3)"),
        Check("freed-after-forward", 2, "train", _judge_forward,
              "free each unit after its forward: only the unit being computed (and one prefetched) is gathered"),
        Check("gathered-for-backward", 1, "train", _judge_backward,
              "a hook on the gradient of a block's output runs just before the block's backward: gather there",
              catches=("used-while-freed",)),
        Check("traffic", 2, "train", _judge_traffic,
              "ZeRO-3 moves 3(N−1)/N·Ψ·4 per step: params gathered for forward and again for backward, gradients "
              "reduce-scattered"),
    ],
    hints=[
        "ZeRO-3 shards the parameters themselves: a unit's full parameters exist only while it computes. Gather them "
        "just before the unit's forward and again just before its backward, free them right after each, and "
        "reduce-scatter the unit's gradients as soon as they are complete.",
        "gather and free: a freed unit's flat buffer has no memory; give it its storage back (the unit materializes "
        "itself), then all-gather every rank's shard into it — the parameters are views of that buffer. free releases "
        "the storage again. pre_forward and pre_backward only gather.",
        "post_forward: free the unit, then put a hook on the gradient of the block's output: it runs when that "
        "gradient is ready, just before the block's own backward — the moment to gather again. Only an output that "
        "requires grad gets the hook (a forward under no_grad has none); return the output.",
        "post_backward runs once per parameter: count them; on the unit's last, copy the gradients into a new flat "
        "bucket of the unit and drop each parameter's own, divide by N, reduce-scatter into the unit's gradient shard, "
        "free the unit and reset the count.",
        "The code:\n"
        "gather(i):\n"
        "    self.units[i].materialize()\n"
        "    zerokit.comm.all_gather(self.units[i].data, self.shards[i].detach(), group=self.group)\n"
        "free(i):\n"
        "    self.units[i].free()\n"
        "pre_forward(i), pre_backward(i):\n"
        "    self.gather(i)\n"
        "post_forward(i, output):\n"
        "    self.free(i)\n"
        "    if output.requires_grad:\n"
        "        output.register_hook(lambda grad: self.pre_backward(i))\n"
        "    return output\n"
        "post_backward(i, p), once the unit's last gradient is in:\n"
        "    bucket = unit.new_flat()\n"
        "    for q, view in zip(unit.params, unit.views(bucket)):\n"
        "        view.copy_(q.grad)\n"
        "        q.grad = None\n"
        "    bucket.div_(self.world)\n"
        "    zerokit.comm.reduce_scatter(self.grad_shards[i], bucket, group=self.group)\n"
        "    self.free(i)\n"
        "    self.ready[i] = 0",
    ],
)
