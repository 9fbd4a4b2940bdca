"""matplotlib pictures of what the ledgers measured, and the legend and tick helpers every picture shares.

matplotlib is imported inside the functions that draw, so ``import zerokit`` never loads it.
"""
from __future__ import annotations

from .runtime.timeline import exposed_comm_s, rank_timeline, ranks_of, straggler_waits

#: font sizes (points) of titles, axis labels and ticks, legends and annotations: readable from the back of a room
TITLE_SIZE, LABEL_SIZE, LEGEND_SIZE = 12, 11, 10
CATEGORY_COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868",
                   "buffers": "#8172B3", "activations": "#C44E52"}


def legend_outside(ax, where: str = "right", **kwargs):
    """The axes' legend off the data: to its right (``where="right"``) or under it (``"below"``, entries in a row).

    A legend inside the axes hides bars or points sooner or later (a taller bar, another
    world size); outside, :meth:`Figure.tight_layout` makes room for it. ``kwargs`` go to
    :meth:`Axes.legend` (``handles``, ``ncol``, ``title`` …)."""
    kwargs.setdefault("fontsize", LEGEND_SIZE)
    if where == "right":
        kwargs.setdefault("loc", "upper left")
        kwargs.setdefault("bbox_to_anchor", (1.02, 1.0))
    elif where == "below":
        kwargs.setdefault("loc", "upper center")
        kwargs.setdefault("bbox_to_anchor", (0.5, -0.22))
        kwargs.setdefault("ncol", 3)
    else:
        raise ValueError(f"where={where!r}; allowed: right, below")
    kwargs.setdefault("borderaxespad", 0.0)
    kwargs.setdefault("frameon", False)
    return ax.legend(**kwargs)


def grouped_ticks(ax, groups, fontsize: float = LABEL_SIZE) -> None:
    """Bars in groups (a job's ranks): each bar's own tick label (``r0``, ``r1`` …) and the group's name once,
    centred under its bars — not repeated under every bar, where long names run into each other.

    ``groups`` is ``[(name, [x of each bar], [tick label of each bar]), …]``."""
    ticks, labels = [], []
    for _, xs, names in groups:
        ticks += list(xs)
        labels += list(names)
    ax.set_xticks(ticks, labels, fontsize=fontsize)
    fig = ax.figure
    if not hasattr(fig.canvas, "get_renderer"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    bottom = ax.get_window_extent(renderer).y0  # how far under the axes the tick labels reach, in points
    below = max((bottom - t.get_window_extent(renderer).y0 for t in ax.get_xticklabels() if t.get_text()),
                default=0.0) * 72 / fig.dpi
    for name, xs, _ in groups:
        ax.annotate(name, xy=(sum(xs) / len(xs), 0), xycoords=("data", "axes fraction"), xytext=(0, -(below + 3)),
                    textcoords="offset points", ha="center", va="top", fontsize=fontsize, annotation_clip=False)
    ax.xaxis.labelpad = fontsize * 1.3 + 8  # an axis label goes under the groups' names


def memory_bars(report, ax=None, categories=("params", "grads", "optimizer"), legend: bool = True):
    """Stacked bytes per rank and strategy, measured, with the theory's total as a black tick.

    The key sits to the right of the bars (``legend=False`` leaves it out: a second panel
    of the same colours beside this one)."""
    import matplotlib.pyplot as plt

    own = ax is None
    if own:  # a pyplot figure: a cell that draws it shows it
        _, ax = plt.subplots(figsize=(max(3.0, 1.0 * sum(len(r.ranks) for r in report.results)) + 2.6, 3.6))
    groups, x = [], 0
    for result in report.results:
        groups.append((result.strategy, [], []))
        for rank in result.ranks:
            bottom = 0.0
            for c in categories:
                value = rank.model_state_bytes.get(c, rank.memory_bytes.get(c, 0)) / 2**20
                ax.bar(x, value, bottom=bottom, color=CATEGORY_COLORS[c], label=c if x == 0 else None)
                bottom += value
            theory_total = rank.theory_model_states["total"] / 2**20
            ax.plot([x - 0.4, x + 0.4], [theory_total] * 2, color="black", lw=2,
                    label="theory" if x == 0 else None)
            groups[-1][1].append(x)
            groups[-1][2].append(f"r{rank.rank}")
            x += 1
    grouped_ticks(ax, groups, fontsize=9)  # each rank under its bar, the strategy once under its ranks
    ax.set_ylabel("MiB per rank")
    ax.set_title("model states per rank:\nmeasured (bars), theory (line)", fontsize=10)
    if legend:
        handles, names = ax.get_legend_handles_labels()
        order = [names.index(c) for c in reversed(categories)] + [names.index("theory")]  # top of the stack first
        legend_outside(ax, handles=[handles[i] for i in order], labels=[names[i] for i in order], fontsize=9)
    if own:
        ax.figure.tight_layout()
    return ax


# --- timelines ---------------------------------------------------------------------------------

TIMELINE_COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "grad sync": "#F2C6A0", "step": "#55A868",
                   "in flight": "#D9D4EE", "emulated link": "#8C8C8C", "exposed": "#C44E52",
                   "straggler wait": "#F0A030"}


def draw_timeline(ax, report_or_result, steps=None, modules: bool = False, legend_size: float = 9):
    """Draw one run's per-rank rows on ``ax``; returns ``steps`` (the steps drawn, default all).

    Compute above each rank's line (forward; backward, which ends where the last module's
    backward ended; "grad sync", the rest of ``engine.backward``; the step), communication
    below, in layers bottom to top so nothing hides the part that costs time: a collective
    from launch to known completion (in flight), the emulated link's span when there is one
    (:mod:`zerokit.runtime.link`), the **exposed** time — blocked on it — in red, and the
    part of that spent waiting for a peer that had not yet launched the same collective
    (:func:`zerokit.runtime.timeline.straggler_waits`) in orange, labelled with the peer.
    The x-axis is ms from the first drawn step's start.
    """
    ranks = ranks_of(report_or_result)
    lines = [rank_timeline(r) for r in ranks]
    if steps is None:
        steps = range(max((c["step"] for line in lines for c in line["compute"]), default=0) + 1)
    keep = lambda item: item["step"] in steps and item.get("phase") != "setup"  # noqa: E731
    starts = [c["start"] for line in lines for c in line["compute"] if keep(c)]
    if not starts:
        raise ValueError(f"no training step in steps={steps!r} was traced")
    t0 = min(starts)
    ms = lambda t: 1e3 * (t - t0)  # noqa: E731
    waits = [w for w in straggler_waits(lines) if w["step"] in steps]

    def bar(x0, x1, y, h, color, z, **kw):
        ax.broken_barh([(ms(x0), max(ms(x1) - ms(x0), 0.05))], (y, h), color=color, zorder=z, **kw)

    for row, line in enumerate(lines):
        y = len(lines) - 1 - row
        for c in filter(keep, line["compute"]):
            bar(c["start"], c["end"], y + 0.05, 0.4, TIMELINE_COLORS.get(c["name"], "#999999"), 1)
        if modules:
            for m in filter(keep, line["modules"]):
                bar(m["start"], m["end"], y + 0.38, 0.07, "black", 2, alpha=0.5)
        comm = list(filter(keep, line["comm"]))
        for c in comm:
            bar(c["start"], c["end"], y - 0.45, 0.4, TIMELINE_COLORS["in flight"], 2, edgecolor="#6A5ACD",
                linewidth=0.4)
        for c in comm:
            if "emulated_start" in c:
                bar(c["emulated_start"], c["emulated_end"], y - 0.45, 0.1, TIMELINE_COLORS["emulated link"], 3)
        for c in comm:  # exposed on top of everything in flight
            if c["blocked_s"] > 0:
                bar(c["blocked_start"], c["end"], y - 0.33, 0.28, TIMELINE_COLORS["exposed"], 4)
        mine = [w for w in waits if w["rank"] == line["rank"]]
        for w in mine:
            bar(w["start"], w["end"], y - 0.33, 0.28, TIMELINE_COLORS["straggler wait"], 5)
        if mine:
            longest = max(mine, key=lambda w: w["end"] - w["start"])
            ax.annotate(f"waits for r{longest['peer']}", (ms(longest["start"]), y - 0.47),
                        fontsize=legend_size - 1, va="top", color="#9A5B00", zorder=6)
    ax.set_yticks(range(len(lines)), [f"rank {r.rank}" for r in reversed(ranks)])
    ax.set_ylim(-0.75, len(lines) - 0.4)
    return steps


def timeline_legend(ax, legend_size: float = 9, **where):
    """The legend of :func:`draw_timeline`'s colours."""
    from matplotlib.patches import Patch

    where = where or dict(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4)
    return ax.legend(handles=[Patch(color=v, label=k) for k, v in TIMELINE_COLORS.items()], fontsize=legend_size - 1,
                     frameon=False, **where)


def timeline(report_or_result, ax=None, steps=None, modules: bool = False):
    """One run's per-rank Gantt chart (:func:`draw_timeline`), titled with each rank's exposed time.

    ``report_or_result``: a Report (its first strategy), a StrategyResult or a list of
    RankResults from ``zerokit.train(..., keep_records=True)``. ``steps``: a range of
    training steps to draw (default: all). ``modules``: also draw every leaf module's
    forward and backward as thin bars. Returns ``(ax, {rank: exposed seconds})`` over
    the steps drawn. :func:`zerokit.course.timeline_figure` puts several runs on one axis.
    """
    import matplotlib.pyplot as plt

    ranks = ranks_of(report_or_result)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.9 + 0.9 * len(ranks)))
    steps = draw_timeline(ax, report_or_result, steps, modules)
    exposed = {rank.rank: exposed_comm_s(rank, steps=steps) for rank in ranks}
    ax.set_xlabel("ms")
    shown = ", ".join(f"r{r} {1000 * s:.1f} ms" for r, s in exposed.items())
    ax.set_title(f"compute (top) and communication (bottom) per rank; exposed communication: {shown}",
                 fontsize=9)
    legend = timeline_legend(ax, loc="upper center", ncol=4)
    _below_the_axis_label(ax, legend)
    return ax, exposed


def _below_the_axis_label(ax, legend) -> None:
    """Lay the figure out with ``legend`` (anchored at its top centre) just under ``ax``'s x-axis label."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = ax.figure
    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    for _ in range(3):  # the layout moves the label, the legend moves with it: a few rounds settle it
        fig.tight_layout()
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        bottom = min(ax.xaxis.label.get_window_extent(renderer).y0,
                     *(t.get_window_extent(renderer).y0 for t in ax.get_xticklabels() if t.get_text()))
        legend.set_bbox_to_anchor((0.5, ax.transAxes.inverted().transform((0, bottom - 4))[1]), transform=ax.transAxes)
    fig.tight_layout()
