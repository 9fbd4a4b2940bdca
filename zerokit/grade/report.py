"""What a grading found, as a learner reads it and as a workshop teacher tabulates it.

Lifecycle: :func:`zerokit.grade` fills one :class:`GradeReport` per submission with the
:class:`~.core.CheckResult` of every check; ``text()`` (also its ``repr``, so a notebook
cell shows it) prints one line per check — pass or FAIL, points, what matched or what
did not, expected vs measured, the rank, a hint — then the score. ``to_dict`` gives the
same as JSON. :func:`class_table` puts many reports in one table, one row per
submission, for ``zerokit grade --table submissions/``.
"""
from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass, field
from typing import List, Optional

from .core import CheckResult

WIDTH = 100
#: the failure kinds (:attr:`.core.CheckResult.kind`) behind each status
_NOT_STARTED = {"not-implemented", "not-answered"}
_HANG = {"hang", "load-hang"}
_ERROR = {"error", "load-error", "crashed", "missing-name", "unreadable"}


def _number(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() and abs(value) >= 1000 else f"{value:.6g}"
    return str(value)


@dataclass
class GradeReport:
    exercise: str
    title: str
    submission: str
    results: List[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    #: why no check ran: the submission could not be loaded, or its process stopped first (every check says so)
    load_error: Optional[str] = None
    #: the learner whose work it is (a class's folder: the subfolder's name); None when not known
    learner: Optional[str] = None
    #: the last lines the submission's process printed (its own prints, its ranks' output, a hang's stacks): kept
    #: here, out of the report's text, the table and the JSON
    output: str = ""

    @property
    def points(self) -> int:
        return sum(r.earned for r in self.results)

    @property
    def max_points(self) -> int:
        return sum(r.points for r in self.results)

    @property
    def passed(self) -> bool:
        """Every check passed (and there was at least one)."""
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def status(self) -> str:
        """A gradebook's word for it (:mod:`.gradebook`): passed, not started, hang, error or wrong — from why its
        checks failed."""
        if self.passed:
            return "passed"
        if not self.results:  # which exercise it answers could not be told
            return "error"
        failed = [r.kind for r in self.results if not r.passed]
        if not any(r.passed for r in self.results) and all(kind in _NOT_STARTED for kind in failed):
            return "not started"
        if any(kind in _HANG for kind in failed):
            return "hang"
        if any(kind in _ERROR for kind in failed):
            return "error"
        return "wrong"

    @property
    def exit_status(self) -> int:
        return 0 if self.passed else 1

    def failed(self) -> List[CheckResult]:
        return [r for r in self.results if not r.passed]

    def result(self, name: str) -> CheckResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no check {name!r}; checks: {', '.join(r.name for r in self.results)}")

    def summary(self) -> str:
        done = sum(r.passed for r in self.results)
        verdict = "all checks pass" if self.passed else f"{len(self.results) - done} to fix"
        return (f"Score: {self.points}/{self.max_points} points — {done} of {len(self.results)} checks passed, "
                f"{verdict} ({self.seconds:.1f} s).")

    def text(self) -> str:
        lines = [f"Exercise {self.exercise[:2]} · {self.title} — {self.submission}"]
        if self.load_error:
            loading = not self.results or any(r.kind in ("load-error", "load-hang") for r in self.results)
            what = "could not load the submission" if loading else "the grading stopped"
            lines.append(_wrap(f"{what}: {self.load_error}", "  "))
        width = max((len(r.name) for r in self.results), default=0)
        for r in self.results:
            mark = "✓ pass" if r.passed else "✗ FAIL"
            head = f"  {mark}  {r.name.ljust(width)}  {r.earned}/{r.points}  "
            lines.append(_wrap(r.detail, " " * len(head), first=head))
            if not r.passed:
                if r.expected is not None or r.measured is not None:
                    where = f" (rank {r.rank})" if r.rank is not None else ""
                    lines.append(f"{' ' * 10}expected: {_number(r.expected)}   measured: {_number(r.measured)}{where}")
                if r.hint:
                    lines.append(_wrap(f"hint: {r.hint}", " " * 16, first=" " * 10))
        lines.append(self.summary())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()

    def to_dict(self) -> dict:
        return {"exercise": self.exercise, "title": self.title, "submission": self.submission,
                "learner": self.learner, "status": self.status,
                "points": self.points, "max_points": self.max_points, "passed": self.passed,
                "seconds": round(self.seconds, 2), "load_error": self.load_error,
                "checks": [{**asdict(r), "expected": _json(r.expected), "measured": _json(r.measured),
                            "earned": r.earned} for r in self.results]}


def _json(value):
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def _wrap(text: str, indent: str, first: Optional[str] = None) -> str:
    return textwrap.fill(text, WIDTH, initial_indent=indent if first is None else first, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False)


def class_table(reports: List[GradeReport]) -> str:
    """One row per submission: exercise, points, and the checks it failed."""
    rows = [("submission", "exercise", "points", "checks", "failed")]
    for r in reports:
        failed = ", ".join(c.name for c in r.failed()) or ("could not load" if r.load_error else "—")
        rows.append((r.submission, r.exercise, f"{r.points}/{r.max_points}",
                     f"{sum(c.passed for c in r.results)}/{len(r.results)}", failed))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for k, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4])
        if k == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    complete = sum(r.passed for r in reports)
    lines.append(f"{len(reports)} submission{'s' if len(reports) != 1 else ''}, {complete} with every check passing")
    return "\n".join(lines)
