"""Exercise 14: the interleaved 1F1B schedule as data (Megatron 2104.04473 §2.2.2; torch's ScheduleInterleaved1F1B).

Interface: ``stage_of(r, c, p)`` and ``compute_order(p, m, v, r)`` (rank r's F and B actions in
order); the given ``interleaved_1f1b(p, m, v)`` wraps them in their sends and receives and makes
the :class:`~zerokit.pipeline_parallel.Schedule`. Graded without processes for several
(p, m, v) — chunks on the right ranks, every chunk's forward before its backward, no deadlock
under :func:`zerokit.simulate` and :func:`~zerokit.pipeline_parallel.p2p_plan.message_order`,
the bubble against :func:`zerokit.theory.bubble_fraction` ``(p, m, v)`` — then run by zerokit's
executor on 2 ranks with 2 chunks each: the point-to-point calls it posted are replayed under
NCCL's one-stream-per-pair rule (:mod:`zerokit.runtime.p2p_replay`), the order it ran checked
per chunk, the gradients held against one process's.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ... import theory
from ...pipeline_parallel import Action, simulate
from ...pipeline_parallel.executor import Executor
from ...pipeline_parallel.p2p_plan import message_order
from ...runtime.p2p_replay import P2PDeadlock, recording, replay
from ..core import Check, Exercise, Fail, Scenario
from ..probe import Mistake

#: (p, m, v) the schedule is played out for; m a multiple of p, as Megatron's interleaving needs
CONFIGS = ((2, 2, 2), (2, 4, 2), (2, 6, 3), (3, 3, 2), (3, 6, 2), (4, 4, 2), (4, 8, 2), (4, 8, 4))
RUN_P, RUN_M, RUN_V = 2, 4, 2
FORWARD, BACKWARD = 1.0, 2.0


def _placement(schedule) -> str:
    """'' when every action is on the rank of its stage and every stage has one F and one B per micro-batch."""
    p, m, v = schedule.ranks, schedule.micro_batches, schedule.chunks
    if len(schedule.actions) != p:
        return f"the schedule has {len(schedule.actions)} action lists for {p} ranks"
    seen = {}
    for r, row in enumerate(schedule.actions):
        for a in row:
            if a.stage >= p * v or a.micro >= m:
                return f"rank {r} runs {a}: there are {p * v} stages (0…{p * v - 1}) and {m} micro-batches"
            if a.stage % p != r:
                return (f"rank {r} runs {a}, but stage {a.stage} lives on rank {a.stage % p} (stage mod p): chunk c "
                        f"of rank r is stage c·p + r")
            if a.is_compute:
                seen[(a.stage, a.kind, a.micro)] = seen.get((a.stage, a.kind, a.micro), 0) + 1
    for s in range(p * v):
        for k in range(m):
            for kind in ("F", "B"):
                n = seen.get((s, kind, k), 0)
                if n != 1:
                    return f"stage {s} runs {s}{kind}{k} {n} times on rank {s % p}; every stage runs it once"
    return ""


def _order(schedule) -> str:
    """'' when every (stage, micro-batch)'s F comes before its B on its rank."""
    for r, row in enumerate(schedule.actions):
        done = set()
        for a in row:
            if a.kind == "F":
                done.add((a.stage, a.micro))
            elif a.kind == "B" and (a.stage, a.micro) not in done:
                chunk = a.stage // schedule.ranks
                return (f"rank {r} runs {a} (chunk {chunk}'s backward of micro-batch {a.micro}) before its forward "
                        f"{a.stage}F{a.micro}")
    return ""


def _paper(ctx, ns, probe):
    out = []
    for p, m, v in CONFIGS:
        row = {"p": p, "m": m, "v": v}
        schedule = ns["interleaved_1f1b"](p, m, v)
        row["placement"] = _placement(schedule)
        row["order"] = "" if row["placement"] else _order(schedule)
        if row["placement"] or row["order"]:
            out.append(row)
            continue
        try:
            result = simulate(schedule, forward=FORWARD, backward=BACKWARD)
            message_order(schedule)
        except (ValueError, RuntimeError) as e:
            row["deadlock"] = str(e)
        else:
            row.update(deadlock="", bubble=result.bubble_fraction, peak=list(result.peak_in_flight))
        out.append(row)
    return out


def pipeline_model() -> nn.Sequential:
    """Four stages of (Linear, Tanh) pairs, the last a Linear: stage s is layers 2s, 2s + 1."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 2))


def stage_module(model: nn.Sequential, s: int) -> nn.Module:
    return model[2 * s:2 * s + 2]


def micro_batches():
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(2 * RUN_M, 4, generator=g), torch.randn(2 * RUN_M, 2, generator=g)
    return [(x[2 * k:2 * k + 2], y[2 * k:2 * k + 2]) for k in range(RUN_M)]


def _mse(out, target):
    return ((out - target) ** 2).mean()


def _run(ctx, ns, probe):
    schedule = ns["interleaved_1f1b"](RUN_P, RUN_M, RUN_V)
    problem = _placement(schedule) or _order(schedule)
    if not problem:
        try:
            simulate(schedule)
        except (ValueError, RuntimeError) as e:
            problem = str(e)
    if problem:
        raise Mistake("not-runnable", f"not run: the schedule for p={RUN_P}, m={RUN_M}, v={RUN_V} fails on paper "
                                      f"({problem})")
    model = pipeline_model()
    stages = {s: stage_module(model, s) for s in range(ctx.rank, RUN_P * RUN_V, RUN_P)}
    executor = Executor(schedule, stages, ctx.rank, list(range(RUN_P)), None, _mse, torch.device("cpu"))
    micro = micro_batches()
    executor.infer_shapes(micro[0][0])
    with recording() as posted:
        executor.step(micro)
    grads = {f"{s}.{n}": p.grad.detach().clone() for s, stage in stages.items() for n, p in stage.named_parameters()}
    return {"grads": grads, "ran": [str(a) for a, _, _ in executor.spans], "posted": posted}


def _rows(results):
    return results[0]


def _judge_placement(results, ns):
    for row in _rows(results):
        if row["placement"]:
            raise Fail(f"p={row['p']}, m={row['m']}, v={row['v']}: {row['placement']}",
                       "every stage on rank stage mod p", "misplaced")
    return (f"for every (p, m, v) in {list(CONFIGS)} rank r holds stages r, r + p, …, r + (v − 1)·p, each running "
            f"one F and one B of every micro-batch")


def _judge_order(results, ns):
    for row in _rows(results):
        if row["placement"]:
            raise Fail(f"p={row['p']}, m={row['m']}, v={row['v']}: not judged — the stages are not on their ranks "
                       f"(see 'chunks-on-ranks')")
        if row["order"]:
            p, v, m = row["p"], row["v"], row["m"]
            raise Fail(f"p={p}, m={m}, v={v}: {row['order']}", "F before B on every chunk", "B first",
                       hint=f"with v chunks a micro-batch's backward starts on the last chunk, so rank r must have "
                            f"run every chunk's forward of the first group before its first backward: (v − 1)·p + "
                            f"2·(p − 1 − r) warm-up forwards (1F1B's p − 1 − r is not enough); p={p}, v={v}: "
                            f"rank 0 needs {min((v - 1) * p + 2 * (p - 1), v * m)}")
    return "on every rank and chunk each micro-batch's forward comes before its backward"


def _judge_deadlock(results, ns):
    for row in _rows(results):
        if row["placement"] or row["order"]:
            raise Fail(f"p={row['p']}, m={row['m']}, v={row['v']}: not simulated (see 'chunks-on-ranks' and "
                       f"'forward-before-backward')")
        if row["deadlock"]:
            raise Fail(f"p={row['p']}, m={row['m']}, v={row['v']}: {row['deadlock']}", "no deadlock", "deadlock",
                       hint="a micro-batch's backward runs the chunks in reverse: the last chunk (stage "
                            "(v − 1)·p + r) first, chunk 0 last — chunk 0's backward waits for a gradient that "
                            "comes back through every later stage")
    return ("zerokit.simulate plays it out to the end for every (p, m, v), and p2p_plan finds one causal order of its "
            "messages: no deadlock")


def _judge_bubble(results, ns):
    for row in _rows(results):
        if row.get("bubble") is None:
            raise Fail(f"p={row['p']}, m={row['m']}, v={row['v']}: not simulated (see the checks above)")
        p, m, v = row["p"], row["m"], row["v"]
        expected = theory.bubble_fraction(p, m, v)
        if abs(row["bubble"] - expected) > 1e-9:
            plain = theory.bubble_fraction(p, m)
            why = (" — 1F1B's, as if there were one chunk: run the forwards depth-first in groups of p micro-batches"
                   if abs(row["bubble"] - plain) < 1e-9 else "")
            raise Fail(f"p={p}, m={m}, v={v}: the simulated idle share is {row['bubble']:.4f}{why}",
                       f"(p − 1)/(v·m + p − 1) = {expected:.4f}", f"{row['bubble']:.4f}")
    p, m, v = CONFIGS[-2]
    return (f"simulated bubble = theory.bubble_fraction(p, m, v) = (p − 1)/(v·m + p − 1) for every (p, m, v); "
            f"p={p}, m={m}: {theory.bubble_fraction(p, m, v):.4f} with v={v}, "
            f"1F1B's {theory.bubble_fraction(p, m):.4f}")


def peak_bound(p: int, m: int, v: int, r: int) -> int:
    """Chunk micro-batches rank r holds at most under Megatron's order: its warm-up forwards and one more (all v·m
    when m = p, where Megatron runs every forward first)."""
    return v * m if m == p else min((v - 1) * p + 2 * (p - 1 - r) + 1, v * m)


def _judge_peak(results, ns):
    for row in _rows(results):
        if row.get("peak") is None:
            raise Fail(f"p={row['p']}, m={row['m']}, v={row['v']}: not simulated (see the checks above)")
        p, m, v = row["p"], row["m"], row["v"]
        bound = [peak_bound(p, m, v, r) for r in range(p)]
        over = [r for r in range(p) if row["peak"][r] > bound[r]]
        if over:
            r = over[0]
            gpipe = row["peak"][r] == v * m
            why = (" — every forward before any backward, GPipe's order over the chunks: same bubble, v·m "
                   "activations held; start the backwards after the warm-up" if gpipe else "")
            raise Fail(f"p={p}, m={m}, v={v}: rank {r} holds {row['peak'][r]} chunk micro-batches' activations at "
                       f"peak{why}", f"≤ min((v − 1)·p + 2·(p − 1 − r) + 1, v·m) = {bound}", row["peak"], r)
    p, m, v = CONFIGS[-2]
    return (f"peak chunk micro-batches in flight within Megatron's warm-up + 1 on every rank; p={p}, m={m}, v={v}: "
            f"{[peak_bound(p, m, v, r) for r in range(p)]} of {v * m}")


def _judge_run(results, ns):
    try:
        replay({rank: r["posted"] for rank, r in enumerate(results)})
    except P2PDeadlock as e:
        raise Fail(f"the run finished on gloo, but its point-to-point calls deadlock under NCCL's one stream per "
                   f"pair: {e}", "no deadlock", "deadlock") from e
    for rank, r in enumerate(results):
        done = set()
        for text in r["ran"]:
            stage, kind, micro = _parse(text)
            if kind == "F":
                done.add((stage, micro))
            elif kind == "B" and (stage, micro) not in done:
                raise Fail(f"rank {rank} ran {text} before {stage}F{micro}", "F before B", "B first", rank)
    model = pipeline_model()
    total = sum(_mse(model(x), y) for x, y in micro_batches()) / RUN_M
    total.backward()
    for rank, r in enumerate(results):
        for s in range(rank, RUN_P * RUN_V, RUN_P):
            for name, p in stage_module(model, s).named_parameters():
                got = r["grads"].get(f"{s}.{name}")
                if got is None or not torch.allclose(got, p.grad, atol=1e-6):
                    diff = "missing" if got is None else f"max |Δ| = {float((got - p.grad).abs().max()):.3g}"
                    raise Fail(f"rank {rank}'s gradient of stage {s}'s {name} differs from one process's ({diff})",
                               "equal", "different", rank)
    return (f"zerokit's executor ran it on {RUN_P} ranks × {RUN_V} chunks, m = {RUN_M}: it finished, its send/recv "
            f"replay without a deadlock under NCCL's rules, every chunk ran F before B, and every stage's gradients "
            f"equal one process's")


def _parse(text: str):
    a = Action.parse(text)
    return a.stage, a.kind, a.micro


EXERCISE = Exercise(
    key="14_interleaved_1f1b",
    title="The interleaved 1F1B schedule",
    minutes=40,
    needs=("stage_of", "compute_order", "interleaved_1f1b"),
    scenarios={"paper": Scenario("paper", 1, _paper), "run": Scenario("run", RUN_P, _run)},
    checks=[
        Check("chunks-on-ranks", 2, "paper", _judge_placement,
              "Megatron's placement is round-robin: rank r holds stages r, r + p, …, so a micro-batch goes round the "
              "ranks v times"),
        Check("forward-before-backward", 2, "paper", _judge_order,
              "the warm-up covers every chunk's forward of the first group: (v − 1)·p + 2·(p − 1 − r) "
              "forwards"),
        Check("no-deadlock", 2, "paper", _judge_deadlock,
              "backwards go through the chunks in reverse order, so every gradient a rank waits for is on its way"),
        Check("bubble", 2, "paper", _judge_bubble,
              "interleaving divides the idle share by about v: (p − 1)/(v·m + p − 1), for v times more messages"),
        Check("peak-in-flight", 2, "paper", _judge_peak,
              "what 1F1B's order saves is memory: a rank holds its warm-up's activations plus one, not all v·m"),
        Check("runs-on-ranks", 2, "run", _judge_run,
              "a schedule is data; the executor runs its actions in order over send/recv, posted so that NCCL's "
              "one stream per pair cannot deadlock", catches=("not-runnable",)),
    ],
    hints=[
        "Interleaving shrinks the bubble by giving each rank v small chunks of the model instead of one big stage: a "
        "micro-batch visits ranks 0 to p − 1, then rank 0 again for its next chunk. The bubble falls by v; the price "
        "is v times the point-to-point messages.",
        "stage_of: rank r's chunk c is stage c·p + r, so rank 0 holds stages 0, p, 2p and so on. The forwards go "
        "depth-first in groups of p micro-batches: for each group, every chunk in turn, each on the group's p "
        "micro-batches; the backwards the same, with the chunks reversed.",
        "Warm-up: (v − 1)·p + 2·(p − 1 − r) forwards on rank r, at most v·m (Megatron's interleaved schedule counts it "
        "the same way); then one forward and one backward at a time; then the backwards left.",
        "zerokit's simulator (zerokit.simulate) names a deadlock's stuck ranks, and zerokit's own interleaved schedule "
        "(zerokit.schedule, kind interleaved) prints a table to compare yours with.",
        "The code:\n"
        "stage_of:  return c * p + r\n"
        "compute_order:\n"
        "    forwards = [Action(stage_of(r, c, p), 'F', first + k)\n"
        "                for first in range(0, m, p) for c in range(v) for k in range(p)]\n"
        "    backwards = [Action(stage_of(r, c, p), 'B', first + k)\n"
        "                 for first in range(0, m, p) for c in reversed(range(v)) for k in range(p)]\n"
        "    warmup = min((v - 1) * p + 2 * (p - 1 - r), v * m)\n"
        "    order = forwards[:warmup]\n"
        "    for k in range(len(forwards) - warmup):\n"
        "        order += [forwards[warmup + k], backwards[k]]\n"
        "    return order + backwards[len(forwards) - warmup:]",
    ],
)
