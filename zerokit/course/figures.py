"""The picture plumbing every lesson shares, and the measured-vs-theory plot against N.

Figures are plain matplotlib ``Figure`` objects, never registered with pyplot, so a cell
shows one only when it returns it, and a panel turns one into PNG bytes for its
``ipywidgets.Image`` (:func:`png`). :func:`volume_figure` draws the traffic a lesson
read off its runs (markers: measured on zerokit's ring, or the ring formula applied to
measured payloads, labelled as such) next to :mod:`zerokit.theory` (lines) against the
world size; it runs no job itself, it plots numbers a cell already has.
"""
from __future__ import annotations

import io
import textwrap
from typing import Dict, Optional

from ..plot import LABEL_SIZE, LEGEND_SIZE, TITLE_SIZE, grouped_ticks, legend_outside  # noqa: F401 - the lessons' too

#: pixels per inch of every picture the panels and helpers render: legible projected, files still small
DPI = 100
#: what :func:`new_figure` sets in matplotlib's rcParams before drawing (text made later inherits it)
STYLE = {"font.size": LABEL_SIZE, "axes.titlesize": TITLE_SIZE, "axes.labelsize": LABEL_SIZE,
         "xtick.labelsize": LABEL_SIZE, "ytick.labelsize": LABEL_SIZE, "legend.fontsize": LEGEND_SIZE}


def new_figure(width: float, height: float, ncols: int = 1, width_ratios=None):
    """A matplotlib Figure not registered with pyplot (so a cell never shows it by accident), and its axes."""
    import matplotlib
    from matplotlib.figure import Figure

    matplotlib.rcParams.update(STYLE)
    fig = Figure(figsize=(width, height), dpi=DPI)
    if ncols == 1:
        return fig, fig.add_subplot(1, 1, 1)
    return fig, fig.subplots(1, ncols, gridspec_kw={"width_ratios": width_ratios} if width_ratios else None)


def plain_log_ticks(axis) -> None:
    """Tick labels of a log axis as plain numbers (``60``, ``0.5``), never ``6×10¹``, and never fewer than two.

    The major ticks (the powers of the base) are labelled; the minor ones too where the view holds at most two
    powers, as matplotlib's own log formatter picks them (``LogFormatter.set_locs``: 2, 4 and 6 × a power over
    more than 0.4 of a decade, every multiple over less) — an axis from 1.5 to 20 reads 2, 4, 6, 10, 20, not a
    lone 10."""
    from matplotlib.ticker import FuncFormatter, LogFormatter

    class PlainLogFormatter(LogFormatter):
        def _num_to_string(self, x, vmin, vmax):
            return f"{x:g}"

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(PlainLogFormatter(base=getattr(axis.get_transform(), "base", 10), labelOnlyBase=False,
                                                  minor_thresholds=(2, 0.4)))


def png(fig) -> bytes:
    """The figure as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


#: what the markers of a :func:`volume_figure` series are, by the key that holds them
POINT_KINDS = {"sent": "sent (measured, ring)", "ring_cost": "ring cost (formula on measured payload)",
               "measured": "measured"}


def volume_figure(series: Dict[str, dict], ylabel: str = "bytes per rank", title: str = "",
                  reference: Optional[tuple] = None):
    """Points from the runs (markers) and theory (line) against the world size, one series per name.

    ``series[name] = {"N": [...], KIND: [...], "theory": [...]}``, where KIND names what the
    points are, and so their legend: ``"sent"`` — bytes zerokit's ring handed to send
    (measured); ``"ring_cost"`` — the ring formula applied to the payloads the ledger
    measured (the backend's collectives: nothing counted their wire); ``"measured"`` —
    any other measured quantity. Optionally ``"theory_N"`` when the theory line is drawn at
    other world sizes than the points. ``reference = (value, label)`` adds a dashed
    horizontal line (an asymptote).
    """
    fig, ax = new_figure(8.0, 4.2)  # the points, and under them the key
    for i, (name, s) in enumerate(series.items()):
        color = f"C{i}"
        kinds = [k for k in POINT_KINDS if k in s]
        if len(kinds) != 1:
            raise ValueError(f"series {name!r} needs exactly one of {', '.join(POINT_KINDS)}; has {kinds or 'none'}")
        ax.plot(s.get("theory_N", s["N"]), s["theory"], color=color, lw=1.5, label=f"{name}: theory")
        ax.plot(s["N"], s[kinds[0]], "o", color=color, ms=6, label=f"{name}: {POINT_KINDS[kinds[0]]}")
    if reference is not None:
        ax.axhline(reference[0], color="#999999", ls="--", lw=1, label=reference[1])
    ax.set_xlabel("world size N")
    ticks = sorted({n for s in series.values() for n in s.get("theory_N", s["N"])})
    if len(ticks) <= 8:
        ax.set_xticks(ticks)
    else:  # every world size would crowd the axis: a few whole numbers
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
    ax.set_ylabel(ylabel)
    top = max([v for s in series.values() for k in ("theory", *POINT_KINDS) for v in s.get(k, [])]
              + ([reference[0]] if reference is not None else []), default=1.0)
    ax.set_ylim(0, top * 1.12)  # a dashed asymptote stays clear of the title
    lines = -(-len(title) // 70)  # as few lines as fit, of even length: no word alone on the last
    ax.set_title(textwrap.fill(title, -(-len(title) // max(lines, 1)) + 8) if title else "", fontsize=TITLE_SIZE)
    entries = len(series) * 2 + (reference is not None)
    legend_outside(ax, "below", ncol=2 if entries > 3 else entries, bbox_to_anchor=(0.5, -0.25))  # the axes keep
    fig.tight_layout()  # the figure's width
    return fig
