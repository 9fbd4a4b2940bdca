# %% [markdown]
# # Exercise 08 · A 1F1B pipeline schedule as data
#
# **Goal.** Write the schedule of a pipeline the way torch's `pipelining` and DeepSpeed do: as
# **data**, an ordered list of small actions per rank — `1F0` (stage 1, forward, micro-batch
# 0), `0B3`, `2SEND_F1`, `3RECV_B2` — that can be checked, simulated for deadlocks and idle
# time without a single process, then run by an executor. 1F1B (PipeDream-flush, Megatron
# §2.2) idles exactly as much as GPipe, (p − 1)/(m + p − 1), but rank r holds at most
# min(p − r, m) micro-batches' activations instead of m.
#
# **Interface.** `one_f_one_b(p, m) -> Schedule`: `Schedule("1f1b", p, m, 1, actions)` where
# `actions[r]` is rank r's list of `Action(stage, kind, micro)` (`zerokit.pipeline_parallel`;
# with one stage per rank, stage = rank), compute (`F`, `B`) and communication (`SEND_F`,
# `RECV_F`, `SEND_B`, `RECV_B`) in the order the rank runs them.
#
# **What the grader checks** (`zerokit.grade.checks("08")`), for (p, m) in (1, 1), (2, 1),
# (2, 4), (3, 5), (4, 2), (4, 8):
# - `well-formed` — `zerokit.pipeline_parallel.check` accepts the schedule;
# - `no-deadlock` — `zerokit.simulate` plays it out to the end;
# - `bubble` — its idle fraction is `theory.bubble_fraction(p, m)`;
# - `peak-in-flight` — rank r holds `theory.peak_stashed_microbatches("1f1b", p, m, r)`;
# - `runs-with-executor` — zerokit's executor runs it on 2 ranks (m = 4) over send/recv, and
#   the gradients equal one process's.
#
# **Time.** About 35 minutes.
#
# **How to work.** Replace the `raise NotImplementedError(...)`, look at the table the demo
# prints, grade with the last cell; `hint(EXERCISE)` unfolds one hint at a time. Cells under
# `if __name__ == "__main__":` do not run when the grader loads your notebook.

# %%
import zerokit
from zerokit.grade import hint
from zerokit.pipeline_parallel import Action, Schedule

EXERCISE = "08_one_f_one_b"

# %%
def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B for p ranks (one stage each) and m micro-batches, communication included."""
    actions = []
    for r in range(p):
        raise NotImplementedError("rank r's actions: min(p−1−r, m) warm-up forwards, then one forward / one backward, then the remaining backwards — each wrapped in its RECV/SEND")
    return Schedule("1f1b", p, m, 1, actions)

# %% [markdown]
# Try it: the compute actions of p = 4, m = 8, and what the simulator makes of them.

# %%
if __name__ == "__main__":
    schedule = one_f_one_b(4, 8)
    print(schedule.table())
    result = zerokit.simulate(schedule)
    print(f"bubble {result.bubble_fraction:.3f}; peak in flight per rank {result.peak_in_flight}")

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
if __name__ == "__main__":  # check `well-formed`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["well-formed"])
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
if __name__ == "__main__":  # check `runs-with-executor`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["runs-with-executor"])
    assert report.passed, report
