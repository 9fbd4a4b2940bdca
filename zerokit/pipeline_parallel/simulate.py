"""Run a pipeline schedule on paper, without processes: when each action starts and ends, who idles.

Lifecycle: :func:`check` first holds a :class:`~.actions.Schedule` to the rules every pipeline
schedule obeys; :func:`simulate` then plays it out. Each rank executes its list strictly in
order. A compute action takes its duration (F = ``forward``, B = ``backward``; for split
backwards I = ``backward − weight`` and W = ``weight``); communication takes no time, but a
``RECV`` cannot end before its matching ``SEND`` has run on the other rank. If work remains
and no rank can move, the schedule deadlocks and :func:`simulate` raises ``RuntimeError``
naming the stuck ranks and the receives they wait in. The :class:`SimulationResult` holds
the makespan, each rank's idle time, the overall bubble fraction (total idle over
ranks × makespan), the peak number of micro-batches in flight per rank and ``spans``:
``spans[r]`` lists rank r's compute actions as ``(action, start, end)``, the same shape a
measured run produces, so :func:`~.figures.draw_schedule` draws either.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .actions import Action, Schedule

Span = Tuple[Action, float, float]

#: a communication action and the action on the other side it pairs with
_PEER = {"SEND_F": ("RECV_F", +1), "RECV_F": ("SEND_F", -1),
         "SEND_B": ("RECV_B", -1), "RECV_B": ("SEND_B", +1)}


def _peer(action: Action) -> Action:
    """The matching communication action: ``2SEND_F5`` ↔ ``3RECV_F5``, ``3SEND_B5`` ↔ ``2RECV_B5``."""
    kind, step = _PEER[action.kind]
    return Action(action.stage + step, kind, action.micro)


@dataclass
class SimulationResult:
    """What :func:`simulate` found; times are in the units of the durations it was given."""

    schedule: Schedule
    makespan: float
    #: total idle / (ranks × makespan)
    bubble_fraction: float
    #: makespan − busy time, per rank
    idle_per_rank: List[float]
    #: per rank, the most (stage, micro-batch) pairs held at once between F and the end of the backward
    peak_in_flight: List[int]
    #: per rank, its compute actions as (action, start, end)
    spans: List[List[Span]] = field(default_factory=list)

    @property
    def ranks(self) -> int:
        return len(self.spans)


def check(schedule: Schedule) -> None:
    """Raise ``ValueError`` unless ``schedule`` is a well-formed pipeline schedule.

    The rules: every action sits on the rank that holds its stage (``stage % ranks``) and
    names a stage and micro-batch that exist; every (stage, micro-batch) gets exactly one
    F and one full backward — one B, or one I and one W, never both kinds; on its rank, F
    precedes the B or I and I precedes W; a forward on stage s > 0 is preceded by the
    ``RECV_F`` of its micro-batch and one on s < S − 1 followed by a ``SEND_F``; a backward
    (B or I) on s < S − 1 is preceded by ``RECV_B`` and one on s > 0 followed by
    ``SEND_B``; every send has exactly one matching receive and every receive one send.
    """
    p, m, S = schedule.ranks, schedule.micro_batches, schedule.stages
    if len(schedule.actions) != p:
        raise ValueError(f"schedule {schedule.name!r} has {len(schedule.actions)} action lists for {p} ranks")
    where: Dict[Tuple[int, str, int], Tuple[int, int]] = {}  # (stage, kind, micro) -> (rank, position)
    for r, row in enumerate(schedule.actions):
        for i, a in enumerate(row):
            if a.stage >= S or a.micro >= m:
                raise ValueError(f"rank {r}: {a} names stage {a.stage} / micro-batch {a.micro}; "
                                 f"the schedule has {S} stages and {m} micro-batches")
            if a.stage % p != r:
                raise ValueError(f"rank {r}: {a} belongs to rank {a.stage % p}")
            if (a.stage, a.kind, a.micro) in where:
                raise ValueError(f"rank {r}: {a} appears twice")
            where[(a.stage, a.kind, a.micro)] = (r, i)

    def before(first: tuple, second: tuple, what: str) -> None:
        for missing, present in ((first, second), (second, first)):
            if missing not in where:
                raise ValueError(f"{Action(*present)} on rank {where[present][0]} has no {Action(*missing)} ({what})")
        if where[first][1] > where[second][1]:
            raise ValueError(f"rank {where[second][0]}: {Action(*first)} must come before {Action(*second)} ({what})")

    for s in range(S):
        for mb in range(m):
            f, b, i, w = ((s, k, mb) for k in ("F", "B", "I", "W"))
            if f not in where:
                raise ValueError(f"stage {s}, micro-batch {mb} has no forward {Action(*f)}")
            if (b in where) == (i in where or w in where):
                raise ValueError(f"stage {s}, micro-batch {mb} needs one full backward: "
                                 f"{Action(*b)}, or {Action(*i)} and {Action(*w)}")
            back = b if b in where else i
            before(f, back, "forward before backward")
            if back is i:
                before(i, w, "input gradient before weight gradient")
            if s > 0:
                before((s, "RECV_F", mb), f, "receive the activation before the forward")
                before(back, (s, "SEND_B", mb), "send the input gradient after the backward")
            if s < S - 1:
                before(f, (s, "SEND_F", mb), "send the activation after the forward")
                before((s, "RECV_B", mb), back, "receive the output gradient before the backward")
    for (stage, kind, mb), (r, _) in where.items():
        if kind in _PEER:
            other, step = _PEER[kind]
            if not 0 <= stage + step < S or (stage + step, other, mb) not in where:
                raise ValueError(f"{Action(stage, kind, mb)} on rank {r} has no matching {other} "
                                 f"on stage {stage + step}")


def durations(forward: float = 1.0, backward: float = 2.0, weight: Optional[float] = None) -> Dict[str, float]:
    """Seconds (or any unit) per compute kind: F, B, and the split I = backward − weight, W = weight."""
    weight = backward / 2 if weight is None else weight
    if forward < 0 or backward < 0:
        raise ValueError(f"forward={forward}, backward={backward}: durations must be >= 0")
    if not 0 <= weight <= backward:
        raise ValueError(f"weight={weight}: the weight-gradient part must lie in [0, backward={backward}]")
    return {"F": forward, "B": backward, "I": backward - weight, "W": weight}


def simulate(schedule: Schedule, forward: float = 1.0, backward: float = 2.0,
             weight: Optional[float] = None) -> SimulationResult:
    """Play ``schedule`` out (after :func:`check`) and time every action; see the module docstring.

    ``peak_in_flight[r]`` counts, on rank r, the (stage, micro-batch) pairs whose F has run
    and whose backward has not finished — B, or W when the backward is split (the inputs
    W needs stay stashed until it runs). With interleaving each chunk counts on its own: a
    micro-batch held by two chunks of a rank counts twice, each being 1/v of the rank's layers.
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a Schedule, e.g. zerokit.schedule('1f1b', stages, micro_batches); "
                        f"got {type(schedule).__name__} {schedule!r}")
    check(schedule)
    cost = durations(forward, backward, weight)
    p = schedule.ranks
    clock = [0.0] * p
    cursor = [0] * p
    busy = [0.0] * p
    sent: Dict[Tuple[int, str, int], float] = {}  # (stage, kind, micro) of each send -> when it ran
    spans: List[List[Span]] = [[] for _ in range(p)]
    remaining = sum(len(row) for row in schedule.actions)
    while remaining:
        progressed = False
        for r, row in enumerate(schedule.actions):
            while cursor[r] < len(row):
                a = row[cursor[r]]
                if a.kind in _PEER:
                    other, step = _PEER[a.kind]
                    if a.kind.startswith("SEND"):
                        sent[(a.stage, a.kind, a.micro)] = clock[r]
                    elif (a.stage + step, other, a.micro) in sent:
                        clock[r] = max(clock[r], sent[(a.stage + step, other, a.micro)])
                    else:
                        break
                else:
                    start, clock[r] = clock[r], clock[r] + cost[a.kind]
                    busy[r] += cost[a.kind]
                    spans[r].append((a, start, clock[r]))
                cursor[r] += 1
                remaining -= 1
                progressed = True
        if remaining and not progressed:
            stuck = [f"rank {r} waits in {row[cursor[r]]} for {_peer(row[cursor[r]])} "
                     f"(rank {schedule.rank_of(_peer(row[cursor[r]]).stage)})"
                     for r, row in enumerate(schedule.actions) if cursor[r] < len(row)]
            raise RuntimeError(f"schedule {schedule.name!r} deadlocks: " + "; ".join(stuck))
    makespan = max(clock, default=0.0)
    idle = [makespan - b for b in busy]
    bubble = sum(idle) / (p * makespan) if makespan > 0 else 0.0
    return SimulationResult(schedule, makespan, bubble, idle, [_peak(row) for row in spans], spans)


def measured(schedule: Schedule, rank_spans: List[list]) -> SimulationResult:
    """A real run's timeline in the simulator's shape: ``rank_spans[r]`` is pipeline rank r's
    ``pipeline_spans`` from ``zerokit.train`` (``(action string, start s, end s)``, seconds from that
    rank's start of the step). Only compute actions count as busy; a rank's receives (and the
    waits inside them) are idle. Each rank's clock starts when it starts the step, so the
    ranks line up to within the skew of their starts. ``bubble_fraction`` = 1 − busy time over
    ranks × makespan, as :func:`simulate` defines it; measured, so the ranks' sharing of CPU
    cores shows up in it too."""
    spans = [[(Action.parse(a), start, end) for a, start, end in row if Action.parse(a).is_compute]
             for row in rank_spans]
    makespan = max((end for row in rank_spans for _, _, end in row), default=0.0)
    busy = [sum(end - start for _, start, end in row) for row in spans]
    idle = [makespan - b for b in busy]
    bubble = sum(idle) / (len(spans) * makespan) if makespan > 0 else 0.0
    return SimulationResult(schedule, makespan, bubble, idle, [_peak(row) for row in spans], spans)


def _peak(spans: List[Span]) -> int:
    """Most (stage, micro-batch) pairs between their F and the end of their B (or W) on one rank."""
    held = peak = 0
    for a, _, _ in spans:
        if a.kind == "F":
            held += 1
            peak = max(peak, held)
        elif a.kind in ("B", "W"):
            held -= 1
    return peak
