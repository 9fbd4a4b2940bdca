"""Real sizes: model preset, GPUs, memory per GPU, strategy → per-GPU bars and the planner's table.

:class:`PlanPanel` runs no job: every change of a control calls :func:`zerokit.plan` for
each strategy (ddp, zero1-3) on the chosen preset and cluster and draws the per-GPU bytes
stacked by category (params, grads, optimizer, activations, buffers) with the GPU's
memory as a dashed line (:func:`plan_bars`); the table below lists the chosen strategy's
terms, each with its formula and assumption, and the advisor's first lines.
"""
from __future__ import annotations

import html
from typing import Optional, Sequence

from ..planner import plan, PRESETS, STRATEGIES
from ..plot import CATEGORY_COLORS
from .figures import LABEL_SIZE, legend_outside, LEGEND_SIZE, new_figure, png, TITLE_SIZE
from .panel import ipywidgets, mimebundle
from .tables import table

#: per-GPU memory sizes to choose from, GB
MEMORY_GB = (16, 24, 32, 40, 48, 80, 96, 141)
GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def plan_bars(plans: dict, chosen: Optional[str] = None, ax=None):
    """Stacked per-GPU bytes by category for ``{strategy: Plan}``, the GPU's memory as a dashed line.

    Each bar's verdict (fits / does not fit) and the chosen strategy are written under the bar, in its
    tick label — never over the title or on the memory line — and no outline covers a thin segment
    (activations, buffers); the key sits outside the axes, on the right."""
    if ax is None:
        _, ax = new_figure(7.5, 3.6)
    first = next(iter(plans.values()))
    unit = first.convention
    top = unit.value(first.cluster.gpu_memory)
    for x, (name, p) in enumerate(plans.items()):
        s, bottom = p.memory.model_states, 0.0
        parts = {"params": s.params, "grads": s.grads, "optimizer": s.optimizer,
                 "activations": p.memory.activations, "buffers": p.memory.buffers}
        for category, value in parts.items():
            height = unit.value(value)
            ax.bar(x, height, bottom=bottom, color=CATEGORY_COLORS[category], label=category if x == 0 else None,
                   linewidth=0)
            bottom += height
        top = max(top, bottom)
    ax.axhline(unit.value(first.cluster.gpu_memory), color="#333333", ls="--", lw=1,
               label=f"GPU memory {unit.text(first.cluster.gpu_memory)}")
    ax.set_ylim(0, top * 1.05)
    labels = [f"{name}{' (chosen)' if name == chosen else ''}\n{'fits' if p.fits else 'does not fit'}"
              for name, p in plans.items()]
    ax.set_xticks(range(len(plans)), labels, fontsize=LABEL_SIZE)
    for label, name in zip(ax.get_xticklabels(), plans):
        if name == chosen:
            label.set_fontweight("bold")
    ax.set_ylabel(f"{unit.unit_name} per GPU (planned)")
    ax.set_title(f"{first.model.name} on {first.cluster.gpus} GPUs: per-GPU memory\nby strategy (formulas)",
                 fontsize=TITLE_SIZE)
    legend_outside(ax, fontsize=LEGEND_SIZE)
    return ax


class PlanPanel:
    """Preset, GPUs, memory per GPU, strategy → per-GPU bars for every strategy and the chosen one's table.

    ``plan_options`` go to :func:`zerokit.plan` unchanged (micro_batch_size, checkpointing,
    convention, parallel, …). Nothing runs; a bad combination is shown in the status line.
    """

    def __init__(self, preset: str = "llama-7b", gpus: int = 8, gpu_memory_gb: float = 80, strategy: str = "zero3",
                 presets: Sequence[str] = tuple(PRESETS), **plan_options):
        w = ipywidgets()
        self.plan_options = plan_options
        self.preset = w.Dropdown(options=list(presets), value=preset, description="model")
        self.gpus = w.SelectionSlider(options=list(GPU_COUNTS), value=gpus, description="GPUs",
                                      continuous_update=False)
        memory = sorted(set(MEMORY_GB) | {gpu_memory_gb})
        self.gpu_memory = w.SelectionSlider(options=memory, value=gpu_memory_gb, description="GB per GPU",
                                            continuous_update=False)
        self.strategy = w.ToggleButtons(options=list(STRATEGIES), value=strategy, description="strategy")
        self.status = w.HTML(value="")
        self.image = w.Image(format="png")
        self.details = w.HTML(value="")
        self.plans: dict = {}
        self.last_error: Optional[str] = None
        #: how many times the panel has drawn (a test reads it)
        self.draws = 0
        for control in (self.preset, self.gpus, self.gpu_memory, self.strategy):
            control.observe(lambda _: self.update(), names="value")
        self.box = w.VBox([w.HBox([w.VBox([self.preset, self.gpus, self.gpu_memory]), self.strategy]),
                           self.status, self.image, self.details])
        self.update()

    @property
    def chosen(self):
        """The plan of the chosen strategy (None after an error)."""
        return self.plans.get(self.strategy.value)

    def update(self) -> None:
        """Plan every strategy for the controls' values and redraw."""
        try:
            self.plans = {s: plan(self.preset.value, gpus=self.gpus.value, gpu_memory=self.gpu_memory.value * 1e9,
                                  gpus_per_node=min(8, self.gpus.value), strategy=s, **self.plan_options)
                          for s in STRATEGIES}
        except ValueError as exc:  # shown, not raised from a callback nobody sees
            self.plans, self.last_error = {}, str(exc)
            self.status.value = f"<span style='color:#C44E52'>{html.escape(self.last_error)}</span>"
            return
        self.last_error = None
        self.draw()

    def draw(self) -> None:
        fig, ax = new_figure(7.5, 3.6)
        plan_bars(self.plans, self.strategy.value, ax=ax)
        fig.tight_layout()
        self.image.value = png(fig)
        chosen = self.chosen
        unit = chosen.convention
        rows = [{"category": t.category, "term": t.name, unit.unit_name: round(unit.value(t.bytes), 3),
                 "formula": t.formula, "assumption": t.assumption} for t in chosen.memory.terms]
        rows.append({"category": "", "term": "total", unit.unit_name: round(unit.value(chosen.total_bytes), 3),
                     "formula": f"of {unit.text(chosen.cluster.gpu_memory)}",
                     "assumption": "fits" if chosen.fits else "does not fit"})
        advice = "<br>".join(html.escape(line) for line in chosen.advise().lines(limit=4))
        self.status.value = (f"{html.escape(chosen.model.describe())}<br>{html.escape(chosen.layout.describe())}: "
                             f"<b>{unit.text(chosen.total_bytes)}</b> per GPU — "
                             f"{'fits' if chosen.fits else 'does not fit'}")
        self.details.value = table(rows)._repr_html_() + f"<p style='font-size:85%'>{advice}</p>"
        self.draws += 1

    def __repr__(self) -> str:
        return f"PlanPanel for {self.preset.value}: an interactive panel — run this notebook in Jupyter to use it"

    def _repr_mimebundle_(self, **kwargs):
        return mimebundle(self, **kwargs)
