"""Exercise 07: Megatron's f and g, and a column → row parallel MLP (Megatron-LM 1909.08053 §3).

Interface: ``CopyToTensorParallelRegion`` (f: identity forward, all-reduce backward) and
``ReduceFromTensorParallelRegion`` (g: all-reduce forward, identity backward) as
``torch.autograd.Function``\\ s, each ``apply(x, group)``; ``shard_mlp(w1, b1, w2, rank,
world_size)`` (w1 and b1 by output features, w2 by input features); ``parallel_mlp(x, w1_shard,
b1_shard, w2_shard, b2, group=None)``. Graded: the shards on their own (``shard_mlp`` is a pure
function, called in the submission's process as each rank would call it); then on 2 ranks f and
g alone (forward and backward), the MLP (run on the grader's shards, so that each part is
judged on its own) — output and every gradient against the unsharded MLP — and the traffic
against :func:`zerokit.theory.tp_comm_bytes_per_step`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import theory
from ..core import Check, Exercise, Fail, learner_answer, learner_call, Scenario

N = 2
B, S, H, FFN = 2, 3, 8, 16


def weights():
    g = torch.Generator().manual_seed(7)
    return (torch.randn(FFN, H, generator=g) / 3, torch.randn(FFN, generator=g) / 3,
            torch.randn(H, FFN, generator=g) / 4, torch.randn(H, generator=g))


def inputs():
    g = torch.Generator().manual_seed(8)
    return torch.randn(B, S, H, generator=g), torch.randn(B, S, H, generator=g)


def unsharded(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def _shards(ctx, ns, probe):
    """Scenario ``shards`` (no ranks, in the submission's process): shard_mlp on its own — a pure function — called
    as each of the N ranks would call it, so that an f, g or parallel_mlp still unwritten fails only the checks that
    need it. Each rank's three shards, or what the call raised."""
    def shards(rank):
        w1, b1, w2, _ = weights()
        return [t.detach().clone() for t in ns["shard_mlp"](w1, b1, w2, rank, N)]

    return [learner_call(shards, rank) for rank in range(N)]


def _run(ctx, ns, probe):
    rank = ctx.rank
    x, target = inputs()
    mine = torch.Generator().manual_seed(50 + rank)
    out = {}
    with probe.phase("f"):  # f alone: the same input everywhere, a different upstream gradient per rank
        xf = x.clone().requires_grad_()
        yf = ns["CopyToTensorParallelRegion"].apply(xf, None)
        upstream = torch.randn(B, S, H, generator=mine)
        yf.backward(upstream)
        out["f"] = {"out": yf.detach(), "grad": xf.grad, "upstream": upstream}
    with probe.phase("g"):  # g alone: a different partial sum per rank, the same upstream gradient
        z = torch.randn(B, S, H, generator=mine).requires_grad_()
        yg = ns["ReduceFromTensorParallelRegion"].apply(z, None)
        yg.backward(target)
        out["g"] = {"in": z.detach(), "out": yg.detach(), "grad": z.grad}
    b2 = weights()[3]
    # the MLP runs on the grader's shards, so that parallel_mlp is judged on its own
    leaves = [t.detach().clone().requires_grad_() for t in expected_shards(rank, ctx.world_size)]
    xm, b2m = x.clone().requires_grad_(), b2.clone().requires_grad_()
    probe.reset()
    with probe.phase("mlp"):
        y = ns["parallel_mlp"](xm, *leaves, b2m)
        (y * target).sum().backward()
    out["mlp"] = {"out": y.detach(), "x": xm.grad, "w1": leaves[0].grad, "b1": leaves[1].grad,
                  "w2": leaves[2].grad, "b2": b2m.grad}
    return {**out, "calls": probe.calls()}


def reference():
    x, target = inputs()
    w1, b1, w2, b2 = (t.clone().requires_grad_() for t in weights())
    xr = x.clone().requires_grad_()
    y = unsharded(xr, w1, b1, w2, b2)
    (y * target).sum().backward()
    return {"out": y.detach(), "x": xr.grad, "w1": w1.grad, "b1": b1.grad, "w2": w2.grad, "b2": b2.grad}


def expected_shards(rank, n):
    w1, b1, w2, _ = weights()
    rows = slice(rank * FFN // n, (rank + 1) * FFN // n)
    return [w1[rows], b1[rows], w2[:, rows]]


def _close(a, b, atol=1e-5) -> bool:
    return a is not None and a.shape == b.shape and bool(torch.allclose(a, b, atol=atol))


def _judge_f(results, ns):
    n, total = len(results), sum(r["f"]["upstream"] for r in results)
    for rank, r in enumerate(results):
        x = inputs()[0]
        if not _close(r["f"]["out"], x):
            swapped = _close(r["f"]["out"], n * x)
            raise Fail("f's forward is not the identity" + (f": it is {n}× the input, an all-reduce — that is g's "
                       f"forward (f and g swapped?). Every rank already holds the whole input of a column-parallel "
                       f"layer" if swapped else ""), "output = input", "all-reduced" if swapped else "different",
                       rank)
        if not _close(r["f"]["grad"], total):
            own = _close(r["f"]["grad"], r["f"]["upstream"])
            raise Fail("f's backward " + ("returns the gradient unchanged — the identity backward is g's (f and g "
                       "swapped?). Each rank's column shard contributes a partial gradient of the input: f sums "
                       "them with an all-reduce" if own else "is not the sum of the ranks' gradients"),
                       "all-reduce of the gradient", "identity" if own else "different", rank)
    return "f: identity forward, all-reduce (sum) of the gradient backward"


def _judge_g(results, ns):
    n, total = len(results), sum(r["g"]["in"] for r in results)
    target = inputs()[1]
    for rank, r in enumerate(results):
        if not _close(r["g"]["out"], total):
            same = _close(r["g"]["out"], r["g"]["in"])
            raise Fail("g's forward " + ("is the identity — that is f's forward (f and g swapped?). After a "
                       "row-parallel layer each rank holds a partial product: g sums them" if same else
                       "is not the sum of the ranks' inputs"), "all-reduce (sum)", "identity" if same else "different",
                       rank)
        if not _close(r["g"]["grad"], target):
            summed = _close(r["g"]["grad"], n * target)
            raise Fail("g's backward " + (f"all-reduces ({n}× the gradient) — that is f's backward. The output of g "
                       f"is replicated, so its gradient already is the whole gradient on every rank" if summed else
                       "is not the identity"), "identity", "all-reduced" if summed else "different", rank)
    return "g: all-reduce (sum) forward, identity backward"


def _judge_shards(results, ns):
    names = ("w1_shard", "b1_shard", "w2_shard")
    for rank, outcome in enumerate(results):
        got_shards = learner_answer(outcome, f"shard_mlp(w1, b1, w2, rank={rank}, world_size={len(results)})")
        for name, got, want in zip(names, got_shards, expected_shards(rank, len(results))):
            if not _close(got, want, 0):
                why = ""
                if name == "w1_shard" and tuple(got.shape) == (FFN, H // len(results)):
                    why = (": w1 was split along its input features; a column-parallel layer splits the output "
                           "features — the rows of w1, which nn.Linear stores as (out, in)")
                raise Fail(f"rank {rank}'s {name} is not its slice{why}", tuple(want.shape), tuple(got.shape), rank)
    return (f"w1 and b1 split by output features (rows [r·{FFN}/N, (r+1)·{FFN}/N)), w2 by input features "
            f"(the same columns)")


def _judge_mlp(results, ns):
    n, expected = len(results), reference()
    for rank, r in enumerate(results):
        got = r["mlp"]
        if not _close(got["out"], expected["out"]):
            b2 = weights()[3]
            if _close(got["out"] - expected["out"], (n - 1) * b2.expand_as(got["out"])):
                raise Fail(f"rank {rank}'s output is off by (N−1)·b2: every rank added b2 before g summed — add "
                           f"the row-parallel bias once, after the reduction", "unsharded output", "+ (N−1)·b2",
                           rank)
            diff = float((got["out"] - expected["out"]).abs().max()) if got["out"].shape == expected["out"].shape \
                else float("inf")
            raise Fail(f"rank {rank}'s output differs from the unsharded MLP's (max |Δ| = {diff:.3g})", 0.0,
                       f"{diff:.3g}", rank)
        rows = slice(rank * FFN // n, (rank + 1) * FFN // n)
        wanted = {"x": expected["x"], "w1": expected["w1"][rows], "b1": expected["b1"][rows],
                  "w2": expected["w2"][:, rows], "b2": expected["b2"]}
        for name, want in wanted.items():
            if not _close(got[name], want, 1e-4):
                raise Fail(f"rank {rank}'s gradient of {name} differs from the unsharded MLP's"
                           + (" — the input's gradient is a sum of every rank's part: f all-reduces it backward"
                              if name == "x" else ""), "equal", "different", rank)
    return "output, input gradient and every shard's gradient equal the unsharded MLP's on every rank"


def _judge_traffic(results, ns):
    n = len(results)
    expected = theory.tp_comm_bytes_per_step(B * S, 2 * H, n, 4)
    for rank, r in enumerate(results):
        calls = [c for c in r["calls"] if c["op"] != "send" and c["op"] != "recv"]
        ops = sorted(c["op"] for c in calls)
        cost = sum(theory.ring_bytes_sent(c["op"], c["nbytes"], n) for c in calls)
        fwd = sum(1 for c in calls if not c["in_backward"])
        if ops != ["all_reduce", "all_reduce"] or fwd != 1 or cost != expected:
            raise Fail(f"rank {rank}: {len(calls)} collective(s) ({', '.join(ops) or 'none'}), {fwd} in forward; the "
                       f"column → row MLP needs exactly one all-reduce of b·s·h forward (g) and one backward (f)",
                       f"2 all-reduces, ring cost {expected:g} B", f"{cost:g} B", rank)
    return (f"one all-reduce of b·s·h = {B * S * H} elements forward (g) and one backward (f): ring cost "
            f"{expected:g} B = theory.tp_comm_bytes_per_step(b·s, 2h, t, 4), half of tp_elements_sent_per_layer")


EXERCISE = Exercise(
    key="07_megatron_mlp",
    title="Megatron's f and g, and a column → row parallel MLP",
    minutes=40,
    needs=("CopyToTensorParallelRegion", "ReduceFromTensorParallelRegion", "shard_mlp", "parallel_mlp"),
    scenarios={"shards": Scenario("shards", 0, _shards), "tp": Scenario("tp", N, _run)},
    checks=[
        Check("f", 2, "tp", _judge_f, "f enters the tensor-parallel region: identity forward, all-reduce backward"),
        Check("g", 2, "tp", _judge_g, "g leaves it: all-reduce forward, identity backward — f's conjugate"),
        Check("shards", 1, "shards", _judge_shards,
              "column-parallel: A = [A_1 … A_t] by output features; row-parallel: B by input features (Megatron §3)"),
        Check("same-as-unsharded", 3, "tp", _judge_mlp,
              "Y = GeLU(f(X)·A_i)·B_i, then g sums: the unsharded output, with no communication in between"),
        Check("traffic", 2, "tp", _judge_traffic,
              "per MLP one all-reduce forward and one backward, each of b·s·h elements (Megatron §3)"),
    ],
    hints=[
        "Tensor parallelism splits each weight matrix across the ranks, so each rank computes part of a layer. "
        "Megatron's MLP needs two communication points: f where the replicated input enters the split region, g where "
        "the partial outputs leave it — each the other's conjugate, the identity one way and an all-reduce the other.",
        "f: the input is already whole on every rank, so its forward is the identity; but each rank's column shard "
        "contributes only a partial gradient of the input, so its backward sums them with an all-reduce. g is the "
        "reverse: its forward all-reduces the partial products, its backward passes the gradient through unchanged.",
        "A torch.autograd.Function's backward returns one gradient per forward input: the tensor's, then None for the "
        "group; keep the group on ctx in forward. An all-reduce works in place: reduce a clone, never the tensor "
        "autograd handed you.",
        "shard_mlp: the first linear is column-parallel — split w1 and b1 by output features, the rows of w1 "
        "(nn.Linear stores its weight as out × in); the second is row-parallel — split w2 by input features, the same "
        "indices as columns. parallel_mlp: f, the first linear on the shards, GeLU, the second linear without its "
        "bias, g, then b2 added once.",
        "The code:\n"
        "f, forward:   ctx.group = group; return x.view_as(x)\n"
        "f, backward:  grad = grad.contiguous().clone(); dist.all_reduce(grad, group=ctx.group); return grad, None\n"
        "g, forward:   out = x.contiguous().clone(); dist.all_reduce(out, group=group); return out\n"
        "g, backward:  return grad, None\n"
        "shard_mlp:\n"
        "    k = w1.shape[0] // world_size\n"
        "    rows = slice(rank * k, (rank + 1) * k)\n"
        "    return w1[rows], b1[rows], w2[:, rows]\n"
        "parallel_mlp:\n"
        "    h = F.gelu(F.linear(CopyToTensorParallelRegion.apply(x, group), w1_shard, b1_shard))\n"
        "    return ReduceFromTensorParallelRegion.apply(F.linear(h, w2_shard), group) + b2",
    ],
)
