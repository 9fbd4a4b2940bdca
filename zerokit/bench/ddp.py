"""``zerokit bench ddp``: zerokit's data parallelism against torch DDP, in step-time ratios.

Two parts, both interleaved (every configuration runs once per round, the order
rotating between rounds) so that drift on a shared machine hits all alike:

1. **Sweep.** The tiny GPT at each world size and bucket size: ``ddp-naive``,
   ``ddp-bucketed``, ``ddp`` with overlap on and off, and ``torch-ddp`` with the same
   bucket size. Reported: the median over rounds of each run's median step time, its
   ratio to torch DDP's, and the exposed communication per step (seconds the compute
   thread was blocked on collectives, from the ledger; torch DDP waits inside its
   reducer, so the ledger cannot see its exposed time).
2. **Overlap.** A communication-heavy GPT (four times the parameters for half the
   tokens): ``ddp`` with overlap on and off, the exposed communication of each.

Timing runs use ``track_peak=False`` and no reference. Absolute times depend on the
machine; the ratios are the result. Ratios to torch DDP are paired round by round
(:func:`add_ratios`).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

from . import median, ratio

#: the tiny GPT of the sweep (zerokit.tiny_gpt's defaults: about 0.93 M parameters, 3.6 MiB of fp32 gradients)
SWEEP_GPT = dict(vocab=512, seq_len=64, d_model=128, n_layer=4, n_head=4, batch_size=8)
#: communication-heavy: 4× the parameters (and bytes reduced) of the sweep's GPT for half its tokens per step,
#: so about twice the bytes per FLOP, with enough backward left to hide a bucket's all-reduce behind
HEAVY_GPT = dict(vocab=1024, seq_len=32, d_model=256, n_layer=4, n_head=4, batch_size=8)

PEER = "torch-ddp"


def sweep_configs(bucket_sizes):
    """(label, strategy, options, bucket) for every run of one round at one world size."""
    configs = [("ddp-naive", "ddp-naive", {}, None)]
    for mb in bucket_sizes:
        configs += [
            ("ddp-bucketed", "ddp-bucketed", {"bucket_mb": mb}, mb),
            ("ddp overlap=on", "ddp", {"bucket_mb": mb, "overlap": True}, mb),
            ("ddp overlap=off", "ddp", {"bucket_mb": mb, "overlap": False}, mb),
            (PEER, PEER, {"bucket_mb": mb}, mb),
        ]
    return configs


def _rank_with_exposure(ctx, job):
    """Train on this rank (``zerokit.train``'s loop), then read how long each step was blocked on collectives.

    The ledger keeps every record whether or not ``keep_records`` is set, so the
    timing run needs no tracer (its module hooks would cost time).
    """
    from ..runtime import comm
    from ..train import run_rank

    result = run_rank(ctx, job)
    blocked = [0.0] * job.steps
    for record in comm.ledger().select():  # setup excluded
        blocked[record.step] += record.blocked_s
    return result, blocked


def measure(workload, strategy: str, world_size: int, steps: int, options: dict, timeout_s: float) -> dict:
    """One run: median step time of the slowest rank, median exposed communication per step (averaged
    over the ranks), calls and ring cost (the ring formula on the measured payloads) per step; the first (warm-up) step is left out of both medians."""
    from ..runtime.launch import launch
    from ..report import StrategyResult
    from ..train import make_job

    job = make_job(workload, strategy, world_size, steps, "fp32", "adamw", 1e-3, 1, options, track_peak=False)
    out = launch(_rank_with_exposure, world_size, job, timeout_s=timeout_s)
    result = StrategyResult.from_ranks(job, [rank for rank, _ in out], None)
    exposed = [sum(blocked[s] for _, blocked in out) / world_size for s in range(steps)]
    return {"step_s": result.step_time_s_median, "exposed_s": median(exposed[1:]),
            "calls": result.ranks[0].comm_calls_per_step, "ring_cost_bytes": result.ranks[0].comm_ring_cost_bytes_per_step}


def run_rounds(workload, world_sizes, configs_for, steps: int, rounds: int, timeout_s: float, log) -> list:
    """Run every (world size, config) once per round, rotating the order; return one row per config."""
    plan = [(n, c) for n in world_sizes for c in configs_for(n)]
    samples = {i: [] for i in range(len(plan))}
    for r in range(rounds):
        shift = (r * max(1, len(plan) // rounds)) % len(plan)
        order = list(range(len(plan)))[shift:] + list(range(len(plan)))[:shift]
        for i in order:
            n, (label, strategy, options, bucket) = plan[i]
            samples[i].append(measure(workload, strategy, n, steps, options, timeout_s))
            log(f"round {r + 1}/{rounds}: N={n} {label:<16} bucket={bucket} "
                f"{1000 * samples[i][-1]['step_s']:.1f} ms")
    rows = []
    for i, (n, (label, strategy, options, bucket)) in enumerate(plan):
        runs = samples[i]
        rows.append({"world_size": n, "label": label, "strategy": strategy, "options": options,
                     "bucket_mb": bucket, "step_s": median([s["step_s"] for s in runs]),
                     "exposed_s": median([s["exposed_s"] for s in runs]), "calls": runs[0]["calls"],
                     "ring_cost_bytes": runs[0]["ring_cost_bytes"], "runs": runs})
    return rows


def add_ratios(rows) -> None:
    """Each row's step time over torch DDP's at the same world size and bucket size (naive: the median peer).

    The ratio is paired: round by round, this configuration's time over the peer's in the same round
    (they ran minutes apart at most), and the median of those ratios, so slow drift of a shared machine
    cancels. ``vs_torch_ddp_of_medians`` is the plain ratio of the two medians, for comparison.
    """
    for row in rows:
        peers = [p for p in rows if p["label"] == PEER and p["world_size"] == row["world_size"]
                 and (row["bucket_mb"] is None or p["bucket_mb"] == row["bucket_mb"])]
        if not peers:
            row["vs_torch_ddp"] = row["vs_torch_ddp_of_medians"] = None
            continue
        per_round = [ratio(run["step_s"], median([p["runs"][r]["step_s"] for p in peers]))
                     for r, run in enumerate(row["runs"])]
        row["vs_torch_ddp"] = median(per_round)
        row["vs_torch_ddp_of_medians"] = ratio(row["step_s"], median([p["step_s"] for p in peers]))


def table(rows, title: str) -> str:
    lines = [title, f"{'N':>2} {'bucket MiB':>10}  {'strategy':<16} {'step ms':>8} {'× torch-ddp':>11} "
                    f"{'exposed ms/step':>15} {'calls/step':>10}"]
    for row in rows:
        bucket = "—" if row["bucket_mb"] is None else f"{row['bucket_mb']:g}"
        vs = "—" if row.get("vs_torch_ddp") is None else f"{row['vs_torch_ddp']:.2f}"
        exposed = "—" if row["strategy"] == PEER else f"{1000 * row['exposed_s']:.1f}"
        lines.append(f"{row['world_size']:>2} {bucket:>10}  {row['label']:<16} {1000 * row['step_s']:>8.1f} "
                     f"{vs:>11} {exposed:>15} {row['calls']:>10.1f}")
    return "\n".join(lines)


def summary(sweep, heavy) -> dict:
    out = {}
    ours = [r for r in sweep if r["label"] == "ddp overlap=on"]
    if ours:
        out["ddp_vs_torch_ddp"] = {f"N={r['world_size']} bucket={r['bucket_mb']:g}": round(r["vs_torch_ddp"], 3)
                                   for r in ours}
        out["ddp_vs_torch_ddp_median"] = median([r["vs_torch_ddp"] for r in ours])
        out["ddp_vs_torch_ddp_max"] = max(r["vs_torch_ddp"] for r in ours)
    for n in sorted({r["world_size"] for r in heavy}):
        on = next(r for r in heavy if r["world_size"] == n and r["label"] == "ddp overlap=on")
        off = next(r for r in heavy if r["world_size"] == n and r["label"] == "ddp overlap=off")
        out[f"heavy_N={n}"] = {"exposed_ms_on": 1000 * on["exposed_s"], "exposed_ms_off": 1000 * off["exposed_s"],
                               "exposed_on_over_off": ratio(on["exposed_s"], off["exposed_s"]),
                               "step_on_over_off": ratio(on["step_s"], off["step_s"]),
                               "ddp_vs_torch_ddp": on.get("vs_torch_ddp")}
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerokit bench ddp", description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--bucket-mb", type=float, nargs="+", default=[0.25, 1.0, 4.0, 32.0])
    parser.add_argument("--steps", type=int, default=12, help="steps per run (the first is left out of the median)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions of every configuration")
    parser.add_argument("--heavy-bucket-mb", type=float, default=1.0,
                        help="bucket size of the communication-heavy overlap comparison")
    parser.add_argument("--no-heavy", action="store_true", help="skip the communication-heavy overlap comparison")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run before it counts as hung")
    parser.add_argument("--json", metavar="FILE", help="also write every run and the summary to FILE")
    parser.add_argument("--quiet", action="store_true", help="no per-run progress lines")
    return parser


def main(argv=None) -> int:
    from ..workloads import tiny_gpt

    args = build_parser().parse_args(argv)
    for mb in args.bucket_mb + [args.heavy_bucket_mb]:
        if not mb > 0:
            raise ValueError(f"--bucket-mb {mb:g}: bucket sizes must be positive MiB")
    if args.steps < 2 or args.rounds < 1:
        raise ValueError("--steps must be at least 2 and --rounds at least 1")
    log = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    start = time.perf_counter()
    sweep_work, heavy_work = tiny_gpt(**SWEEP_GPT), tiny_gpt(**HEAVY_GPT)
    sweep = run_rounds(sweep_work, args.world_sizes, lambda n: sweep_configs(args.bucket_mb), args.steps,
                       args.rounds, args.timeout, log)
    add_ratios(sweep)
    heavy = []
    if not args.no_heavy:
        mb = args.heavy_bucket_mb
        heavy = run_rounds(heavy_work, args.world_sizes,
                           lambda n: [("ddp overlap=on", "ddp", {"bucket_mb": mb, "overlap": True}, mb),
                                      ("ddp overlap=off", "ddp", {"bucket_mb": mb, "overlap": False}, mb),
                                      (PEER, PEER, {"bucket_mb": mb}, mb)],
                           args.steps, args.rounds, args.timeout, log)
        add_ratios(heavy)
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs, 1 thread per rank, torch {torch.__version__}, "
               + "load average %.2f %.2f %.2f" % os.getloadavg())
    print(f"zerokit bench ddp — fp32 AdamW, gloo on CPU, {args.steps} steps × {args.rounds} interleaved rounds; "
          f"{machine}")
    print(table(sweep, f"\nsweep: {sweep_work.description}; Ψ = {sweep_work.param_count():,}"))
    if heavy:
        print(table(heavy, f"\ncommunication-heavy: {heavy_work.description}; Ψ = {heavy_work.param_count():,}"))
    result = summary(sweep, heavy)
    print("\nsummary:", json.dumps(result, indent=2))
    print(f"bench finished in {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": list(argv or []), "machine": machine, "sweep_workload": SWEEP_GPT,
                       "heavy_workload": HEAVY_GPT, "sweep": sweep, "heavy": heavy, "summary": result}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
