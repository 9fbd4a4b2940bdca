# %% [markdown]
# # 10 · Activation checkpointing: trading a forward pass for memory
#
# **The question.** ZeRO shards the model states; nothing it does touches the activations —
# the tensors each layer saves for its backward, which grow with batch and sequence and, for
# long sequences, dwarf the model states. Activation checkpointing keeps only a few of them
# and recomputes the rest during backward. How many bytes does each policy keep — every
# block, segments of k blocks, Chen et al.'s √n, Korthikanti et al.'s *selective* recompute —
# and how much time does the recompute cost? Is √n really the best segment length?
#
# **What you will see.** The bytes a tiny GPT's blocks save for backward, counted by the
# memory ledger's saved-tensor hooks, next to Korthikanti et al.'s term-by-term formula; each
# policy's stored and peak bytes equal to `theory.checkpointed_activation_bytes` (Chen et
# al.'s `⌈n/k⌉·X` + one segment recomputed); Chen's `k + n/k` minimum at `k = √n` on a chain
# built for it — and why a transformer's minimum is elsewhere; selective recompute with and
# without a fused attention kernel; the step-time cost, measured; training under ZeRO-2 and
# ZeRO-3 with the same losses, and the seed's checkpointing table (45 % / 78 % saved for 18 % /
# 22 % more time) measured here; and a panel over policy, k and the number of blocks.
#
# **Time:** about 25 min to read and run (the run itself: about 15 s on a 2-core laptop) ·
# **Needs:** lessons 02 (what a step keeps in memory) and 06 (ZeRO-3's gathers), nothing else ·
# **After it you can answer:** *What does activation checkpointing trade, and for how much?* ·
# *Is k = √n the best checkpoint interval for a transformer?* · *What does selective
# recomputation recompute?* · *Does ZeRO-3 reduce activation memory?*

# %%
%matplotlib inline
import math
import statistics

import matplotlib
import torch
from IPython.display import display
from torch.nn.attention import SDPBackend, sdpa_kernel

import zerokit
from zerokit import course, theory
from zerokit.activation_checkpointing.measure import block_activations, scale_chain, step_time
from zerokit.activation_checkpointing.policies import THEORY_NAME
from zerokit.course.timeline_figure import step_time as median_step  # a run's step time and its spread
from zerokit.workloads import TinyGPT

matplotlib.rcParams["figure.dpi"] = course.DPI
torch.set_num_threads(1)
V, S, H, HEADS, B, E = 64, 16, 64, 8, 2, 4  # vocab, sequence, hidden, heads, batch; fp32 (4-byte elements)
n = 8  # blocks
torch.manual_seed(0)
model = TinyGPT(V, S, H, n, HEADS, dropout=0.1)
x = torch.randn(B, S, H)  # what the embeddings would hand the first block
X = x.numel() * x.element_size()  # one block's input: what a checkpoint keeps
print(f"{n} blocks, s = {S}, b = {B}, h = {H}, a = {HEADS}, fp32, residual dropout 0.1; a block's input X = {X:,} B")

# %% [markdown]
# ## What one block keeps for backward
#
# Korthikanti et al. (arXiv 2205.05198 §4) count a transformer layer's saved tensors term by
# term: the LayerNorm and linear inputs, Q, K, V, the MLP's inputs, the dropout masks, and per
# head either the `s × s` softmax (materialised attention) or a log-sum-exp (a fused kernel,
# which is what torch runs on CPU here). In 16 bits that is `s·b·h·(34 + 5·a·s/h)`; in fp32
# with a fused kernel, `theory.transformer_layer_activation_bytes(…, element_bytes=4,
# fused_attention=True)`. The ledger counts what autograd really saves, deduplicated by storage:

# %%
none = block_activations(model, x, "none", live=False)
A_measured = none["stored"] / n
A_formula = theory.transformer_layer_activation_bytes(S, B, H, HEADS, element_bytes=E, fused_attention=True)
course.table([{"per block": "A, measured (ledger)", "bytes": A_measured, "× X": A_measured / X},
              {"per block": "A, Korthikanti term by term (theory, fp32, fused)", "bytes": A_formula, "× X": A_formula / X},
              {"per block": "16-bit, unfused: s·b·h·(34 + 5as/h) (theory)", "bytes": theory.activation_bytes_per_layer(S, B, H, HEADS),
               "× X": theory.activation_bytes_per_layer(S, B, H, HEADS) / X}])

# %% [markdown]
# The measured block is a little above the formula: torch's LayerNorm also saves its mean and
# 1/σ (two fp32 numbers per token per norm), and the CPU's dropout keeps its masks as fp32,
# not bytes. Either way a block saves **about 18 × its input**: that ratio decides which
# checkpointing policy is best, below.
#
# ## The policies
#
# A checkpointed call keeps its inputs and the RNG state and drops everything else it would
# save; backward runs it again (dropout draws the same masks) and uses what the recompute
# saves. zerokit's policies (`zerokit/activation_checkpointing/`), all through `zerokit.train(…,
# checkpointing=…)`:
#
# - `every` — each block keeps only its input X (Korthikanti's "full" recompute);
# - `every_k` — segments of k blocks keep only the segment's input; backward recomputes a whole
#   segment at once (Chen et al., arXiv 1604.06174): `⌈n/k⌉·X` stored, plus one segment's
#   `k·A` while it is recomputed;
# - `sqrt` — `every_k` with k ≈ √n, Chen's choice;
# - `selective` — only the attention core is recomputed (Korthikanti et al. §5);
# - `torch-every`, `torch-selective` — torch's own `torch.utils.checkpoint` per block, and its
#   selective checkpointing keeping the matmul outputs.
#
# Stored after forward and at the peak of backward, for the 8 blocks above, each policy
# recomputing every block (or attention core) once.
#
# **Predict before you run.** A block here saves about 18 × its input (A ≈ 18·X). Of `every`
# (k = 1), `every_k` with k = 2, 4 or 8, and `sqrt` (k ≈ √8, segments of 3), which keeps the
# least at the peak of backward?
#
# <details><summary>Answer</summary>
#
# `every`: the peak is about `⌈n/k⌉·X + k·A`, and with A ≈ 18·X each extra block in the
# recomputed segment (`+A`) costs far more than the boundaries it saves (`X` each). The
# "peak B (ledger)" column of the table below is smallest in the `every` row and grows with k;
# `sqrt` sits between k = 2 and k = 4.
#
# </details>

# %%
POLICIES = [("every", None), ("every_k", 2), ("every_k", 4), ("sqrt", None), ("every_k", n), ("selective", None),
            ("torch-every", None), ("torch-selective", None)]
measured = {p: block_activations(model, x, *p) for p in POLICIES}
rows = []
for (policy, k), got in measured.items():
    if policy.startswith("torch"):
        continue  # torch's own policies hide their tensors from the ledger's hooks: compared by live tensors below
    segmented = policy in THEORY_NAME
    rows.append({"policy": policy, "k": got["segment_layers"] if segmented else None,
                 "stored B (ledger)": got["stored"],
                 "stored B (formula ⌈n/k⌉·X)": theory.checkpointed_activation_bytes(n, 0, X, THEORY_NAME[policy],
                                                                                     segment_layers=k)
                 if segmented else None,
                 "peak B (ledger)": got["peak"],
                 "peak B (formula on measured A, X)": theory.checkpointed_activation_bytes(
                     n, A_measured, X, THEORY_NAME[policy], segment_layers=k) if segmented else None})
display(course.table([{"policy": "none", "stored B (ledger)": none["stored"], "peak B (ledger)": none["peak"],
                       "peak B (formula on measured A, X)": theory.checkpointed_activation_bytes(n, A_measured, X, "none")}]
                     + rows, columns=list(rows[0])))
course.table([{"policy": f"{ours} / {theirs}", "stored B, live tensors": f"{measured[(ours, None)]['live_stored']:,} / "
               f"{measured[(theirs, None)]['live_stored']:,}",
               "peak B, live tensors": f"{measured[(ours, None)]['live_peak']:,} / {measured[(theirs, None)]['live_peak']:,}"}
              for ours, theirs in (("every", "torch-every"), ("selective", "torch-selective"))],
             title="zerokit's policy / torch's own (torch.utils.checkpoint), counted as live tensors")

# %% [checks]
for (policy, k), got in measured.items():
    assert got["recomputed_forwards"] == n, policy  # every block (or attention core) recomputed once
for row in rows:
    if row["stored B (formula ⌈n/k⌉·X)"] is not None:
        assert row["stored B (ledger)"] == row["stored B (formula ⌈n/k⌉·X)"], row["policy"]  # exact: one input per segment
        if n % row["k"] == 0:  # exact up to one boundary: the recomputed segment's first block saves its kept input
            assert row["peak B (ledger)"] == row["peak B (formula on measured A, X)"] - X, row["policy"]
        else:  # sqrt: segments of 3, 3, 2; the short last one is recomputed first, and frees its boundary
            assert X <= row["peak B (formula on measured A, X)"] - row["peak B (ledger)"] \
                <= row["stored B (formula ⌈n/k⌉·X)"], row["policy"]
assert measured[("every", None)]["live_stored"] == measured[("torch-every", None)]["live_stored"]  # torch keeps the same
assert min(rows[:5], key=lambda r: r["peak B (ledger)"])["policy"] == "every"  # A ≈ 18·X: the best k is 1 here

# %% [markdown]
# **Check yourself.** How many block forwards does each policy re-run in backward? Predict it, then run the cell: it prints its
# verdict, and stops with an `AssertionError` if the run disagrees.

# %%
again = {policy: got["recomputed_forwards"] for (policy, _), got in measured.items()}
print(f"blocks recomputed in backward (n = {n}): {again} — "
      f"{'each policy pays one extra forward' if set(again.values()) == {n} else 'not one extra forward'}")
assert set(again.values()) == {n}

# %% [markdown]
# On this stack of blocks, `every` stores the least and also peaks the least — not `sqrt`
# (a whole model adds its embedding and head, and its peak can fall elsewhere: the training
# run below). Chen's `k + n/k`
# assumes a block's activations are the size of its input; a transformer block's are ~18 × X,
# so recomputing a long segment costs more at the peak (`k·A`) than the boundaries it saves
# (`X` each). The formula says where the balance lies: `⌈n/k⌉·X + k·A` is smallest near
# `k* = √(n·X/A)` — √n only when A = X. Here √(8/18) < 1, so k* = 1. torch's own
# `checkpoint` around each block keeps what zerokit's `every` keeps (the second table). On a
# chain built to Chen's assumption (`scale_chain`: `tanh(x·w)`, which saves exactly its input
# and output) the minimum sits at √n:

# %%
CHAIN_N, D = 16, 256
chain, cx = scale_chain(CHAIN_N, D), torch.randn(8, D)
unit = cx.numel() * cx.element_size()
ks = [1, 2, 4, 8, 16]
chain_peaks = {k: block_activations(chain, cx, "every" if k == 1 else "every_k", None if k == 1 else k, live=False)["peak"]
               for k in ks}
gpt_peaks = {1: measured[("every", None)]["peak"], 2: measured[("every_k", 2)]["peak"],
             4: measured[("every_k", 4)]["peak"], 8: measured[("every_k", n)]["peak"]}
fig, (left, right) = course.new_figure(10, 3.4, ncols=2)
grid = list(range(1, CHAIN_N + 1))
left.plot(grid, [theory.checkpointed_blocks(CHAIN_N, CHAIN_N / k) for k in grid], color="#333333", lw=1.5,
          label="Chen: k + n/k (theory)")
left.plot(ks, [chain_peaks[k] / unit for k in ks], "o", color="#C44E52", ms=7, label="peak, measured (ledger)")
left.axvline(math.sqrt(CHAIN_N), color="#999999", ls="--", lw=1, label="k = √n")
left.set_xlabel("blocks per segment k")
left.set_ylabel("peak, in blocks' activations")
left.set_title(f"chain of {CHAIN_N} blocks saving their input's size", fontsize=9)
left.legend(fontsize=8)
right.plot(range(1, n + 1), [theory.checkpointed_activation_bytes(n, A_measured, X, "every-k", segment_layers=k) / 1024
                             for k in range(1, n + 1)], color="#333333", lw=1.5, label="⌈n/k⌉·X + k·A (theory)")
right.plot(list(gpt_peaks), [v / 1024 for v in gpt_peaks.values()], "o", color="#C44E52", ms=7,
           label="peak, measured (ledger)")
right.axhline(none["peak"] / 1024, color="#999999", ls=":", lw=1, label="none")
right.set_xlabel("blocks per segment k")
right.set_ylabel("KiB at the peak")
right.set_title(f"tiny GPT, {n} blocks, A ≈ {A_measured / X:.0f}·X", fontsize=9)
right.legend(fontsize=8)
fig.tight_layout()
fig

# %% [checks]
for k in ks:
    assert chain_peaks[k] == theory.checkpointed_blocks(CHAIN_N, CHAIN_N // k) * unit, k  # exact
assert min(chain_peaks, key=chain_peaks.get) == theory.optimal_checkpoint_segments(CHAIN_N) == 4  # √16
assert chain_peaks[4] == 2 * math.sqrt(CHAIN_N) * unit  # 2√n

# %% [markdown]
# ### The best k for a real model
#
# How deep must a transformer be before segments beat checkpointing every block? In 16 bits
# a layer's input is `X = 2·s·b·h` and, with the `s × s` scores dropped (a fused attention
# kernel, or selective recompute), Korthikanti's layer keeps `A ≈ 34·s·b·h`: **A ≈ 17·X**, so
# `k* ≈ √(n/17)`. With the scores materialised, `A/X = 17 + 2.5·a·s/h` — 57 at GPT-3's shape.
# The formula's minimum over k, from `theory.checkpointed_activation_bytes`, for GPT-3 (96
# layers, s = 2048, h = 12288, a = 96, one sequence) and for this lesson's 8 blocks:

# %%
s3, b3, h3, a3, n3 = 2048, 1, 12288, 96, 96
X3 = 2 * s3 * b3 * h3  # a GPT-3 layer's 16-bit input
cases = [("GPT-3, scores dropped (fused attention)", n3, theory.transformer_layer_activation_bytes(
              s3, b3, h3, a3, fused_attention=True), X3),
         ("GPT-3, scores materialised", n3, theory.activation_bytes_per_layer(s3, b3, h3, a3), X3),
         ("this lesson's tiny GPT (A measured)", n, A_measured, X)]
k_rows = []
for label, depth, A_, X_ in cases:
    peak = {k: theory.checkpointed_activation_bytes(depth, A_, X_, "every-k", segment_layers=k) for k in range(1, depth + 1)}
    best = min(peak, key=peak.get)
    k_rows.append({"model": label, "n": depth, "A / X": round(A_ / X_, 1), "√(n·X/A)": round(math.sqrt(depth * X_ / A_), 2),
                   "k* (formula's minimum)": best, "peak at k* ÷ peak at k = 1": round(peak[best] / peak[1], 3)})
course.table(k_rows)

# %% [checks]
assert [r["k* (formula's minimum)"] for r in k_rows] == [2, 1, 1]  # √(96/17) ≈ 2.4; √(96/57) ≈ 1.3; √(8/18) < 1
assert 0.70 < k_rows[0]["peak at k* ÷ peak at k = 1"] < 0.78  # "about a quarter less"

# %% [markdown]
# With a fused attention kernel (flash attention, the usual kernel in large-model training
# today) the best segment for 96 layers is 2 blocks, k = 3 barely behind, and it keeps about a
# quarter less at the peak than checkpointing every block. With the scores materialised A is
# so large that the formula's minimum is k = 1. k* grows only as √n: a few blocks per segment
# even for very deep models, never √n.

# %% [markdown]
# ## Selective recompute: drop what is big and cheap
#
# Korthikanti et al. §5 noticed that the attention core — softmax(QKᵀ)V with its `s × s`
# scores, mask and dropout — holds the `5·a·s²·b` term, the part that grows with the square
# of the sequence, while costing few FLOPs to recompute. `selective` recomputes only that
# core and keeps every linear layer's output. How much it saves depends on the kernel: a fused
# attention kernel (flash attention; torch's CPU default) never stores the scores in the first
# place, only a log-sum-exp per head. With the materialised (math) kernel the scores are back,
# and selective drops them:

# %%
two = TinyGPT(V, S, H, 2, HEADS, dropout=0.1)
kernels = {}
for kernel, backend in (("fused", None), ("math", SDPBackend.MATH)):
    for policy in ("none", "selective"):
        if backend is None:
            kernels[(kernel, policy)] = block_activations(two, x, policy, live=False)["stored"]
        else:
            with sdpa_kernel(backend):
                kernels[(kernel, policy)] = block_activations(two, x, policy, live=False)["stored"]
scores = (theory.transformer_layer_activation_bytes(S, B, H, HEADS, element_bytes=E, dropout=False)
          - theory.transformer_layer_activation_bytes(S, B, H, HEADS, element_bytes=E, dropout=False, fused_attention=True))
course.table([{"kernel": kernel, "none B": kernels[(kernel, "none")], "selective B": kernels[(kernel, "selective")],
               "selective saves B": kernels[(kernel, "none")] - kernels[(kernel, "selective")]} for kernel in ("fused", "math")]
             + [{"kernel": "math − fused, per 2 blocks (theory: the s² scores)", "none B": 2 * scores}])

# %% [checks]
assert kernels[("math", "none")] - kernels[("fused", "none")] == 2 * scores  # the s × s softmax, as the formula says
assert kernels[("math", "selective")] == kernels[("fused", "selective")]  # selective drops the core either way

# %% [markdown]
# At this toy size the scores are small. At GPT-3's (s = 2048, h = 12288, a = 96, 16-bit, one
# sequence per micro-batch) the `5·a·s/h` term is more than twice the 34 of everything else,
# so dropping it (selective, or a fused kernel) keeps well under half of a layer's bytes, and
# full recompute keeps one input of `2·s·b·h`:

# %%
s, b, h, a = 2048, 1, 12288, 96
layer16 = theory.activation_bytes_per_layer(s, b, h, a)
fused16 = theory.transformer_layer_activation_bytes(s, b, h, a, fused_attention=True)
course.table([{"GPT-3 layer, 16-bit": "none: s·b·h·(34 + 5as/h)", "MB": layer16 / 1e6, "share": 1.0},
              {"GPT-3 layer, 16-bit": "scores dropped (selective ≈ fused attention)", "MB": fused16 / 1e6,
               "share": fused16 / layer16},
              {"GPT-3 layer, 16-bit": "every: the layer's input, 2·s·b·h", "MB": 2 * s * b * h / 1e6,
               "share": 2 * s * b * h / layer16}])

# %% [markdown]
# ## What the recompute costs in time
#
# A checkpointed block runs its forward twice. With backward ≈ 2 × forward, one extra
# forward per block is ≈ 33 % more compute; `selective` recomputes only the attention core.
# Forward + backward of a slightly larger tiny GPT (s = 64, h = 128, 4 blocks), median of 3
# after a warm-up, in 3 interleaved rounds, measured on this machine's CPU, one thread (each
# round's value shown, to show the noise). The last column times the same policies on the smaller model the
# panel below times (the 8 blocks of the tables above: s = 16, h = 64, b = 2):

# %%
timing_model = TinyGPT(256, 64, 128, 4, 4, dropout=0.1)
tokens = torch.randint(0, 256, (8, 64))
panel_model = TinyGPT(64, S, H, n, HEADS, dropout=0.1)  # the panel's model: the tables' 8 blocks
panel_tokens = torch.randint(0, 64, (B, S))
TIMED = [("none", None), ("every", None), ("every_k", 2), ("selective", None), ("torch-every", None),
         ("torch-selective", None)]
samples = {p: [] for p in TIMED}
small = {p: [] for p in TIMED}
for r in range(3):  # interleaved rounds, the order rotating: drift on a shared machine hits every policy alike
    for policy, k in TIMED[r:] + TIMED[:r]:
        samples[(policy, k)].append(step_time(timing_model, tokens, policy, k, repeats=3))
        small[(policy, k)].append(step_time(panel_model, panel_tokens, policy, k, repeats=3))
times = {p: statistics.median(v) for p, v in samples.items()}  # median of the rounds' medians
small_times = {p: statistics.median(v) for p, v in small.items()}


def spread(values):
    """The rounds' interquartile range over their median."""
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / statistics.median(values)


display(course.table([{"policy": p + (f" k={k}" if k else ""), "ms fwd + bwd (median, measured)": 1000 * t,
                       "× none": t / times[("none", None)],
                       "rounds (ms)": ", ".join(f"{1000 * v:.0f}" for v in samples[(p, k)]),
                       "× none, the panel's model": small_times[(p, k)] / small_times[("none", None)]}
                      for (p, k), t in times.items()]))
for policy in ("every", "selective"):
    course.show(course.speed_sentence(
        f"`{policy}`", times[(policy, None)], "`none`", times[("none", None)],
        spread=max(spread(samples[(policy, None)]), spread(samples[("none", None)])),
        elsewhere="" if policy == "every" else
        "Where a block's arithmetic outweighs its fixed costs (a GPU at real sizes), `every` adds about one forward "
        "per block, ≈ 1/3 of forward + backward, and `selective` a small fraction of that."))
ratio = {p: (times[p] / times[("none", None)], small_times[p] / small_times[("none", None)]) for p in TIMED[1:]}
larger_on_small = [p + (f" k={k}" if k else "") for (p, k), (big, tiny) in ratio.items() if tiny > big]
course.show(f"On this run the panel's smaller model paid the larger ratio to `none` for "
            f"{len(larger_on_small)} of the {len(ratio)} policies" + (f" ({', '.join(larger_on_small)})"
                                                                      if larger_on_small else "") + ".")

# %% [markdown]
# What one extra forward per block costs is a ratio to measure, on a given model and machine,
# not a constant to quote. On a CPU at these sizes the backward is not exactly twice the
# forward, and each recompute carries fixed costs — saving and restoring the RNG state, the
# hooks, Python — that weigh more the smaller the block: where they dominate, the panel's
# smaller model (its column, and the panel's "time ×" below) pays a larger ratio than the larger
# model's "× none" (the sentence under the table counts the policies for which it did on this
# run; with ratios this close the noise decides some of them). Recomputing only the attention
# core (`selective`) recomputes less of each block.
#
# ## Training with checkpointing: the same losses, under ZeRO too
#
# Dropout makes the recompute honest: if the RNG state were not restored, the masks in
# backward would differ from those in forward and the gradients would be wrong. ZeRO-3 adds a
# second difficulty — a block's parameters are freed after its forward, so the recompute needs
# them gathered again: zerokit's choice is to run the recompute inside the block's backward,
# after the gather the backward makes anyway, so checkpointing adds no collective (the checks
# compare the bytes). A tiny GPT with dropout (s = 32, h = 64, 4 blocks, 16 sequences), 2
# ranks, 4 steps, each policy next to the same run without checkpointing; the training ledger
# also reads each rank's activation peak:

# %%
dropout_work = zerokit.tiny_gpt(vocab=64, seq_len=32, d_model=64, n_layer=4, n_head=4, batch_size=16, dropout=0.1)
STEPS = 4
trained = {}
for strategy, policy in (("zero2", "none"), ("zero2", "every"), ("zero3", "none"), ("zero3", "every"), ("zero3", "sqrt"),
                         ("zero3", "selective"), ("zero3", "torch-every"), ("zero3", "torch-selective")):
    trained[(strategy, policy)] = zerokit.train(dropout_work, strategy, world_size=2, steps=STEPS, reference=False,
                                                checkpointing=policy)
rows = []
for (strategy, policy), report in trained.items():
    result, plain = report.result, trained[(strategy, "none")].result
    rows.append({"strategy": strategy, "checkpointing": policy, "last loss": round(result.losses[-1], 6),
                 "|Δparam| vs none": zerokit.report.param_difference(result.ranks[0].params, plain.ranks[0].params)["max_abs"],
                 "recomputed forwards (rank 0)": result.ranks[0].recomputed_forwards,
                 "activation peak B (rank 0, ledger)": None if policy.startswith("torch") else
                 result.ranks[0].peak_by_category["activations"]})  # torch's own hooks hide its tensors from the ledger
display(course.table(rows))
X_train = (16 // 2) * 32 * 64 * 4  # one block's input on a rank: 8 sequences × s × h, fp32
whole = {p: trained[("zero3", p)].result.ranks[0].peak_by_category["activations"] for p in ("every", "sqrt")}
gap = whole["every"] - whole["sqrt"]
course.show(f"In this whole model (zero3, rank 0) `every` peaks at {whole['every']:,} B of activations and `sqrt` "
            f"(k = 2) at {whole['sqrt']:,} B: " + (
                "`every` peaks lower, as the block-stack formula `⌈n/k⌉·X + k·A` says." if gap < 0 else
                "the same." if gap == 0 else
                f"`sqrt` peaks lower, by {gap / X_train:g} block inputs X — " + (
                    "exactly the boundaries `every` keeps and `sqrt` does not, so the model's peak falls where all the "
                    "kept boundaries are live, not inside a segment's recompute: the "
                    "block-stack formula describes the recompute alone, and fewer boundaries win here."
                    if gap % X_train == 0 else
                    "the model's peak is not the block stack's; the formula `⌈n/k⌉·X + k·A` counts the blocks alone.")))

# %% [checks]
for (strategy, policy), report in trained.items():
    result, plain = report.result, trained[(strategy, "none")].result
    assert max(abs(u - v) for u, v in zip(result.losses, plain.losses)) <= 1e-6, (strategy, policy)  # same masks
    assert zerokit.report.param_difference(result.ranks[0].params, plain.ranks[0].params)["max_abs"] <= 1e-6
    for rank in result.ranks:
        assert rank.recomputed_forwards == (0 if policy == "none" else 4 * STEPS)  # 4 blocks (or cores) per step
        assert rank.comm_payload_bytes_per_step == plain.ranks[rank.rank].comm_payload_bytes_per_step  # no extra gather
for strategy in ("zero2", "zero3"):
    assert trained[(strategy, "every")].result.ranks[0].peak_by_category["activations"] < \
        trained[(strategy, "none")].result.ranks[0].peak_by_category["activations"]

# %% [markdown]
# ## The seed's table: checkpointing under ZeRO-2 and ZeRO-3
#
# The seed answers *"Is ZeRO compatible with gradient checkpointing?"*
# (“ZeRO与梯度检查点的兼容性？”) with a table: memory saved 45 % under ZeRO-2 and 78 % under
# ZeRO-3, for 18 % and 22 % more compute (“内存节省率 45% 78%”, “计算开销增加 18% 22%”), and
# "activation recompute + sharded storage" (“激活值重计算+分片存储”) recommended. It names no model,
# batch or policy, and cites no source for the numbers. The same trade measured on the
# runs above (`every` against `none`, rank 0): the activations saved, the rank's whole peak
# saved (model states + activations), and the step time, the median of the last 3 steps:

# %%
seed_rows, sentences = [], []
for strategy, seed_saved, seed_more in (("zero2", "45 %", "18 %"), ("zero3", "78 %", "22 %")):
    plain, ckpt = trained[(strategy, "none")], trained[(strategy, "every")]
    r0, r1 = plain.result.ranks[0], ckpt.result.ranks[0]
    t0, t1 = median_step(plain), median_step(ckpt)  # (median s, IQR / median) over steps 2–4
    activations = 1 - r1.peak_by_category["activations"] / r0.peak_by_category["activations"]
    seed_rows.append({"stage": strategy, "activations saved (measured)": f"{activations:.1%}",
                      "rank's peak saved (measured)": f"{1 - r1.peak_bytes / r0.peak_bytes:.1%}",
                      "seed: memory saved": seed_saved, "step time added (measured)": f"{t1[0] / t0[0] - 1:+.0%}",
                      "seed: compute added": seed_more})
    sentences.append(course.speed_sentence(f"{strategy} with `every`", t1[0], f"{strategy} without", t0[0],
                                           spread=max(t0[1], t1[1])))
display(course.table(seed_rows))
course.show(" ".join(sentences))

# %% [checks]
share = {st: 1 - trained[(st, "every")].result.ranks[0].peak_bytes / trained[(st, "none")].result.ranks[0].peak_bytes
         for st in ("zero2", "zero3")}
assert abs(share["zero2"] - share["zero3"]) < 0.05  # "the two shares come out close" on this run
assert trained[("zero2", "every")].result.ranks[0].peak_by_category["activations"] == \
    trained[("zero3", "every")].result.ranks[0].peak_by_category["activations"]

# %% [markdown]
# Row by row, the verdict:
#
# - **Memory saved.** The activations saved are the same under ZeRO-2 and ZeRO-3, to the byte
#   (the first column): ZeRO shards model states, never activations, so checkpointing saves
#   what it saves whatever the stage. What can differ is the saving as a share of the rank's
#   whole peak (the second column): ZeRO-3 holds fewer model-state bytes at rest, so where a
#   model's states are a large part of the peak, the same activation bytes are a larger share
#   of it under ZeRO-3 — one way a "45 % vs 78 %" could arise, for some model and batch. It is
#   not a property of the stages: on a run whose peak is mostly activations, as here, the two
#   shares come out close.
# - **Compute added.** Checkpointing every block adds one forward per block at either stage:
#   ≈ 1/3 of forward + backward where backward ≈ 2 × forward. Under ZeRO-3 the recompute needs
#   the block's parameters, and where an implementation gathers them once more for it, the
#   extra gather adds to the step; zerokit's recompute uses the backward's own gather (no
#   extra bytes, checked above). What a step adds here is in the sentences above, with their
#   noise; 18 % and 22 % are ratios of one unnamed setup.
# - **"Recompute + sharded storage" recommended: yes, as a combination that composes** — the
#   same losses and parameters with and without checkpointing at both stages (the training
#   table), activation memory cut by checkpointing and model states by ZeRO. Whether it is
#   worth its time depends on what the freed memory buys (a larger micro-batch, a longer
#   sequence, fewer pipeline stages).

# %% [markdown]
# ## Try it
#
# Choose the policy, the segment length k (for `every_k`) and the number of blocks: the
# panel measures the policy next to `none` on a tiny GPT — stored and peak bytes from the
# ledger (live tensors for torch's policies), with the formula's ticks — and times forward +
# backward of both. Watch `every_k`'s peak grow with k, and how little `selective` saves with
# a fused kernel.

# %%
course.CheckpointingPanel(blocks=(4, 8, 16), n=8, policy="every_k", k=2)

# %% [markdown]
# ## Summary
#
# - A transformer block saves many times its input for backward (~18 × here; Korthikanti's
#   `34 + 5as/h` per `s·b·h` in 16 bits); the ledger counts it, the formula predicts it term
#   by term.
# - Checkpointing in segments of k blocks stores `⌈n/k⌉·X` and peaks at about `⌈n/k⌉·X + k·A`
#   (`theory.checkpointed_activation_bytes`, measured to the byte up to one shared boundary).
#   Chen's √n is optimal only when a block's activations equal its input (`k + n/k`, measured
#   on a chain); for transformer blocks the peak is smallest near `k* = √(n·X/A)`: with a
#   fused attention kernel A ≈ 17·X in 16 bits, so `k* ≈ √(n/17)` — 1 for shallow models like
#   this one, 2 (or 3) for GPT-3's 96 layers. That is the blocks' own peak: a whole model's
#   can fall where every kept boundary is live, outside any
#   recompute, where fewer boundaries win (the training run's sentence says which did here).
# - The price is one extra forward per checkpointed block (≈ 4/3 of the compute when backward
#   is 2 × forward; what this machine measured, with its noise, is in the sentences under the
#   timing table); selective recompute drops the `s²` attention term and recomputes only the
#   attention core, and a fused attention kernel already avoids storing it.
# - ZeRO does not shard activations; checkpointing works under every stage with identical
#   losses and saves the same activation bytes under ZeRO-2 and ZeRO-3 (the seed's 45 % / 78 %
#   can only be shares of different peaks); zerokit's ZeRO-3 recomputes a block inside its
#   backward, after the gather the backward makes anyway.
#
# ## Interview questions
#
# 1. *Why is k = √n the optimal checkpoint interval, and when is it not?*
#
#    <details><summary>Answer</summary>
#
#    With n equal blocks in segments of k, you store one input per segment (n/k) and hold one
#    segment's activations during its recompute (k): `k + n/k`, minimal at `k = √n`, giving
#    `2√n`. That assumes a block's activations are the size of its input. A transformer block
#    saves A ≈ 17 × its input in 16 bits with a fused attention kernel (more with the `s × s`
#    scores materialised), and `⌈n/k⌉·X + k·A` is minimal near `k* = √(n·X/A) ≈ √(n/17)`: 1 for
#    shallow models, 2–3 for GPT-3's 96 layers (2 by the formula's exact minimum, a quarter less
#    than k = 1 at the peak), and 1 again when the scores are kept (A ≈ 57·X there). The chain,
#    the GPT measured side by side, and the k* table above. That optimises the blocks' own
#    peak; measure the whole model's, whose peak can fall outside any recompute (the
#    training run, where the sentence under its table compares `every` and `sqrt`).
#
#    </details>
#
# 2. *What does selective activation recomputation recompute, and why is it cheaper than full
#    recomputation?*
#
#    <details><summary>Answer</summary>
#
#    Only the attention core — QKᵀ, softmax, dropout, ×V — whose saved tensors (the `5·a·s²·b`
#    term) grow with s² but whose recompute takes few FLOPs compared with the linear layers.
#    Everything else is kept. Flash attention gets the same memory effect by never storing the
#    scores (the fused vs math table).
#
#    </details>
#
# 3. *Does ZeRO-3 reduce activation memory? How do you combine it with checkpointing?*
#
#    <details><summary>Answer</summary>
#
#    No: ZeRO shards parameters, gradients and optimizer states; each rank still holds its own
#    micro-batch's activations. Checkpointing is orthogonal and composes with every stage (the
#    same activation bytes saved under ZeRO-2 and ZeRO-3, the same losses as without it). Under
#    ZeRO-3 the recompute needs the block's parameters again: run inside the block's backward,
#    it uses the gather the backward makes anyway (zerokit's choice; no extra bytes above).
#
#    </details>

# %% [markdown]
# **Exercise:** [exercises/12_checkpoint_policy.ipynb](../exercises/12_checkpoint_policy.ipynb) — a
# checkpointing policy and its best segment length, graded by `zerokit grade 12` · **Next:** [lesson 11 — putting it together: DP × TP × PP and
# how to choose](11_putting_it_together.ipynb)
