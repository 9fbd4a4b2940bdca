# %% [markdown]
# # Exercise 12 · An activation-checkpointing policy: every k-th block
#
# **Goal.** Backward needs what forward saved; n blocks save n blocks' worth of activations
# (n·A). Activation checkpointing (Chen et al., 1604.06174) cuts the chain into **segments**
# of k blocks, runs each segment's forward without recording anything, keeps only the
# segment's **input** (X bytes), and in backward runs the segment's forward again — now
# recording — to get its gradients. After forward a rank holds ⌈n/k⌉·X; while one segment is
# recomputed it holds that plus the segment's k·A: `theory.checkpointed_activation_bytes(n,
# A, X, "every-k", k)` = ⌈n/k⌉·X + k·A. The price is one more forward of every block. Which
# k is best depends on A/X: k = √n (Chen's rule) only when a block's activations are the size
# of its input. A transformer layer saves A/X = 17 + 2.5·a·s/h times its input in 16-bit
# (Korthikanti et al. §4: A = s·b·h·(34 + 5·a·s/h), X = 2·s·b·h), at least 17 with fused
# attention (no s × s scores stored), and the best k is then about √(n·X/A): for GPT-3's 96
# layers at A = 17·X the formula's minimum is k = 2, not √96 ≈ 10.
#
# **Interface.**
# - `segments(n, k)`: the segments of n chained blocks, `[(0, k), (k, 2k), …]`, the last one
#   shorter when k does not divide n;
# - `Recompute`, a `torch.autograd.Function` called as `Recompute.apply(run, x, *params)`:
#   forward returns `run(x)` and keeps only `x` (and the RNG state); backward runs `run` again
#   with autograd on, from forward's RNG state — a block with dropout must draw the same mask
#   twice — and returns the gradients of `x` and of every parameter in `params`;
# - `checkpointed_forward(blocks, x, k)`: `x` through the blocks (an `nn.Sequential`), each
#   segment of `segments(len(blocks), k)` under `Recompute`;
# - `best_k(n, layer_bytes, boundary_bytes)`: the k in 1…n with the smallest
#   ⌈n/k⌉·X + k·A (the smallest such k on a tie), A = `layer_bytes`, X = `boundary_bytes`.
#
# **What the grader checks** (2 ranks, each its own 4 × 16 batch through n = 9 blocks
# `tanh(x·w)`, fp32, k = 1 and k = 3; `zerokit.grade.checks("12")`):
# - `segments` — the segments, the short last one included;
# - `same-gradients` — the input's and every parameter's gradient equal the run without
#   checkpointing;
# - `rng-state` — the same on a chain of `tanh(dropout(x·w))` blocks (p = 0.5) under one
#   seed: equal only when the recompute draws forward's dropout masks (the RNG state saved
#   in forward and restored for the recompute, as `torch.utils.checkpoint` does with
#   `preserve_rng_state=True`);
# - `stored-bytes` — the memory ledger's saved activations after forward: ⌈n/k⌉·X;
# - `peak-bytes` — the ledger's peak over forward and backward:
#   `theory.checkpointed_activation_bytes(n, A, X, "every-k", k)`, with A = X for this block
#   (it saves its input for the product and its output for tanh's gradient, and a block's
#   output is the next block's input: one X per block);
# - `recomputes` — backward ran every block's forward once more, no more;
# - `best-k` — your k against the minimum of the formula, for blocks with A = X and with
#   A ≈ 17·X.
#
# **Time.** About 40 minutes.
#
# **How to work.** Replace each `raise NotImplementedError(...)`, run the demo, grade with the
# last cell; `hint(EXERCISE)` unfolds one hint at a time. Cells under
# `if __name__ == "__main__":` do not run when the grader loads your notebook.
# `zerokit/activation_checkpointing/` holds the library's version (`every_k` in `policies.py`), to compare with afterwards.

# %%
import math

import torch
import torch.nn as nn

import zerokit
from zerokit.grade import hint

EXERCISE = "12_checkpoint_policy"

# %%
def segments(n: int, k: int) -> list:
    """[(start, stop), …] covering blocks 0…n−1 in segments of k (the last may be shorter)."""
    raise NotImplementedError('one (start, stop) per segment, from 0 in steps of k, the last stop n')


class Recompute(torch.autograd.Function):
    """Forward without recording, keeping only the input; backward recomputes, then differentiates."""

    @staticmethod
    def forward(ctx, run, x, *params):
        raise NotImplementedError("keep run, the RNG state (torch.get_rng_state(): dropout's masks), and the input and the params with ctx.save_for_backward; return run(x) — autograd records nothing inside a Function's forward")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("a fresh leaf of the saved input; run again with torch.enable_grad(), from forward's RNG state (inside torch.random.fork_rng(), torch.set_rng_state(...), so the training's own RNG moves on untouched); torch.autograd.grad of the output with respect to the input and the params; return (None, their gradients)")


def checkpointed_forward(blocks: nn.Sequential, x: torch.Tensor, k: int) -> torch.Tensor:
    """x through the blocks, each segment of k blocks recomputed in backward."""
    raise NotImplementedError("for each segment: run = the segment's blocks (an nn.Sequential of them); x = Recompute.apply(run, x, *its parameters)")


def best_k(n: int, layer_bytes: float, boundary_bytes: float) -> int:
    """The segment length k in 1…n with the smallest ⌈n/k⌉·X + k·A."""
    raise NotImplementedError('try every k from 1 to n; keep the first with the smallest bytes')

# %% [markdown]
# Try it: the bytes a 16-block chain keeps after forward, for each k, and the k your policy picks.

# %%
if __name__ == "__main__":
    from zerokit.runtime.memory import MemoryLedger

    def stored(k):
        torch.manual_seed(0)
        blocks = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(16)])
        x = torch.randn(8, 32, requires_grad=True)
        ledger = MemoryLedger()
        ledger.track_model(blocks)
        with ledger.watch_activations():
            y = checkpointed_forward(blocks, x, k)
            kept = ledger.current()["activations"]
            y.sum().backward()
        return kept

    for k in (1, 2, 4, 8, 16):
        print(f"k = {k:2d}: {stored(k):6,} B kept after forward")
    print("best k for 16 blocks with A = X:", best_k(16, 1, 1), "; with A = 17·X:", best_k(16, 17, 1))

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
if __name__ == "__main__":  # check `segments`, 1 point
    report = zerokit.grade(globals(), EXERCISE, checks=["segments"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `same-gradients`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["same-gradients"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `rng-state`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["rng-state"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `stored-bytes`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["stored-bytes"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `peak-bytes`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["peak-bytes"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `recomputes`, 1 point
    report = zerokit.grade(globals(), EXERCISE, checks=["recomputes"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `best-k`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["best-k"])
    assert report.passed, report
