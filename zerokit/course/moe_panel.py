"""Mixture of experts (Switch, GShard, DeepSpeed-MoE): experts × top-k × capacity × ep → routing and bytes.

:class:`MoEPanel` trains the tiny MoE GPT for one step under ``ddp`` with the chosen mesh
(``parallel={"dp": dp, "ep": ep}``: a real job through :func:`zerokit.train`, see
:class:`~zerokit.course.panel.Panel`) and draws:

- left, the slots each expert received over the step's global batch, per layer, with the
  capacity line ⌈c·T·k/E⌉ per sequence times the sequences where a capacity is set, and the
  dropped slots in the title. Routing is per token and capacity per sequence, so the
  global batch routed by the same weights in this process gives the ranks' totals;
  :func:`moe_rows` checks it against the job: the rows each rank's dispatch all-to-all
  carried (its ledger) are the kept slots × d × b;
- right, rank 0's bytes per step on each mesh axis (``dp`` for the dense gradients,
  ``ep`` for the all-to-alls, ``edp`` for the experts' gradients when dp > ep), measured
  (the ledger's ring cost) next to the formula (``theory_comm_bytes_by_axis``).

Under the picture, the table of :func:`moe_rows`; :meth:`MoEPanel.table` returns it as it stands, for a
notebook read without a kernel. A mesh zerokit refuses (ep not dividing dp or E, top-k above E) is shown in the
status line.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from ..expert_parallel.apply import routing
from ..workloads import tiny_gpt
from .figures import legend_outside, new_figure, png
from .panel import ipywidgets, Panel
from .tables import table

AXES = ("dp", "ep", "edp")
LAYER_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52")


def routed(workload) -> dict:
    """What the MoE layers route on step 0's global batch, with the initial weights: slots per expert and dropped
    per layer (measured by :func:`zerokit.expert_parallel.apply.routing`), and the batch's sequences and tokens."""
    model = workload.build_model()
    x, _ = workload.batch(0)
    with torch.no_grad():
        model(x)
    return {**routing(model), "sequences": x.shape[0], "tokens": x.numel()}


def moe_rows(report, routing: dict, d_model: int) -> list:
    """One row per rank: the slots its dispatch carried (ledger, step 0) next to the kept slots routed in one process,
    and the bytes per axis, measured and theory."""
    rows = []
    for rank in report.result.ranks:
        dispatched = sum(r["payload_bytes"] for r in rank.comm_records or ()
                         if r["tag"] == "moe dispatch" and r["step"] == 0) // (4 * d_model)
        row = {"rank": rank.rank, "slots dispatched, all layers (ledger)": dispatched}
        for axis in AXES:
            measured = (rank.comm_bytes_by_axis or {}).get(axis)
            if measured is not None:
                row[f"{axis} B/step (measured · theory)"] = (f"{measured['ring_cost_bytes']:,.0f} · "
                                                              f"{rank.theory_comm_bytes_by_axis.get(axis, 0):,.0f}")
        row["params B (measured)"] = rank.model_state_bytes["params"]
        rows.append(row)
    return rows


class MoEPanel(Panel):
    """Experts, top-k, capacity factor, ep and dp → slots per expert, dropped, and bytes per axis next to theory.

    ``base``: :func:`zerokit.tiny_gpt`'s sizes (vocab, seq_len, d_model, n_layer, n_head, batch_size);
    the panel adds ``n_experts``, ``top_k`` and ``capacity_factor`` from its controls.
    """

    def __init__(self, base: dict, experts: Sequence[int] = (2, 4, 8), n_experts: int = 4,
                 top_ks: Sequence[int] = (1, 2), top_k: int = 2,
                 capacities: Sequence[Optional[float]] = (None, 0.5, 1.0, 1.25, 2.0), capacity: Optional[float] = None,
                 eps: Sequence[int] = (1, 2, 4), ep: int = 2, dps: Sequence[int] = (2, 4), dp: int = 2,
                 auto_run: bool = True, run: bool = True):
        w = ipywidgets()
        self.base, self.auto_run, self._tiny_gpt = dict(base), auto_run, tiny_gpt
        self._build_common()
        self.experts = w.ToggleButtons(options=list(experts), value=n_experts, description="experts E")
        self.top_k = w.ToggleButtons(options=list(top_ks), value=top_k, description="top-k")
        self.capacity = w.ToggleButtons(options=[("dropless" if c is None else f"c = {c:g}", c) for c in capacities],
                                        value=capacity, description="capacity")
        self.ep = w.ToggleButtons(options=list(eps), value=ep, description="ep")
        self.dp = w.ToggleButtons(options=list(dps), value=dp, description="dp (ranks)")
        for control in (self.experts, self.top_k, self.capacity, self.ep, self.dp):
            control.observe(self._changed, names="value")
        self.workload = self._workload()
        self.routing = None
        #: the rows of the table under the picture (:func:`moe_rows`), one per rank
        self.rows: list = []
        self.box = w.VBox([w.HBox([w.VBox([self.experts, self.top_k, self.capacity]), w.VBox([self.ep, self.dp])]),
                           w.HBox([self.run_button, self.progress, self.status]), self.image, self.details])
        if run:
            self.run()

    def _workload(self):
        return self._tiny_gpt(**self.base, n_experts=self.experts.value, top_k=self.top_k.value,
                              capacity_factor=self.capacity.value)

    def run(self):
        """Train one step on dp ranks with ep carved from them, route the same batch here, then draw."""
        try:
            self.workload = self._workload()
        except ValueError as exc:
            return self._fail(f"ValueError: {exc}")
        dp, ep = self.dp.value, self.ep.value
        parallel = {"dp": dp, "ep": ep} if ep > 1 else {"dp": dp}
        report = self._train_all([("ddp", dp, dict(steps=1, parallel=parallel, keep_records=True,
                                                   optimizer="sgd", lr=0.1))])
        if report is None:
            return None
        self.routing = routed(self.workload)
        self.last_report = report
        self.runs += 1
        self.draw()
        return report

    def capacity_slots(self) -> Optional[int]:
        """⌈c·T·k/E⌉ slots per expert per sequence (None: dropless)."""
        c = self.capacity.value
        if c is None:
            return None
        return math.ceil(c * self.base["seq_len"] * self.top_k.value / self.experts.value)

    def draw(self) -> None:
        report, routing = self.last_report, self.routing
        if report is None or routing is None:
            return
        fig, (left, right) = new_figure(11, 3.8, ncols=2, width_ratios=[3, 2])
        n_experts, layers = self.experts.value, len(routing["tokens_per_expert"])
        width = 0.8 / layers
        for i, counts in enumerate(routing["tokens_per_expert"]):
            left.bar([e + (i - (layers - 1) / 2) * width for e in range(n_experts)], counts, width,
                     color=LAYER_COLORS[i % len(LAYER_COLORS)], label=f"layer {i} (measured)")
        even = routing["tokens"] * self.top_k.value / n_experts
        left.axhline(even, color="#777777", ls=":", lw=1.5, label="even share T·k/E")
        cap = self.capacity_slots()
        if cap is not None:
            left.axhline(cap * routing["sequences"], color="black", lw=1.5, label="capacity ⌈c·T·k/E⌉ × sequences")
        left.set_xticks(range(n_experts), [str(e) for e in range(n_experts)])
        left.set_xlabel("expert")
        left.set_ylabel("slots received (global batch)")
        left.set_title(f"dropped: {sum(routing['dropped'])} of {routing['tokens'] * self.top_k.value * layers} slots",
                       fontsize=10)
        legend_outside(left, "below", ncol=2)
        rank0 = report.result.ranks[0]
        axes = [a for a in AXES if a in (rank0.comm_bytes_by_axis or {})]
        measured = [rank0.comm_bytes_by_axis[a]["ring_cost_bytes"] / 1024 for a in axes]
        formula = [rank0.theory_comm_bytes_by_axis.get(a, 0) / 1024 for a in axes]
        right.bar(range(len(axes)), measured, 0.6, color="#8172B2", label="measured (ledger)")
        for x, value in enumerate(formula):
            right.plot([x - 0.3, x + 0.3], [value] * 2, color="black", lw=2, label="theory" if x == 0 else None)
        right.set_xticks(range(len(axes)), axes)
        right.set_ylabel("KiB per step, rank 0")
        right.set_title(f"dp = {self.dp.value}, ep = {self.ep.value}: bytes per axis", fontsize=10)
        legend_outside(right, "below", ncol=2)
        fig.tight_layout()
        self.image.value = png(fig)
        experts = sum(p.numel() for n, p in self.workload.build_model().named_parameters() if ".experts." in n)
        self.status.value = (f"{self.status.value}; dropped <b>{sum(routing['dropped'])}</b> slots; load-balancing "
                             f"loss per layer {', '.join(f'{a:.3f}' for a in routing['aux'])} (1 = even); rank 0 "
                             f"holds {experts // self.ep.value:,} of {experts:,} expert parameters")
        self.rows = moe_rows(report, routing, self.base["d_model"])
        self.details.value = table(self.rows)._repr_html_()

    def table(self):
        """The table under the picture as it stands, one row per rank: a cell that shows it keeps it in the saved
        notebook, where the widget's copy is not."""
        return table(self.rows, title=f"dp = {self.dp.value}, ep = {self.ep.value}: per rank, one step")
