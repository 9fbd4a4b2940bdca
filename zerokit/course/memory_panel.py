"""Memory per rank: strategies × world size × precision → bars, measured against the formula.

:class:`MemoryPanel` trains each selected strategy for a few steps at the chosen world
size and precision (real jobs through :func:`zerokit.train`, one after the other, see
:class:`~zerokit.course.panel.Panel`) and draws either the model states after the last
step, stacked by category with :mod:`zerokit.theory`'s total as a black tick, or each
rank's peak by category (:func:`peak_bars`, activations and buffers included).
:func:`peak_bars` alone draws a report a cell already has.
"""
from __future__ import annotations

from typing import Optional, Sequence

from .. import theory
from ..plot import CATEGORY_COLORS, memory_bars
from .figures import grouped_ticks, LABEL_SIZE, legend_outside, LEGEND_SIZE, new_figure, png, TITLE_SIZE
from .panel import ipywidgets, Panel
from .tables import RING_COST, summary_rows, table, THEORY


def peak_bars(report, ax=None, legend: bool = True, labels=None):
    """Stacked peak bytes per rank and strategy by category (activations and buffers too), theory's model states as a
    tick; the key to the right of the bars (``legend=False``: none). Each bar is labelled by its rank (and its
    precision when they differ), each job's strategy once under its ranks; ``labels`` (one per bar) replace both."""
    own = ax is None
    bars = sum(len(r.ranks) for r in report.results)
    if own:
        _, ax = new_figure(max(3.0, 1.1 * bars) + 3.0, 3.8)
    given, labels, groups, x = labels, [], [], 0
    mixed = len({r.precision for r in report.results}) > 1
    for result in report.results:
        groups.append((result.strategy, [], []))
        for rank in result.ranks:
            bottom = 0.0
            for category, color in CATEGORY_COLORS.items():
                value = rank.peak_breakdown.get(category, 0) / 2**20
                ax.bar(x, value, bottom=bottom, color=color, label=category if x == 0 else None)
                bottom += value
            ax.plot([x - 0.4, x + 0.4], [rank.theory_model_states["total"] / 2**20] * 2, color="black", lw=2,
                    label="theory: model states" if x == 0 else None)
            # more than 8 bars leave no room for "-mixed" (zerokit has no pure bf16/fp16 to confuse it with)
            precision = result.precision.replace("-mixed", "") if bars > 8 else result.precision
            groups[-1][1].append(x)
            groups[-1][2].append(f"{precision + chr(10) if mixed else ''}r{rank.rank}")
            x += 1
    if given is not None:
        ax.set_xticks(range(len(given)), list(given), fontsize=LABEL_SIZE - (2 if mixed else 0))
    else:
        grouped_ticks(ax, groups, fontsize=LABEL_SIZE - (1 if mixed else 0))
    ax.set_ylabel("MiB per rank at its peak")
    ax.set_title("peak memory per rank,\nby category (measured)", fontsize=TITLE_SIZE - 1)
    if legend:
        handles, names = ax.get_legend_handles_labels()
        order = [names.index(c) for c in reversed(CATEGORY_COLORS)] + [names.index("theory: model states")]
        legend_outside(ax, handles=[handles[i] for i in order], labels=[names[i] for i in order],
                       fontsize=LEGEND_SIZE - 1)  # the top of the stack first
    if own:
        ax.figure.tight_layout()
    return ax


class MemoryPanel(Panel):
    """Strategies × world size × precision → per-rank memory bars, measured vs :mod:`zerokit.theory`.

    ``view`` "model states" draws params, grads and optimizer states after the last
    step (exact, against the formula); "peak" draws each rank's peak by category,
    activations and buffers included.
    """

    VIEWS = ("model states", "peak")

    def __init__(self, workload, strategies: Sequence[str] = ("ddp", "zero1", "zero2", "zero3"),
                 world_sizes: Sequence[int] = (1, 2, 4), precisions: Sequence[str] = theory.PRECISIONS,
                 world_size: Optional[int] = None, precision: Optional[str] = None, steps: int = 2,
                 view: str = "model states", auto_run: bool = False, run: bool = True):
        w = ipywidgets()
        self.workload, self.steps, self.auto_run = workload, steps, auto_run
        self._build_common()
        self.strategies = w.SelectMultiple(options=list(strategies), value=tuple(strategies), description="strategies",
                                           rows=min(len(strategies), 6))
        self._world_size_and_precision(world_sizes, world_size, precisions, precision)
        self.view = w.ToggleButtons(options=list(self.VIEWS), value=view, description="show")
        for control in (self.strategies, self.world_size, self.precision):
            control.observe(self._changed, names="value")
        self.view.observe(lambda _: self.draw(), names="value")
        controls = w.HBox([w.VBox([self.world_size, self.precision, self.view]), self.strategies])
        self.box = w.VBox([controls, w.HBox([self.run_button, self.progress, self.status]), self.image,
                           self.details])
        if run:
            self.run()

    def run(self):
        """Train every selected strategy at the chosen world size and precision, then draw."""
        jobs = [(s, self.world_size.value, dict(steps=self.steps, precision=self.precision.value))
                for s in self.strategies.value]
        if not jobs:
            self.status.value = "choose at least one strategy"
            return None
        return self._run_and_draw(jobs)

    def draw(self) -> None:
        report = self.last_report
        if report is None:
            return

        bars = sum(len(r.ranks) for r in report.results)
        fig, ax = new_figure(min(14.0, max(7.0, 0.75 * bars + 4.0)), 3.8)
        if self.view.value == "peak":
            peak_bars(report, ax=ax)
        else:
            memory_bars(report, ax=ax)
        first = report.results[0]
        ax.set_xlabel(f"{self.workload.name}, Ψ = {first.param_count:,}, N = {first.world_size}, {first.precision}",
                      fontsize=LABEL_SIZE - 1)
        fig.tight_layout()
        self.image.value = png(fig)
        self.details.value = table(summary_rows(report), ["strategy", "model states B", "theory B", RING_COST,
                                                          THEORY, "peak B"])._repr_html_()
