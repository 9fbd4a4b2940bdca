"""The ``zerokit`` command: ``tour``, ``compare`` and ``bench``."""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

from . import strategies as strategy_registry
from . import theory
from .report import Report
from .train import make_job, run_job, run_reference
from .workloads import Workload, tiny_gpt

#: the tiny GPT the tour runs: small enough for every strategy at 2 and 4 ranks in a minute
TOUR_WORKLOAD = dict(vocab=256, seq_len=32, d_model=64, n_layer=2, n_head=4, batch_size=8)


def load_workload(spec: str) -> Workload:
    """``FILE.py:FUNC`` -> the Workload FUNC() returns."""
    if ":" not in spec:
        raise SystemExit(f"--model {spec!r}: expected FILE.py:FUNC")
    path, func = spec.rsplit(":", 1)
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"--model: no such file {path!r}")
    module_spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[file.stem] = module
    module_spec.loader.exec_module(module)
    if not hasattr(module, func):
        raise SystemExit(f"--model: {path} defines no {func!r}")
    workload = getattr(module, func)()
    if not isinstance(workload, Workload):
        raise SystemExit(f"--model: {func}() returned {type(workload).__name__}, not a zerokit.Workload")
    return workload


def compare(workload: Workload, world_size: int, strategies, steps: int = 10, precision: str = "fp32",
            optimizer: str = "adamw", lr: float = 1e-3, micro_batches: int = 1, options_for=None,
            timeout_s: float = 300.0, track_peak: bool = True, keep_records: bool = False) -> Report:
    """Run each strategy on the same workload and compare it with one single-process reference.

    ``options_for(strategy) -> dict`` gives each strategy its options (default: none).
    """
    options_for = options_for or (lambda name: {})
    jobs = []
    for name in strategies:
        n = 1 if name == "single" else world_size
        jobs.append((make_job(workload, name, n, steps, precision, optimizer, lr, micro_batches,
                              options_for(name), track_peak, keep_records), n))
    reference = run_reference(jobs[0][0])
    results = [run_job(job, n, reference, timeout_s=timeout_s) for job, n in jobs]
    return Report(results, reference=reference)


def _strategy_options(args):
    options = {}
    for item in args.option or []:
        if "=" not in item:
            raise SystemExit(f"--option {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        options[key] = json.loads(value) if value not in ("true", "false") else value == "true"
    config = {}
    if getattr(args, "deepspeed_config", None):
        from .zero.config import from_deepspeed

        config = from_deepspeed(args.deepspeed_config)

    def options_for(name):
        cls = strategy_registry.get(name)
        chosen = {k: v for k, v in {**config, **options}.items() if k in cls.options}
        return chosen

    return options_for


def cmd_compare(args) -> int:
    workload = load_workload(args.model)
    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for name in names:
        strategy_registry.get(name)  # unknown names fail before any process starts
    report = compare(workload, args.world_size, names, steps=args.steps, precision=args.precision,
                     optimizer=args.optimizer, lr=args.lr, micro_batches=args.micro_batches,
                     options_for=_strategy_options(args))
    if args.json:
        print(report.dumps())
    else:
        print(report.table())
    return 0


def tour_strategies() -> list:
    """Every strategy that exists, zerokit's own first, peers after (DeepSpeed only if installed)."""
    names = strategy_registry.names()
    ordered = sorted(names, key=lambda n: (strategy_registry.get(n).peer, names.index(n)))
    return [n for n in ordered if n != "single" and not n.startswith("deepspeed")]


def cmd_tour(args) -> int:
    start = time.perf_counter()
    workload = tiny_gpt(**TOUR_WORKLOAD)
    psi = workload.param_count()
    print(f"zerokit tour — {workload.description}; Ψ = {psi:,} parameters; fp32 AdamW, {args.steps} steps.")
    print("Model states and traffic are rank 0's, measured after the last step, next to zerokit.theory.\n")
    names = tour_strategies()
    reference = None
    for n in args.world_sizes:
        report = compare(workload, n, ["single", *names] if reference is None else names, steps=args.steps,
                         timeout_s=args.timeout)
        reference = report.reference
        print(f"-- {n} ranks --")
        print(report.table())
        print()
    print(f"DDP holds 16Ψ = {16 * psi:,} B of model states per rank, plus 4 B per tensor for Adam's step.")
    print(f"tour finished in {time.perf_counter() - start:.1f} s")
    return 0


def cmd_bench(args) -> int:
    from . import bench

    return bench.main(args.suite, args.rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerokit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    tour = sub.add_parser("tour", help="every strategy on the tiny GPT at 2 and 4 ranks, one table")
    tour.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    tour.add_argument("--steps", type=int, default=4)
    tour.add_argument("--timeout", type=float, default=120.0)
    tour.set_defaults(func=cmd_tour)

    cmp_ = sub.add_parser("compare", help="run strategies on a workload of yours, side by side")
    cmp_.add_argument("--model", required=True, help="FILE.py:FUNC, where FUNC() returns a zerokit.Workload")
    cmp_.add_argument("--world-size", type=int, required=True)
    cmp_.add_argument("--strategies", required=True, help="comma-separated; see `zerokit compare --list`")
    cmp_.add_argument("--steps", type=int, default=10)
    cmp_.add_argument("--precision", choices=theory.PRECISIONS, default="fp32")
    cmp_.add_argument("--optimizer", choices=theory.OPTIMIZERS, default="adamw")
    cmp_.add_argument("--lr", type=float, default=1e-3)
    cmp_.add_argument("--micro-batches", type=int, default=1)
    cmp_.add_argument("--option", action="append", metavar="KEY=VALUE",
                      help="a strategy option (JSON value), given to every strategy that has it")
    cmp_.add_argument("--deepspeed-config", metavar="FILE", help="a DeepSpeed config JSON (zero_optimization)")
    cmp_.add_argument("--json", action="store_true")
    cmp_.set_defaults(func=cmd_compare)

    bench = sub.add_parser("bench", help="step-time ratios against the peers (see benchmarks/)")
    bench.add_argument("suite", help="ddp or zero")
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"zerokit {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
