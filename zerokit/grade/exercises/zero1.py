"""Exercise 04: a ZeRO-1 sharded optimizer step (P_os, ZeRO §5.1).

Interface: ``Zero1(model, lr, group=None)`` lays the parameters out in one flat unit
(:class:`zerokit.zero.flat_buffer.FlatUnit`, padded to a multiple of N; the gradients
accumulate into a flat buffer of the same layout) and builds ``self.optimizer``, an AdamW
over this rank's shard only; ``step()`` reduce-scatters the mean gradient into the shard,
steps it, and all-gathers the updated shards; ``zero_grad()`` is given. Graded on 2 ranks
against single-process AdamW, the optimizer-state bytes against
:func:`zerokit.theory.model_state_bytes` and the traffic against
:func:`zerokit.theory.comm_bytes_per_step` (stage 1).
"""
from __future__ import annotations

import torch

from ... import theory
from .. import reference as ref
from ..core import Check, Exercise, Fail, Scenario
from .common import by_op, describe_ops, per_step_traffic, same_params

STEPS = 3
LR = 1e-2
N = 2


def state_bytes(optimizer) -> int:
    """Bytes of the optimizer's state tensors, each storage once."""
    seen, total = set(), 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() not in seen:
                seen.add(value.untyped_storage().data_ptr())
                total += value.untyped_storage().nbytes()
    return total


def stepped_gradient(optimizer) -> torch.Tensor:
    """The gradients of the tensors the optimizer steps, flattened in order."""
    grads = [p.grad.reshape(-1) for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    return torch.cat(grads) if grads else torch.zeros(0)


def _train(ctx, ns, probe):
    model = ref.mlp()
    zero = ns["Zero1"](model, LR)
    rows = ref.local_rows(12, ctx.rank, ctx.world_size)
    out = {}
    for step in range(STEPS):
        x, y = ref.batch(step)
        with probe.phase("backward"):
            ref.mse(model(x[rows]), y[rows]).backward()
        with probe.phase("step"):
            zero.step()
        if step == 0:
            out["grad_shard"] = stepped_gradient(zero.optimizer).detach().clone()
        zero.zero_grad()
    out["optimizer_bytes"] = state_bytes(zero.optimizer)
    out["optimizer_tensors"] = sum(len(g["params"]) for g in zero.optimizer.param_groups)
    return {**out, "params": ref.named_params(model), "calls": probe.calls()}


def reference_run():
    return ref.train_single(ref.mlp, STEPS, lambda p: torch.optim.AdamW(p, lr=LR), ref.batch)


def _psi() -> int:
    return sum(p.numel() for p in ref.mlp().parameters())


def _judge_grad_shard(results, ns):
    n, psi = len(results), _psi()
    shard = theory.shard_numel([psi], n)
    full = torch.zeros(n * shard)
    full[:psi] = ref.flat(reference_run()["grads"][0])
    for rank, r in enumerate(results):
        got = r["grad_shard"]
        if got.numel() != shard:
            what = " — the whole gradient: each rank steps only its 1/N" if got.numel() >= psi else ""
            raise Fail(f"rank {rank}'s optimizer steps {got.numel()} gradient elements{what}",
                       f"{shard} (Ψ = {psi} padded to a multiple of N, / N)", got.numel(), rank)
        mine = full[rank * shard:(rank + 1) * shard]
        diff = float((got - mine).abs().max())
        if diff > 1e-6:
            others = [k for k in range(n) if k != rank and torch.allclose(got, full[k * shard:(k + 1) * shard],
                                                                            atol=1e-6)]
            why = (f"it is rank {others[0]}'s shard: rank r owns elements [r·s, (r+1)·s)" if others else
                   ref.describe_multiple(ref.ratio(got, mine), n) or f"max |Δ| = {diff:.3g}")
            raise Fail(f"rank {rank}'s gradient shard is not its slice of the mean gradient: {why}", 0.0,
                       f"max |Δ| = {diff:.3g}", rank)
    return f"each rank steps its {shard} elements of the mean gradient (Ψ = {psi}, N = {n})"


def _judge_memory(results, ns):
    n, psi = len(results), _psi()
    for rank, r in enumerate(results):
        tensors = r["optimizer_tensors"]
        expected = theory.model_state_bytes(1, psi, n, "fp32", "adamw", units=[psi], optimizer_tensors=tensors)
        if r["optimizer_bytes"] != expected.optimizer:
            full = theory.model_state_bytes(0, psi, n, "fp32", "adamw", optimizer_tensors=tensors).optimizer
            why = (" — AdamW's m and v for every parameter, as DDP keeps them: build the optimizer over this "
                   "rank's shard only" if r["optimizer_bytes"] >= full else "")
            raise Fail(f"rank {rank}'s optimizer holds {r['optimizer_bytes']:,} B of state{why}",
                       f"8·Ψ/N + 4·{tensors} = {expected.optimizer:,} B", f"{r['optimizer_bytes']:,} B", rank)
    return (f"optimizer states 8·Ψ/N + 4 (Adam's step) = {expected.optimizer:,} B per rank, "
            f"theory.model_state_bytes(1, …).optimizer; DDP would hold {8 * psi + 4 * 8:,} B")


def _judge_params(results, ns):
    reference = reference_run()
    expected = reference["params"]
    initial = ref.named_params(ref.mlp())
    n, psi = len(results), _psi()
    shard = theory.shard_numel([psi], n)
    for rank, r in enumerate(results):
        diff, name = ref.worst(r["params"], expected)
        if diff <= ref.PARAM_ATOL:
            continue
        got, start = ref.flat(r["params"]), ref.flat(initial)
        outside = torch.ones(psi, dtype=torch.bool)
        outside[rank * shard:(rank + 1) * shard] = False
        if torch.equal(got[outside], start[outside]):
            raise Fail(f"rank {rank}'s parameters outside its own shard never changed: each rank steps its shard, "
                       f"then the updated shards are all-gathered so that every rank holds the whole model again",
                       "all-gathered", "only the own shard updated", rank)
    return same_params(results, expected, STEPS, "AdamW", model=reference["model"])


def _judge_traffic(results, ns):
    n, psi = len(results), _psi()
    expected = theory.comm_bytes_per_step(1, psi, n, 4, units=[psi])
    for rank, r in enumerate(results):
        ops = by_op(r["calls"], "step")
        _, cost, _ = per_step_traffic(r["calls"], STEPS, "step")
        if "all_reduce" in ops:
            raise Fail(f"rank {rank} all-reduces its gradients: every rank receives the whole mean gradient but "
                       f"steps only 1/N of it — a reduce-scatter delivers just the own shard, half the bytes of "
                       f"an all-reduce (ZeRO §7.2)", "reduce_scatter + all_gather",
                       ", ".join(sorted(ops)), rank)
        if set(ops) != {"reduce_scatter", "all_gather"} or cost != expected:
            raise Fail(f"rank {rank}'s collectives per step: {describe_ops(ops, STEPS)}; ZeRO-1 sends one "
                       f"reduce-scatter and one all-gather of the padded buffer", f"{expected:,} B ring cost",
                       f"{cost:,.0f} B", rank)
    return (f"one reduce-scatter and one all-gather of the padded buffer per step: ring cost {expected:,} B = "
            f"2(N−1)/N·Ψ·4, the same as DDP (theory.comm_bytes_per_step(1, …))")


EXERCISE = Exercise(
    key="04_zero1",
    title="ZeRO-1: a sharded optimizer step",
    minutes=35,
    needs=("Zero1",),
    scenarios={"train": Scenario("train", N, _train)},
    checks=[
        Check("gradient-shard", 3, "train", _judge_grad_shard,
              "ZeRO-1 reduce-scatters the mean gradient: rank r receives the sum of chunk r only (divide by N first)"),
        Check("optimizer-states-sharded", 2, "train", _judge_memory,
              "P_os: each rank keeps AdamW's m and v for its 1/N of the parameters (ZeRO §5.1)"),
        Check("same-as-one-process", 3, "train", _judge_params,
              "step the own shard, then all-gather every rank's updated shard into the full parameters"),
        Check("traffic", 2, "train", _judge_traffic,
              "reduce-scatter + all-gather = an all-reduce cut in half: ZeRO-1 sends what DDP sends"),
    ],
    hints=[
        "ZeRO-1 shards the optimizer states: each rank keeps Adam's moments, and the fp32 master copy they update, for "
        "its own 1/N of the parameters only. A step reduces the gradients to each shard's owner, steps the shard, and "
        "gathers the updated shards back to every rank.",
        "__init__: the shard is this rank's view of the flat parameters (self.unit cuts them into N shards). Copy it "
        "into a Parameter of its own, the master the optimizer steps, and build AdamW over that one tensor with the "
        "given lr.",
        "step: a reduce-scatter does the reduction and the sharding at once — rank r receives the sum, over the ranks, "
        "of chunk r of the flat gradients. Divide them by N first (the mean), receive into a shard-sized buffer, make "
        "it the master's gradient, step.",
        "Then the way back: an all-gather of every rank's updated master shard into the flat parameters "
        "(self.unit.data), which the model's parameters are views of, so that every rank holds the whole updated model "
        "again.",
        "The code:\n"
        "__init__:\n"
        "    self.master = torch.nn.Parameter(self.unit.shard(self.unit.data).clone())\n"
        "    self.optimizer = torch.optim.AdamW([self.master], lr=lr)\n"
        "step:\n"
        "    self.grads.div_(self.world)\n"
        "    grad_shard = torch.empty_like(self.master)\n"
        "    zerokit.comm.reduce_scatter(grad_shard, self.grads, group=self.group)\n"
        "    self.master.grad = grad_shard\n"
        "    self.optimizer.step()\n"
        "    zerokit.comm.all_gather(self.unit.data, self.master.detach(), group=self.group)",
    ],
)
