"""Pipeline schedules built as data: GPipe, 1F1B, Megatron's interleaved 1F1B and zero-bubble ZB-H1.

Lifecycle: each builder is a pure function of the pipeline ranks ``p``, the micro-batches
``m`` (and the chunks per rank ``v``) that returns a :class:`~.actions.Schedule`: it lays
out every rank's compute actions in order, then :func:`_with_communication` inserts the
point-to-point actions around them — ``RECV_F`` before a forward on stage s > 0,
``SEND_F`` after one on s < S − 1, ``RECV_B`` before a backward (B or I) on s < S − 1,
``SEND_B`` after one on s > 0. The last stage's forward is followed, on the same rank, by
its backward on the loss. :func:`schedule` picks a builder by name. Nothing here runs:
:func:`~.simulate.simulate` plays a schedule out on paper, the executor with processes.

The bubble each docstring derives is in the units of one action: F and B are one chunk's
forward and backward (a whole stage's without interleaving), I and W the two halves of a
split backward. The formulas they land on are :mod:`zerokit.theory`'s where it has them
(``pipeline_makespan``, ``bubble_fraction``); :func:`~.simulate.simulate` reproduces each.
"""
from __future__ import annotations

import numbers
from typing import List, Sequence, Tuple

from .actions import Action, Schedule

NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1")


def _check_sizes(p, m, v=1, names: Sequence[str] = ("p", "m", "v")) -> None:
    what = ("pipeline ranks, the mesh's pp degree", "micro-batches per step", "model chunks per rank")
    for value, name, meaning in zip((p, m, v), names, what):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} ({meaning}): must be an integer >= 1")
    if v > 1 and p < 2:
        raise ValueError(f"{names[2]}={v!r} needs {names[0]} >= 2: with one rank there is nothing to interleave")


def _with_communication(name: str, p: int, m: int, v: int, compute: List[List[Action]]) -> Schedule:
    """The schedule whose rank r computes ``compute[r]`` in order, with its sends and receives inserted."""
    last = p * v - 1
    rows = []
    for ops in compute:
        row: List[Action] = []
        for a in ops:
            if a.kind == "F" and a.stage > 0:
                row.append(Action(a.stage, "RECV_F", a.micro))
            if a.kind in ("B", "I") and a.stage < last:
                row.append(Action(a.stage, "RECV_B", a.micro))
            row.append(a)
            if a.kind == "F" and a.stage < last:
                row.append(Action(a.stage, "SEND_F", a.micro))
            if a.kind in ("B", "I") and a.stage > 0:
                row.append(Action(a.stage, "SEND_B", a.micro))
        rows.append(row)
    return Schedule(name, p, m, v, rows)


def _one_f_one_b_order(forwards: List[Action], backwards: List[Action], warmup: int) -> List[Action]:
    """``warmup`` forwards, then one forward and one backward at a time, then the remaining backwards."""
    ops = list(forwards[:warmup])
    for k in range(len(forwards) - warmup):
        ops += [forwards[warmup + k], backwards[k]]
    return ops + backwards[len(forwards) - warmup:]


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (arXiv 1811.06965): every rank runs all m forwards, then all m backwards (B0 first, as torch).

    Bubble: micro-batch k reaches rank r at (r + k)·F, so the last rank ends its forwards
    at (m + p − 1)·F; the backwards run the same staircase the other way and rank 0 ends
    at (m + p − 1)·(F + B). Every rank works m·(F + B), so each idles (p − 1)·(F + B):
    bubble fraction (p − 1)/(m + p − 1) (``theory.bubble_fraction(p, m)``), for any F, B.
    Every rank holds all m micro-batches' activations at the turn.
    """
    _check_sizes(p, m)
    compute = [[Action(r, "F", k) for k in range(m)] + [Action(r, "B", k) for k in range(m)] for r in range(p)]
    return _with_communication("gpipe", p, m, 1, compute)


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B (PipeDream-flush, Megatron 2104.04473 §2.2): p − 1 − r warm-up forwards, then F and B alternate.

    Rank r runs min(p − 1 − r, m) forwards, then pairs (F, B) while forwards remain, then
    its last backwards — torch's ``Schedule1F1B`` order (its warm-up counts the first
    pair's F). Bubble: rank 0's first p forwards end at p·F; its first backward needs the
    round trip through the last rank and back, (p − 1)·B later. In the steady state the
    backwards reach it every F + B, exactly as fast as it works; in the cooldown they come
    every B, so it idles F before each of its last p − 1 backwards. Idle (p − 1)·(F + B)
    on every rank, as GPipe: fraction (p − 1)/(m + p − 1) (``theory.bubble_fraction``).
    What changes is memory: rank r holds at most min(p − r, m) micro-batches, not m.
    """
    _check_sizes(p, m)
    compute = []
    for r in range(p):
        forwards = [Action(r, "F", k) for k in range(m)]
        backwards = [Action(r, "B", k) for k in range(m)]
        compute.append(_one_f_one_b_order(forwards, backwards, min(p - 1 - r, m)))
    return _with_communication("1f1b", p, m, 1, compute)


def _groups(p: int, m: int) -> List[Tuple[int, int]]:
    """Micro-batch groups (first, size): max(1, m // p) groups as even as possible, larger first."""
    rounds = max(1, m // p)
    size, extra = divmod(m, rounds)
    out, first = [], 0
    for g in range(rounds):
        n = size + (g < extra)
        out.append((first, n))
        first += n
    return out


def interleaved_1f1b(p: int, m: int, v: int) -> Schedule:
    """Megatron's interleaved 1F1B (2104.04473 §2.2.2): v chunks per rank, depth-first in groups of micro-batches.

    Rank r holds stages r, r + p, …, r + (v − 1)·p. Its forwards run group by group: for
    each group of micro-batches, chunk 0 on the whole group, then chunk 1, …; its
    backwards the same with the chunks reversed. The groups are Megatron's p micro-batches
    when p divides m; for any m, max(1, m // p) groups as even as possible (sizes between
    p and 2p − 1, or m when m < p) — torch's ``ScheduleInterleaved1F1B`` whenever it
    accepts m (it needs equal groups). Warm-up: (v − 1)·g + 2·(p − 1 − r) forwards, g the
    largest group (capped at v·m), then F and B alternate. With v = 1 this is 1F1B.

    Bubble, in chunk actions (F, B: one chunk's forward and backward). m ≥ p: the 1F1B
    argument holds with every rank doing v·m chunk pairs instead of m, and the round
    trip still costs (p − 1)·(F + B) of idle per rank: fraction (p − 1)/(v·m + p − 1)
    (``theory.bubble_fraction(p, m, v)``), v times less idle relative to work. m < p: a
    group is shorter than the ring, so rank 0 finishes chunk 0's m forwards (m·F) before
    micro-batch 0 returns for chunk 1 (p·F): the schedule degenerates to GPipe over
    S = v·p stages, makespan (m + v·p − 1)·(F + B) (``theory.pipeline_makespan(v·p, m, F, B)``)
    and fraction 1 − v·m/(m + v·p − 1) = (v·p − 1 − (v − 1)·m)/(m + v·p − 1); both agree at m = p.
    """
    _check_sizes(p, m, v)
    if v == 1:
        return Schedule("interleaved", p, m, 1, one_f_one_b(p, m).actions)
    groups = _groups(p, m)
    largest = max(n for _, n in groups)
    compute = []
    for r in range(p):
        forwards = [Action(c * p + r, "F", first + k) for first, n in groups for c in range(v) for k in range(n)]
        backwards = [Action(c * p + r, "B", first + k)
                     for first, n in groups for c in reversed(range(v)) for k in range(n)]
        warmup = min((v - 1) * largest + 2 * (p - 1 - r), v * m)
        compute.append(_one_f_one_b_order(forwards, backwards, warmup))
    return _with_communication("interleaved", p, m, v, compute)


def zb_h1(p: int, m: int) -> Schedule:
    """Zero-bubble ZB-H1 (Qi et al., arXiv 2401.10241 §2.1): 1F1B with the backward split, W deferred.

    Each backward is split into I (the input gradient the previous stage waits for; the
    paper's "B") and W (the weight gradient nobody waits for). Rank r runs 1F1B's
    min(p − 1 − r, m) warm-up forwards, then F and I alternate; after its j-th I it runs
    the W of micro-batch j − r (none while j < r), and its last r W's at the end. So
    rank r defers r W's: every rank holds at most min(p, m) micro-batches — rank 0, the
    fullest, exactly as under 1F1B, the others the W stash of a few more (the paper's
    "same number of in-flight micro-batches" on every stage). This is torch's
    ``ScheduleInterleavedZeroBubble`` with one chunk per rank.

    Bubble with F = I = W (backward = 2·forward, split in halves), m ≥ p: rank r idles
    r·F before its first forward and (p − 1 − r)·I = (p − 1 − r)·F waiting for its first
    I (the last rank's, p − 1 − r hops back); after that the deferred W's fill every slot
    1F1B's cooldown left empty, so idle per rank is (p − 1)·F against 1F1B's 3·(p − 1)·F:
    fraction (p − 1)/(3m + p − 1), a third of 1F1B's idle time. m < p: rank 0 runs its m
    forwards, starts I0 at (2p − 1)·F and then alternates W, I, busy to the end: makespan
    (2m + 2p − 1)·F, fraction (2p − 1 − m)/(2m + 2p − 1) (equal to the first at m = p).
    In general (m ≥ p) the idle is (p − 1)·max(F, I, F + I − W) per rank: the paper's
    (p − 1)(T_F + T_B − T_W) when W ≤ min(F, I); :func:`~.simulate.simulate` gives any case.
    """
    _check_sizes(p, m)
    compute = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        ops = [Action(r, "F", k) for k in range(warmup)]
        done = 0
        for j in range(m):
            if warmup + j < m:
                ops.append(Action(r, "F", warmup + j))
            ops.append(Action(r, "I", j))
            if j >= r:
                ops.append(Action(r, "W", done))
                done += 1
        compute.append(ops + [Action(r, "W", k) for k in range(done, m)])
    return _with_communication("zb-h1", p, m, 1, compute)


def schedule(name: str, stages: int, micro_batches: int, chunks: int = 1) -> Schedule:
    """The schedule ``name`` (``gpipe``, ``1f1b``, ``interleaved``, ``zb-h1``) for ``stages`` pipeline ranks.

    ``stages`` is the mesh's pp degree p; ``chunks`` > 1 (model chunks per rank) only for
    ``interleaved``.
    """
    if name not in NAMES:
        raise ValueError(f"schedule name={name!r}; known: {', '.join(NAMES)}")
    _check_sizes(stages, micro_batches, chunks, names=("stages", "micro_batches", "chunks"))
    if name == "interleaved":
        return interleaved_1f1b(stages, micro_batches, chunks)
    if chunks != 1:
        raise ValueError(f"chunks={chunks!r}: only the 'interleaved' schedule takes chunks > 1, not {name!r}")
    return {"gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1}[name](stages, micro_batches)
