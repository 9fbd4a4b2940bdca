"""Exercise 16: a mixture-of-experts layer's dispatch and combine over expert-parallel ranks (GShard 2006.16668
§2; Switch 2101.03961 §2.2; DeepSpeed-MoE 2201.05596).

Interface: ``dispatch(x, chosen, n_experts, group=None)`` → ``(rows, ids, plan)``: the rows of every
slot routed to this rank's experts, from every rank, with their expert ids, and whatever
``combine`` needs; ``combine(out, plan, gates, group=None)`` → ``(T, d)``: the experts' outputs
sent home, put back in token order, weighted by the gates and summed per token. Graded on 2
ranks, in one launch: each rank routes its own tokens (E = 4 experts, 2 per rank, top-2) with
the grader's router; the grader runs the experts on what ``dispatch`` delivered, then
``combine``. Judged against the whole layer in one process on both ranks' tokens: what each
rank received, the outputs, the gradients (input, router, experts), and the bytes of the
all-to-alls the grader recorded (``dist.all_to_all_single``, direct or through
``zerokit.comm``) against :func:`zerokit.theory.moe_dispatch_payload` and
:func:`zerokit.theory.moe_alltoall_bytes` on the split the router chose. The library's
version: :mod:`zerokit.expert_parallel.moe` and :mod:`zerokit.expert_parallel.alltoall`.
"""
from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F

from ... import theory
from ..core import Check, Exercise, Fail, Scenario

N = 2
E, K, D, FFN, T = 4, 2, 8, 16, 6  # experts, top-k, width, expert hidden width, tokens per rank
ELEMENT = 4  # fp32


def weights():
    """The router (E, d) and every expert's w1, b1, w2, b2, stacked by expert."""
    g = torch.Generator().manual_seed(23)
    return (torch.randn(E, D, generator=g), torch.randn(E, FFN, D, generator=g) / 3,
            torch.randn(E, FFN, generator=g) / 3, torch.randn(E, D, FFN, generator=g) / 4,
            torch.randn(E, D, generator=g))


def tokens(rank):
    """This rank's tokens (T, d) and the upstream gradient's weights (the loss is Σ y·target)."""
    g = torch.Generator().manual_seed(70 + rank)
    return torch.randn(T, D, generator=g), torch.randn(T, D, generator=g)


def owner(expert, n=N):
    return expert // (E // n)


def expert_forward(rows, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(rows, w1, b1)), w2, b2)


def run_experts(rows, ids, experts):
    """Each delivered row through its (local) expert; rows for an expert this rank does not hold stay zero."""
    out = rows.new_zeros(rows.shape)
    for e, params in experts.items():
        where = (ids == e).nonzero().flatten()
        if len(where):
            out = out.index_copy(0, where, expert_forward(rows[where], *params))
    return out


class _AllToAllRecorder:
    """Records every ``dist.all_to_all_single`` this rank makes while installed (the probe does not wrap it)."""

    def __init__(self):
        import torch.distributed as dist

        self.dist, self.calls = dist, []
        self.original = dist.all_to_all_single
        signature = inspect.signature(self.original)
        recorder = self

        def recorded(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            v = bound.arguments
            x, n = v["input"], dist.get_world_size(v["group"])
            me = dist.get_rank(v["group"])
            width = math.prod(x.shape[1:]) if x.dim() > 1 else 1
            split = list(v["input_split_sizes"]) if v["input_split_sizes"] else [x.shape[0] // n] * n
            row_bytes = width * x.element_size()
            recorder.calls.append({"rows": int(x.shape[0]), "width": width, "dtype": str(x.dtype),
                                   "payload": int(x.numel() * x.element_size()),
                                   "leaving": (sum(split) - split[me]) * row_bytes,
                                   "in_backward": torch._C._current_graph_task_id() != -1})
            return recorder.original(*args, **kwargs)

        dist.all_to_all_single = recorded

    def remove(self):
        self.dist.all_to_all_single = self.original


def _run(ctx, ns, probe):
    rank, n = ctx.rank, ctx.world_size
    router, w1, b1, w2, b2 = weights()
    x, target = tokens(rank)
    x = x.clone().requires_grad_()
    router = router.clone().requires_grad_()
    mine = range(rank * E // n, (rank + 1) * E // n)
    experts = {e: [t[e].clone().requires_grad_() for t in (w1, b1, w2, b2)] for e in mine}
    probs = torch.softmax(x @ router.t(), dim=-1)
    gates, chosen = probs.topk(K, dim=-1)
    recorder = _AllToAllRecorder()
    try:
        rows, ids, plan = ns["dispatch"](x, chosen, E, None)
        ids = torch.as_tensor(ids).reshape(-1).long()
        out = run_experts(rows, ids, experts)
        y = ns["combine"](out, plan, gates, None)
        (y * target).sum().backward()
    finally:
        recorder.remove()
    return {"chosen": chosen, "rows": rows.detach(), "ids": ids, "y": y.detach(), "x_grad": x.grad,
            "router_grad": router.grad, "experts": {e: [p.grad for p in ps] for e, ps in experts.items()},
            "calls": recorder.calls}


def reference(chosen_by_rank=None, gated=True, order=None, expert_path=True):
    """The whole layer in one process on every rank's tokens: outputs per rank and the gradients.

    The variants are the judges' hypotheses about a wrong answer: ``gated=False`` sums the experts' outputs
    without the gates; ``order`` ("owner" or "expert") leaves each rank's slot outputs in the order they were
    sorted for the dispatch; ``expert_path=False`` lets no gradient into the tokens through the experts."""
    router, w1, b1, w2, b2 = [t.clone().requires_grad_() for t in weights()]
    out = {"y": [], "x_grad": []}
    xs = []
    loss = 0
    for rank in range(N):
        x, target = tokens(rank)
        x = x.requires_grad_()
        xs.append(x)
        gates, chosen = torch.softmax(x @ router.t(), dim=-1).topk(K, dim=-1)
        expert = chosen.reshape(-1)
        slot_x = x.repeat_interleave(K, dim=0)
        slot_x = slot_x if expert_path else slot_x.detach()
        slot_out = torch.stack([expert_forward(slot_x[s], w1[e], b1[e], w2[e], b2[e])
                                for s, e in enumerate(expert.tolist())])
        if order is not None:
            slot_out = slot_out[torch.argsort(owner(expert) if order == "owner" else expert, stable=True)]
        g = gates.reshape(-1, 1) if gated else torch.ones(K * T, 1)
        y = (slot_out * g).view(T, K, D).sum(1)
        out["y"].append(y.detach())
        loss = loss + (y * target).sum()
    loss.backward()
    out["x_grad"] = [x.grad for x in xs]
    out["router_grad"], out["experts"] = router.grad, {e: [w1.grad[e], b1.grad[e], w2.grad[e], b2.grad[e]]
                                                       for e in range(E)}
    return out


def _close(a, b, atol=1e-5) -> bool:
    return a is not None and torch.is_tensor(a) and a.shape == b.shape and bool(torch.allclose(a, b, atol=atol))


def _rows_for(results, rank):
    """(ids, rows) of every slot, on any rank, whose expert lives on ``rank``."""
    ids, rows = [], []
    for src in range(N):
        x, _ = tokens(src)
        expert = results[src]["chosen"].reshape(-1)
        slot_x = x.repeat_interleave(K, dim=0)
        keep = owner(expert) == rank
        ids.append(expert[keep])
        rows.append(slot_x[keep])
    return torch.cat(ids), torch.cat(rows)


def _canonical(ids, rows):
    first = torch.argsort(rows[:, 0], stable=True)
    second = torch.argsort(ids[first], stable=True)
    pick = first[second]
    return ids[pick], rows[pick]


def _judge_dispatch(results, ns):
    for rank, r in enumerate(results):
        want_ids, want_rows = _rows_for(results, rank)
        rows, ids = r["rows"], r["ids"]
        if rows.dim() != 2 or rows.shape[1] != D:
            raise Fail(f"rank {rank}'s dispatch returned rows of shape {tuple(rows.shape)}; expected (rows, d = {D})",
                       f"(R, {D})", tuple(rows.shape), rank)
        if len(rows) != len(want_rows) or len(ids) != len(rows):
            away = [int((owner(q["chosen"].reshape(-1)) != src).sum()) for src, q in enumerate(results)]
            more = " — every slot of every rank: each slot goes to one rank only, its expert's" if \
                len(rows) == N * T * K else ""
            raise Fail(f"rank {rank} received {len(rows)} rows ({len(ids)} ids); the ranks routed {len(want_rows)} "
                       f"slots to its experts {list(range(rank * E // N, (rank + 1) * E // N))}{more} "
                       f"(slots sent away per rank: {away})", len(want_rows), len(rows), rank)
        got_ids, got_rows = _canonical(ids, rows)
        want_ids, want_rows = _canonical(want_ids, want_rows)
        if not torch.equal(got_ids, want_ids):
            foreign = sorted(set(ids.tolist()) - set(range(rank * E // N, (rank + 1) * E // N)))
            raise Fail(f"rank {rank} received rows for the wrong experts" +
                       (f": ids {foreign} live on the other rank — send each slot to owner = expert // (E/n), with "
                        f"the counts of the slots sorted by owner" if foreign else
                        ": the right number of rows per rank, but not the routed (slot, expert) pairs — sort the "
                        "rows and their ids with the same order"), want_ids.tolist(), got_ids.tolist(), rank)
        if not _close(got_rows, want_rows, 0):
            raise Fail(f"rank {rank} received the right expert ids, but rows that are not the routed tokens' — sort "
                       f"the slot rows (token s // k for slot s) with the same order as their ids",
                       "the routed tokens' rows", "other rows", rank)
    return (f"each rank received exactly the slots routed to its {E // N} experts from both ranks, rows and expert ids "
            f"({', '.join(str(len(r['rows'])) for r in results)} rows)")


def _judge_outputs(results, ns):
    expected = reference()
    for rank, r in enumerate(results):
        y, want = r["y"], expected["y"][rank]
        if _close(y, want):
            continue
        if y.shape != want.shape:
            raise Fail(f"rank {rank}'s combine returned shape {tuple(y.shape)}; the layer's output is (T, d) = "
                       f"{tuple(want.shape)}: one row per token, the k slots summed", tuple(want.shape),
                       tuple(y.shape), rank)
        if _close(y, reference(gated=False)["y"][rank]):
            raise Fail(f"rank {rank}'s output is the experts' outputs summed without the gates: a token's output is "
                       f"Σ_j gate_j · expert_j(x), the router's probabilities weighting its k experts (and the "
                       f"router learns only through them)", "gated sum", "ungated sum", rank)
        for order in ("owner", "expert"):
            if _close(y, reference(order=order)["y"][rank]):
                raise Fail(f"rank {rank}'s slot outputs were weighted and summed in the order they were dispatched "
                           f"(sorted by {order}), not restored to token order: undo the dispatch's sort (index_copy "
                           f"with its order) before the gates and the sum per token", "token order",
                           f"sorted by {order}", rank)
        bad = int(((y - want).abs() > 1e-5).any(dim=1).sum())
        raise Fail(f"rank {rank}'s output differs from the whole layer's on {bad} of its {T} tokens (max |Δ| = "
                   f"{float((y - want).abs().max()):.3g})", "the whole layer's output", "different", rank)
    return "every rank's output equals the whole layer's, run in one process on both ranks' tokens (max |Δ| ≤ 1e-5)"


def _judge_gradients(results, ns):
    expected = reference()
    for rank, r in enumerate(results):
        if not _close(r["x_grad"], expected["x_grad"][rank], 1e-4):
            router_only = reference(expert_path=False)["x_grad"][rank]
            if _close(r["x_grad"], router_only, 1e-4):
                raise Fail(f"rank {rank}'s gradient of its tokens has only the router's part: nothing came back "
                           f"through the experts — the all-to-all must be an autograd Function whose backward is the "
                           f"reverse exchange (receive counts become send counts), on rows that were not detached",
                           "router + experts", "router only", rank)
            raise Fail(f"rank {rank}'s gradient of its tokens differs from the whole layer's", "equal", "different",
                       rank)
        for e, grads in r["experts"].items():
            for name, got, want in zip(("w1", "b1", "w2", "b2"), grads, expected["experts"][e]):
                if not _close(got, want, 1e-4):
                    raise Fail(f"rank {rank}'s gradient of expert {e}'s {name} " +
                               ("is missing: the combine's all-to-all passed no gradient back to the experts"
                                if got is None else "differs from the whole layer's, where expert e sees the slots "
                                                    "of every rank routed to it"), "equal",
                               "None" if got is None else "different", rank)
    router = [r["router_grad"] for r in results]
    if any(g is None for g in router):
        raise Fail("the router got no gradient: it learns through the gates that weight each expert's output in "
                   "combine", "a gradient", "None")
    total = sum(router)
    if not _close(total, expected["router_grad"], 1e-4):
        raise Fail("the router's gradient, summed over the ranks, differs from the whole layer's", "equal",
                   "different")
    return ("the gradients of the tokens, of each expert (on the rank that holds it, from both ranks' slots) and of "
            "the router (summed over the ranks) equal the whole layer's")


def _split(results, rank):
    """Rows this rank sent to the other ranks, and rows it received from them: the router's measured split."""
    sent = int((owner(results[rank]["chosen"].reshape(-1)) != rank).sum())
    received = sum(int((owner(q["chosen"].reshape(-1)) == rank).sum()) for src, q in enumerate(results) if src != rank)
    return sent, received


def _judge_bytes(results, ns):
    payload = theory.moe_dispatch_payload(T, K, D, ELEMENT)
    lines = []
    for rank, r in enumerate(results):
        rows = [c for c in r["calls"] if c["width"] == D and c["dtype"] == "torch.float32"]
        forward = [c for c in rows if not c["in_backward"]]
        if not forward:
            raise Fail(f"rank {rank} made no all-to-all of {D}-wide rows: the tokens travel to their experts by "
                       f"dist.all_to_all_single (or zerokit.comm.all_to_all_single) with split sizes",
                       "an all-to-all of the rows", "none", rank)
        first = forward[0]["payload"]
        if first != payload:
            every = first == N * payload
            raise Fail(f"rank {rank}'s dispatch all-to-all carries {first:,} B; its T·k = {T * K} routed slots of d = "
                       f"{D} fp32 are theory.moe_dispatch_payload(T, k, d, 4) = {payload:,} B" +
                       (" — every slot went to every rank (an all-gather's traffic, n×): send each slot only to its "
                        "expert's rank" if every else ""), payload, first, rank)
        sent, received = _split(results, rank)
        want = (theory.moe_alltoall_bytes(sent, received, D, ELEMENT, N)
                - theory.moe_alltoall_bytes(sent, received, 0, ELEMENT, N))  # its terms in d: the rows
        measured = sum(c["leaving"] for c in rows)
        if measured != want:
            raise Fail(f"rank {rank}: {measured:,} B of rows left it over the forward and backward all-to-alls; the "
                       f"router's split ({sent} slots sent away, {received} received) gives {want:,} B — the rows out "
                       f"and back, and their gradients the other way: the d-terms of theory.moe_alltoall_bytes",
                       want, measured, rank)
        lines.append(f"rank {rank}: {sent} slots away, {received} in → {measured:,} B")
    return (f"dispatch payload T·k·d·b = {payload:,} B per rank (theory.moe_dispatch_payload); rows leaving each rank "
            f"= theory.moe_alltoall_bytes' d-terms on the measured split ({'; '.join(lines)})")


EXERCISE = Exercise(
    key="16_moe_dispatch",
    title="MoE dispatch and combine over expert-parallel ranks",
    minutes=45,
    needs=("dispatch", "combine"),
    scenarios={"moe": Scenario("moe", N, _run)},
    checks=[
        Check("dispatch", 3, "moe", _judge_dispatch,
              "dispatch: slots sorted by the rank that owns their expert, the counts exchanged, the rows (and their "
              "expert ids) sent by one uneven all-to-all"),
        Check("same-outputs", 3, "moe", _judge_outputs,
              "combine: the outputs back by the reverse all-to-all, restored to token order, weighted by the gates, "
              "summed over each token's k slots"),
        Check("same-gradients", 2, "moe", _judge_gradients,
              "an all-to-all's gradient is the reverse all-to-all: tokens get their experts' gradients back, experts "
              "get every rank's slots', the router learns through the gates"),
        Check("bytes", 2, "moe", _judge_bytes,
              "expert parallelism moves tokens, not weights: T·k·d·b bytes of rows per dispatch, of which the "
              "router's split decides what leaves the rank"),
    ],
    hints=[
        "Expert parallelism sends each token to the rank that holds its expert and brings the result home: two "
        "all-to-alls per MoE layer, dispatch and combine, each moving the routed rows with uneven counts per peer. The "
        "counts themselves are exchanged first: a rank cannot know how many rows it will receive.",
        "AllToAll is an autograd Function around one uneven all-to-all: its forward sends send_counts rows to each "
        "peer and receives recv_counts; its backward is the same exchange the other way, the two count lists swapped. "
        "exchange_counts: an all-to-all of one int64 number per peer, without split sizes.",
        "dispatch: each token makes k slots, one per chosen expert; a slot's destination is the rank that owns its "
        "expert. Sort the slots by destination (a stable sort keeps their order within a rank), count them per rank, "
        "exchange the counts, then send the slots' rows — and their expert ids, as a float column — through AllToAll.",
        "combine: the reverse all-to-all (the counts swapped) brings the rows home in the dispatch's sorted order; "
        "undo the sort, weigh each slot by its gate and sum each token's k slots.",
        "The code:\n"
        "AllToAll.forward:\n"
        "    ctx.send, ctx.recv, ctx.group = send_counts, recv_counts, group\n"
        "    out = rows.new_empty((sum(recv_counts), *rows.shape[1:]))\n"
        "    zerokit.comm.all_to_all_single(out, rows.contiguous(), group=group, output_split_sizes=recv_counts, "
        "input_split_sizes=send_counts)\n"
        "    return out\n"
        "AllToAll.backward:\n"
        "    back = grad.new_empty((sum(ctx.send), *grad.shape[1:]))\n"
        "    zerokit.comm.all_to_all_single(back, grad.contiguous(), group=ctx.group, output_split_sizes=ctx.send, "
        "input_split_sizes=ctx.recv)\n"
        "    return back, None, None, None\n"
        "exchange_counts:\n"
        "    theirs = torch.empty(dist.get_world_size(group), dtype=torch.int64)\n"
        "    zerokit.comm.all_to_all_single(theirs, torch.tensor(send_counts, dtype=torch.int64), group=group)\n"
        "    return theirs.tolist()\n"
        "dispatch:\n"
        "    n, k = dist.get_world_size(group), chosen.shape[1]\n"
        "    expert = chosen.reshape(-1)  # slot s is token s // k\n"
        "    dest = owner(expert, n_experts, n)\n"
        "    order = torch.argsort(dest, stable=True)\n"
        "    send = torch.bincount(dest, minlength=n).tolist()\n"
        "    recv = exchange_counts(send, group)\n"
        "    rows = AllToAll.apply(x.repeat_interleave(k, dim=0)[order], send, recv, group)\n"
        "    ids = AllToAll.apply(expert[order].to(x.dtype)[:, None], send, recv, group)[:, 0].long()\n"
        "    return rows, ids, {'order': order, 'send': send, 'recv': recv, 'k': k}\n"
        "combine:\n"
        "    back = AllToAll.apply(out, plan['recv'], plan['send'], group)\n"
        "    slots = torch.empty_like(back).index_copy(0, plan['order'], back)\n"
        "    return (slots * gates.reshape(-1, 1)).view(-1, plan['k'], slots.shape[-1]).sum(dim=1)",
    ],
)
