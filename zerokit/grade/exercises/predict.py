"""Exercise 09: predict the number — bytes per rank, traffic per step, a bubble fraction.

Interface: three numbers the learner works out for stated configurations,
``ZERO1_BYTES_PER_RANK``, ``ZERO3_BYTES_SENT_PER_STEP`` and ``BUBBLE_1F1B``. Each is graded
against :mod:`zerokit.theory` and shown next to a measured run of the same configuration
(``zerokit.train`` on 2 gloo ranks; for the bubble also :func:`zerokit.simulate`), so the
learner sees the formula and the measurement agree — or, for the bubble's wall-clock
measurement on a shared CPU, by how much they do not. The measured runs launch their own
ranks, so their scenarios run in the submission's process without ranks of their own (each bounded by
its ``zerokit.train`` timeout and a margin); the three numbers are the exercise's ``answers``, the
plain values judged in the grader's process.
"""
from __future__ import annotations

import numbers

from ... import theory
from ...pipeline_parallel import measured, schedule, simulate
from ...train import train
from ...workloads import mlp, tiny_gpt
from ..core import Check, Exercise, Fail, Scenario

SIZES = (32, 64, 64, 10)
N = 2
P, M = 2, 4
#: relative tolerance for the byte counts, absolute for the fraction
BYTES_RTOL, FRACTION_ATOL = 0.005, 0.005
#: each measured run's own launch timeout; its scenario may take that and a margin
TRAIN_TIMEOUT_S = 120
SCENARIO_TIMEOUT_S = TRAIN_TIMEOUT_S + 30
ANSWERS = ("ZERO1_BYTES_PER_RANK", "ZERO3_BYTES_SENT_PER_STEP", "BUBBLE_1F1B")


def _workload():
    return mlp(sizes=SIZES)


def _units() -> list:
    return [a * b + b for a, b in zip(SIZES, SIZES[1:])]


def psi() -> int:
    return sum(_units())


def _answer(name: str):
    def requires(ns):
        value = ns.get(name, ...)
        if value is ... or value is None:
            return f"not answered yet: set {name} to a number"
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return f"{name} = {value!r}: expected a number"
        return None
    return requires


def _measure_zero1(ctx, ns, probe):
    rank = train(_workload(), "zero1", world_size=N, steps=1, reference=False, track_peak=False,
                 timeout_s=TRAIN_TIMEOUT_S)["zero1"].ranks[0]
    return {"measured": sum(rank.model_state_bytes[k] for k in ("params", "grads", "optimizer"))}


def _measure_zero3(ctx, ns, probe):
    rank = train(_workload(), "zero3", world_size=N, steps=1, reference=False, track_peak=False,
                 timeout_s=TRAIN_TIMEOUT_S, algorithm="ring")["zero3"].ranks[0]
    return {"measured": rank.comm_sent_bytes_per_step}


def _measure_bubble(ctx, ns, probe):
    sched = schedule("1f1b", P, M)
    result = train(tiny_gpt(n_layer=2), "pp", world_size=P, steps=2, micro_batches=M, schedule="1f1b",
                   reference=False, track_peak=False, timeout_s=TRAIN_TIMEOUT_S)["pp"]
    return {"simulated": simulate(sched).bubble_fraction,
            "measured": measured(sched, [r.pipeline_spans for r in result.ranks]).bubble_fraction}


def _close(value, expected, rtol=0.0, atol=0.0) -> bool:
    return abs(value - expected) <= max(atol, rtol * abs(expected))


def _judge_zero1(results, ns):
    value, n, p = ns["ZERO1_BYTES_PER_RANK"], N, psi()
    expected = theory.model_state_bytes(1, p, n, "fp32", "adamw", units=[p], optimizer_tensors=1).total
    shown = (f"yours {value:,} · theory {expected:,} B (theory.model_state_bytes(1, Ψ, N, 'fp32', 'adamw')) · "
             f"measured {results['measured']:,} B (zerokit.train zero1, rank 0)")
    if _close(value, expected, BYTES_RTOL):
        return shown
    others = {16 * p: "DDP's 16Ψ: every rank holding every state — ZeRO-1 shards the optimizer's",
              16 * p // n: "ZeRO-3's 16Ψ/N — ZeRO-1 shards only the optimizer states",
              4 * p + 12 * p // n: "ZeRO-2's 4Ψ + 12Ψ/N (gradients sharded too), which is also the paper's ZeRO-1 "
                                   "in mixed precision (2 + 2 bytes, K = 12); here fp32: 4 + 4 bytes, K = 8"}
    why = next((text for number, text in others.items() if _close(value, number, BYTES_RTOL)), "")
    raise Fail(f"{shown}" + (f" — yours is {why}" if why else ""),
               hint="fp32 AdamW: params 4Ψ and grads 4Ψ on every rank, m and v 8Ψ/N (+ 4 B for Adam's step)")


def _judge_zero3(results, ns):
    value, n, p = ns["ZERO3_BYTES_SENT_PER_STEP"], N, psi()
    expected = theory.comm_bytes_per_step(3, p, n, 4, units=_units())
    shown = (f"yours {value:,} · theory {expected:,} B (theory.comm_bytes_per_step(3, Ψ, N, 4)) · measured "
             f"{results['measured']:,.0f} B sent on the wire (zerokit.train zero3, algorithm='ring', rank 0)")
    if _close(value, expected, BYTES_RTOL):
        return shown
    others = {2 * (n - 1) * 4 * p / n: "DDP's (and ZeRO-1's and ZeRO-2's) 2(N−1)/N·Ψ·4 — ZeRO-3 gathers the "
                                       "parameters in forward and again in backward",
              3 * 4 * p: "3·Ψ·4: a rank sends (N−1)/N of each collective's bytes, not all of them"}
    why = next((text for number, text in others.items() if _close(value, number, BYTES_RTOL)), "")
    raise Fail(f"{shown}" + (f" — yours is {why}" if why else ""),
               hint="two all-gathers and one reduce-scatter of Ψ·4 bytes, each (N−1)/N on the wire")


def _judge_bubble(results, ns):
    value = ns["BUBBLE_1F1B"]
    expected = theory.bubble_fraction(P, M)
    shown = (f"yours {value:.4g} · theory {expected:.4g} (theory.bubble_fraction) · simulated "
             f"{results['simulated']:.4g} (zerokit.simulate) · measured {results['measured']:.3g} (wall clock of a "
             f"tiny GPT on this machine: stages of unequal cost sharing CPU cores, so only roughly)")
    if _close(value, expected, atol=FRACTION_ATOL):
        return shown
    why = ""
    if _close(value, theory.bubble_over_ideal(P, M), atol=FRACTION_ATOL):
        why = " — yours is (p − 1)/m, the bubble over the ideal compute time; the fraction of wall time idle is " \
              "(p − 1)/(m + p − 1)"
    raise Fail(shown + why,
               hint="every rank idles (p − 1) of the (m + p − 1) slot pairs of the schedule")


EXERCISE = Exercise(
    key="09_predict",
    title="Predict the number",
    minutes=20,
    needs=(),
    answers=ANSWERS,
    scenarios={"zero1": Scenario("zero1", 0, _measure_zero1, SCENARIO_TIMEOUT_S),
               "zero3": Scenario("zero3", 0, _measure_zero3, SCENARIO_TIMEOUT_S),
               "bubble": Scenario("bubble", 0, _measure_bubble, SCENARIO_TIMEOUT_S)},
    checks=[
        Check("zero1-bytes-per-rank", 3, "zero1", _judge_zero1,
              "ZeRO-1 shards the optimizer states only (ZeRO §5.1)", requires=_answer("ZERO1_BYTES_PER_RANK")),
        Check("zero3-bytes-sent-per-step", 3, "zero3", _judge_zero3,
              "ZeRO-3 moves 1.5 × DDP's bytes (ZeRO §7.2)", requires=_answer("ZERO3_BYTES_SENT_PER_STEP")),
        Check("bubble-1f1b", 2, "bubble", _judge_bubble,
              "the pipeline bubble, as a fraction of wall time (GPipe; Megatron §2.2)",
              requires=_answer("BUBBLE_1F1B")),
    ],
    hints=[
        "Predict before you measure: each answer is one of the course's formulas — the model-state bytes on one rank "
        "(ZeRO §5.1), the bytes a rank sends per step on a ring, and the pipeline bubble — written with this "
        "exercise's Ψ, N, p and m.",
        "Model states in fp32 with AdamW: 4 bytes of parameter and 4 of gradient per element, 8 of optimizer state (m "
        "and v). ZeRO-1 divides only the optimizer states by N; torch's AdamW adds a 4-byte step counter per tensor it "
        "steps, and ZeRO-1 steps one flat shard.",
        "A ring all-gather or reduce-scatter of S bytes makes each rank send (N−1)/N·S. ZeRO-3, per step: all-gather "
        "the parameters for forward, again for backward, and reduce-scatter the gradients — three such collectives of "
        "Ψ·4 bytes.",
        "1F1B with p stages and m micro-batches runs for m + p − 1 forward-and-backward slots, of which each rank "
        "works m: the idle fraction of the wall time is the rest over the total.",
        "The code:\n"
        "ZERO1_BYTES_PER_RANK = 4 * PSI + 4 * PSI + 8 * PSI // N + 4\n"
        "ZERO3_BYTES_SENT_PER_STEP = 3 * (N - 1) * 4 * PSI // N\n"
        "BUBBLE_1F1B = (p - 1) / (m + p - 1)  # here p = 2, m = 4",
    ],
)
