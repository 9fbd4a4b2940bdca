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
lengths are equal times (``shared_axis=False``: each its own, its step time in its title).
Each panel is drawn by :func:`zerokit.plot.draw_timeline` (the same picture as
:func:`zerokit.plot.timeline`).

Exposed time is split in two, both read from the ledgers (nothing modelled): the
**straggler wait** — blocked before the last peer had even launched the collective, so
the peer's compute, not the wire, held the rank — and the rest, **exposed − wait**:
blocked once every rank had launched, the communication that did not hide. Ranks that
share a few cores drift apart by milliseconds every step, so the straggler part can be
most of what a rank waits for; :func:`calmest_step` picks, among the steps asked for,
the one whose ranks waited least for each other, and the figure says which step it drew.
:func:`timeline_stats` gives the medians over steps the titles and tables show, and
:func:`step_time` a run's step time with its spread, for :func:`.claims.speed_sentence`.
"""
from __future__ import annotations

import statistics
from typing import Dict, Optional, Tuple

from ..plot import draw_timeline, TIMELINE_COLORS
from ..runtime.timeline import rank_timeline, ranks_of, straggler_waits
from .figures import LEGEND_SIZE, new_figure

#: what each colour of a timeline is, as the figure's key says it
KEY = {"forward": "forward", "backward": "backward", "grad sync": "grad sync (after backward)", "step": "step",
       "in flight": "collective in flight", "emulated link": "emulated link busy",
       "exposed": "exposed: blocked, all launched", "straggler wait": "straggler wait: peer not launched"}


def timeline_stats(report, steps: range) -> list:
    """Per rank, medians over ``steps``: step ms, backward compute ms, exposed ms (the ledger's blocked time), of
    which straggler wait and emulated-link hold, exposed − wait ms (the first minus the second: the time blocked once
    every rank had launched), and in-flight ms."""
    ranks = ranks_of(report)
    lines = [rank_timeline(r) for r in ranks]
    waits = straggler_waits(lines)
    rows = []
    for rank, line in zip(ranks, lines):
        def per_step(values):
            return [sum(v for s, v in values if s == k) for k in steps]

        comm = [c for c in line["comm"] if c["phase"] != "setup"]
        exposed = per_step([(c["step"], c["blocked_s"]) for c in comm])
        waited = per_step([(w["step"], w["end"] - w["start"]) for w in waits if w["rank"] == rank.rank])
        rows.append({
            "rank": rank.rank,
            "step ms": 1e3 * statistics.median(rank.step_times_s[k] for k in steps),
            "backward ms": 1e3 * statistics.median(per_step([(c["step"], c["end"] - c["start"])
                                                             for c in line["compute"] if c["name"] == "backward"])),
            "exposed ms": 1e3 * statistics.median(exposed),
            "straggler wait ms": 1e3 * statistics.median(waited),
            # the difference of the two medians, so the columns add up (a wait never exceeds its step's exposed
            # time, so neither does its median: this is never negative)
            "exposed − wait ms": 1e3 * (statistics.median(exposed) - statistics.median(waited)),
            "emulated held ms": 1e3 * statistics.median(per_step([(c["step"], c.get("held_s", 0.0)) for c in comm])),
            "in flight ms": 1e3 * statistics.median(per_step([(c["step"], c["end"] - c["start"]) for c in comm])),
        })
    return rows


def step_time(report, steps: Optional[range] = None) -> Tuple[float, float]:
    """A run's step time over ``steps`` (default: all but the first): the median over steps of the slowest rank's
    time, in seconds, and the spread of those times (interquartile range / median), for ``speed_sentence``."""
    ranks = ranks_of(report)
    count = len(ranks[0].step_times_s)
    steps = steps if steps is not None else range(1 if count > 1 else 0, count)
    per_step = [max(r.step_times_s[k] for r in ranks) for k in steps]
    median = statistics.median(per_step)
    if len(per_step) < 2:
        return median, 0.0
    q1, _, q3 = statistics.quantiles(per_step, n=4, method="inclusive")
    return median, (q3 - q1) / median


def calmest_step(report, steps: range) -> int:
    """Of ``steps``, the one whose ranks spent the least time, summed, waiting for a peer to launch (the first on
    a tie): the step whose timeline shows the communication rather than the ranks drifting apart."""
    waits = straggler_waits([rank_timeline(r) for r in ranks_of(report)])
    return min(steps, key=lambda k: sum(w["end"] - w["start"] for w in waits if w["step"] == k))


def timeline_legend(fig, emulated: bool, ncol: int = 4):
    """The key of the timeline's colours above the panels (the emulated link's only when a run has one)."""
    from matplotlib.patches import Patch

    handles = [Patch(color=TIMELINE_COLORS[name], label=label) for name, label in KEY.items()
               if emulated or name != "emulated link"]
    return fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1.0), ncol=ncol,
                      fontsize=LEGEND_SIZE - 1, frameon=False)


def timeline_figure(runs: Dict[str, object], steps: Optional[range] = None, width: float = 11.0,
                    calmest: bool = False, shared_axis: bool = True):
    """One panel per run, ranks as rows, on a shared time axis from each panel's step start (see module doc).

    ``steps``: the steps drawn (default all). ``calmest=True`` draws one step per run, the one of ``steps`` whose
    ranks waited least for each other (:func:`calmest_step`); the titles name it, and their numbers are that
    step's. Each title gives every rank's exposed time split into exposed − wait and the straggler wait.
    ``shared_axis=False`` gives each panel a time axis of its own, for runs whose steps differ so much that the
    shorter would be a sliver of the longer's axis: each panel is labelled and its title gives its slowest rank's
    step time, so the lengths are read against their own ticks and the ratio is said, not drawn."""
    rows = sum(len(ranks_of(r)) for r in runs.values())
    height = 1.3 + 0.8 * rows + 0.75 * len(runs) + (0.3 * (len(runs) - 1) if not shared_axis else 0.0)
    fig, _ = new_figure(width, height)
    fig.clear()
    axes = list(fig.subplots(len(runs), 1, sharex=shared_axis, squeeze=False)[:, 0])
    emulated = False
    for ax, (label, report) in zip(axes, runs.items()):
        drawn = steps
        if calmest and steps is not None:
            k = calmest_step(report, steps)
            drawn = range(k, k + 1)
        drawn = draw_timeline(ax, report, drawn, legend_size=LEGEND_SIZE)
        stats = timeline_stats(report, drawn)
        which = f"step {drawn.start}" if len(drawn) == 1 else f"steps {drawn.start}–{drawn.stop - 1}, medians"
        if calmest and steps is not None and len(steps) > 1:
            which += f" (least straggler wait of {steps.start}–{steps.stop - 1})"
        shown = ", ".join(f"r{s['rank']} {s['exposed − wait ms']:.1f} + {s['straggler wait ms']:.1f}" for s in stats)
        if not shared_axis:  # its own axis: the title says how long the step it draws was
            which += f", slowest rank's step {max(s['step ms'] for s in stats):.1f} ms"
            ax.set_xlabel("ms from the start of the step (this panel's own scale)")
        ax.set_title(f"{label}, {which} — exposed ms, all launched + straggler wait: {shown}",
                     fontsize=LEGEND_SIZE - 1, loc="left")
        emulated = emulated or any(c.get("link") for r in ranks_of(report) for c in r.comm_records)
    if shared_axis:
        axes[-1].set_xlabel("ms from the start of the step")
    legend = timeline_legend(fig, emulated)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.55 / height))
    legend.set_bbox_to_anchor((0.5, 1.0))
    return fig
