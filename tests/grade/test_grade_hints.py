"""Hints that teach rather than tell: a check fails only for the function it is about, a wrong gradient is named in
the grader's model the learner can picture, and an exercise's hints go from the concept to the code in steps.

- a pure function (02's ``shard_batch``, 03's ``make_buckets``, 07's ``shard_mlp``, 15's ``merge``, 17's
  ``quantize``/``dequantize``) is checked on its own: with it right and another function still unwritten, its
  check passes and the others name the unwritten function (a method with its class);
- a partial reduction (exercise 02, the biases never all-reduced) lists the gradients never reduced, by name, and
  says which model the grader uses;
- exercise 02's demo prints the single-process reference beside the ranks' weights, so that forgetting to divide
  by N shows there (both ranks agree on the wrong answer);
- every exercise's first hint names the concept without code, and only the last shows code.

The wrong answers are the solutions with small edits (``planted.py``).
"""
from __future__ import annotations

import re

import pytest

from zerokit.grade import grade
from zerokit.grade.exercises import get, KEYS

from planted import assert_passes, grade_on_shared_ranks, load_variants, planted, solution, stubbed

#: (exercise, the function left unwritten, the check that still passes, a check that fails, the name it gives)
UNWRITTEN = [
    ("02_naive_ddp", "average_gradients", "batch-shards", "mean-gradient", "average_gradients"),
    ("03_bucketed_ddp", "__init__", "buckets", "same-as-one-process", "BucketedDDP.__init__"),
    ("07_megatron_mlp", "forward", "shards", "f", "CopyToTensorParallelRegion.forward"),
    ("15_ring_attention", "ring_forward", "merge", "same-as-one-process", "ring_forward"),
    ("17_quantized_allgather", "quantized_all_gather", "round-trip", "all-gather", "quantized_all_gather"),
    ("17_quantized_allgather", "dequantize", "codec", "round-trip", "dequantize"),
]


@pytest.mark.parametrize("key, unwritten, passes, fails, named", UNWRITTEN,
                         ids=[f"{u[0][:2]}-{u[1]}" for u in UNWRITTEN])
def test_a_pure_function_is_checked_on_its_own(tmp_path, key, unwritten, passes, fails, named):
    path = tmp_path / f"{key}.py"
    path.write_text(stubbed(solution(key), unwritten, key))
    report = grade(path, checks=[passes, fails])
    assert report.result(passes).passed, report.text()
    failed = report.result(fails)
    assert not failed.passed and failed.kind == "not-implemented"
    assert failed.detail.startswith(f"not implemented yet — {named} ("), failed.detail
    assert "still raises NotImplementedError: " in failed.detail


def test_the_unwritten_pure_function_fails_its_own_check_by_name(tmp_path):
    """shard_batch unwritten, average_gradients right: batch-shards names shard_batch; the run that needs it says
    so once and the other checks point to it."""
    path = tmp_path / "02_naive_ddp.py"
    path.write_text(stubbed(solution("02_naive_ddp"), "shard_batch"))
    report = grade(path)
    shards = report.result("batch-shards")
    assert shards.detail.startswith("not implemented yet — shard_batch (02_naive_ddp.py, line "), shards.detail
    assert report.result("mean-gradient").detail == "not implemented yet (see 'batch-shards')"
    assert report.status == "not started"


# --- a partial reduction: the gradients never reduced, named in the grader's model --------------------------------

NEVER_REDUCED = {
    "the biases skipped": ([("        if p.grad is not None:\n", "        if p.grad is not None and p.dim() > 1:\n")],
                           ["0.bias", "2.bias", "4.bias", "6.bias"]),
    "the last bias skipped": ([("        if p.grad is not None:\n",
                                "        if p.grad is not None and p is not list(model.parameters())[-1]:\n")],
                              ["6.bias"]),
}
MLP = ("The grader's MLP: 0 Linear(8, 16) → 1 Tanh → 2 Linear(16, 16) → 3 Tanh → 4 Linear(16, 16) → 5 Tanh → "
       "6 Linear(16, 4)")


def test_a_partial_reduction_names_the_gradients_never_reduced_and_the_model(tmp_path):
    key = "02_naive_ddp"
    variants = {"solution": solution(key), **{what: planted(solution(key), edits, what)
                                              for what, (edits, _) in NEVER_REDUCED.items()}}
    graded = grade_on_shared_ranks(key, load_variants(tmp_path, key, variants))
    assert_passes(graded, "solution")
    for what, (_, names) in NEVER_REDUCED.items():
        mean = graded[what]["mean-gradient"]
        assert not mean.passed, what
        verb = "holds" if len(names) == 1 else "hold"
        assert f"{len(names)} of the 8 gradients were never reduced over the ranks — {', '.join(names)} still " \
               f"{verb} this rank's own gradient" in mean.detail, mean.detail
        assert MLP in mean.detail and "6.bias, the bias of the last Linear (Linear(16, 4)), shape (4,)" in mean.detail
        assert "max |Δ|" not in mean.detail and "biases too" in mean.hint
        assert (mean.expected, mean.measured) == ("all 8 gradients reduced", f"{len(names)} never reduced")
        params = graded[what]["same-as-one-process"]
        assert "'s 6.bias, the bias of the last Linear (Linear(16, 4)), shape (4,), differs" in params.detail
        assert MLP in params.detail, params.detail


# --- exercise 02's demo: the single-process reference beside the ranks ----------------------------------------------

def _demo_lines(source: str, capsys) -> list:
    """What the solution's cells print up to its demo, run as the notebook would (``__name__ == "__main__"``)."""
    cells = [c.split("\n", 1)[1] for c in source.split("# %%")[1:] if not c.startswith(" [markdown]")]
    upto = next(i for i, c in enumerate(cells) if "def demo(" in c)
    namespace = {"__name__": "__main__"}
    capsys.readouterr()
    for cell in cells[:upto + 1]:
        exec(compile(cell, "<demo>", "exec"), namespace)
    return capsys.readouterr().out.splitlines()


def _weights(line: str) -> list:
    return line.split(":", 1)[1].split()


def test_the_demo_shows_forgetting_to_divide_against_one_process(capsys):
    right = _demo_lines(solution("02_naive_ddp"), capsys)
    assert [line.split(":")[0] for line in right] == ["rank 0", "rank 1", "one process, whole batch",
                                                      "every rank took the step one process takes"], right
    assert _weights(right[0]) == _weights(right[1]) == _weights(right[2])
    undivided = _demo_lines(planted(solution("02_naive_ddp"), [("            p.grad.div_(n)\n", "")], "undivided"),
                            capsys)
    assert _weights(undivided[0]) == _weights(undivided[1]) != _weights(undivided[2])  # agreeing, and wrong
    assert _weights(undivided[2]) == _weights(right[2])
    assert undivided[3] == "the ranks' step differs from one process's: is every gradient the mean over the ranks?"


# --- hints go from the concept to the code ---------------------------------------------------------------------------

#: what shows code in a hint: a call with its arguments, an assignment statement, a slice, a code block
CODE = re.compile(r"[A-Za-z_][\w.]*\((?:[^()]|\([^()]*\))*\)"
                  r"|(?:^|;\s*)[A-Za-z_][\w.\[\]]*(?:, [A-Za-z_][\w.\[\]]*)* [-+*/]?= "
                  r"|[\w\])]\[[^\]]*:[^\]]*\]"
                  r"|```", re.M)
#: a library's API named in a hint: the first names the concept in words
API = re.compile(r"\b(?:dist|torch|zerokit|F|nn|self|ctx|math)\.\w")


def test_the_code_detector_tells_code_from_prose():
    for code in ("dist.all_reduce(p.grad, group=group)", "per = B // N", "inputs[rank * per:(rank + 1) * per]",
                 "x; y += 1", "```\nx\n```"):
        assert CODE.search(code), code
    for prose in ("rank r takes rows r·B/N up to (r+1)·B/N", "each rank sends 2(N − 1)/N of the tensor",
                  "the scores q·kᵀ/√d, masked with −∞ (nothing seen)", "with k = FFN / N rows each"):
        assert not CODE.search(prose), prose


@pytest.mark.parametrize("key", KEYS)
def test_hints_go_from_the_concept_to_the_code(key):
    """The first hint names the concept in words (no code, no API); the ones after it narrow down in words; only the
    last shows code."""
    hints = get(key).hints
    assert len(hints) >= 2, f"{key}: {len(hints)} hint"
    first = hints[0]
    assert not CODE.search(first) and not API.search(first), f"{key}'s first hint shows code: {first}"
    for n, text in enumerate(hints[1:-1], start=2):
        assert not CODE.search(text), f"{key}'s hint {n} shows code before the last: {CODE.search(text).group(0)!r}"
    assert CODE.search(hints[-1]), f"{key}'s last hint shows no code"
