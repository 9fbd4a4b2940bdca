"""Interleaved rounds: every configuration of a suite runs once per round, the order rotating between rounds.

Drift on a shared machine then hits every configuration alike. The lifecycle of a suite's run:

1. **plan**: a list of :class:`Entry` (workload, world size, label, strategy, options);
2. **rounds**: each round runs every entry once (:func:`measure`: ``track_peak=False``, no
   reference), starting one place further along the plan each round; a run reports the
   step time of the slowest rank at every step (the first, warm-up, step left out), and the
   seconds per step each rank's compute thread was blocked on collectives (the ledger's
   ``blocked_s``: the exposed communication) and, behind an emulated link, the link's
   seconds per step for the busiest rank (``emulated_s``, a formula: 0 without a link);
3. **peaks**: once per entry (when asked), a short run with the memory ledger's module and
   gradient hooks (``track_peak=True``, not timed: the hooks cost time) gives the peak bytes
   of the busiest rank (:func:`measure_peak`);
4. **rows**: per entry, the median over rounds of each run's median step time, the median
   exposed communication, the noise (IQR / median of all its steps) and the peak.

A peer's exposed communication is reported only when the ledger saw all of it: a library
that waits on its asynchronous collectives inside itself (torch DDP's reducer, FSDP2's
streams) leaves no blocked seconds on those records, so its exposed time is None, not 0.
``options`` may carry ``micro_batches`` (the job's, not the strategy's) and ``link``
(an emulated link, :mod:`zerokit.runtime.link`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional

from ..report import StrategyResult
from ..runtime import comm
from ..runtime.launch import launch
from ..strategies.base import get
from ..train import make_job, run_rank
from . import median
from .table import noise

PEAK_STEPS = 3  # step 2 has the optimizer states; torch DDP rebuilds its buckets at step 2 (its hook sees them in step 3)


@dataclass
class Entry:
    workload: object
    world_size: int
    label: str
    strategy: str
    options: dict = field(default_factory=dict)
    #: what the suite sorts or pairs by (a bucket size, a model size, a bandwidth)
    key: object = None


def _rank_with_exposure(ctx, job):
    """Train on this rank (``zerokit.train``'s loop), then read how long each step was blocked on collectives,
    and whether an asynchronous collective was never waited on by zerokit (its exposed part unseen)."""
    result = run_rank(ctx, job)
    blocked, emulated = [0.0] * job.steps, [0.0] * job.steps
    unseen = False
    for record in comm.ledger().select():  # setup excluded
        blocked[record.step] += record.blocked_s
        emulated[record.step] += getattr(record, "emulated_s", 0.0)
        unseen = unseen or (record.async_op and record.blocked_s == 0.0 and record.op not in ("send",))
    return result, (blocked, emulated), unseen


def _job(entry: Entry, steps: int, track_peak: bool):
    options = dict(entry.options)
    micro_batches = options.pop("micro_batches", 1)
    return make_job(entry.workload, entry.strategy, entry.world_size, steps, "fp32", "adamw", 1e-3, micro_batches,
                    options, track_peak=track_peak)


def measure(entry: Entry, steps: int, timeout_s: float) -> dict:
    """One timing run: per-step times of the slowest rank and exposed communication (mean over ranks), both
    without the first step; calls and ring cost per step of rank 0."""
    job = _job(entry, steps, track_peak=False)
    out = launch(_rank_with_exposure, entry.world_size, job, timeout_s=timeout_s)
    result = StrategyResult.from_ranks(job, [rank for rank, _, _ in out], None)
    ranks = result.ranks
    times = [max(r.step_times_s[s] for r in ranks) for s in range(1, steps)]
    exposed = [sum(blocked[s] for _, (blocked, _), _ in out) / len(out) for s in range(1, steps)]
    link = [max(emulated[s] for _, (_, emulated), _ in out) for s in range(1, steps)]
    seen = not (getattr(get(entry.strategy), "peer", False) and any(unseen for _, _, unseen in out))
    return {"step_s": median(times), "times": times, "exposed_s": median(exposed) if seen else None,
            "link_s": median(link), "calls": ranks[0].comm_calls_per_step,
            "ring_cost_bytes": ranks[0].comm_ring_cost_bytes_per_step}


def measure_peak(entry: Entry, timeout_s: float) -> dict:
    """Peak bytes of the busiest rank over :data:`PEAK_STEPS` steps, with the ledger's split at that moment."""
    ranks = launch(run_rank, entry.world_size, _job(entry, PEAK_STEPS, track_peak=True), timeout_s=timeout_s)
    busiest = max(ranks, key=lambda r: r.peak_bytes)
    return {"peak": busiest.peak_bytes, "peak_where": busiest.peak_where, "peak_breakdown": busiest.peak_breakdown}


def run_plan(plan: List[Entry], steps: int, rounds: int, timeout_s: float, log: Callable[[str], None],
             peak: Optional[Callable[[Entry], bool]] = None) -> list:
    """Every entry once per round (rotating order), then the peaks of those ``peak`` accepts; one row per entry."""
    samples: dict = {i: [] for i in range(len(plan))}
    for r in range(rounds):
        shift = (r * max(1, len(plan) // rounds)) % len(plan)
        order = list(range(len(plan)))[shift:] + list(range(len(plan)))[:shift]
        for i in order:
            e = plan[i]
            samples[i].append(measure(e, steps, timeout_s))
            log(f"round {r + 1}/{rounds}: N={e.world_size} {e.label:<20} {'' if e.key is None else e.key} "
                f"{1000 * samples[i][-1]['step_s']:.1f} ms")
    rows, sizes = [], {}
    for i, e in enumerate(plan):
        if id(e.workload) not in sizes:
            sizes[id(e.workload)] = e.workload.param_count()
        runs = samples[i]
        exposed = [s["exposed_s"] for s in runs]
        row = {"world_size": e.world_size, "label": e.label, "strategy": e.strategy, "options": e.options,
               "key": e.key, "param_count": sizes[id(e.workload)],
               "step_s": median([s["step_s"] for s in runs]),
               "exposed_s": None if None in exposed else median(exposed),
               "link_s": median([s["link_s"] for s in runs]),
               "noise": noise([t for s in runs for t in s["times"]]), "calls": runs[0]["calls"],
               "ring_cost_bytes": runs[0]["ring_cost_bytes"], "peak": None, "runs": runs}
        if peak is not None and peak(e):
            row.update(measure_peak(e, timeout_s))
            log(f"peak: N={e.world_size} {e.label:<20} {row['peak']:,} B ({row['peak_where']})")
        rows.append(row)
    return rows


def run_rounds(workload, world_sizes, configs_for, steps: int, rounds: int, timeout_s: float, log,
               peak: Optional[Callable[[Entry], bool]] = None) -> list:
    """:func:`run_plan` over ``configs_for(n)`` — (label, strategy, options, key) — at every world size."""
    plan = [Entry(workload, n, label, strategy, options, key)
            for n in world_sizes for label, strategy, options, key in configs_for(n)]
    return run_plan(plan, steps, rounds, timeout_s, log, peak)


def paired_ratio(row: dict, peers: list, field_name: str = "step_s") -> Optional[float]:
    """Median over rounds of (this row's run / the peers' median run in the same round): drift that hits the
    round hits both, and cancels."""
    if not peers:
        return None
    return median([run[field_name] / median([p["runs"][r][field_name] for p in peers])
                   for r, run in enumerate(row["runs"])])


def peak_ratio(row: dict, peer: dict) -> Optional[float]:
    """Peak bytes per rank, this row over the peer's (None where either was not measured)."""
    if row.get("peak") is None or peer.get("peak") is None or not peer["peak"]:
        return None
    return row["peak"] / peer["peak"]
