"""What a training run measured, per rank and per strategy, next to the theory.

Names say what a number is, everywhere (fields, JSON keys, table columns): a
*measured* quantity was read off the run — memory from the ledger, ``comm_payload_bytes``
of the collectives issued, ``comm_sent_bytes`` counted by zerokit's ring on the wire; a
*formula* quantity was computed — ``comm_ring_cost_bytes`` (the ring formula applied to
each measured payload) and everything under ``theory`` (the formulas of
:mod:`zerokit.theory` applied to Ψ and N).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from .plot import memory_bars


@dataclass
class RankResult:
    rank: int
    losses: list
    step_times_s: list
    model_state_bytes: dict
    memory_bytes: dict
    peak_bytes: int
    peak_breakdown: dict
    peak_where: str
    cuda_peak_bytes: Optional[int]
    #: measured: bytes of the collectives' tensors per step
    comm_payload_bytes_per_step: float
    #: formula on measured payloads: what the ring algorithm sends for them, per step
    comm_ring_cost_bytes_per_step: float
    #: measured on the wire (zerokit's ring only): bytes sent per step; None if the backend ran any collective
    comm_sent_bytes_per_step: Optional[float]
    comm_calls_per_step: float
    comm_summary: list
    comm_records: Optional[list]
    theory_model_states: dict
    theory_comm_bytes_per_step: float
    params: Optional[Dict[str, torch.Tensor]]
    param_count: int
    trace: Optional[list] = None
    #: each category's own peak over the samples (``peak_breakdown`` is the split at the total's peak)
    peak_by_category: Optional[dict] = None
    #: measured by CUDA's caching allocator (None on the CPU): bytes allocated at the ledger's peak sample, and the
    #: largest allocated − ledger total over the samples, with where (:mod:`zerokit.runtime.memory`)
    allocator_at_peak: Optional[int] = None
    allocator_gap_max: Optional[int] = None
    allocator_gap_where: str = ""
    #: this rank's place on the mesh: {"dp": …, "tp": …, "pp": …}
    coords: Optional[dict] = None
    #: per mesh axis: calls, payload, ring cost and sent bytes per step
    comm_bytes_by_axis: Optional[dict] = None
    #: formula: the ring bytes per step on each axis (``theory_comm_bytes_per_step`` is their sum)
    theory_comm_bytes_by_axis: Optional[dict] = None
    #: measured: model states resting on the host (zerokit.offload), {params, grads, optimizer}
    host_model_state_bytes: Optional[dict] = None
    #: measured: device↔host bytes and copies per step, {"d2h": …, "h2d": …} (setup excluded)
    transfer_bytes_per_step: Optional[dict] = None
    transfer_copies_per_step: Optional[dict] = None
    #: formula: the same bytes per step (None: the strategy's copies are not modelled, e.g. a peer's)
    theory_transfer_bytes_per_step: Optional[dict] = None
    #: measured, with a pipeline: the last step's actions on this rank as (action, start s, end s)
    pipeline_spans: Optional[list] = None
    #: measured: forward calls activation checkpointing re-ran in backward, over all steps
    #: (zerokit.activation_checkpointing)
    recomputed_forwards: int = 0
    #: measured, with a mixture of experts: per MoE layer, the slots each expert took and the slots dropped in the
    #: last step's last forward (summed over this rank's micro-batch), and the load-balancing loss
    #: (:func:`zerokit.expert_parallel.apply.routing`)
    routing: Optional[dict] = None


def _median_step_time(ranks: List[RankResult]) -> float:
    """Median over steps (the first, warm-up, left out when there are more) of the slowest rank."""
    per_step = [max(r.step_times_s[i] for r in ranks) for i in range(len(ranks[0].step_times_s))]
    return statistics.median(per_step[1:] if len(per_step) > 1 else per_step)


def param_difference(params: Dict[str, torch.Tensor], reference: Dict[str, torch.Tensor]) -> dict:
    """Largest absolute and relative (to the reference's largest magnitude) parameter difference."""
    if params.keys() != reference.keys():
        missing = sorted(set(reference) ^ set(params))
        raise ValueError(f"parameter names differ from the reference: {missing[:5]}")
    abs_diff = max(float((params[k] - reference[k]).abs().max()) for k in reference)
    scale = max(float(reference[k].abs().max()) for k in reference)
    return {"max_abs": abs_diff, "max_rel": abs_diff / scale if scale else abs_diff}


@dataclass
class StrategyResult:
    strategy: str
    world_size: int
    precision: str
    optimizer: str
    micro_batches: int
    options: dict
    ranks: List[RankResult]
    losses: list
    param_count: int
    step_time_s_median: float
    param_diff: Optional[dict] = None
    #: the mesh: {"dp": …, "tp": …, "pp": …}
    parallel: Optional[dict] = None

    @classmethod
    def from_ranks(cls, job, ranks: List[RankResult], reference: Optional[RankResult]) -> "StrategyResult":
        n = len(ranks)
        losses = [sum(r.losses[i] for r in ranks) / n for i in range(job.steps)]
        diff = None
        if reference is not None and ranks[0].params is not None:
            diff = param_difference(ranks[0].params, reference.params)
        return cls(job.strategy, n, job.config.precision, job.config.optimizer.name, job.config.micro_batches,
                   dict(job.options), ranks, losses, ranks[0].param_count, _median_step_time(ranks), diff,
                   dict(getattr(job, "parallel", None) or {"pp": 1, "dp": n, "tp": 1}))

    @property
    def max_abs_param_diff(self) -> Optional[float]:
        return None if self.param_diff is None else self.param_diff["max_abs"]

    def to_json(self) -> dict:
        return {
            "strategy": self.strategy,
            "world_size": self.world_size,
            "parallel": self.parallel,
            "options": self.options,
            "per_rank": [{
                "rank": r.rank,
                "coords": r.coords,
                "model_state_bytes": r.model_state_bytes,
                "peak_bytes": r.peak_bytes,
                "comm_payload_bytes_per_step": r.comm_payload_bytes_per_step,
                "comm_ring_cost_bytes_per_step": r.comm_ring_cost_bytes_per_step,
                "comm_sent_bytes_per_step": r.comm_sent_bytes_per_step,
                "comm_calls_per_step": r.comm_calls_per_step,
                "comm_bytes_by_axis": r.comm_bytes_by_axis,
                "host_model_state_bytes": r.host_model_state_bytes,
                "transfer_bytes_per_step": r.transfer_bytes_per_step,
                "cuda_peak_bytes": r.cuda_peak_bytes,
                "allocator_at_peak": r.allocator_at_peak,
                "allocator_gap_max": r.allocator_gap_max,
                "allocator_gap_where": r.allocator_gap_where,
                "recomputed_forwards": r.recomputed_forwards,
                "routing": r.routing,
            } for r in self.ranks],
            "theory": {
                "model_state_bytes_per_rank": self.ranks[0].theory_model_states,
                "comm_ring_bytes_per_step": self.ranks[0].theory_comm_bytes_per_step,
                "comm_ring_bytes_per_step_by_axis": self.ranks[0].theory_comm_bytes_by_axis,
                "transfer_bytes_per_step": self.ranks[0].theory_transfer_bytes_per_step,
            },
            "losses": self.losses,
            "max_abs_param_diff_vs_reference": self.max_abs_param_diff,
            "max_rel_param_diff_vs_reference": None if self.param_diff is None else self.param_diff["max_rel"],
            "step_time_s_median": self.step_time_s_median,
        }


def _max_or_none(values):
    return None if any(v is None for v in values) else max(values)


def _mb(x) -> str:
    return f"{x / 2**20:8.3f}"


@dataclass
class Report:
    results: List[StrategyResult]
    reference: Optional[RankResult] = None

    def __getitem__(self, key) -> StrategyResult:
        if isinstance(key, int):
            return self.results[key]
        for r in self.results:
            if r.strategy == key:
                return r
        raise KeyError(f"no result for strategy {key!r}; have {[r.strategy for r in self.results]}")

    @property
    def result(self) -> StrategyResult:
        return self.results[0]

    def to_json(self) -> dict:
        first = self.results[0]
        world_size = max(r.world_size for r in self.results)  # the reference runs on one
        return {"world_size": world_size, "param_count": first.param_count, "precision": first.precision,
                "optimizer": first.optimizer, "strategies": [r.to_json() for r in self.results]}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    def rows(self) -> list:
        """One row per strategy: rank 0's model states and traffic, measured and theory."""
        rows = []
        for r in self.results:
            rank0 = r.ranks[0]
            measured = sum(rank0.model_state_bytes.values())
            rows.append({
                "strategy": r.strategy, "N": r.world_size,
                "model_states_measured": measured, "model_states_theory": rank0.theory_model_states["total"],
                "comm_payload": max(x.comm_payload_bytes_per_step for x in r.ranks),
                "comm_ring_cost": max(x.comm_ring_cost_bytes_per_step for x in r.ranks),
                "comm_sent": _max_or_none([x.comm_sent_bytes_per_step for x in r.ranks]),
                "comm_theory": max(x.theory_comm_bytes_per_step for x in r.ranks),  # the busiest rank by formula
                "peak": max(x.peak_bytes for x in r.ranks),
                "loss": r.losses[-1], "param_diff": r.max_abs_param_diff, "step_s": r.step_time_s_median,
            })
        return rows

    def table(self) -> str:
        """Memory and traffic per rank per step, MiB. Measured columns: states, payload, sent, peak; formula
        columns: states theory, ring cost (the ring formula on the measured payloads), ring theory (on Ψ)."""
        header = (f"{'strategy':<20}{'N':>3} {'states':>9} {'theory':>9} {'payload':>9} {'ring cost':>9} "
                  f"{'sent':>9} {'ring theory':>11} {'peak':>9} {'last loss':>10} {'|Δp| vs ref':>12} {'step ms':>8}")
        kinds = (f"{'':<20}{'':>3} {'measured':>9} {'formula':>9} {'measured':>9} {'formula':>9} "
                 f"{'measured':>9} {'formula':>11} {'measured':>9}")
        lines = [header, kinds, "-" * len(header)]
        notes = set()
        for row in self.rows():
            diff = "—" if row["param_diff"] is None else f"{row['param_diff']:.1e}"
            sent = "—" if row["comm_sent"] is None else _mb(row["comm_sent"])
            lines.append(f"{row['strategy']:<20}{row['N']:>3} {_mb(row['model_states_measured']):>9} "
                         f"{_mb(row['model_states_theory']):>9} {_mb(row['comm_payload']):>9} "
                         f"{_mb(row['comm_ring_cost']):>9} {sent:>9} {_mb(row['comm_theory']):>11} "
                         f"{_mb(row['peak']):>9} {row['loss']:>10.4f} {diff:>12} {1000 * row['step_s']:>8.1f}")
        for r in self.results:
            notes.update(row["note"] for row in r.ranks[0].comm_summary if row.get("note"))
        lines.append("MiB per rank (traffic: per step, the busiest rank). sent: bytes zerokit's ring handed to send "
                     "(algorithm='ring'); — where the backend ran the collective and nothing counts its wire bytes.")
        lines += self._host_lines()
        lines += self._axis_lines()
        lines += sorted(f"note: {n}" for n in notes)
        return "\n".join(lines)

    def _axis_lines(self) -> list:
        """Rank 0 of every run whose traffic lies on more than one mesh axis (a grid, context or expert parallelism):
        its bytes per step on each axis, measured (the ring formula on the measured payloads; an uneven all-to-all
        the rows that left the rank) next to the theory for that axis."""
        lines = []
        for r in self.results:
            rank0 = r.ranks[0]
            measured = {a: row.get("ring_cost_bytes") for a, row in (rank0.comm_bytes_by_axis or {}).items()
                        if row.get("calls")}
            theory = rank0.theory_comm_bytes_by_axis or {}
            if len(set(measured) | set(theory)) < 2:
                continue
            cells = ", ".join(f"{a} {measured.get(a, 0):,.0f} / {theory[a]:,.0f}" if a in theory else
                              f"{a} {measured[a]:,.0f} / —" for a in sorted(set(measured) | set(theory)))
            lines.append(f"by axis, {r.strategy} rank 0, B/step measured / theory: {cells}")
        return lines

    def _host_lines(self) -> list:
        """Rank 0 of every strategy that offloads (zerokit.offload): its states on the host and its device↔host
        bytes per step, measured next to the formula (the device's are the table's columns)."""
        lines = []
        for r in self.results:
            rank0 = r.ranks[0]
            host, moved = rank0.host_model_state_bytes or {}, rank0.transfer_bytes_per_step or {}
            if not (sum(host.values()) or sum(moved.values())):
                continue
            host_theory = rank0.theory_model_states.get("host", {}).get("total")
            moved_theory = rank0.theory_transfer_bytes_per_step or {}
            formula = lambda x: "—" if x is None else _mb(x).strip()
            lines.append(f"host, {r.strategy} rank 0: states {_mb(sum(host.values())).strip()} MiB (formula "
                         f"{formula(host_theory)}); per step d2h {_mb(moved.get('d2h', 0)).strip()} (formula "
                         f"{formula(moved_theory.get('d2h'))}), h2d {_mb(moved.get('h2d', 0)).strip()} (formula "
                         f"{formula(moved_theory.get('h2d'))}) MiB")
        if lines:
            lines.append("host: zerokit's device↔host copies are real copies, counted (a peer's are not: formula —); "
                         "on a CPU-only machine host and device are one RAM, so no link time is measured")
        return lines

    def __str__(self) -> str:
        return self.table()

    def plot(self, ax=None):
        """Per-rank stacked model-state bars, measured, next to the theory's total."""
        return memory_bars(self, ax=ax)
