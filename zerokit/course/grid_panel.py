"""The grid: dp × cp × ep × tp × pp degrees and the ZeRO stage on dp → per-rank memory and per-axis traffic.

:class:`GridPanel` trains the workload once on a ``{"dp", "cp", "ep", "tp", "pp"}`` mesh (a
real job through :func:`zerokit.train`, see :class:`~zerokit.course.panel.Panel`) whenever a
degree, the stage or — with cp above 1 — the attention changes, and draws, per rank, the
model states the memory ledger read after the last step, stacked by category with
:mod:`zerokit.theory`'s total as a black tick, and the bytes each rank put on each mesh axis
per step — the ring cost of the collectives the communication ledger recorded (a formula on
measured payloads; point-to-point sends on ``pp`` and ring attention's on ``cp``) — next to
the theory's value for that axis (hatched). :func:`grid_rows` gives the same numbers as
table rows, one per rank.

The five axes, each cutting something else: ``dp`` the batch; ``cp`` the sequence (ring
attention or Ulysses, ``cp_attention``; the weights' gradients are then reduced over the
flattened dp × cp group, axis ``dp_cp``, where ZeRO shards too); ``ep`` the experts of a
mixture-of-experts model, carved from dp (ep divides dp and adds no ranks: world = dp · cp ·
tp · pp; the all-to-alls on ``ep``, the experts' gradients on ``edp`` when dp > ep); ``tp``
the hidden size and heads; ``pp`` the layers. The traffic chart draws dp (or dp_cp), tp and
pp always and every other axis the ledger or the theory reports.

A mesh above ``max_world_size`` ranks is shown in the status line and nothing runs; so is
every combination zerokit refuses before any process starts (ZeRO-2/3 with a pipeline, as
DeepSpeed refuses it; cp with pp; ep with cp or pp; ep on a model without experts or not
dividing dp; Ulysses on heads that cp · tp do not divide): the library's own reason.
"""
from __future__ import annotations

from typing import Sequence

from ..plot import CATEGORY_COLORS
from .figures import legend_outside, new_figure, png
from .panel import ipywidgets, Panel
from .tables import table

#: the degree controls, in the order the panel shows them
MESH = ("dp", "cp", "ep", "tp", "pp")
#: a rank's coordinates, outermost first (tp innermost; ep is a rank's place among the experts' ranks, inside dp)
COORDS = ("pp", "dp", "ep", "cp", "tp")
#: the axes the ledgers report bytes on, in the order the traffic chart draws them
AXES = ("dp", "dp_cp", "cp", "ep", "edp", "tp", "pp")
#: drawn on every grid, reported or not (dp_cp takes dp's place when the sequence is cut over cp)
ALWAYS = ("dp", "tp", "pp")
STAGES = ("ddp", "zero1", "zero2", "zero3")
ATTENTIONS = ("ring", "ulysses")
AXIS_COLORS = {"dp": "#4C72B0", "dp_cp": "#64B5CD", "cp": "#C44E52", "ep": "#8172B2", "edp": "#937860",
               "tp": "#DD8452", "pp": "#55A868"}


def _ranks(report) -> list:
    return sorted(report.results[0].ranks, key=lambda r: r.rank)


def _in_use(report) -> list:
    """The coordinates with a degree above 1 on the report's mesh, outermost first."""
    parallel = report.results[0].parallel or {}
    return [a for a in COORDS if parallel.get(a, 1) > 1]


def _label(rank, axes: Sequence[str]) -> str:
    c = rank.coords or {}
    return f"r{rank.rank}" + ("\n" + " ".join(f"{a}{c.get(a, 0)}" for a in axes) if axes else "")


def _ledger(rank, axis: str) -> float:
    """The ring cost of the calls the rank's communication ledger recorded on ``axis`` per step (0: none)."""
    return ((rank.comm_bytes_by_axis or {}).get(axis) or {}).get("ring_cost_bytes") or 0


def _theory(rank, axis: str) -> float:
    return (rank.theory_comm_bytes_by_axis or {}).get(axis, 0)


def traffic_axes(report) -> list:
    """The axes drawn and tabled: dp (dp_cp in its place when cp cuts the sequence), tp and pp always, and every
    other axis the ledger or the theory reports on some rank (cp, ep, edp …), in :data:`AXES`' order."""
    reported = {a for r in _ranks(report)
                for a in (*(r.comm_bytes_by_axis or {}), *(r.theory_comm_bytes_by_axis or {}))}
    always = [a for a in ALWAYS if not (a == "dp" and "dp_cp" in reported and "dp" not in reported)]
    return [a for a in AXES if a in reported or a in always] + sorted(reported - set(AXES))


def grid_rows(report) -> list:
    """One row per rank: coordinates, model states measured and by formula, bytes per step on each axis drawn.

    Coordinates: pp, dp and tp always, ep and cp where the mesh uses them. Axes: :func:`traffic_axes`, each
    with a ``"<axis> B/step (ledger)"`` and a ``"<axis> B/step (theory)"`` column."""
    coords = [a for a in COORDS if a in ("pp", "dp", "tp") or a in _in_use(report)]
    axes = traffic_axes(report)
    rows = []
    for rank in _ranks(report):
        row = {"rank": rank.rank, **{a: (rank.coords or {}).get(a, 0) for a in coords},
               "states B (measured)": sum(rank.model_state_bytes.values()),
               "states B (theory)": rank.theory_model_states["total"]}
        for axis in axes:
            row[f"{axis} B/step (ledger)"] = _ledger(rank, axis)
            row[f"{axis} B/step (theory)"] = _theory(rank, axis)
        rows.append(row)
    return rows


class GridPanel(Panel):
    """dp, cp, ep, tp, pp degrees, the ZeRO stage on dp and cp's attention → per-rank memory bars and per-axis
    traffic, ledger vs theory.

    ``cp``, ``ep`` (keyword-only, 1 by default: off) and ``cp_attention`` (``"ring"`` or ``"ulysses"``, used only
    when cp is above 1) add context and expert parallelism; ep needs a workload with experts
    (``zerokit.tiny_gpt(…, n_experts=E)``). ``report`` (optional) is a grid run a cell already has, drawn first
    without rerunning (pass ``cp_attention`` as it ran: the report does not keep it); ``micro_batches`` and
    ``schedule`` apply when pp is above 1. Nothing reruns until a control changes (``auto_run``) or Run is clicked.
    """

    def __init__(self, workload, dp: int = 2, tp: int = 2, pp: int = 2, stage: str = "zero1",
                 degrees: Sequence[int] = (1, 2, 4), max_world_size: int = 8, micro_batches: int = 2,
                 schedule: str = "1f1b", steps: int = 1, precision: str = "fp32", report=None,
                 auto_run: bool = True, run: bool = True, *, cp: int = 1, ep: int = 1, cp_attention: str = "ring"):
        w = ipywidgets()
        if stage not in STAGES:
            raise ValueError(f"GridPanel: stage={stage!r}; allowed: {', '.join(STAGES)}")
        if cp_attention not in ATTENTIONS:
            raise ValueError(f"GridPanel: cp_attention={cp_attention!r}; allowed: {', '.join(ATTENTIONS)}")
        # cp and ep are off at 1, offered whether degrees names 1 or not (a caller's degrees=(2, 4) keeps working)
        options = {a: list(degrees) if a in ("dp", "tp", "pp") else sorted({1, *degrees}) for a in MESH}
        values = {"dp": dp, "cp": cp, "ep": ep, "tp": tp, "pp": pp}
        for name in MESH:
            if values[name] not in options[name]:
                raise ValueError(f"GridPanel: {name}={values[name]!r} is not among degrees={tuple(options[name])}")
        self.workload, self.steps, self.precision, self.auto_run = workload, steps, precision, auto_run
        self.max_world_size, self.micro_batches, self.schedule = max_world_size, micro_batches, schedule
        self._build_common()
        self.degree = {name: w.ToggleButtons(options=options[name], value=values[name], description=name,
                                             style={"button_width": "48px"}) for name in MESH}
        self.stage = w.ToggleButtons(options=list(STAGES), value=stage, description="on dp",
                                     style={"button_width": "64px"})
        self.attention = w.ToggleButtons(options=list(ATTENTIONS), value=cp_attention, description="attention",
                                         tooltip="cp's attention: used when cp is above 1", disabled=cp == 1,
                                         style={"button_width": "64px"})
        #: the attention the last run (or the given report) used: a report does not keep it
        self.ran_attention = cp_attention
        #: what the last picture drew, read off the ledgers: {"states": [...], "traffic": {axis: [...]},
        #: "theory": {axis: [...]}}
        self.bars: dict = {}
        self.degree["cp"].observe(self._cp_changed, names="value")  # first: the attention's state, then the rerun
        for control in (*self.degree.values(), self.stage):
            control.observe(self._changed, names="value")
        self.attention.observe(self._attention_changed, names="value")
        self.box = w.VBox([w.HBox([w.VBox(list(self.degree.values())), w.VBox([self.stage, self.attention])]),
                           w.HBox([self.run_button, self.progress, self.status]), self.image, self.details])
        if report is not None:
            self.last_report = report
            self.draw()
        elif run:
            self.run()

    def _cp_changed(self, change) -> None:
        self.attention.disabled = change["new"] == 1

    def _attention_changed(self, change) -> None:
        if self.degree["cp"].value > 1:  # the attention is unused at cp = 1: nothing to rerun
            self._changed(change)

    @property
    def parallel(self) -> dict:
        """The mesh for :func:`zerokit.train`: pp, dp, tp always, cp and ep only above 1."""
        return {axis: self.degree[axis].value for axis in ("pp", "dp", "cp", "ep", "tp")
                if axis in ("pp", "dp", "tp") or self.degree[axis].value > 1}

    def run(self):
        """Train on the chosen mesh with the chosen stage on dp (and attention, with cp), then draw."""
        parallel = self.parallel
        world = parallel["dp"] * parallel.get("cp", 1) * parallel["tp"] * parallel["pp"]  # ep is carved from dp
        if world > self.max_world_size:
            return self._fail(f"dp × cp × tp × pp = {world} ranks; this panel runs at most {self.max_world_size}")
        kwargs = dict(steps=self.steps, precision=self.precision, parallel=parallel)
        if parallel.get("cp", 1) > 1:
            kwargs.update(cp_attention=self.attention.value)
        if parallel["pp"] > 1:  # ZeRO-2/3 take no schedule: left out, so the refusal names the pipeline
            kwargs.update(micro_batches=self.micro_batches)
            if self.stage.value in ("ddp", "zero1"):
                kwargs.update(schedule=self.schedule)
        attention, self.ran_attention = self.ran_attention, self.attention.value
        report = self._run_and_draw([(self.stage.value, world, kwargs)])
        if report is None:  # refused or failed: the picture (if any) is still the last run's
            self.ran_attention = attention
        return report

    def draw(self) -> None:
        report = self.last_report
        if report is None:
            return

        ranks, in_use, axes = _ranks(report), _in_use(report), traffic_axes(report)
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
        labels = [_label(r, in_use) for r in ranks]
        left.set_xticks(range(len(ranks)), labels, fontsize=8)
        left.set_ylabel("KiB per rank (ledger)")
        left.set_title("model states per rank:\nledger, theory as a tick", fontsize=9)
        handles, names = left.get_legend_handles_labels()
        legend_outside(left, "below", handles=handles, labels=names, fontsize=8, ncol=4,  # not between the panels
                       bbox_to_anchor=(0.5, -0.3))
        width, traffic, theory = 0.8 / len(axes), {}, {}
        for i, axis in enumerate(axes):
            rows, formula = [_ledger(r, axis) for r in ranks], [_theory(r, axis) for r in ranks]
            color = AXIS_COLORS.get(axis, "#999999")
            xs = [x - 0.4 + width * (i + 0.5) for x in range(len(ranks))]
            right.bar(xs, [v / 2**10 for v in rows], width * 0.5, color=color, label=f"{axis}: ledger")
            right.bar([x + width * 0.5 for x in xs], [v / 2**10 for v in formula], width * 0.5, color="white",
                      edgecolor=color, hatch="///", label=f"{axis}: theory")
            traffic[axis], theory[axis] = rows, formula
        right.set_xticks(range(len(ranks)), labels, fontsize=8)
        right.set_ylabel("KiB per rank per step")
        right.set_title("traffic per axis: ring cost of\nthe ledger's calls vs theory", fontsize=9)
        legend_outside(right, fontsize=8, ncol=2 if len(axes) > 4 else 1)
        result = report.results[0]
        parallel = result.parallel or {}
        mesh = " × ".join(f"{a} {parallel.get(a, 1)}" for a in ("dp", "cp", "tp", "pp")
                          if a != "cp" or parallel.get("cp", 1) > 1)
        mesh += f" (ep {parallel['ep']} of dp)" if parallel.get("ep", 1) > 1 else ""
        mesh += f", {self.ran_attention} attention" if parallel.get("cp", 1) > 1 else ""
        group = "dp × cp" if parallel.get("cp", 1) > 1 else "dp"  # the weights' gradients: ZeRO shards there
        fig.suptitle(f"{self.workload.name}, Ψ = {result.param_count:,}: {result.strategy} on {group}, {mesh}",
                     fontsize=9)
        fig.tight_layout()
        self.image.value = png(fig)
        self.bars = {"states": states, "traffic": traffic, "theory": theory}
        self.details.value = table(grid_rows(report))._repr_html_()
