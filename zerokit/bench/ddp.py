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

Timing runs use ``track_peak=False`` and no reference (the runner is
:mod:`zerokit.bench.rounds`). Absolute times depend on the machine; the ratios are the
result. Ratios to torch DDP are paired round by round (:func:`add_ratios`). Peak bytes per
rank come from one extra run of ``ddp`` and torch DDP per bucket size with the memory
ledger's hooks (``track_peak=True``), printed as a ratio next to the time's. The output
ends with the load average and the noise of the run (IQR / median of the step times).
"""
from __future__ import annotations

import json
import sys
import time

from ..workloads import tiny_gpt
from . import median, ratio, suite_parser
from .rounds import paired_ratio, peak_ratio, run_rounds
from .table import conditions, load_average, machine, mib, ms, progress_log, table

#: the tiny GPT of the sweep (zerokit.tiny_gpt's defaults: about 0.93 M parameters, 3.6 MiB of fp32 gradients)
SWEEP_GPT = dict(vocab=512, seq_len=64, d_model=128, n_layer=4, n_head=4, batch_size=8)
#: communication-heavy: 4× the parameters (and bytes reduced) of the sweep's GPT for half its tokens per step,
#: so about twice the bytes per FLOP, with enough backward left to hide a bucket's all-reduce behind
HEAVY_GPT = dict(vocab=1024, seq_len=32, d_model=256, n_layer=4, n_head=4, batch_size=8)

PEER = "torch-ddp"
#: the sweep's configurations whose peak bytes are measured (one extra run each, per bucket size)
PEAK_LABELS = ("ddp overlap=on", PEER)


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


def add_ratios(rows) -> None:
    """Each row's step time over torch DDP's at the same world size and bucket size (naive: the median peer),
    and its peak bytes per rank over torch DDP's.

    The time ratio is paired: round by round, this configuration's time over the peer's in the same round
    (they ran minutes apart at most), and the median of those ratios, so slow drift of a shared machine
    cancels. ``vs_torch_ddp_of_medians`` is the plain ratio of the two medians, for comparison.
    """
    for row in rows:
        peers = [p for p in rows if p["label"] == PEER and p["world_size"] == row["world_size"]
                 and (row["key"] is None or p["key"] == row["key"])]
        row["vs_torch_ddp"] = paired_ratio(row, peers)
        row["vs_torch_ddp_of_medians"] = ratio(row["step_s"], median([p["step_s"] for p in peers])) if peers else None
        row["peak_vs_torch_ddp"] = peak_ratio(row, peers[0]) if len(peers) == 1 else None


COLUMNS = [("N", "world_size", "d"), ("bucket MiB", lambda r: r["key"], "g"), ("strategy", "label", "s"),
           ("step ms", "step_s", ms), ("× torch-ddp", "vs_torch_ddp", ".2f"),
           ("exposed ms/step", "exposed_s", ms), ("IQR/median", "noise", ".2f"), ("calls/step", "calls", ".1f"),
           ("peak MiB", "peak", mib), ("peak × torch-ddp", "peak_vs_torch_ddp", ".3f")]


def summary(sweep, heavy) -> dict:
    out = {}
    ours = [r for r in sweep if r["label"] == "ddp overlap=on"]
    if ours:
        out["ddp_vs_torch_ddp"] = {f"N={r['world_size']} bucket={r['key']:g}": round(r["vs_torch_ddp"], 3)
                                   for r in ours}
        out["ddp_peak_vs_torch_ddp"] = {f"N={r['world_size']} bucket={r['key']:g}": round(r["peak_vs_torch_ddp"], 4)
                                        for r in ours if r["peak_vs_torch_ddp"] is not None}
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


def build_parser():
    parser = suite_parser("ddp", __doc__, steps=12, rounds=3, json="every run and the summary",
                          steps_help="steps per run (the first is left out of the median)")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--bucket-mb", type=float, nargs="+", default=[0.25, 1.0, 4.0, 32.0])
    parser.add_argument("--heavy-bucket-mb", type=float, default=1.0,
                        help="bucket size of the communication-heavy overlap comparison")
    parser.add_argument("--no-heavy", action="store_true", help="skip the communication-heavy overlap comparison")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for mb in args.bucket_mb + [args.heavy_bucket_mb]:
        if not mb > 0:
            raise ValueError(f"--bucket-mb {mb:g}: bucket sizes must be positive MiB")
    if args.steps < 2 or args.rounds < 1:
        raise ValueError("--steps must be at least 2 and --rounds at least 1")
    log = progress_log(args.quiet)
    start, start_machine, start_load = time.perf_counter(), machine(), load_average()
    sweep_work, heavy_work = tiny_gpt(**SWEEP_GPT), tiny_gpt(**HEAVY_GPT)
    sweep = run_rounds(sweep_work, args.world_sizes, lambda n: sweep_configs(args.bucket_mb), args.steps,
                       args.rounds, args.timeout, log, peak=lambda e: e.label in PEAK_LABELS)
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
    print(f"zerokit bench ddp — fp32 AdamW, gloo on CPU, 1 thread per rank, {args.steps} steps × {args.rounds} "
          f"interleaved rounds; {start_machine}")
    print(table(f"\nsweep: {sweep_work.description}; Ψ = {sweep_work.param_count():,}", COLUMNS, sweep))
    if heavy:
        print(table(f"\ncommunication-heavy: {heavy_work.description}; Ψ = {heavy_work.param_count():,}",
                    COLUMNS, heavy))
    print("(exposed: seconds per step the compute thread was blocked on collectives, from the ledger; — for torch "
          "DDP, whose reducer waits inside C++ where the ledger cannot see; peak: busiest rank, one run with the "
          "memory ledger's hooks)")
    result = summary(sweep, heavy)
    print("\nsummary:", json.dumps(result, indent=2))
    print(conditions(sweep + heavy, start_load,
                     lambda r: f"N={r['world_size']} {r['label']} bucket {r['key']}"))
    print(f"bench finished in {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": list(argv or []), "machine": start_machine, "sweep_workload": SWEEP_GPT,
                       "heavy_workload": HEAVY_GPT, "sweep": sweep, "heavy": heavy, "summary": result}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
