"""A class's gradebook: learners × exercises, a status and points per cell, totals — as a grid, a CSV, and a
feedback file per learner.

Lifecycle: ``zerokit grade`` grades a class's folder (a subfolder per learner) and hands the
reports, each with its ``learner``, to :meth:`Gradebook.build`, with the roster when there is
one (:func:`read_roster`: one name a line). A cell is a learner's notebook answering an exercise;
its status (:attr:`.report.GradeReport.status`) comes from why its checks failed:

- ``passed`` — every check passed;
- ``not started`` — no check passed, and each failed because the code still raises
  NotImplementedError or the answer is still ``...`` (the untouched exercise);
- ``hang`` — a run, or the loading, did not finish in time;
- ``error`` — the notebook did not load, a rank raised or skipped a collective, the submission's
  process ended early, a name the exercise needs is gone, or the judge could not read what the
  code returned;
- ``wrong`` — everything ran, and some check found a wrong answer (a partial one included);
- ``missing`` — no notebook of the learner's answers the exercise (a learner on the roster with
  no folder: every cell).

Two notebooks of one learner answering the same exercise (a "-Copy1"): the cell counts the better one
(on a tie, the one named as the exercise), and the grid says so. :meth:`Gradebook.text` prints the grid (exercises by number, their names below,
a total per learner, how many passed per exercise, the missing work); :meth:`Gradebook.write_csv`
writes it for a spreadsheet (points, maximum and status per exercise; total); and
:meth:`Gradebook.write_feedback` writes one Markdown file per learner — every exercise's checks
with their points, what matched, expected vs measured, the hints — as nbgrader's
``generate_feedback`` gives each student.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .exercises import get, KEYS
from .report import GradeReport

STATUSES = ("passed", "wrong", "error", "hang", "not started", "missing")


def read_roster(path) -> List[str]:
    """The learners' names in a roster file: one a line, as their folders are named; blank lines and ``#`` comments
    are skipped. Raises ``ValueError`` naming the file for an unreadable, empty or repeating roster."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--roster {path}: cannot read it ({e})") from e
    names = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    names = [name for name in names if name]
    if not names:
        raise ValueError(f"--roster {path}: no names in it (one learner a line, named as their folder)")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"--roster {path}: {', '.join(twice)} listed more than once")
    return names


@dataclass
class Cell:
    """A learner's work on one exercise: the notebook that counts (None: missing) and any others that answer it."""

    exercise: str
    report: Optional[GradeReport] = None
    others: List[GradeReport] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "missing" if self.report is None else self.report.status

    @property
    def points(self) -> int:
        return 0 if self.report is None else self.report.points

    @property
    def max_points(self) -> int:
        return get(self.exercise).max_points

    def text(self) -> str:
        if self.report is None:
            return "— missing"
        return f"{self.points}/{self.max_points} {self.status}" + (" *" if self.others else "")


def _rank(report: GradeReport) -> Tuple[int, bool]:
    """Which of a learner's notebooks for one exercise counts: more points, then the exercise's own file name."""
    return report.points, Path(report.submission).name == f"{report.exercise}.ipynb"


class Gradebook:
    """``cells[learner][exercise]``: a :class:`Cell` for every learner (the roster's first, in its order) and every
    exercise (course order)."""

    def __init__(self, learners: List[str], exercises: List[str], cells: Dict[str, Dict[str, Cell]],
                 roster: Optional[Sequence[str]], not_graded: List[GradeReport]):
        self.learners, self.exercises, self.cells = learners, exercises, cells
        self.roster = list(roster) if roster is not None else None
        #: notebooks outside any learner's folder, or answering no exercise that could be told
        self.not_graded = not_graded

    @classmethod
    def build(cls, reports: Sequence[GradeReport], roster: Optional[Sequence[str]] = None,
              exercises: Sequence[str] = ()) -> "Gradebook":
        """The gradebook of ``reports`` (each with its ``learner``); ``exercises``: keys that get a column even when
        no notebook answers them (``--exercise``)."""
        mine = [r for r in reports if r.learner is not None and r.exercise in KEYS]
        not_graded = [r for r in reports if r not in mine]
        keys = {get(k).key for k in exercises} | {r.exercise for r in mine}
        columns = [k for k in KEYS if k in keys]
        found = sorted({r.learner for r in mine})
        learners = list(roster or []) + [name for name in found if name not in (roster or [])]
        cells = {name: {key: Cell(key) for key in columns} for name in learners}
        for r in mine:
            cell = cells[r.learner][r.exercise]
            if cell.report is None:
                cell.report = r
            else:  # the better notebook counts (on a tie, the one named as the exercise); the other is named
                best, other = (r, cell.report) if _rank(r) > _rank(cell.report) else (cell.report, r)
                cell.report = best
                cell.others.append(other)
        return cls(learners, columns, cells, roster, not_graded)

    def total(self, learner: str) -> Tuple[int, int]:
        row = self.cells[learner].values()
        return sum(c.points for c in row), sum(c.max_points for c in row)

    def missing(self) -> List[Tuple[str, List[str]]]:
        """``(learner, [exercises])`` for every learner with missing work."""
        out = []
        for name in self.learners:
            keys = [key for key, cell in self.cells[name].items() if cell.report is None]
            if keys:
                out.append((name, keys))
        return out

    @property
    def complete(self) -> bool:
        """Every cell passed."""
        return all(cell.status == "passed" for row in self.cells.values() for cell in row.values())

    def _label(self, learner: str) -> str:
        if self.roster is not None and learner not in self.roster:
            return f"{learner} (not on the roster)"
        return learner

    def text(self) -> str:
        """The grid: a row per learner, a column per exercise (by number; the names below), the total."""
        head = ["learner"] + [key[:2] for key in self.exercises] + ["total"]
        rows = [head]
        for name in self.learners:
            points, most = self.total(name)
            rows.append([self._label(name)] + [self.cells[name][key].text() for key in self.exercises]
                        + [f"{points}/{most}"])
        passed = [sum(self.cells[name][key].status == "passed" for name in self.learners) for key in self.exercises]
        rows.append(["passed"] + [f"{n} of {len(self.learners)}" for n in passed] + [""])
        widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.insert(len(lines) - 1, "  ".join("-" * w for w in widths))
        lines += [f"{key[:2]}: {key} — {get(key).title}, {get(key).max_points} points" for key in self.exercises]
        for name in self.learners:
            for key, cell in self.cells[name].items():
                if cell.others:
                    lines.append(f"* {name}: {len(cell.others) + 1} notebooks answer {key}; {cell.report.submission} "
                                 f"counts, not {', '.join(o.submission for o in cell.others)}")
        missing = self.missing()
        if missing:
            seen = {name for name in self.learners if any(c.report for c in self.cells[name].values())}
            lines.append("missing work: " + "; ".join(
                f"{name} — {', '.join(keys) if name in seen else 'no notebook at all'}" for name, keys in missing))
        for r in self.not_graded:
            why = "outside any learner's folder" if r.exercise in KEYS else (r.load_error or "which exercise?")
            lines.append(f"not in the grid: {r.submission} — {why}")
        return "\n".join(lines)

    def write_csv(self, path) -> Path:
        """The grid as CSV: learner, on the roster, then points, maximum and status per exercise, then the total."""
        path = Path(path)
        with path.open("w", newline="", encoding="utf-8") as f:
            out = csv.writer(f)
            head = ["learner", "on_roster"]
            for key in self.exercises:
                head += [f"{key} points", f"{key} max", f"{key} status"]
            out.writerow(head + ["total", "max"])
            for name in self.learners:
                on = "" if self.roster is None else ("yes" if name in self.roster else "no")
                row = [name, on]
                for key in self.exercises:
                    cell = self.cells[name][key]
                    row += [cell.points, cell.max_points, cell.status]
                out.writerow(row + list(self.total(name)))
        return path

    def write_feedback(self, folder) -> List[Path]:
        """One Markdown file per learner in ``folder`` (made if need be): ``<learner>.md``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        written, used = [], set()
        for name in self.learners:
            stem = re.sub(r"[^\w.-]+", "_", name).strip("._") or "learner"
            while stem in used:
                stem += "_"
            used.add(stem)
            path = folder / f"{stem}.md"
            path.write_text(self.feedback(name), encoding="utf-8")
            written.append(path)
        return written

    def feedback(self, learner: str) -> str:
        """A learner's feedback: the total, a line per exercise, then each exercise's report in full."""
        points, most = self.total(learner)
        lines = [f"# Feedback for {learner}", "", f"Total: {points}/{most} points.", "",
                 "| exercise | status | points |", "|---|---|---|"]
        for key, cell in self.cells[learner].items():
            lines.append(f"| {key} | {cell.status} | {cell.points}/{cell.max_points} |")
        for key, cell in self.cells[learner].items():
            spec = get(key)
            lines += ["", f"## {key[:2]} · {spec.title} — {cell.status}, {cell.points}/{cell.max_points}", ""]
            if cell.report is None:
                lines.append(f"No notebook of yours answers this exercise (exercises/{key}.ipynb, handed in as "
                             f"{key}.ipynb).")
                continue
            lines += [f"Graded: `{cell.report.submission}`."
                      + (f" Also handed in: {', '.join(f'`{o.submission}`' for o in cell.others)} "
                         f"(the better one counts)." if cell.others else ""), "",
                      "```text", cell.report.text(), "```"]
        return "\n".join(lines) + "\n"
