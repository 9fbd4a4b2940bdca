"""Ring attention's transfers against its blocks' compute, on one rank's timeline (lesson 15).

:func:`ring_overlap_figure` reads a ``zerokit.train(..., parallel={"cp": n}, keep_records=True)``
run — nothing is computed here — and draws, for one rank and one training step, the
ring's point-to-point transfers from the communication ledger (each send's window from
launch to the end of its wait, the waited part in red) under the block spans the tracer
recorded inside ring attention (:func:`zerokit.runtime.timeline.block`): a transfer whose
window holds a block travelled while that block was computed. :func:`ring_overlap_rows`
gives each rank's sums (:func:`zerokit.runtime.timeline.overlap`) as table rows.
"""
from __future__ import annotations

from ..runtime.timeline import overlap, rank_timeline
from .figures import legend_outside, new_figure

TAG = "ring attention"
COLORS = {"block compute": "#4C72B0", "transfer in flight": "#D9D4EE", "waited (exposed)": "#C44E52"}


def ring_overlap_rows(result) -> list:
    """One row per rank, measured: the ring's sends and receives, their windows, the block compute inside them,
    the waits."""
    rows = []
    for rank in sorted(result.ranks, key=lambda r: r.rank):
        m = overlap(rank, TAG)
        rows.append({"rank": rank.rank, "ring sends + receives": m["transfers"],
                     "in flight ms (measured)": round(1e3 * m["in_flight_s"], 2),
                     "block compute inside ms (measured)": round(1e3 * m["computing_s"], 2),
                     "waited ms (measured)": round(1e3 * m["blocked_s"], 2)})
    return rows


def _layers(sends) -> list:
    """The layer each send belongs to: every layer's attention sends each ring step's tag once per pass, layers
    in order in forward and in reverse in backward, so the k-th send of a tag in a pass is layer k (forward) or
    layer L − 1 − k (backward, L the tag's count in the pass)."""
    from collections import Counter

    total = Counter((c["phase"], c["tag"]) for c in sends)
    seen, out = Counter(), []
    for c in sends:
        key = (c["phase"], c["tag"])
        k = seen[key]
        seen[key] += 1
        out.append(k if c["phase"] == "forward" else total[key] - 1 - k)
    return out


def ring_overlap_figure(result, rank: int = 0, step: int = 0):
    """One rank's ring transfers (sends only, one row each, in order) under its block spans, for one step."""
    chosen = next((r for r in result.ranks if r.rank == rank), None)
    if chosen is None:
        raise ValueError(f"ring_overlap_figure: rank={rank!r} is not among the run's ranks "
                         f"{sorted(r.rank for r in result.ranks)}")
    line = rank_timeline(chosen)
    sends = [c for c in line["comm"] if c["tag"].startswith(TAG) and c["op"] == "send" and c["step"] == step]
    blocks = [m for m in line["modules"] if m["kind"] == "block" and m["step"] == step]
    if not sends or not blocks:
        raise ValueError(f"ring_overlap_figure: step={step!r} of rank {rank} holds no ring transfer and block; run "
                         f"ring attention (cp above 1) with keep_records=True")
    t0 = min(b["start"] for b in blocks + sends)
    ms = lambda t: 1e3 * (t - t0)  # noqa: E731
    fig, ax = new_figure(11.0, 1.6 + 0.28 * len(sends))
    top = len(sends)
    ax.broken_barh([(ms(b["start"]), max(ms(b["end"]) - ms(b["start"]), 0.01)) for b in blocks], (top, 0.8),
                   color=COLORS["block compute"])
    for i, c in enumerate(sends):
        y = top - 1 - i
        ax.broken_barh([(ms(c["start"]), max(ms(c["end"]) - ms(c["start"]), 0.01))], (y + 0.15, 0.7),
                       color=COLORS["transfer in flight"], edgecolor="#6A5ACD", linewidth=0.4)
        if c["blocked_s"] > 0:
            ax.broken_barh([(ms(c["blocked_start"]), max(ms(c["end"]) - ms(c["blocked_start"]), 0.01))],
                           (y + 0.3, 0.4), color=COLORS["waited (exposed)"])
    names = [f"layer {layer} {'fwd' if c['phase'] == 'forward' else 'bwd'} {c['tag'][len(TAG) + 1:]}"
             for c, layer in zip(sends, _layers(sends))]
    ax.set_yticks([top + 0.4, *[top - 1 - i + 0.5 for i in range(len(sends))]], ["blocks", *names], fontsize=9)
    ax.set_xlabel(f"ms from rank {rank}'s first ring event of step {step} (measured)")
    ax.set_title(f"rank {rank}: each send of the ring, launch to the end of its wait, under the blocks computed",
                 fontsize=10)
    from matplotlib.patches import Patch

    legend_outside(ax, handles=[Patch(color=v, label=k) for k, v in COLORS.items()])
    fig.tight_layout()
    return fig
