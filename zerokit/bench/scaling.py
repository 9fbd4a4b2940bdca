"""``zerokit bench scaling``: per-rank model-state bytes and traffic against the world size, measured vs theory.

For every strategy (``ddp``, ``zero1``, ``zero2``, ``zero3``) and world size N (default 2–8)
one short run of the tiny GPT records rank 0's model-state bytes (measured from tensor
storages) and its traffic per step (the ring cost of the measured payloads), next to
``zerokit.theory``'s values for the same layout. Nothing here is a wall-clock time, so a
busy machine changes nothing. The picture (two panels: bytes per rank and bytes sent per
step, both against N, measured as markers, theory as lines) is written to
``benchmarks/scaling.png`` (``--out``); the table is printed, with the largest
measured/theory deviation, which must be 0.
"""
from __future__ import annotations

import sys

from ..train import train
from ..workloads import tiny_gpt
from . import suite_parser
from .table import load_average

STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
GPT = dict(vocab=512, seq_len=8, d_model=128, n_layer=4, n_head=4, batch_size=840)  # bytes do not depend on s or b


def measure(work, strategy: str, n: int, timeout_s: float) -> dict:
    report = train(work, strategy, world_size=n, steps=2, optimizer="adamw", reference=False, track_peak=False,
                   timeout_s=timeout_s)
    rank = report.results[0].ranks[0]
    return {"states": sum(rank.model_state_bytes.values()),
            "states_theory": sum(rank.theory_model_states[k] for k in ("params", "grads", "optimizer")),
            "sent": rank.comm_ring_cost_bytes_per_step, "sent_theory": rank.theory_comm_bytes_per_step}


def plot(rows: dict, sizes, out: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), dpi=110)
    for i, (key, label) in enumerate((("states", "model states per rank (MiB)"),
                                      ("sent", "bytes sent per rank per step (MiB, ring cost)"))):
        ax = fig.add_subplot(1, 2, i + 1)
        for strategy in STRATEGIES:
            measured = [rows[strategy][n][key] / 2**20 for n in sizes]
            theory = [rows[strategy][n][f"{key}_theory"] / 2**20 for n in sizes]
            line, = ax.plot(sizes, theory, label=f"{strategy} (theory)")
            ax.plot(sizes, measured, "o", color=line.get_color(), label=f"{strategy} (measured)")
        ax.set_xlabel("world size N")
        ax.set_ylabel(label)
        ax.set_xticks(list(sizes))
    fig.axes[0].legend(fontsize=7, frameon=False, ncol=2)
    fig.suptitle("tiny GPT, fp32 AdamW: measured (markers) vs zerokit.theory (lines)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)


def main(argv=None) -> int:
    parser = suite_parser("scaling", __doc__)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=list(range(2, 9)))
    parser.add_argument("--out", default="benchmarks/scaling.png", help="where the picture goes")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.world_sizes):
        raise ValueError("--world-sizes must be positive")
    work = tiny_gpt(**GPT)  # a batch of 840 divides by every N from 1 to 8
    rows: dict = {s: {} for s in STRATEGIES}
    for n in args.world_sizes:
        for strategy in STRATEGIES:
            rows[strategy][n] = measure(work, strategy, n, args.timeout)
            if not args.quiet:
                print(f"N={n} {strategy}: {rows[strategy][n]}", file=sys.stderr, flush=True)
    print(f"zerokit bench scaling — {work.description}; Ψ = {work.param_count():,}; rank 0, bytes")
    print(f"{'strategy':<8}{'N':>3}{'states':>14}{'theory':>14}{'sent/step':>14}{'theory':>14}")
    worst = 0.0
    for strategy in STRATEGIES:
        for n in args.world_sizes:
            r = rows[strategy][n]
            worst = max(worst, abs(r["states"] - r["states_theory"]), abs(r["sent"] - r["sent_theory"]))
            print(f"{strategy:<8}{n:>3}{r['states']:>14,}{r['states_theory']:>14,}{r['sent']:>14,.0f}"
                  f"{r['sent_theory']:>14,.0f}")
    print(f"largest |measured − theory|: {worst:,.0f} B")
    print(f"conditions: {load_average()}; bytes only, no timing: the load and the noise of the machine change none "
          f"of these numbers")
    plot(rows, args.world_sizes, args.out)
    print(f"picture: {args.out}")
    return 0 if worst == 0 else 1
