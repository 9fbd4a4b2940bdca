"""Exercise 15: ring attention's online softmax (Liu et al. 2310.01889; the merge of Milakov & Gimelshein and
FlashAttention).

Interface: ``merge(out, lse, block_out, block_lse)`` → ``(out, lse)`` and ``ring_forward(q, k, v, positions,
all_positions, group)`` → ``(out, lse)``; the given ``ring_shift`` (send to the next rank, receive from the
previous, through :mod:`zerokit.comm`), the given backward and ``ring_attention`` around both. Graded: ``merge``
on its own (a pure function, called in the submission's process: a ``ring_forward`` still unwritten fails only
the checks that need it) on two blocks of keys (with fully masked rows) against the softmax over both; then, on
2 ranks, the ring on the zig-zag chunks of :mod:`zerokit.context_parallel.layout` — output and dQ, dK, dV put
back in sequence order against one process's causal attention — and the bytes each rank sent on the ring (the
communication ledger, forward and backward) against :func:`zerokit.theory.ring_attention_bytes`. The library's
version: :mod:`zerokit.context_parallel.ring_attention`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import theory
from ...context_parallel import layout
from ...runtime import comm
from ..core import Check, Exercise, Fail, learner_answer, learner_call, Scenario

N = 2
B, H, T, D = 2, 2, 16, 8
#: merge's test: rows of queries, keys per block, value size
ROWS, KEYS, VD = 6, 5, 4


def inputs():
    g = torch.Generator().manual_seed(15)
    return [torch.randn(B, H, T, D, generator=g) for _ in range(4)]  # q, k, v, the upstream gradient


def merge_inputs():
    """Two blocks of scores over different keys, and their values; rows 0 and 3 see nothing of the second block,
    row 4 nothing of the first (merged into nothing seen yet: −∞ and −∞)."""
    g = torch.Generator().manual_seed(16)
    scores = [torch.randn(ROWS, KEYS, generator=g) * 3 for _ in range(2)]
    scores[1][[0, 3]] = float("-inf")
    scores[0][1, 2:] = float("-inf")
    scores[0][4] = float("-inf")
    values = [torch.randn(KEYS, VD, generator=g) for _ in range(2)]
    return scores, values


def block_result(s, v):
    """A block's own (normalised output, log-sum-exp): what ring_forward hands to merge."""
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.masked_fill(torch.isinf(lse), 0.0)[..., None])
    return p @ v, lse


def _merge(ctx, ns, probe):
    """Scenario ``merge`` (no ranks, in the submission's process): merge on its own — a pure function — two blocks
    merged from (0, −∞), so that a ring_forward still unwritten fails only the checks that need it."""
    scores, values = merge_inputs()
    first, second = block_result(scores[0], values[0]), block_result(scores[1], values[1])

    def merged():
        running = (torch.zeros(ROWS, VD), torch.full((ROWS,), float("-inf")))
        running = ns["merge"](*running, *first)
        return [t.detach() for t in ns["merge"](*running, *second)]

    return learner_call(merged)


def _run(ctx, ns, probe):
    rank, n = ctx.rank, ctx.world_size
    out = {}
    q, k, v, dout = inputs()
    mine = [layout.split(t, rank, n, dim=2).clone().requires_grad_(i < 3) for i, t in enumerate((q, k, v, dout))]
    every = torch.stack([layout.positions(r, n, T) for r in range(n)])
    ledger = comm.ledger()
    ledger.reset()
    with comm.phase("forward"):
        y = ns["ring_attention"](*mine[:3], every[rank], every, None)
    sent = {"forward": 0, "backward": 0}
    sent["forward"] = sum(r.ring_cost_bytes for r in ledger.records if r.op == "send")
    with comm.phase("backward"):
        y.backward(mine[3])
    sent["backward"] = sum(r.ring_cost_bytes for r in ledger.records if r.op == "send") - sent["forward"]
    out.update(out_=y.detach(), dq=mine[0].grad, dk=mine[1].grad, dv=mine[2].grad, sent=sent,
               sends=sum(1 for r in ledger.records if r.op == "send" and r.phase == "forward"),
               block=mine[1].numel() * mine[1].element_size())
    return out


def reference():
    q, k, v, dout = (t.clone().requires_grad_(i < 3) for i, t in enumerate(inputs()))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    y.backward(dout)
    return {"out_": y.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def local_index_mask_output(n):
    """What rank r's output is when each block is masked by local index (key j after query i) instead of by global
    position: the mistake named by 'same-as-one-process'."""
    q, k, v, _ = inputs()
    outs = []
    for r in range(n):
        qr = layout.split(q, r, n, dim=2)
        length = qr.shape[2]
        local = torch.arange(length)
        scores, vals = [], []
        for src in range(n):
            s = qr @ layout.split(k, src, n, dim=2).transpose(-1, -2) / D ** 0.5
            scores.append(s.masked_fill(local[None, :] > local[:, None], float("-inf")))
            vals.append(layout.split(v, src, n, dim=2))
        outs.append(torch.softmax(torch.cat(scores, -1), -1) @ torch.cat(vals, 2))
    return outs


def _close(a, b, atol=1e-5) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and bool(torch.allclose(a, b, atol=atol, rtol=1e-5))


def _judge_merge(results, ns):
    scores, values = merge_inputs()
    full = torch.cat(scores, -1)
    want_out = torch.softmax(full, -1) @ torch.cat(values, 0)
    want_lse = torch.logsumexp(full, -1)
    got_out, got_lse = learner_answer(results, "merge(out, lse, block_out, block_lse)")
    if torch.isnan(got_out).any() or torch.isnan(got_lse).any():
        rows = sorted({int(i) for i in torch.nonzero(torch.isnan(got_out))[:, 0]} |
                      {int(i) for i in torch.nonzero(torch.isnan(got_lse))[:, 0]})
        raise Fail(f"merge gives NaN in rows {rows}, where the running lse was −∞ (nothing seen yet) or a block is "
                   f"fully masked: −∞ − (−∞) is NaN", "finite", "NaN",
                   hint="subtract a finite number where the merged ℓ is −∞ (e.g. ℓ.masked_fill(isinf(ℓ), 0)): "
                        "e^(−∞ − 0) = 0, so a block that saw nothing adds nothing")
    if not _close(got_lse, want_lse):
        raise Fail("merge's lse is not log(e^ℓ_a + e^ℓ_b) of the two blocks", "logaddexp(ℓ_a, ℓ_b)", "different",
                   hint="the merged log-sum-exp is torch.logaddexp(lse, block_lse): the log of the two blocks' "
                        "summed exponentials")
    if not _close(got_out, want_out):
        first, second = block_result(scores[0], values[0]), block_result(scores[1], values[1])
        unscaled = first[0] + second[0]
        why = (": it is o_a + o_b, the blocks' outputs added without rescaling — each block's output is normalised "
               "by its own sum, so weigh it by e^(ℓ_block − ℓ) before adding" if _close(got_out, unscaled) else "")
        raise Fail(f"merged output differs from the softmax over both blocks' keys "
                   f"(max |Δ| = {float((got_out - want_out).abs().max()):.3g}){why}", "softmax over both blocks",
                   "not rescaled" if why else "different")
    return "two blocks merged from (0, −∞) equal the softmax over both blocks' keys, fully masked rows included"


def _gathered(results, key):
    return layout.gather([r[key] for r in results], dim=2)


def _judge_output(results, ns):
    n, want = len(results), reference()
    for rank, r in enumerate(results):
        expected = layout.split(want["out_"], rank, n, dim=2)
        got = r["out_"]
        if _close(got, expected):
            continue
        if isinstance(got, torch.Tensor) and torch.isnan(got).any():
            raise Fail(f"rank {rank}'s output holds NaN: a query that sees no key of a block has ℓ_b = −∞ "
                       f"(rank 0's early chunk sees nothing of rank 1's block)", "finite", "NaN", rank,
                       hint="in the block's softmax and in merge, subtract 0 where the log-sum-exp is −∞")
        local = _close(got, local_index_mask_output(n)[rank])
        diff = float((got - expected).abs().max()) if _close(got, got) and got.shape == expected.shape else float("inf")
        raise Fail(f"rank {rank}'s output differs from one process's causal attention on its tokens "
                   f"(max |Δ| = {diff:.3g})" + (": the mask compares local indices — rank r holds zig-zag chunks r "
                                                "and 2cp − 1 − r, so a key's place in its block is not its place in "
                                                "the sequence; compare all_positions[src] with positions"
                                                if local else ""),
                   "one process's", "masked by local index" if local else f"{diff:.3g}", rank,
                   hint="mask where all_positions[src][None, :] > positions[:, None] — the global positions"
                   if local else None)
    return "every rank's output, put back in sequence order, equals one process's causal attention"


def _judge_grads(results, ns):
    n, want = len(results), reference()
    for name in ("dq", "dk", "dv"):
        if any(not isinstance(r[name], torch.Tensor) for r in results):
            raise Fail(f"{name} is missing: ring_attention gave no gradient", "a gradient", None)
        got = _gathered(results, name)
        if not _close(got, want[name], 1e-4):
            raise Fail(f"{name} differs from one process's (max |Δ| = {float((got - want[name]).abs().max()):.3g}): "
                       f"the given backward uses your out and lse — both must be the whole softmax's",
                       "one process's", "different")
    return "dQ, dK and dV from the given backward equal one process's"


def _judge_bytes(results, ns):
    n = len(results)
    for rank, r in enumerate(results):
        formula = theory.ring_attention_bytes(n, r["block"])
        if r["sent"] != formula:
            fwd, want = r["sent"]["forward"], formula["forward"]
            why = ""
            if fwd == want + 2 * r["block"]:
                why = (f": {r['sends']} transfers of K and V forward, one more than cp − 1 — at the last step every "
                       f"block has visited every rank, so nothing is sent")
            elif fwd == 0:
                why = ": nothing sent forward — pass the key/value block on with ring_shift (zerokit.comm)"
            raise Fail(f"rank {rank} sent {r['sent']} B on the ring{why}",
                       f"{formula} (theory.ring_attention_bytes({n}, |K| = {r['block']}))", r["sent"], rank)
    block = results[0]["block"]
    return (f"bytes sent on the ring = theory.ring_attention_bytes(cp = {n}, |K| = {block} B): "
            f"{theory.ring_attention_bytes(n, block)}")


EXERCISE = Exercise(
    key="15_ring_attention",
    title="Ring attention's online softmax",
    minutes=40,
    needs=("merge", "ring_forward", "ring_attention"),
    scenarios={"merge": Scenario("merge", 0, _merge), "ring": Scenario("ring", N, _run)},
    checks=[
        Check("merge", 2, "merge", _judge_merge,
              "each block's output is normalised by its own sum: rescale both by e^(ℓ_own − ℓ_merged), "
              "ℓ_merged = logaddexp"),
        Check("same-as-one-process", 3, "ring", _judge_output,
              "the causal mask compares global positions: zig-zag chunks are not in sequence order"),
        Check("same-gradients", 2, "ring", _judge_grads,
              "backward recomputes P = exp(S − ℓ) from the final ℓ, so the forward's ℓ must be the whole softmax's"),
        Check("ring-bytes", 2, "ring", _judge_bytes,
              "cp − 1 transfers of K and V forward: after them every block has visited every rank"),
    ],
    hints=[
        "Ring attention keeps each rank's queries and passes the keys and values around the ring: at every step a rank "
        "attends to the block it holds while the next block is in transit. The softmax over all keys is assembled "
        "block by block — the online softmax: each block's output normalised by its own sum, merged by rescaling with "
        "the log-sum-exp.",
        "merge: the merged log-sum-exp is the log of the two blocks' summed exponentials; each output is weighed by e "
        "to the power of its own log-sum-exp minus the merged one, then the two are added. Where the merged "
        "log-sum-exp is −∞ (nothing seen yet, or a fully masked row) subtract 0 instead, so that no −∞ − (−∞) makes a "
        "NaN.",
        "ring_forward: start from an output of zeros and a log-sum-exp of −∞; at step s you hold the block of rank (me "
        "− s) mod n. Post the shift of the stacked keys and values first, unless it is the last step; compute on the "
        "block you hold, merge, then wait for the transfer and take the block that arrived.",
        "A block's own result: the scores q·kᵀ/√d, masked with −∞ where a key's global position is after the query's "
        "(compare the source rank's positions with yours: the zig-zag layout scrambles the local order); its "
        "log-sum-exp; the probabilities, with −∞ read as 0; their product with v.",
        "The code:\n"
        "merge:\n"
        "    merged = torch.logaddexp(lse, block_lse)\n"
        "    safe = merged.masked_fill(torch.isinf(merged), 0.0)\n"
        "    out = out * torch.exp(lse - safe)[..., None] + block_out * torch.exp(block_lse - safe)[..., None]\n"
        "    return out, merged\n"
        "ring_forward:\n"
        "    me, n = dist.get_rank(group), dist.get_world_size(group)\n"
        "    out, lse = torch.zeros(q.shape), torch.full(q.shape[:-1], float('-inf'))\n"
        "    kv = torch.stack([k, v]).contiguous()\n"
        "    for s in range(n):\n"
        "        src = (me - s) % n\n"
        "        pending = ring_shift(kv, group) if s < n - 1 else None\n"
        "        scores = torch.matmul(q, kv[0].transpose(-1, -2)) / math.sqrt(q.shape[-1])\n"
        "        scores = scores.masked_fill(all_positions[src][None, :] > positions[:, None], float('-inf'))\n"
        "        block_lse = torch.logsumexp(scores, dim=-1)\n"
        "        probs = torch.exp(scores - block_lse.masked_fill(torch.isinf(block_lse), 0.0)[..., None])\n"
        "        out, lse = merge(out, lse, torch.matmul(probs, kv[1]), block_lse)\n"
        "        if pending is not None:\n"
        "            incoming, works = pending\n"
        "            for work in works:\n"
        "                work.wait()\n"
        "            kv = incoming\n"
        "    return out, lse",
    ],
)
