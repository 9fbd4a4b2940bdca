"""``zerokit tour``: every parallelism on one tiny GPT, one table, measured next to the theory.

Lifecycle:

1. **rows** (:func:`tour_rows`): the tour as data — per parallelism, zerokit's strategy on
   its layout (dp×tp×pp×cp×ep) and, under it, each peer that does the same thing (torch DDP,
   ZeroRedundancyOptimizer, FSDP2, DeepSpeed when it is installed, torch TP, torch's
   pipelining, torch.utils.checkpoint). Data parallelism and ZeRO 1–3 run at every
   ``--world-sizes`` entry; tensor parallelism at tp=2; pipeline 1F1B at pp=2 with 4
   micro-batches; the dp×tp grid at 2×2; offload and activation checkpointing at dp=2;
   HSDP at 4 ranks in shard groups of 2; ZeRO++ (qwZ, hpZ over 2, qgZ) at 4 ranks; context
   parallelism at cp=2 (ring and Ulysses), dp=2×cp=2 under zero3 and cp=2×tp=2; expert
   parallelism at dp=2×ep=2, dp=4×ep=2 and dp=2×ep=2×tp=2 (zero1) on the tour's GPT with a
   mixture of experts.
2. **plan**: every row becomes a checked :class:`~zerokit.job.Job` before any process starts,
   so a row the library cannot run fails in a second, naming the row.
3. **run**: one single-process reference per model, then each row launched for real; each result holds
   rank 0's ledgers, the busiest rank's traffic and the parameters. The ranks' output passes
   through :class:`Terminal`, which holds back DeepSpeed's set-up chatter and counts it in one line.
4. **print** (:func:`table`), every line within :data:`WIDTH` columns: per row, model states per
   rank (memory ledger) next to ``zerokit.theory``, traffic per step (the ring cost of the
   collectives the communication ledger recorded) next to the theory's, |Δparam| against the
   single process, and what the row is there to show (the pipeline's bubble measured and
   simulated, offload's host bytes and copies, checkpointing's activations and recomputed
   forwards). Where a peer's measurement is not the formula's, a "why" line (:func:`why`)
   says what its library does instead — read from its source, sized from the row's own
   ledger so that formula + the note's bytes = the measurement. The last lines say where to go
   next; :func:`main` returns the results with every line it printed (:class:`TourRun`).
"""
from __future__ import annotations

import re
import sys
import textwrap
import time
from dataclasses import dataclass, field
from typing import List, Optional

from . import strategies as strategy_registry, theory
from .job import make_job
from .pipeline_parallel import measured, schedule, simulate
from .report import StrategyResult
from .runtime.errors import RankFailed, RankTimeout
from .train import reference_device, run_job, run_reference
from .workloads import tiny_gpt

#: the tiny GPT the tour runs (tied embedding and head): small enough for every row in a minute on 2 cores
TOUR_WORKLOAD = dict(vocab=256, seq_len=32, d_model=64, n_layer=2, n_head=4, batch_size=8)
#: the pipeline row: its schedule and micro-batches
PIPELINE = dict(schedule="1f1b", stages=2, micro_batches=4)
#: the expert-parallel rows' model: the tour's GPT with a mixture of experts in every block (its own reference)
TOUR_EXPERTS = dict(n_experts=4, top_k=2)
#: the tour's AdamW learning rate
LR = 1e-3
#: the columns of a terminal the tour's output fits, every line of it (tests/app/test_tour.py)
WIDTH = 100
#: the mesh's axes, in the order the layout column names them
AXES = ("dp", "tp", "pp", "cp", "ep")
#: how the strategy column writes an option (any other: ``key=value``)
SHORT_OPTION = {"schedule": "{v}", "cp_attention": "{v}", "checkpointing": "checkpointing {v}",
                "offload": "offload {v}"}
#: registered strategies the tour leaves out, and why; any other strategy must have a row (tests/app/test_tour.py)
NOT_IN_TOUR = {
    "single": "the reference every row is held against",
    "ddp-naive": "a teaching step towards ddp (lesson 03): one all-reduce per parameter",
    "ddp-bucketed": "a teaching step towards ddp (lesson 03): buckets after backward, no overlap",
    "zero2-naive": "the seed's misreading of ZeRO-2 (all-reduce, then drop), lesson 05",
    "torch-pp-gpipe": "another of torch's schedules; the tour's pipeline row is 1F1B (lesson 08 has them all)",
    "torch-pp-interleaved": "another of torch's schedules; the tour's pipeline row is 1F1B (lesson 08 has them all)",
    "hsdp-zero2": "HSDP over ZeRO-2; the HSDP row (over ZeRO-3) shows the split into dp_shard and dp_replicate, "
                  "tests/zero/test_hsdp.py holds both to their formulas",
    "deepspeed-moe": "DeepSpeed's layer computes the same function only at top-1 dropless (its top-2 renormalises and "
                     "samples the gates); the tour's experts are top-2 — `zerokit bench cp_ep` pairs it at top-1",
}


@dataclass(frozen=True)
class Row:
    """One line of the tour: a strategy on a layout, with its options."""

    section: str
    strategy: str
    world_size: int
    parallel: Optional[dict] = None
    options: dict = field(default_factory=dict)
    micro_batches: int = 1
    #: a peer's row: the zerokit strategy it mirrors (printed under it)
    peer: bool = False
    #: the row's model when it is not the tour's GPT: "experts" (:data:`TOUR_EXPERTS`)
    model: str = "gpt"
    #: what the strategy column shows in place of its options, when they are too long to read ("" : the options)
    short: str = ""
    #: ranks per emulated node (``zerokit.train``'s ``ranks_per_node``); None: one node
    ranks_per_node: Optional[int] = None

    @property
    def layout(self) -> str:
        """Every axis of the mesh, in :data:`AXES`' order: ``2×1×1×1×2`` is dp 2, ep 2 (ep carved out of dp)."""
        shape = self.parallel or {"dp": self.world_size}
        return "×".join(str(shape.get(axis, 1)) for axis in AXES)

    @property
    def label(self) -> str:
        extra = [SHORT_OPTION.get(k, "{k}={v}").format(k=k, v=v) for k, v in self.options.items()]
        extra += [f"{self.micro_batches} micro-batches"] if self.micro_batches > 1 else []
        extra = [self.short] if self.short else extra
        if self.ranks_per_node:
            extra.append(f"{self.world_size // self.ranks_per_node} nodes")
        name = f"{self.strategy} ({', '.join(extra)})" if extra else self.strategy
        return f"  ↳ {name}" if self.peer else name


def _have(name: str) -> bool:
    return name in strategy_registry.names()


def tour_rows(world_sizes=(2, 4)) -> List[Row]:
    """Every parallelism's rows, zerokit's strategy first and its peers under it (those installed)."""
    rows: List[Row] = []

    def add(section, ours, peers, n, parallel=None, options=None, micro_batches=1, peer_options=None,
            ranks_per_node=None):
        rows.append(Row(section, ours, n, parallel, dict(options or {}), micro_batches,
                        ranks_per_node=ranks_per_node))
        for peer in peers:
            if _have(peer):
                rows.append(Row(section, peer, n, parallel, dict((peer_options or {}).get(peer, {})),
                                micro_batches, peer=True, ranks_per_node=ranks_per_node))

    data_parallel = [("data parallel", "ddp", ["torch-ddp"]),
                     ("ZeRO-1", "zero1", ["torch-zero1", "deepspeed-zero1"]),
                     ("ZeRO-2", "zero2", ["fsdp2-zero2", "deepspeed-zero2"]),
                     ("ZeRO-3", "zero3", ["fsdp2-zero3", "deepspeed-zero3"])]
    for section, ours, peers in data_parallel:
        for n in world_sizes:
            add(section, ours, peers, n)
    add("ZeRO-3", "fully-shard", [], world_sizes[0])  # zero3 behind FSDP2's face (its peer is in the rows above)
    # ZeRO++ at 4 ranks as 2 emulated nodes of 2: int8 weight gathers, a secondary copy inside each node, int4
    # gradients by an all-to-all inside the node then across; on the CPU DeepSpeed runs its hpZ alone (its
    # quantizer kernels are CUDA only: zerokit.peers.deepspeed)
    rows.append(Row("ZeRO++", "zeropp", 4, options={"zero_quantized_weights": True, "zero_hpz_partition_size": 2,
                                                    "zero_quantized_gradients": True}, short="qwZ, hpZ 2, qgZ",
                    ranks_per_node=2))
    if _have("deepspeed-zeropp"):
        rows.append(Row("ZeRO++", "deepspeed-zeropp", 4, options={"zero_hpz_partition_size": 2}, peer=True,
                        short="hpZ 2", ranks_per_node=2))
    # ZeRO-3 inside each of 2 emulated nodes of 2 ranks (the default shard group: one node), the gradient shards
    # all-reduced across the nodes
    add("HSDP", "hsdp", ["fsdp2-hsdp"], 4, ranks_per_node=2)
    add("tensor parallel", "tp", ["torch-tp"], 2, parallel={"tp": 2})
    p, m = PIPELINE["stages"], PIPELINE["micro_batches"]
    add("pipeline", "pp", [f"torch-pp-{PIPELINE['schedule']}"], p, parallel={"pp": p},
        options={"schedule": PIPELINE["schedule"]}, micro_batches=m)
    add("dp×tp grid", "zero1", [], 4, parallel={"dp": 2, "tp": 2})
    add("dp×tp grid", "zero3", [], 4, parallel={"dp": 2, "tp": 2})
    add("offload", "zero2", ["deepspeed-zero2-offload"], 2, options={"offload": "optimizer"})
    add("offload", "zero3", ["fsdp2-zero3-offload"], 2, options={"offload": "params"})
    rows.append(Row("checkpointing", "ddp", 2, options={"checkpointing": "every"}))
    rows.append(Row("checkpointing", "ddp", 2, options={"checkpointing": "torch-every"}, peer=True))
    for attention, peer in (("ring", "torch-ring"), ("ulysses", "deepspeed-ulysses")):
        add("context parallel", "ddp", [peer], 2, parallel={"cp": 2}, options={"cp_attention": attention},
            peer_options={peer: {"cp_attention": attention}})
    add("context parallel", "zero3", [], 4, parallel={"dp": 2, "cp": 2}, options={"cp_attention": "ring"})
    add("context parallel", "ddp", [], 4, parallel={"cp": 2, "tp": 2}, options={"cp_attention": "ring"})
    rows.append(Row("expert parallel", "ddp", 2, parallel={"dp": 2, "ep": 2}, model="experts"))
    rows.append(Row("expert parallel", "ddp", 4, parallel={"dp": 4, "ep": 2}, model="experts"))
    rows.append(Row("expert parallel", "zero1", 4, parallel={"dp": 2, "ep": 2, "tp": 2}, model="experts"))
    return rows


def plan(rows: List[Row], workload, steps: int) -> list:
    """``[(row, job), …]``: every row checked (ValueError naming the row) before any process starts."""
    models = {"gpt": workload, "experts": tiny_gpt(**TOUR_WORKLOAD, **TOUR_EXPERTS)}
    jobs = []
    for row in rows:
        try:
            job = make_job(models[row.model], row.strategy, row.world_size, steps, "fp32", "adamw", LR,
                           row.micro_batches, dict(row.options), parallel=row.parallel)
        except ValueError as e:
            raise ValueError(f"tour row {row.section} / {row.strategy} on {row.layout}: {e}") from e
        jobs.append((row, job))
    return jobs


def run(jobs: list, timeout_s: float, progress=None) -> tuple:
    """The reference, then every job; returns (reference, [(row, StrategyResult), …])."""
    device = reference_device(None, max(row.world_size for row, _ in jobs))
    references = {}  # one single-process run per model
    for row, job in jobs:
        if row.model not in references:
            references[row.model] = run_reference(job, device)
    reference = references[jobs[0][0].model]
    results = []
    for row, job in jobs:
        try:
            result = run_job(job, row.world_size, references[row.model], timeout_s=timeout_s,
                             ranks_per_node=row.ranks_per_node)
        except (RankFailed, RankTimeout) as e:
            e.strategy, e.world_size = f"tour row {row.section} / {row.strategy} on {row.layout}", row.world_size
            raise
        results.append((row, result))
        if progress:
            progress(row, result)
    return reference, results


def _kib(x) -> str:
    return "—" if x is None else f"{x / 1024:,.1f}"


def _notes(row: Row, result: StrategyResult, steps: int, without: Optional[StrategyResult] = None) -> str:
    """What the row is there to show, beyond states and traffic: measured, then the formula."""
    rank0 = result.ranks[0]
    if row.section == "pipeline" and rank0.pipeline_spans is not None:
        p, m = PIPELINE["stages"], PIPELINE["micro_batches"]
        ranks = sorted(result.ranks, key=lambda r: r.coords["pp"])
        sched = schedule(PIPELINE["schedule"], p, m)
        bubble = measured(sched, [r.pipeline_spans for r in ranks]).bubble_fraction
        return (f"bubble {bubble:.2f} measured (a rank waiting for a CPU core counts as idle), "
                f"{simulate(sched).bubble_fraction:.2f} simulated (t_b = 2·t_f), (p−1)/(m+p−1) = "
                f"{theory.bubble_fraction(p, m):.2f}")
    if row.section in ("dp×tp grid", "HSDP", "ZeRO++", "context parallel", "expert parallel") and \
            rank0.comm_bytes_by_axis:
        theory_by_axis = rank0.theory_comm_bytes_by_axis or {}
        routed = ""
        if rank0.routing:  # the last forward's slots per expert on rank 0's tokens (layer 0), and what was dropped
            routed = (f"; rank 0's tokens per expert (layer 0) {rank0.routing['tokens_per_expert'][0]}, "
                      f"dropped {sum(rank0.routing['dropped'])}")
        return "by axis, ledger / theory KiB/step: " + ", ".join(
            f"{axis} {_kib(v['ring_cost_bytes'])} / {_kib(theory_by_axis.get(axis))}"
            for axis, v in sorted(rank0.comm_bytes_by_axis.items()) if v.get("calls")) + routed
    if row.section == "offload":
        host = sum((rank0.host_model_state_bytes or {}).values())
        host_theory = rank0.theory_model_states.get("host", {}).get("total")
        moved = rank0.transfer_bytes_per_step or {}
        moved_theory = rank0.theory_transfer_bytes_per_step or {}
        if not host and not moved:
            return "host bytes: not visible to zerokit's ledger in this peer"
        if row.peer and rank0.theory_transfer_bytes_per_step is None:
            return (f"host states {_kib(host)} KiB (theory {_kib(host_theory)}); its device↔host copies are the "
                    f"library's own, not counted")
        return (f"host states {_kib(host)} KiB (theory {_kib(host_theory)}); d2h {_kib(moved.get('d2h'))} / "
                f"h2d {_kib(moved.get('h2d'))} KiB/step (theory {_kib(moved_theory.get('d2h'))} / "
                f"{_kib(moved_theory.get('h2d'))})")
    if row.section == "checkpointing":
        acts = rank0.peak_breakdown.get("activations", 0)
        base = "" if without is None else f" vs {_kib(without.ranks[0].peak_breakdown.get('activations', 0))} without"
        n_layer = TOUR_WORKLOAD["n_layer"]
        recomputed = (f"; {rank0.recomputed_forwards} block forwards recomputed (n_layer·steps = {n_layer * steps})"
                      if rank0.recomputed_forwards else "")
        return f"activations at the peak {_kib(acts)} KiB{base}{recomputed}"
    return ""


# --- why a row's measured figure is not the formula's --------------------------------------------------

@dataclass(frozen=True)
class Why:
    """Why one of a row's measured figures is not the formula's: the sentence printed under the row, and the bytes
    it accounts for — ``states`` on rank 0 (B), ``traffic`` on the busiest rank (B/step) — each computed from the
    library's source-read behaviour and the row's ledger, so that formula + ``explained`` = measured
    (tests/app/test_tour.py holds every row to it). ``|Δp|`` explains a parameter difference over lr·steps."""

    figure: str
    text: str
    explained: float = 0.0


def gaps(row: Row, result: StrategyResult, steps: int) -> dict:
    """The row's measured figures less the formula's, as the table prints them: ``states`` (B, rank 0),
    ``traffic`` (B/step, the busiest rank's ledger less the largest formula), and ``|Δp|``: whether the parameter
    difference exceeds lr·steps, what AdamW's rounding can reach (:func:`legend`)."""
    rank0 = result.ranks[0]
    return {"states": sum(rank0.model_state_bytes.values()) - rank0.theory_model_states["total"],
            "traffic": (max(x.comm_ring_cost_bytes_per_step for x in result.ranks)
                        - max(x.theory_comm_bytes_per_step for x in result.ranks)),
            "|Δp|": result.max_abs_param_diff is not None and result.max_abs_param_diff > LR * steps}


def _busiest(result: StrategyResult):
    return max(result.ranks, key=lambda x: x.comm_ring_cost_bytes_per_step)


def _ledger(rank, steps: int, phase: str, op: str) -> float:
    """The ring cost per step of one rank's ``op`` calls in ``phase`` (the ledger's summary is over the run)."""
    return sum(s["ring_cost_bytes"] for s in rank.comm_summary if s["phase"] == phase and s["op"] == op) / steps


def _zero_redundancy_share(numels: List[int], n: int, rank: int) -> tuple:
    """The elements and tensors ZeroRedundancyOptimizer gives ``rank``: whole tensors, largest first, each to the
    rank holding the fewest elements so far (the lowest such rank on a tie) — torch's ``_partition_parameters``."""
    sizes, tensors = [0] * n, [0] * n
    for numel in sorted(numels, reverse=True):
        least = sizes.index(min(sizes))
        sizes[least] += numel
        tensors[least] += 1
    return sizes[rank], tensors[rank]


def _why_zero_redundancy(row: Row, result: StrategyResult, steps: int) -> List[Why]:
    rank0, n = result.ranks[0], row.world_size
    numels = [p.numel() for p in tiny_gpt(**TOUR_WORKLOAD).build_model().parameters()]
    owned, tensors = _zero_redundancy_share(numels, n, 0)
    states = 8 * owned + 4 * tensors - rank0.theory_model_states["optimizer"]  # fp32 AdamW: m, v and a step each
    busiest = _busiest(result)
    broadcast = _ledger(busiest, steps, "step", "broadcast")
    ddp = _ledger(busiest, steps, "backward", "all_reduce")
    return [Why("states", f"ZeroRedundancyOptimizer shards whole tensors (largest first, to the least loaded "
                          f"rank): rank 0 steps {tensors} tensors, {owned:,} elements, not Ψ/N = "
                          f"{sum(numels) / n:,.0f}: {states:+,} B", states),
            Why("traffic", f"after DDP's all-reduce each owner broadcasts its updated tensors: "
                           f"+{_kib(broadcast)} KiB/step ({(ddp + broadcast) / ddp:.2f}× DDP)", broadcast)]


def _why_deepspeed_partitions(row: Row, result: StrategyResult, steps: int) -> List[Why]:
    """DeepSpeed stages 1 and 2 (runtime/zero/stage_1_and_2.py)."""
    rank0, busiest = result.ranks[0], _busiest(result)
    formula = rank0.theory_model_states
    master = (formula["optimizer"] - formula["step_scalars"]) // 2  # fp32: m and v are 8 B per element, a copy 4
    states = master + 4 - formula["grads"]
    all_reduce = _ledger(busiest, steps, "backward", "all_reduce")
    checks = _ledger(busiest, steps, "step", "all_reduce")
    return [Why("states", f"DeepSpeed frees the gradients at its step ({-formula['grads']:+,} B) and keeps an fp32 "
                          f"copy of its partition, even of an fp32 model, with its Adam step ({master + 4:+,} B)",
                states),
            Why("traffic", f"DeepSpeed all-reduces each bucket where the formula reduce-scatters "
                           f"(use_multi_rank_bucket_allreduce, its default): +{_kib(all_reduce / 2)} KiB/step, "
                           f"{checks:+,.0f} B/step of overflow checks", all_reduce / 2 + checks)]


def _why_deepspeed_stage3(row: Row, result: StrategyResult, steps: int) -> List[Why]:
    """DeepSpeed stage 3 (runtime/zero/stage3.py, partitioned_param_coordinator.py), and its hpZ."""
    rank0, busiest, n = result.ranks[0], _busiest(result), row.world_size
    psi, formula = rank0.param_count, rank0.theory_model_states
    s = row.options.get("zero_hpz_partition_size", 1)
    secondary = theory.hpz_secondary_bytes(psi, s, "fp32") if s > 1 else 0
    hpz = f"; hpZ's secondary copy is freed at each step ({-secondary:+,} B)" if secondary else ""
    one_pass = theory.comm_bytes_per_step(3, psi, n, 4) / 3  # an all-gather of Ψ over the N ranks
    backward_formula = max(x.theory_comm_bytes_per_step for x in result.ranks) - 2 * one_pass
    small = _ledger(busiest, steps, "forward", "broadcast") + _ledger(busiest, steps, "step", "all_reduce")
    regathered = one_pass / steps - backward_formula
    return [Why("states", f"its gradient partitions sit in a private buffer, unseen ({-formula['grads']:+,} B)"
                          f"{hpz}; its Adam step +4 B", 4 - formula["grads"] - secondary),
            Why("traffic", f"it keeps what forward gathered for backward (stage3_max_reuse_distance 1e9 > Ψ): only "
                           f"step 1 gathers again, over all {n} ranks" + (", none inside a node" if secondary else "")
                + f": {regathered / 1024:+,.1f} KiB/step, {small:+,.0f} B/step of small calls", regathered + small)]


def _why_torch_tp(row: Row, result: StrategyResult, steps: int) -> List[Why]:
    t = (row.parallel or {}).get("tp", 1)
    whole = TOUR_WORKLOAD["vocab"] * TOUR_WORKLOAD["d_model"] * 4  # fp32
    extra = whole - whole // t
    return [Why("states", f"torch computes the token embedding's gradient whole (vocab × d) on every rank; the "
                          f"step slices it: {extra:+,} B", extra)]


def _why_pipelining_metadata(row: Row, result: StrategyResult, steps: int) -> List[Why]:
    extra = gaps(row, result, steps)["traffic"]
    return [Why("traffic", f"torch's pipelining sends the stages' tensor metadata (pickled) in its first step: "
                           f"{extra * steps:+,.0f} B over the run", extra)]


def _why_quantized(row: Row, result: StrategyResult, steps: int) -> List[Why]:
    weights, gradients = (theory.block_quantization_relative_bound(bits) for bits in (8, 4))
    return [Why("|Δp|", f"qwZ rounds each gathered weight to int8 (error ≤ absmax/{1 / weights:.0f} per block), "
                        f"qgZ each gradient to int4 (≤ absmax/{1 / gradients:.0f}): quantization, not rounding "
                        f"(lesson 17)")]


#: the rows whose measured figures differ from the formula, and the function that says why
EXPLAINED = {"torch-zero1": _why_zero_redundancy, "deepspeed-zero1": _why_deepspeed_partitions,
             "deepspeed-zero2": _why_deepspeed_partitions, "deepspeed-zero2-offload": _why_deepspeed_partitions,
             "deepspeed-zero3": _why_deepspeed_stage3, "deepspeed-zeropp": _why_deepspeed_stage3,
             "torch-tp": _why_torch_tp, "torch-pp-1f1b": _why_pipelining_metadata, "zeropp": _why_quantized}


def why(row: Row, result: StrategyResult, steps: int) -> List[Why]:
    """The notes of the figures where this row's measurement differs from the formula (none where they agree)."""
    gap = gaps(row, result, steps)
    explain = EXPLAINED.get(row.strategy)
    if explain is None or not (gap["states"] or abs(gap["traffic"]) > 0.5 or gap["|Δp|"]):
        return []
    return [w for w in explain(row, result, steps)
            if (w.figure == "states" and gap["states"]) or (w.figure == "traffic" and abs(gap["traffic"]) > 0.5)
            or (w.figure == "|Δp|" and gap["|Δp|"])]


# --- the table --------------------------------------------------------------------------------------

def _wrapped(text: str, indent: str) -> List[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=False, break_on_hyphens=False)


#: the strategy column's width; the layout and the five figures take the rest of :data:`WIDTH`
_LABEL = 38
_ROW = "{label:<38}{layout:<15}{a:>8}{b:>9}{c:>10}{d:>9}{e:>9}"


def table(results: list, steps: int) -> str:
    """The tour's table, every line within :data:`WIDTH` columns: a heading line per parallelism, then one line
    per row and under a row what it is there to show and, where a measured figure is not the formula's, why
    (the module's docstring says what each column is)."""
    lines = [f"{'strategy':<{_LABEL}}{'dp×tp×pp×cp×ep':<15}{'states KiB':>17}{'traffic KiB/step':>19}"
             f"{'|Δp| vs':>9}",
             _ROW.format(label="", layout="", a="ledger", b="theory", c="ledger", d="theory", e="single"),
             "-" * WIDTH]
    ddp_at_2 = next((r for row, r in results if row.strategy == "ddp" and row.world_size == 2 and not row.options),
                    None)
    section = None
    for row, r in results:
        if row.section != section:
            section = row.section
            lines.append(section)
        rank0 = r.ranks[0]
        states = sum(rank0.model_state_bytes.values())
        traffic = max(x.comm_ring_cost_bytes_per_step for x in r.ranks)
        traffic_theory = max(x.theory_comm_bytes_per_step for x in r.ranks)
        diff = "—" if r.max_abs_param_diff is None else f"{r.max_abs_param_diff:.1e}"
        lines.append(_ROW.format(label=row.label, layout=row.layout, a=_kib(states),
                                 b=_kib(rank0.theory_model_states["total"]), c=_kib(traffic),
                                 d=_kib(traffic_theory), e=diff))
        indent = "      " if row.peer else "  "
        note = _notes(row, r, steps, ddp_at_2)
        if note:
            lines += _wrapped(note, indent)
        for w in why(row, r, steps):
            lines += _wrapped(f"why {w.figure}: {w.text}", indent)
    return "\n".join(lines)


def legend(psi: int, steps: int) -> List[str]:
    """The footers, each wrapped to :data:`WIDTH` columns."""
    paragraphs = [
        "states: rank 0's parameters, gradients and optimizer states on the device after the last step, from the "
        "memory ledger (ledger) and from zerokit.theory's formula for the layout (theory).",
        "traffic: the busiest rank's collectives per step — each call's measured payload through the ring formula "
        "(ledger) — next to the theory's bytes for Ψ and the layout. A peer's private buffers and shared-memory "
        "collectives (DeepSpeed on CPU) are not seen by the ledgers; a \"why\" line under a row says what its "
        "library does that the formula does not.",
        "|Δp|: largest parameter difference from one process training the same model on the same data. The "
        "gradients agree to float32 rounding (their sums run in another order); AdamW divides by √v, which turns "
        "rounding in a gradient that should be zero (an attention key bias) into steps of up to lr, so anything "
        f"under lr·steps = {LR * steps:g} can be rounding; more is the row's own doing, and its \"why\" line says "
        "what (ZeRO++ quantizes). tests/ hold each strategy to bounds derived per case.",
        f"DDP holds 16Ψ = {16 * psi / 1024:,.1f} KiB of model states per rank (fp32 AdamW), plus 4 B per tensor for "
        f"Adam's step; the peers' ledgers miss what a library keeps privately.",
        "dp×tp×pp×cp×ep: the mesh's degree on each axis; the ranks are dp·tp·pp·cp, ep is carved out of dp (its "
        "experts spread over ep of the dp ranks).",
    ]
    return [line for text in paragraphs for line in _wrapped(text, "")]


NEXT = [
    "Where next:",
    "  make lab                                  the course, lesson 00 onwards, every lesson run for real",
    "  zerokit compare --help                    your own model (FILE.py:FUNC), strategies side by side",
    "  zerokit plan --preset llama-7b --gpus 64  the same formulas for a real model on a real cluster",
    "  zerokit bench --help                      step time and peak memory against torch and DeepSpeed",
]


def prepare(world_sizes, steps: int) -> tuple:
    """The workload and every row's checked job, ``(workload, [(row, job), …])``; a row that cannot run raises
    ValueError naming it, before any process starts."""
    workload = tiny_gpt(**TOUR_WORKLOAD)
    return workload, plan(tour_rows(world_sizes), workload, steps)


#: a rank's line that is DeepSpeed setting itself up, not the tour: its CPU communication op loaded
#: (``[r0] DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully``) and its logger's INFO and WARNING
#: lines (``[r0] [2026-01-01 00:00:00,000] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator
#: to CPU…``)
DEEPSPEED_CHATTER = re.compile(r"\[r\d+\] (DeepSpeed \S+ built successfully$|\[\d{4}-\d\d-\d\d [\d:,.]+\] "
                               r"\[(INFO|WARNING)\] )")


class _Lines:
    """One of ``sys.stdout`` / ``sys.stderr`` while the tour runs: text cut into whole lines for :class:`Terminal`."""

    def __init__(self, terminal: "Terminal", stream):
        self.terminal, self.stream, self.pending = terminal, stream, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.terminal.line(line, self.stream)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def finish(self) -> None:
        if self.pending:
            self.terminal.line(self.pending, self.stream)
            self.pending = ""
        self.stream.flush()

    def __getattr__(self, name):  # encoding, isatty, fileno…: the stream's own
        return getattr(self.stream, name)


class Terminal:
    """Where the tour's text goes while it runs. Lifecycle: entering replaces ``sys.stdout`` and ``sys.stderr``
    with a :class:`_Lines` each, so the tour's own lines and those the launcher forwards from the ranks
    (:mod:`zerokit.runtime.output`, which looks the streams up at every write) pass through :meth:`line` whole;
    DeepSpeed's set-up chatter (:data:`DEEPSPEED_CHATTER`) is held back in :attr:`held`, every other line goes out
    and is kept in :attr:`printed`. Leaving puts the streams back; when a run failed, the held lines go out too
    (to stderr), since then they may be the clue."""

    def __init__(self):
        self.printed: List[str] = []
        self.held: List[str] = []

    def __enter__(self) -> "Terminal":
        self._saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Lines(self, sys.stdout), _Lines(self, sys.stderr)
        return self

    def __exit__(self, kind, error, traceback) -> None:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, _Lines):
                stream.finish()
        sys.stdout, sys.stderr = self._saved
        if error is not None and self.held:
            sys.stderr.write("".join(line + "\n" for line in self.held))

    def line(self, text: str, stream) -> None:
        if DEEPSPEED_CHATTER.match(text):
            self.held.append(text)
            return
        self.printed.append(text)
        stream.write(text + "\n")


class TourRun(list):
    """``[(row, StrategyResult), …]`` as :func:`main` returns it, with every line it printed (``printed``) and the
    ranks' lines it held back (``held``): ``zerokit tour`` keeps it whole (:mod:`zerokit.tour_results`), so the
    tests read the output `make tour` showed."""

    def __init__(self, results=(), printed=(), held=()):
        super().__init__(results)
        self.printed, self.held = list(printed), list(held)


def main(prepared: tuple, steps: int, timeout_s: float, out=print) -> TourRun:
    """Run the rows :func:`prepare` made, print the table, every line within :data:`WIDTH` columns;
    ``out(text, flush=…)`` prints (``print`` by default: what goes through ``sys.stdout`` is filtered by
    :class:`Terminal` and kept). Returns the :class:`TourRun`."""
    start = time.perf_counter()
    workload, jobs = prepared
    rows = [row for row, _ in jobs]
    psi = workload.param_count()
    with Terminal() as terminal:
        for text in (f"zerokit tour — {workload.description}",
                     f"Ψ = {psi:,} parameters; fp32 AdamW, {steps} steps; {len(rows)} runs, each against one "
                     f"single-process reference."):
            for line in _wrapped(text, ""):
                out(line)
        if not _have("deepspeed-zero1"):
            out("(DeepSpeed is not installed: its rows are left out; `make install` installs it)")
        started = []

        def progress(row, result):  # one word per parallelism as its runs finish, so a minute is not silent
            if row.section not in started:
                started.append(row.section)
                out(("running: " if len(started) == 1 else "         ") + row.section, flush=True)

        _, results = run(jobs, timeout_s, progress)
        if terminal.held:
            for line in _wrapped(f"(held back: {len(terminal.held)} lines DeepSpeed's ranks printed setting up — its "
                                 f"CPU op built, its logger's notices)", ""):
                out(line)
        out("")
        out(table(results, steps))
        out("")
        for line in legend(psi, steps):
            out(line)
        out("")
        for line in NEXT:
            out(line)
        out(f"\ntour finished in {time.perf_counter() - start:.1f} s")
    return TourRun(results, terminal.printed, terminal.held)
