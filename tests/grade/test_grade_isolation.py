"""A class cannot break the grader: each submission is graded in a process of its own, and judged where its code
never ran.

One ``zerokit grade --table --jobs 2`` run over a class of exercise 02 (naive DDP), in which four learners' notebooks
each try to break it — a stray ``sys.exit(0)``, a leftover ``torch.set_default_dtype(torch.float64)``, the grader's
functions replaced (``zerokit.grade.core.run``, ``verdicts``, ``_judge``), processes started (one in a session of
its own) and then ``os._exit(0)`` — beside solved and untouched ones. Each gets the verdict its own work earns (the
patcher the untouched one's, word for word; the float64 one solved, its scenario run under the grader's conditions,
float32), none changes another's, the table lists every submission, the gradebook says what stopped the first and
the last, and nothing they started is left running. (Under the grader before
isolation, the first ended the run with nothing printed and exit status 0; the second cost the next solved notebook
its traffic check, 8/10; the third gave itself and the next untouched notebook 10/10.)
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
KEY = "02_naive_ddp"

EXITS = "import sys\nsys.exit(0)\n"
FLOAT64 = "import torch\ntorch.set_default_dtype(torch.float64)\n"
PATCHES = """import zerokit.grade.core as _core
_all = lambda exercise, *a, **k: [_core.CheckResult(c.name, c.points, True, "ok") for c in exercise.checks]
_core.run = _all
_core.verdicts = lambda exercise, checks, ns, outcomes: [_core.CheckResult(c.name, c.points, True, "ok") for c in checks]
_core._judge = lambda check, outcome, ns, owner: _core.CheckResult(check.name, check.points, True, "ok")
"""
SPAWNS = """import multiprocessing, os, subprocess, time
PIDS = {pids!r}
def _write(name, pid):
    with open(os.path.join(PIDS, name), "w") as f:
        f.write(str(pid))
def _sleep():
    _write("forked", os.getpid())
    time.sleep(600)
_write("popen", subprocess.Popen(["sleep", "600"]).pid)
_write("session", subprocess.Popen(["sleep", "600"], start_new_session=True).pid)
multiprocessing.get_context("fork").Process(target=_sleep).start()
while not os.path.exists(os.path.join(PIDS, "forked")):
    time.sleep(0.01)
os._exit(0)
"""


def _notebook(base: Path, extra: str, path: Path) -> Path:
    nb = json.loads(base.read_text())
    if extra:
        nb["cells"].append({"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                            "source": extra})
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(nb))
    return path


@pytest.fixture(scope="module")
def klass(tmp_path_factory):
    """The class's folder (a subfolder per learner, in the order they are graded) and the spawner's pid folder."""
    root = tmp_path_factory.mktemp("class")
    pids = root / "pids"
    pids.mkdir()
    solved, untouched = ROOT / "solutions" / f"{KEY}.ipynb", ROOT / "exercises" / f"{KEY}.ipynb"
    learners = {"a_exits": (untouched, EXITS), "b_float64": (solved, FLOAT64), "c_solved": (solved, ""),
                "d_patcher": (untouched, PATCHES), "e_untouched": (untouched, ""),
                "f_spawner": (untouched, SPAWNS.format(pids=str(pids))), "g_solved": (solved, "")}
    folder = root / "submissions"
    for name, (base, extra) in learners.items():
        _notebook(base, extra, folder / name / f"{KEY}.ipynb")
    return folder, pids


def _rows(table: str) -> dict:
    """{learner: (points, failed checks)} from the table's rows."""
    rows = {}
    for line in table.splitlines():
        match = re.match(r"(\w+)/02_naive_ddp\.ipynb\s+02_naive_ddp\s+(\d+/\d+)\s+\d+/\d+\s+(.*)$", line)
        if match:
            rows[match.group(1)] = (match.group(2), match.group(3).strip())
    return rows


def _report(feedback: str, learner: str) -> str:
    """The report in a learner's feedback, less their name and the seconds it took."""
    block = feedback.split("```text", 1)[1].split("```", 1)[0]
    return re.sub(r"\(\d+\.\d s\)", "", block.replace(learner, "LEARNER"))


def test_a_class_cannot_break_the_grader(klass, tmp_path, capsys, no_children_left):
    from zerokit.cli import main

    folder, pids = klass
    book, feedback = tmp_path / "book.csv", tmp_path / "feedback"
    assert main(["grade", "--table", "--jobs", "2", "--csv", str(book), "--feedback", str(feedback), str(folder)]) == 1
    table = capsys.readouterr().out
    rows = _rows(table)
    assert list(rows) == sorted(p.name for p in folder.iterdir()), table  # every submission, in order
    assert "7 submissions, 3 with every check passing" in table
    for solved in ("b_float64", "c_solved", "g_solved"):  # the float64 one runs the grader's scenario in float32
        assert rows[solved][0] == "10/10", table  # c after the float64, g after the patcher and the spawner
    for untouched in ("a_exits", "d_patcher", "e_untouched", "f_spawner"):
        assert rows[untouched][0] == "0/10", table  # the patcher does not grade itself, nor the next one
    with book.open() as f:
        status = {row["learner"]: row["02_naive_ddp status"] for row in csv.DictReader(f)}
    assert status == {"a_exits": "error", "b_float64": "passed", "c_solved": "passed", "d_patcher": "not started",
                      "e_untouched": "not started", "f_spawner": "error", "g_solved": "passed"}, status
    said = {name: " ".join((feedback / f"{name}.md").read_text().split()) for name in status}
    assert "code cell 10 called sys.exit(0): a notebook run top to bottom stops there — remove it" in said["a_exits"]
    assert "the submission's process exited with code 0 before the grading finished" in said["f_spawner"]
    assert _report(said["d_patcher"], "d_patcher") == _report(said["e_untouched"], "e_untouched")

    no_children_left()
    for name in ("popen", "session", "forked"):  # what the spawner started, in its session or out of it
        pid = int((pids / name).read_text())
        with pytest.raises(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                raise AssertionError(f"the spawner's {name} process {pid} is still running")
            raise psutil.NoSuchProcess(pid)
