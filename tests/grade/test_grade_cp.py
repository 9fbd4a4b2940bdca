"""Exercise 15 (ring attention's online softmax): the solution passes every check, and each planted wrong answer
fails the check that names it, in a learner's words.

One launch: the solution and its wrong variants are loaded as submissions, and both ranks run the exercise's
scenario on each in turn (the grader's seed for each, as ``zerokit.grade.core`` does); each check then judges
each submission's measurements. Every wrong answer here gives wrong numbers, never an error or a hang, so the
variants share the ranks. (``tests/grade/test_grade.py`` grades the solution and the untouched exercise through
``zerokit.grade``.)
"""
from __future__ import annotations

from pathlib import Path

import torch

from zerokit.grade import core, loader
from zerokit.grade.exercises import get
from zerokit.runtime.launch import launch

ROOT = Path(__file__).resolve().parents[2]
KEY = "15_ring_attention"

_MERGE = ("    out = out * torch.exp(lse - safe)[..., None] + block_out * torch.exp(block_lse - safe)[..., None]\n")
_MASK = ("        s = s.masked_fill(all_positions[src][None, :] > positions[:, None], float(\"-inf\"))\n"
         "        block_lse = torch.logsumexp(s, dim=-1)\n")

#: wrong answer: ([(old, new) edits of the solution], the check that must fail, words its message holds)
WRONG = {
    "merge without rescaling": (
        [(_MERGE, "    out = out + block_out\n")], "merge", "without rescaling"),
    "mask by local index": (
        [(_MASK, "        local = torch.arange(q.shape[2])\n"
                 "        s = s.masked_fill(local[None, :] > local[:, None], float(\"-inf\"))\n"
                 "        block_lse = torch.logsumexp(s, dim=-1)\n")],
        "same-as-one-process", "compares local indices"),
    "a transfer at every step": (
        [("        pending = ring_shift(kv, group) if step < n - 1 else None\n",
          "        pending = ring_shift(kv, group)\n")], "ring-bytes", "one more than cp − 1"),
    "−∞ − (−∞) in the merge": (
        [("    safe = merged.masked_fill(torch.isinf(merged), 0.0)\n", "    safe = merged\n")], "merge", "NaN"),
}



def test_solution_passes_and_each_wrong_answer_is_named(tmp_path):
    source = (ROOT / "solutions" / f"{KEY}.py").read_text()
    namespaces = {}
    for name, edits in {"solution": [], **{w: e for w, (e, _, _) in WRONG.items()}}.items():
        text = source
        for old, new in edits:
            assert text.count(old) == 1, f"{name}: the edit's text {old[:60]!r} is not in the solution once"
            text = text.replace(old, new)
        path = tmp_path / f"{len(namespaces)}" / f"{KEY}.py"
        path.parent.mkdir()
        path.write_text(text)
        namespaces[name] = loader.load_path(path)
    spec = get(KEY)
    (scenario,) = spec.scenarios.values()
    by_rank = launch(core.each_on_the_same_ranks, scenario.world_size, scenario.fn, namespaces,
                     backend="gloo", timeout_s=60)
    graded = {name: {c.name: core._judge(c, [r[name] for r in by_rank], ns, None) for c in spec.checks}
              for name, ns in namespaces.items()}
    failed = {name: r.detail for name, r in graded["solution"].items() if not r.passed}
    assert not failed, f"the solution fails {failed}"
    for what, (_, check, words) in WRONG.items():
        result = graded[what][check]
        assert not result.passed, f"{what}: {check} passed"
        assert words in result.detail, f"{what}: {result.detail}"
        assert result.hint, f"{what}: no hint"
