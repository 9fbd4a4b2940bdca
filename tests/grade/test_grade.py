"""The graded exercises: generated from their solutions, graded on gloo ranks, and wrong answers named.

Three kinds of tests, as the exercises promise:

- every grader passes on its solution (``solutions/NN_name.py``), and the untouched
  exercise (``exercises/NN_name.ipynb``) fails at once, every check saying what is still
  to write;
- each grader, fed plausible wrong answers — each a small edit of the solution — fails
  the check that names the mistake, with words a learner can act on;
- ``exercises/`` is what ``tools/make_exercises.py`` makes of ``solutions/``, the solution
  notebooks are their sources run top to bottom, and each exercise states its goal,
  interface, checks, time and hints.

The ``zerokit grade`` command (exit status, ``--table`` over a folder) is tested at the end.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import time
from pathlib import Path

import pytest

import zerokit
from zerokit.grade import grade, hint
from zerokit.grade.exercises import KEYS, get

from planted import planted

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS, EXERCISES = ROOT / "solutions", ROOT / "exercises"


def _tool():
    spec = importlib.util.spec_from_file_location("make_exercises", ROOT / "tools" / "make_exercises.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _source(key: str) -> str:
    return (SOLUTIONS / f"{key}.py").read_text()


def _edited(key: str, *edits) -> str:
    """The solution with each (old, new) replaced once; an edit that matches nothing is a broken test."""
    return planted(_source(key), edits, key)


def _block(key: str, k: int, body: str) -> tuple:
    """An edit replacing the k-th solution block's body with ``body`` (its lines already indented)."""
    text = _source(key)
    blocks = re.findall(r"(?ms)^[ \t]*# BEGIN SOLUTION.*?\n(.*?)^[ \t]*# END SOLUTION", text)
    return blocks[k], body


# --- every grader on its solution, and on the untouched exercise ---------------------------------------

@pytest.mark.parametrize("key", KEYS)
def test_grader_passes_on_its_solution(key):
    report = grade(SOLUTIONS / f"{key}.py")
    assert report.passed, report.text()
    assert report.exit_status == 0 and report.points == report.max_points == get(key).max_points


@pytest.mark.parametrize("key", KEYS)
def test_untouched_exercise_fails_quickly_saying_what_to_write(key):
    start = time.perf_counter()
    report = grade(EXERCISES / f"{key}.ipynb")
    assert time.perf_counter() - start < 20
    assert not report.passed and report.exit_status == 1 and report.points == 0
    first = report.results[0].detail
    assert first.startswith(("not implemented yet — ", "not answered yet: ")), first
    if first.startswith("not implemented"):
        assert "NotImplementedError: " in first and "code cell" in first  # where, and what to write there
    for r in report.results:
        assert r.detail.startswith(("not implemented yet", "not answered yet")), r.detail
        assert r.hint, f"{r.name}: no hint"


# --- wrong answers, each named ------------------------------------------------------------------------------

RING_NAIVE = """    others = [r for r in range(n) if r != rank]
    received = [torch.empty_like(tensor) for _ in others]
    works = [dist.irecv(buf, src=global_rank(r), group=group) for buf, r in zip(received, others)]
    for r in others:
        dist.isend(tensor.contiguous(), dst=global_rank(r), group=group).wait()
    for w in works:
        w.wait()
    for buf in received:
        tensor += buf
"""

WRONG = [
    # (exercise, what, edits, check, words the message must contain)
    ("01_ring_allreduce", "the all-gather half is missing",
     [("    for k in range(n - 1):  # all-gather: pass the finished chunks around\n"
       "        round_trip(chunks[(rank - k) % n], chunks[(rank - k - 1) % n])\n", "")],
     "sum-2-ranks", "the all-gather half"),
    ("01_ring_allreduce", "the whole tensor sent to every rank", [("ring_block", RING_NAIVE)],
     "bytes-per-rank", "(N−1)·S"),
    ("01_ring_allreduce", "the backend's all-reduce", [("ring_block", "    dist.all_reduce(tensor, group=group)\n")],
     "send-recv-only", "collective all_reduce"),
    ("02_naive_ddp", "forgetting to average", [("            p.grad.div_(n)\n", "")],
     "mean-gradient", "not divided by N"),
    ("02_naive_ddp", "every rank on the whole batch", [("    return inputs[rows], targets[rows]\n",
                                                         "    return inputs, targets\n")],
     "batch-shards", "every rank took the whole batch"),
    ("03_bucketed_ddp", "a hook per module: the tied weight twice",
     [("params = [p for p in model.parameters() if p.requires_grad]",
       "params = [p for m in model.modules() for p in m.parameters(recurse=False)]")],
     "tied-weights", "tied weights"),
    ("03_bucketed_ddp", "a blocking all-reduce in the hook",
     [("self.works.append(dist.all_reduce(self.buffers[b], group=self.group, async_op=True))",
       "dist.all_reduce(self.buffers[b], group=self.group)")],
     "overlap", "synchronously"),
    ("03_bucketed_ddp", "no end-of-backward wait", [("        for work in self.works:\n            work.wait()\n", "")],
     "waited-before-step", "never waited"),
    ("03_bucketed_ddp", "buckets in forward order", [("    for p in reversed(params):\n", "    for p in params:\n")],
     "buckets", "reverse registration order"),
    ("04_zero1", "all-reduce instead of reduce-scatter",
     [("        zerokit.comm.reduce_scatter(grad_shard, self.grads, group=self.group)\n",
       "        zerokit.comm.all_reduce(self.grads, group=self.group)\n"
       "        grad_shard.copy_(self.unit.shard(self.grads))\n")],
     "traffic", "all-reduces its gradients"),
    ("04_zero1", "the updated shards never gathered",
     [("        zerokit.comm.all_gather(self.unit.data, self.master.detach(), group=self.group)\n", "")],
     "same-as-one-process", "outside its own shard never changed"),
    ("04_zero1", "forgetting to average", [("        self.grads.div_(self.world)\n", "")],
     "gradient-shard", "not divided by N"),
    ("05_zero2", "all-reduce instead of reduce-scatter (zero2-naive)",
     [("            work = zerokit.comm.reduce_scatter(self.grad_shards[i], bucket, group=self.group, "
       "async_op=True)\n",
       "            work = zerokit.comm.all_reduce(bucket, group=self.group, async_op=True)\n"
       "            work.wait()\n            self.grad_shards[i].copy_(unit.shard(bucket))\n")],
     "reduce-scatter-in-backward", "not ZeRO-2"),
    ("05_zero2", "a bucket freed before its reduction finished",
     [("            self.in_flight.append((i, work))\n",
       "            self.in_flight.append((i, work))\n            bucket.untyped_storage().resize_(0)\n")],
     "freed-after-reduction", "freed"),
    ("05_zero2", "buckets never freed", [("            del self.buckets[i]\n", "            pass\n")],
     "buckets-freed", "still holds 5 bucket"),
    ("06_zero3", "no gather before backward",
     [("            output.register_hook(lambda grad: self.pre_backward(i))\n", "            pass\n")],
     "gathered-for-backward", "while they were freed"),
    ("06_zero3", "units kept after forward",
     [("        self.free(i)\n        if output.requires_grad:", "        if output.requires_grad:")],
     "freed-after-forward", "ZeRO-2's memory"),
    ("07_megatron_mlp", "f and g swapped",
     [("class CopyToTensorParallelRegion(torch.autograd.Function):", "class _Swap(torch.autograd.Function):"),
      ("class ReduceFromTensorParallelRegion(torch.autograd.Function):",
       "class CopyToTensorParallelRegion(torch.autograd.Function):"),
      ("class _Swap(torch.autograd.Function):", "class ReduceFromTensorParallelRegion(torch.autograd.Function):")],
     "f", "f and g swapped"),
    ("07_megatron_mlp", "the row-parallel bias added on every rank",
     [("    return ReduceFromTensorParallelRegion.apply(F.linear(h, w2_shard), group) + b2\n",
       "    return ReduceFromTensorParallelRegion.apply(F.linear(h, w2_shard, b2), group)\n")],
     "same-as-unsharded", "(N−1)·b2"),
    ("07_megatron_mlp", "w1 split by its input features",
     [("    return w1[rows], b1[rows], w2[:, rows]\n",
       "    cols = slice(rank * w1.shape[1] // world_size, (rank + 1) * w1.shape[1] // world_size)\n"
       "    return w1[:, cols], b1[rows], w2[cols]\n")],
     "shards", "output features"),
    ("08_one_f_one_b", "warm-up counted the wrong way: a deadlock",
     [("        warmup = min(p - 1 - r, m)\n", "        warmup = min(r, m)\n")], "no-deadlock", "deadlocks"),
    ("08_one_f_one_b", "GPipe's order", [("        warmup = min(p - 1 - r, m)\n", "        warmup = m\n")],
     "peak-in-flight", "GPipe"),
    ("08_one_f_one_b", "no SEND_F",
     [("                if r < p - 1:\n                    row.append(Action(r, \"SEND_F\", a.micro))\n", "")],
     "well-formed", "SEND_F"),
    ("09_predict", "DDP's model states for ZeRO-1",
     [("ZERO1_BYTES_PER_RANK = 4 * PSI + 4 * PSI + 8 * PSI // N + 4", "ZERO1_BYTES_PER_RANK = 16 * PSI")],
     "zero1-bytes-per-rank", "DDP's 16Ψ"),
    ("09_predict", "the bubble over ideal time", [("BUBBLE_1F1B = (2 - 1) / (4 + 2 - 1)", "BUBBLE_1F1B = 1 / 4")],
     "bubble-1f1b", "over the ideal compute time"),
]


@pytest.mark.parametrize("key, what, edits, check, words", WRONG, ids=[f"{w[0][:2]}-{w[1]}" for w in WRONG])
def test_wrong_answer_is_named(tmp_path, key, what, edits, check, words):
    edits = [_block(key, 0, new) if old == "ring_block" else (old, new) for old, new in edits]
    path = tmp_path / f"{key}.py"
    path.write_text(_edited(key, *edits))
    report = grade(path, checks=[check])
    result = report.result(check)
    assert not result.passed, f"{what}: {report.text()}"
    assert words in result.detail, f"{what}: {result.detail}"
    assert result.hint and report.exit_status == 1


def test_a_hang_is_reported_with_where_each_rank_waits(tmp_path, capfd):
    """A ring whose ranks all receive before anyone sends: reported as a hang within the timeout, never waited out,
    in a few lines — the ranks grouped by where they wait, their stacks kept in the submission's output
    (``report.output``), out of the grader's."""
    blocking = "    dist.recv(tensor.clone(), src=left, group=group)\n    dist.send(tensor, dst=right, group=group)\n"
    path = tmp_path / "01_ring_allreduce.py"
    path.write_text(_edited("01_ring_allreduce", _block("01_ring_allreduce", 0, blocking)))
    capfd.readouterr()
    start = time.perf_counter()
    report = grade(path, checks=["sum-2-ranks"], timeout_s=3)
    assert time.perf_counter() - start < 15
    detail = report.result("sum-2-ranks").detail
    assert "a hang" in detail and "recv" in detail, detail
    out, err = capfd.readouterr()
    assert out == err == "", out + err
    assert report.status == "hang" and 'File "' in report.output
    assert len(report.text().splitlines()) <= 8, report.text()
    assert "a hang: ranks 0, 1 last entered recv of 48 B (grader's call #0)" in detail, detail


def test_a_learner_assertion_is_reported_not_raised(tmp_path):
    path = tmp_path / "02_naive_ddp.py"
    path.write_text(_edited("02_naive_ddp", ("    per = inputs.shape[0] // world_size\n",
                                             "    per = inputs.shape[0] // world_size\n    assert per > 99, 'too small'\n")))
    report = grade(path)
    assert not report.passed
    assert "raised AssertionError: too small in shard_batch" in report.results[0].detail


# --- loading, the API, hints ----------------------------------------------------------------------------

def test_a_notebook_that_does_not_load_fails_every_check_with_the_reason(tmp_path):
    nb = json.loads((EXERCISES / "02_naive_ddp.ipynb").read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    code[1]["source"] = "def shard_batch(inputs, targets, rank, world_size)\n    return inputs\n"
    path = tmp_path / "02_mine.ipynb"
    path.write_text(json.dumps(nb))
    report = grade(path)
    assert report.load_error.startswith("code cell 2 has a syntax error at line 1")
    assert all(not r.passed and "syntax error" in r.detail for r in report.results)


def test_grade_takes_a_namespace_and_a_module_and_needs_to_know_the_exercise():
    namespace = {}
    exec(compile(_source("08_one_f_one_b"), "08.py", "exec"), namespace)  # __name__ is not "__main__": no demo
    assert grade(namespace, "08").passed
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location("mine", SOLUTIONS / "08_one_f_one_b.py"))
    module.__spec__.loader.exec_module(module)
    assert zerokit.grade(module).passed  # the module is callable; EXERCISE names the exercise
    with pytest.raises(ValueError, match="which exercise"):
        grade({})
    with pytest.raises(ValueError, match="no exercise"):
        grade({}, "42")


def test_hints_unfold_one_at_a_time(capsys):
    last = len(get("02").hints)
    hint("02")
    hint("02")
    out = capsys.readouterr().out
    assert f"Hint 1 of {last}" in out and f"Hint 2 of {last}" in out
    hint("02", last)
    assert "(the last one)" in capsys.readouterr().out


# --- the sources and what is generated from them ---------------------------------------------------------

def test_every_exercise_has_a_solution_an_exercise_and_a_grader():
    assert sorted(p.stem for p in SOLUTIONS.glob("[0-9][0-9]_*.py")) == list(KEYS)
    assert sorted(p.name for p in EXERCISES.iterdir() if p.suffix in (".py", ".ipynb")) == \
        sorted(f"{k}{s}" for k in KEYS for s in (".py", ".ipynb"))


@pytest.mark.parametrize("key", KEYS)
def test_exercise_is_generated_from_its_solution(key):
    for path, text in _tool().expected_exercise_files(SOLUTIONS / f"{key}.py").items():
        assert path.read_text() == text, f"{path.name} is out of date: run `python tools/make_exercises.py --no-run`"


def test_strip_solutions_replaces_every_marked_part_and_refuses_broken_markers():
    strip = _tool().strip_solutions
    text = ("def f():\n    # BEGIN SOLUTION: add one\n    return 1\n    # END SOLUTION\n"
            "X = 3 * 4  # ANSWER: twelve\nassert X  # SOLUTION ONLY\n")
    assert strip(text) == "def f():\n    raise NotImplementedError('add one')\nX = ...  # your answer: twelve\n"
    for broken in ("# BEGIN SOLUTION\nx = 1\n", "# END SOLUTION\n", "# BEGIN SOLUTION\n# BEGIN SOLUTION\n"):
        with pytest.raises(ValueError):
            strip(broken)


@pytest.mark.parametrize("key", KEYS)
def test_solution_notebook_is_its_source_run_top_to_bottom(key):
    tool = _tool()
    cells = tool._notebook_build().parse_cells(_source(key))
    nb = json.loads((SOLUTIONS / f"{key}.ipynb").read_text())
    assert [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]] == cells, \
        f"solutions/{key}.ipynb differs from its source: run `python tools/make_exercises.py {key[:2]}`"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))
    outputs = "".join("".join(o.get("text", "")) for c in code for o in c["outputs"])
    assert "all checks pass" in outputs and not any(o.get("output_type") == "error" for c in code for o in c["outputs"])
    assert not re.search(r"(?<![\w.])/(?:home|root|tmp|work|usr)/|site-packages|ipykernel_\d+", outputs)


@pytest.mark.parametrize("key", KEYS)
def test_exercise_states_goal_interface_checks_time_and_has_hints(key):
    first = _source(key).split("# %%\n", 1)[0]
    for heading in ("**Goal.**", "**Interface.**", "**What the grader checks**", "**Time.**"):
        assert heading in first, f"{key}: no {heading}"
    spec = get(key)
    for check in spec.checks:
        assert f"`{check.name}`" in first, f"{key}: the opening does not name the check {check.name!r}"
    assert f"About {spec.minutes} minutes" in first
    assert len(spec.hints) >= 3 and "hint(EXERCISE)" in _source(key)


# --- the command line ---------------------------------------------------------------------------------------

def test_cli_exit_status_and_a_class_table(tmp_path, capsys):
    from zerokit.cli import main

    assert main(["grade", str(SOLUTIONS / "07_megatron_mlp.py")]) == 0
    assert "Score: 10/10 points" in capsys.readouterr().out
    folder = tmp_path / "submissions"
    (folder / "ada").mkdir(parents=True)
    (folder / "bob").mkdir()
    shutil.copy(SOLUTIONS / "08_one_f_one_b.ipynb", folder / "ada" / "08_one_f_one_b.ipynb")
    shutil.copy(EXERCISES / "08_one_f_one_b.ipynb", folder / "bob" / "08_one_f_one_b.ipynb")
    shutil.copy(SOLUTIONS / "08_one_f_one_b.py", folder / "ada" / "08_one_f_one_b.py")  # a paired copy: no row
    assert main(["grade", "--table", str(folder)]) == 1
    table = capsys.readouterr().out
    assert re.search(r"ada/08_one_f_one_b\.ipynb\s+08_one_f_one_b\s+10/10\s+5/5\s+—", table), table
    assert re.search(r"bob/08_one_f_one_b\.ipynb\s+08_one_f_one_b\s+0/10\s+0/5\s+well-formed", table), table
    assert "2 submissions, 1 with every check passing" in table and ".py" not in table
    (folder / "notes.ipynb").write_text('{"cells": []}')  # a stray notebook is a row that says so, not the end
    assert main(["grade", "--table", str(folder)]) == 1
    assert re.search(r"notes\.ipynb\s+\?\?\s+0/0\s+0/0\s+could not load", capsys.readouterr().out)
    (folder / "notes.ipynb").unlink()
    assert main(["grade", "--json", str(folder / "ada")]) == 0
    assert json.loads(capsys.readouterr().out)[0]["passed"] is True


def test_cli_bad_input_exits_2(tmp_path, capsys):
    from zerokit.cli import main

    assert main(["grade", str(tmp_path / "missing.ipynb")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["grade", "--exercise", "42", str(SOLUTIONS / "01_ring_allreduce.py")]) == 2
    assert main(["grade", "--exercise", "01", "--check", "nope", str(SOLUTIONS / "01_ring_allreduce.py")]) == 2
    (tmp_path / "notes.py").write_text("x = 1\n")
    assert main(["grade", str(tmp_path / "notes.py")]) == 2
    assert "which exercise" in capsys.readouterr().err
    assert main(["grade", "--list"]) == 0
    assert "09_predict" in capsys.readouterr().out
    assert main(["grade", "99"]) == 2 and "no exercise numbered 99" in capsys.readouterr().err


def test_cli_grades_an_exercise_by_its_number_as_the_lessons_write_it(capsys, monkeypatch):
    """A lesson's closing cell says `zerokit grade 07`: from the repository root, exercises/07_*.ipynb (the
    untouched exercise fails its checks, exit 1; a number that names no exercise is a usage error, exit 2)."""
    from zerokit.cli import main

    monkeypatch.chdir(ROOT)
    assert main(["grade", "07"]) == 1
    assert "07_megatron_mlp" in capsys.readouterr().out
