"""``zerokit grade``: grade exercises from the shell — one submission, many, or a class's folder as one table.

Lifecycle: :func:`add_grade_command` puts the ``grade`` subcommand on ``zerokit``'s parser;
:func:`cmd_grade` expands each PATH (a folder: every notebook under it, a subfolder per learner;
a ``.py`` file when named itself; a bare number ``06``: ``exercises/06_*.ipynb``, as the lessons'
closing cells write it), grades every submission, each in a process of its own and ``--jobs`` at
a time (:mod:`.isolate`), and prints every report in full, or with ``--table`` one row per
submission and, for a class (a subfolder per learner, or ``--roster``), the gradebook's grid
(:mod:`.gradebook`), or ``--json``. ``--csv`` writes the grid, ``--feedback`` a file per
learner. The exit status is 0 only when every check of every submission passed (and, with
``--roster``, no work is missing), 1 otherwise, 2 for bad input (``zerokit: error: …``, as
every ``zerokit`` command reports it).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Tuple

from ..runtime.errors import UsageError
from . import class_table, submissions_in
from .exercises import get, KEYS
from .gradebook import Gradebook, read_roster
from .isolate import grade_paths, Job


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


def _not_found(text: str) -> str:
    """What ``zerokit grade TEXT`` says when TEXT names nothing: for an exercise's number, where it looked and why
    it found nothing; always where the exercises are listed."""
    listing = "`zerokit grade --list` lists the exercises"
    if text.isdigit() and len(text) <= 2:
        if not Path("exercises").is_dir():
            return (f"grade: {text} is an exercise's number, looked up in ./exercises, and there is no exercises/ "
                    f"folder here: run it from the repository's root, or give the notebook's path; {listing}")
        return f"grade: there is no exercise numbered {int(text):02d} in ./exercises; {listing}"
    return (f"grade: no such file or folder: {text} (a notebook, a .py file, a folder, or an exercise's number; "
            f"{listing})")


def _submissions(args) -> Tuple[list, bool]:
    """``[(path, label, learner, named)]`` for every PATH, and whether a folder held a subfolder per learner.

    A folder: its notebooks, each the learner's whose subfolder holds it (one directly in the folder is no
    learner's, when the folder has learners' subfolders; otherwise the folder is one learner's, named after it).
    A file: its own, its folder's name for the learner; ``named``: its exercise must be told (else exit 2)."""
    found, classes = [], False
    for text in args.paths:
        path = _by_number(text) or Path(text)
        if not path.exists():
            raise _usage_error(_not_found(text))
        if not path.is_dir():
            found.append((path, str(path), path.resolve().parent.name, True))
            continue
        notebooks = submissions_in(path)
        if not notebooks:
            raise _usage_error(f"grade: {text} holds no notebook (.ipynb); in a folder only notebooks are graded, "
                               f"a .py file when it is named itself")
        per_learner = any(len(nb.relative_to(path).parts) > 1 for nb in notebooks)
        classes |= per_learner
        for nb in notebooks:
            parts = nb.relative_to(path).parts
            learner = parts[0] if len(parts) > 1 else (None if per_learner else path.resolve().name)
            found.append((nb, str(nb.relative_to(path)), learner, False))
    return found, classes


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
    roster = None
    if args.roster is not None:
        try:
            roster = read_roster(args.roster)
        except ValueError as e:
            raise _usage_error(str(e)) from e
    if args.feedback is not None and Path(args.feedback).exists() and not Path(args.feedback).is_dir():
        raise _usage_error(f"--feedback {args.feedback}: a file is there; give a folder (made if need be)")
    found, classes = _submissions(args)
    try:
        reports = grade_paths([Job(path, args.exercise, args.check) for path, _, _, _ in found], args.timeout,
                              args.jobs)
    except ValueError as e:  # an exercise that does not exist, a check it does not have
        raise _usage_error(str(e)) from e
    for (_, label, learner, named), report in zip(found, reports):
        if named and report.exercise == "??":
            raise _usage_error(report.load_error)
        report.submission, report.learner = label, learner
    book = Gradebook.build(reports, roster, [args.exercise] if args.exercise else ())
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=1))
    elif args.table:
        print(class_table(reports))
        if classes or roster is not None:
            print()
            print(book.text())
    else:
        print("\n\n".join(r.text() for r in reports))
    if args.csv is not None:
        print(f"gradebook: {book.write_csv(args.csv)}", file=sys.stderr)
    if args.feedback is not None:
        written = book.write_feedback(args.feedback)
        print(f"feedback: {len(written)} file{'s' if len(written) != 1 else ''} in {args.feedback}", file=sys.stderr)
    everything = all(r.passed for r in reports) and not (roster is not None and book.missing())
    return 0 if everything else 1


def add_grade_command(sub) -> None:
    """The ``grade`` subcommand on ``zerokit``'s subparsers."""
    grade = sub.add_parser("grade", help="grade exercises: a notebook, a .py file, or a folder of submissions",
                           description="Grade exercise submissions on gloo ranks, check by check; exit status 0 "
                                       "only when every check passes.")
    grade.add_argument("paths", nargs="*", metavar="PATH",
                       help="a notebook (.ipynb) or .py file, a folder (every notebook under it; a subfolder per "
                            "learner), or an exercise's number (06: exercises/06_*.ipynb)")
    grade.add_argument("--exercise", metavar="NN",
                       help="the exercise (e.g. 03 or 03_bucketed_ddp); default: from the file name")
    grade.add_argument("--check", action="append", metavar="NAME", help="grade only this check (repeatable)")
    grade.add_argument("--table", action="store_true",
                       help="one row per submission; for a class's folder (a subfolder per learner) the gradebook's "
                            "learner × exercise grid too")
    grade.add_argument("--json", action="store_true", help="the reports as JSON")
    grade.add_argument("--timeout", type=float, metavar="S",
                       help="seconds each run, and the loading of each notebook, may take before it is a hang "
                            "(default: each exercise's own, 60 s; loading 60 s)")
    grade.add_argument("--jobs", type=int, default=1, metavar="N",
                       help="grade N submissions at once, each in a process of its own (default 1)")
    grade.add_argument("--csv", metavar="FILE", help="write the gradebook (learner × exercise: points, status) as CSV")
    grade.add_argument("--roster", metavar="FILE",
                       help="the class's learners, one a line as their folders are named: their missing work shows")
    grade.add_argument("--feedback", metavar="DIR",
                       help="write a feedback file per learner (every check, expected vs measured, the hints)")
    grade.add_argument("--list", action="store_true", help="list the exercises")
    grade.set_defaults(func=cmd_grade)
