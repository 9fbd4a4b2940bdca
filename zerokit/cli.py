"""The ``zerokit`` command: ``tour``, ``compare``, ``plan``, ``grade`` and ``bench``."""
from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import sys
from pathlib import Path

from . import strategies as strategy_registry, theory, tour, tour_results
from .bench.cli import add_bench_command
from .grade.cli import add_grade_command
from .job import JOB_OPTIONS, make_job
from .planner.cli import add_plan_command
from .report import Report
from .runtime.errors import RankFailed, RankTimeout, UsageError
from .runtime.link import PRESETS as link_presets
from .runtime.mesh import AXES, check_built, parse_parallel
from .runtime.termination import end_by, stop_resource_tracker
from .train import reference_device, run_job, run_reference
from .workloads import BUILTIN, Workload
from .zero.config import from_deepspeed

#: what ``zerokit --help`` says first (plain text: argparse prints it as it is)
DESCRIPTION = ("The zerokit command: tour (every parallelism on a tiny GPT), compare (strategies side by side on a "
               "workload), plan (a real model on a real cluster, computed), grade (the exercises) and bench "
               "(step time and memory against torch and DeepSpeed).")

#: how ``--parallel`` is written, for its help and its error messages
PARALLEL_FORM = "AXIS=N[,AXIS=N…] with AXIS one of dp, cp, ep, tp, pp, e.g. dp=2,tp=1,pp=1 (ep is carved from dp)"

#: how ``--model`` is written, for its help and its error messages
MODEL_FORM = (f"a built-in workload ({', '.join(BUILTIN)}: "
              f"{', '.join(f'zerokit.{f.__name__}' for f in BUILTIN.values())} with their defaults) or FILE.py:FUNC, "
              f"where FUNC() returns a zerokit.Workload")


def load_workload(spec: str) -> Workload:
    """A built-in workload by name (``tiny-gpt``, ``mlp``: :data:`zerokit.workloads.BUILTIN` with its defaults), or
    ``FILE.py:FUNC`` -> the Workload FUNC() returns."""
    if spec in BUILTIN:
        return BUILTIN[spec]()
    if ":" not in spec:
        raise UsageError(f"--model {spec!r}: expected {MODEL_FORM}")
    path, func = spec.rsplit(":", 1)
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--model: no such file {path!r}")
    module_spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[file.stem] = module
    module_spec.loader.exec_module(module)
    if not hasattr(module, func):
        raise UsageError(f"--model: {path} defines no {func!r}")
    workload = getattr(module, func)()
    if not isinstance(workload, Workload):
        raise UsageError(f"--model: {func}() returned {type(workload).__name__}, not a zerokit.Workload")
    return workload


# --- compare: plan (every check, nothing started), then run ------------------------------------

def _plan(workload: Workload, world_size: int, strategies, steps: int, precision: str, optimizer: str,
          lr: float, micro_batches: int, options_for, track_peak: bool, keep_records: bool, parallel,
          sequence_parallel: bool = False) -> list:
    """``[(job, number of ranks), …]``, every argument checked (ValueError) before any process starts."""
    strategies = list(strategies)
    if not strategies:
        raise ValueError("no strategies to compare; name at least one, e.g. single,ddp "
                         f"(allowed: {', '.join(strategy_registry.names())})")
    options_for = options_for or (lambda name: {})
    jobs = []
    for name in strategies:
        single = name == "single"  # the reference runs in one process: no mesh
        n = 1 if single else world_size
        jobs.append((make_job(workload, name, n, steps, precision, optimizer, lr, micro_batches,
                              options_for(name), track_peak, keep_records,
                              parallel=None if single else parallel,
                              sequence_parallel=False if single else sequence_parallel), n))
    return jobs


def _run(jobs: list, reference=None, timeout_s: float = 300.0) -> Report:
    """Run planned jobs one after another against ``reference`` (default: one made from the first job).

    A failure raises :class:`RankFailed` / :class:`RankTimeout` with ``strategy`` and
    ``world_size`` set to the job that failed.
    """
    if reference is None:
        reference = run_reference(jobs[0][0], reference_device(None, max(n for _, n in jobs)))
    results = []
    for job, n in jobs:
        try:
            results.append(run_job(job, n, reference, timeout_s=timeout_s))
        except (RankFailed, RankTimeout) as e:
            e.strategy, e.world_size = job.strategy, n
            raise
    return Report(results, reference=reference)


def compare(workload: Workload, world_size: int, strategies, steps: int = 10, precision: str = "fp32",
            optimizer: str = "adamw", lr: float = 1e-3, micro_batches: int = 1, options_for=None,
            timeout_s: float = 300.0, track_peak: bool = True, keep_records: bool = False,
            parallel=None, sequence_parallel: bool = False) -> Report:
    """Run each strategy on the same workload and compare it with one single-process reference.

    ``options_for(strategy) -> dict`` gives each strategy its options (default: none).
    ``parallel={"dp": …, "tp": …, "pp": …}`` lays every strategy's ranks out on a device mesh
    (see :func:`zerokit.train.train`); ``single`` always runs in one process, without one.
    Every job is checked before any runs; a failing rank raises :class:`zerokit.RankFailed`.
    """
    jobs = _plan(workload, world_size, strategies, steps, precision, optimizer, lr, micro_batches,
                 options_for, track_peak, keep_records, parallel, sequence_parallel)
    return _run(jobs, timeout_s=timeout_s)


# --- command-line parsing ------------------------------------------------------------------------

def parse_parallel_arg(text: str, world_size: int) -> dict:
    """``"dp=2,tp=1"`` -> ``{"dp": 2, "tp": 1}``, checked against the world size and what is built."""
    parallel = {}
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        try:
            degree = int(value)
        except ValueError:
            degree = None
        if not sep or not key or degree is None:
            raise UsageError(f"--parallel {text!r}: {item.strip()!r} is not AXIS=N; expected {PARALLEL_FORM}")
        if key in parallel:
            raise UsageError(f"--parallel {text!r}: {key} is given twice; expected {PARALLEL_FORM}")
        parallel[key] = degree
    try:
        check_built(parse_parallel(parallel, world_size))
    except ValueError as e:
        raise UsageError(f"--parallel {text!r}: {str(e).removeprefix('parallel: ')}") from e
    return parallel


def _option_value(text: str):
    """A JSON value (``4``, ``false``, ``"ring"``), Python's ``True``/``False``/``None``, else the bare string."""
    try:
        return json.loads(text)
    except ValueError:
        return {"True": True, "False": False, "None": None}.get(text.strip(), text)


def _strategy_names(text: str) -> list:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise UsageError(f"--strategies {text!r} names no strategy; give a comma-separated list, e.g. single,ddp "
                         f"(allowed: {', '.join(strategy_registry.names())})")
    for name in names:
        try:
            strategy_registry.get(name)  # unknown names fail before any process starts
        except ValueError as e:
            raise UsageError(f"--strategies: {e}") from e
    return names


def _strategy_options(args, names):
    """``options_for(name)``: the ``--option`` and ``--deepspeed-config`` values that strategy has.

    A key none of ``names`` has is an error; one that only some have goes to those.
    """
    options = {}
    for item in args.option or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--option {item!r}: expected KEY=VALUE, e.g. bucket_mb=4, overlap=false or "
                             f"algorithm=ring")
        options[key] = _option_value(value)
    config = {}
    if getattr(args, "deepspeed_config", None):
        try:
            config = from_deepspeed(args.deepspeed_config)
        except ValueError as e:
            raise UsageError(f"--deepspeed-config: {e}") from e
    merged = {**config, **options}
    if getattr(args, "link", None):  # --link NAME: every strategy's collectives behind an emulated link
        merged["link"] = args.link
    classes = {name: strategy_registry.get(name) for name in names}
    for key in merged:
        if key not in JOB_OPTIONS and not any(key in cls.options for cls in classes.values()):
            source = f"--option {key}" if key in options else f"--deepspeed-config (mapped to {key!r})"
            have = "; ".join(f"{name}: {', '.join(sorted(cls.options)) or 'none'}" for name, cls in classes.items())
            raise UsageError(f"{source}: none of the chosen strategies has an option {key!r}; "
                             f"their options are — {have}")

    def options_for(name):
        cls = classes.get(name) or strategy_registry.get(name)
        # checkpointing / checkpoint_every go to every strategy: make_job takes them out of the options
        return {k: v for k, v in merged.items() if k in cls.options or k in JOB_OPTIONS}

    return options_for


def cmd_compare(args) -> int:
    workload = load_workload(args.model)
    names = _strategy_names(args.strategies)
    if args.world_size < 1:
        raise UsageError(f"--world-size {args.world_size}: must be a positive integer")
    parallel = parse_parallel_arg(args.parallel, args.world_size) if args.parallel else None
    options_for = _strategy_options(args, names)
    try:
        jobs = _plan(workload, args.world_size, names, args.steps, args.precision, args.optimizer, args.lr,
                     args.micro_batches, options_for, True, False, parallel, args.sequence_parallel)
    except ValueError as e:
        raise UsageError(str(e)) from e
    report = _run(jobs)
    if args.json:
        print(report.dumps())
    else:
        print(report.table())
    return 0


def cmd_tour(args) -> int:
    if not args.timeout > 0:
        raise UsageError(f"--timeout {args.timeout:g}: must be a positive number of seconds")
    if any(n < 2 for n in args.world_sizes):
        raise UsageError(f"--world-sizes {' '.join(map(str, args.world_sizes))}: each must be an integer of at "
                         f"least 2 (the data-parallel and ZeRO rows' ranks)")
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps}: must be a positive integer")
    try:
        prepared = tour.prepare(args.world_sizes, args.steps)
    except ValueError as e:  # a row refused by make_job, before any process started
        raise UsageError(str(e)) from e
    results = tour.main(prepared, args.steps, args.timeout)  # a failing rank raises RankFailed: main() reports it
    tour_results.keep_results(results, args.world_sizes, args.steps)
    return 0


# --- plan: real sizes on a real cluster, nothing run -----------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerokit", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    tour = sub.add_parser("tour", help="every parallelism on a tiny GPT, each with its peers: one table, measured "
                                       "next to the theory and against one process")
    tour.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4],
                      help="ranks of the data-parallel and ZeRO rows (tp, pp, the grid, offload and checkpointing "
                           "have their own layouts)")
    tour.add_argument("--steps", type=int, default=4)
    tour.add_argument("--timeout", type=float, default=120.0, help="seconds per run before it counts as hung")
    tour.set_defaults(func=cmd_tour)

    cmp_ = sub.add_parser("compare", help="run strategies on a built-in workload or one of yours, side by side")
    cmp_.add_argument("--model", required=True, metavar="NAME|FILE.py:FUNC", help=MODEL_FORM)
    cmp_.add_argument("--world-size", type=int, required=True)
    cmp_.add_argument("--strategies", required=True,
                      help="comma-separated, e.g. single,ddp,zero1 (README.md lists them; an unknown name is "
                           "refused with the list)")
    cmp_.add_argument("--steps", type=int, default=10)
    cmp_.add_argument("--precision", choices=theory.PRECISIONS, default="fp32")
    cmp_.add_argument("--optimizer", choices=theory.OPTIMIZERS, default="adamw")
    cmp_.add_argument("--lr", type=float, default=1e-3)
    cmp_.add_argument("--micro-batches", type=int, default=1)
    cmp_.add_argument("--parallel", metavar="dp=N,cp=N,tp=N,pp=N",
                      help=f"the device mesh, degrees multiplying to --world-size ({PARALLEL_FORM}; "
                           f"an axis left out is 1, or for dp the rest); default: every rank on dp; "
                           f"axes {', '.join(AXES)}; pp above 1 runs a pipeline (ddp, zero1, pp, torch-pp-*)")
    cmp_.add_argument("--sequence-parallel", action="store_true",
                      help="with tp above 1: shard the LayerNorm regions along the sequence (Korthikanti et al.)")
    cmp_.add_argument("--option", action="append", metavar="KEY=VALUE",
                      help="a strategy option, repeatable: a JSON value (4, 0.5, true, false, null) or a bare "
                           "string (ring, 1f1b); given to every chosen strategy that has it, an error if none has")
    cmp_.add_argument("--deepspeed-config", metavar="FILE", help="a DeepSpeed config JSON (zero_optimization)")
    cmp_.add_argument("--link", choices=link_presets, metavar="NAME",
                      help=f"hold each collective until an emulated α-β link has carried its bytes (zerokit.links): "
                           f"{', '.join(link_presets)}; a system's name (dgx-h100) is its two tiers, the ranks all "
                           f"on one node unless torchrun says otherwise")
    cmp_.add_argument("--json", action="store_true")
    cmp_.set_defaults(func=cmd_compare)

    add_plan_command(sub)

    add_grade_command(sub)

    add_bench_command(sub)
    return parser


def _failure_message(e: Exception) -> str:
    """One message for a failed launch: which strategy, which rank, its error, its own traceback."""
    where = ""
    if getattr(e, "strategy", None):
        where = f"{e.strategy} on {e.world_size} rank{'s' if e.world_size != 1 else ''}: "
    if isinstance(e, RankFailed):
        lines = [line for line in e.traceback.strip().splitlines() if line.strip()]
        error = lines[-1].strip() if lines else "no traceback"
        code = f" (exit code {e.exitcode})" if e.exitcode is not None else ""
        text = f"{where}rank {e.rank} failed{code}: {error}\nrank {e.rank}'s traceback:\n{e.traceback.rstrip()}"
        if e.others:
            text += "\nother ranks failed after it:" + "".join(f"\n  rank {r}: {s}" for r, s in e.others)
        return text
    return f"{where}{e}"


def main(argv=None) -> int:
    """Run one command; it returns only after every process it started has exited, however it ends.

    The launches stop and reap their ranks (on Ctrl-C, SIGTERM and SIGHUP too); what a
    spawn-method launch leaves, multiprocessing's resource tracker, is stopped here. Ctrl-C
    says so in one line, then ends the process by SIGINT, as a shell expects.
    """
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as e:  # bad input, found before anything ran: argparse's style and status
        print(f"zerokit: error: {e}", file=sys.stderr)
        return 2
    except (RankFailed, RankTimeout) as e:  # a rank failed or hung: its own traceback, not the CLI's
        print(f"zerokit {args.command}: {_failure_message(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"zerokit {args.command}: interrupted; every process it started has stopped", file=sys.stderr)
        end_by(signal.SIGINT)
        raise
    finally:
        stop_resource_tracker()


if __name__ == "__main__":
    sys.exit(main())
