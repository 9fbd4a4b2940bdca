"""Timelines to compare: several runs' per-rank Gantt rows on one shared time axis, exposed time on top.

:func:`timeline_figure` draws one panel per run (a label → a report of
``zerokit.train(..., keep_records=True)``), each rank a row: compute above (forward,
backward — which ends where the last module's backward ended — "grad sync", the rest of
``engine.backward``, and the step), communication below. Communication is drawn in
layers, bottom to top, so nothing hides the part that costs time: a collective from
launch to known completion (in flight), the emulated link's span when there is one
(:mod:`zerokit.runtime.link`), then the **exposed** time — blocked on a collective — in
red, and the part of it spent waiting for a peer that had not yet launched the same
collective (:func:`zerokit.runtime.timeline.straggler_waits`) in orange, labelled with
that peer. Every panel starts at its own step's start and all share the x-axis, so equal
lengths are equal times. Each panel is drawn by :func:`zerokit.plot.draw_timeline` (the
same picture as :func:`zerokit.plot.timeline`); :func:`timeline_stats` gives the medians over steps the titles
and tables show.
"""
from __future__ import annotations

import statistics
from typing import Dict, Optional

from .figures import LEGEND_SIZE, new_figure


def timeline_stats(report, steps: range) -> list:
    """Per rank, medians over ``steps``: step ms, backward compute ms, exposed ms, of which straggler wait and
    emulated-link hold, and in-flight ms."""
    from ..runtime.timeline import rank_timeline, ranks_of, straggler_waits

    ranks = ranks_of(report)
    lines = [rank_timeline(r) for r in ranks]
    waits = straggler_waits(lines)
    rows = []
    for rank, line in zip(ranks, lines):
        def per_step(values):
            return 1e3 * statistics.median([sum(v for s, v in values if s == k) for k in steps])

        comm = [c for c in line["comm"] if c["phase"] != "setup"]
        rows.append({
            "rank": rank.rank,
            "step ms": 1e3 * statistics.median(rank.step_times_s[k] for k in steps),
            "backward ms": per_step([(c["step"], c["end"] - c["start"]) for c in line["compute"]
                                     if c["name"] == "backward"]),
            "exposed ms": per_step([(c["step"], c["blocked_s"]) for c in comm]),
            "straggler wait ms": per_step([(w["step"], w["end"] - w["start"]) for w in waits
                                           if w["rank"] == rank.rank]),
            "emulated held ms": per_step([(c["step"], c.get("held_s", 0.0)) for c in comm]),
            "in flight ms": per_step([(c["step"], c["end"] - c["start"]) for c in comm]),
        })
    return rows


def timeline_figure(runs: Dict[str, object], steps: Optional[range] = None, width: float = 11.0):
    """One panel per run, ranks as rows, on a shared time axis from each panel's step start (see module doc)."""
    from ..plot import draw_timeline, timeline_legend
    from ..runtime.timeline import ranks_of

    height = 1.2 + sum(0.8 * len(ranks_of(r)) + 0.6 for r in runs.values())
    fig, _ = new_figure(width, height)
    fig.clear()
    axes = list(fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0])
    for ax, (label, report) in zip(axes, runs.items()):
        drawn = draw_timeline(ax, report, steps, legend_size=LEGEND_SIZE)
        stats = timeline_stats(report, drawn)
        shown = ", ".join(f"r{s['rank']} {s['exposed ms']:.1f}" for s in stats)
        ax.set_title(f"{label}: exposed ms/step (median) {shown}", fontsize=LEGEND_SIZE + 1, loc="left")
    axes[-1].set_xlabel("ms from the start of the step")
    timeline_legend(axes[0], LEGEND_SIZE, loc="lower center", bbox_to_anchor=(0.5, 1.25), ncol=4)
    fig.tight_layout()
    return fig
