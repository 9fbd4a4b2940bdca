"""Exercise 16 (MoE dispatch and combine): the solution and zerokit's own all-to-all pass every check, and each
planted wrong answer fails the check that names it, in a learner's words.

One launch: the solution and its wrong variants are loaded as submissions, and both ranks run the exercise's
scenario on each in turn (the grader's seed for each, as ``zerokit.grade.core`` does); each check then judges
each submission's measurements. Every wrong answer here gives wrong numbers, never an error or a hang, so the
variants share the ranks. (``tests/grade/test_grade.py`` grades the solution and the untouched exercise through
``zerokit.grade``.)
"""
from __future__ import annotations

import re

import torch

from planted import assert_each_named, assert_passes, grade_on_shared_ranks, load_variants, planted, solution

KEY = "16_moe_dispatch"

EVERY_SLOT_DISPATCH = '''    n, k, me = dist.get_world_size(group), chosen.shape[1], dist.get_rank(group)
    expert, slots = chosen.reshape(-1), chosen.numel()
    rows = AllToAll.apply(x.repeat_interleave(k, dim=0).repeat(n, 1), [slots] * n, [slots] * n, group)
    ids = AllToAll.apply(expert.to(x.dtype)[:, None].repeat(n, 1), [slots] * n, [slots] * n, group)[:, 0].long()
    keep = (owner(ids, n_experts, n) == me).nonzero().flatten()
    return rows[keep], ids[keep], {"keep": keep, "slots": slots, "k": k}
'''
EVERY_SLOT_COMBINE = '''    n = dist.get_world_size(group)
    full = out.new_zeros((n * plan["slots"], out.shape[1])).index_copy(0, plan["keep"], out)
    back = AllToAll.apply(full, [plan["slots"]] * n, [plan["slots"]] * n, group)
    slots = back.view(n, plan["slots"], -1).sum(0)
    return (slots * gates.reshape(-1, 1)).view(-1, plan["k"], slots.shape[-1]).sum(dim=1)
'''

#: wrong answer -> ([(old, new) edits of the solution; old "dispatch"/"combine": that function's solution block],
#: the check that must fail, words its message holds)
WRONG = {
    "combine without the gates": (
        [("    weighted = slots * gates.reshape(-1, 1).to(slots.dtype)\n", "    weighted = slots\n")],
        "same-outputs", "without the gates"),
    "rows not restored to token order": (
        [('    slots = torch.empty_like(back).index_copy(0, plan["order"], back)      # slot (token) order again\n',
          "    slots = back\n")],
        "same-outputs", "not restored to token order"),
    "rows detached before the all-to-all": (
        [("x.repeat_interleave(k, dim=0)[order], send", "x.repeat_interleave(k, dim=0)[order].detach(), send")],
        "same-gradients", "only the router's part"),
    "ids sent in token order, rows sorted": (
        [("    ids = AllToAll.apply(expert[order].to(x.dtype)[:, None]", "    ids = AllToAll.apply(expert.to(x.dtype)[:, None]")],
        "dispatch", "wrong experts"),
    "every slot to every rank": (
        [("dispatch", EVERY_SLOT_DISPATCH), ("combine", EVERY_SLOT_COMBINE)],
        "bytes", "every slot went to every rank"),
}

#: zerokit's own exchange (zerokit.expert_parallel.alltoall) in place of the learner's: it must pass too
LIBRARY = '''
from zerokit.expert_parallel.alltoall import counts_exchange as _counts, exchange as _exchange


def exchange_counts(send_counts, group=None):
    return _counts(torch.tensor(send_counts, dtype=torch.int64), group).tolist()


class AllToAll:
    apply = staticmethod(lambda rows, send, recv, group: _exchange(rows, send, recv, group, "moe"))
'''


def _edited(source: str, edits, what: str) -> str:
    text = source
    for old, new in edits:
        if old in ("dispatch", "combine"):  # the function's whole solution block
            block = re.search(rf"(?ms)^def {old}\(.*?# BEGIN SOLUTION[^\n]*\n(.*?)^[ \t]*# END SOLUTION", text)
            old = block.group(1)
        text = planted(text, [(old, new)], what)
    return text


def test_solution_and_library_pass_and_each_wrong_answer_is_named(tmp_path):
    source = solution(KEY)
    variants = {"solution": source, "library": source + LIBRARY,
                **{what: _edited(source, edits, what) for what, (edits, _, _) in WRONG.items()}}
    graded = grade_on_shared_ranks(KEY, load_variants(tmp_path, KEY, variants))
    for right in ("solution", "library"):
        assert_passes(graded, right)
    assert_each_named(graded, WRONG)
    # the traffic mistake gives the right numbers: only the bytes tell it
    assert [c for c, r in graded["every slot to every rank"].items() if not r.passed] == ["bytes"]
