"""The picture plumbing every lesson shares, and the measured-vs-theory plot against N.

Figures are plain matplotlib ``Figure`` objects, never registered with pyplot, so a cell
shows one only when it returns it, and a panel turns one into PNG bytes for its
``ipywidgets.Image`` (:func:`png`). :func:`volume_figure` draws what a lesson measured
(markers) next to :mod:`zerokit.theory` (lines) against the world size; it runs no job
itself, it plots numbers a cell already measured.
"""
from __future__ import annotations

import io
from typing import Dict, Optional

#: pixels per inch of every picture the panels and helpers render (small files)
DPI = 80


def new_figure(width: float, height: float, ncols: int = 1, width_ratios=None):
    """A matplotlib Figure not registered with pyplot (so a cell never shows it by accident), and its axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    if ncols == 1:
        return fig, fig.add_subplot(1, 1, 1)
    return fig, fig.subplots(1, ncols, gridspec_kw={"width_ratios": width_ratios} if width_ratios else None)


def png(fig) -> bytes:
    """The figure as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def volume_figure(series: Dict[str, dict], ylabel: str = "bytes sent per rank", title: str = "",
                  reference: Optional[tuple] = None):
    """Measured points (markers) and theory (line) against the world size, one series per name.

    ``series[name] = {"N": [...], "measured": [...], "theory": [...]}``, with optionally
    ``"theory_N"`` when the theory line is drawn at other world sizes than the measurements.
    ``reference = (value, label)`` adds a dashed horizontal line (an asymptote).
    """
    fig, ax = new_figure(5.5, 3.2)
    for i, (name, s) in enumerate(series.items()):
        color = f"C{i}"
        ax.plot(s.get("theory_N", s["N"]), s["theory"], color=color, lw=1.5, label=f"{name}: theory")
        ax.plot(s["N"], s["measured"], "o", color=color, ms=6, label=f"{name}: measured")
    if reference is not None:
        ax.axhline(reference[0], color="#999999", ls="--", lw=1, label=reference[1])
    ax.set_xlabel("world size N")
    ax.set_xticks(sorted({n for s in series.values() for n in s.get("theory_N", s["N"])}))
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
