"""Exercise 12: an activation-checkpointing policy — segments of k blocks recomputed in backward (Chen et al.
1604.06174), and the k that minimises the bytes.

Interface: ``segments(n, k)``; ``Recompute`` (a ``torch.autograd.Function``,
``apply(run, x, *params)``); ``checkpointed_forward(blocks, x, k)``; ``best_k(n, layer_bytes,
boundary_bytes)``. Graded on 2 ranks, in one launch, each rank its own batch through a chain
of n :class:`zerokit.activation_checkpointing.measure.ScaleBlock` (``tanh(x·w)``: its activations are
its input's size, A = X): the gradients against the chain without checkpointing, the saved
activations the memory ledger counts after forward (⌈n/k⌉·X) and at its peak over forward and
backward (:func:`zerokit.theory.checkpointed_activation_bytes`), and how many block forwards
backward re-ran. The same launch runs a chain whose blocks hold dropout (``tanh(dropout(x·w))``):
its gradients with ``k`` = 1 and 3 must equal the chain's without checkpointing under the same seed,
which holds only when the recompute draws the masks forward drew (the RNG state saved in forward and
restored in backward, as ``torch.utils.checkpoint``'s ``preserve_rng_state`` does). ``segments`` and
``best_k`` are called without ranks, in the submission's process (the scenario ``calls``: its answers,
or what each call raised, as plain data), and judged in the grader's, ``best_k`` against the formula's
minimum.
"""
from __future__ import annotations

import math

import torch

from ... import theory
from ...checkpointing.measure import scale_chain
from ...runtime.memory import MemoryLedger
from ..core import Check, Exercise, Fail, learner_answer, learner_call, Scenario

N = 2
BLOCKS, ROWS, WIDTH = 9, 4, 16
KS = (1, 3)
X = ROWS * WIDTH * 4  # one block's input (fp32), the boundary a segment keeps; a block's activations A = X
#: the dropout chain's drop probability: half the elements zeroed, so that a different mask shows in every gradient
DROPOUT = 0.5
#: the seed both runs of the dropout chain start from (with and without checkpointing)
DROPOUT_SEED = 12


class DropoutBlock(torch.nn.Module):
    """``tanh(dropout(x·w))``: a block whose forward draws random numbers, as a transformer block's does."""

    def __init__(self, width: int, scale: float):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((width,), scale))

    def forward(self, x):
        return torch.tanh(torch.nn.functional.dropout(x * self.w, p=DROPOUT, training=self.training))


def _dropout_chain():
    return torch.nn.Sequential(*[DropoutBlock(WIDTH, 1 + 0.05 * i) for i in range(BLOCKS)])


def _dropout_run(ns, rank, k):
    """The dropout chain's gradients: without checkpointing (``k`` None) or with ``checkpointed_forward``."""
    chain = _dropout_chain()
    x = _input(rank).requires_grad_()
    torch.manual_seed(DROPOUT_SEED + rank)
    y = chain(x) if k is None else ns["checkpointed_forward"](chain, x, k)
    y.sum().backward()
    return {"grads": _grads(chain, x), "out": y.detach()}


def _chain():
    torch.manual_seed(0)
    chain = scale_chain(BLOCKS, WIDTH)
    with torch.no_grad():  # a different w per block, so that a block run twice or skipped shows
        for i, block in enumerate(chain):
            block.w.mul_(1 + 0.05 * i)
    return chain


def _input(rank):
    return torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(70 + rank))


def _grads(chain, x):
    return {"x": x.grad, **{n: p.grad for n, p in chain.named_parameters()}}


def _run_policy(ns, rank, k):
    chain = _chain()
    recomputed = []
    for i, block in enumerate(chain):
        block.register_forward_hook(lambda m, a, o, i=i: recomputed.append(i)
                                    if torch._C._current_graph_task_id() != -1 else None)
    x = _input(rank).requires_grad_()
    ledger = MemoryLedger()
    ledger.track_model(chain)
    ledger.instrument(chain)
    with ledger.watch_activations():
        y = ns["checkpointed_forward"](chain, x, k)
        ledger.sample("after forward")
        stored = ledger.current()["activations"]
        y.sum().backward()
    ledger.remove_hooks()
    return {"stored": stored, "peak": ledger.peak_by_category["activations"], "recomputed": recomputed,
            "grads": _grads(chain, x), "out": y.detach()}


def _run(ctx, ns, probe):
    chain = _chain()
    x = _input(ctx.rank).requires_grad_()
    y = chain(x)
    y.sum().backward()
    out = {"plain": {"grads": _grads(chain, x), "out": y.detach()}}
    for k in KS:
        out[k] = _run_policy(ns, ctx.rank, k)
    out["dropout"] = {k: _dropout_run(ns, ctx.rank, k) for k in (None, *KS)}
    return out


SEGMENT_CASES = ((9, 3), (8, 3), (5, 1), (4, 4), (7, 2))


def _calls(ctx, ns, probe) -> dict:
    """Scenario ``calls`` (no ranks, in the submission's process): segments(n, k) and best_k(n, A, X) on every
    case, each answer as a list or a number (or what the call raised)."""
    def segments(n, k):
        return [tuple(s) for s in ns["segments"](n, k)]

    return {"segments": [learner_call(segments, n, k) for n, k in SEGMENT_CASES],
            "best_k": [learner_call(ns["best_k"], n, a, x) for n, a, x in CASES]}


def _expected_segments(n, k):
    return [(s, min(s + k, n)) for s in range(0, n, k)]


def _judge_segments(results, ns):
    for (n, k), outcome in zip(SEGMENT_CASES, results["segments"]):
        want = _expected_segments(n, k)
        got = learner_answer(outcome, f"segments({n}, {k})")
        if got != want:
            why = ""
            if got == want[:-1] and n % k:
                why = f": the last {n % k} block(s) are in no segment — the last segment is shorter when k does not " \
                      f"divide n"
            raise Fail(f"segments({n}, {k}) = {got}{why}", want, got)
    return "segments of k blocks from the first, the last one shorter when k does not divide n"


def _judge_gradients(results, ns):
    for rank, r in enumerate(results):
        plain = r["plain"]
        for k in KS:
            got = r[k]
            if not torch.allclose(got["out"], plain["out"], atol=1e-6):
                raise Fail(f"rank {rank}, k = {k}: checkpointed_forward's output differs from the chain's",
                           "the chain's output", "different", rank)
            for name, want in plain["grads"].items():
                g = got["grads"][name]
                if g is None:
                    raise Fail(f"rank {rank}, k = {k}: {name} got no gradient — Recompute's backward must return "
                               f"the gradient of every parameter passed to apply (autograd cannot see through a "
                               f"Function to the blocks' weights)", "a gradient", "None", rank)
                if not torch.allclose(g, want, atol=1e-5):
                    diff = float((g - want).abs().max())
                    raise Fail(f"rank {rank}, k = {k}: the gradient of {name} differs from the chain without "
                               f"checkpointing (max |Δ| = {diff:.3g})", 0.0, f"{diff:.3g}", rank)
    return f"k = {' and '.join(map(str, KS))}: the input's and every parameter's gradient equal the chain's without " \
           f"checkpointing"


def _judge_rng(results, ns):
    for rank, r in enumerate(results):
        plain = r["dropout"][None]
        for k in KS:
            got = r["dropout"][k]
            if not torch.allclose(got["out"], plain["out"], atol=1e-6):
                raise Fail(f"rank {rank}, k = {k}: with dropout in the blocks, checkpointed_forward's output differs "
                           f"from the chain's under the same seed", "the chain's output", "different", rank)
            for name, want in plain["grads"].items():
                g = got["grads"][name]
                if g is None or not torch.allclose(g, want, atol=1e-5):
                    diff = "no gradient" if g is None else f"max |Δ| = {float((g - want).abs().max()):.3g}"
                    raise Fail(f"rank {rank}, k = {k}: with dropout in the blocks, the gradient of {name} differs from "
                               f"the chain's without checkpointing ({diff}) — the recompute drew other dropout masks "
                               f"than forward did: save the RNG state in Recompute.forward (torch.get_rng_state()) "
                               f"and run backward's recompute from it (torch.random.fork_rng(), then "
                               f"torch.set_rng_state), as torch.utils.checkpoint's preserve_rng_state does",
                               "the same masks, the same gradients", diff, rank)
    return (f"with dropout (p = {DROPOUT}) in the blocks, k = {' and '.join(map(str, KS))} give the chain's gradients: "
            f"the recompute drew forward's masks")


def _judge_stored(results, ns):
    for rank, r in enumerate(results):
        for k in KS:
            want = math.ceil(BLOCKS / k) * X
            got = r[k]["stored"]
            if got != want:
                why = ""
                if got == 0:
                    why = (": nothing saved — keep the segment's input with ctx.save_for_backward: autograd's "
                           "saved-tensor hooks (which the ledger reads, as DeepSpeed's and torch's offloading of "
                           "activations do) see only what is saved that way, not a tensor kept as an attribute of ctx")
                elif got >= BLOCKS * X:
                    why = (f": every block's activations are still saved (n·A = {BLOCKS * X:,} B, and the last block's "
                           f"output) — the segments' "
                           f"forward recorded its graph; run it inside a torch.autograd.Function (Recompute), whose "
                           f"forward records nothing")
                raise Fail(f"rank {rank}, k = {k}: {got:,} B of activations saved after forward{why}",
                           f"⌈n/k⌉·X = {want:,} B", f"{got:,} B", rank)
    return (f"after forward the ledger counts ⌈n/k⌉·X: " +
            ", ".join(f"k = {k}: {math.ceil(BLOCKS / k) * X:,} B" for k in KS) + f" (n = {BLOCKS}, X = {X} B)")


def _judge_peak(results, ns):
    for rank, r in enumerate(results):
        for k in KS:
            want = theory.checkpointed_activation_bytes(BLOCKS, X, X, "every-k", segment_layers=k)
            got = r[k]["peak"]
            if got != want:
                raise Fail(f"rank {rank}, k = {k}: the ledger's activation peak is {got:,} B",
                           f"⌈n/k⌉·X + k·A = {want:,} B", f"{got:,} B", rank)
    return ("peak over forward and backward = theory.checkpointed_activation_bytes(n, A, X, 'every-k', k): " +
            ", ".join(f"k = {k}: {theory.checkpointed_activation_bytes(BLOCKS, X, X, 'every-k', segment_layers=k):,.0f} B"
                      for k in KS))


def _judge_recomputes(results, ns):
    for rank, r in enumerate(results):
        for k in KS:
            again = sorted(r[k]["recomputed"])
            if again != list(range(BLOCKS)):
                missing = sorted(set(range(BLOCKS)) - set(again))
                twice = sorted({i for i in again if again.count(i) > 1})
                why = ("no block ran again in backward: nothing was recomputed" if not again else
                       f"blocks {missing} never ran again" if missing else f"blocks {twice} ran more than once")
                raise Fail(f"rank {rank}, k = {k}: {why}", f"each of the {BLOCKS} blocks once",
                           f"{len(again)} block forwards", rank)
    return f"backward re-ran each of the {BLOCKS} blocks' forward exactly once: one extra forward, the price"


CASES = ((16, 1, 1), (9, 1, 1), (96, 17, 1), (24, 18, 1), (4, 18, 1), (10, 3, 2))


def _formula_best(n, a, x):
    return min(range(1, n + 1),
               key=lambda k: (theory.checkpointed_activation_bytes(n, a, x, "every-k", segment_layers=k), k))


def _judge_best_k(results, ns):
    for (n, a, x), outcome in zip(CASES, results["best_k"]):
        want = _formula_best(n, a, x)
        got = learner_answer(outcome, f"best_k({n}, A={a}, X={x})")
        if got != want:
            cost = theory.checkpointed_activation_bytes(n, a, x, "every-k", segment_layers=want)
            mine = theory.checkpointed_activation_bytes(n, a, x, "every-k", segment_layers=got) \
                if isinstance(got, int) and 1 <= got <= n else float("nan")
            why = ""
            if got == theory.optimal_checkpoint_segments(n) or got == round(math.sqrt(n)):
                why = (f" — √n is Chen's answer when a block's activations equal its input (A = X); here A = {a / x:g}·X, "
                       f"and the best k is near √(n·X/A)")
            raise Fail(f"best_k({n}, A={a}, X={x}) = {got}: ⌈n/k⌉·X + k·A = {mine:g}, against {cost:g} at k = {want}"
                       f"{why}", want, got)
    return "your k minimises ⌈n/k⌉·X + k·A in every case: √n when A = X, about √(n·X/A) for a transformer's A ≈ 17·X"


EXERCISE = Exercise(
    key="12_checkpoint_policy",
    title="An activation-checkpointing policy: every k-th block",
    minutes=40,
    needs=("segments", "Recompute", "checkpointed_forward", "best_k"),
    scenarios={"chain": Scenario("chain", N, _run), "calls": Scenario("calls", 0, _calls)},
    checks=[
        Check("segments", 1, "calls", _judge_segments,
              "segments of k consecutive blocks cover the chain; each keeps only its input"),
        Check("same-gradients", 3, "chain", _judge_gradients,
              "recomputing a segment's forward in backward gives the same gradients as keeping its activations"),
        Check("rng-state", 2, "chain", _judge_rng,
              "a recompute must draw the random numbers forward drew (dropout's masks): the RNG state saved in "
              "forward, restored for the recompute"),
        Check("stored-bytes", 2, "chain", _judge_stored,
              "after forward only the segments' inputs are saved: ⌈n/k⌉·X (Chen et al.)"),
        Check("peak-bytes", 2, "chain", _judge_peak,
              "the peak adds one segment's activations while it is recomputed: ⌈n/k⌉·X + k·A"),
        Check("recomputes", 1, "chain", _judge_recomputes,
              "the price of checkpointing: every block's forward runs once more, in backward"),
        Check("best-k", 2, "calls", _judge_best_k,
              "the best k minimises ⌈n/k⌉·X + k·A: √n only when A = X (Chen), ≈ √(n·X/A) otherwise"),
    ],
    hints=[
        "Activation checkpointing trades compute for memory: keep only each segment's input during forward, and run "
        "the segment again in backward to get the activations its gradients need. With a segment every k blocks, what "
        "is kept is the n/k boundaries plus one segment's activations at a time — the best k balances the two.",
        "segments: one (start, stop) pair per segment, from 0 in steps of k; the last stop is n, so a short last "
        "segment still counts. checkpointed_forward: for each segment, run its blocks (a slice of the Sequential) "
        "through Recompute, with the input and the segment's parameters.",
        "Recompute's forward runs with autograd off, so the segment saves nothing: keep the function to run, the input "
        "and the parameters (ctx.save_for_backward), and the RNG state, so that dropout draws the same masks again in "
        "backward.",
        "Recompute's backward: make a fresh leaf of the saved input, run the segment again with grad enabled from the "
        "saved RNG state (inside torch.random.fork_rng, so that training's own RNG moves on untouched), then take the "
        "gradients of the output with respect to the input and the parameters; return None for the function, then "
        "those. best_k: try every k from 1 to n and keep the smallest ⌈n/k⌉·boundary + k·layer bytes, the first on a "
        "tie.",
        "The code:\n"
        "segments:  return [(s, min(s + k, n)) for s in range(0, n, k)]\n"
        "Recompute.forward:\n"
        "    ctx.run, ctx.rng = run, torch.get_rng_state()\n"
        "    ctx.save_for_backward(x, *params)\n"
        "    return run(x)\n"
        "Recompute.backward:\n"
        "    x, *params = ctx.saved_tensors\n"
        "    x = x.detach().requires_grad_()\n"
        "    with torch.random.fork_rng(), torch.enable_grad():\n"
        "        torch.set_rng_state(ctx.rng)\n"
        "        y = ctx.run(x)\n"
        "    return (None, *torch.autograd.grad(y, (x, *params), grad))\n"
        "checkpointed_forward:\n"
        "    for start, stop in segments(len(blocks), k):\n"
        "        run = blocks[start:stop]\n"
        "        x = Recompute.apply(run, x, *run.parameters())\n"
        "    return x\n"
        "best_k:  return min(range(1, n + 1), key=lambda k: (math.ceil(n / k) * boundary_bytes + k * layer_bytes, k))",
    ],
)
