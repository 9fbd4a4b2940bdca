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

    python tools/make_exercises.py              # everything
    python tools/make_exercises.py 03 05        # the exercises whose names start with 03 or 05
    python tools/make_exercises.py --no-run     # exercises/ only, the solution notebooks not executed
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


def notebook_of(text: str) -> nbformat.NotebookNode:
    """A notebook of a percent-format source's cells, as notebooks/build.py makes them (no outputs)."""
    build = _notebook_build()
    nb = nbformat.v4.new_notebook()
    for i, (kind, body) in enumerate(build.parse_cells(text)):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        cell = make(body)
        cell["id"] = f"c{i:02d}"
        nb.cells.append(cell)
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    return nb


def expected_exercise_files(source: Path) -> dict:
    """``{path in exercises/: its text}`` that ``source`` (a solution) makes."""
    stub = strip_solutions(source.read_text(), source.name)
    return {EXERCISES / source.name: stub, EXERCISES / (source.stem + ".ipynb"): nbformat.writes(notebook_of(stub))}


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
