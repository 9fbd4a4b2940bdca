"""Make ``exercises/`` from ``solutions/``, and build the solutions' notebooks with their outputs.

Each exercise is written once, as its solution: ``solutions/NN_name.py``, a percent-format
source like the lessons in ``notebooks/src/`` (cells separated by ``# %%``). The parts a
learner writes are marked, and this script removes them:

- a block between ``# BEGIN SOLUTION: what to write`` and ``# END SOLUTION`` becomes
  ``raise NotImplementedError("what to write")`` at the block's indentation;
- ``NAME = expression  # ANSWER: what it is`` becomes ``NAME = ...  # your answer: what it is``;
- a line ending in ``# SOLUTION ONLY`` is dropped (the solution's own ``assert report.passed``).

It writes ``exercises/NN_name.py`` (the stub source) and ``exercises/NN_name.ipynb`` (the
same cells, no outputs: the learner runs them), and, unless ``--no-run``, executes each
``solutions/NN_name.ipynb`` top to bottom in a fresh kernel (grading included) and writes it
with its outputs, cleaned as the course notebooks are. ``tests/grade/test_grade.py`` fails when
``exercises/`` differs from what this script makes of ``solutions/``.

**nbgrader.** Every exercise also ends with nbgrader's autograded cells, one per check of the
grader (``zerokit/grade/exercises/``), worth the check's points: ``assert`` that
``zerokit.grade(globals(), EXERCISE, checks=[name])`` passed, under ``if __name__ ==
"__main__":`` like every cell that grades (so ``zerokit grade`` loading the notebook skips
them). The exercise notebook carries nbgrader's cell metadata (schema 3): each cell a learner
writes in is a solution cell, each autograded cell a locked grade cell. nbgrader's own source
— the instructor's version, with the answers — is the solution, marked the way nbgrader's
``generate_assignment`` reads it: ``--nbgrader DIR`` writes ``DIR/source/NN_name/NN_name.ipynb``,
where each solution block is ``### BEGIN SOLUTION`` … ``### END SOLUTION`` under a comment
saying what to write (nbgrader replaces a block by its own stub, ``raise
NotImplementedError()``, so the comment keeps the exercise's words), and each ``# ANSWER``
line becomes such a block of its own. The grade ids, cells and points are the exercise
notebook's, so a learner's filled-in ``exercises/NN_name.ipynb`` is also an nbgrader
submission of that assignment. ``tests/grade/test_nbgrader.py`` runs nbgrader's
``generate_assignment`` and ``autograde`` on one exercise and holds its points to ``zerokit grade``'s.

    python tools/make_exercises.py              # everything
    python tools/make_exercises.py 03 05        # the exercises whose names start with 03 or 05
    python tools/make_exercises.py --no-run     # exercises/ only, the solution notebooks not executed
    python tools/make_exercises.py --no-run --nbgrader build/nbgrader   # and nbgrader's source tree
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
CELL_TIMEOUT_S = 180

_BEGIN = re.compile(r"^(\s*)# BEGIN SOLUTION(?::\s*(.*))?$")
_END = re.compile(r"^\s*# END SOLUTION\s*$")
_ANSWER = re.compile(r"^(\s*)([A-Za-z_][A-Za-z_0-9]*)\s*=\s*.+?\s*# ANSWER:\s*(.*)$")
_ONLY = re.compile(r"#\s*SOLUTION ONLY\s*$")
_ENCLOSING = re.compile(r"^(?:def|class)\s+([A-Za-z_][A-Za-z_0-9]*)")

#: nbgrader's delimiters as its documentation writes them (it takes any line holding "BEGIN SOLUTION" or
#: "END SOLUTION" as one: ClearSolutions.begin_solution_delimeter / end_solution_delimeter)
NBGRADER_BEGIN, NBGRADER_END = "### BEGIN SOLUTION", "### END SOLUTION"
#: nbgrader's cell-metadata schema (nbgrader 0.9)
NBGRADER_SCHEMA = 3
_GRADE_ID = re.compile(r"^[A-Za-z0-9_-]+$")


def _notebook_build():
    spec = importlib.util.spec_from_file_location("notebook_build", ROOT / "notebooks" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def strip_solutions(text: str, name: str = "solution") -> str:
    """The exercise made of a solution's source: every marked part replaced (see the module docstring)."""
    out, inside, line_no = [], None, 0
    for line_no, line in enumerate(text.splitlines(), start=1):
        begin = _BEGIN.match(line)
        if inside is not None:
            if _BEGIN.match(line):
                raise ValueError(f"{name}:{line_no}: BEGIN SOLUTION inside the block opened at line {inside}")
            if _END.match(line):
                inside = None
            continue
        if begin:
            indent, what = begin.group(1), (begin.group(2) or "write this part").strip()
            out.append(f"{indent}raise NotImplementedError({what!r})")
            inside = line_no
        elif _END.match(line):
            raise ValueError(f"{name}:{line_no}: END SOLUTION without a BEGIN SOLUTION")
        elif _ONLY.search(line):
            continue
        elif _ANSWER.match(line):
            indent, var, what = _ANSWER.match(line).groups()
            out.append(f"{indent}{var} = ...  # your answer: {what}")
        else:
            out.append(line)
    if inside is not None:
        raise ValueError(f"{name}:{inside}: BEGIN SOLUTION never closed with END SOLUTION")
    return "\n".join(out) + "\n"


def nbgrader_source(text: str, name: str = "solution") -> str:
    """The solution's source as nbgrader's ``generate_assignment`` reads it (see the module docstring).

    ``# BEGIN SOLUTION: what`` becomes ``# to write: what`` over ``### BEGIN SOLUTION``; ``NAME = expression  #
    ANSWER: what`` becomes ``# NAME = your answer: what`` over the line in a block of its own; ``# SOLUTION ONLY``
    lines are dropped, as in the exercise.
    """
    strip_solutions(text, name)  # the markers' nesting, checked once
    out = []
    for line in text.splitlines():
        begin, answer = _BEGIN.match(line), _ANSWER.match(line)
        if begin:
            indent, what = begin.group(1), (begin.group(2) or "write this part").strip()
            out += [f"{indent}# to write: {what}", f"{indent}{NBGRADER_BEGIN}"]
        elif _END.match(line):
            out.append(line[:len(line) - len(line.lstrip())] + NBGRADER_END)
        elif _ONLY.search(line):
            continue
        elif answer:
            indent, var, what = answer.groups()
            code = line[:line.rindex("# ANSWER:")].rstrip()
            out += [f"{indent}# {var} = your answer: {what}", f"{indent}{NBGRADER_BEGIN}", code,
                    f"{indent}{NBGRADER_END}"]
        else:
            out.append(line)
    for line_no, line in enumerate(out, start=1):
        if ("BEGIN SOLUTION" in line or "END SOLUTION" in line) and line.strip() not in (NBGRADER_BEGIN, NBGRADER_END):
            raise ValueError(f"{name}: nbgrader would take this line of its source (line {line_no}) for a "
                             f"delimiter: {line.strip()!r}; write the words another way")
    return "\n".join(out) + "\n"


def _checks_of(stem: str) -> list:
    """The grader's checks of the exercise ``stem`` (zerokit/grade/exercises/)."""
    from zerokit.grade.exercises import get

    return list(get(stem).checks)


def autograded_cells(stem: str) -> str:
    """Percent-format cells appended to the exercise and to nbgrader's source: a note, then one cell per check."""
    text = ("\n# %% [markdown]\n"
            "# **Autograded cells** (nbgrader's): one per check, worth that check's points. A teacher who grades with\n"
            "# nbgrader runs them (`nbgrader autograde`); each asks `zerokit.grade` what the cell above reports, one\n"
            "# check at a time. Leave them as they are.\n")
    for check in _checks_of(stem):
        text += (f"\n# %%\nif __name__ == \"__main__\":  # check `{check.name}`, {check.points} "
                 f"point{'s' if check.points != 1 else ''}\n"
                 f"    report = zerokit.grade(globals(), EXERCISE, checks=[\"{check.name}\"])\n"
                 f"    assert report.passed, report\n")
    return text


def _answer_name(body: str, line_index: int) -> str:
    """The name a marked line answers: an ANSWER line's variable, else the def or class around it."""
    lines = body.splitlines()
    answer = _ANSWER.match(lines[line_index])
    if answer:
        return answer.group(2)
    for line in reversed(lines[:line_index]):
        enclosing = _ENCLOSING.match(line)
        if enclosing:
            return enclosing.group(1)
    return ""


def nbgrader_cells(text: str, stem: str) -> dict:
    """``{cell index: nbgrader metadata}`` of the notebooks made of the solution ``text``, :func:`autograded_cells`
    appended.

    A cell holding a marked part is a solution cell, its grade id ``answer-`` + the first name it answers (the
    function or class around the block, or the ANSWER line's variable); each autograded cell is a locked grade
    cell, its grade id ``check-`` + the check's name, its points the check's.
    """
    cells = _notebook_build().parse_cells(text)
    marks: dict = {}
    for i, (kind, body) in enumerate(cells):
        lines = body.splitlines()
        marked = [k for k, line in enumerate(lines) if _BEGIN.match(line) or _ANSWER.match(line)]
        if not marked or kind == "markdown":
            continue
        name = _answer_name(body, marked[0]) or f"cell-{i}"
        marks[i] = {"grade": False, "grade_id": f"answer-{name}", "locked": False,
                    "schema_version": NBGRADER_SCHEMA, "solution": True}
    first = len(cells) + 1  # after the autograded cells' note
    for k, check in enumerate(_checks_of(stem)):
        marks[first + k] = {"grade": True, "grade_id": f"check-{check.name}", "locked": True,
                            "points": check.points, "schema_version": NBGRADER_SCHEMA, "solution": False}
    ids = [m["grade_id"] for m in marks.values()]
    bad = [g for g in ids if not _GRADE_ID.match(g)] + sorted({g for g in ids if ids.count(g) > 1})
    if bad:
        raise ValueError(f"{stem}: nbgrader grade ids must be unique and of letters, digits, _ and -: {bad}")
    return marks


def notebook_of(text: str, nbgrader: dict = None, locked_editable: bool = False) -> nbformat.NotebookNode:
    """A notebook of a percent-format source's cells, as notebooks/build.py makes them (no outputs).

    ``nbgrader``: ``{cell index: nbgrader metadata}`` (:func:`nbgrader_cells`); ``locked_editable`` False marks its
    locked cells read-only and undeletable, as nbgrader's ``generate_assignment`` does in what it releases.
    """
    build = _notebook_build()
    nb = nbformat.v4.new_notebook()
    cells = build.parse_cells(text)
    if nbgrader and max(nbgrader) >= len(cells):
        raise ValueError(f"nbgrader metadata for cell {max(nbgrader)}, but the notebook has {len(cells)} cells")
    for i, (kind, body) in enumerate(cells):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        cell = make(body)
        cell["id"] = f"c{i:02d}"
        if nbgrader and i in nbgrader:
            cell.metadata["nbgrader"] = dict(nbgrader[i])
            if nbgrader[i]["locked"] and not locked_editable:
                cell.metadata["deletable"] = cell.metadata["editable"] = False
        nb.cells.append(cell)
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    return nb


def expected_exercise_files(source: Path) -> dict:
    """``{path in exercises/: its text}`` that ``source`` (a solution) makes."""
    text = source.read_text()
    stub = strip_solutions(text, source.name) + autograded_cells(source.stem)
    marks = nbgrader_cells(text, source.stem)
    return {EXERCISES / source.name: stub,
            EXERCISES / (source.stem + ".ipynb"): nbformat.writes(notebook_of(stub, marks))}


def nbgrader_source_notebook(source: Path) -> nbformat.NotebookNode:
    """nbgrader's source of the exercise ``source`` (a solution): the instructor's version, answers included."""
    text = source.read_text()
    marks = nbgrader_cells(text, source.stem)
    return notebook_of(nbgrader_source(text, source.name) + autograded_cells(source.stem), marks,
                       locked_editable=True)


def write_nbgrader_source(folder: Path, sources) -> list:
    """``folder/source/NN_name/NN_name.ipynb`` for each solution (an assignment per exercise); the paths written."""
    written = []
    for source in sources:
        path = Path(folder) / "source" / source.stem / (source.stem + ".ipynb")
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nbgrader_source_notebook(source), path)
        written.append(path)
    return written


def run_solution_notebook(source: Path) -> float:
    """Execute the solution's notebook in a fresh kernel (working directory solutions/) and write it with outputs."""
    from nbclient import NotebookClient

    nb = notebook_of(source.read_text())
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", store_widget_state=False,
                            resources={"metadata": {"path": str(SOLUTIONS)}})
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    nbformat.write(_notebook_build().clean(nb), SOLUTIONS / (source.stem + ".ipynb"))
    return elapsed


def solution_sources(prefixes=()) -> list:
    return sorted(p for p in SOLUTIONS.glob("[0-9][0-9]_*.py") if not prefixes or any(p.name.startswith(x)
                                                                                       for x in prefixes))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="only the exercises whose names start with these")
    parser.add_argument("--no-run", action="store_true", help="do not execute the solution notebooks")
    parser.add_argument("--nbgrader", metavar="DIR", type=Path,
                        help="also write nbgrader's source tree, DIR/source/NN_name/NN_name.ipynb (the solutions)")
    args = parser.parse_args(argv)
    sources = solution_sources(args.prefixes)
    if not sources:
        print(f"no solution matches {args.prefixes}", file=sys.stderr)
        return 2
    EXERCISES.mkdir(exist_ok=True)
    for source in sources:
        for path, text in expected_exercise_files(source).items():
            path.write_text(text)
        note = "" if args.no_run else f"  solution notebook run in {run_solution_notebook(source):5.1f} s"
        print(f"{source.stem:<24} exercise written{note}")
    if args.nbgrader is not None:
        for path in write_nbgrader_source(args.nbgrader, sources):
            print(f"nbgrader source written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
