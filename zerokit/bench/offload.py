"""``zerokit bench offload``: the host optimizer's step, and ZeRO's step time with and without offload.

Offload is only as fast as the optimizer step on the host: users of other frameworks
report 10–50× slower steps when it is not vectorised. Two parts, each interleaved (the
order rotates between rounds, so drift on a shared machine hits all alike):

1. **Host AdamW.** torch's three CPU implementations — ``fused=True`` (one kernel),
   ``foreach=True`` (multi-tensor) and the for-loop (``foreach=False``, what zerokit's
   device-side ``MasterOptimizer`` uses) — step the same fp32 parameters, cut into
   ``--tensors`` tensors, at each ``--sizes``. Reported: the median step time of each,
   and the ratios for-loop / fused and foreach / fused (above 1: fused is faster).
2. **Training.** The tiny GPT under ``zero1``, ``zero2`` and ``zero3`` with
   ``offload="none"`` and ``"optimizer"``, and ``zero3`` with ``"params"`` (fp32 AdamW,
   no reference, ``track_peak=False``): the median step time and the ratio offload / none
   per stage.

On a CPU-only machine the "device" and the host are the same RAM and cores: the
training ratio shows what the copies and the host-side bookkeeping cost, not PCIe time,
and not what a GPU would gain by shedding the optimizer. Absolute times depend on the
machine and its load (printed with the results).
"""
from __future__ import annotations

import json
import sys
import time

import torch

from ..offload.host_optimizer import build_optimizer, IMPLEMENTATIONS
from ..optim import OptimizerSpec
from ..workloads import tiny_gpt
from . import median, ratio, suite_parser
from .rounds import run_rounds
from .table import conditions, load_average, machine, ms, noise, progress_log, table

ADAMW_COLUMNS = [("elements", "numel", ","), ("fused ms", "fused_s", lambda v: f"{1000 * v:.2f}"),
                 ("foreach ms", "foreach_s", lambda v: f"{1000 * v:.2f}"),
                 ("for-loop ms", "for-loop_s", lambda v: f"{1000 * v:.2f}"), ("for-loop/fused", "for-loop/fused", ".2f"),
                 ("foreach/fused", "foreach/fused", ".2f"), ("IQR/median (worst)", "noise", ".2f")]
TRAINING_COLUMNS = [("N", "world_size", "d"), ("configuration", "label", "s"), ("step ms", "step_s", ms),
                    ("IQR/median", "noise", ".2f")]

#: the training part's configurations: (label, strategy, offload)
TRAINING = [("zero1", "zero1", "none"), ("zero1 offload", "zero1", "optimizer"),
            ("zero2", "zero2", "none"), ("zero2 offload", "zero2", "optimizer"),
            ("zero3", "zero3", "none"), ("zero3 offload", "zero3", "optimizer"),
            ("zero3 offload=params", "zero3", "params")]
TRAINING_GPT = dict(vocab=512, seq_len=64, d_model=128, n_layer=4, n_head=4, batch_size=8)


def adamw_step_times(numel: int, tensors: int = 16, repeats: int = 10, rounds: int = 3) -> dict:
    """Median seconds of one AdamW step over ``numel`` fp32 elements in ``tensors`` tensors, per implementation."""
    spec = OptimizerSpec("adamw", lr=1e-3)
    sizes = [numel // tensors + (1 if i < numel % tensors else 0) for i in range(tensors)]
    g = torch.Generator().manual_seed(0)
    setups = {}
    for impl in IMPLEMENTATIONS:
        params = [torch.nn.Parameter(torch.randn(n, generator=g)) for n in sizes]
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer = build_optimizer(params, spec, impl)
        optimizer.step()  # warm-up: allocates m and v
        setups[impl] = optimizer
    samples = {impl: [] for impl in IMPLEMENTATIONS}
    for r in range(rounds):
        order = IMPLEMENTATIONS[r % 3:] + IMPLEMENTATIONS[:r % 3]
        for impl in order:
            for _ in range(repeats):
                t0 = time.perf_counter()
                setups[impl].step()
                samples[impl].append(time.perf_counter() - t0)
    return {impl: median(s) for impl, s in samples.items()}, {impl: noise(s) for impl, s in samples.items()}


def adamw_rows(sizes, tensors: int, repeats: int, rounds: int, log) -> list:
    rows = []
    for numel in sizes:
        times, spread = adamw_step_times(numel, tensors, repeats, rounds)
        row = {"numel": numel, "tensors": tensors, **{f"{k}_s": v for k, v in times.items()},
               "noise": max(spread.values()),
               "for-loop/fused": ratio(times["for-loop"], times["fused"]),
               "foreach/fused": ratio(times["foreach"], times["fused"])}
        log(f"AdamW {numel:,} elements: " + ", ".join(f"{k} {1000 * v:.2f} ms" for k, v in times.items()))
        rows.append(row)
    return rows


def training_configs(n):
    return [(label, strategy, {"offload": offload}, None) for label, strategy, offload in TRAINING]


def training_ratios(rows) -> dict:
    out = {}
    for n in sorted({r["world_size"] for r in rows}):
        at = {r["label"]: r["step_s"] for r in rows if r["world_size"] == n}
        for stage in ("zero1", "zero2", "zero3"):
            if stage in at and f"{stage} offload" in at:
                out[f"N={n} {stage} offload/none"] = round(ratio(at[f"{stage} offload"], at[stage]), 3)
        if "zero3" in at and "zero3 offload=params" in at:
            out[f"N={n} zero3 offload=params/none"] = round(ratio(at["zero3 offload=params"], at["zero3"]), 3)
    return out


def build_parser():
    parser = suite_parser("offload", __doc__, steps=8, rounds=3, json="every figure",
                          steps_help="training steps per run (the first is left out)")
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 4e6],
                        help="elements stepped by the host AdamW (default 1e6 4e6)")
    parser.add_argument("--tensors", type=int, default=16, help="tensors the elements are cut into")
    parser.add_argument("--repeats", type=int, default=10, help="AdamW steps per implementation per round")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for the AdamW part (1: what each training rank uses here)")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2])
    parser.add_argument("--no-train", action="store_true", help="only the AdamW part")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 2 or args.rounds < 1 or args.repeats < 1 or args.tensors < 1 or args.threads < 1:
        raise ValueError("--steps must be at least 2; --rounds, --repeats, --tensors and --threads at least 1")
    sizes = [int(s) for s in args.sizes]
    if any(s < args.tensors for s in sizes):
        raise ValueError(f"--sizes must each be at least --tensors ({args.tensors}) elements")
    log = progress_log(args.quiet)
    start, start_machine, start_load = time.perf_counter(), machine(), load_average()
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        adam = adamw_rows(sizes, args.tensors, args.repeats, args.rounds, log)
    finally:
        torch.set_num_threads(threads)
    rows, ratios, work = [], {}, tiny_gpt(**TRAINING_GPT)
    if not args.no_train:
        rows = run_rounds(work, args.world_sizes, training_configs, args.steps, args.rounds, args.timeout, log)
        ratios = training_ratios(rows)
    print(f"zerokit bench offload — {start_machine}")
    print(table(f"\nhost AdamW step, fp32, {args.tensors} tensors, {args.threads} thread(s), median of {args.rounds} × "
                f"{args.repeats} steps", ADAMW_COLUMNS, adam))
    if rows:
        print(table(f"\n{work.description}; Ψ = {work.param_count():,}; fp32 AdamW, {args.steps} steps × "
                    f"{args.rounds} interleaved rounds", TRAINING_COLUMNS, rows))
        print("ratios (offload / none; on one RAM: the copies' and the host step's cost, not PCIe time):",
              json.dumps(ratios, indent=2))
    print(conditions(adam + rows, start_load,
                     lambda r: f"AdamW {r['numel']:,}" if "numel" in r else f"N={r['world_size']} {r['label']}"))
    print(f"bench finished in {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": list(argv or []), "machine": start_machine, "adamw": adam,
                       "training_workload": TRAINING_GPT,
                       "rows": [{k: v for k, v in r.items() if k != "runs"} for r in rows], "ratios": ratios},
                      f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
