"""nbgrader, the tool teachers already run, grades an exercise as ``zerokit grade`` does.

``tools/make_exercises.py --nbgrader DIR`` writes nbgrader's source of each exercise (the solution, its answers
between ``### BEGIN SOLUTION`` and ``### END SOLUTION``, one autograded cell per check); the exercise notebooks
carry the same cell metadata. Here, in a course directory of its own (its ``nbgrader_config.py``, a sqlite
gradebook, everything under pytest's tmp, nothing fetched), nbgrader 0.9's ``generate_assignment`` releases
exercise 02 (the cheapest to run: its solution notebook runs in about 4 s) and ``autograde`` grades four
submissions — the exercise filled in with the solution, the same with a planted mistake, the untouched exercise,
and nbgrader's own released notebook untouched — and every autograded cell's score is the points
``zerokit grade`` gives that check on the same file.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from zerokit.grade import grade
from zerokit.grade.exercises import get

ROOT = Path(__file__).resolve().parents[2]
KEY = "02_naive_ddp"
SOLUTION = ROOT / "solutions" / f"{KEY}.py"
#: a planted mistake (tests/grade/test_grade.py's "forgetting to average"): some checks fail, not all
NOT_AVERAGED = ("            p.grad.div_(n)\n", "")

#: nbgrader runs its gradebook's migrations with the ``alembic`` command: the one beside this Python
PATH = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _tool():
    spec = importlib.util.spec_from_file_location("make_exercises", ROOT / "tools" / "make_exercises.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nbgrader(course: Path, *args: str) -> str:
    """``python -m nbgrader ARGS`` run in the course directory (its nbgrader_config.py is read from there)."""
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **PATH})
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _filled(exercise: dict, solution_text: str, cells) -> dict:
    """The exercise notebook with every solution cell holding the solution's cell: a learner's finished work."""
    nb = json.loads(json.dumps(exercise))
    for i, cell in enumerate(nb["cells"]):
        if cell["metadata"].get("nbgrader", {}).get("solution"):
            kind, body = cells(solution_text)[i]
            assert kind == "code"
            cell["source"] = body
    return nb


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course directory, exercise 02 released and four submissions autograded: (course, {student: path})."""
    tool = _tool()
    course = tmp_path_factory.mktemp("course")
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        "c.CourseDirectory.course_id = 'zerokit'\n"
        f"c.CourseDirectory.db_url = 'sqlite:///{course / 'gradebook.db'}'\n"
        "c.Execute.timeout = 300  # a cell's limit; zerokit.grade bounds each run it starts itself\n")
    [source] = tool.write_nbgrader_source(course, [SOLUTION])
    assert source == course / "source" / KEY / f"{KEY}.ipynb"
    _nbgrader(course, "generate_assignment", KEY, "--force")
    released = json.loads((course / "release" / KEY / f"{KEY}.ipynb").read_text())

    exercise = json.loads((ROOT / "exercises" / f"{KEY}.ipynb").read_text())
    solution_text = SOLUTION.read_text()
    cells = tool._notebook_build().parse_cells
    with_mistake = solution_text.replace(*NOT_AVERAGED)
    assert with_mistake != solution_text
    notebooks = {"solved": _filled(exercise, solution_text, cells),
                 "not-averaged": _filled(exercise, with_mistake, cells),
                 "untouched": exercise,
                 "nbgrader-release": released}
    paths = {}
    for student, nb in notebooks.items():
        path = course / "submitted" / student / KEY / f"{KEY}.ipynb"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(nb))
        paths[student] = path
    _nbgrader(course, "autograde", KEY, "--force")
    return course, paths, released


def _nbgrader_scores(course: Path, student: str) -> dict:
    """{grade id: score} of the student's autograded cells, read from the course's gradebook."""
    from nbgrader.api import Gradebook

    with mock.patch.dict(os.environ, PATH), Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        notebook = gb.find_submission_notebook(KEY, KEY, student)
        return {g.name: g.score for g in notebook.grades if g.max_score_gradecell}


@pytest.mark.slow
def test_generate_assignment_releases_the_exercise_without_its_answers(course):
    _, _, released = course
    code = "\n".join("".join(c["source"]) for c in released["cells"] if c["cell_type"] == "code")
    assert "p.grad.div_(n)" not in code and "inputs[rows]" not in code and "BEGIN SOLUTION" not in code
    assert code.count("raise NotImplementedError()") == 2  # nbgrader's stub, one per solution block
    assert "# to write: all-reduce (sum) every p.grad" in code  # what to write, kept above nbgrader's stub
    graded = {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["nbgrader"]["points"]
              for c in released["cells"] if c["metadata"].get("nbgrader", {}).get("grade")}
    assert graded == {f"check-{c.name}": c.points for c in get(KEY).checks}


@pytest.mark.slow
@pytest.mark.parametrize("student, total", [("solved", 10), ("not-averaged", None), ("untouched", 0),
                                            ("nbgrader-release", 0)])
def test_autograde_gives_zerokit_grades_points_check_by_check(course, student, total):
    directory, paths, _ = course
    scores = _nbgrader_scores(directory, student)
    report = grade(paths[student])
    assert scores == {f"check-{r.name}": float(r.earned) for r in report.results}, report.text()
    assert sum(scores.values()) == report.points
    if total is not None:
        assert report.points == total
    else:  # the planted mistake: the gradient and the parameters are wrong, the shards and the traffic right
        assert 0 < report.points < report.max_points
        assert {n for n, s in scores.items() if s == 0} >= {"check-mean-gradient"}


@pytest.mark.slow
def test_the_exercise_notebook_is_an_nbgrader_submission_of_the_source(course):
    """A learner's filled-in exercises/02 is graded cell by cell, no cell missing: its grade ids are the source's."""
    directory, _, _ = course
    source = json.loads((directory / "source" / KEY / f"{KEY}.ipynb").read_text())
    exercise = json.loads((ROOT / "exercises" / f"{KEY}.ipynb").read_text())

    def ids(nb):
        return [(c["id"], c["metadata"]["nbgrader"]) for c in nb["cells"] if "nbgrader" in c["metadata"]]
    assert ids(source) == ids(exercise)
    autograded = json.loads((directory / "autograded" / "untouched" / KEY / f"{KEY}.ipynb").read_text())
    assert "was missing from the submission" not in json.dumps(autograded)


def test_nbgrader_source_marks_blocks_and_answers_with_nbgraders_delimiters_and_refuses_look_alikes():
    source = _tool().nbgrader_source
    text = ("def f():\n    # BEGIN SOLUTION: add one\n    return 1\n    # END SOLUTION\n"
            "X = 3 * 4  # ANSWER: twelve\nassert X  # SOLUTION ONLY\n")
    assert source(text) == ("def f():\n    # to write: add one\n    ### BEGIN SOLUTION\n    return 1\n"
                            "    ### END SOLUTION\n# X = your answer: twelve\n### BEGIN SOLUTION\nX = 3 * 4\n"
                            "### END SOLUTION\n")
    with pytest.raises(ValueError, match="delimiter"):  # nbgrader takes any line holding the words for one
        source("def f():\n    # BEGIN SOLUTION: up to the END SOLUTION line\n    return 1\n    # END SOLUTION\n")
    with pytest.raises(ValueError, match="never closed"):
        source("# BEGIN SOLUTION\nx = 1\n")


def test_every_exercise_has_a_solution_cell_and_one_autograded_cell_per_check():
    tool = _tool()
    for key in [p.stem for p in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.py"))]:
        nb = json.loads((ROOT / "exercises" / f"{key}.ipynb").read_text())
        marks = [c["metadata"]["nbgrader"] for c in nb["cells"] if "nbgrader" in c["metadata"]]
        assert any(m["solution"] and not m["locked"] for m in marks), key
        assert [(m["grade_id"], m["points"]) for m in marks if m["grade"]] == \
            [(f"check-{c.name}", c.points) for c in get(key).checks], key
        assert all(m["schema_version"] == tool.NBGRADER_SCHEMA for m in marks)
