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
lengths are equal times. :func:`timeline_stats` gives the medians over steps the titles
and tables show.
"""
from __future__ import annotations

import statistics
from typing import Dict, Optional

from .figures import LEGEND_SIZE, new_figure

COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "grad sync": "#F2C6A0", "step": "#55A868",
          "in flight": "#D9D4EE", "emulated link": "#8C8C8C", "exposed": "#C44E52", "straggler wait": "#F0A030"}


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
    from matplotlib.patches import Patch

    from ..runtime.timeline import rank_timeline, ranks_of, straggler_waits

    height = 1.2 + sum(0.8 * len(ranks_of(r)) + 0.6 for r in runs.values())
    fig, _ = new_figure(width, height)
    fig.clear()
    axes = list(fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0])
    for ax, (label, report) in zip(axes, runs.items()):
        ranks = ranks_of(report)
        lines = [rank_timeline(r) for r in ranks]
        drawn = steps if steps is not None else range(max(c["step"] for c in lines[0]["compute"]) + 1)
        keep = lambda item: item["step"] in drawn and item.get("phase") != "setup"  # noqa: E731
        t0 = min(c["start"] for line in lines for c in line["compute"] if keep(c))
        ms = lambda t: 1e3 * (t - t0)  # noqa: E731
        waits = [w for w in straggler_waits(lines) if w["step"] in drawn]

        def bar(x0, x1, y, h, color, z, **kw):
            ax.broken_barh([(ms(x0), max(ms(x1) - ms(x0), 0.05))], (y, h), color=color, zorder=z, **kw)

        for row, line in enumerate(lines):
            y = len(lines) - 1 - row
            for c in filter(keep, line["compute"]):
                bar(c["start"], c["end"], y + 0.05, 0.4, COLORS.get(c["name"], "#999999"), 1)
            comm = list(filter(keep, line["comm"]))
            for c in comm:
                bar(c["start"], c["end"], y - 0.45, 0.4, COLORS["in flight"], 2, edgecolor="#6A5ACD", linewidth=0.4)
            for c in comm:
                if "emulated_start" in c:
                    bar(c["emulated_start"], c["emulated_end"], y - 0.45, 0.1, COLORS["emulated link"], 3)
            for c in comm:  # exposed on top of everything in flight
                if c["blocked_s"] > 0:
                    bar(c["blocked_start"], c["end"], y - 0.33, 0.28, COLORS["exposed"], 4)
            for w in waits:
                if w["rank"] == line["rank"]:
                    bar(w["start"], w["end"], y - 0.33, 0.28, COLORS["straggler wait"], 5)
            mine = [w for w in waits if w["rank"] == line["rank"]]
            if mine:
                longest = max(mine, key=lambda w: w["end"] - w["start"])
                ax.annotate(f"waits for r{longest['peer']}", (ms(longest["start"]), y - 0.47),
                            fontsize=LEGEND_SIZE - 1, va="top", color="#9A5B00", zorder=6)
        stats = timeline_stats(report, drawn)
        shown = ", ".join(f"r{s['rank']} {s['exposed ms']:.1f}" for s in stats)
        ax.set_title(f"{label}: exposed ms/step (median) {shown}", fontsize=LEGEND_SIZE + 1, loc="left")
        ax.set_yticks(range(len(lines)), [f"rank {r.rank}" for r in reversed(ranks)])
        ax.set_ylim(-0.75, len(lines) - 0.4)
    axes[-1].set_xlabel("ms from the start of the step")
    axes[0].legend(handles=[Patch(color=v, label=k) for k, v in COLORS.items()], fontsize=LEGEND_SIZE - 1,
                   loc="lower center", bbox_to_anchor=(0.5, 1.25), ncol=4, frameon=False)
    fig.tight_layout()
    return fig
