"""``zerokit bench zero``: zerokit's ZeRO stages against their peers, in step-time ratios.

Every configuration runs once per round, the order rotating between rounds, so drift
on a shared machine hits all alike (the runner is ``zerokit.bench.ddp``'s). On the tiny
GPT at each world size:

- ``zero1`` against ``torch-zero1`` (ZeroRedundancyOptimizer on torch DDP);
- ``zero2`` against ``fsdp2-zero2`` (fully_shard, reshard_after_forward=False) and
  ``deepspeed-zero2``;
- ``zero3`` against ``fsdp2-zero3`` and ``deepspeed-zero3``, all three on the same units
  (zerokit's ``zero3`` units get ``fully_shard``; DeepSpeed gathers per module anyway);
- ``fully-shard`` (``zerokit.fully_shard`` on every block and the root, a torch optimizer on
  its shard parameters) against ``fsdp2-zero3``: FSDP2's own convention on both sides;
- ``hsdp`` against ``fsdp2-hsdp`` (``fully_shard`` on a 2-D mesh) at 4 ranks and above, in shard
  groups of half the ranks (2 replicas), on the same units;
- ``zero3`` with ``prefetch=False``: the exposed communication per step (seconds the
  compute thread was blocked on collectives, from the ledger) with and without prefetch.

DeepSpeed runs only if it is installed. Timing runs use ``track_peak=False`` and no
reference (:mod:`zerokit.bench.rounds`). Reported: the median over rounds of each run's
median step time, and the ratios zerokit / peer (below 1.0 is faster, paired round by
round), of step time and of peak bytes per rank (one extra run per configuration with the
memory ledger's hooks). Absolute times depend on the machine; the output ends with the
load average and the noise (IQR / median of the step times).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from ..peers.deepspeed import deepspeed_available
from ..workloads import tiny_gpt
from . import suite_parser
from .ddp import SWEEP_GPT
from .rounds import paired_ratio, peak_ratio, run_rounds
from .table import conditions, load_average, machine, mib, ms, progress_log, table

#: (zerokit's strategy, its peers)
PAIRS = [("zero1", ["torch-zero1"]), ("zero2", ["fsdp2-zero2", "deepspeed-zero2"]),
         ("zero3", ["fsdp2-zero3", "deepspeed-zero3"]), ("fully-shard", ["fsdp2-zero3"]), ("hsdp", ["fsdp2-hsdp"])]
#: HSDP runs at this many ranks and above (below, its shard group would be one rank or all of them)
HSDP_FROM = 4


def configs(with_deepspeed: bool, unit_size="block", only=None, world_size=None):
    """(label, strategy, options, note) for every run of one round at ``world_size`` ranks; ``unit_size`` goes to
    zero3, hsdp and FSDP2; hsdp and fsdp2-hsdp shard over half the ranks, from :data:`HSDP_FROM` ranks on."""
    def options(name):
        out = {"unit_size": unit_size} if name in ("zero3", "hsdp") or name.startswith("fsdp2") else {}
        return {**out, "shard_group_size": world_size // 2} if name in ("hsdp", "fsdp2-hsdp") else out

    out = []
    for ours, peers in PAIRS:  # a peer in two pairs (fsdp2-zero3) runs once
        if ours == "hsdp" and (world_size is None or world_size < HSDP_FROM):
            continue
        out += [(name, name, options(name), None) for name in [ours, *peers]
                if (with_deepspeed or not name.startswith("deepspeed")) and name not in [c[0] for c in out]]
    out.append(("zero3 prefetch=off", "zero3", {**options("zero3"), "prefetch": False}, None))
    return [c for c in out if only is None or c[0] in only]


def add_ratios(rows) -> dict:
    """Per world size and pair: step time zerokit / peer (paired round by round) and peak bytes per rank
    zerokit / peer, set on the peer's row too (``vs_ours``, ``peak_vs_ours``: the ratio of that pair)."""
    ratios = {}
    for n in sorted({r["world_size"] for r in rows}):
        at = {r["label"]: r for r in rows if r["world_size"] == n}
        for ours, peers in PAIRS:
            for peer in peers:
                if ours in at and peer in at:
                    a, b = at[ours], at[peer]
                    time_ratio, peak = paired_ratio(a, [b]), peak_ratio(a, b)
                    if "vs_ours" not in b:  # a peer in two pairs shows its first pair's in the table; both in ratios
                        b["vs_ours"], b["peak_vs_ours"] = time_ratio, peak
                    ratios[f"N={n} {ours}/{peer}"] = {"time": _round(time_ratio), "peak": _round(peak)}
        if "zero3" in at and "zero3 prefetch=off" in at:
            on, off = at["zero3"], at["zero3 prefetch=off"]
            ratios[f"N={n} zero3 exposed ms/step prefetch on/off"] = [round(1000 * on["exposed_s"], 2),
                                                                     round(1000 * off["exposed_s"], 2)]
    return ratios


def _round(x):
    return None if x is None else round(x, 3)


COLUMNS = [("N", "world_size", "d"), ("strategy", "label", "s"), ("step ms", "step_s", ms),
           ("zerokit/this time", "vs_ours", ".2f"), ("zerokit/this peak", "peak_vs_ours", ".3f"),
           ("exposed ms/step", "exposed_s", ms), ("IQR/median", "noise", ".2f"), ("calls/step", "calls", ".1f"),
           ("ring cost MiB/step", "ring_cost_bytes", mib), ("peak MiB", "peak", mib)]


def unit_size_arg(text: str):
    if text == "block":
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: 'block', 0 or a positive number of elements")
    return value


def build_parser():
    parser = suite_parser("zero", __doc__, steps=12, rounds=3, json="every run and the ratios",
                          steps_help="steps per run (the first is left out of the median)")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--no-deepspeed", action="store_true", help="skip the DeepSpeed peers")
    parser.add_argument("--unit-size", type=unit_size_arg, default="block",
                        help="zero3's and FSDP2's unit_size: 'block' (default: one unit per transformer block), 0 "
                             "(every module with parameters is a unit) or a number of elements")
    parser.add_argument("--only", nargs="+", metavar="LABEL", help="run only these configurations (labels)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 2 or args.rounds < 1:
        raise ValueError("--steps must be at least 2 and --rounds at least 1")
    with_deepspeed = deepspeed_available() and not args.no_deepspeed
    log = progress_log(args.quiet)
    start, start_machine, start_load = time.perf_counter(), machine(), load_average()
    work = tiny_gpt(**SWEEP_GPT)
    rows = run_rounds(work, args.world_sizes, lambda n: configs(with_deepspeed, args.unit_size, args.only, n),
                      args.steps, args.rounds, args.timeout, log, peak=lambda e: e.label != "zero3 prefetch=off")
    ratios = add_ratios(rows)
    print(f"zerokit bench zero — fp32 AdamW, {args.steps} steps × {args.rounds} interleaved rounds, "
          f"unit_size {args.unit_size}; {start_machine}" + ("" if with_deepspeed else "; DeepSpeed not installed"))
    print(table(f"\n{work.description}; Ψ = {work.param_count():,}", COLUMNS, rows))
    print("(zerokit/this: zerokit's stage over this peer, step time paired round by round and peak bytes per rank; "
          "exposed: seconds per step blocked on collectives, from the ledger, — where the library waits on its "
          "asynchronous collectives inside itself; peak: busiest rank, one run with the memory ledger's hooks)")
    print("\nratios (zerokit / peer; exposed communication with prefetch on / off):", json.dumps(ratios, indent=2))
    print(conditions(rows, start_load, lambda r: f"N={r['world_size']} {r['label']}"))
    print(f"bench finished in {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": list(argv or []), "machine": start_machine, "workload": SWEEP_GPT, "rows": rows,
                       "ratios": ratios}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
