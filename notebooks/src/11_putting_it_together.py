# %% [markdown]
# # 11 · Putting it together: DP × TP × PP on 8 ranks, ZeRO on dp, and how to choose
#
# **The question.** Lessons 03–08 took one parallelism at a time. Real training of a large
# model runs three at once — a 3-D mesh of data, tensor and pipeline parallelism — with ZeRO
# sharding the optimizer states along the data-parallel axis. On such a grid, what does each
# rank hold, what does it send on each axis, and how long does it idle? And the seed's table
# — *"data parallel: O(N×P) memory, O(P) traffic; model parallel: O(P), O(L×A); ZeRO-3:
# O(P/N), O(P/N)"* — does it survive being measured on one model? Finally: given a model and
# a cluster, which layout do you pick?
#
# **What you will see.** A tiny GPT trained on a 2 × 2 × 2 mesh (8 ranks: ZeRO-1 on dp,
# Megatron TP on tp, a 1F1B pipeline on pp), the same model as one process; each rank's
# coordinates, model states and bytes per axis measured next to `zerokit.theory`. The seed's
# comparison table rebuilt from four runs on the same 8 ranks — DDP, ZeRO-3, model parallel
# (TP 2 × PP 4) and the 3-D grid: memory per rank, traffic per axis, bubble, each measured
# next to its formula. Then a decision guide with the planner (`zerokit.plan`) on real sizes,
# and a panel (`course.GridPanel`) where you set dp, tp, pp and the ZeRO stage.

# %%
%matplotlib inline
import matplotlib
from IPython.display import display

import zerokit
from zerokit import course, theory
from zerokit.pipeline_parallel import measured
from zerokit.planner import tiny_gpt_spec

matplotlib.rcParams["figure.dpi"] = course.DPI
SHAPE = dict(vocab=32, seq_len=8, d_model=16, n_layer=4, n_head=2)
work = zerokit.tiny_gpt(**SHAPE, batch_size=16)
GRID = {"dp": 2, "tp": 2, "pp": 2}
M = 4  # micro-batches per step on every pipeline below
print(work.description)

# %% [markdown]
# ## The grid: 8 ranks, three axes
#
# `zerokit.train(work, "zero1", world_size=8, parallel={"dp": 2, "tp": 2, "pp": 2})` lays the
# ranks on a mesh with `tp` innermost (tensor-parallel neighbours are consecutive ranks, as
# they would share a node's NVLink), then `dp`, then `pp` outermost. Each rank first cuts the
# model along pp (its stage's blocks: embeddings with the first, head with the last), then
# along tp (Megatron's column/row split, attention by heads, a vocabulary-parallel head and
# loss), and ZeRO-1 shards what is left of the optimizer states along dp. 4 micro-batches per
# step run a 1F1B schedule on pp; the global batch of 16 is split in 2 along dp.

# %%
grid = zerokit.train(work, "zero1", world_size=8, steps=2, parallel=GRID, micro_batches=M, schedule="1f1b")
result = grid.results[0]
course.table(course.grid_rows(grid))

# %% [markdown]
# Read a row as a place: rank 5 is stage 1 (pp 1), data-parallel replica 0, tensor shard 1.
# Ranks that differ only in `dp` hold the same shard of the same stage — the data-parallel
# replicas ZeRO shards across. The two stages differ (stage 0 has the embeddings, stage 1 the
# final norm and head); the two tensor shards of a stage are equal. Every column comes with
# its formula: model states from the memory ledger against `theory.model_state_bytes` on the
# rank's own parameter count; each axis's bytes from the communication ledger (the ring cost
# of the calls it recorded; point-to-point sends on pp) against the axis's formula —
# `theory.comm_bytes_per_step` on dp, `theory.tp_comm_bytes_per_step` on tp (the
# vocabulary-parallel loss's three reductions only on the last stage, which computes the loss),
# `theory.pipeline_p2p_bytes` on pp.

# %%
# 8 ranks on three axes train the model one process trains: the same losses, the same parameters to fp32 rounding
# (AdamW divides by √v, which magnifies the rounding of a reduction order on near-zero gradients: 1e-5, as lesson 13)
assert all(abs(a - b) <= 1e-5 for a, b in zip(result.losses, grid.reference.losses)), (result.losses, grid.reference.losses)
assert result.max_abs_param_diff <= 1e-5, result.max_abs_param_diff
assert sorted(tuple(r.coords[a] for a in ("pp", "dp", "tp")) for r in result.ranks) == \
    [(p, d, t) for p in range(2) for d in range(2) for t in range(2)]
for rank in result.ranks:
    assert sum(rank.model_state_bytes.values()) == rank.theory_model_states["total"], rank.rank
    for axis in ("dp", "tp", "pp"):
        assert rank.comm_bytes_by_axis[axis]["ring_cost_bytes"] == rank.theory_comm_bytes_by_axis[axis], (rank.rank, axis)
print(f"largest |Δparam| vs one process: {result.max_abs_param_diff:.1e}; "
      f"every rank's states and every axis's bytes = theory")

# %% [markdown]
# ## ZeRO on the dp axis
#
# ZeRO shards along the **data-parallel** axis only: a tensor-parallel shard is already
# different on each tp rank and a stage on each pp rank; what is duplicated is the same shard
# of the same stage across the dp replicas. So each rank's optimizer states are its
# `(tp, pp)` shard's divided by dp. Below, each stage's first rank: the parameters it holds,
# its optimizer states measured, and what DDP on the same shard would hold by the same
# formula (stage 0) — the optimizer states halve at dp = 2; params and grads don't move.

# %%
rows = []
for rank in sorted(result.ranks, key=lambda r: r.rank):
    if rank.coords["dp"] or rank.coords["tp"]:
        continue
    psi_rank = rank.model_state_bytes["params"] // 4  # fp32: 4 bytes per element held
    ddp = theory.model_state_bytes(0, psi_rank, GRID["dp"], "fp32", "adamw")
    rows.append({"stage": rank.coords["pp"], "Ψ on this rank": psi_rank,
                 "optimizer B (measured)": rank.model_state_bytes["optimizer"],
                 "ZeRO-1 optimizer B (theory)": rank.theory_model_states["optimizer"],
                 "DDP optimizer B (theory, same shard)": ddp.optimizer,
                 "dp B/step (ledger)": rank.comm_bytes_by_axis["dp"]["ring_cost_bytes"],
                 "dp B/step (theory 2(N−1)/N·Ψb)": theory.comm_bytes_per_step(1, psi_rank, GRID["dp"], 4)})
course.table(rows)

# %%
for row in rows:
    assert row["optimizer B (measured)"] == row["ZeRO-1 optimizer B (theory)"] < row["DDP optimizer B (theory, same shard)"]
    assert row["dp B/step (ledger)"] == row["dp B/step (theory 2(N−1)/N·Ψb)"]
refusals = {}
for stage in ("zero2", "zero3"):  # a pipeline takes ZeRO-1 at most, as DeepSpeed: refused before any process starts
    try:
        zerokit.train(work, stage, world_size=8, parallel=GRID, micro_batches=M, reference=False)
    except ValueError as exc:
        refusals[stage] = str(exc)
assert set(refusals) == {"zero2", "zero3"} and all("pipeline" in msg for msg in refusals.values())
print(refusals["zero3"][:160], "…")

# %% [markdown]
# Why not ZeRO-2 or 3 under a pipeline? A pipeline runs m micro-batches' backwards per step;
# ZeRO-2 and 3 free the gradients a rank does not own after each one, so they would
# reduce-scatter m times per step instead of once (and ZeRO-3 gather every parameter m times
# more). DeepSpeed refuses the combination; so does zerokit.
#
# ## The seed's table, rebuilt from measurements
#
# The seed compares data parallelism, model parallelism and ZeRO-3 in one table of O(·)
# claims. Here are the three on the **same model and the same 8 ranks**, plus the 3-D grid
# above — each trained for a step, every number read off the ledgers or the recorded
# pipeline actions and set next to its formula. "model parallel" is Megatron's recipe: TP 2
# inside a pair of ranks, PP 4 across, no data parallelism.

# %%
layouts = {
    "DP (DDP, dp 8)": ("ddp", {"dp": 8}),
    "ZeRO-3 (dp 8)": ("zero3", {"dp": 8}),
    "model parallel (tp 2 × pp 4)": ("pp", {"dp": 1, "tp": 2, "pp": 4}),
}
runs = {name: zerokit.train(work, s, world_size=8, steps=1, parallel=par, reference=False,
                            **({"micro_batches": M, "schedule": "1f1b"} if par.get("pp", 1) > 1 else {}))
        for name, (s, par) in layouts.items()}
runs["3-D: ZeRO-1 (dp 2 × tp 2 × pp 2)"] = grid
psi = result.param_count
single = theory.model_state_bytes(0, psi, 1, "fp32", "adamw").total  # one process holds all of it


def bubble(report):
    """The pipeline's idle share: measured from the recorded actions of one rank per stage, simulated, formula."""
    res = report.results[0]
    p = res.parallel.get("pp", 1)
    if p == 1:
        return 0.0, 0.0, theory.bubble_fraction(1, res.micro_batches)
    firsts = sorted((r for r in res.ranks if r.coords["dp"] == 0 and r.coords["tp"] == 0), key=lambda r: r.coords["pp"])
    sched = zerokit.schedule("1f1b", p, res.micro_batches)
    return (measured(sched, [r.pipeline_spans for r in firsts]).bubble_fraction, zerokit.simulate(sched).bubble_fraction,
            theory.bubble_fraction(p, res.micro_batches))


rows = []
for name, report in runs.items():
    ranks = report.results[0].ranks
    busiest = lambda axis, key: max((r.comm_bytes_by_axis.get(axis, {}).get(key) or 0) for r in ranks)
    formula = lambda axis: max(r.theory_comm_bytes_by_axis.get(axis, 0) for r in ranks)
    b_measured, b_simulated, b_formula = bubble(report)
    rows.append({"layout": name,
                 "states B/rank (measured, max)": max(sum(r.model_state_bytes.values()) for r in ranks),
                 "states B/rank (theory, max)": max(r.theory_model_states["total"] for r in ranks),
                 "÷ one process (measured)": round(max(sum(r.model_state_bytes.values()) for r in ranks) / single, 3),
                 "activations peak B (measured, max)": max(r.peak_by_category["activations"] for r in ranks),
                 **{f"{a} B/step ({kind})": value for a in ("dp", "tp", "pp")
                    for kind, value in (("ledger", busiest(a, "ring_cost_bytes")), ("theory", formula(a)))},
                 "bubble (measured)": round(b_measured, 3), "bubble (simulated)": round(b_simulated, 3),
                 "bubble (theory)": round(b_formula, 3)})
seed_table = rows
course.table(rows)

# %%
for name, report in runs.items():
    for rank in report.results[0].ranks:
        assert sum(rank.model_state_bytes.values()) == rank.theory_model_states["total"], (name, rank.rank)
        for axis, formula in rank.theory_comm_bytes_by_axis.items():
            assert (rank.comm_bytes_by_axis.get(axis, {}).get("ring_cost_bytes") or 0) == formula, (name, rank.rank, axis)
for row in seed_table:
    assert row["bubble (simulated)"] == row["bubble (theory)"] and 0 <= row["bubble (measured)"] < 1
row = {r["layout"]: r for r in seed_table}
dp_row, z3_row, mp_row = row["DP (DDP, dp 8)"], row["ZeRO-3 (dp 8)"], row["model parallel (tp 2 × pp 4)"]
assert dp_row["÷ one process (measured)"] >= 1.0                          # per rank: the whole model, O(P) — not O(N·P)
assert z3_row["÷ one process (measured)"] < 1.05 / 8                      # O(P/N) memory: true
assert z3_row["dp B/step (ledger)"] == 1.5 * dp_row["dp B/step (ledger)"]  # traffic 1.5 × DDP, not O(P/N)
assert mp_row["dp B/step (ledger)"] == 0 and mp_row["pp B/step (ledger)"] > 0  # model parallel sends activations
# the planner, which answers for real sizes, gives the same bytes for this model's pure data-parallel runs
spec = tiny_gpt_spec(**SHAPE)
for name, strategy in (("DP (DDP, dp 8)", "ddp"), ("ZeRO-3 (dp 8)", "zero3")):
    planned = zerokit.plan(spec, gpus=8, strategy=strategy, precision="fp32", micro_batch_size=2)
    assert planned.comm_bytes_per_step["dp"] == row[name]["dp B/step (ledger)"], name

# %%
names = [r["layout"].split(" (")[0] if not r["layout"].startswith("3-D") else "3-D + ZeRO-1" for r in seed_table]
fig, (ax_mem, ax_comm, ax_bubble) = course.new_figure(13, 3.4, ncols=3)
xs = range(len(seed_table))
ax_mem.bar(xs, [r["states B/rank (measured, max)"] / 1024 for r in seed_table], color="#4C72B0", label="measured")
ax_mem.plot(xs, [r["states B/rank (theory, max)"] / 1024 for r in seed_table], "k_", ms=30, mew=2, label="theory")
ax_mem.axhline(single / 1024, color="#999999", ls="--", label="one process holds")
ax_mem.set_ylabel("KiB per rank (the fullest rank)")
ax_mem.set_title("model states per rank", fontsize=9)
width = 0.25
for i, (axis, color) in enumerate((("dp", "#4C72B0"), ("tp", "#DD8452"), ("pp", "#55A868"))):
    ax_comm.bar([x + (i - 1) * width for x in xs], [r[f"{axis} B/step (ledger)"] / 1024 for r in seed_table], width,
                color=color, label=f"{axis} (ledger)")
    ax_comm.plot([x + (i - 1) * width for x in xs], [r[f"{axis} B/step (theory)"] / 1024 for r in seed_table], "k_",
                 ms=10, mew=2, label="theory" if i == 0 else None)
ax_comm.set_ylabel("KiB per rank per step (busiest rank)")
ax_comm.set_title("traffic per axis", fontsize=9)
ax_bubble.bar([x - 0.2 for x in xs], [r["bubble (measured)"] for r in seed_table], 0.4, color="#C44E52",
              label="measured (noisy: 8 ranks, 2 cores)")
ax_bubble.bar([x + 0.2 for x in xs], [r["bubble (theory)"] for r in seed_table], 0.4, color="white", edgecolor="#C44E52",
              hatch="///", label="theory (p − 1)/(m + p − 1)")
ax_bubble.set_ylim(0, 1.5 * max(r["bubble (measured)"] for r in seed_table))
ax_bubble.set_ylabel("idle share of the step")
ax_bubble.set_title(f"pipeline bubble, m = {M}", fontsize=9)
for ax in (ax_mem, ax_comm, ax_bubble):
    ax.set_xticks(list(xs), names, fontsize=8)
    ax.legend(fontsize=7)
fig.suptitle(f"the seed's table on one model ({work.name}, Ψ = {psi:,}), 8 ranks, fp32 AdamW", fontsize=10)
fig.tight_layout()
fig

# %% [markdown]
# What the measurements say about the seed's cells:
#
# - **Memory.** Data parallelism holds the whole model on every rank: O(P) *per rank* (the
#   seed's O(N×P) is the cluster's total). ZeRO-3 holds 1/N of it (plus padding): O(P/N),
#   true. Model parallelism divides the states too — by tp × pp, unevenly (the stage with the
#   embeddings or the head holds more) — so its O(P) is per model, not per rank. The 3-D grid
#   divides by tp × pp and then shards the optimizer states by dp.
# - **Traffic.** DDP's all-reduce: 2(N−1)/N·Ψb per rank, O(P) — true. ZeRO-3's is 1.5 × that
#   (parameters gathered in forward and again in backward, gradients reduce-scattered): still
#   O(P), flat in N, **not** O(P/N). Model parallelism sends activations, not parameters: tp's
#   all-reduces and pp's point-to-point bytes scale with b·s·h and the layers, not with Ψ —
#   the seed's O(L×A) is right in spirit.
# - **Bubble.** Only a pipeline idles: (p − 1)/(m + p − 1) with m = 4 is 3/7 at p = 4 and 1/5
#   at p = 2; the recorded actions of a real run give the same order of magnitude, noisier and
#   larger here (8 processes on 2 shared cores; lesson 08 has the details).
#
# The table's O(·) cells hide what decides a layout: the constants (1.5×, the bubble's m)
# and **which link** each axis's bytes cross.
#
# ## Choosing a layout: a decision guide, with the planner
#
# On real sizes nothing here can run; the planner (`zerokit.plan`) composes the same formulas
# — the ones the ledgers just matched — for a model preset and a cluster, and estimates each
# axis's time on its link (NVLink inside a node, InfiniBand across). First the rule of thumb,
# then the planner on GPT-3 175 B with 1024 GPUs of 80 GB (8 per node), 16 micro-batches,
# full activation checkpointing:

# %%
candidates = {
    "ZeRO-3, dp 1024": ("zero3", None),
    "ZeRO-1, tp 8 × dp 128": ("zero1", {"dp": 128, "tp": 8, "pp": 1}),
    "ZeRO-1, tp 16 × dp 64": ("zero1", {"dp": 64, "tp": 16, "pp": 1}),
    "ZeRO-1, tp 8 × pp 8 × dp 16": ("zero1", {"dp": 16, "tp": 8, "pp": 8}),
    "ZeRO-1, tp 8 × pp 16 × dp 8": ("zero1", {"dp": 8, "tp": 8, "pp": 16}),
}
plans = {name: zerokit.plan(preset="gpt3-175b", gpus=1024, gpu_memory=80e9, strategy=s, parallel=par, micro_batches=16,
                            checkpointing="full") for name, (s, par) in candidates.items()}
course.table([{"layout (planned)": name, "GB per GPU (formula)": round(p.total_bytes / 1e9, 1), "fits 80 GB": p.fits,
               **{f"{a} GB/step (formula)": round(p.comm_bytes_per_step.get(a, 0) / 1e9, 1) for a in ("dp", "tp", "pp")},
               "link s/step (estimate)": round(p.comm_seconds, 2),
               "bubble (formula)": round(p.bubble["fraction_of_wall_time"], 3)} for name, p in plans.items()])

# %%
for name, p in plans.items():  # the planner's bubble is theory's; its per-rank states are theory's on its shard
    layout = p.layout
    assert p.bubble["fraction_of_wall_time"] == (theory.bubble_fraction(layout.pp, 16) if layout.pp > 1 else 0.0), name
intra, inter = plans["ZeRO-1, tp 8 × dp 128"], plans["ZeRO-1, tp 16 × dp 64"]
assert inter.comm_seconds > 5 * intra.comm_seconds  # tp 16 leaves the node: its all-reduces cross InfiniBand
best = min((p for p in plans.values() if p.fits), key=lambda p: p.comm_seconds)
assert best.bubble["fraction_of_wall_time"] > plans["ZeRO-1, tp 8 × pp 8 × dp 16"].bubble["fraction_of_wall_time"]
print(f"least estimated link time among those that fit: {best.layout.describe()} — "
      f"and it idles {best.bubble['fraction_of_wall_time']:.0%} of the step")

# %% [markdown]
# Read the rows: ZeRO-3 alone fits but its dp bytes are absurd — it gathers the whole model
# for every micro-batch, 16 times a step, across nodes. tp 8 × dp 128 doesn't fit; tp 16 fits
# but its all-reduces leave the node (the link time jumps). The pipelines fit with little
# traffic, and the one with the least link time idles almost half the step: the planner's
# link estimate does not include the bubble, so weigh the two — pp 8 idles 30 % at m = 16,
# and more micro-batches per step (a larger global batch, or gradient accumulation) would
# shrink both.
#
# The guide, each step backed by something measured above or in the earlier lessons:
#
# 1. **Does the model fit with plain data parallelism?** Per rank that is the whole model
#    (16Ψ bytes of states with Adam, plus activations). If yes, use DDP — or ZeRO-1/2, which
#    send the **same bytes** (measured equal in lessons 04–05) and free memory for a larger
#    micro-batch.
# 2. **States don't fit: shard them along dp.** ZeRO-1, then ZeRO-2, then ZeRO-3; ZeRO-3 costs
#    1.5 × the traffic (measured above) and gathers every parameter per micro-batch — with
#    many micro-batches per step that multiplies (the 1024-GPU ZeRO-3 row: its dp bytes are
#    its whole model's, 1.5 × 2 bytes, times 16 micro-batches). Offload (lesson 09) trades GPU
#    memory for PCIe.
# 3. **Activations, or one layer, too large — or the dp all-reduce too slow across nodes: add
#    tensor parallelism inside the node.** tp divides states and activations, but
#    all-reduces `b·s·h` four times per layer: keep tp ≤ the GPUs that share NVLink (tp 16
#    across two nodes: the planner's link time jumps).
# 4. **Still too large: add pipeline stages across nodes.** pp sends only point-to-point
#    activations at stage boundaries (the smallest traffic in every table above) but idles
#    `(p − 1)/(m + p − 1)`: keep m ≥ 4p, use 1F1B for memory (lesson 08), interleaving or
#    zero-bubble schedules for time. Only ZeRO-1 goes with it.
# 5. **Then let the planner rank what fits** — `zerokit plan --preset … --gpus …` or
#    `zerokit.plan(...).advise()` — and measure the chosen layout small, as above, before
#    spending the cluster.
#
# The planner panel puts steps 1–2 on sliders for real models (memory per GPU by strategy):

# %%
course.PlanPanel(preset="llama-13b", gpus=8, gpu_memory_gb=80, strategy="zero1", micro_batch_size=1,
                 checkpointing="full")

# %% [markdown]
# ## Try it: the grid panel
#
# Set the degrees of dp, tp and pp (at most 8 ranks) and the ZeRO stage on dp. Each change
# trains the tiny GPT on that mesh for a step — real ranks, real ledgers — and draws each
# rank's model states (stacked by category, the formula as a tick) and its bytes per axis
# (the ledger's bars next to the formula's hatched ones). It opens on the grid run above.
# Watch the optimizer states halve when dp goes from 1 to 2 under ZeRO-1; the dp bars grow by
# half when ddp becomes zero3; tp's bars appear only with tp > 1, and a pipeline refuses
# ZeRO-2 and ZeRO-3.

# %%
panel = course.GridPanel(work, **GRID, stage="zero1", micro_batches=M, report=grid)
panel

# %% [markdown]
# ## Summary
#
# - A 2 × 2 × 2 mesh of 8 ranks (ZeRO-1 on dp, Megatron TP on tp, 1F1B on pp) trains the
#   model one process trains (the same losses, parameters within 1e-5); every rank's model
#   states and every axis's bytes equal `zerokit.theory`'s, to the byte.
# - ZeRO shards along dp only: the optimizer states of a rank's (tp, pp) shard divided by dp;
#   a pipeline takes ZeRO-1 at most (ZeRO-2/3 refused, as DeepSpeed refuses them).
# - The seed's table, measured on one model: data parallelism is O(P) per rank, ZeRO-3 O(P/N)
#   in memory but 1.5 × DDP in traffic (not O(P/N)); model parallelism divides the states by
#   tp × pp and sends activations; only a pipeline idles, (p − 1)/(m + p − 1).
# - Choose by memory first, then by which link each axis crosses: DDP/ZeRO-1/2 while states
#   fit, ZeRO-3 or offload when they don't, TP inside a node, PP across nodes with m ≫ p, and
#   the planner to rank what fits.
#
# ## Interview questions
#
# 1. *On a 3-D mesh (dp × tp × pp), along which axis does ZeRO shard, and why only that one?*
#
#    <details><summary>Answer</summary>
#
#    Along dp. The tp ranks already hold different shards and the pp ranks different stages;
#    only the dp replicas hold the same shard of the same stage, so only there is something
#    redundant to shard. Measured above: each rank's optimizer states are its (tp, pp) shard's
#    divided by dp, and params and grads don't change.
#
#    </details>
#
# 2. *Why does DeepSpeed pair pipeline parallelism with ZeRO-1 and refuse ZeRO-2/3?*
#
#    <details><summary>Answer</summary>
#
#    A pipeline runs m micro-batch backwards per step. ZeRO-2/3 free non-owned gradients after
#    each backward, so they would reduce-scatter m times per step (and ZeRO-3 re-gather
#    parameters m times); ZeRO-1 keeps full gradients until the step and reduces once. zerokit
#    refuses the same combinations before any process starts.
#
#    </details>
#
# 3. *You have 1024 GPUs, 8 per node, and a 175 B model. Why tp = 8 and not 16, and what
#    limits pp?*
#
#    <details><summary>Answer</summary>
#
#    tp all-reduces activations four times per layer per micro-batch; inside a node that rides
#    NVLink, across nodes InfiniBand — the planner's link time for tp 16 is many times tp 8's.
#    pp sends little (point-to-point activations) but idles (p − 1)/(m + p − 1), so its depth
#    is bounded by the micro-batches a step can have (m ≥ 4p keeps the bubble under ~20 %).
#
#    </details>
