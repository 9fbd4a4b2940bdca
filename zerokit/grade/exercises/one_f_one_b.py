"""Exercise 08: a 1F1B pipeline schedule as data (PipeDream-flush; Megatron 2104.04473 §2.2).

Interface: ``one_f_one_b(p, m) -> zerokit.pipeline_parallel.Schedule``, every rank's actions
— ``F``, ``B`` and the ``SEND_*`` / ``RECV_*`` around them — in order. Graded without
processes by :func:`zerokit.pipeline_parallel.check` and :func:`zerokit.simulate` for several
(p, m): well formed, no deadlock, the bubble against
:func:`zerokit.theory.bubble_fraction`, the peak of micro-batches in flight against
:func:`zerokit.theory.peak_stashed_microbatches`; then run by zerokit's pipeline executor on 2
ranks, whose gradients must equal one process's.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ... import theory
from ...pipeline_parallel import check, simulate
from ...pipeline_parallel.executor import Executor
from ..core import Check, Exercise, Fail, Scenario
from ..probe import Mistake

#: (p, m) the schedule is played out for
CONFIGS = ((1, 1), (2, 1), (2, 4), (3, 5), (4, 2), (4, 8))
RUN_P, RUN_M = 2, 4


def _paper(ctx, ns, probe):
    out = []
    for p, m in CONFIGS:
        row = {"p": p, "m": m, "check": None, "deadlock": None}
        schedule = ns["one_f_one_b"](p, m)
        try:
            check(schedule)
        except ValueError as e:
            row["check"] = str(e)
            out.append(row)
            continue
        try:
            result = simulate(schedule, forward=1.0, backward=2.0)
        except RuntimeError as e:
            row["deadlock"] = str(e)
        else:
            row.update(bubble=result.bubble_fraction, peak=list(result.peak_in_flight))
        out.append(row)
    return out


def pipeline_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def micro_batches():
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(2 * RUN_M, 4, generator=g), torch.randn(2 * RUN_M, 2, generator=g)
    return [(x[2 * k:2 * k + 2], y[2 * k:2 * k + 2]) for k in range(RUN_M)]


def _mse(out, target):
    return ((out - target) ** 2).mean()


def _run(ctx, ns, probe):
    schedule = ns["one_f_one_b"](RUN_P, RUN_M)
    try:
        check(schedule)
        simulate(schedule)
    except (ValueError, RuntimeError) as e:
        raise Mistake("not-runnable", f"not run: the schedule for p={RUN_P}, m={RUN_M} fails on paper ({e})") from e
    model = pipeline_model()
    stage = model[0:2] if ctx.rank == 0 else model[2:]
    executor = Executor(schedule, {ctx.rank: stage}, ctx.rank, list(range(RUN_P)), None, _mse, torch.device("cpu"))
    micro = micro_batches()
    executor.infer_shapes(micro[0][0])
    executor.step(micro)
    return {n: p.grad.detach().clone() for n, p in stage.named_parameters()}


def _rows(results):
    return results[0]


def _judge_well_formed(results, ns):
    for row in _rows(results):
        if row["check"]:
            raise Fail(f"p={row['p']}, m={row['m']}: zerokit.pipeline_parallel.check refuses the schedule: "
                       f"{row['check']}", "well formed", "refused")
    return f"zerokit.pipeline_parallel.check accepts it for (p, m) in {list(CONFIGS)}"


def _judge_deadlock(results, ns):
    for row in _rows(results):
        if row["check"]:
            raise Fail(f"p={row['p']}, m={row['m']}: not simulated — the schedule is not well formed (see "
                       f"'well-formed')")
        if row["deadlock"]:
            raise Fail(f"p={row['p']}, m={row['m']}: {row['deadlock']}", "no deadlock", "deadlock",
                       hint="rank r runs min(p − 1 − r, m) warm-up forwards: the last rank none, so its first "
                            "backward comes right after its first forward and sends the gradient back in time; "
                            "with more warm-up on later ranks they wait for forwards that wait for backwards")
    return "zerokit.simulate plays it out to the end for every (p, m): no deadlock"


def _judge_bubble(results, ns):
    for row in _rows(results):
        if row.get("bubble") is None:
            raise Fail(f"p={row['p']}, m={row['m']}: not simulated (see 'well-formed' and 'no-deadlock')")
        expected = theory.bubble_fraction(row["p"], row["m"])
        if abs(row["bubble"] - expected) > 1e-9:
            raise Fail(f"p={row['p']}, m={row['m']}: the simulated idle fraction is {row['bubble']:.4f}",
                       f"(p − 1)/(m + p − 1) = {expected:.4f}", f"{row['bubble']:.4f}")
    p, m = CONFIGS[-1]
    return (f"simulated bubble = theory.bubble_fraction(p, m) = (p − 1)/(m + p − 1) for every (p, m); "
            f"p={p}, m={m}: {theory.bubble_fraction(p, m):.4f}")


def _judge_peak(results, ns):
    for row in _rows(results):
        if row.get("peak") is None:
            raise Fail(f"p={row['p']}, m={row['m']}: not simulated (see 'well-formed' and 'no-deadlock')")
        p, m = row["p"], row["m"]
        expected = [theory.peak_stashed_microbatches("1f1b", p, m, r) for r in range(p)]
        if row["peak"] != expected:
            rank = next(r for r in range(p) if row["peak"][r] != expected[r])
            gpipe = row["peak"][rank] == m and m > expected[rank]
            why = (" — all forwards before any backward, GPipe's order: start the backwards after the warm-up, "
                   "one forward then one backward" if gpipe else "")
            raise Fail(f"p={p}, m={m}: rank {rank} holds {row['peak'][rank]} micro-batches' activations at "
                       f"peak{why}", f"min(p − r, m) = {expected}", row["peak"], rank)
    p, m = CONFIGS[-1]
    return (f"peak micro-batches in flight on rank r = min(p − r, m) (theory.peak_stashed_microbatches); p={p}, "
            f"m={m}: {[theory.peak_stashed_microbatches('1f1b', p, m, r) for r in range(p)]}, GPipe would hold {m}")


def _judge_run(results, ns):
    model = pipeline_model()
    total = sum(_mse(model(x), y) for x, y in micro_batches()) / RUN_M
    total.backward()
    expected = [{n: p.grad for n, p in model[0:2].named_parameters()},
                {n: p.grad for n, p in model[2:].named_parameters()}]
    for rank, grads in enumerate(results):
        for name, want in expected[rank].items():
            got = grads.get(name)
            if got is None or not torch.allclose(got, want, atol=1e-6):
                raise Fail(f"pipeline rank {rank}'s gradient of {name} differs from one process's", "equal",
                           "different", rank)
    return (f"zerokit's executor ran it on {RUN_P} ranks over send/recv, m = {RUN_M}: every stage's gradients "
            f"equal one process's")


EXERCISE = Exercise(
    key="08_one_f_one_b",
    title="A 1F1B pipeline schedule as data",
    minutes=35,
    needs=("one_f_one_b",),
    scenarios={"paper": Scenario("paper", 1, _paper), "run": Scenario("run", RUN_P, _run)},
    checks=[
        Check("well-formed", 2, "paper", _judge_well_formed,
              "each forward on stage s > 0 follows its RECV_F and precedes its SEND_F (s < p − 1); each backward "
              "follows its RECV_B (s < p − 1) and precedes its SEND_B (s > 0)"),
        Check("no-deadlock", 2, "paper", _judge_deadlock,
              "warm-up: rank r runs min(p − 1 − r, m) forwards before its first backward"),
        Check("bubble", 2, "paper", _judge_bubble,
              "1F1B idles as much as GPipe: (p − 1)/(m + p − 1) of the time (Megatron §2.2)"),
        Check("peak-in-flight", 2, "paper", _judge_peak,
              "what 1F1B saves is memory: rank r holds min(p − r, m) micro-batches, not m"),
        Check("runs-with-executor", 2, "run", _judge_run,
              "a schedule is data; the executor runs its actions in order over send/recv",
              catches=("not-runnable",)),
    ],
    hints=[
        "1F1B bounds the activations in flight: after a short warm-up of forwards, each stage alternates one forward "
        "and one backward, so stage r never holds more than p − r micro-batches' activations, where GPipe's order "
        "(every forward first) holds all m. The bubble is the same; the memory is not.",
        "Build each rank's compute order first. Rank r's warm-up is p − 1 − r forwards, at most m: the last stage has "
        "none, the first the most. Then, while forwards remain, one forward and one backward (forward number warm-up + "
        "k, backward number k); then the backwards left.",
        "Then wrap each compute action in its communication: a forward receives its input first (except on the first "
        "stage) and sends its output after (except on the last); a backward receives its gradient first on every stage "
        "but the last, which computes its loss inside its forward, and sends after on every stage but the first.",
        "The p rows make a Schedule of kind 1f1b with one micro-batch group. zerokit's checker and simulator "
        "(zerokit.pipeline_parallel.check, zerokit.simulate) say at once what is wrong, and zerokit.schedule prints "
        "zerokit's own to compare with.",
        "The code, for each rank r:\n"
        "warmup = min(p - 1 - r, m)\n"
        "compute = [Action(r, 'F', k) for k in range(warmup)]\n"
        "for k in range(m - warmup):\n"
        "    compute += [Action(r, 'F', warmup + k), Action(r, 'B', k)]\n"
        "compute += [Action(r, 'B', k) for k in range(m - warmup, m)]\n"
        "# then each F as RECV_F (if r > 0), F, SEND_F (if r < p - 1);\n"
        "#      each B as RECV_B (if r < p - 1), B, SEND_B (if r > 0)\n"
        "return Schedule('1f1b', p, m, 1, actions)  # actions[r]: rank r's list",
    ],
)
