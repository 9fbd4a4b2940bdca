"""``zerokit grade``: grade exercises from the shell — one submission, many, or a class's folder as one table.

Lifecycle: :func:`add_grade_command` puts the ``grade`` subcommand on ``zerokit``'s parser;
:func:`cmd_grade` expands each PATH (a folder: every notebook and ``.py`` under it; a bare number
``06``: ``exercises/06_*.ipynb``, as the lessons' closing cells write it), grades
each submission with :func:`zerokit.grade.grade`, prints every report in full, or with
``--table`` one row per submission (a workshop teacher's view), or ``--json``. The exit
status is 0 only when every check of every submission passed, 1 otherwise, 2 for bad
input (``zerokit: error: …``, as every ``zerokit`` command reports it).
"""
from __future__ import annotations

import json
from pathlib import Path

from ..runtime.errors import UsageError
from . import class_table, grade, grade_folder
from .exercises import get, KEYS


def _usage_error(message: str):
    return UsageError(message)


def _list_exercises() -> str:
    lines = []
    for key in KEYS:
        spec = get(key)
        lines.append(f"{key:<20} {spec.title} — about {spec.minutes} min, {len(spec.checks)} checks, "
                     f"{spec.max_points} points")
    return "\n".join(lines)


def _by_number(text: str):
    """``zerokit grade 06``: the exercise numbered 06 in ./exercises (where a lesson's closing cell sends you), when no
    file or folder of that name exists; None otherwise."""
    if Path(text).exists() or not (text.isdigit() and len(text) <= 2):
        return None
    found = sorted(Path("exercises").glob(f"{int(text):02d}_*.ipynb"))
    return found[0] if found else None


def cmd_grade(args) -> int:
    if args.list:
        print(_list_exercises())
        return 0
    if not args.paths:
        raise _usage_error("grade: give a notebook, a .py file or a folder of them (or --list)")
    if args.exercise is not None:
        try:
            spec = get(args.exercise)
        except ValueError as e:
            raise _usage_error(f"--exercise: {e}") from e
        unknown = sorted(set(args.check or ()) - {c.name for c in spec.checks})
        if unknown:
            raise _usage_error(f"--check {', '.join(unknown)}: exercise {spec.key} has the checks "
                               f"{', '.join(c.name for c in spec.checks)}")
    if args.timeout is not None and not args.timeout > 0:
        raise _usage_error(f"--timeout {args.timeout:g}: must be a positive number of seconds")
    if args.jobs < 1:
        raise _usage_error(f"--jobs {args.jobs}: must be a whole number of submissions graded at once, 1 or more")
    reports = []
    for text in args.paths:
        path = _by_number(text) or Path(text)
        if not path.exists():
            raise _usage_error(f"grade: no such file or folder: {text}")
        try:
            if path.is_dir():
                found = grade_folder(path, args.exercise, timeout_s=args.timeout, jobs=args.jobs)
                if not found:
                    raise _usage_error(f"grade: {text} holds no notebook or .py file")
                reports.extend(found)
            else:
                reports.append(grade(path, args.exercise, checks=args.check, timeout_s=args.timeout))
        except ValueError as e:  # which exercise could not be told, or an unknown one
            raise _usage_error(str(e)) from e
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=1))
    elif args.table:
        print(class_table(reports))
    else:
        print("\n\n".join(r.text() for r in reports))
    return 0 if all(r.passed for r in reports) else 1


def add_grade_command(sub) -> None:
    """The ``grade`` subcommand on ``zerokit``'s subparsers."""
    grade = sub.add_parser("grade", help="grade exercises: a notebook, a .py file, or a folder of submissions",
                           description="Grade exercise submissions on gloo ranks, check by check; exit status 0 "
                                       "only when every check passes.")
    grade.add_argument("paths", nargs="*", metavar="PATH",
                       help="a notebook (.ipynb) or .py file, a folder (every submission under it), or an exercise's "
                            "number (06: exercises/06_*.ipynb)")
    grade.add_argument("--exercise", metavar="NN",
                       help="the exercise (e.g. 03 or 03_bucketed_ddp); default: from the file name")
    grade.add_argument("--check", action="append", metavar="NAME", help="grade only this check (repeatable)")
    grade.add_argument("--table", action="store_true", help="one row per submission (for a class's folder)")
    grade.add_argument("--json", action="store_true", help="the reports as JSON")
    grade.add_argument("--timeout", type=float, metavar="S",
                       help="seconds each run, and the loading of each notebook, may take before it is a hang "
                            "(default: each exercise's own, 60 s; loading 60 s)")
    grade.add_argument("--jobs", type=int, default=1, metavar="N",
                       help="grade N submissions at once, each in a process of its own (default 1)")
    grade.add_argument("--list", action="store_true", help="list the exercises")
    grade.set_defaults(func=cmd_grade)
