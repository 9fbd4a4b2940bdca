"""Exercise 10: Megatron's sequence parallelism around a tensor-parallel MLP block (Korthikanti et al.
2205.05198 §4.2.2).

Interface: ``all_gather_sequence(x, group)`` and ``reduce_scatter_sequence(x, group)`` (along
dimension 1 of (batch, sequence, hidden)); ``GatherFromSequenceParallelRegion`` (g: all-gather
forward, reduce-scatter backward) and ``ReduceScatterToSequenceParallelRegion`` (ḡ:
reduce-scatter forward, all-gather backward), each ``apply(x, group)``;
``sequence_parallel_block(x_shard, ln_w, ln_b, w1_shard, b1_shard, w2_shard, b2, group=None)``
(LayerNorm on the sequence shard, g, column, GeLU, row, ḡ, + b2, + residual) and
``sync_replicated_grads(params, group=None)``. Graded on 2 ranks, in one launch: g and ḡ
alone (forward and backward, a different shard per rank), the block on the grader's shards —
output and every gradient against the single-process block — the replicated weights'
gradients after the sync, and the bytes of every collective against
:func:`zerokit.theory.tp_comm_bytes_per_step` and
:func:`zerokit.theory.sequence_parallel_grad_bytes`. The library's version:
:mod:`zerokit.tensor_parallel.mappings`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import theory
from ..core import Check, Exercise, Fail, Scenario

N = 2
B, S, H, FFN = 2, 4, 8, 16


def weights():
    """ln_w, ln_b, w1, b1, w2, b2 of the whole block."""
    g = torch.Generator().manual_seed(17)
    return (1 + torch.randn(H, generator=g) / 4, torch.randn(H, generator=g) / 4,
            torch.randn(FFN, H, generator=g) / 3, torch.randn(FFN, generator=g) / 3,
            torch.randn(H, FFN, generator=g) / 4, torch.randn(H, generator=g))


def inputs():
    g = torch.Generator().manual_seed(18)
    return torch.randn(B, S, H, generator=g), torch.randn(B, S, H, generator=g)


def unsharded(x, ln_w, ln_b, w1, b1, w2, b2):
    return x + F.linear(F.gelu(F.linear(F.layer_norm(x, (H,), ln_w, ln_b), w1, b1)), w2, b2)


def seq(rank, n):
    return slice(rank * S // n, (rank + 1) * S // n)


def feat(rank, n):
    return slice(rank * FFN // n, (rank + 1) * FFN // n)


def _run(ctx, ns, probe):
    rank, n = ctx.rank, ctx.world_size
    probe.reset()
    mine = torch.Generator().manual_seed(60 + rank)
    out = {}
    with probe.phase("g"):  # g alone: a different shard per rank, a different upstream gradient per rank
        xg = torch.randn(B, S // n, H, generator=mine).requires_grad_()
        yg = ns["GatherFromSequenceParallelRegion"].apply(xg, None)
        upstream = torch.randn(B, S, H, generator=mine)
        yg.backward(upstream)
        out["g"] = {"in": xg.detach(), "out": yg.detach(), "grad": xg.grad, "upstream": upstream}
    with probe.phase("g_bar"):  # ḡ alone: a different partial sum per rank, a different gradient shard per rank
        z = torch.randn(B, S, H, generator=mine).requires_grad_()
        yb = ns["ReduceScatterToSequenceParallelRegion"].apply(z, None)
        upstream = torch.randn(B, S // n, H, generator=mine)
        yb.backward(upstream)
        out["g_bar"] = {"in": z.detach(), "out": yb.detach(), "grad": z.grad, "upstream": upstream}
    # the block runs on the grader's shards, so that it is judged on its own
    x, target = inputs()
    ln_w, ln_b, w1, b1, w2, b2 = weights()
    leaves = {"x": x[:, seq(rank, n)], "ln_w": ln_w, "ln_b": ln_b, "w1": w1[feat(rank, n)],
              "b1": b1[feat(rank, n)], "w2": w2[:, feat(rank, n)], "b2": b2}
    leaves = {k: v.detach().clone().requires_grad_() for k, v in leaves.items()}
    with probe.phase("block"):
        y = ns["sequence_parallel_block"](*leaves.values())
        (y * target[:, seq(rank, n)]).sum().backward()
    before = {k: leaves[k].grad.clone() for k in ("ln_w", "ln_b", "b2")}
    with probe.phase("sync"):
        ns["sync_replicated_grads"]([leaves["ln_w"], leaves["ln_b"], leaves["b2"]])
    out["block"] = {"out": y.detach(), **{k: v.grad for k, v in leaves.items()}}
    out["before_sync"] = before
    return {**out, "calls": probe.calls()}


def reference():
    x, target = inputs()
    leaves = [t.clone().requires_grad_() for t in (x, *weights())]
    y = unsharded(*leaves)
    (y * target).sum().backward()
    names = ("x", "ln_w", "ln_b", "w1", "b1", "w2", "b2")
    return {"out": y.detach(), **{k: t.grad for k, t in zip(names, leaves)}}


def _close(a, b, atol=1e-5) -> bool:
    return a is not None and a.shape == b.shape and bool(torch.allclose(a, b, atol=atol))


def _judge_g(results, ns):
    n = len(results)
    whole = torch.cat([r["g"]["in"] for r in results], dim=1)
    total = sum(r["g"]["upstream"] for r in results)
    for rank, r in enumerate(results):
        got = r["g"]
        if not _close(got["out"], whole):
            shape = tuple(got["out"].shape)
            why = (": it is the rank's own shard — nothing was gathered" if _close(got["out"], got["in"]) else
                   f": shape {shape}, expected {tuple(whole.shape)} — the shards go side by side along dimension 1 "
                   f"(the sequence), in rank order" if shape != tuple(whole.shape) else
                   " — the shards must sit in rank order along dimension 1 (the sequence)")
            raise Fail(f"g's forward is not the ranks' shards concatenated along the sequence{why}",
                       "all-gather along the sequence", "different", rank)
        want = total[:, seq(rank, n)]
        if not _close(got["grad"], want):
            own = got["grad"] is not None and _close(got["grad"], got["upstream"][:, seq(rank, n)])
            raise Fail("g's backward " + ("keeps this rank's slice of its own gradient without summing: every "
                       "rank's column shard contributed to every token's gradient, so the conjugate of an "
                       "all-gather is a reduce-scatter (sum, then keep your slice)" if own else
                       "is not this rank's slice of the ranks' summed gradient (a reduce-scatter)"),
                       "reduce-scatter of the gradient", "slice without sum" if own else "different", rank)
    return "g: all-gather along the sequence forward, reduce-scatter of the gradient backward"


def _judge_g_bar(results, ns):
    n = len(results)
    total = sum(r["g_bar"]["in"] for r in results)
    whole_grad = torch.cat([r["g_bar"]["upstream"] for r in results], dim=1)
    for rank, r in enumerate(results):
        got = r["g_bar"]
        want = total[:, seq(rank, n)]
        if not _close(got["out"], want):
            why = ""
            if _close(got["out"], total):
                why = (": it is the whole sum — an all-reduce; ḡ keeps only this rank's 1/t of the sequence "
                       "(a reduce-scatter)")
            elif _close(got["out"], got["in"][:, seq(rank, n)]):
                why = ": it is this rank's slice of its own input — the partial sums were never summed"
            raise Fail(f"ḡ's forward is not this rank's slice of the ranks' sum{why}", tuple(want.shape),
                       tuple(got["out"].shape), rank)
        if not _close(got["grad"], whole_grad):
            raise Fail("ḡ's backward is not the ranks' gradient shards concatenated along the sequence: every rank's "
                       "row-parallel partial product covered every token, so each needs the whole gradient (an "
                       "all-gather)", "all-gather of the gradient", "different", rank)
    return "ḡ: reduce-scatter along the sequence forward, all-gather of the gradient backward"


def _judge_block(results, ns):
    n, expected = len(results), reference()
    b2 = weights()[5]
    for rank, r in enumerate(results):
        got = r["block"]
        want = expected["out"][:, seq(rank, n)]
        if not _close(got["out"], want):
            if got["out"].shape == want.shape and _close(got["out"] - want, (n - 1) * b2.expand_as(want)):
                raise Fail(f"rank {rank}'s output is off by (N−1)·b2: every rank added b2 before ḡ summed — add "
                           f"the row-parallel bias once, after the reduce-scatter", "single-process output",
                           "+ (N−1)·b2", rank)
            shape = tuple(got["out"].shape)
            diff = float((got["out"] - want).abs().max()) if shape == tuple(want.shape) else float("inf")
            raise Fail(f"rank {rank}'s output differs from its sequence slice of the single-process block's "
                       f"(max |Δ| = {diff:.3g}" + (f", shape {shape}, expected {tuple(want.shape)}" if diff == float("inf")
                                                   else "") + ")", 0.0, f"{diff:.3g}", rank)
        wanted = {"x": expected["x"][:, seq(rank, n)], "w1": expected["w1"][feat(rank, n)],
                  "b1": expected["b1"][feat(rank, n)], "w2": expected["w2"][:, feat(rank, n)]}
        for name, w in wanted.items():
            if not _close(got[name], w, 1e-4):
                raise Fail(f"rank {rank}'s gradient of {name} differs from the single-process block's", "equal",
                           "different", rank)
    return ("output shard, input gradient and every weight shard's gradient equal the single-process block's on "
            "every rank")


def _judge_replicated(results, ns):
    n, expected = len(results), reference()
    for rank, r in enumerate(results):
        for name in ("ln_w", "ln_b", "b2"):
            got, want = r["block"][name], expected[name]
            if _close(got, want, 1e-4):
                continue
            partial = _close(got, r["before_sync"][name], 0)
            summed = sum(q["before_sync"][name] for q in results)
            raise Fail(f"rank {rank}'s gradient of {name} is not the single-process block's" +
                       (f": it is this rank's own part — the rank saw only its 1/{n} of the sequence; "
                        f"sync_replicated_grads must sum it over the ranks (an all-reduce)" if partial else
                        f": it is {n}× the sum, or averaged — the ranks' parts add up, sum them (no division)"
                        if _close(got, n * summed, 1e-4) or _close(got, summed / n, 1e-4) else ""),
                       "the sum of the ranks' parts", "own part" if partial else "different", rank)
    return (f"the LayerNorm's and b2's gradients, each rank's part of 1/{n} of the tokens, summed over the ranks: "
            f"the single-process block's")


def _collectives(calls, phase):
    return [c for c in calls if c["phase"] == phase and c["op"] not in ("send", "recv")]


def _judge_traffic(results, ns):
    n = len(results)
    size = B * S * H * 4
    expected = theory.tp_comm_bytes_per_step(B * S, 2 * H, n, 4)
    sync = theory.sequence_parallel_grad_bytes(3 * H, n, 4)
    for rank, r in enumerate(results):
        block = _collectives(r["calls"], "block")
        fwd = sorted((c["op"], c["nbytes"]) for c in block if not c["in_backward"])
        bwd = sorted((c["op"], c["nbytes"]) for c in block if c["in_backward"])
        want = [("all_gather", size), ("reduce_scatter", size)]
        cost = sum(theory.ring_bytes_sent(c["op"], c["nbytes"], n) for c in block)
        if fwd != want or bwd != want:
            seen = ", ".join(f"{op} of {b} B" for op, b in fwd) or "none"
            back = ", ".join(f"{op} of {b} B" for op, b in bwd) or "none"
            reduced = any(op == "all_reduce" for op, _ in fwd + bwd)
            raise Fail(f"rank {rank}: forward {seen}; backward {back}. "
                       + ("An all-reduce of b·s·h sends twice a reduce-scatter's bytes (2(t−1)/t against (t−1)/t): "
                          "all-reducing the partial sums and then keeping a slice is plain tensor parallelism's g "
                          "with the other half thrown away; sequence parallelism reduce-scatters instead"
                          if reduced else
                          "Sequence parallelism needs one all-gather (g) and one reduce-scatter (ḡ) of b·s·h each "
                          "way"), f"{want} each way", f"forward {fwd}, backward {bwd}", rank)
        if cost != expected:
            raise Fail(f"rank {rank}'s block sends {cost:g} B under the ring formula", f"{expected:g} B",
                       f"{cost:g} B", rank)
        synced = _collectives(r["calls"], "sync")
        sync_cost = sum(theory.ring_bytes_sent(c["op"], c["nbytes"], n) for c in synced)
        if sync_cost != sync:
            raise Fail(f"rank {rank}: sync_replicated_grads sends {sync_cost:g} B "
                       f"({', '.join(c['op'] for c in synced) or 'no collective'}); one all-reduce of the "
                       f"3h = {3 * H} replicated gradient elements sends "
                       f"theory.sequence_parallel_grad_bytes(3h, t, 4) = {sync:g} B", f"{sync:g} B",
                       f"{sync_cost:g} B", rank)
    return (f"per block an all-gather and a reduce-scatter of b·s·h = {B * S * H} elements ({size} B) forward and "
            f"again backward: ring cost {expected:g} B = theory.tp_comm_bytes_per_step(b·s, 2h, t, 4), the same "
            f"as tensor parallelism's two all-reduces; + {sync:g} B for the replicated gradients")


EXERCISE = Exercise(
    key="10_sequence_parallel",
    title="Sequence parallelism around a tensor-parallel MLP",
    minutes=45,
    needs=("all_gather_sequence", "reduce_scatter_sequence", "GatherFromSequenceParallelRegion",
           "ReduceScatterToSequenceParallelRegion", "sequence_parallel_block", "sync_replicated_grads"),
    scenarios={"sp": Scenario("sp", N, _run)},
    checks=[
        Check("g", 2, "sp", _judge_g,
              "g enters the tensor-parallel region from sequence shards: all-gather forward, reduce-scatter "
              "backward (Korthikanti §4.2.2)"),
        Check("g-bar", 2, "sp", _judge_g_bar,
              "ḡ leaves it: reduce-scatter forward, all-gather backward — g's conjugate"),
        Check("same-as-unsharded", 3, "sp", _judge_block,
              "LN on the shard, g, column-parallel, GeLU, row-parallel, ḡ, then b2 once and the residual on the "
              "shard"),
        Check("replicated-grads", 2, "sp", _judge_replicated,
              "weights every rank keeps whole saw 1/t of the tokens on each rank: their gradients are summed over "
              "the ranks (an all-reduce per backward; Megatron once per step)"),
        Check("traffic", 2, "sp", _judge_traffic,
              "an all-reduce is a reduce-scatter + an all-gather: sequence parallelism moves the same bytes as "
              "tensor parallelism, split into its two halves"),
    ],
    hints=[
        "Sequence parallelism shards the activations outside the tensor-parallel region along the sequence: LayerNorm "
        "and the residual run on each rank's slice of it. Megatron's f and g become g (all-gather the sequence on the "
        "way in) and ḡ (reduce-scatter it on the way out) — the bytes of one all-reduce, with 1/t of those activations "
        "kept.",
        "all_gather_sequence: gather every rank's slice into a buffer with the rank axis first, then move that axis "
        "next to the sequence axis and merge the two, so that rank j's tokens land at positions j·s up to (j+1)·s. "
        "reduce_scatter_sequence is the reverse: split the sequence into t chunks, put the chunk axis first "
        "(contiguous), reduce-scatter the flat buffer.",
        "g and ḡ are autograd Functions, each other's conjugate: g gathers forward and reduce-scatters the gradient "
        "backward; ḡ reduce-scatters forward and gathers the gradient backward. Each backward returns the tensor's "
        "gradient, then None for the group.",
        "The block: LayerNorm on the shard, g, the column-parallel linear, GeLU, the row-parallel linear without its "
        "bias, ḡ, then the residual and b2 — once, after ḡ. sync_replicated_grads: the LayerNorm weights and b2 are "
        "replicated, but each rank saw only its slice of the sequence: sum their gradients over the ranks, in one "
        "all-reduce of them flattened together.",
        "The code:\n"
        "all_gather_sequence:\n"
        "    t = dist.get_world_size(group)\n"
        "    out = torch.empty((t, *x.shape))\n"
        "    zerokit.comm.all_gather(out.view(-1), x.contiguous().view(-1), group=group)\n"
        "    return out.movedim(0, 1).flatten(1, 2)\n"
        "reduce_scatter_sequence:\n"
        "    t = dist.get_world_size(group)\n"
        "    chunks = x.unflatten(1, (t, x.shape[1] // t)).movedim(1, 0).contiguous()\n"
        "    out = torch.empty(chunks.shape[1:])\n"
        "    zerokit.comm.reduce_scatter(out.view(-1), chunks.view(-1), group=group)\n"
        "    return out\n"
        "g:  forward returns all_gather_sequence(x, group); backward returns (reduce_scatter_sequence(grad, "
        "ctx.group), None); ḡ the other way round\n"
        "the block:\n"
        "    h = F.layer_norm(x_shard, (x_shard.shape[-1],), ln_w, ln_b)\n"
        "    h = F.gelu(F.linear(GatherFromSequenceParallelRegion.apply(h, group), w1_shard, b1_shard))\n"
        "    y = ReduceScatterToSequenceParallelRegion.apply(F.linear(h, w2_shard), group)\n"
        "    return x_shard + y + b2\n"
        "sync_replicated_grads:\n"
        "    flat = torch.cat([p.grad.reshape(-1) for p in params])\n"
        "    zerokit.comm.all_reduce(flat, group=group)\n"
        "    # then copy each p's piece of flat back into p.grad",
    ],
)
