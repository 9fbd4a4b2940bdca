"""Pipeline schedules: stages, micro-batches, schedule, chunks → the bubble picture, simulated.

:class:`PipelinePanel` runs no job: every change of a control builds the schedule
(:func:`zerokit.schedule`), plays it out with :func:`zerokit.simulate` (t_b = 2·t_f, so
ZB-H1's I and W one t_f each) and draws it (:func:`draw_schedule`); the status line gives
the simulated bubble next to the formula, (p − 1)/(v·m + p − 1), and each rank's peak
micro-batches in flight. A combination a schedule refuses (interleaved with m not a
multiple of p, say) is shown in the status line, not raised.
"""
from __future__ import annotations

import html
from typing import Optional, Sequence

from .. import theory
from ..pipeline_parallel import draw_schedule, schedule, simulate
from .figures import new_figure, png
from .panel import ipywidgets, mimebundle

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


class PipelinePanel:
    """Stages, micro-batches, schedule and chunks → the simulated schedule drawn, its bubble next to the formula."""

    def __init__(self, stages: Sequence[int] = (2, 3, 4, 8), micro_batches: Sequence[int] = (1, 2, 4, 8, 16, 32),
                 schedules: Sequence[str] = SCHEDULES, p: int = 4, m: int = 4, name: str = "1f1b", chunks: int = 2,
                 forward: float = 1.0, backward: float = 2.0):
        w = ipywidgets()
        self.forward, self.backward = forward, backward
        self.stages = w.SelectionSlider(options=list(stages), value=p, description="stages p",
                                        continuous_update=False)
        self.micro_batches = w.SelectionSlider(options=list(micro_batches), value=m, description="micro-batches",
                                               continuous_update=False)
        self.schedule = w.ToggleButtons(options=list(schedules), value=name, description="schedule")
        self.chunks = w.IntSlider(value=chunks, min=2, max=4, description="chunks v", continuous_update=False)
        self.status = w.HTML(value="")
        self.image = w.Image(format="png")
        self.result = None
        self.last_error: Optional[str] = None
        #: how many times the panel has drawn (a test reads it)
        self.draws = 0
        for control in (self.stages, self.micro_batches, self.schedule, self.chunks):
            control.observe(lambda _: self.update(), names="value")
        self.box = w.VBox([w.HBox([w.VBox([self.stages, self.micro_batches, self.chunks]), self.schedule]),
                           self.status, self.image])
        self.update()

    def update(self) -> None:
        """Build and simulate the chosen schedule, then redraw."""
        name, p, m = self.schedule.value, self.stages.value, self.micro_batches.value
        v = self.chunks.value if name == "interleaved" else 1
        self.chunks.disabled = name != "interleaved"
        try:
            self.result = simulate(schedule(name, p, m, chunks=v), self.forward, self.backward)
        except ValueError as exc:  # shown, not raised from a callback nobody sees
            self.result, self.last_error = None, str(exc)
            self.status.value = f"<span style='color:#C44E52'>{html.escape(self.last_error)}</span>"
            return
        self.last_error = None
        self.draw()

    def draw(self) -> None:
        result = self.result
        sched = result.schedule
        p, m, v = sched.ranks, sched.micro_batches, sched.chunks
        formula = theory.bubble_fraction(p, m, v)
        fig, ax = new_figure(min(14.0, 3.0 + 0.35 * len(sched.compute(0))), 0.9 + 0.45 * p)
        draw_schedule(result, ax=ax, title=f"{sched.name}, p = {p}, m = {m}" + (f", v = {v}" if v > 1 else "")
                      + f": simulated bubble {result.bubble_fraction:.1%}")
        fig.tight_layout()
        self.image.value = png(fig)
        self.status.value = (f"simulated bubble <b>{result.bubble_fraction:.1%}</b> (t_b = "
                             f"{self.backward / self.forward:g}·t_f); (p − 1)/(v·m + p − 1) = {formula:.1%}"
                             + ((f" for 1F1B; ZB-H1 fills part of it with W: (p − 1)/(3m + p − 1) = "
                                 f"{theory.zb_h1_bubble_fraction(p, m):.1%}" if m >= p else
                                 " for 1F1B; ZB-H1 fills part of it with W") if sched.splits_backward else "")
                             + f"; peak micro-batches in flight per rank: {result.peak_in_flight}")
        self.draws += 1

    def __repr__(self) -> str:
        return "PipelinePanel: an interactive panel — run this notebook in Jupyter to use it"

    def _repr_mimebundle_(self, **kwargs):
        return mimebundle(self, **kwargs)
