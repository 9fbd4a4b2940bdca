"""CPU offload (ZeRO-Offload, arXiv 2101.06840): stage × offload × world size → device vs host bytes and transfers.

:class:`OffloadPanel` trains the chosen ZeRO stage twice on the chosen world size — once
without offload, once with the chosen ``offload`` (real jobs through :func:`zerokit.train`,
see :class:`~zerokit.course.panel.Panel`) — and draws what the ledgers measured on rank 0:

- left, the model states: for each run a *device* bar and a *host* bar, stacked by
  category (params, grads, optimizer: the memory ledger's ``model_state_bytes`` and
  ``host_model_state_bytes``), with :mod:`zerokit.theory.offload`'s totals as black ticks;
- right, the device↔host copies per step (the transfer ledger: ``d2h`` gradient shards
  out, ``h2d`` parameter shards back or fetched per gather), with the formula's bytes as
  ticks.

The status line gives what the device saved, what the host took on, ZeRO-Offload's
4Ψ (2Ψ out, 2Ψ back, with 16-bit values, over the N ranks) next to the measured copies,
and the measured step-time ratio — on a CPU-only machine host and device are one RAM,
so that ratio is the copies' and the host step's cost, not PCIe time. A combination
zerokit refuses (``params`` below stage 3) is shown in the status line, not raised.
"""
from __future__ import annotations

import statistics
from typing import Optional, Sequence

from .. import theory
from ..plot import CATEGORY_COLORS
from .figures import new_figure, png
from .panel import ipywidgets, Panel
from .tables import table

STAGES = ("zero1", "zero2", "zero3")
OFFLOADS = ("none", "optimizer", "params")
STATES = ("params", "grads", "optimizer")


def offload_rows(report) -> list:
    """One row per run and rank: device and host bytes and the copies per step, each measured next to the formula."""
    rows = []
    for result in report.results:
        for rank in result.ranks:
            host_theory = rank.theory_model_states.get("host", {"total": 0})
            transfer_theory = rank.theory_transfer_bytes_per_step or {"d2h": 0, "h2d": 0}
            rows.append({"strategy": result.strategy, "offload": result.options.get("offload", "none"),
                         "rank": rank.rank,
                         "device B (measured)": sum(rank.model_state_bytes.values()),
                         "device B (theory)": rank.theory_model_states["total"],
                         "host B (measured)": sum((rank.host_model_state_bytes or {}).values()),
                         "host B (theory)": host_theory["total"],
                         "d2h B/step (measured)": rank.transfer_bytes_per_step["d2h"],
                         "d2h B/step (theory)": transfer_theory["d2h"],
                         "h2d B/step (measured)": rank.transfer_bytes_per_step["h2d"],
                         "h2d B/step (theory)": transfer_theory["h2d"]})
    return rows


def median_step_s(result) -> float:
    """Median over steps (the first left out) of the slowest rank's step time: measured."""
    per_step = [max(r.step_times_s[i] for r in result.ranks) for i in range(len(result.ranks[0].step_times_s))]
    return statistics.median(per_step[1:] if len(per_step) > 1 else per_step)


def offload_bars(report, ax_states, ax_transfers, rank: int = 0) -> None:
    """Device and host bars per run (stacked by category) and the copies per step, measured, theory as ticks."""
    labels, positions, x = [], [], 0.0
    for result in report.results:
        r = result.ranks[rank]
        offload = result.options.get("offload", "none")
        theory_host = r.theory_model_states.get("host", {"total": 0})["total"]
        for where, measured, formula in (("device", r.model_state_bytes, r.theory_model_states["total"]),
                                         ("host", r.host_model_state_bytes or {}, theory_host)):
            bottom = 0.0
            for c in STATES:
                value = measured.get(c, 0) / 1024
                ax_states.bar(x, value, bottom=bottom, color=CATEGORY_COLORS[c], hatch="//" if where == "host" else None,
                              edgecolor="white", label=c if x == 0 else None)
                bottom += value
            ax_states.plot([x - 0.4, x + 0.4], [formula / 1024] * 2, color="black", lw=2,
                           label="theory" if x == 0 else None)
            labels.append(f"{where}\n{result.strategy}\n{offload}")
            positions.append(x)
            x += 1
        x += 0.5
    ax_states.set_xticks(positions, labels, fontsize=8)
    ax_states.set_ylabel(f"KiB on rank {rank} (model states)")
    ax_states.set_title("device vs host (hatched), measured; — theory", fontsize=9)
    ax_states.legend(fontsize=8)

    names, width = [], 0.38
    for i, result in enumerate(report.results):
        r = result.ranks[rank]
        formula = r.theory_transfer_bytes_per_step or {"d2h": 0, "h2d": 0}
        for j, (direction, color) in enumerate((("d2h", "#DD8452"), ("h2d", "#4C72B0"))):
            pos = i + (j - 0.5) * width
            ax_transfers.bar(pos, r.transfer_bytes_per_step[direction] / 1024, width, color=color,
                             label=f"{direction} (measured)" if i == 0 else None)
            ax_transfers.plot([pos - width / 2, pos + width / 2], [formula[direction] / 1024] * 2, color="black",
                              lw=2, label="theory" if i == 0 and j == 0 else None)
        names.append(f"{result.strategy}\noffload={result.options.get('offload', 'none')}")
    ax_transfers.set_xticks(range(len(names)), names, fontsize=8)
    ax_transfers.set_ylabel(f"KiB per step, rank {rank}")
    ax_transfers.set_title("device↔host copies per step (transfer ledger)", fontsize=9)
    ax_transfers.legend(fontsize=8)


class OffloadPanel(Panel):
    """ZeRO stage × offload × world size × precision → device vs host bytes and the copies per step.

    Each run trains ``stage`` without offload and with ``offload`` (one job when that is
    "none") for ``steps`` steps; ``auto_run`` (default) reruns when a control changes.
    """

    def __init__(self, workload, stage: str = "zero2", offload: str = "optimizer", world_sizes: Sequence[int] = (2, 3, 4),
                 world_size: Optional[int] = None, precisions: Sequence[str] = ("bf16-mixed", "fp32"),
                 precision: Optional[str] = None, steps: int = 3, auto_run: bool = True, run: bool = True):
        if stage not in STAGES:
            raise ValueError(f"stage={stage!r}; allowed: {', '.join(STAGES)}")
        if offload not in OFFLOADS:
            raise ValueError(f"offload={offload!r}; allowed: {', '.join(OFFLOADS)}")
        w = ipywidgets()
        self.workload, self.steps, self.auto_run = workload, steps, auto_run
        self._build_common()
        self.stage = w.ToggleButtons(options=list(STAGES), value=stage, description="stage")
        self.offload = w.ToggleButtons(options=list(OFFLOADS), value=offload, description="offload")
        self._world_size_and_precision(world_sizes, world_size, precisions, precision)
        for control in (self.stage, self.offload, self.world_size, self.precision):
            control.observe(self._changed, names="value")
        self.box = w.VBox([w.HBox([w.VBox([self.stage, self.offload]), w.VBox([self.world_size, self.precision])]),
                           w.HBox([self.run_button, self.progress, self.status]), self.image, self.details])
        if run:
            self.run()

    def run(self):
        """Train the stage without and with the chosen offload, then draw."""
        common = dict(steps=self.steps, precision=self.precision.value)
        modes = ["none"] + ([self.offload.value] if self.offload.value != "none" else [])
        jobs = [(self.stage.value, self.world_size.value, dict(common, offload=mode)) for mode in modes]
        return self._run_and_draw(jobs)

    def draw(self) -> None:
        report = self.last_report
        if report is None:
            return
        fig, (left, right) = new_figure(10.5, 3.6, ncols=2, width_ratios=[3, 2])
        offload_bars(report, left, right)
        first = report.results[0]
        fig.suptitle(f"{self.workload.name}, Ψ = {first.param_count:,}, N = {first.world_size}, {first.precision}",
                     fontsize=9)
        fig.tight_layout()
        self.image.value = png(fig)
        self.status.value = self._summary(report)
        self.details.value = table(offload_rows(report))._repr_html_()

    def _summary(self, report) -> str:
        base, last = report.results[0], report.results[-1]
        n, psi = last.world_size, last.param_count
        r0, r1 = base.ranks[0], last.ranks[0]
        device0, device1 = sum(r0.model_state_bytes.values()), sum(r1.model_state_bytes.values())
        moved = sum(sum(r.transfer_bytes_per_step.values()) for r in last.ranks)
        b = theory.param_bytes_per_element(last.precision)
        text = (f"{self.status.value}; rank 0's device: {device0:,} → <b>{device1:,} B</b>"
                f" ({(device1 - device0) / device0:+.0%}), host: <b>{sum(r1.host_model_state_bytes.values()):,} B</b>; "
                f"copies over all ranks: <b>{moved:,.0f} B/step</b> (ZeRO-Offload's Ψ·b out + Ψ·b back, "
                f"theory.offload_traffic_bytes: {theory.offload_traffic_bytes(psi, b):,})")
        if last is not base:
            text += (f"; step time offload/none = {median_step_s(last) / median_step_s(base):.2f} (measured, "
                     f"medians; one RAM: the copies and the host step, not PCIe)")
        return text
