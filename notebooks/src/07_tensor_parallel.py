# %% [markdown]
# # 07 · Tensor parallelism: f and g, column → row, and 4 all-reduces per layer
#
# **The question.** ZeRO shards what a rank *stores*; every rank still computes every layer
# on whole weight matrices. Megatron-LM (arXiv 1909.08053 §3) splits the matrices
# themselves: each rank multiplies by a slice. How can a layer be cut across ranks so that
# its output is *exactly* the unsharded layer's, what must the ranks exchange to make it
# so, and how many bytes is that per layer? Megatron-LM's paper gives the four all-reduces
# per layer; the count `8·b·s·h·(t−1)/t` per device per micro-batch is Narayanan et al.'s
# (arXiv 2104.04473 §3.3, the paper of the interleaved schedule), and Korthikanti et al.
# (arXiv 2205.05198 §4.2.2) split each all-reduce into the reduce-scatter and all-gather of
# sequence parallelism at the same bytes.
#
# **What you will see.** Megatron's conjugate operators f and g on 2 ranks, a column-parallel
# then row-parallel MLP whose output equals the unsharded one; the tiny GPT trained under
# `tp` with its 4 all-reduces per layer counted in the ledger next to
# `theory.tp_elements_sent_per_layer` and `theory.tp_comm_bytes_per_step`; sequence
# parallelism replacing them by all-gathers and reduce-scatters of the same bytes; torch's
# own tensor parallelism side by side; and each rank's model states next to
# `theory.tp_model_state_bytes`.
#
# **Time:** about 25 min to read and run (the run itself: 6 s on a 2-core laptop) ·
# **Needs:** lessons 01 (all-reduce, reduce-scatter, all-gather on a ring) and 02 (model states
# and activations), nothing else ·
# **After it you can answer:** *Why column-parallel first and row-parallel second?* · *How many
# bytes does tensor parallelism send per layer?* · *What does sequence parallelism change?* ·
# *What does a rank hold under tensor parallelism, and why does t stay within a node?*

# %%
%matplotlib inline
import matplotlib
import numpy as np
import torch
import torch.nn as nn

import zerokit
from zerokit import course, theory
from zerokit import tensor_parallel as tp
from zerokit.cli import compare
from zerokit.runtime import comm

matplotlib.rcParams["figure.dpi"] = course.DPI
B, S, H, L, T = 8, 16, 32, 2, 2   # batch, sequence, hidden, layers, tensor-parallel degree
work = zerokit.tiny_gpt(vocab=64, seq_len=S, d_model=H, n_layer=L, n_head=4, batch_size=B)
print(f"{work.description}\nΨ = {work.param_count():,} parameters; t = {T}")

# %% [markdown]
# ## f and g: one MLP on two ranks
#
# An MLP is `Y = GeLU(X·A)`, `Z = Y·B`. Split **A by columns** (`A = [A₁ A₂]`): rank r computes
# `Y_r = GeLU(X·A_r)` on its own, with no exchange — GeLU acts elementwise, so each rank's
# columns stay correct. Split **B by rows** (`B = [B₁; B₂]`): rank r computes the partial sum
# `Y_r·B_r`, and the ranks **add** their partials: `Z = Y₁B₁ + Y₂B₂`. Two operators carry it
# (Megatron §3, Fig. 3):
#
# - **f** before the column layer: identity in forward, **all-reduce** of the input's
#   gradient in backward (each rank's `dX` covers only its columns);
# - **g** after the row layer: **all-reduce** in forward, identity in backward.
#
# Below, both ranks cut their shards from one unsharded MLP (`from_linear`), run the same
# input, and compare with the unsharded layer: output, input gradient, weight gradients.

# %%
def column_then_row(ctx, t):
    ctx.set_mesh({"dp": 1, "tp": t, "pp": 1})
    group = ctx.mesh.group("tp")
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(H, 4 * H), nn.GELU(), nn.Linear(4 * H, H)).to(ctx.device)  # a GPU under NCCL
    x = torch.randn(B, S, H).to(ctx.device).requires_grad_()
    ref(x).square().sum().backward()
    col = tp.ColumnParallelLinear.from_linear(ref[0], group)
    row = tp.RowParallelLinear.from_linear(ref[2], group)
    sharded = nn.Sequential(col, nn.GELU(), row)
    xs = x.detach().clone().requires_grad_()
    comm.ledger().reset()
    with comm.phase("forward"):
        y = sharded(xs)
    with comm.phase("backward"):
        y.square().sum().backward()
    grads = tp.full_gradients(sharded, group)
    records = [r for r in comm.ledger().records if not r.tag.startswith("full_")]
    return {"rank": ctx.rank, "A shard": tuple(col.weight.shape), "B shard": tuple(row.weight.shape),
            "max |Z − Z_ref|": (y - ref(x)).abs().max().item(),
            "max |dX − dX_ref|": (xs.grad - x.grad).abs().max().item(),
            "max |dW − dW_ref|": max((grads[n] - p.grad).abs().max().item() for n, p in ref.named_parameters()),
            "collectives": [(r.phase, r.op, r.tag, r.numel) for r in records]}


pair = zerokit.launch(column_then_row, T, T)
course.table([{k: v for k, v in got.items() if k != "collectives"} for got in pair])

# %%
course.table([{"rank": got["rank"], "phase": phase, "op": op, "tag": tag, "elements": numel,
               "= b·s·h": numel == B * S * H} for got in pair for phase, op, tag, numel in got["collectives"]])

# %% [checks]
for got in pair:
    assert got["max |Z − Z_ref|"] <= 1e-5 and got["max |dX − dX_ref|"] <= 1e-5 and got["max |dW − dW_ref|"] <= 1e-5
    assert got["A shard"] == (4 * H // T, H) and got["B shard"] == (H, 4 * H // T)
    # g: one all-reduce forward; f: one all-reduce backward; each of b·s·h elements
    assert got["collectives"] == [("forward", "all_reduce", "row:g", B * S * H),
                                  ("backward", "all_reduce", "column:f", B * S * H)]

# %% [markdown]
# **Check yourself.** Does the column → row MLP on 2 ranks give the unsharded layer's output, with one all-reduce each way? Predict it, then run the cell: it prints its
# verdict, and stops with an `AssertionError` if the run disagrees.

# %%
for got in pair:
    same = got["max |Z − Z_ref|"] <= 1e-5
    calls = [(phase, op) for phase, op, _, _ in got["collectives"]]
    print(f"max |Z − Z_ref| = {got['max |Z − Z_ref|']:.1e} — {'the unsharded layer' if same else 'not the unsharded layer'}; "
          f"collectives: {calls}")
    assert same and calls == [("forward", "all_reduce"), ("backward", "all_reduce")]

# %% [markdown]
# Each rank holds half of A's columns and half of B's rows, and the output is the
# unsharded layer's, to float rounding. One all-reduce of `b·s·h` each way. Attention is
# cut the same way — the QKV projection by heads (column), the output projection by rows —
# so a transformer layer has **two f/g pairs: 4 all-reduces of `b·s·h` per layer**, two in
# forward, two in backward. On a ring each sends `2(t−1)/t` of its size:
# `4 · 2(t−1)/t · b·s·h = 8·b·s·h·(t−1)/t` elements per layer.
#
# ## The tiny GPT under `tp`: counted per layer
#
# `zerokit.train(work, "tp", parallel={"tp": 2})` cuts the model by its plan
# (`tp.tiny_gpt_plan`): attention and MLP as above, a vocabulary-parallel embedding (a g in
# forward), a vocabulary-parallel head (an f) and a cross-entropy that never gathers the
# logits (three all-reduces of `b·s` numbers: the max, the sum of exponentials, the target's
# logit). Trained next to one process, with SGD, fp32, and with sequence parallelism.
#
# The bytes below are the **ring cost**: the ring formula applied to the payloads the ledger
# measured, since gloo's all-reduce is not a ring and nothing counts its wire (lesson 01, [Why
# gloo's times are not a ring's](01_collectives.ipynb#Why-gloo's-times-are-not-a-ring's)).
#
# **Predict before you run.** Sequence parallelism replaces each of a layer's 4 all-reduces by
# an all-gather and a reduce-scatter. Per layer, will its ring cost be larger, smaller or the
# same as plain tensor parallelism's — and how many calls will the ledger count?
#
# <details><summary>Answer</summary>
#
# The same bytes in twice the calls: in the table below each `blocks.i` row has the same ring
# cost with and without sequence parallelism, equal to the `8·b·s·h·(t−1)/t` column, in 4 calls
# (all-reduce) or 8 (all-gather + reduce-scatter). A ring all-reduce *is* a reduce-scatter then an
# all-gather, so splitting it moves no extra byte.
#
# </details>

# %%
SGD = dict(optimizer="sgd", lr=0.1)
runs = {sp: compare(work, T, ["single", "tp"], steps=3, parallel={"dp": 1, "tp": T}, sequence_parallel=sp,
                    keep_records=True, **SGD)["tp"] for sp in (False, True)}


def per_layer(rank, step=2):
    """Ring cost per layer (and outside the layers) of one step, from the ledger's records."""
    out = {}
    for r in rank.comm_records:
        if r["step"] != step or r["axis"] != "tp":
            continue
        where = ".".join(r["tag"].split(".")[:2]) if r["tag"].startswith("blocks.") else r["tag"].split(":")[0]
        row = out.setdefault(where, {"calls": 0, "ops": set(), "ring cost B": 0})
        row["calls"] += 1
        row["ops"].add(r["op"])
        row["ring cost B"] += r["ring_cost_bytes"]
    return out


per_layer_theory = theory.tp_elements_sent_per_layer(B, S, H, T) * 4  # fp32
rows = []
for sp, result in runs.items():
    for where, row in per_layer(result.ranks[0]).items():
        rows.append({"sequence_parallel": sp, "where": where, "calls": row["calls"], "ops": ", ".join(sorted(row["ops"])),
                     "ring cost B (formula on measured payload)": row["ring cost B"],
                     "theory 8·b·s·h·(t−1)/t ·4 B": per_layer_theory if where.startswith("blocks.") else ""})
course.table(rows)

# %% [markdown]
# Per step the whole model's traffic is the formula for any plan,
# `theory.tp_comm_bytes_per_step`: `tokens × reduced_width` per conjugate pair — `4h` per
# layer, `h` for the embedding, `h` for the head — plus the loss's three reductions of `b·s`
# fp32 values, and, under sequence parallelism, the once-per-backward all-reduce of the
# gradients of parameters every rank holds whole (norms, positions, row biases), since each
# rank now saw only `1/t` of the sequence.

# %%
replicated_sp = S * H + (4 * L + 2) * H + 2 * L * H   # positions, LayerNorms, row-parallel biases
formula = {sp: theory.tp_comm_bytes_per_step(B * S, (4 * L + 2) * H, T, 4, loss_reductions=3,
                                             sequence_parallel_numel=replicated_sp if sp else 0) for sp in (False, True)}
course.table([{"sequence_parallel": sp, "param diff vs one process": result.param_diff["max_abs"],
               "ring cost B/step (formula on measured payload)":
                   result.ranks[0].comm_bytes_by_axis["tp"]["ring_cost_bytes"],
               "theory.tp_comm_bytes_per_step": formula[sp],
               "calls/step": result.ranks[0].comm_bytes_by_axis["tp"]["calls"]} for sp, result in runs.items()])

# %% [checks]
for sp, result in runs.items():
    assert result.param_diff["max_abs"] <= 1e-6  # the same training as one process
    for rank in result.ranks:
        assert rank.comm_bytes_by_axis["tp"]["ring_cost_bytes"] == formula[sp] == rank.theory_comm_bytes_by_axis["tp"]
        layers = {k: v for k, v in per_layer(rank).items() if k.startswith("blocks.")}
        assert len(layers) == L
        for row in layers.values():
            assert row["ring cost B"] == per_layer_theory  # 8·b·s·h·(t−1)/t elements, with or without SP
            assert row["ops"] == ({"all_gather", "reduce_scatter"} if sp else {"all_reduce"})
            assert row["calls"] == (8 if sp else 4)  # 4 all-reduces, or 4 all-gathers + 4 reduce-scatters

# %% [markdown]
# ## Sequence parallelism: the same bytes, split differently
#
# Between the f/g pairs sit LayerNorm and dropout, which every rank computes whole on the
# whole sequence — duplicated work and duplicated activations. Korthikanti et al.
# (2205.05198 §4.2.2) shard those regions **along the sequence**: g becomes a
# **reduce-scatter** (each rank keeps the summed output for its `s/t` tokens) and f an
# **all-gather** (the sequence is gathered before the column layer). An all-reduce *is* a
# reduce-scatter followed by an all-gather, so the bytes don't change — the table shows 8
# calls per layer instead of 4 and the same bytes — while the LayerNorm activations shrink
# by t.

# %%
fig, ax = course.new_figure(10, 3.6)
wheres = list(dict.fromkeys([*per_layer(runs[False].ranks[0]), *per_layer(runs[True].ranks[0])]))
width = 0.38
for i, (sp, color) in enumerate(((False, "#4C72B0"), (True, "#DD8452"))):
    layer = per_layer(runs[sp].ranks[0])
    ax.bar(np.arange(len(wheres)) + (i - 0.5) * width, [layer.get(w, {"ring cost B": 0})["ring cost B"] / 1024
                                                         for w in wheres],
           width, color=color, label="sequence parallel:\nall-gather + reduce-scatter" if sp else "tp: all-reduce")
ax.axhline(per_layer_theory / 1024, color="#333333", ls="--", lw=1, label="8·b·s·h·(t−1)/t per layer\n(fp32, theory)")
ax.set_xticks(range(len(wheres)), [w.replace("_", "\n", 2) if not w.startswith("blocks.") else w for w in wheres],
              fontsize=9)
ax.set_ylabel("KiB per step (ring cost)")
ax.set_title(f"rank 0, t = {T}: traffic per layer and at the edges (ring formula on measured payloads)", fontsize=10)
course.figures.legend_outside(ax, fontsize=9)
fig.tight_layout()
fig

# %% [markdown]
# ## Next to torch's own tensor parallelism
#
# `torch-tp` runs the same plan through `torch.distributed.tensor.parallel`
# (`ColwiseParallel`, `RowwiseParallel` on a DeviceMesh). Both train the same model as one
# process. The difference is at the head. zerokit's `torch-tp` gives the head
# `ColwiseParallel(output_layouts=Replicate())`, the plain plan: the logits are gathered whole
# (`b·s·V`) before a plain cross-entropy. zerokit's `tp` keeps them split and exchanges three
# numbers per token, as Megatron's vocabulary-parallel cross-entropy does; torch offers the same
# with its `loss_parallel()` context (logits left sharded, `Shard(-1)`), which needs the loss
# computed inside that context — zerokit's loop computes it outside the strategy, so its
# `torch-tp` gathers: zerokit's choice, not a limit of torch.

# %%
side = compare(work, T, ["single", "tp", "torch-tp"], steps=3, parallel={"dp": 1, "tp": T}, **SGD)
course.table([{"strategy": name, "param diff vs one process": side[name].param_diff["max_abs"],
               "tp payload B/step": side[name].ranks[0].comm_bytes_by_axis["tp"]["payload_bytes"],
               "tp calls/step": side[name].ranks[0].comm_bytes_by_axis["tp"]["calls"],
               "ops": ", ".join(sorted({row["op"] for row in side[name].ranks[0].comm_summary
                                        if row["axis"] == "tp"}))} for name in ("tp", "torch-tp")])

# %% [checks]
for name in ("tp", "torch-tp"):
    assert side[name].param_diff["max_abs"] <= 1e-6, name
assert side["tp"].ranks[0].comm_bytes_by_axis["tp"]["payload_bytes"] < \
    side["torch-tp"].ranks[0].comm_bytes_by_axis["tp"]["payload_bytes"]  # no gathered logits

# %% [markdown]
# ## What a rank holds
#
# The split matrices (and the column-parallel biases) divide by t; the LayerNorms, the
# position table and the row-parallel biases are held whole by every rank. Model states of
# one rank, AdamW in fp32, for t = 2 and 4, measured after one step, next to
# `theory.tp_model_state_bytes(sharded, replicated, t)`:

# %%
model = work.build_model()
psi, tensors = work.param_count(), len(list(model.parameters()))
rows, measured_states = [], {}
for t in (2, 4):
    counts = tp.parameter_counts(model, t, tp.tiny_gpt_plan())
    report = zerokit.train(work, "tp", world_size=t, steps=1, parallel={"dp": 1, "tp": t}, reference=False)
    expected = theory.tp_model_state_bytes(counts["sharded"], counts["replicated"], t, "fp32", "adamw",
                                           optimizer_tensors=tensors)
    measured_states[t] = ([rank.model_state_bytes for rank in report.result.ranks], expected)
    rows.append({"t": t, "sharded elements": counts["sharded"], "replicated elements": counts["replicated"],
                 "measured B (rank 0)": sum(report.result.ranks[0].model_state_bytes.values()),
                 "theory B": expected.params + expected.grads + expected.optimizer,
                 "unsharded 16Ψ B (fp32 AdamW)": 16 * psi})
course.table(rows)

# %% [checks]
for t, (ranks, expected) in measured_states.items():
    for states in ranks:
        assert states == {"params": expected.params, "grads": expected.grads, "optimizer": expected.optimizer}

# %% [markdown]
# Tensor parallelism divides the *sharded* part by t, never the replicated rest — and, unlike
# ZeRO, it divides the **compute** and the activations inside the f/g regions too. Its price
# is on the critical path: the all-reduces sit between layers, and the next layer cannot start
# until g's sum has arrived, so each step waits for them wherever the link is slow next to the
# compute. That is why Megatron keeps t within a node, on NVLink (t ≤ 8 on an 8-GPU node), and
# crosses nodes with pipeline or data parallelism.
#
# ## Try it
#
# An all-reduce is a reduce-scatter then an all-gather — the identity sequence parallelism
# rests on. Choose the collective, the world size and the payload: the panel runs it on real
# ranks and draws the ring's rounds and the bytes each rank sent.

# %%
course.CollectivePanel(ops=("all_reduce", "reduce_scatter", "all_gather"), world_sizes=(2, 3, 4),
                       payload_kib=(16, 64), world_size=2)

# %% [markdown]
# ## Summary
#
# - A column-parallel layer then a row-parallel one is the unsharded pair, exactly: f (an
#   all-reduce of the input gradient in backward) and g (an all-reduce of the output in
#   forward) are the only exchanges.
# - A transformer layer has two such pairs: **4 all-reduces of b·s·h per layer per
#   micro-batch, `8·b·s·h·(t−1)/t` elements**, measured per layer; the whole step equals
#   `theory.tp_comm_bytes_per_step`.
# - Sequence parallelism swaps each all-reduce for a reduce-scatter + all-gather: the same
#   bytes, LayerNorm regions sharded along the sequence.
# - A rank holds `sharded/t + replicated`; the traffic is on the critical path, every layer,
#   so t stays within a node.
#
# ## Interview questions
#
# 1. *Why column-parallel first and row-parallel second in the MLP?*
#
#    <details><summary>Answer</summary>
#
#    The column split leaves each rank whole columns of `XA`, so GeLU applies locally with no
#    exchange; the row split then needs one all-reduce (g) for the output. The other order would
#    need a collective before the nonlinearity (the first table: one all-reduce each way).
#
#    </details>
#
# 2. *How much does tensor parallelism communicate per layer?*
#
#    <details><summary>Answer</summary>
#
#    4 all-reduces of `b·s·h` (2 forward, 2 backward): `8·b·s·h·(t−1)/t` elements, independent
#    of the parameter count and proportional to the activations (the per-layer table).
#
#    </details>
#
# 3. *What does sequence parallelism change in the communication?*
#
#    <details><summary>Answer</summary>
#
#    Nothing in bytes (the bars: the same per layer): each all-reduce becomes a reduce-scatter
#    and an all-gather of the same total, twice the calls. What it saves is the LayerNorm and
#    dropout activations and compute, each rank keeping `s/t` of the sequence in those regions
#    (Korthikanti et al. §4.2.2; not measured in this lesson).
#
#    </details>

# %% [markdown]
# **Exercise:** [exercises/07_megatron_mlp.ipynb](../exercises/07_megatron_mlp.ipynb) — the
# column-then-row MLP with its f and g, written by you, graded by `zerokit grade 07`; then
# [exercises/10_sequence_parallel.ipynb](../exercises/10_sequence_parallel.ipynb) — sequence parallelism
# around it, graded by `zerokit grade 10` ·
# **Next:** [lesson 08 — pipeline parallelism: schedules as data, the bubble, and 1F1B's
# memory](08_pipeline_parallel.ipynb)
