"""Pipeline schedules: stages, micro-batches, schedule, chunks → the bubble picture, simulated.

:class:`PipelinePanel` runs no job: every change of a control builds the schedule
(:func:`zerokit.schedule`), plays it out with :func:`zerokit.simulate` (t_b = 2·t_f, so
ZB-H1's I and W one t_f each) and draws it (:func:`draw_schedule`); the status line gives
the simulated bubble next to the formula, (p − 1)/(v·m + p − 1) of the step — (p − 1)/(v·m)
of the ideal time, as Megatron states it — and each rank's peak micro-batches in flight. A
combination a schedule refuses (interleaved with m not a multiple of p, say) is shown in the
status line, not raised.

:func:`schedule_key` gives a drawn schedule its whole key, beside the axes: which colour is
which micro-batch, which shade (and hatch) which pass, grey for idle, and, when ranks hold
several chunks, how to read a box's ``m.c`` label. The lesson's pictures call it too.
"""
from __future__ import annotations

import html
from typing import Optional, Sequence

from .. import theory
from ..pipeline_parallel import draw_schedule, measured, schedule, simulate
from ..pipeline_parallel.figures import _shade, IDLE_COLOR, KIND_STYLE
from .figures import new_figure, png
from .panel import ipywidgets, mimebundle

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
#: the micro-batch colours :func:`zerokit.pipeline_parallel.draw_schedule` cycles through (its palette, in order)
MICRO_BATCH_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
                      "#CCB974", "#64B5CD")
#: what each pass is called in the key
PASS_NAMES = {"F": "F forward", "B": "B backward", "I": "I input grad", "W": "W weight grad"}


def schedule_key(ax, sched, fontsize: float = 9, label_size: float = 8) -> None:
    """Give ``ax``, where :func:`draw_schedule` drew ``sched``, its whole key and lay the figure out.

    The legend :func:`draw_schedule` made is replaced by one at the figure's foot, across its width (the
    axes keep the width, so a one-t_f box still holds its ``m`` or ``m.c`` label): the passes in micro-batch 0's
    shades and idle first, then one swatch per micro-batch colour (they repeat after ten), and for interleaved
    schedules what a box's ``m.c`` label means. The box labels are set in ``label_size`` points; then the
    figure is laid out (``tight_layout``) and a label wider than its box is dropped, so no label covers its
    neighbours (the colour still names the micro-batch)."""
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    kinds = sorted({a.kind for row in sched.actions for a in row if a.kind in KIND_STYLE}, key="FBIW".index)
    colours = MICRO_BATCH_COLORS[:min(sched.micro_batches, len(MICRO_BATCH_COLORS))]
    first = to_rgb(MICRO_BATCH_COLORS[0])
    passes = [Patch(facecolor=_shade(first, KIND_STYLE[k][0]), hatch=KIND_STYLE[k][1], edgecolor="white",
                    label=PASS_NAMES[k]) for k in kinds] + [Patch(facecolor=IDLE_COLOR, label="idle")]
    micro = [Patch(facecolor=c, label=f"micro-batch {i}") for i, c in enumerate(colours)]
    handles = passes + micro
    title = "colour: micro-batch" + (" (repeats after 10)" if sched.micro_batches > len(colours) else "")
    title += ", shade: pass" + (";  box m.c: micro-batch m, chunk c" if sched.chunks > 1 else "")
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    for text in ax.texts:
        text.set_fontsize(label_size)
    key_at_bottom(ax.figure, handles, title, fontsize)
    _drop_crowded_labels(ax)


def schedule_figure(result, title: str, width: float = 16.0):
    """One simulated schedule (``zerokit.simulate``'s result) as lesson 08 draws its four: ``width`` inches, so that
    an interleaved schedule's one-t_f boxes hold their ``m.c`` labels with :data:`LABEL_GAP_PX` to spare at p = 4,
    m = 8, and its whole key at the foot (:func:`schedule_key`)."""
    fig, ax = new_figure(width, 1.7 + 0.4 * result.schedule.ranks)
    draw_schedule(result, ax=ax, title=title)
    schedule_key(ax, result.schedule)
    return fig


def side_by_side_figure(sched, rank_spans, forward: float = 1.0, backward: float = 2.0):
    """The schedule simulated (left, units of one forward) next to a real run of it (right, seconds from each
    rank's start of the step; ``rank_spans`` the ranks' ``pipeline_spans`` in pipeline-rank order), as
    :func:`zerokit.pipeline_parallel.draw_side_by_side` draws them, with one key for both at the figure's foot
    and each panel tall enough to read its boxes."""
    simulated, real = simulate(sched, forward, backward), measured(sched, rank_spans)
    fig, (left, right) = new_figure(15.0, 2.0 + 0.6 * sched.ranks, ncols=2)
    draw_schedule(simulated, ax=left, title=f"simulated (t_b = {backward / forward:g}·t_f): "
                                            f"bubble {simulated.bubble_fraction:.1%}")
    draw_schedule(real, ax=right, title=f"measured: bubble {real.bubble_fraction:.1%}")
    left.set_xlabel("time (units of one forward)")
    right.set_xlabel("seconds from each rank's start of the step")
    for ax in (left, right):
        ax.title.set_fontsize(11)
    right.get_legend().remove()
    schedule_key(left, sched)
    _drop_crowded_labels(right)
    for text in right.texts:
        text.set_fontsize(8)
    return fig


def key_at_bottom(fig, handles, title: str, fontsize: float) -> None:
    """One legend for the whole figure at its foot, in as few rows as its width allows, and the axes laid out
    above it (``tight_layout`` within the rest): never between two panels, never over a label."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    for old in list(fig.legends):
        old.remove()
    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    rows = 1
    while True:
        legend = fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.01), fontsize=fontsize,
                            frameon=False, ncol=-(-len(handles) // rows), title=title, title_fontsize=fontsize,
                            handlelength=1.2, columnspacing=1.0, borderaxespad=0.0)
        if legend.get_window_extent(renderer).width <= fig.bbox.width - 8 or rows >= len(handles):
            break
        legend.remove()
        rows += 1
    height = (legend.get_window_extent(renderer).height + 6) / fig.bbox.height
    fig.tight_layout(rect=(0, 0.01 + height, 1, 1))


#: pixels a box label keeps clear of each edge of its box: closer, neighbouring labels ("0.0", "1.0") read as one
LABEL_GAP_PX = 3.0


def _drop_crowded_labels(ax) -> None:
    """Remove each box label that does not fit the narrowest box it sits in with :data:`LABEL_GAP_PX` on each side."""
    from matplotlib.patches import Rectangle

    fig = ax.figure
    if not hasattr(fig.canvas, "get_renderer"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    boxes = [p for p in ax.patches if isinstance(p, Rectangle)]
    for text in list(ax.texts):
        x, y = text.get_position()
        inside = [b for b in boxes if b.get_x() <= x <= b.get_x() + b.get_width()
                  and b.get_y() <= y <= b.get_y() + b.get_height()]
        if not inside:
            continue
        box = min(inside, key=lambda b: b.get_width())
        (left, _), (right, _) = ax.transData.transform([(box.get_x(), 0.0), (box.get_x() + box.get_width(), 0.0)])
        if text.get_window_extent(renderer).width + 2 * LABEL_GAP_PX > right - left:
            text.remove()


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
        fig, ax = new_figure(min(16.5, 3.0 + 0.4 * len(sched.compute(0))), 1.9 + 0.45 * p)
        draw_schedule(result, ax=ax, title=f"{sched.name}, p = {p}, m = {m}" + (f", v = {v}" if v > 1 else "")
                      + f": simulated bubble {result.bubble_fraction:.1%}")
        schedule_key(ax, sched)
        self.image.value = png(fig)
        self.status.value = (f"simulated bubble <b>{result.bubble_fraction:.1%}</b> (t_b = "
                             f"{self.backward / self.forward:g}·t_f); (p − 1)/(v·m + p − 1) = {formula:.1%} of "
                             f"the step, (p − 1)/(v·m) = {theory.bubble_over_ideal(p, m, v):.1%} of the ideal time"
                             + ((f" for 1F1B; ZB-H1 fills part of it with W: (p − 1)/(3m + p − 1) = "
                                 f"{theory.zb_h1_bubble_fraction(p, m):.1%}" if m >= p else
                                 " for 1F1B; ZB-H1 fills part of it with W") if sched.splits_backward else "")
                             + f"; peak micro-batches in flight per rank: {result.peak_in_flight}")
        self.draws += 1

    def __repr__(self) -> str:
        return "PipelinePanel: an interactive panel — run this notebook in Jupyter to use it"

    def _repr_mimebundle_(self, **kwargs):
        return mimebundle(self, **kwargs)
