"""The classic pipeline picture: one row per rank, time to the right, one box per compute action.

Lifecycle: :func:`draw_schedule` takes a :class:`~.simulate.SimulationResult` (or a
:class:`~.actions.Schedule`, which it simulates with the default durations first) or any
object with the same ``spans`` — ``spans[r]`` a list of ``(action, start, end)`` — such as
a measured run in seconds, and returns a matplotlib ``Figure`` not registered with pyplot
(Agg-safe; matplotlib is imported only when drawing). Boxes are coloured by micro-batch
and labelled with its number (``3.1``: micro-batch 3 on chunk 1 when ranks hold several
chunks); F is solid, B dark, I dark and hatched ``//``, W light and dotted; idle time is grey.
Communication spans, if a measured run records them, are not drawn.
"""
from __future__ import annotations

from typing import Optional

from .actions import Schedule
from .simulate import measured, simulate

#: how each compute kind is drawn: (blend towards black, or towards white when negative; hatch)
KIND_STYLE = {"F": (0.0, None), "B": (0.45, None), "I": (0.3, "//"), "W": (-0.4, "..")}
IDLE_COLOR = "#D9D9D9"


def _shade(rgb, blend: float):
    """``rgb`` blended towards black (``blend`` > 0) or white (< 0)."""
    target = 0.0 if blend > 0 else 1.0
    return tuple(c + (target - c) * abs(blend) for c in rgb)


def _spans_of(result_or_schedule):
    if isinstance(result_or_schedule, Schedule):
        result_or_schedule = simulate(result_or_schedule)
    spans = getattr(result_or_schedule, "spans", None)
    if spans is None:
        raise TypeError(f"draw_schedule needs a Schedule or something with .spans, "
                        f"not {type(result_or_schedule).__name__}")
    return result_or_schedule, spans


def draw_schedule(result_or_schedule, ax=None, title: Optional[str] = None):
    """Draw the per-rank timeline of ``result_or_schedule`` (see the module docstring); returns the Figure."""
    from matplotlib.colors import to_rgb
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    result, spans = _spans_of(result_or_schedule)
    ranks = len(spans)
    compute = [[(a, s, e) for a, s, e in row if a.kind in KIND_STYLE] for row in spans]
    t0 = min((s for row in compute for _, s, _ in row), default=0.0)
    t1 = max((e for row in compute for _, _, e in row), default=1.0)
    micro_batches = 1 + max((a.micro for row in compute for a, _, _ in row), default=0)
    if ax is None:
        fig = Figure(figsize=(min(16.0, 2.0 + 0.25 * sum(len(r) for r in compute) / max(ranks, 1)),
                              0.6 + 0.5 * max(ranks, 1)), dpi=80)
        ax = fig.add_subplot(1, 1, 1)
    fig = ax.figure
    palette = [to_rgb(c) for c in ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3",
                                   "#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD")]
    width = t1 - t0 or 1.0
    interleaved = any(a.stage >= ranks for row in compute for a, _, _ in row)
    for r, row in enumerate(compute):
        y = ranks - 1 - r
        ax.barh(y, width, left=t0, height=0.8, color=IDLE_COLOR, edgecolor="none")
        for a, start, end in row:
            blend, hatch = KIND_STYLE[a.kind]
            color = _shade(palette[a.micro % len(palette)], blend)
            ax.barh(y, end - start, left=start, height=0.8, color=color, hatch=hatch,
                    edgecolor="white", linewidth=0.6)
            label = f"{a.micro}.{a.stage // ranks}" if interleaved else str(a.micro)
            if (end - start) / width > 0.012:
                ax.text((start + end) / 2, y, label, ha="center", va="center", fontsize=7,
                        color="black" if blend < 0 else "white",
                        bbox={"boxstyle": "square,pad=0.05", "facecolor": color, "edgecolor": "none"})
    ax.set_yticks(range(ranks), [f"rank {r}" for r in reversed(range(ranks))])
    ax.set_xlim(t0, t1)
    ax.set_xlabel("time")
    schedule = getattr(result, "schedule", None)
    bubble = getattr(result, "bubble_fraction", None)
    if title is None and schedule is not None:
        title = f"{schedule.name}: p={schedule.ranks}, m={schedule.micro_batches}"
        title += f", v={schedule.chunks}" if schedule.chunks > 1 else ""
        title += f" — bubble {bubble:.1%}" if bubble is not None else ""
    if title:
        ax.set_title(title, fontsize=10)
    kinds = sorted({a.kind for row in compute for a, _, _ in row}, key="FBIW".index)
    handles = [Patch(facecolor=_shade(palette[0], KIND_STYLE[k][0]), hatch=KIND_STYLE[k][1],
                     edgecolor="white", label=k) for k in kinds]
    handles.append(Patch(facecolor=IDLE_COLOR, label="idle"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False,
              title=f"{micro_batches} micro-batches" if micro_batches > 1 else None, title_fontsize=7)
    return fig


def draw_side_by_side(schedule, rank_spans, forward: float = 1.0, backward: float = 2.0):
    """The schedule simulated (left, units of one forward) next to a real run of it (right, seconds):
    ``rank_spans`` are the ranks' ``pipeline_spans`` from ``zerokit.train``, in pipeline-rank order."""
    from matplotlib.figure import Figure

    simulated, real = simulate(schedule, forward, backward), measured(schedule, rank_spans)
    fig = Figure(figsize=(15, 0.9 + 0.55 * schedule.ranks), dpi=80)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    draw_schedule(simulated, ax=left, title=f"simulated (t_b = {backward / forward:g}·t_f): "
                                            f"bubble {simulated.bubble_fraction:.1%}")
    draw_schedule(real, ax=right, title=f"measured: bubble {real.bubble_fraction:.1%}")
    right.set_xlabel("seconds from each rank's start of the step")
    fig.tight_layout()
    return fig
