# %% [markdown]
# # 15 · Context parallelism: the sequence cut over ranks, ring attention and Ulysses
#
# **The question.** ZeRO shards the model states, tensor and pipeline parallelism split the
# layers — yet none of them lets one sequence of a million tokens fit, because what runs out
# at long context is not the parameters but the **activations**: every layer keeps tensors
# the size of the sequence for its backward, and data parallelism cannot split a single
# sequence. Context parallelism (cp) cuts the sequence itself over cp ranks. Everything in a
# transformer block works token by token except attention, where every query needs every
# earlier key: how do the ranks get each other's keys — by passing blocks around a ring
# (ring attention) or by an all-to-all that trades tokens for heads (DeepSpeed-Ulysses) — how
# many bytes does each cost, and why does the causal mask need a zig-zag cut?
#
# **What you will see.** Activations per layer at 4 k … 1 M tokens from Korthikanti's formula
# next to a 7B model's states; the tiny GPT trained on one process and with its sequence cut
# over cp = 2, its activation bytes measured by the memory ledger next to one process's ÷ cp
# (and the few bytes each algorithm adds, counted); ring attention and Ulysses measured on the
# `cp` axis next to `theory.ring_attention_bytes` and `theory.ulysses_bytes`, both training
# like one process; the ring's transfers under its blocks' compute in the timeline; how each
# scales with cp; the causal mask's load per rank drawn for a
# contiguous and a zig-zag cut; and a panel over cp and the attention.
#
# **Time:** about 25 min to read and run (the run itself: 5 s on a 2-core laptop) ·
# **Needs:** lessons 02 (what a step keeps for backward), 07 (tensor parallelism) and 10
# (activation checkpointing), nothing else ·
# **After it you can answer:** *Why does a long context run out of memory when ZeRO-3 already
# shards everything?* · *Ring attention or Ulysses: what does each send, and where does each
# stop scaling?* · *Why is a causal sequence cut into zig-zag chunks?*

# %%
%matplotlib inline
import statistics

import matplotlib
import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

import zerokit
from zerokit import course, theory
from zerokit.context_parallel import layout
from zerokit.course.context_panel import activation_bytes
from zerokit.report import Report

matplotlib.rcParams["figure.dpi"] = course.DPI
torch.set_num_threads(1)
V, T, H, L, HEADS, B = 64, 64, 32, 2, 4, 4  # vocab, sequence, hidden, layers, heads, batch; fp32
work = zerokit.tiny_gpt(vocab=V, seq_len=T, d_model=H, n_layer=L, n_head=HEADS, batch_size=B, tie_weights=True)
print(work.description)

# %% [markdown]
# ## Why activations, not parameters, run out
#
# A LLaMA-7B-shaped model (32 layers, h = 4096, 32 heads, SwiGLU MLP of 11008, no dropout,
# bf16, a fused attention kernel that keeps only a log-sum-exp per head) trained on **one**
# sequence at a time. Its model states are 16Ψ ≈ 108 GB; ZeRO-3 over 8 GPUs leaves 13.5 GB per
# GPU, whatever the context. Its activations are Korthikanti et al.'s term-by-term count
# (`theory.transformer_layer_activation_bytes`, lesson 10) × 32 layers — linear in s with the
# scores never stored, quadratic without. Checkpointing every layer (lesson 10) keeps only
# each layer's input, 2·s·h bytes, plus one layer recomputed at a time: still linear in s.
# None of that is divided by data parallelism or ZeRO: a sequence lives on one rank.

# %%
LL, HH, AA, FFN, PSI, GPUS = 32, 4096, 32, 11008, 6.74e9, 8
GB = 1e9
scale_rows = []
for s in (4096, 32768, 131072, 1048576):
    layer = theory.transformer_layer_activation_bytes(s, 1, HH, AA, ffn=FFN, dropout=False, fused_attention=True,
                                                      mlp="swiglu")
    recompute = theory.checkpointed_activation_bytes(LL, layer, 2 * s * HH, "full")
    scale_rows.append({"context s": f"{s:,}", "activations, all layers (formula)": f"{LL * layer / GB:,.0f} GB",
                       "checkpoint every layer (formula)": f"{recompute / GB:,.1f} GB",
                       "÷ cp = 8 (formula)": f"{recompute / 8 / GB:,.1f} GB",
                       "model states, ZeRO-3 over 8 (formula)": f"{theory.paper_model_state_bytes(3, PSI, GPUS) / GB:.1f} GB"})
course.table(scale_rows)

# %% [markdown]
# At 4 k tokens the activations are 20 GB, 1.7 GB checkpointed. At 128 k they are 645 GB, and
# checkpointing every layer still keeps 54.5 GB — with the 13.5 GB of states, most of an 80 GB
# GPU before a single temporary buffer. At 1 M tokens checkpointing keeps 436 GB: no GPU holds
# it; cut over 8 ranks it is 54.5 GB each. The model states do not move. Tensor parallelism with sequence parallelism divides the activations by t
# (lesson 07), but t is bounded by the heads and by the NVLink domain. Context parallelism
# divides them by cp: each rank holds s/cp tokens of every layer, and attention fetches the
# other ranks' keys. (The last column assumes the checkpoints are cut too — they are: every
# rank keeps only its own tokens' layer inputs.)
#
# ## Measured: activations per rank ÷ cp
#
# The tiny GPT on one process, then its sequence of 64 tokens cut over cp = 2 ranks (each
# rank 32 tokens of every sequence in the batch), once with ring attention and once with
# Ulysses, 5 SGD steps each, every run checked against one process's training
# (`reference=True`). The memory ledger counts the tensors autograd saves for backward
# (saved-tensor hooks, one count per storage) and keeps their peak:

# %%
kw = dict(steps=5, optimizer="sgd", lr=0.1)
single = zerokit.train(work, "ddp", world_size=1, reference=False, **kw).result
runs = {att: zerokit.train(work, "ddp", world_size=2, parallel={"cp": 2}, cp_attention=att, **kw).result
        for att in ("ring", "ulysses")}
base = activation_bytes(single.ranks[0])
act_rows = [{"run": "one process", "activations B (ledger)": base, "one process ÷ cp (formula)": base,
             "ledger − formula": 0}]
for att, result in runs.items():
    got = activation_bytes(result.ranks[0])
    act_rows.append({"run": f"cp = 2, {att}", "activations B (ledger)": got, "one process ÷ cp (formula)": base / 2,
                     "ledger − formula": got - base / 2})
course.table(act_rows)

# %% [markdown]
# Both divide what one process keeps by cp; each then adds bytes of its own, the "ledger −
# formula" column, and the checks below count them:
#
# - **ring**: the table of every rank's positions (`s` int64 numbers, once) and 2 bytes: the
#   loss scalar is 4 bytes on every rank, not halved. Its blocks run on torch's fused kernel,
#   which returns the output tokens-first, as on one process, so the output projection reads a
#   view of it (with `kernel="explicit"`, the math of the exercise, the output is heads-first
#   and the projection's input a copy: one `b·(s/cp)·h` tensor per layer more). Counted
#   exactly in the checks below.
# - **Ulysses**: after its all-to-all a rank holds the *whole* sequence for H/cp heads, and
#   zerokit's attention on them is the unfused math form, so it keeps the softmax,
#   `b·(H/cp)·s²` numbers per layer — the quadratic term Korthikanti's formula has without a
#   fused kernel. DeepSpeed-Ulysses wraps whatever local attention it is given, on GPUs usually
#   a fused (flash) kernel, which keeps a log-sum-exp instead. zerokit's choice: the math form,
#   the simplest correct one.

# %% [checks]
copy = L * B * (T // 2) * H * 4  # one b·(s/cp)·h fp32 tensor per layer: the explicit ring's output copy
positions_table = T * 8  # every rank's positions, int64, kept once
assert act_rows[1]["activations B (ledger)"] == base / 2 + positions_table + 2, act_rows[1]  # + half the loss
softmax = L * B * (HEADS // 2) * T * T * 4  # Ulysses: H/cp heads' softmax over the whole sequence, fp32, per layer
assert 0 < act_rows[2]["ledger − formula"] - softmax < copy, act_rows[2]  # the softmax, and a few bytes more
assert [r["checkpoint every layer (formula)"] for r in scale_rows] == ["1.7 GB", "13.6 GB", "54.5 GB", "436.1 GB"]
assert scale_rows[2]["activations, all layers (formula)"] == "645 GB"  # the numbers the prose above quotes
assert act_rows[1]["activations B (ledger)"] < 0.55 * base and act_rows[2]["activations B (ledger)"] < 0.8 * base

# %% [markdown]
# **Check yourself.** Does ring attention on 2 ranks keep about half of one process's activations per rank? Predict it, then run the cell: it prints its
# verdict, and stops with an `AssertionError` if the run disagrees.

# %%
share = act_rows[1]["activations B (ledger)"] / base
print(f"ring attention, cp = 2: {share:.0%} of one process's activations per rank — "
      f"{'about half' if share < 0.55 else 'more than half'}")
assert share < 0.55

# %% [markdown]
# ## Ring attention and Ulysses: what goes over the `cp` axis
#
# **Ring attention** (Liu et al., arXiv 2310.01889). Each rank keeps its queries and passes its
# key/value block to the next rank, cp − 1 times: at every step it posts the transfer of the
# block it holds, computes its queries' scores against that block, and folds the result into a
# running output with the online softmax (each block's log-sum-exp ℓ_b and normalised output,
# merged as FlashAttention merges tiles — exercise 15 writes it). Forward: (cp − 1)·2·|K| per
# layer, |K| = `b·(s/cp)·h·e` this rank's key bytes; backward sends K and V around again and,
# one step behind them on a second ring, their gradients dK and dV, each rank adding its share
# as the block passes; the last hop brings each block's dK, dV home: (cp − 1)·4·|K| + 2·|K|.
#
# **Ulysses** (Jacobs et al., arXiv 2309.14509). An all-to-all turns "my s/cp tokens, all H heads"
# into "all s tokens, my H/cp heads" for Q, K and V; each rank runs ordinary causal attention
# on its heads, and one more all-to-all brings the output back to token order. Each all-to-all
# sends (cp − 1)/cp of a `b·(s/cp)·h` tensor: 4 of them forward, 4 backward. It needs the heads
# to divide by cp.
#
# **Predict before you run.** At cp = 2, which puts more bytes per step on the `cp` axis, ring
# attention or Ulysses — and by what factor?
#
# <details><summary>Answer</summary>
#
# Ring attention, by 2×: per layer it sends 2·|K| forward and 4·|K| + 2·|K| backward, 8·|K|;
# Ulysses sends 8 all-to-alls of ½·|K|, 4·|K|. The "cp B/step (ledger)" column below shows
# 262,144 B against 131,072 B, each equal to its theory column.
#
# </details>

# %%
byte_rows = []
for att, result in runs.items():
    rank = result.ranks[0]
    byte_rows.append({"attention": att,
                      "cp B/step (ledger)": rank.comm_bytes_by_axis["cp"]["ring_cost_bytes"],
                      "cp B/step (theory)": rank.theory_comm_bytes_by_axis["cp"],
                      "dp_cp B/step (ledger)": rank.comm_bytes_by_axis["dp_cp"]["ring_cost_bytes"],
                      "dp_cp B/step (theory)": rank.theory_comm_bytes_by_axis["dp_cp"],
                      "max |Δ param| vs one process": result.param_diff["max_abs"]})
course.table(byte_rows)

# %% [checks]
for att, result in runs.items():
    assert result.param_diff["max_abs"] <= 1e-5, (att, result.param_diff)  # fp32: the same sums in another order
    for rank in result.ranks:
        measured = {axis: row["ring_cost_bytes"] for axis, row in rank.comm_bytes_by_axis.items()}
        assert measured == rank.theory_comm_bytes_by_axis, (att, measured)  # exact: each axis = its formula
block = B * HEADS * (T // 2) * (H // HEADS) * 4  # |K|: this rank's keys, per layer
assert byte_rows[0]["cp B/step (ledger)"] == L * sum(theory.ring_attention_bytes(2, block).values()) == 8 * L * block
assert byte_rows[1]["cp B/step (ledger)"] == L * sum(theory.ulysses_bytes(2, block).values()) == 4 * L * block

# %% [markdown]
# Both train like one process, and the weights' gradients go over `dp_cp`: every cp rank saw
# different tokens, so the replicated weights' gradients are averaged over dp × cp (here
# dp = 1: the cp group), as Megatron's data-parallel group with context parallelism does — the
# same all-reduce as data parallelism's, ZeRO sharding over that group if chosen. The `cp`
# bytes above are the ledger's payloads through the ring formula; gloo's own algorithms
# differ (lesson 01, [Why gloo's times are not a ring's](01_collectives.ipynb#Why-gloo's-times-are-not-a-ring's)).
# Step times, this machine:

# %%
def step_stats(result):
    per_step = [max(r.step_times_s[i] for r in result.ranks) for i in range(1, len(result.ranks[0].step_times_s))]
    q1, _, q3 = statistics.quantiles(per_step, n=4)
    return statistics.median(per_step), (q3 - q1) / statistics.median(per_step)


(t_ring, s_ring), (t_uly, s_uly) = step_stats(runs["ring"]), step_stats(runs["ulysses"])
course.show(course.speed_sentence(
    "ring attention", t_ring, "Ulysses", t_uly, spread=max(s_ring, s_uly),
    elsewhere="Ranks sharing a CPU's cores say little about either: on GPUs the ring's transfers overlap "
              "with the attention on the block already held where that compute takes longer than the transfer, "
              "while Ulysses' all-to-alls sit between its steps and are bounded by the slowest link of the group."))

# %% [markdown]
# ### The ring's overlap, in the timeline
#
# "The transfer runs while the block is computed" is a claim about order, and the timeline
# can show it. zerokit's ring posts each send (`batch_isend_irecv`) *before* the block's
# attention and waits for it *after*; in backward the dK, dV of a block follow one step behind
# on a second ring, so their transfer also runs under the next block's compute — all but the
# last hop home, which has nothing left to hide behind. Below, one rank of a ring run at
# cp = 2 with `keep_records=True`: each send from launch to the end of its wait (from the
# communication ledger), the part it still waited in red, under the blocks' compute spans
# (recorded inside ring attention by `zerokit.runtime.timeline.block`). The table sums them
# per rank with `zerokit.runtime.timeline.overlap`: how long the transfers were in flight, how
# much block compute ran inside those windows, and how long the rank waited.

# %%
traced = zerokit.train(work, "ddp", world_size=2, parallel={"cp": 2}, cp_attention="ring", steps=2,
                       optimizer="sgd", lr=0.1, keep_records=True, reference=False).result
overlap_rows = course.ring_overlap_rows(traced)
course.table(overlap_rows)

# %%
course.ring_overlap_figure(traced, rank=0, step=1)

# %%
waited = sum(r["waited ms (measured)"] for r in overlap_rows)
covered = sum(r["block compute inside ms (measured)"] for r in overlap_rows)
course.show(f"On this run the ranks waited {waited:.1f} ms in all for the ring's transfers, while "
            f"{covered:.1f} ms of block compute ran inside their windows: "
            + ("more compute covered the transfers than the ranks still waited for them."
               if covered > waited else
               "the ranks waited longer than the blocks took — where the ranks share CPU cores, the transfers and "
               "the compute compete for them, so there is little to overlap with; on GPUs the sends are "
               "NCCL kernels on a stream of their own, taking a few SMs and some memory bandwidth while the other "
               "SMs compute: overlap lowers their cost, it does not remove it.")
            + " Whether the wait shrinks to nothing depends on a block's attention taking longer than a hop.")

# %% [checks]
from zerokit.runtime import timeline  # noqa: E402

for rank in traced.ranks:
    line = timeline.rank_timeline(rank)
    blocks = [m for m in line["modules"] if m["kind"] == "block"]
    for c in line["comm"]:
        if c["tag"].startswith("ring attention") and c["phase"] != "setup":
            covered_by = [b for b in blocks if c["start"] <= b["start"] and b["end"] <= c["blocked_start"]]
            assert bool(covered_by) == (c["tag"] != "ring attention dkv 1"), c  # all but the last hop home

# %% [markdown]
# ### How each scales with cp
#
# Hold the sequence fixed and grow cp: a rank's block |K| = K_s / cp shrinks (K_s: the whole
# sequence's key bytes per layer). The ring sends (6·cp − 4)·|K| = (6 − 4/cp)·K_s per layer per
# rank — 4·K_s at cp = 2, rising towards 6·K_s, never falling — while Ulysses sends
# 8·(cp − 1)/cp·|K|, which falls as 1/cp. Per layer, per rank, from the formulas, in units of K_s:

# %%
scaling = []
for cp in (2, 4, 8, 16, 32):
    ring_total = sum(theory.ring_attention_bytes(cp, 1_000_000 // cp).values()) / 1_000_000
    uly_total = sum(theory.ulysses_bytes(cp, 1_000_000 // cp).values()) / 1_000_000
    scaling.append({"cp": cp, "ring (theory), × K_s": round(ring_total, 3), "Ulysses (theory), × K_s": round(uly_total, 3),
                    "ring sends (fwd + bwd)": sum(theory.cp_attention_calls("ring", cp).values()),
                    "Ulysses needs heads": f"a multiple of {cp}"})
course.table(scaling)

# %% [markdown]
# Bytes alone favour Ulysses, more so as cp grows. What the ring buys is elsewhere: it talks
# only to its two neighbours, in messages that can be posted before each block's attention and
# run while it computes (where that compute takes longer than a hop, the ring's bytes cost no
# step time); it works for any number of heads; and its transfers are point-to-point, which
# crosses nodes well. Ulysses needs cp to divide the heads — with grouped-query attention, the
# key/value heads (8 for LLaMA-3-70B) — and its all-to-all involves every rank of the group at
# once. Production systems mix them: Megatron-LM's context parallelism (through Transformer
# Engine) defaults to a ring of point-to-point sends with the zig-zag cut below, and offers
# all-gather, all-to-all and mixed variants; DeepSpeed ships Ulysses; torch's `context_parallel` rotates K/V by
# all-gather or all-to-all; "unified" sequence parallelism (USP) runs Ulysses inside a node
# and the ring across nodes.
#
# ## The causal mask's load, and the zig-zag cut
#
# Under a causal mask the query at position t attends to t + 1 keys. Cut the sequence into cp
# contiguous pieces and the last rank's queries see every key while the first rank's see only
# their own: at each ring step everyone waits for the slowest. The zig-zag (head-tail) cut of
# Megatron-LM and ring-flash-attention splits the sequence into 2·cp chunks and gives rank r
# chunks r and 2·cp − 1 − r, one early and one late (`layout.positions`). The (query, key) pairs
# each rank computes, `layout.causal_pairs`, for cp = 4 and a 64-token sequence:

# %%
CP, S = 4, 64
colors = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
pairs = {"contiguous": [layout.causal_pairs(r, CP, S, zigzag=False) for r in range(CP)],
         "zig-zag": [layout.causal_pairs(r, CP, S) for r in range(CP)]}
owner = {"contiguous": np.repeat(np.arange(CP), S // CP),
         "zig-zag": np.empty(S, dtype=int)}
for r in range(CP):
    owner["zig-zag"][layout.positions(r, CP, S).numpy()] = r
fig, axes = course.new_figure(12.0, 4.2, ncols=3, width_ratios=[1, 1, 1.2])
for ax, name in zip(axes[:2], ("contiguous", "zig-zag")):
    grid = np.full((S, S), np.nan)
    for q in range(S):
        grid[q, :q + 1] = owner[name][q]
    ax.imshow(grid, cmap=ListedColormap(colors), vmin=-0.5, vmax=CP - 0.5, interpolation="nearest")
    ax.set_title(f"{name} cut: query rows by rank", fontsize=9)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
width = 0.38
right = axes[2]
for i, (name, hatch) in enumerate((("contiguous", ""), ("zig-zag", "///"))):
    right.bar([r + (i - 0.5) * width for r in range(CP)], pairs[name], width, color=colors, hatch=hatch,
              edgecolor="black", linewidth=0.6)
right.axhline(S * (S + 1) / 2 / CP, color="black", ls=":", lw=1)
right.set_xticks(range(CP), [f"rank {r}" for r in range(CP)])
right.set_ylabel("(query, key) pairs under the mask")
right.set_title("work per rank: causal_pairs", fontsize=9)
handles = [Patch(facecolor=c, edgecolor="black", label=f"rank {r}") for r, c in enumerate(colors)]
handles += [Patch(facecolor="white", edgecolor="black", label="contiguous (plain bars)"),
            Patch(facecolor="white", edgecolor="black", hatch="///", label="zig-zag (hatched bars)"),
            matplotlib.lines.Line2D([], [], color="black", ls=":", label="an equal share, s(s+1)/2/cp")]
fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.0))
fig.tight_layout(rect=(0, 0.13, 1, 0.97))
fig

# %% [checks]
assert len(set(pairs["zig-zag"])) == 1 and sum(pairs["zig-zag"]) == sum(pairs["contiguous"]) == S * (S + 1) // 2
assert pairs["contiguous"][-1] / pairs["contiguous"][0] > 2 * CP - 2  # ≈ 2cp − 1: the last rank carries the most
assert sorted(np.unique(owner["zig-zag"]).tolist()) == list(range(CP))

# %% [markdown]
# With the contiguous cut rank 3 computes about 2·cp − 1 = 7 times rank 0's pairs, so the ring
# runs at rank 3's pace; with the zig-zag cut every rank computes the same number (the dotted
# line). zerokit's ring, like torch's and the rings built on FlashAttention, computes only what
# the mask shows: the diagonal block causal, and of the other blocks the part any query sees —
# under the zig-zag cut half of each, under the contiguous cut all of an earlier rank's block and
# none of a later one's. So the cut decides each rank's work, and the ring runs at the busiest
# rank's pace.
#
# ## The panel
#
# cp and the attention algorithm: each change trains one process and the sequence cut over cp
# ranks for a step, and draws each rank's activations (ledger, with one process's ÷ cp as a
# tick) and its bytes on `cp` and `dp_cp` (ledger next to theory). Try Ulysses at cp = 4 (4
# heads: it fits) and watch its softmax remainder; the ring's `cp` bytes grow a little with
# cp (4 → 5 × K_s), Ulysses' fall. The panel starts from the runs above.

# %%
course.ContextPanel(work, cp=2, attention="ring", report=Report([single, runs["ring"]]))

# %% [markdown]
# ## Summary
#
# - At long context the **activations** outgrow everything: linear in s with a fused kernel
#   (quadratic without), multiplied by the layers, and neither data parallelism nor ZeRO
#   divides them — a sequence lives on one rank. Checkpointing leaves L·2·s·h, still linear.
# - **Context parallelism** cuts the sequence over cp ranks; everything but attention is token
#   by token. Measured here: activations per rank = one process's ÷ cp, plus a few counted
#   bytes (the ring's positions table; Ulysses' softmax of its heads over the whole sequence).
# - **Ring attention** passes K/V blocks to the neighbour, cp − 1 hops, merging with the
#   online softmax: (6·cp − 4)·|K| per layer per rank, 4 to 6 K_s whatever cp; each send is
#   posted before a block's attention and waited after it (the timeline shows every hop but the
#   last one home inside a block's window); any head count. **Ulysses** regroups tokens ↔ heads with 4 + 4
#   all-to-alls: 8·(cp − 1)/cp·|K|, falling with cp, but cp must divide the (KV) heads. Both
#   equal one process; the ledger's bytes equal `theory.ring_attention_bytes` / `ulysses_bytes`.
# - The weights stay replicated; their gradients are reduced over **dp × cp**.
# - A causal mask loads a contiguous cut unevenly (last rank ≈ 2·cp − 1 × the first); the
#   **zig-zag** cut (chunks r and 2·cp − 1 − r) balances it.
#
# ## Interview questions
#
# 1. *You train a 7B model with ZeRO-3 on 64 GPUs and it runs out of memory at 128 k tokens. Why, and what do you add?*
#
#    <details><summary>Answer</summary>
#
#    ZeRO-3 divides the model states (16Ψ/N, about 1.7 GB per GPU here) but not the activations,
#    which belong to the sequence: about 38·s·h bytes per layer for LLaMA-7B's shape in bf16
#    with a fused kernel, 645 GB for 32 layers at 128 k, and still 54.5 GB with every layer
#    checkpointed. Data parallelism cannot
#    split one sequence. Add context parallelism (the sequence over cp ranks: activations ÷ cp)
#    on top of checkpointing, and tensor parallelism with sequence parallelism inside a node;
#    keep ZeRO over dp × cp for the states.
#
#    </details>
#
# 2. *Ring attention or Ulysses — what does each send, and when would you pick which?*
#
#    <details><summary>Answer</summary>
#
#    Ring: K and V blocks to the next rank, cp − 1 hops forward (and K, V, dK, dV back round in
#    backward): 4 to 6 K_s per layer per rank whatever cp, but only neighbour-to-neighbour and
#    posted ahead of each block's attention, so it can run during the compute; any head count;
#    crosses nodes well. Ulysses: 4 all-to-alls forward and 4 backward of (cp − 1)/cp of a
#    rank's tensor — fewer bytes, falling with cp — but cp must divide the (KV) heads and the
#    all-to-all spans the group. Inside an NVLink node with heads to spare, Ulysses; across
#    nodes or beyond the heads, the ring; at scale both (USP: Ulysses in the node, ring across).
#
#    </details>
#
# 3. *Why is a causal sequence cut into zig-zag chunks, and what must the attention mask then compare?*
#
#    <details><summary>Answer</summary>
#
#    Under a causal mask later queries attend to more keys, so with contiguous pieces the last
#    rank does ~2·cp − 1 times the first's work and every ring step waits for it. Giving rank r
#    chunks r and 2·cp − 1 − r (one early, one late) equalises the (query, key) pairs. The
#    mask must then compare **global positions** (`layout.positions`), not indices within a
#    rank's block — and the position embedding must read them too.
#
#    </details>

# %% [markdown]
# **Exercise:** [exercises/15_ring_attention.ipynb](../exercises/15_ring_attention.ipynb) — ring attention's
# online softmax on 2 ranks, graded by `zerokit grade 15` · **Next:** [lesson 16 — mixture of
# experts](16_mixture_of_experts.ipynb)
