# %% [markdown]
# # Exercise 09 · Predict the number
#
# **Goal.** Before you run a configuration, know what it will cost. Work out three numbers
# with pencil and paper (or a line of Python), then let the grader hold each against
# `zerokit.theory` **and** a measured run of the same configuration, side by side.
#
# **Interface.** Three numbers, set at the top level of the notebook, for this configuration:
# `zerokit.mlp(sizes=(32, 64, 64, 10))`, three linear layers, Ψ = 32·64 + 64 + 64·64 + 64 +
# 64·10 + 10 = 6,922 parameters, fp32, AdamW, N = 2 ranks.
#
# 1. `ZERO1_BYTES_PER_RANK` — the model-state bytes (parameters + gradients + optimizer
#    states) one rank holds under ZeRO-1. zerokit's ZeRO-1 keeps the parameters in one flat
#    buffer (6,922 is even, so no padding at N = 2) and steps one flat shard, so torch's AdamW
#    keeps one 4-byte `step` counter.
# 2. `ZERO3_BYTES_SENT_PER_STEP` — the bytes one rank sends per training step under ZeRO-3,
#    with zerokit's ring on send/recv (`algorithm="ring"`: the bytes are counted on the wire).
#    Each layer is a unit; every layer's parameter count is even, so again no padding.
# 3. `BUBBLE_1F1B` — the fraction of wall time a rank idles in a 1F1B pipeline of p = 2 stages
#    and m = 4 micro-batches: the share of the step (GPipe's form), not Megatron's idle time
#    over the ideal time — lesson 08 teaches both.
#
# **What the grader checks** (`zerokit.grade.checks("09")`):
# - `zero1-bytes-per-rank` — yours against `theory.model_state_bytes(1, …)` (within 0.5 %),
#   shown next to the bytes `zerokit.train(…, "zero1")` measures;
# - `zero3-bytes-sent-per-step` — against `theory.comm_bytes_per_step(3, …)`, next to the bytes
#   `zerokit.train(…, "zero3", algorithm="ring")` counts on the wire;
# - `bubble-1f1b` — against `theory.bubble_fraction(2, 4)` (within 0.005), next to
#   `zerokit.simulate`'s and a measured run's.
#
# **When.** After lessons 04 (ZeRO-1's bytes), 06 (ZeRO-3's) and 08 (the 1F1B bubble): the
# course map lists it after lesson 11, which gathers the three.
#
# **Time.** About 20 minutes.
#
# **How to work.** Replace each `...` with your number (an expression is fine — but not one that
# calls `zerokit.theory`: that is what you are predicting). `hint(EXERCISE)` unfolds one hint at
# a time. Cells under `if __name__ == "__main__":` do not run when the grader loads your
# notebook.

# %%
import zerokit
from zerokit.grade import hint

EXERCISE = "09_predict"
PSI = 6922
N = 2

# %%
ZERO1_BYTES_PER_RANK = 4 * PSI + 4 * PSI + 8 * PSI // N + 4  # ANSWER: parameters + gradients + optimizer states, bytes on one rank
ZERO3_BYTES_SENT_PER_STEP = 3 * (N - 1) * 4 * PSI // N  # ANSWER: bytes one rank sends per step under ZeRO-3
BUBBLE_1F1B = (2 - 1) / (4 + 2 - 1)  # ANSWER: idle fraction of wall time, p = 2, m = 4

# %%
if __name__ == "__main__":
    print("Ψ =", zerokit.mlp(sizes=(32, 64, 64, 10)).param_count())

# %%
if __name__ == "__main__":
    hint(EXERCISE)

# %%
if __name__ == "__main__":
    report = zerokit.grade(globals(), EXERCISE)
    print(report)
    assert report.passed  # SOLUTION ONLY
