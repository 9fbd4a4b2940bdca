"""How every bench suite prints: one table format, the machine and its load, and how noisy the run was.

A suite collects its rows (dicts) and hands them to :func:`table` with its columns, each
``(header, key, format)``: ``key`` names a field of the row or is a function of the row,
``format`` a format spec (``".1f"``, ``","``, ``"s"``) or a function of the value. A value
of None prints "—": not measured (a peer's exposed communication the ledger cannot see, a
ratio without a peer). Text columns are left-aligned, numbers right-aligned.

Wall-clock times on a shared machine drift with its load, so every suite prints
:func:`machine` (with the load average) at the start and :func:`conditions` at the end: the
load average again and the noise, IQR / median of the step times of each configuration
(every step of every round, the warm-up steps left out).
"""
from __future__ import annotations

import os
import platform
import statistics
from typing import Callable, Optional, Sequence, Union

import torch

Column = tuple  # (header, key: str | callable(row), format: str | callable(value))


def _cell(row, key: Union[str, Callable], fmt: Union[str, Callable]) -> str:
    value = key(row) if callable(key) else row.get(key)
    if value is None:
        return "—"
    if callable(fmt):
        return fmt(value)
    return format(value, fmt)


def table(title: str, columns: Sequence[Column], rows: Sequence[dict]) -> str:
    """``title``, then a header line and one line per row, each column as wide as its widest cell."""
    cells = [[_cell(row, key, fmt) for _, key, fmt in columns] for row in rows]
    widths = [max([len(header)] + [len(line[i]) for line in cells]) for i, (header, _, _) in enumerate(columns)]
    left = [fmt == "s" for _, _, fmt in columns]

    def line(values):
        return "  ".join(v.ljust(w) if l else v.rjust(w) for v, w, l in zip(values, widths, left)).rstrip()

    return "\n".join([title, line([header for header, _, _ in columns])] + [line(c) for c in cells])


def ms(value: float) -> str:
    """Seconds as milliseconds, one decimal."""
    return f"{1000 * value:.1f}"


def mib(value: float) -> str:
    """Bytes as MiB, three decimals."""
    return f"{value / 2 ** 20:.3f}"


def load_average() -> str:
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def machine() -> str:
    """The machine, the torch build and the load average now (one line)."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {load_average()}"


def noise(times: Sequence[float]) -> Optional[float]:
    """IQR / median of step times (None for fewer than 2): 0.1 means the middle half spans 10 % of the median."""
    if len(times) < 2:
        return None
    q1, q2, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / q2 if q2 else None


def conditions(rows: Sequence[dict], start_load: str, label: Callable[[dict], str]) -> str:
    """The load at the start and now, and the noise of the run: the median and the worst IQR / median over
    the configurations (rows with a ``noise`` field), naming the worst."""
    noisy = [r for r in rows if r.get("noise") is not None]
    text = f"conditions: {start_load} at the start, {load_average()} at the end"
    if not noisy:
        return text + "; noise not measurable (fewer than 2 timed steps per configuration)"
    worst = max(noisy, key=lambda r: r["noise"])
    return (text + f"; noise (IQR / median of each configuration's step times): median "
            f"{statistics.median(r['noise'] for r in noisy):.2f}, worst {worst['noise']:.2f} ({label(worst)})")


def progress_log(quiet: bool) -> Callable[[str], None]:
    """Where a suite's per-run progress lines go: standard error, or nowhere with ``--quiet``."""
    import sys

    if quiet:
        return lambda line: None
    return lambda line: print(line, file=sys.stderr, flush=True)


def minor_label(value, _) -> str:
    """Label the 2s and 5s between the decades of a log axis, plainly (0.5, 2, 20), and no other minor tick."""
    import math

    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if mantissa in (2, 5) else ""
