"""``zerokit bench``: the subcommand that runs one suite, or every suite with ``--quick``.

Lifecycle: :func:`add_bench_command` puts ``bench`` on ``zerokit``'s parser; :func:`cmd_bench`
checks the suite name (bad input: ``zerokit: error: …``, exit 2, as every command reports
it) and hands the rest of the command line to the suite's own parser.
"""
from __future__ import annotations

import argparse

from .. import bench
from ..runtime.errors import UsageError
from . import SUITES

ALL = SUITES


def cmd_bench(args) -> int:
    if args.quick:
        if args.suite or args.rest:
            raise UsageError("bench --quick runs every suite; give no suite with it")
        return bench.quick()
    if not args.suite:
        raise UsageError(f"bench: name a suite ({', '.join(ALL)}) or give --quick")
    if args.suite not in SUITES:
        raise UsageError(f"bench suite {args.suite!r} is unknown; allowed: {', '.join(ALL)}")
    return bench.main(args.suite, args.rest)


def add_bench_command(sub) -> None:
    parser = sub.add_parser("bench", help="step-time ratios against the peers (see benchmarks/)")
    parser.add_argument("--quick", action="store_true", help="every suite, one short round each (minutes)")
    parser.add_argument("suite", nargs="?", help=", ".join(ALL[:-1]) + " or " + ALL[-1])
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(func=cmd_bench)
