"""Exercise 15 (ring attention's online softmax): the solution passes every check, and each planted wrong answer
fails the check that names it, in a learner's words.

One launch: the solution and its wrong variants are loaded as submissions, and both ranks run the exercise's
scenario on each in turn (the grader's seed for each, as ``zerokit.grade.core`` does); each check then judges
each submission's measurements. Every wrong answer here gives wrong numbers, never an error or a hang, so the
variants share the ranks. (``tests/grade/test_grade.py`` grades the solution and the untouched exercise through
``zerokit.grade``.)
"""
from __future__ import annotations

import torch

from planted import assert_each_named, assert_passes, grade_on_shared_ranks, load_variants, planted, solution

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
    source = solution(KEY)
    variants = {"solution": source, **{what: planted(source, edits, what) for what, (edits, _, _) in WRONG.items()}}
    graded = grade_on_shared_ranks(KEY, load_variants(tmp_path, KEY, variants))
    assert_passes(graded, "solution")
    assert_each_named(graded, WRONG)
