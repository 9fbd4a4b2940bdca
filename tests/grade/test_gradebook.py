"""A gradebook a teacher can use: ``zerokit grade`` over a class's folder (a subfolder per learner) gives a learner ×
exercise grid with a status per cell, totals, the roster's missing work, a CSV and a feedback file per learner;
only notebooks are graded; a rank that skipped a collective is named; the notebook-load limit follows
``--timeout``. (A hang's few lines: ``tests/grade/test_grade.py``'s hang test.)

The class: ada solved exercises 02 (naive DDP) and 08 (1F1B as data); bob handed in 02 untouched (and its ``.py``
copy beside it); carl forgot to average in 02 and his 08 raises while it loads; dana's rank 1 skips the
all-reduce; eve, on the roster, handed in nothing; a notebook lies outside every learner's folder.
"""
from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest

from zerokit.grade import grade, isolate

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS, EXERCISES = ROOT / "solutions", ROOT / "exercises"

FORGETS_TO_AVERAGE = [("            p.grad.div_(n)\n", "")]
RANK_1_SKIPS = [("            dist.all_reduce(p.grad, group=group)\n",
                 "            if dist.get_rank() == 0:\n                dist.all_reduce(p.grad, group=group)\n")]
RANK_1_SKIPS_THE_BIASES = [("            dist.all_reduce(p.grad, group=group)\n",
                            "            if not (dist.get_rank() == 1 and p.dim() == 1):\n"
                            "                dist.all_reduce(p.grad, group=group)\n")]
RAISES = "raise RuntimeError('half-way through')\n"


def _notebook(key: str, path: Path, edits=(), cell: str = "", base: Path = SOLUTIONS) -> Path:
    """``base``'s notebook of ``key`` with each (old, new) edit made in the one cell holding ``old``, and ``cell``
    appended as a code cell."""
    nb = json.loads((base / f"{key}.ipynb").read_text())
    for old, new in edits:
        holding = [c for c in nb["cells"] if old in "".join(c["source"])]
        assert len(holding) == 1 and "".join(holding[0]["source"]).count(old) == 1, old
        holding[0]["source"] = "".join(holding[0]["source"]).replace(old, new)
    if cell:
        nb["cells"].append({"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                            "source": cell})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))
    return path


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class graded once: (exit status, stdout, the CSV's rows by learner, the feedback folder)."""
    from zerokit.cli import main

    root = tmp_path_factory.mktemp("gradebook")
    folder = root / "submissions"
    _notebook("02_naive_ddp", folder / "ada" / "02_naive_ddp.ipynb")
    _notebook("08_one_f_one_b", folder / "ada" / "08_one_f_one_b.ipynb")
    _notebook("02_naive_ddp", folder / "bob" / "02_naive_ddp.ipynb", base=EXERCISES)
    shutil.copy(EXERCISES / "02_naive_ddp.py", folder / "bob" / "02_naive_ddp.py")
    _notebook("02_naive_ddp", folder / "carl" / "02_naive_ddp.ipynb", FORGETS_TO_AVERAGE)
    _notebook("08_one_f_one_b", folder / "carl" / "08_one_f_one_b.ipynb", cell=RAISES)
    _notebook("02_naive_ddp", folder / "dana" / "02_naive_ddp.ipynb", RANK_1_SKIPS)
    _notebook("02_naive_ddp", folder / "notes.ipynb", base=EXERCISES)
    roster = root / "roster.txt"
    roster.write_text("# the class\nada\nbob\ncarl\ndana\neve   # joined late\n")
    book, feedback = root / "book.csv", root / "feedback"
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["grade", "--table", "--roster", str(roster), "--csv", str(book), "--feedback", str(feedback),
                       str(folder)])
    with book.open() as f:
        rows = {row["learner"]: row for row in csv.DictReader(f)}
    return status, out.getvalue(), rows, feedback


def test_the_grid_has_a_status_per_cell_totals_and_the_missing_work(graded):
    status, table, rows, _ = graded
    assert status == 1
    cells = {name: (row["02_naive_ddp status"], row["08_one_f_one_b status"], row["total"], row["max"])
             for name, row in rows.items()}
    assert cells == {"ada": ("passed", "passed", "20", "20"), "bob": ("not started", "missing", "0", "20"),
                     "carl": ("wrong", "error", "4", "20"), "dana": ("error", "missing", "2", "20"),
                     "eve": ("missing", "missing", "0", "20")}, cells
    assert list(rows) == ["ada", "bob", "carl", "dana", "eve"] and {r["on_roster"] for r in rows.values()} == {"yes"}
    assert re.search(r"^carl\s+4/10 wrong\s+0/10 error\s+4/20$", table, re.M), table
    assert re.search(r"^passed\s+1 of 5\s+1 of 5$", table, re.M), table
    assert "missing work: bob — 08_one_f_one_b; dana — 08_one_f_one_b; eve — no notebook at all" in table
    assert "not in the grid: notes.ipynb — outside any learner's folder" in table


def test_only_notebooks_are_graded(graded):
    _, table, _, _ = graded
    assert "bob/02_naive_ddp.ipynb" in table and ".py " not in table
    assert "7 submissions, 2 with every check passing" in table


def test_a_feedback_file_per_learner_with_the_checks_the_numbers_and_the_hints(graded):
    _, _, _, feedback = graded
    assert sorted(p.name for p in feedback.iterdir()) == ["ada.md", "bob.md", "carl.md", "dana.md", "eve.md"]
    carl = (feedback / "carl.md").read_text()
    assert "Total: 4/20 points." in carl and "| 02_naive_ddp | wrong | 4/10 |" in carl
    assert "✗ FAIL  mean-gradient" in carl and "not divided by N" in carl  # the check, in the learner's words
    assert re.search(r"expected: \S+\s+measured: \S+", carl)  # the numbers
    assert "hint: " in carl and "✓ pass  batch-shards" in carl
    assert "code cell" in carl and "RuntimeError: half-way through" in carl  # where 08 stopped loading
    assert "No notebook of yours answers this exercise" in (feedback / "eve.md").read_text()


def test_the_rank_that_skipped_a_collective_is_named(graded):
    _, _, _, feedback = graded
    dana = (feedback / "dana.md").read_text()
    assert "rank 1 skipped a collective that rank 0 called: rank 1 returned after 0 collectives while rank 0 " \
           "waited in all_reduce" in " ".join(dana.split()), dana
    assert "Connection closed" not in dana


def test_ranks_calling_different_collectives_are_told_apart(tmp_path):
    path = _notebook("02_naive_ddp", tmp_path / "02_naive_ddp.ipynb", RANK_1_SKIPS_THE_BIASES)
    report = grade(path, checks=["mean-gradient"])
    detail = report.result("mean-gradient").detail
    assert detail.startswith("the ranks called different collectives at the grader's call #1: rank 0 in "
                             "all_reduce of "), detail
    assert report.status == "error"


def test_the_load_limit_follows_the_timeout(tmp_path, monkeypatch):
    sleeps = _notebook("02_naive_ddp", tmp_path / "a" / "02_naive_ddp.ipynb", cell="import time\ntime.sleep(600)\n")
    report = grade(sleeps, timeout_s=1)
    assert report.load_error.startswith("loading took longer than 1 s"), report.load_error
    assert report.status == "hang" and {r.kind for r in report.results} == {"load-hang"}
    # a cell that swallows the loader's alarm is stopped by the grader's own deadline, the keeper told to kill
    swallows = "import time\nwhile True:\n    try:\n        time.sleep(600)\n    except Exception:\n        pass\n"
    stubborn = _notebook("02_naive_ddp", tmp_path / "b" / "02_naive_ddp.ipynb", cell=swallows)
    monkeypatch.setattr(isolate, "LOAD_MARGIN_S", 1.0)
    report = grade(stubborn, timeout_s=1)
    assert report.load_error.startswith("loading took longer than 1 s") and report.status == "hang"


def test_a_keeper_started_by_spawn_grades_the_same(monkeypatch):
    """Where fork is unsafe (outside Linux, a process group or CUDA here) the keeper is spawned."""
    monkeypatch.setattr(isolate, "_start_method", lambda: "spawn")
    report = grade(SOLUTIONS / "08_one_f_one_b.ipynb")
    assert report.passed, report.text()


@pytest.mark.parametrize("args, words", [
    (["--jobs", "0"], "--jobs 0: must be a whole number"),
    (["--roster", "missing.txt"], "--roster missing.txt: cannot read it"),
    (["--roster", "{empty}"], "no names in it"),
    (["--roster", "{twice}"], "ada listed more than once"),
    (["--feedback", "{empty}"], "a file is there; give a folder"),
])
def test_bad_gradebook_input_exits_2(tmp_path, capsys, args, words):
    from zerokit.cli import main

    (tmp_path / "empty").write_text("# nobody yet\n")
    (tmp_path / "twice").write_text("ada\nbob\nada\n")
    args = [a.format(empty=tmp_path / "empty", twice=tmp_path / "twice") for a in args]
    assert main(["grade", *args, str(SOLUTIONS / "08_one_f_one_b.py")]) == 2
    assert words in capsys.readouterr().err


def test_a_folder_of_py_files_only_is_refused(tmp_path, capsys):
    from zerokit.cli import main

    shutil.copy(SOLUTIONS / "08_one_f_one_b.py", tmp_path / "08_one_f_one_b.py")
    assert main(["grade", str(tmp_path)]) == 2
    assert "holds no notebook (.ipynb)" in capsys.readouterr().err
