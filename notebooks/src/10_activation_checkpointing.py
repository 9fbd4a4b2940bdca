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
# without a fused attention kernel; the step-time cost, measured; training under ZeRO-3 with
# the same losses; and a panel over policy, k and the number of blocks.

# %%
%matplotlib inline
import math

import matplotlib
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import zerokit
from zerokit import course, theory
from zerokit.checkpointing.measure import block_activations, scale_chain, step_time
from zerokit.checkpointing.policies import THEORY_NAME
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
# saves. zerokit's policies (`zerokit/checkpointing/`), all through `zerokit.train(…,
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
# Stored after forward and at the peak of backward, for the 8 blocks above (torch's own
# policies hide their tensors from the ledger's hooks; live tensors count every policy):

# %%
POLICIES = [("every", None), ("every_k", 2), ("every_k", 4), ("sqrt", None), ("every_k", n), ("selective", None),
            ("torch-every", None), ("torch-selective", None)]
measured = {p: block_activations(model, x, *p) for p in POLICIES}
rows = []
for (policy, k), got in measured.items():
    segmented = policy in THEORY_NAME
    rows.append({"policy": policy, "k": got["segment_layers"] if segmented else None,
                 "stored B (ledger)": got["stored"],
                 "theory ⌈n/k⌉·X": theory.checkpointed_activation_bytes(n, 0, X, THEORY_NAME[policy], segment_layers=k)
                 if segmented else None,
                 "peak B (ledger)": got["peak"],
                 "theory on measured A, X": theory.checkpointed_activation_bytes(n, A_measured, X, THEORY_NAME[policy],
                                                                                 segment_layers=k) if segmented else None,
                 "live stored B": got["live_stored"], "live peak B": got["live_peak"],
                 "recomputed forwards": got["recomputed_forwards"]})
course.table([{"policy": "none", "stored B (ledger)": none["stored"], "peak B (ledger)": none["peak"],
               "theory on measured A, X": theory.checkpointed_activation_bytes(n, A_measured, X, "none")}] + rows,
             columns=list(rows[0]))

# %%
for row, ((policy, k), got) in zip(rows, measured.items()):
    assert got["recomputed_forwards"] == n, policy  # every block (or attention core) recomputed once
    if row["theory ⌈n/k⌉·X"] is not None:
        assert row["stored B (ledger)"] == row["theory ⌈n/k⌉·X"], policy  # exact: one input per segment
        if n % row["k"] == 0:  # exact up to one boundary: the recomputed segment's first block saves its kept input
            assert row["peak B (ledger)"] == row["theory on measured A, X"] - X, policy
        else:  # sqrt: segments of 3, 3, 2; the short last one is recomputed first, and frees its boundary
            assert X <= row["theory on measured A, X"] - row["peak B (ledger)"] <= row["theory ⌈n/k⌉·X"], policy
assert measured[("every", None)]["live_stored"] == measured[("torch-every", None)]["live_stored"]  # torch keeps the same
assert min(rows[:5], key=lambda r: r["peak B (ledger)"])["policy"] == "every"  # A ≈ 18·X: the best k is 1 here

# %% [markdown]
# `every` stores the least and, here, also peaks the least — not `sqrt`. Chen's `k + n/k`
# assumes a block's activations are the size of its input; a transformer block's are ~18 × X,
# so recomputing a long segment costs more at the peak (`k·A`) than the boundaries it saves
# (`X` each). The formula says the same: its minimum over k stays at `k = 1` until n is about
# 2A/X blocks. On a chain built to Chen's assumption (`scale_chain`: `tanh(x·w)`, which saves exactly
# its input and output) the minimum sits at √n:

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
left.legend(fontsize=7)
right.plot(range(1, n + 1), [theory.checkpointed_activation_bytes(n, A_measured, X, "every-k", segment_layers=k) / 1024
                             for k in range(1, n + 1)], color="#333333", lw=1.5, label="⌈n/k⌉·X + k·A (theory)")
right.plot(list(gpt_peaks), [v / 1024 for v in gpt_peaks.values()], "o", color="#C44E52", ms=7,
           label="peak, measured (ledger)")
right.axhline(none["peak"] / 1024, color="#999999", ls=":", lw=1, label="none")
right.set_xlabel("blocks per segment k")
right.set_ylabel("KiB at the peak")
right.set_title(f"tiny GPT, {n} blocks, A ≈ {A_measured / X:.0f}·X", fontsize=9)
right.legend(fontsize=7)
fig.tight_layout()
fig

# %%
for k in ks:
    assert chain_peaks[k] == theory.checkpointed_blocks(CHAIN_N, CHAIN_N // k) * unit, k  # exact
assert min(chain_peaks, key=chain_peaks.get) == theory.optimal_checkpoint_segments(CHAIN_N) == 4  # √16
assert chain_peaks[4] == 2 * math.sqrt(CHAIN_N) * unit  # 2√n

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

# %%
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
# Forward + backward of a slightly larger tiny GPT (s = 64, h = 128, 4 blocks), median of 5
# after a warm-up, in 3 interleaved rounds, measured on 2 shared cores (each round's value shown,
# to show the noise):

# %%
timing_model = TinyGPT(256, 64, 128, 4, 4, dropout=0.1)
tokens = torch.randint(0, 256, (8, 64))
TIMED = [("none", None), ("every", None), ("every_k", 2), ("selective", None), ("torch-every", None),
         ("torch-selective", None)]
samples = {p: [] for p in TIMED}
for r in range(3):  # interleaved rounds, the order rotating: drift on a shared machine hits every policy alike
    for policy, k in TIMED[r:] + TIMED[:r]:
        samples[(policy, k)].append(step_time(timing_model, tokens, policy, k, repeats=3))
times = {p: sorted(v)[1] for p, v in samples.items()}  # median of the rounds' medians
course.table([{"policy": p + (f" k={k}" if k else ""), "ms fwd + bwd (median, measured)": 1000 * t,
               "× none": t / times[("none", None)], "rounds (ms)": ", ".join(f"{1000 * v:.0f}" for v in samples[(p, k)])}
              for (p, k), t in times.items()])

# %% [markdown]
# One extra forward per block is ≈ 1/3 more compute when backward costs 2 × forward; the
# ratios measured here for `every` and `every_k` are higher, because on a CPU at this size the
# backward is not twice the forward and each recompute has its own bookkeeping — and they move
# with the machine's load (the rounds column). `selective` stays much closer to 1: recomputing
# the attention core is cheap. The seed's "45 % less memory for 18 % more time" is this trade
# for one model and policy; it is a ratio to measure, not a constant to quote.
#
# ## Training with checkpointing: the same losses, under ZeRO too
#
# Dropout makes the recompute honest: if the RNG state were not restored, the masks in
# backward would differ from those in forward and the gradients would be wrong. ZeRO-3 adds a
# second difficulty — a block's parameters are freed after its forward, so the recompute must
# gather them again. The tiny GPT with dropout, 2 ranks, 2 steps, each policy next to the same
# run without checkpointing; the training ledger also reads each rank's activation peak:

# %%
dropout_work = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=4, n_head=2, batch_size=8, dropout=0.1)
trained = {}
for strategy, policy in (("zero1", "none"), ("zero1", "every"), ("zero3", "none"), ("zero3", "every"), ("zero3", "sqrt"),
                         ("zero3", "selective"), ("zero3", "torch-every"), ("zero3", "torch-selective")):
    trained[(strategy, policy)] = zerokit.train(dropout_work, strategy, world_size=2, steps=2, reference=False,
                                                checkpointing=policy).result
rows = []
for (strategy, policy), result in trained.items():
    plain = trained[(strategy, "none")]
    diff = zerokit.report.param_difference(result.ranks[0].params, plain.ranks[0].params)
    rows.append({"strategy": strategy, "checkpointing": policy, "losses": [round(v, 6) for v in result.losses],
                 "|Δparam| vs none": diff["max_abs"], "recomputed forwards (rank 0)": result.ranks[0].recomputed_forwards,
                 "activation peak B (rank 0, ledger)": None if policy.startswith("torch") else
                 result.ranks[0].peak_by_category["activations"]})  # torch's own hooks hide its tensors from the ledger
course.table(rows)

# %%
for (strategy, policy), result in trained.items():
    plain = trained[(strategy, "none")]
    assert max(abs(u - v) for u, v in zip(result.losses, plain.losses)) <= 1e-6, (strategy, policy)  # same masks
    assert zerokit.report.param_difference(result.ranks[0].params, plain.ranks[0].params)["max_abs"] <= 1e-6
    for rank in result.ranks:
        assert rank.recomputed_forwards == (0 if policy == "none" else 4 * 2)  # 4 blocks (or cores), 2 steps
assert trained[("zero3", "every")].ranks[0].peak_by_category["activations"] < \
    trained[("zero3", "none")].ranks[0].peak_by_category["activations"]

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
#   on a chain); for transformer blocks, checkpointing every block is usually best.
# - The price is one extra forward per checkpointed block (≈ 4/3 of the compute when backward
#   is 2 × forward; measured higher here, and noisy); selective recompute drops the `s²`
#   attention term at a small fraction of that cost, and a fused attention kernel already
#   avoids storing it.
# - ZeRO does not shard activations; checkpointing works under every stage with identical
#   losses (ZeRO-3 re-gathers a block for its recompute).
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
#    saves ~18–30 × its input, so `⌈n/k⌉·X + k·A` is minimal at `k = 1` for any realistic depth
#    (the chain and the GPT measured side by side above).
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
#    micro-batch's activations. Checkpointing is orthogonal and composes with every stage; under
#    ZeRO-3 the recompute needs the block's parameters again, so the block's unit is gathered a
#    second time in backward (the same losses as without checkpointing, above).
#
#    </details>
