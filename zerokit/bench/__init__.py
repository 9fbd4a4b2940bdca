"""``zerokit bench SUITE``: step-time ratios of zerokit's strategies against their peers.

Wall-clock times on a shared machine are noisy, so every suite runs zerokit and the
peer in the same invocation, interleaved, and reports medians and their ratio.
Suites live in this package, one module each (``ddp``, ``zero``, ``offload``, ``pipeline``,
``scaling``, ``sizes``, ``link``), with a ``main(argv) -> int``; they share the interleaved runner
(:mod:`.rounds`), the flags every suite takes (:func:`suite_parser`) and the printing (:mod:`.table`:
tables, load average, noise). ``zerokit bench --quick`` runs every suite with one round of
few steps at 2 ranks (:data:`QUICK`): a smoke run of the whole benchmark, minutes on 2 cores,
too short for the ratios to mean much.
"""
from __future__ import annotations

import argparse
import importlib
import statistics

SUITES = ("ddp", "zero", "offload", "pipeline", "scaling", "sizes", "link", "cp_ep")
#: every suite's arguments for ``--quick``
QUICK = {
    "ddp": ["--world-sizes", "2", "--bucket-mb", "1", "--steps", "3", "--rounds", "1", "--no-heavy", "--quiet"],
    "zero": ["--world-sizes", "2", "--steps", "3", "--rounds", "1", "--quiet"],
    "offload": ["--sizes", "1e6", "--repeats", "3", "--steps", "3", "--rounds", "1", "--quiet"],
    "pipeline": ["--steps", "3", "--rounds", "1", "--quiet"],
    "scaling": ["--world-sizes", "2", "3", "--out", "benchmarks/scaling-quick.png", "--quiet"],
    "sizes": ["--sizes", "0.5M", "5M", "--strategies", "ddp", "zero3", "torch-ddp", "--steps", "3", "--rounds", "1",
              "--out", "out/bench-quick/model-size.png", "--quiet"],
    "link": ["--bandwidths", "1e8", "--steps", "3", "--rounds", "1", "--out", "out/bench-quick/link-bandwidth.png",
             "--quiet"],
    "cp_ep": ["--steps", "3", "--rounds", "1", "--quiet"],
}


def quick() -> int:
    """Every suite, one short round each; the total time at the end (the budget: 5 minutes on 2 cores)."""
    import time

    start, worst = time.perf_counter(), 0
    for suite in SUITES:
        print(f"\n=== zerokit bench {suite} (quick) ===", flush=True)
        worst = max(worst, main(suite, QUICK[suite]))
    print(f"\nzerokit bench --quick: {len(SUITES)} suites in {time.perf_counter() - start:.0f} s")
    return worst


def main(suite: str, argv) -> int:
    if suite not in SUITES:
        raise ValueError(f"bench suite={suite!r} is unknown; allowed: {', '.join(SUITES)}")
    try:
        module = importlib.import_module(f"{__name__}.{suite}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{suite}":
            raise
        raise ValueError(f"bench suite {suite!r} is not built yet") from None
    return module.main(list(argv))


def median(values) -> float:
    return statistics.median(values)


def ratio(ours: float, peer: float) -> float:
    """ours / peer: below 1.0 is faster than the peer."""
    return ours / peer if peer else float("inf")


def suite_parser(suite: str, doc: str, *, steps: int = None, rounds: int = None, timeout: float = 300.0,
                 json: str = None, steps_help: str = "steps per run (the first is left out)"):
    """``zerokit bench SUITE``'s parser, with the flags the suites share: ``--steps`` and ``--rounds`` (when given
    a default), ``--timeout``, ``--json`` (when given its help: what the file holds) and ``--quiet``."""
    parser = argparse.ArgumentParser(prog=f"zerokit bench {suite}", description=doc.splitlines()[0])
    if steps is not None:
        parser.add_argument("--steps", type=int, default=steps, help=steps_help)
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds, help="interleaved repetitions of every configuration")
    parser.add_argument("--timeout", type=float, default=timeout, help="seconds per run before it counts as hung")
    if json is not None:
        parser.add_argument("--json", metavar="FILE", help=f"also write {json} to FILE")
    parser.add_argument("--quiet", action="store_true", help="no per-run progress lines")
    return parser
