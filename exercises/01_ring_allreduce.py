# %% [markdown]
# # Exercise 01 · Ring all-reduce from send/recv
#
# **Goal.** Build the all-reduce every data-parallel step relies on out of the only thing a
# network really does — one rank sending a tensor to another — and see why the ring is the
# bandwidth-optimal way: each rank sends 2(N−1)/N of the tensor, however many ranks there are.
#
# **Interface.** `ring_all_reduce(tensor, group=None) -> None` sums `tensor` over the ranks of
# `group` (None: all ranks) **in place**, using only `dist.send` / `dist.recv` (or
# `dist.isend` / `dist.irecv`). Any shape, any number of elements, on the tensor's device.
# Order each round so that it cannot deadlock on NCCL, where a send waits for its receive:
# if every rank first posts its receive from the left and waits, the ring is a cycle of waits.
#
# **What the grader checks** (`zerokit.grade.checks("01")` lists them with their points):
# - `sum-2-ranks` — on 2 ranks, every rank ends with the sum of the inputs;
# - `sum-3-ranks-uneven` — the same on 3 ranks with 10 elements, which 3 does not divide;
# - `send-recv-only` — no collective was called;
# - `bytes-per-rank` — each rank sent 2(N−1)/N·S bytes (`zerokit.theory.ring_bytes_sent`);
# - `rounds` — 2(N−1) sends per rank (`zerokit.theory.ring_steps`).
#
# **Time.** About 40 minutes.
#
# **How to work.** Replace each `raise NotImplementedError(...)` with your code, run the demo,
# and grade with the last cell. `hint(EXERCISE)` unfolds one hint at a time. Cells under
# `if __name__ == "__main__":` run here but not when the grader loads your notebook, so
# `zerokit grade 01_ring_allreduce.ipynb` in a terminal grades the same code.

# %%
import torch
import torch.distributed as dist

import zerokit
from zerokit.grade import hint

EXERCISE = "01_ring_allreduce"

# %% [markdown]
# Cut the tensor into N chunks. In the **reduce-scatter** half, each of N−1 rounds moves one
# chunk one step to the right and adds it in, so that afterwards rank r holds the full sum
# of chunk r; in the **all-gather** half, N−1 more rounds pass the finished chunks around.

# %%
def ring_all_reduce(tensor: torch.Tensor, group=None) -> None:
    """Sum `tensor` over the ranks of `group`, in place, with the ring algorithm on send/recv."""
    n = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if n == 1:
        return

    def global_rank(group_rank: int) -> int:
        return dist.get_global_rank(group, group_rank) if group is not None else group_rank

    right, left = global_rank((rank + 1) % n), global_rank((rank - 1) % n)
    raise NotImplementedError('sum `tensor` over the ranks in place: N−1 reduce-scatter rounds, then N−1 all-gather rounds, each one send to `right` and one receive from `left` (even ranks send first, odd ranks receive first)')

# %% [markdown]
# Try it: rank r contributes r + 1 everywhere, so every element of the sum on 3 ranks is 6.

# %%
if __name__ == "__main__":
    def demo(ctx):
        t = torch.full((5,), float(ctx.rank + 1))
        ring_all_reduce(t)
        return t.tolist()

    print(zerokit.launch(demo, 3))

# %% [markdown]
# Stuck? Each call shows the next hint.

# %%
if __name__ == "__main__":
    hint(EXERCISE)

# %% [markdown]
# Grade: the grader runs your function on 2 and 3 ranks and compares with the sum and with
# the ring's formula.

# %%
if __name__ == "__main__":
    report = zerokit.grade(globals(), EXERCISE)
    print(report)

# %% [markdown]
# **Autograded cells** (nbgrader's): one per check, worth that check's points. A teacher who grades with
# nbgrader runs them (`nbgrader autograde`); each asks `zerokit.grade` what the cell above reports, one
# check at a time. Leave them as they are.

# %%
if __name__ == "__main__":  # check `sum-2-ranks`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["sum-2-ranks"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `sum-3-ranks-uneven`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["sum-3-ranks-uneven"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `send-recv-only`, 1 point
    report = zerokit.grade(globals(), EXERCISE, checks=["send-recv-only"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `bytes-per-rank`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["bytes-per-rank"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `rounds`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["rounds"])
    assert report.passed, report
