"""``zerokit bench link``: step time against link bandwidth for ``ddp``, ``zero3`` and ``pp``, on an emulated link.

On this machine the ranks talk through shared memory, so communication is nearly free next
to compute. Here every collective still runs on gloo, and its completion is held until an
α-β link of the given bandwidth would have carried its ring bytes
(:mod:`zerokit.runtime.link`: ``zerokit.train(..., link=...)``). The tiny GPT runs under
``ddp``, ``zero3`` (N = 2 data-parallel ranks) and ``pp`` (2 stages, 1F1B, 4 micro-batches)
behind links of ``--bandwidths`` bytes per second (α = ``--alpha-us`` µs per message round),
and without a link (the backend's own speed) as the baseline. Every (strategy, bandwidth)
runs once per round, the order rotating between rounds (:mod:`zerokit.bench.rounds`).

Reported per run: the median step time (measured), the link's seconds per step (emulated:
the formula rounds·α + bytes·β summed over the step's transfers on the busiest rank), and
the exposed communication (measured: seconds the compute thread was blocked, sleeps for
the emulated completion included). Exposed below the link's time is communication hidden
behind compute (``ddp``'s overlapped all-reduce, ``zero3``'s prefetch). The picture
(``--out``, default ``benchmarks/link-bandwidth.png``): step time against bandwidth (log),
the baselines as dotted lines; and exposed (measured) against the link's time (emulated).
"""
from __future__ import annotations

import json
import os
import sys
import time

from ..runtime.link import custom
from ..workloads import tiny_gpt
from . import suite_parser
from .rounds import Entry, run_plan
from .table import conditions, load_average, machine, minor_label, ms, progress_log, table

GPT = dict(vocab=512, seq_len=64, d_model=128, n_layer=4, n_head=4, batch_size=8)
#: label → (strategy, options): two data-parallel ranks (ddp in 1 MiB buckets: 4 per step, the first three overlap
#: backward), or two pipeline stages
STRATEGIES = {"ddp": ("ddp", {"bucket_mb": 1.0}), "zero3": ("zero3", {"unit_size": "block"}),
              "pp": ("pp", {"schedule": "1f1b", "micro_batches": 4})}
NO_LINK = "none"

COLUMNS = [("strategy", "label", "s"), ("link", lambda r: _bandwidth(r["key"]), "s"), ("step ms", "step_s", ms),
           ("× no link", "vs_baseline", ".2f"), ("link ms/step (emulated)", "link_s", ms),
           ("exposed ms/step", "exposed_s", ms), ("IQR/median", "noise", ".2f"), ("calls/step", "calls", ".1f")]


def _bandwidth(key) -> str:
    return "no link" if key == NO_LINK else f"{key / 1e9:g} GB/s"


def plan(work, strategies, bandwidths, alpha_s: float, baseline: bool) -> list:
    entries = []
    for label in strategies:
        strategy, options = STRATEGIES[label]
        keys = ([NO_LINK] if baseline else []) + list(bandwidths)
        for key in keys:
            extra = {} if key == NO_LINK else {"link": custom(alpha_s, key, name=_bandwidth(key))}
            entries.append(Entry(work, 2, label, strategy, {**options, **extra}, key))
    return entries


def add_ratios(rows) -> None:
    for row in rows:
        base = next((r for r in rows if r["label"] == row["label"] and r["key"] == NO_LINK), None)
        row["vs_baseline"] = row["step_s"] / base["step_s"] if base else None


def plot(rows, strategies, out: str) -> None:
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(11, 4), dpi=110)
    times, hidden = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for label in strategies:
        mine = sorted((r for r in rows if r["label"] == label and r["key"] != NO_LINK), key=lambda r: r["key"])
        line, = times.plot([r["key"] / 1e9 for r in mine], [1000 * r["step_s"] for r in mine], marker="o",
                           label=label)
        base = next((r for r in rows if r["label"] == label and r["key"] == NO_LINK), None)
        if base is not None:
            times.axhline(1000 * base["step_s"], color=line.get_color(), ls=":", lw=1,
                          label=f"{label}, no link")
        hidden.plot([1000 * r["link_s"] for r in mine], [1000 * r["exposed_s"] for r in mine], marker="o",
                    color=line.get_color(), label=label)
    times.set_xscale("log")
    times.set_yscale("log")
    times.set_xlabel("link bandwidth (GB/s, emulated, one direction)")
    times.set_ylabel("median step time (ms, measured)")
    times.legend(fontsize=8, frameon=False)
    linked = [r for r in rows if r["key"] != NO_LINK]
    low = min([1000 * r["link_s"] for r in linked] + [1000 * r["exposed_s"] for r in linked] + [1.0])
    top = max([1000 * r["link_s"] for r in linked] + [1000 * r["exposed_s"] for r in linked] + [1.0])
    hidden.plot([low, top], [low, top], color="grey", lw=0.8, ls="--", label="exposed = link time")
    hidden.set_xscale("log")
    hidden.set_yscale("log")
    for ax in (times, hidden):
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(FuncFormatter(minor_label))
    hidden.set_xlabel("link time per step (ms, emulated: rounds·α + bytes·β)")
    hidden.set_ylabel("exposed comm. per step (ms, measured)")
    hidden.legend(fontsize=8, frameon=False)
    fig.suptitle(f"tiny GPT, fp32 AdamW, 2 ranks, α = {rows[0].get('alpha_us', 0):g} µs: step time against an "
                 f"emulated link's bandwidth", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out)


def build_parser():
    parser = suite_parser("link", __doc__, steps=6, rounds=2, timeout=600.0, json="every run")
    parser.add_argument("--bandwidths", type=float, nargs="+", default=[1e7, 3e7, 1e8, 3e8, 1e9, 1e10],
                        help="link bandwidths, bytes per second, one direction (default 1e7 … 1e10)")
    parser.add_argument("--alpha-us", type=float, default=10.0, help="link latency per message round, µs")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument("--no-baseline", action="store_true", help="skip the runs without a link")
    parser.add_argument("--out", default="benchmarks/link-bandwidth.png", help="where the picture goes")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 2 or args.rounds < 1:
        raise ValueError("--steps must be at least 2 and --rounds at least 1")
    if any(not b > 0 for b in args.bandwidths) or not args.alpha_us >= 0:
        raise ValueError("--bandwidths must be positive bytes per second and --alpha-us at least 0")
    log = progress_log(args.quiet)
    start, start_machine, start_load = time.perf_counter(), machine(), load_average()
    work = tiny_gpt(**GPT)
    rows = run_plan(plan(work, args.strategies, sorted(args.bandwidths), args.alpha_us * 1e-6, not args.no_baseline),
                    args.steps, args.rounds, args.timeout, log)
    for row in rows:
        row["alpha_us"] = args.alpha_us
    add_ratios(rows)
    print(f"zerokit bench link — {work.description}; Ψ = {work.param_count():,}; fp32 AdamW, 2 ranks (ddp, zero3: "
          f"data parallel; pp: 2 stages, 1F1B, 4 micro-batches), α = {args.alpha_us:g} µs, {args.steps} steps × "
          f"{args.rounds} interleaved rounds; {start_machine}")
    print(table("", COLUMNS, rows).lstrip("\n"))
    print("(link ms/step: the emulated link's time for the step's transfers on the busiest rank, a formula; exposed: "
          "measured seconds blocked on collectives, the sleeps for the emulated completion included)")
    print(conditions(rows, start_load, lambda r: f"{r['label']} {_bandwidth(r['key'])}"))
    plot(rows, args.strategies, args.out)
    print(f"picture: {args.out}")
    print(f"bench finished in {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": list(argv or []), "machine": start_machine, "workload": GPT, "rows": rows}, f,
                      indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
