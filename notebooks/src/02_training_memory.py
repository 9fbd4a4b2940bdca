# %% [markdown]
# # 02 · Anatomy of training memory
#
# **The question.** The seed's next interview question ([docs/seed.md](../docs/seed.md)): *"What
# are the main sources of GPU memory use in training a large model?"*
# (“大模型训练中显存占用的主要来源有哪些？”) — where does the memory of training go? How many bytes
# per parameter does Adam cost, and does bf16 mixed precision halve it?
#
# **What you will see.** A tiny GPT trained with data parallelism on 2 ranks, in fp32 and in
# bf16 mixed precision; the **memory ledger** of each rank — parameters, gradients,
# optimizer states, activations, read from tensor storages — next to `zerokit.theory`'s
# value, to the byte: 16 bytes per parameter either way, split differently. Then the
# activations, which grow with the batch, against the Korthikanti et al. estimate.
#
# **Time:** about 20 min to read and run (the run itself: 5 s on a 2-core laptop) ·
# **Needs:** lesson 00 (ranks and `zerokit.train`), nothing else ·
# **After it you can answer:** *Where does the memory of training go?* · *How many bytes per
# parameter does Adam cost, in fp32 and in bf16 mixed precision?* · *Why doesn't mixed precision
# halve it, and why do DeepSpeed's estimators say more?* · *What sets the activations, and what
# does flash attention remove?*

# %%
%matplotlib inline
import matplotlib
import matplotlib.pyplot as plt

import zerokit
from zerokit import course, plot, theory
from zerokit.course.saved_tensors import bytes_by_module, saved_tensors

matplotlib.rcParams["figure.dpi"] = course.DPI
SIZE = dict(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=8)
work = zerokit.tiny_gpt(**SIZE)
psi = work.param_count()
tensors = len(list(work.build_model().parameters()))
print(f"{work.description}\nΨ = {psi:,} parameters in {tensors} tensors")

# %% [markdown]
# ## Model states: what every rank of DDP holds
#
# The ZeRO paper (§3.1) calls them **model states**: the parameters, their gradients, and
# the optimizer's states. With Adam, in plain **fp32**, a parameter costs 4 bytes, its
# gradient 4, and Adam's two moments m and v 8: **16Ψ**. In **bf16 mixed precision** the
# model computes in bf16 — parameters 2 bytes, gradients 2 — but the optimizer keeps an fp32
# master copy of every parameter plus m and v: 12 bytes, K = 12 in the paper. Also **16Ψ**.
#
# torch's Adam keeps one more thing per parameter *tensor*: a 4-byte `step` counter. The
# ledger counts it under "optimizer", and the theory adds it, stated separately.
#
# Train 2 steps on 2 ranks, in each precision; the ledger is read after the last step.
#
# **Predict before you run.** Mixed precision stores the parameters and gradients in 2 bytes
# instead of 4. How many bytes of model states per parameter will the ledger find in
# bf16-mixed — 8, 12 or 16 — against fp32's 16?
#
# <details><summary>Answer</summary>
#
# 16, the same as fp32: the "bytes per parameter" column below reads 2 + 2 + 12 in bf16-mixed
# against 4 + 4 + 8 in fp32. The optimizer's fp32 master copy and its fp32 m and v take what
# the 16-bit copies gave back (the last digits are Adam's 4-byte step counters, one per tensor).
#
# </details>

# %%
runs = {precision: zerokit.train(work, "ddp", world_size=2, steps=2, precision=precision)
        for precision in theory.PRECISIONS}
rows = []
for precision, report in runs.items():
    expected = theory.model_state_bytes(0, psi, 2, precision, "adamw", optimizer_tensors=tensors)
    for category in ("params", "grads", "optimizer"):
        measured = report.result.ranks[0].model_state_bytes[category]
        rows.append({"precision": precision, "category": category, "measured B (rank 0)": measured,
                     "theory B": expected.as_dict()[category], "bytes per parameter": f"{measured / psi:.3f}"})
course.table(rows)

# %% [checks]
for precision, report in runs.items():
    expected = theory.model_state_bytes(0, psi, 2, precision, "adamw", optimizer_tensors=tensors)
    for rank in report.result.ranks:
        assert rank.model_state_bytes == {"params": expected.params, "grads": expected.grads,
                                          "optimizer": expected.optimizer}
        # without Adam's step scalars: 16 bytes per parameter, in both precisions
        assert sum(rank.model_state_bytes.values()) - expected.step_scalars == 16 * psi
    assert report.result.max_abs_param_diff is not None
assert runs["bf16-mixed"].result.ranks[0].model_state_bytes["params"] == theory.param_bytes_per_element("bf16-mixed") * psi
assert (sum(runs["bf16-mixed"].result.ranks[0].model_state_bytes.values()) - 4 * tensors
        == theory.paper_model_state_bytes(0, psi, 2))  # the paper's (2 + 2 + K)Ψ with K = 12

# %% [markdown]
# **Check yourself.** How many bytes of model states does a parameter cost under Adam, in fp32 and in bf16-mixed? Predict it, then run the cell: it prints its
# verdict, and stops with an `AssertionError` if the run disagrees.

# %%
for precision, report in runs.items():
    scalars = theory.model_state_bytes(0, psi, 2, precision, "adamw", optimizer_tensors=tensors).step_scalars
    per_param = (sum(report.result.ranks[0].model_state_bytes.values()) - scalars) / psi
    print(f"{precision}: {per_param:g} bytes per parameter (Adam's step counters aside) — "
          f"{'16, as predicted' if per_param == 16 else 'not 16'}")
    assert per_param == 16

# %% [markdown]
# Mixed precision does **not** halve model-state memory: it moves 4 bytes per parameter
# from the 16-bit copies into the fp32 master. What it halves is the parameters and
# gradients the model computes with — and, below, the activations.

# %%
fig, axes = plt.subplots(1, 2, figsize=(8, 3.4), sharey=True, width_ratios=[1, 1.6])
for ax, (precision, report) in zip(axes, runs.items()):
    plot.memory_bars(report, ax=ax, legend=precision == "bf16-mixed")  # one key, right of the second panel
    ax.set_title(f"DDP, {precision}", fontsize=10)
fig.tight_layout()

# %% [markdown]
# DeepSpeed's own memory estimators count more for mixed precision, because its optimizer keeps
# an **fp32 copy of the gradients** (4 bytes) where the ledger above holds bf16 ones (2 bytes).
# Its ZeRO-3 estimator (`estimate_zero3_model_states_mem_needs`) charges **18** bytes per
# parameter, divided by the GPUs, plus 4 × the largest layer for what is gathered; its ZeRO-2
# one charges `2Ψ + 18Ψ/N`, whose 18 its code spells out as 16-bit gradients 2 + fp32 gradients 4
# + fp32 parameters 4 + m and v 8 — both gradient copies, **20** bytes per parameter on one GPU
# (`theory.deepspeed_zero2_estimate`, `theory.deepspeed_zero3_estimate`, their formulas as
# DeepSpeed 0.19.8 computes them). Same model, a different gradient dtype — know which one an
# estimate assumes.

# %%
largest_layer = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in work.build_model().modules())
zero3_host, zero3_gpu, gathered = theory.deepspeed_zero3_estimate(psi, largest_layer)  # one GPU
estimated = {"zerokit ledger, bf16-mixed, Adam (bf16 gradients)":
             (sum(runs["bf16-mixed"].result.ranks[0].model_state_bytes.values()) - 4 * tensors) / psi,
             "DeepSpeed's ZeRO-3 estimator, less its 4 × largest layer": (zero3_gpu - gathered) / psi,
             "DeepSpeed's ZeRO-2 estimator, one GPU (2Ψ + 18Ψ/N)": theory.deepspeed_zero2_estimate(psi)[1] / psi}
course.table([{"counted by": who, "bytes per parameter": round(per, 3)} for who, per in estimated.items()])

# %% [checks]
assert list(estimated.values()) == [16, theory.deepspeed_estimator_bytes_per_param(), 20]  # 16; 18; 2 + 18 at N = 1

# %% [markdown]
# The same formula at the scale of real models — what plain data parallelism asks of every
# GPU, before a single activation:

# %%
course.table([{"model": name, "Ψ": size, "DDP model states per GPU (GB)":
               theory.paper_model_state_bytes(0, size, 8) / 1e9}
              for name, size in {"GPT-2 1.5B": 1_500_000_000, "LLaMA 7B": 7_000_000_000}.items()])

# %% [markdown]
# ## Activations
#
# Model states are fixed by Ψ. **Activations** — the tensors autograd saves in forward to
# compute the gradients in backward — are set by the batch: they grow with batch × sequence
# × width × layers, and live from forward until backward has used them. The ledger sees
# them through saved-tensor hooks (each storage once; parameters saved for backward are
# already counted as parameters). The peak of a DDP step is right after forward:

# %%
rows = []
for precision, report in runs.items():
    rank0 = report.result.ranks[0]
    rows.append({"precision": precision, "peak at": rank0.peak_where, "peak B (measured)": rank0.peak_bytes,
                 "model states B": sum(rank0.peak_breakdown[c] for c in ("params", "grads", "optimizer")),
                 "activations B": rank0.peak_breakdown["activations"]})
course.table(rows)

# %%
course.peak_bars(zerokit.Report([runs["fp32"].result, runs["bf16-mixed"].result])).figure

# %% [markdown]
# **The ledger next to the allocator.** The ledger names the bytes it finds in the tensors it
# is told about. On a GPU, torch's caching allocator counts every byte handed out, named or
# not: `torch.cuda.max_memory_allocated`. The two differ by what the ledger does not hold —
# the logits' gradient while the loss's backward runs, the fp32 copies of bf16 gradients in the
# optimizer step, cuBLAS's workspace — which `theory.step_transients` sizes. On CPU ranks there
# is no allocator to ask, and the cell says so.

# %%
rows = []
for precision, report in runs.items():
    rank0 = report.result.ranks[0]
    if rank0.cuda_peak_bytes is None:
        continue
    # each of the 2 ranks computes half the batch
    transients = theory.step_transients(SIZE["batch_size"] // 2, SIZE["seq_len"], SIZE["vocab"], psi, precision)
    rows.append({"precision": precision, "ledger peak B": rank0.peak_bytes,
                 "torch max allocated B": rank0.cuda_peak_bytes,
                 "largest gap B (measured)": rank0.allocator_gap_max, "where": rank0.allocator_gap_where,
                 "transients B (theory)": sum(transients.values())})
if rows:
    display(course.table(rows))
else:
    print("these ranks ran on the CPU (gloo): no CUDA allocator to compare; on GPU ranks this cell shows "
          "torch.cuda.max_memory_allocated next to the ledger")

# %% [markdown]
# ## Which tensor is which term
#
# Korthikanti et al. (§4) estimate a transformer layer's activations in 16-bit as
# `s·b·h·(34 + 5·a·s/h)` bytes (sequence s, micro-batch b, hidden h, heads a). The `34`
# counts, per token, the inputs of the two LayerNorms, of QKV, of the output projection and
# of the two MLP linears, Q, K, V, the GeLU's input — and two dropout masks. The `5·a·s/h`
# is attention's s × s per head: the softmax output (2 bytes), its dropout mask (1) and the
# dropped-out probabilities (2). Our tiny GPT matches neither assumption: it has **no
# dropout**, and torch's `scaled_dot_product_attention` runs a **fused** kernel that never
# stores the s × s matrix (it keeps one fp32 log-sum-exp per head and row, and recomputes the
# probabilities in backward). A whole-model total can still land near the estimate — the
# fp32 logits the loss keeps, `4·s·b·v`, make up for what is missing — so look at the tensors
# themselves. `zerokit.course.saved_tensors` runs one forward and the loss under
# saved-tensor hooks and records every storage autograd saves (parameters left out, each
# storage once, as the ledger counts them), with the module that saved it. The first
# block, per-rank batch 4, bf16:

# %%
small = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=4)
TERMS = {"ln1": "LayerNorm input (2sbh) + mean, rstd", "attn.qkv": "QKV input (2sbh)",
         "attn": "Q, K, V (6sbh) and attention output (2sbh); fused: fp32 log-sum-exp, no s × s",
         "attn.proj": "output projection input (2sbh)", "ln2": "LayerNorm input (2sbh) + mean, rstd",
         "mlp.fc": "MLP input (2sbh)", "mlp": "GeLU input (8sbh)", "mlp.proj": "2nd linear's input (8sbh)"}
MATH_ATTENTION = "Q, K, V and the s × s probabilities (here in fp32: the 5·a·s² term, without dropout)"
saved = {how: saved_tensors(small, "bf16-mixed", attention=how) for how in ("fused", "math")}
course.table([{"attention": how, "module": r["module"], "shape": str(r["shape"]), "dtype": r["dtype"],
               "bytes (measured)": r["bytes"], "Korthikanti term": MATH_ATTENTION if (how, r["module"]) == (
                   "math", "blocks.0.attn") else TERMS[r["module"].removeprefix("blocks.0.")]}
              for how in saved for r in saved[how] if r["module"].startswith("blocks.0.")])

# %% [markdown]
# Every row of the fused run is one of the `34`'s terms — minus the dropout masks, which this
# model does not have — and nothing grows with s × s. The math path (`attention="math"`,
# torch's unfused reference, the way attention was computed when the paper was written)
# stores the probabilities, `(b, a, s, s)`; on this CPU it computes bf16 attention in fp32,
# so they take 4 bytes each, and Q, K, V are kept as fp32 copies too.
#
# Now sweep the sequence length at a fixed batch: per token, the terms of the `34` stay
# flat, the s × s term grows with s. The formula is `theory.transformer_layer_activation_bytes`
# term by term, told what this model is (no dropout; fused attention or not):

# %%
h, a, local = 32, 2, 4
rows = []
for s_len in (16, 32, 64, 128):
    model_s = zerokit.tiny_gpt(vocab=64, seq_len=s_len, d_model=h, n_layer=2, n_head=a, batch_size=local)
    layer = {how: sum(bytes_by_module(saved_tensors(model_s, attention=how), "blocks.0.").values())
             for how in ("fused", "math")}
    fused_formula = theory.transformer_layer_activation_bytes(s_len, local, h, a, dropout=False, fused_attention=True)
    tokens = s_len * local
    rows.append({"s": s_len, "fused B/token (measured)": layer["fused"] / tokens,
                 "formula, fused, no dropout B/token": fused_formula / tokens,
                 "math B/token (measured)": layer["math"] / tokens,
                 "math − fused B/token (measured)": (layer["math"] - layer["fused"]) / tokens,
                 "Korthikanti 34 + 5as/h B/token": theory.activation_bytes_per_layer(s_len, local, h, a) / tokens})
course.table(rows, title="one transformer layer, per-rank batch 4, bf16 (per token: bytes ÷ s·b)")

# %% [checks]
for row in rows:
    assert abs(row["fused B/token (measured)"] / row["formula, fused, no dropout B/token"] - 1) < 0.01  # + LN stats
    assert row["fused B/token (measured)"] == rows[0]["fused B/token (measured)"]  # fused: linear in s, flat per token
for r1, r2 in zip(rows, rows[1:]):  # math path: the extra per token grows by a·4 bytes per unit of s — the s² term
    slope = (r2["math − fused B/token (measured)"] - r1["math − fused B/token (measured)"]) / (r2["s"] - r1["s"])
    assert slope == a * theory.param_bytes_per_element("fp32")  # a heads × s probabilities × fp32

# %%
fig, ax = course.new_figure(9.5, 3.6)
ss = [row["s"] for row in rows]
ax.plot(ss, [row["math B/token (measured)"] for row in rows], "o-", color="C3", label="math attention (measured)")
ax.plot(ss, [row["fused B/token (measured)"] for row in rows], "o-", color="C0", label="fused attention (measured)")
ax.plot(ss, [row["formula, fused, no dropout B/token"] for row in rows], "--", color="C0",
        label="formula: fused, no dropout")
ax.plot(ss, [row["Korthikanti 34 + 5as/h B/token"] for row in rows], "--", color="#777777",
        label="Korthikanti: 34 + 5as/h (dropout, unfused)")
ax.set_xscale("log", base=2)
ax.set_xticks(ss, [str(x) for x in ss])
ax.set_xlabel("sequence length s")
ax.set_ylabel("bytes per token, one layer")
ax.set_ylim(0, 1.05 * max(row["math B/token (measured)"] for row in rows))
ax.set_title("what one layer saves per token:\nflat when fused, growing with s otherwise")
course.figures.legend_outside(ax)
fig.tight_layout()
fig

# %% [markdown]
# Fused attention removes the `5·a·s²·b` term entirely — that is what flash attention is
# for, on GPUs as here — and leaves the linear terms, which the formula predicts to 1 %
# (the remainder is the LayerNorms' mean and rstd, 2 values per token each, which the paper
# doesn't count). At s = 16 and h = 32 the s² term is small, and the fp32 logits offset the
# missing dropout masks, which is why a whole-model total can match `34 + 5as/h` by
# coincidence; at s = 128 the estimate is more than twice what a fused layer stores.
#
# In training, the ledger counts the same saved tensors for the whole model. Double the batch,
# double the activations; and the term-by-term formula — layers, plus the head's input, the
# final norm's and the fp32 logits (`theory.output_activation_bytes`) — matches the measured
# peak activations:

# %%
batches = [4, 8, 16]
sweep = {b: zerokit.train(zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=b),
                          "ddp", world_size=2, steps=2, precision="bf16-mixed", reference=False)
         for b in batches}
rows = []
for b, report in sweep.items():
    local = b // 2
    formula = (2 * theory.transformer_layer_activation_bytes(16, local, 32, 2, dropout=False, fused_attention=True)
               + theory.output_activation_bytes(16, local, 32, 64))
    measured = report.result.ranks[0].peak_breakdown["activations"]
    rows.append({"global batch": b, "per-rank batch": local, "activations B (measured)": measured,
                 "formula: 2 fused layers + output B": formula, "measured / formula": round(measured / formula, 3),
                 "2 × Korthikanti B": 2 * theory.activation_bytes_per_layer(s=16, b=local, h=32, a=2)})
course.table(rows)

# %% [checks]
for row in rows:
    assert abs(row["measured / formula"] - 1) < 0.05
measured = [row["activations B (measured)"] for row in rows]
for small_b, large_b in zip(measured, measured[1:]):
    assert 1.9 < large_b / small_b < 2.1  # twice the batch, twice the activations
for precision in theory.PRECISIONS:  # model states don't depend on the batch
    assert runs[precision].result.ranks[0].model_state_bytes == runs[precision].result.ranks[1].model_state_bytes
assert sweep[8].result.ranks[0].model_state_bytes == runs["bf16-mixed"].result.ranks[0].model_state_bytes

# %% [markdown]
# ## Try it
#
# Choose the world size and the precision; the panel trains zerokit's DDP and torch's own
# DDP side by side and draws each rank's memory. However many ranks you add, every rank of
# data parallelism holds all 16Ψ: the redundancy ZeRO removes, from lesson 04 on. Switch
# "show" to *peak* to see the activations on top.

# %%
course.MemoryPanel(work, strategies=("ddp", "torch-ddp"), world_sizes=(1, 2, 4), steps=2)

# %% [markdown]
# ## Summary
#
# - Model states with Adam cost **16 bytes per parameter** on every data-parallel rank: 4 + 4 + 8
#   in fp32, 2 + 2 + 12 in bf16 mixed precision (fp32 master + m + v) — plus 4 bytes per
#   tensor for Adam's step counters. Measured to the byte above.
# - Mixed precision saves on compute copies and activations, not on optimizer states.
# - Activations scale with the batch (measured: ×2 per doubling) and peak after forward.
#   `s·b·h·(34 + 5as/h)` assumes dropout and an unfused attention that stores the s × s
#   probabilities; with fused attention (flash attention, and torch's default here) the
#   `5·a·s²·b` term is gone — measured tensor by tensor and across sequence lengths above.
#
# ## Interview questions
#
# 1. *A 7 B model, Adam, bf16 mixed precision, plain DDP: how much memory per GPU before
#    activations?*
#
#    <details><summary>Answer</summary>
#
#    16 bytes per parameter (the table above): more than an 80 GB GPU holds, whatever the number
#    of GPUs.
#
#    </details>
#
# 2. *Why doesn't mixed precision halve the memory of training?*
#
#    <details><summary>Answer</summary>
#
#    The optimizer keeps an fp32 master copy and fp32 m and v, 12 of the 16 bytes (the table
#    above).
#
#    </details>
#
# 3. *DeepSpeed's estimator says 18 bytes per parameter, you measured 16 — who is wrong?*
#
#    <details><summary>Answer</summary>
#
#    Neither: it assumes fp32 gradients (4 bytes, where bf16 ones take 2) — 18 in its ZeRO-3
#    estimator; its ZeRO-2 one keeps the 16-bit gradients as well, 20 bytes per parameter on one
#    GPU (the estimators' table above).
#
#    </details>

# %% [markdown]
# **Exercise:** [exercises/09_predict.ipynb](../exercises/09_predict.ipynb) asks for a rank's
# model-state bytes like the ones above, and two more numbers that need ZeRO-1 and ZeRO-3 (lessons 04,
# 06) and the 1F1B bubble (08): take it after lesson 11, graded by `zerokit grade 09` against the
# formula and a measured run · **Next:** [lesson 03 — data parallelism: naive →
# bucketed → overlapped](03_data_parallel.ipynb)
