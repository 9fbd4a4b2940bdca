"""``zerokit bench sizes``: step time against model size, 0.5–20 M parameters, per strategy.

The tiny GPT at six widths and depths (:data:`SIZES`, from about 0.5 M to 20 M parameters; the
same sequence, batch and vocabulary, so the tokens per step are fixed and only Ψ grows)
runs under each strategy (default ``ddp``, ``zero1``, ``zero2``, ``zero3`` and the peers
``torch-ddp``, ``fsdp2-zero3``) at one world size. Every (size, strategy) runs once per
round, the order rotating between rounds (:mod:`zerokit.bench.rounds`), fp32 AdamW,
``track_peak=False``. Reported: the median step time, the exposed communication, the noise
(IQR / median of the step times) and, per size, the ratios zerokit / peer (``ddp`` /
``torch-ddp``, ``zero3`` / ``fsdp2-zero3``). The picture (``--out``, default
``benchmarks/model-size.png``): step time against Ψ per strategy (log-log), and the
ratios against Ψ.

On a CPU the compute per step grows with Ψ (≈ 6Ψ FLOPs per token) as fast as the bytes
reduced do, so what the curves show is how each strategy's fixed costs (Python hooks,
calls per step, the gathers' allocations) fade or not as the model grows — not a GPU's
compute/communication balance.
"""
from __future__ import annotations

import json
import os
import sys
import time

from ..strategies import names
from ..workloads import tiny_gpt
from . import suite_parser
from .rounds import Entry, paired_ratio, run_plan
from .table import conditions, load_average, machine, minor_label, ms, progress_log, table

#: name → tiny GPT widths and depths (vocab 512, sequence 64, 4 heads): about 0.55, 0.93, 2.0, 5.0, 10.2, 19.4 M parameters
SIZES = {"0.5M": dict(d_model=96, n_layer=4), "1M": dict(d_model=128, n_layer=4),
         "2M": dict(d_model=192, n_layer=4), "5M": dict(d_model=256, n_layer=6),
         "10M": dict(d_model=320, n_layer=8), "20M": dict(d_model=512, n_layer=6)}
COMMON = dict(vocab=512, seq_len=64, n_head=4)
STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "torch-ddp", "fsdp2-zero3")
#: zerokit's strategy → its peer in the ratios
PAIRS = {"ddp": "torch-ddp", "zero1": "torch-zero1", "zero2": "fsdp2-zero2", "zero3": "fsdp2-zero3"}

COLUMNS = [("size", "key", "s"), ("Ψ", "param_count", ","), ("strategy", "label", "s"), ("step ms", "step_s", ms),
           ("× peer", "vs_peer", ".2f"), ("exposed ms/step", "exposed_s", ms), ("IQR/median", "noise", ".2f")]


def plan(sizes, strategies, world_size: int, batch_size: int) -> list:
    entries = []
    for name in sizes:
        work = tiny_gpt(**COMMON, **SIZES[name], batch_size=batch_size)
        entries += [Entry(work, world_size, s, s, {"unit_size": "block"} if s in ("zero3", "fsdp2-zero3") else {},
                          name) for s in strategies]
    return entries


def add_ratios(rows) -> None:
    for row in rows:
        peer = PAIRS.get(row["strategy"])
        match = [r for r in rows if r["strategy"] == peer and r["key"] == row["key"]]
        row["vs_peer"] = paired_ratio(row, match) if match else None


def plot(rows, strategies, out: str) -> None:
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(11, 4), dpi=110)
    times, ratios = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    colors = {}
    for i, strategy in enumerate(s for s in PAIRS if s in strategies):
        colors[strategy] = colors[PAIRS[strategy]] = f"C{i}"
    for strategy in strategies:  # a peer: dashed, in the colour of the zerokit strategy it is paired with
        mine = sorted((r for r in rows if r["strategy"] == strategy), key=lambda r: r["param_count"])
        x = [r["param_count"] / 1e6 for r in mine]
        style = "--" if strategy not in PAIRS else "-"
        times.plot(x, [1000 * r["step_s"] for r in mine], style, marker="o", label=strategy,
                   color=colors.get(strategy, f"C{len(colors) + strategies.index(strategy)}"))
        if strategy in PAIRS and any(r["vs_peer"] is not None for r in mine):
            ratios.plot([xi for xi, r in zip(x, mine) if r["vs_peer"] is not None],
                        [r["vs_peer"] for r in mine if r["vs_peer"] is not None], marker="o",
                        label=f"{strategy} / {PAIRS[strategy]}", color=colors[strategy])
    times.set_yscale("log")
    for ax in (times, ratios):
        ax.set_xscale("log")
        ax.set_xlabel("parameters Ψ (millions)")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(FuncFormatter(minor_label))
    times.set_ylabel("median step time (ms, measured)")
    times.legend(fontsize=8, frameon=False)
    ratios.axhline(1.0, color="grey", lw=0.8)
    ratios.set_ylabel("step time, zerokit / peer (measured)")
    if ratios.lines[1:]:
        ratios.legend(fontsize=8, frameon=False)
    fig.suptitle(f"tiny GPT, fp32 AdamW, N = {rows[0]['world_size']}: step time against model size", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out)


def build_parser():
    parser = suite_parser("sizes", __doc__, steps=6, rounds=2, timeout=600.0, json="every run")
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES), metavar="SIZE",
                        help=f"model sizes ({', '.join(SIZES)})")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), metavar="STRATEGY",
                        help=f"strategies and peers (default {' '.join(STRATEGIES)})")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8, help="global batch (sequences of 64 tokens)")
    parser.add_argument("--out", default="benchmarks/model-size.png", help="where the picture goes")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 2 or args.rounds < 1 or args.world_size < 1 or args.batch_size < 1:
        raise ValueError("--steps must be at least 2; --rounds, --world-size and --batch-size at least 1")
    unknown = [s for s in args.strategies if s not in names()]
    if unknown:
        raise ValueError(f"--strategies {' '.join(unknown)}: unknown; allowed: {', '.join(sorted(names()))}")
    log = progress_log(args.quiet)
    start, start_machine, start_load = time.perf_counter(), machine(), load_average()
    rows = run_plan(plan(args.sizes, args.strategies, args.world_size, args.batch_size), args.steps, args.rounds,
                    args.timeout, log)
    add_ratios(rows)
    print(f"zerokit bench sizes — tiny GPT (vocab 512, sequence 64, global batch {args.batch_size}), fp32 AdamW, "
          f"N = {args.world_size}, {args.steps} steps × {args.rounds} interleaved rounds; {start_machine}")
    print(table("", COLUMNS, rows).lstrip("\n"))
    print("(× peer: zerokit / " + ", ".join(f"{a} → {b}" for a, b in PAIRS.items())
          + ", paired round by round; exposed: blocked on collectives, from the ledger, — where a library waits "
            "inside itself)")
    print(conditions(rows, start_load, lambda r: f"{r['key']} {r['label']}"))
    plot(rows, args.strategies, args.out)
    print(f"picture: {args.out}")
    print(f"bench finished in {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": list(argv or []), "machine": start_machine, "sizes": {k: SIZES[k] for k in args.sizes},
                       "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
