"""``zerokit bench SUITE``: step-time ratios of zerokit's strategies against their peers.

Wall-clock times on a shared machine are noisy, so every suite runs zerokit and the
peer in the same invocation, interleaved, and reports medians and their ratio.
Suites live in this package, one module each (``ddp``, ``zero``, ``offload``), with a
``main(argv) -> int``.
"""
from __future__ import annotations

import importlib
import statistics

SUITES = ("ddp", "zero", "offload")


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
