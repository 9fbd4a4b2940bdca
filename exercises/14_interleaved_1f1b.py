# %% [markdown]
# # Exercise 14 · The interleaved 1F1B schedule
#
# **Goal.** Cut each rank's share of the model into v **chunks** and run them interleaved, as
# Megatron-LM does (Narayanan et al. 2021, §2.2.2; torch's `ScheduleInterleaved1F1B`): with p
# ranks the model has p·v stages, and rank r holds stages r, r + p, …, r + (v − 1)·p. A
# micro-batch goes round the ranks v times, so a rank starts useful work v times sooner and
# the idle share falls from 1F1B's (p − 1)/(m + p − 1) to **(p − 1)/(v·m + p − 1)** — for the
# price of v times more point-to-point messages. The order has three parts on rank r:
#
# 1. the forwards run **depth-first in groups of p micro-batches**: chunk 0 on micro-batches
#    0…p − 1, then chunk 1 on the same group, …, then chunk 0 on the next group; the backwards
#    run the same groups with the chunks in reverse (the last chunk's backward comes first);
# 2. **warm-up**: (v − 1)·p + 2·(p − 1 − r) forwards (at most v·m) before the first backward —
#    Megatron's count (when m = p it runs all v·m forwards first; either passes here);
# 3. then one forward and one backward at a time while forwards remain, then the remaining
#    backwards.
#
# Megatron needs m to be a multiple of p for this order; so does this exercise.
#
# **Interface.** `stage_of(r, c, p)`: the stage that chunk c of rank r holds.
# `compute_order(p, m, v, r)`: rank r's compute actions, `Action(stage, "F" | "B", micro)`
# (`zerokit.pipeline_parallel`), in the order it runs them. Given: `with_communication`, which
# puts the `RECV_F` / `SEND_F` / `RECV_B` / `SEND_B` around each (exercise 08 wrote them), and
# `interleaved_1f1b(p, m, v)`, which assembles the `Schedule`.
#
# **What the grader checks** (`zerokit.grade.checks("14")`), for (p, m, v) in (2, 2, 2),
# (2, 4, 2), (2, 6, 3), (3, 3, 2), (3, 6, 2), (4, 4, 2), (4, 8, 2), (4, 8, 4):
# - `chunks-on-ranks` — every action sits on the rank that holds its stage (stage mod p), and
#   every stage runs one forward and one backward of every micro-batch;
# - `forward-before-backward` — on every chunk, a micro-batch's forward comes before its
#   backward;
# - `no-deadlock` — `zerokit.simulate` plays the schedule out to the end, and
#   `zerokit.pipeline_parallel.p2p_plan` finds one order for every message;
# - `bubble` — the simulated idle share is `theory.bubble_fraction(p, m, v)`;
# - `peak-in-flight` — rank r holds at most min((v − 1)·p + 2·(p − 1 − r) + 1, v·m) chunk
#   micro-batches' activations at once (its warm-up and one more; v·m allowed when m = p),
#   not all v·m;
# - `runs-on-ranks` — zerokit's executor runs it on 2 ranks (v = 2, m = 4) over send/recv: it
#   finishes, the point-to-point calls it posted replay without a deadlock under NCCL's
#   one-stream-per-pair rule, every chunk ran each forward before its backward, and the
#   gradients equal one process's.
#
# **Time.** About 40 minutes.
#
# **How to work.** Replace each `raise NotImplementedError(...)`, look at the table the demo
# prints, grade with the last cell; `hint(EXERCISE)` unfolds one hint at a time. Cells under
# `if __name__ == "__main__":` do not run when the grader loads your notebook.

# %%
from typing import List

import zerokit
from zerokit.grade import hint
from zerokit.pipeline_parallel import Action, Schedule

EXERCISE = "14_interleaved_1f1b"

# %%
def stage_of(r: int, c: int, p: int) -> int:
    """The stage held by chunk c of rank r (p ranks): Megatron's round-robin placement."""
    raise NotImplementedError('chunk c of rank r is stage c·p + r (rank 0 holds stages 0, p, 2p, …)')


def compute_order(p: int, m: int, v: int, r: int) -> List[Action]:
    """Rank r's forwards and backwards (v chunks each, m micro-batches, m a multiple of p), in the order it runs them."""
    raise NotImplementedError('forwards depth-first in groups of p micro-batches (chunk 0 on the group, then chunk 1, …), backwards the same with the chunks reversed; (v − 1)·p + 2·(p − 1 − r) warm-up forwards (at most v·m), then one forward and one backward at a time, then the remaining backwards')

# %%
def with_communication(p: int, v: int, compute: List[Action]) -> List[Action]:
    """One rank's compute actions with the receives and sends around them (stage s's neighbours: s − 1 and s + 1)."""
    last = p * v - 1
    row = []
    for a in compute:
        if a.kind == "F" and a.stage > 0:
            row.append(Action(a.stage, "RECV_F", a.micro))
        if a.kind == "B" and a.stage < last:
            row.append(Action(a.stage, "RECV_B", a.micro))
        row.append(a)
        if a.kind == "F" and a.stage < last:
            row.append(Action(a.stage, "SEND_F", a.micro))
        if a.kind == "B" and a.stage > 0:
            row.append(Action(a.stage, "SEND_B", a.micro))
    return row


def interleaved_1f1b(p: int, m: int, v: int) -> Schedule:
    """Interleaved 1F1B for p ranks, m micro-batches, v chunks per rank."""
    return Schedule("interleaved", p, m, v, [with_communication(p, v, compute_order(p, m, v, r)) for r in range(p)])

# %% [markdown]
# Try it: the compute actions of p = 4, m = 8, v = 2, then the simulated idle share of 1F1B
# (v = 1 in the formula) and of yours.

# %%
if __name__ == "__main__":
    schedule = interleaved_1f1b(4, 8, 2)
    print(schedule.table())
    result = zerokit.simulate(schedule)
    print(f"simulated bubble {result.bubble_fraction:.3f}; theory: 1F1B {zerokit.theory.bubble_fraction(4, 8):.3f}, "
          f"interleaved v=2 {zerokit.theory.bubble_fraction(4, 8, 2):.3f}")

# %%
if __name__ == "__main__":
    hint(EXERCISE)

# %%
if __name__ == "__main__":
    report = zerokit.grade(globals(), EXERCISE)
    print(report)

# %% [markdown]
# **Autograded cells** (nbgrader's): one per check, worth that check's points. A teacher who grades with
# nbgrader runs them (`nbgrader autograde`); each asks `zerokit.grade` what the cell above reports, one
# check at a time. Leave them as they are.

# %%
if __name__ == "__main__":  # check `chunks-on-ranks`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["chunks-on-ranks"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `forward-before-backward`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["forward-before-backward"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `no-deadlock`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["no-deadlock"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `bubble`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["bubble"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `peak-in-flight`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["peak-in-flight"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `runs-on-ranks`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["runs-on-ranks"])
    assert report.passed, report
