"""Collectives in flight together: why a step's "in flight" time can be longer than the step.

A timeline's *in flight* is each collective's launch-to-completion time, summed over the step
(:func:`zerokit.course.timeline_figure.timeline_stats`). Where collectives overlap one another —
an overlapped DDP launches its buckets during backward, and a link carries them one after
another, so a later bucket waits in flight behind the earlier ones — each counts its whole span,
and the sum can exceed the step. Lifecycle: :func:`overlap_of` takes the spans of one step and
gives their sum, their union (the time at least one collective was in flight, which a step
contains) and the most in flight at once; :func:`in_flight_by_step` reads the spans off one
rank's timeline (a run with ``keep_records=True``), step by step, setup left out.
"""
from __future__ import annotations

from typing import Iterable, List, Tuple

from ..runtime.timeline import rank_timeline


def overlap_of(spans: Iterable[Tuple[float, float]]) -> dict:
    """``{"summed_s", "union_s", "most_at_once"}`` for some (start, end) spans in seconds: the sum of their
    lengths, the length of their union, and the largest number open at one instant (a span ending where another
    starts does not overlap it)."""
    spans = sorted((float(start), float(end)) for start, end in spans)
    if any(end < start for start, end in spans):
        raise ValueError(f"spans must end after they start, got {[s for s in spans if s[1] < s[0]]}")
    summed = sum(end - start for start, end in spans)
    union, open_start, open_end = 0.0, None, None
    for start, end in spans:
        if open_end is None or start > open_end:
            union += 0.0 if open_end is None else open_end - open_start
            open_start, open_end = start, end
        else:
            open_end = max(open_end, end)
    union += 0.0 if open_end is None else open_end - open_start
    most = live = 0
    for _, change in sorted([(end, -1) for _, end in spans] + [(start, 1) for start, _ in spans]):
        live += change  # at equal times the ends (−1) come first
        most = max(most, live)
    return {"summed_s": summed, "union_s": union, "most_at_once": most}


def in_flight_by_step(rank_result, steps: Iterable[int]) -> List[dict]:
    """Per step of ``steps``: ``{"step", "calls", **overlap_of(...)}`` of one rank's training collectives."""
    comm = [c for c in rank_timeline(rank_result)["comm"] if c["phase"] != "setup"]
    rows = []
    for step in steps:
        spans = [(c["start"], c["end"]) for c in comm if c["step"] == step]
        rows.append({"step": step, "calls": len(spans), **overlap_of(spans)})
    return rows
