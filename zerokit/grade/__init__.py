"""``zerokit.grade``: grade an exercise the way a good teacher would — check by check, on real ranks.

Lifecycle of ``zerokit.grade(submission, exercise=None)``:

1. a notebook or ``.py`` path is graded in a process of its own (:mod:`.isolate`): it is
   loaded there (:mod:`.loader`), its scenarios run from there, and only their measurements,
   as plain data (:mod:`.wire`), come back to be judged here, where its code never ran. A
   module or a live namespace (``globals()`` from the exercise notebook itself) is graded in
   this process, where its code already runs — zerokit's choice: the learner's own kernel has
   no other submission to protect;
2. find the exercise (:mod:`.exercises`): the ``exercise`` argument ("01" or
   "01_ring_allreduce"), else the submission's ``EXERCISE`` variable or file name;
3. run its checks (:mod:`.core`): each scenario on gloo ranks through
   :func:`zerokit.launch` with a timeout, the learner's collectives recorded by
   :mod:`.probe`, each check judged against the single-process reference
   (:mod:`.reference`) and :mod:`zerokit.theory`;
4. return a :class:`~.report.GradeReport`: pass/fail, points, expected vs measured, a hint
   per failed check, and the score; ``exit_status`` is 0 only when every check passed.

:func:`grade_folder` grades a class's folder (its notebooks, ``jobs`` at a time); the
gradebook's grid, statuses, CSV and feedback files are :mod:`.gradebook`'s.

``hint(exercise, n)`` unfolds an exercise's hints one at a time, from the concept to the
code. The module itself is callable, so ``zerokit.grade(...)`` and ``from zerokit.grade
import grade`` are the same function; ``zerokit grade FILE`` is the shell's way (:mod:`.cli`).
"""
from __future__ import annotations

import sys
import textwrap
import time
import types
from pathlib import Path
from typing import Optional, Sequence

from . import core, isolate, loader
from .core import CheckResult, Exercise, Fail
from .exercises import get, KEYS
from .report import class_table, GradeReport, WIDTH

__all__ = ["grade", "grade_folder", "hint", "checks", "GradeReport", "CheckResult", "Exercise", "Fail",
           "class_table"]


def _exercise(key) -> Exercise:
    return get(key)


def grade(submission, exercise: Optional[str] = None, checks: Optional[Sequence[str]] = None,
          timeout_s: Optional[float] = None) -> Optional[GradeReport]:
    """Grade ``submission`` (a notebook or .py path, a module, or ``globals()``) on ``exercise``.

    ``checks`` grades only the named checks; ``timeout_s`` overrides every scenario's timeout and
    the time a notebook may take to load. A path is graded in a process of its own.
    Returns None when called by a submission's own code while the grader loads it.
    """
    if loader.is_loading():
        return None
    isolate.check_timeout(timeout_s)
    if isinstance(submission, (str, Path)):
        report = isolate.grade_paths([isolate.Job(Path(submission), exercise, checks)], timeout_s)[0]
        if report.exercise == "??":
            raise ValueError(report.load_error)
        return report
    start = time.perf_counter()
    ns, label, load_error = None, str(submission), None
    try:
        ns, label = loader.load(submission)
    except loader.LoadError as e:
        load_error = str(e)
    key = exercise or loader.exercise_key(submission, ns)
    if key is None:
        raise ValueError(f"grade: which exercise does {label} answer? Pass exercise='01' (one of "
                         f"{', '.join(KEYS)}), or name the file after it, e.g. 01_ring_allreduce.ipynb")
    spec = _exercise(key)
    if load_error is not None:
        chosen = [c for c in spec.checks if checks is None or c.name in checks]
        results = [CheckResult(c.name, c.points, False, f"not run: {load_error}", kind="load-error") for c in chosen]
    else:
        results = core.run(spec, ns, checks, timeout_s)
    return GradeReport(spec.key, spec.title, label, results, time.perf_counter() - start, load_error)


def submissions_in(folder) -> list:
    """The notebooks under ``folder`` (recursively), checkpoints and hidden folders left out.

    Only notebooks: a ``.py`` beside one is its paired copy (the course ships both), not a second
    submission; a ``.py`` file is graded when it is named itself."""
    root = Path(folder)
    found = [p for p in root.rglob("*.ipynb") if p.is_file()
             and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(root).parts)]
    return sorted(found)


def grade_folder(folder, exercise: Optional[str] = None, timeout_s: Optional[float] = None, jobs: int = 1) -> list:
    """A :class:`GradeReport` for every notebook under ``folder``, labelled by its path inside it, each graded in a
    process of its own, ``jobs`` at a time. A notebook in a subfolder is that learner's (``report.learner``)."""
    folder = Path(folder)
    paths = submissions_in(folder)
    reports = isolate.grade_paths([isolate.Job(p, exercise) for p in paths], timeout_s, jobs)
    for path, report in zip(paths, reports):
        parts = path.relative_to(folder).parts
        report.submission = str(path.relative_to(folder))
        report.learner = parts[0] if len(parts) > 1 else None
    return reports


_shown: dict = {}


def hint(exercise: str, n: Optional[int] = None) -> None:
    """Print hint ``n`` (from 1) of ``exercise``, or, without ``n``, the next one not yet shown.

    An exercise's hints go from the concept to the code: the first names the concept in words, the next ones narrow
    down to what each function does, and only the last shows code — so a learner stops at the first that unblocks
    them. A hint in words is wrapped to the report's width; code keeps its lines."""
    spec = _exercise(exercise)
    if not spec.hints:
        print(f"exercise {spec.key} has no hints")
        return
    if n is None:
        n = _shown.get(spec.key, 0) + 1
    if not 1 <= n <= len(spec.hints):
        print(f"exercise {spec.key} has hints 1 to {len(spec.hints)}")
        return
    _shown[spec.key] = max(_shown.get(spec.key, 0), n)
    more = f" (hint({spec.number!r}) shows hint {n + 1})" if n < len(spec.hints) else " (the last one)"
    text = spec.hints[n - 1]
    body = text if "\n" in text else textwrap.fill(text, WIDTH, break_on_hyphens=False, break_long_words=False)
    print(f"Hint {n} of {len(spec.hints)}{more}:\n{body}")


def checks(exercise: str) -> str:
    """The checks of ``exercise`` with their points, as a table."""
    spec = _exercise(exercise)
    width = max(len(c.name) for c in spec.checks)
    lines = [f"Exercise {spec.key} · {spec.title} — about {spec.minutes} min, {spec.max_points} points"]
    lines += [f"  {c.name.ljust(width)}  {c.points} pt{'s' if c.points != 1 else ' '}  {c.concept}"
              for c in spec.checks]
    return "\n".join(lines)


class _CallableModule(types.ModuleType):
    """``zerokit.grade(...)`` calls :func:`grade`; ``zerokit.grade.hint`` and the rest stay attributes."""

    def __call__(self, submission, exercise: Optional[str] = None, **kwargs):
        return grade(submission, exercise, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
