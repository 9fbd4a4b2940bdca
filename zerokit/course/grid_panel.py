"""The 3-D grid: dp × tp × pp degrees and the ZeRO stage on dp → per-rank memory and per-axis traffic.

:class:`GridPanel` trains the workload once on a ``{"dp", "tp", "pp"}`` mesh (a real job
through :func:`zerokit.train`, see :class:`~zerokit.course.panel.Panel`) whenever a degree
or the stage changes, and draws, per rank, the model states the memory ledger read after
the last step, stacked by category with :mod:`zerokit.theory`'s total as a black tick, and
the bytes each rank put on each mesh axis per step — the ring cost of the collectives the
communication ledger recorded (a formula on measured payloads; point-to-point sends on
``pp``) — next to the theory's value for that axis on Ψ and the degrees (hatched).
:func:`grid_rows` gives the same numbers as table rows, one per rank. A mesh above
``max_world_size`` ranks, or ZeRO-2/3 with a pipeline (refused, as DeepSpeed refuses it),
is shown in the status line and nothing runs.
"""
from __future__ import annotations

from typing import Optional, Sequence

from .figures import legend_outside, new_figure, png
from .panel import Panel, ipywidgets
from .tables import table

AXES = ("dp", "tp", "pp")
STAGES = ("ddp", "zero1", "zero2", "zero3")
AXIS_COLORS = {"dp": "#4C72B0", "tp": "#DD8452", "pp": "#55A868"}


def _ranks(report) -> list:
    return sorted(report.results[0].ranks, key=lambda r: r.rank)


def _label(rank) -> str:
    c = rank.coords or {}
    return f"r{rank.rank}\n" + " ".join(f"{a}{c.get(a, 0)}" for a in ("pp", "dp", "tp"))


def grid_rows(report) -> list:
    """One row per rank: coordinates, model states measured and by formula, bytes per step on each axis."""
    rows = []
    for rank in _ranks(report):
        row = {"rank": rank.rank, **{a: (rank.coords or {}).get(a, 0) for a in ("pp", "dp", "tp")},
               "states B (measured)": sum(rank.model_state_bytes.values()),
               "states B (theory)": rank.theory_model_states["total"]}
        for axis in AXES:
            measured = (rank.comm_bytes_by_axis or {}).get(axis, {}).get("ring_cost_bytes") or 0
            row[f"{axis} B/step (ledger)"] = measured
            row[f"{axis} B/step (theory)"] = (rank.theory_comm_bytes_by_axis or {}).get(axis, 0)
        rows.append(row)
    return rows


class GridPanel(Panel):
    """dp, tp, pp degrees and the ZeRO stage on dp → per-rank memory bars and per-axis traffic, ledger vs theory.

    ``report`` (optional) is a grid run a cell already has, drawn first without rerunning;
    ``micro_batches`` and ``schedule`` apply when pp is above 1. Nothing reruns until a
    control changes (``auto_run``) or Run is clicked.
    """

    def __init__(self, workload, dp: int = 2, tp: int = 2, pp: int = 2, stage: str = "zero1",
                 degrees: Sequence[int] = (1, 2, 4), max_world_size: int = 8, micro_batches: int = 2,
                 schedule: str = "1f1b", steps: int = 1, precision: str = "fp32", report=None,
                 auto_run: bool = True, run: bool = True):
        w = ipywidgets()
        if stage not in STAGES:
            raise ValueError(f"GridPanel: stage={stage!r}; allowed: {', '.join(STAGES)}")
        for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
            if value not in degrees:
                raise ValueError(f"GridPanel: {name}={value!r} is not among degrees={tuple(degrees)}")
        self.workload, self.steps, self.precision, self.auto_run = workload, steps, precision, auto_run
        self.max_world_size, self.micro_batches, self.schedule = max_world_size, micro_batches, schedule
        self._build_common()
        self.degree = {name: w.ToggleButtons(options=list(degrees), value=value, description=name,
                                             style={"button_width": "48px"})
                       for name, value in (("dp", dp), ("tp", tp), ("pp", pp))}
        self.stage = w.ToggleButtons(options=list(STAGES), value=stage, description="on dp",
                                     style={"button_width": "64px"})
        #: what the last picture drew, read off the ledgers: {"states": [...], "traffic": {axis: [...]}}
        self.bars: dict = {}
        for control in (*self.degree.values(), self.stage):
            control.observe(self._changed, names="value")
        self.box = w.VBox([w.HBox([w.VBox(list(self.degree.values())), self.stage]),
                           w.HBox([self.run_button, self.progress, self.status]), self.image, self.details])
        if report is not None:
            self.last_report = report
            self.draw()
        elif run:
            self.run()

    @property
    def parallel(self) -> dict:
        return {axis: self.degree[axis].value for axis in ("pp", "dp", "tp")}

    def run(self):
        """Train on the chosen mesh with the chosen stage on dp, then draw."""
        parallel = self.parallel
        world = parallel["dp"] * parallel["tp"] * parallel["pp"]
        if world > self.max_world_size:
            return self._fail(f"dp × tp × pp = {world} ranks; this panel runs at most {self.max_world_size}")
        kwargs = dict(steps=self.steps, precision=self.precision, parallel=parallel)
        if parallel["pp"] > 1:  # ZeRO-2/3 take no schedule: left out, so the refusal names the pipeline
            kwargs.update(micro_batches=self.micro_batches)
            if self.stage.value in ("ddp", "zero1"):
                kwargs.update(schedule=self.schedule)
        return self._run_and_draw([(self.stage.value, world, kwargs)])

    def draw(self) -> None:
        report = self.last_report
        if report is None:
            return
        from ..plot import CATEGORY_COLORS

        ranks = _ranks(report)
        fig, (left, right) = new_figure(max(10.0, min(16.0, 5.0 + 1.3 * len(ranks))), 3.9, ncols=2)
        states = []
        for x, rank in enumerate(ranks):
            bottom = 0.0
            for category in ("params", "grads", "optimizer"):
                value = rank.model_state_bytes[category] / 2**10
                left.bar(x, value, bottom=bottom, color=CATEGORY_COLORS[category], label=category if x == 0 else None)
                bottom += value
            left.plot([x - 0.4, x + 0.4], [rank.theory_model_states["total"] / 2**10] * 2, color="black", lw=2,
                      label="theory" if x == 0 else None)
            states.append(sum(rank.model_state_bytes.values()))
        labels = [_label(r) for r in ranks]
        left.set_xticks(range(len(ranks)), labels, fontsize=7)
        left.set_ylabel("KiB per rank (ledger)")
        left.set_title("model states per rank:\nledger, theory as a tick", fontsize=9)
        handles, names = left.get_legend_handles_labels()
        legend_outside(left, handles=handles[::-1], labels=names[::-1], fontsize=8)
        width, traffic = 0.8 / len(AXES), {}
        for i, axis in enumerate(AXES):
            rows = [(r.comm_bytes_by_axis or {}).get(axis, {}).get("ring_cost_bytes") or 0 for r in ranks]
            formula = [(r.theory_comm_bytes_by_axis or {}).get(axis, 0) for r in ranks]
            xs = [x - 0.4 + width * (i + 0.5) for x in range(len(ranks))]
            right.bar(xs, [v / 2**10 for v in rows], width * 0.5, color=AXIS_COLORS[axis], label=f"{axis}: ledger")
            right.bar([x + width * 0.5 for x in xs], [v / 2**10 for v in formula], width * 0.5, color="white",
                      edgecolor=AXIS_COLORS[axis], hatch="///", label=f"{axis}: theory")
            traffic[axis] = rows
        right.set_xticks(range(len(ranks)), labels, fontsize=7)
        right.set_ylabel("KiB per rank per step")
        right.set_title("traffic per axis: ring cost of\nthe ledger's calls vs theory", fontsize=9)
        legend_outside(right, fontsize=8)
        result = report.results[0]
        mesh = " × ".join(f"{a} {result.parallel.get(a, 1)}" for a in ("dp", "tp", "pp"))
        fig.suptitle(f"{self.workload.name}, Ψ = {result.param_count:,}: {result.strategy} on dp, {mesh}", fontsize=9)
        fig.tight_layout()
        self.image.value = png(fig)
        self.bars = {"states": states, "traffic": traffic}
        self.details.value = table(grid_rows(report))._repr_html_()
