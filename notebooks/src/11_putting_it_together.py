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
# next to its formula. Then a decision guide with the planner (`zerokit.plan`) on real sizes
# at realistic micro-batch counts — flat ZeRO-3 next to hierarchical sharding (HSDP, ZeRO++'s
# hpZ) and model parallelism. On the way, the two axes [lesson 15](15_context_parallel.ipynb) and [lesson 16](16_mixture_of_experts.ipynb)
# teach in full — cp, which cuts
# the sequence, and ep, which cuts the experts — join the grid on a tiny GPT with experts (dp 2 ×
# ep 2 × tp 2) and without (cp 2 × tp 2), each next to one process, with the combinations
# zerokit refuses.
# Last, a panel (`course.GridPanel`) where you set dp, cp, ep, tp, pp and the ZeRO stage.
#
# **Time:** about 30 min to read and run (the run itself: about 8 s on a 2-core laptop) ·
# **Needs:** lessons 03–08 (DDP, the three ZeRO stages, tensor and pipeline parallelism),
# nothing else · **After it you can answer:** *Along which axis of a 3-D mesh does ZeRO shard?*
# · *What do dp, cp, ep, tp and pp each cut, and on which group does each communicate?* · *Is
# ZeRO-3's traffic O(P/N)?* · *What is HSDP, and when does it send fewer bytes across nodes than
# ZeRO-3?* · *Given a model and a cluster, which layout do you try first?*

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
course.table([{"rank": row["rank"], "(pp, dp, tp)": f"({row['pp']}, {row['dp']}, {row['tp']})",
               "states B (measured / theory)": f"{row['states B (measured)']:,} / {row['states B (theory)']:,}",
               **{f"{a} B/step (ledger / theory)": f"{row[f'{a} B/step (ledger)']:,.0f} / {row[f'{a} B/step (theory)']:,.0f}"
                  for a in ("dp", "tp", "pp")}}
              for row in course.grid_rows(grid)])

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

# %% [checks]
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
# **Check yourself.** Do 8 ranks on three axes train what one process trains? Predict it, then run the cell: it prints its
# verdict, and stops with an `AssertionError` if the run disagrees.

# %%
gap = max(abs(a - b) for a, b in zip(result.losses, grid.reference.losses))
print(f"dp 2 × tp 2 × pp 2 against one process: largest loss difference {gap:.1e} — "
      f"{'the same training' if gap <= 1e-5 else 'a different training'}")
assert gap <= 1e-5

# %% [markdown]
# ## Five axes: the sequence and the experts join the grid
#
# zerokit's mesh has two more axes than the grid above, each cutting something the first three
# leave whole (lessons 15 and 16 take them apart one at a time). Each axis cuts one thing, and
# its ranks exchange what that cut leaves them missing, on their own group:
#
# - **dp** cuts the **batch**: each replica trains on other sequences, and the weights' gradients
#   are reduced over the dp group (ZeRO shards along it).
# - **cp** cuts the **sequence**: each rank holds chunks of every sequence, and attention, which
#   needs every key, exchanges keys and values on the cp group (ring attention passes them round
#   the ring; Ulysses swaps sequence chunks for heads with all-to-alls). The cp ranks hold the same
#   weights, so the gradients are reduced over dp × cp flattened — the axis the ledger calls `dp_cp`.
# - **ep** cuts the **experts** of a mixture-of-experts layer, and is carved from dp: ep divides dp
#   and adds no ranks (world = dp · cp · tp · pp). Each token goes to the ranks holding its chosen
#   experts and comes back: all-to-alls on the ep group, in forward and in backward; the dense
#   weights' gradients stay on dp, and when dp > ep the ranks holding the same experts reduce
#   theirs on `edp`.
# - **tp** cuts the **hidden size and the heads** (Megatron's column and row splits, each expert
#   split as the dense MLP is): activations are all-reduced on the tp group inside every block.
# - **pp** cuts the **layers**: activations and their gradients are sent point to point between
#   neighbouring stages on the pp group.
#
# zerokit runs dp × tp × pp, dp × cp, cp × tp, dp × ep and dp × ep × tp; it refuses cp with pp, ep
# with cp and ep with pp, before any process starts, with the reason. Those refusals are zerokit's
# current choices, not limits of the field: Megatron-Core, for one, runs expert parallelism together
# with context and pipeline parallelism. Below, two 4-rank grids under ZeRO-1, each next to one
# process, every axis's bytes next to its formula: a tiny GPT with 4 experts (top-2) on dp 2 ×
# ep 2 × tp 2, and the same GPT on cp 2 × tp 2 (ring attention). Under cp the experts' load-
# balancing loss needs each whole sequence's statistics (the share of its tokens each expert got,
# and the router's mean probability), so the cp ranks sum theirs: a few bytes on `cp` besides the
# ring's.

# %%
SHAPE5 = dict(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=4, batch_size=8)
moe = zerokit.tiny_gpt(**SHAPE5, n_experts=4, top_k=2)  # 4 experts per block, each token to its top 2
FIVE = {"dp 2 × ep 2 × tp 2, experts": (moe, {"dp": 2, "ep": 2, "tp": 2}, {}),
        "cp 2 × tp 2, ring, experts": (moe, {"cp": 2, "tp": 2}, {"cp_attention": "ring"})}
five = {name: zerokit.train(model, "zero1", world_size=4, steps=2, parallel=par, **kw)
        for name, (model, par, kw) in FIVE.items()}
CROSSES = {"dp": "the dense weights' gradients", "dp_cp": "the weights' gradients, over dp × cp",
           "cp": "keys, values (and their gradients) round the ring; the experts' routing statistics",
           "ep": "tokens to their experts and back (all-to-all)", "edp": "the experts' gradients",
           "tp": "activations, all-reduced in each block", "pp": "activations between stages"}
five_rows = []
for name, report in five.items():
    rows = course.grid_rows(report)  # one row per rank, in rank order
    for axis in CROSSES:
        ledger = [row.get(f"{axis} B/step (ledger)", 0) for row in rows]
        formula = [row.get(f"{axis} B/step (theory)", 0) for row in rows]
        if any(ledger) or any(formula):
            five_rows.append({"grid (4 ranks, ZeRO-1)": name, "axis": axis, "what crosses it": CROSSES[axis],
                              "B/step, ranks 0–3 (ledger)": " · ".join(f"{v:,.0f}" for v in ledger),
                              "B/step, ranks 0–3 (theory)": " · ".join(f"{v:,.0f}" for v in formula)})
course.table(five_rows)

# %% [markdown]
# Read the rows by axis. On dp 2 × ep 2 × tp 2 each dp rank holds 2 of the 4 experts (split again
# over tp), so `dp` carries only the dense weights' gradients: an expert lives on one dp rank, and
# the combine all-to-all's backward has already brought it the gradient of every token routed to
# it. The `ep` bytes can differ between the two dp ranks: the router decides how many tokens
# leave each rank, and the formula is taken on the rows it measured. On cp 2 × tp 2 there is no
# `dp` row: the gradients are reduced over dp × cp (`dp_cp`), and the `cp` row is ring attention's
# keys and values on each tp rank's heads, with the load-balancing statistics' all-reduces. Ask for a combination zerokit does not run:

# %%
refused = {}
for name, (par, kw) in {"cp 2 × pp 2": ({"cp": 2, "pp": 2}, {"cp_attention": "ring"}),
                        "dp 2 × ep 2 × pp 2": ({"dp": 2, "ep": 2, "pp": 2}, {}),
                        "dp 2 × ep 2 × cp 2": ({"dp": 2, "ep": 2, "cp": 2}, {"cp_attention": "ring"})}.items():
    try:  # refused before any process starts
        zerokit.train(moe, "zero1", world_size=4, parallel=par, reference=False, **kw)
    except ValueError as exc:
        refused[name] = str(exc)
for name, why in refused.items():
    print(f"{name}: {why}")

# %% [markdown]
# How close is "equal to one process"? The losses match to fp32 rounding. The parameters are another
# matter under AdamW: its step `lr·g/(|g| + ε)` divides by the gradient's own size, so an element whose
# gradient lies within a few ε of zero — an expert weight that few tokens reached — turns a rounding-level
# gradient difference into a visibly different step (up to `2·lr`; `theory.adam_parity_ceiling`). No
# tighter bound follows from the arithmetic, so the check below holds the AdamW runs to one process on
# their losses, and trains each grid again with plain SGD, whose step is linear in the gradient: there
# the parameters must agree to two units in the last place per step (`theory.sgd_parity_bound`).

# %%
sgd = {name: zerokit.train(model, "zero1", world_size=4, steps=2, parallel=par, optimizer="sgd", **kw)
       for name, (model, par, kw) in FIVE.items()}
course.table([{"grid (4 ranks, ZeRO-1)": name,
               "largest |Δparam|, AdamW (measured)": f"{five[name].results[0].max_abs_param_diff:.1e}",
               "largest |Δparam|, SGD (measured)": f"{report.results[0].max_abs_param_diff:.1e}",
               "SGD bound (theory)": f"{theory.sgd_parity_bound(report.reference.params, steps=2):.1e}",
               "AdamW ceiling (theory)": f"{theory.adam_parity_ceiling(1e-3, steps=2):.1e}"}
              for name, report in sgd.items()])

# %% [checks]
# each five-axis grid trains the model one process trains, and every axis's ledger bytes equal the formula
for name, report in five.items():
    res = report.results[0]
    # the losses: a mean over tokens, to fp32 rounding; the parameters under AdamW: below its ceiling only
    assert all(abs(a - b) <= 1e-5 for a, b in zip(res.losses, report.reference.losses)), (name, res.losses)
    assert res.max_abs_param_diff <= theory.adam_parity_ceiling(1e-3, steps=2), (name, res.max_abs_param_diff)
    # the same layout under SGD: the parameters to two ulps per step
    bound = theory.sgd_parity_bound(sgd[name].reference.params, steps=2)
    assert sgd[name].results[0].max_abs_param_diff <= bound, (name, sgd[name].results[0].max_abs_param_diff, bound)
    for rank in res.ranks:
        assert sum(rank.model_state_bytes.values()) == rank.theory_model_states["total"], (name, rank.rank)
        assert set(rank.comm_bytes_by_axis) == set(rank.theory_comm_bytes_by_axis), \
            (name, rank.rank, rank.comm_bytes_by_axis, rank.theory_comm_bytes_by_axis)
        for axis, formula in rank.theory_comm_bytes_by_axis.items():
            assert abs(rank.comm_bytes_by_axis[axis]["ring_cost_bytes"] - formula) <= 0.5, (name, rank.rank, axis)
ep_ranks = five["dp 2 × ep 2 × tp 2, experts"].results[0].ranks
cp_ranks = five["cp 2 × tp 2, ring, experts"].results[0].ranks
assert all(set(r.comm_bytes_by_axis) == {"dp", "ep", "tp"} for r in ep_ranks), [r.comm_bytes_by_axis for r in ep_ranks]
assert all(set(r.comm_bytes_by_axis) == {"dp_cp", "cp", "tp"} for r in cp_ranks), [r.comm_bytes_by_axis for r in cp_ranks]
assert sorted((r.coords["dp"], r.coords["ep"], r.coords["tp"]) for r in ep_ranks) == \
    [(d, d, t) for d in range(2) for t in range(2)]  # ep is carved from dp: here each dp rank is its own ep rank
assert set(refused) == {"cp 2 × pp 2", "dp 2 × ep 2 × pp 2", "dp 2 × ep 2 × cp 2"}
assert all("so far" in why for why in refused.values()), refused
print("both grids = one process (losses to fp32 rounding; parameters under SGD within two ulps a step); "
      "every axis's bytes = theory; 3 combinations refused")

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
                 "ZeRO-1 optimizer B (formula)": rank.theory_model_states["optimizer"],
                 "DDP optimizer B (formula, same shard)": ddp.optimizer,
                 "dp B/step (ledger)": rank.comm_bytes_by_axis["dp"]["ring_cost_bytes"],
                 "dp B/step (theory 2(N−1)/N·Ψb)": theory.comm_bytes_per_step(1, psi_rank, GRID["dp"], 4)})
course.table([{k: v for k, v in row.items() if not k.startswith("dp B/step")} for row in rows])

# %% [markdown]
# zerokit, like DeepSpeed's PipelineEngine, takes ZeRO-1 at most with a pipeline — a rule of
# those two, not of the field: torchtitan runs FSDP2 inside each pipeline stage, with
# `torch.distributed.pipelining` keeping the gradients unsharded over the micro-batches and
# reduce-scattering them once, at the last backward. Ask zerokit for ZeRO-2 or ZeRO-3 on the same mesh:

# %%
refusals = {}
for stage in ("zero2", "zero3"):  # refused before any process starts: zerokit's choice, as DeepSpeed's PipelineEngine refuses them
    try:
        zerokit.train(work, stage, world_size=8, parallel=GRID, micro_batches=M, reference=False)
    except ValueError as exc:
        refusals[stage] = str(exc)
print(refusals["zero3"][:160], "…")

# %% [checks]
for row in rows:
    assert row["optimizer B (measured)"] == row["ZeRO-1 optimizer B (formula)"] < row["DDP optimizer B (formula, same shard)"]
    assert row["dp B/step (ledger)"] == row["dp B/step (theory 2(N−1)/N·Ψb)"]
assert set(refusals) == {"zero2", "zero3"} and all("pipeline" in msg for msg in refusals.values())

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
#
# **Predict before you run.** The seed says ZeRO-3's traffic is O(P/N). On these 8 ranks
# ZeRO-3 holds about 1/8 of the model states DDP holds. What multiple of DDP's dp bytes per
# rank will ZeRO-3 send: 1/8, 1, or something else? Write a number.
#
# <details><summary>Answer</summary>
#
# 1.5 — the `dp B/step (measured)` column below: ZeRO-3 gathers the parameters in forward and
# again in backward and reduce-scatters the gradients, three (N−1)/N·Ψb collectives against
# DDP's all-reduce (two). Memory is O(P/N); traffic stays O(P).
#
# </details>

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
course.table([{"layout": r["layout"], "states per rank ÷ one process (measured)": r["÷ one process (measured)"],
               **{f"{a} B/step (measured)": r[f"{a} B/step (ledger)"] for a in ("dp", "tp", "pp")},
               "bubble ÷ step (formula)": r["bubble (theory)"]} for r in seed_table])

# %% [checks]
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
names = ["DP", "ZeRO-3", "model\nparallel", "3-D +\nZeRO-1"]
fig, (ax_mem, ax_comm, ax_bubble) = course.new_figure(13, 4.4, ncols=3)
xs = range(len(seed_table))
ax_mem.bar(xs, [r["states B/rank (measured, max)"] / 1024 for r in seed_table], color="#4C72B0", label="measured")
ax_mem.plot(xs, [r["states B/rank (theory, max)"] / 1024 for r in seed_table], "k_", ms=30, mew=2, label="theory")
ax_mem.axhline(single / 1024, color="#999999", ls="--", label="one process holds")
ax_mem.set_ylabel("KiB per rank (the fullest rank)")
ax_mem.set_title("model states per rank", fontsize=9)
width = 0.25
for i, (axis, color) in enumerate((("dp", "#4C72B0"), ("tp", "#DD8452"), ("pp", "#55A868"))):
    ax_comm.bar([x + (i - 1) * width for x in xs], [r[f"{axis} B/step (ledger)"] / 1024 for r in seed_table], width,
                color=color, label=f"{axis} (measured)")
    ax_comm.plot([x + (i - 1) * width for x in xs], [r[f"{axis} B/step (theory)"] / 1024 for r in seed_table], "k_",
                 ms=10, mew=2, label="theory" if i == 0 else None)
ax_comm.set_ylabel("KiB per rank per step (busiest rank)")
ax_comm.set_title("traffic per axis", fontsize=9)
ax_bubble.bar([x - 0.2 for x in xs], [r["bubble (measured)"] for r in seed_table], 0.4, color="#C44E52",
              label="measured (noisy: 8 ranks, 2 cores)")
ax_bubble.bar([x + 0.2 for x in xs], [r["bubble (theory)"] for r in seed_table], 0.4, color="white", edgecolor="#C44E52",
              hatch="///", label="theory (p − 1)/(m + p − 1)")
ax_bubble.set_ylim(0, 1.15 * max(max(r["bubble (measured)"], r["bubble (theory)"]) for r in seed_table))
ax_bubble.set_ylabel("idle share of the step")
ax_bubble.set_title(f"pipeline bubble, m = {M}", fontsize=9)
for ax in (ax_mem, ax_comm, ax_bubble):
    ax.set_xticks(list(xs), names, fontsize=8)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)  # below: off the bars
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
# - **Bubble.** Only a pipeline idles: (p − 1)/(m + p − 1) of the step with m = 4 is 3/7 at
#   p = 4 and 1/5 at p = 2; the recorded actions of a real run give the same order of
#   magnitude, noisier and larger here (8 processes on 2 shared cores; lesson 08 has the
#   details).
#
# The table's O(·) cells hide what decides a layout: the constants (1.5×, the bubble's m)
# and **which link** each axis's bytes cross.
#
# ## Choosing a layout: a decision guide, with the planner
#
# On real sizes nothing here can run; the planner (`zerokit.plan`) composes the same formulas
# — the ones the ledgers just matched — for a model preset and a cluster, and estimates each
# axis's time on its link (NVLink inside a node, InfiniBand across). Every comparison below
# keeps the **global batch** fixed — the sequences per optimizer step a training recipe sets
# — so the micro-batches per GPU follow from dp: A = global batch ÷ (dp × micro-batch size).
# Comparing layouts at one A instead compares different batches: 16 micro-batches at dp 1024
# is 16,384 sequences a step, eight times GPT-3's.
#
# ### Flat or hierarchical sharding: LLaMA-7B on 64 GPUs
#
# ZeRO-3 shards over all N ranks, so every gather and reduce-scatter runs on a ring that
# spans every node. **Hierarchical sharding** keeps most of that inside a node:
#
# - **HSDP** (FSDP2's `fully_shard(model, mesh=init_device_mesh("cuda", (nodes, 8),
#   mesh_dim_names=("replicate", "shard")))`; DeepSpeed's MiCS, `mics_shard_size`): ZeRO-3
#   inside each group of g GPUs (a node); the groups are replicas of each other. Gathers and
#   reduce-scatters stay in the node; rank j of every node then holds the same gradient shard
#   j, and those ranks all-reduce it across nodes — 2(r−1)/r·Ψb/g per GPU, once a step (FSDP2
#   all-reduces after every micro-batch unless `set_requires_all_reduce(False)` skips all but
#   the last; the planner assumes it does). Memory: 16Ψ/g with Adam, not 16Ψ/N.
# - **hpZ** (ZeRO++, `zero_hpz_partition_size: 8`): ZeRO-3 over all N, plus a **secondary
#   copy** of the 16-bit parameters sharded over the node (2Ψ/g more per GPU), filled by the
#   step's first forward gather; every later gather of the step reads it inside the node — the
#   backward's and, with A micro-batches, the forwards of micro-batches 2 … A too, as DeepSpeed
#   gathers from its `ds_secondary_tensor` until the step changes the weights. Of ZeRO-3's 3A
#   crossings per step, one gather and the A reduce-scatters remain: (1 + A)/(3A) of its bytes.
#
# The formulas, derived in `zerokit.theory.hierarchical`, are what the planner composes
# (`zerokit plan --strategy hsdp` or `hpz`, `--shard-group`). zerokit trains both as well — the
# `hsdp` strategy (next to torch's own, FSDP2 on a 2-D mesh, as the peer `fsdp2-hsdp`) and
# `zeropp` with `zero_hpz_partition_size` — and [lesson 17](17_beyond_one_node.ipynb) runs
# them on emulated nodes, every group's bytes measured against these formulas. Here, at
# real sizes, they are planned.
#
# **Predict before you run.** LLaMA-7B, 64 GPUs in 8 nodes of 8, 1 M tokens a step (512
# sequences of 2048: A = 8 micro-batches per GPU). How many times more bytes leave each node
# per step under ZeRO-3 than under HSDP with groups of 8?
#
# <details><summary>Answer</summary>
#
# About 13.5 — the ratio printed under the table. ZeRO-3 sends 3·A·(N−1)/N·Ψb per GPU on rings
# that cross nodes, and a ring leaves a node once, carrying one GPU's bytes; HSDP's only
# crossing is the all-reduce of each GPU's 1/8 shard, once a step, and all 8 GPUs of a node
# send theirs: 8 · 2(r−1)/r·Ψb/8. The ratio is 1.5·A·(63/64)/(7/8): it grows with the
# micro-batches per step. hpZ sits at (1 + A)/(3A) of ZeRO-3, 3/8 at A = 8 (printed too).
#
# </details>

# %%
A_7B = 512 // 64  # 1 M tokens a step: 512 sequences of 2048 on 64 GPUs, one sequence per micro-batch
flat_or_not = {"DDP": {"strategy": "ddp"}, "ZeRO-1": {"strategy": "zero1"}, "ZeRO-3": {"strategy": "zero3"},
               "HSDP, groups of 8": {"strategy": "hsdp", "shard_group": 8},
               "hpZ, groups of 8": {"strategy": "hpz", "shard_group": 8}}
plans_7b = {name: zerokit.plan(preset="llama-7b", gpus=64, micro_batches=A_7B, checkpointing="full", **kw)
            for name, kw in flat_or_not.items()}
display(course.table([{"layout (planned)": name, "GB per GPU (formula; 80 fit)": round(p.total_bytes / 1e9, 1),
               "GB/step per GPU inside a node (formula)": round(p.comm_bytes_by_link.get("intra-node", 0) / 1e9, 1),
               "GB/step per GPU across nodes (formula)": round(p.comm_bytes_by_link.get("inter-node", 0) / 1e9, 1),
               "GB leaving each node per step (formula)": round(p.bytes_leaving_node / 1e9, 1),
               "link s/step (estimate)": round(p.comm_seconds, 2)} for name, p in plans_7b.items()]))
ratio = plans_7b["ZeRO-3"].bytes_leaving_node / plans_7b["HSDP, groups of 8"].bytes_leaving_node
advice = zerokit.plan(preset="llama-7b", gpus=64, micro_batches=A_7B, checkpointing="full").advise()
print(f"bytes leaving each node per step, ZeRO-3 ÷ HSDP: {ratio:.1f}; hpZ ÷ ZeRO-3: "
      f"{plans_7b['hpZ, groups of 8'].bytes_leaving_node / plans_7b['ZeRO-3'].bytes_leaving_node:.3f}")
print("the advisor's first three (least estimated link time):", "; ".join(o.label for o in advice.fits[:3]))

# %% [checks]
r, n, g = 8, 64, 8  # the planner's bytes are zerokit.theory.hierarchical's, on the planner's own units
for name, p in plans_7b.items():
    strategy, units = p.layout.strategy, (p.memory.units if p.layout.stage == 3 else None)
    split = theory.hierarchical_link_bytes(strategy, p.memory.psi_rank, n, g, 2, A_7B, units=units) \
        if strategy in ("ddp", "zero3", "hsdp", "hpz") else None
    if split:
        assert split["leaving_node"] == p.bytes_leaving_node, name
        assert split["inter_node"] == p.comm_bytes_by_link.get("inter-node", 0), name
        assert split["intra_node"] == p.comm_bytes_by_link.get("intra-node", 0), name
assert abs(ratio / (1.5 * A_7B * (n - 1) / n * r / (r - 1)) - 1) < 1e-3  # the answer's formula, padding aside
hpz_share = plans_7b["hpZ, groups of 8"].bytes_leaving_node / plans_7b["ZeRO-3"].bytes_leaving_node
assert abs(hpz_share - (1 + A_7B) / (3 * A_7B)) < 1e-9  # one gather and A reduce-scatters of ZeRO-3's 3A
assert not plans_7b["DDP"].fits and all(p.fits for name, p in plans_7b.items() if name != "DDP")
labels = [o.label for o in advice.fits]
assert labels.index("HSDP (groups of 8), dp=64, checkpointing full") < labels.index("ZeRO-3, dp=64, checkpointing full")

# %% [markdown]
# Read the rows. DDP does not fit (16Ψ = 108 GB of states). HSDP holds 16Ψ/8 — a node's worth
# of sharding, enough for 7 B — and its bytes leaving a node are one gradient all-reduce a
# step, about DDP's; ZeRO-3's are 1.5 × DDP's **per micro-batch**, so at a fixed global batch
# the fewer the GPUs, the more micro-batches each runs and the more crosses nodes. hpZ keeps
# ZeRO-3's memory (plus the 2Ψ/8 secondary copy) and serves every gather after the step's
# first from inside the node, so its crossing, (1 + A)/(3A) of ZeRO-3's, shrinks as A grows
# (the ratio printed above). ZeRO-1 fits here too and, reducing once a step, crosses about as little as HSDP; HSDP's
# sharded parameters and gradients leave more room for activations (ZeRO-2 would
# reduce-scatter every micro-batch, A × its bytes). The advisor ranks all of them by the link
# estimate; its first three are printed above.
#
# The link estimate runs a ring that spans nodes at **one GPU's** inter-node link for all its
# bytes (one rail: the planner says so in its notes). Where NCCL spreads a ring's channels
# over the node's 8 network cards, a flat ring's time can drop by up to 8×, which narrows the
# gap between the flat layouts and HSDP in the last column; the bytes leaving a node do not
# depend on that, so weigh layouts by them too.
#
# ### GPT-3 175 B on 1024 GPUs at 4 M tokens a step
#
# 2048 sequences of 2048 tokens per step (GPT-3 used 3.2 M tokens), one sequence per
# micro-batch, full activation checkpointing, 80 GB GPUs, 8 per node. Each layout's micro-batch
# count follows from its dp: 2 at dp 1024, 128 for a pipeline with dp 16.

# %%
SEQUENCES = 2048
candidates = {
    "ZeRO-3, dp 1024": ("zero3", None, {}),
    "hpZ (groups of 8), dp 1024": ("hpz", None, {"shard_group": 8}),
    "HSDP (groups of 8), dp 1024": ("hsdp", None, {"shard_group": 8}),
    "ZeRO-1, tp 8 × dp 128": ("zero1", {"dp": 128, "tp": 8, "pp": 1}, {}),
    "ZeRO-1, tp 16 × dp 64": ("zero1", {"dp": 64, "tp": 16, "pp": 1}, {}),
    "ZeRO-1, tp 8 × pp 8 × dp 16": ("zero1", {"dp": 16, "tp": 8, "pp": 8}, {}),
    "ZeRO-1, tp 8 × pp 16 × dp 8": ("zero1", {"dp": 8, "tp": 8, "pp": 16}, {}),
}
plans = {name: zerokit.plan(preset="gpt3-175b", gpus=1024, gpu_memory=80e9, strategy=s, parallel=par,
                            micro_batches=SEQUENCES // (par or {"dp": 1024})["dp"], checkpointing="full", **kw)
         for name, (s, par, kw) in candidates.items()}
display(course.table([{"layout (planned)": name, "micro-batches A": p.layout.micro_batches,
               "GB per GPU (formula; 80 fit)": round(p.total_bytes / 1e9, 1),
               "GB leaving each node per step (formula)": round(p.bytes_leaving_node / 1e9),
               "link s/step (estimate)": round(p.comm_seconds, 2),
               "bubble ÷ step (formula)": round(p.bubble["fraction_of_wall_time"], 3)} for name, p in plans.items()]))
best = min((p for p in plans.values() if p.fits), key=lambda p: p.comm_seconds)
print(f"least estimated link time among those that fit: {best.layout.describe()} — "
      f"and it idles {best.bubble['fraction_of_wall_time']:.0%} of the step")
# what ZeRO-3's gathers ask of the link: 3·Ψ·b bytes per micro-batch against 6Ψ·s FLOPs (forward and backward)
FLOPS = 300e12  # an assumption: what one GPU sustains in bf16
seq = plans["ZeRO-3, dp 1024"].model.seq_len
print(f"ZeRO-3 sends 3Ψb per micro-batch for 6Ψ·s FLOPs: to keep up at {FLOPS / 1e12:.0f} TFLOP/s a GPU needs "
      f"{FLOPS / seq / 1e9:.0f} GB/s of its own (the planner assumes "
      f"{plans['ZeRO-3, dp 1024'].cluster.inter_bandwidth / 1e9:.0f} GB/s per GPU across nodes)")

# %% [checks]
for name, p in plans.items():  # the planner's bubble is theory's at each layout's own micro-batch count
    layout = p.layout
    assert layout.micro_batches * layout.dp == SEQUENCES, name
    assert p.bubble["fraction_of_wall_time"] == (theory.bubble_fraction(layout.pp, layout.micro_batches)
                                                 if layout.pp > 1 else 0.0), name
intra, inter = plans["ZeRO-1, tp 8 × dp 128"], plans["ZeRO-1, tp 16 × dp 64"]
assert inter.comm_seconds > 5 * intra.comm_seconds  # tp 16 leaves the node: its all-reduces cross InfiniBand
assert best.bubble["fraction_of_wall_time"] > plans["ZeRO-1, tp 8 × pp 8 × dp 16"].bubble["fraction_of_wall_time"]
z3, hpz, hsdp = plans["ZeRO-3, dp 1024"], plans["hpZ (groups of 8), dp 1024"], plans["HSDP (groups of 8), dp 1024"]
assert z3.fits and hpz.fits and not hsdp.fits  # 16Ψ/8 = 350 GB: a node cannot hold GPT-3's states
a = z3.layout.micro_batches
assert abs(hpz.bytes_leaving_node / z3.bytes_leaving_node - (1 + a) / (3 * a)) < 1e-9  # 1/2 at A = 2
hsdp64 = zerokit.plan(preset="gpt3-175b", gpus=1024, strategy="hsdp", shard_group=64, micro_batches=2, checkpointing="full")
assert hsdp64.fits and hsdp64.bytes_leaving_node > z3.bytes_leaving_node  # groups of 8 nodes: their rings cross nodes

# %% [markdown]
# Read the rows. HSDP with groups of 8 does not fit: a node would hold 16Ψ/8 = 350 GB of
# states per GPU. (Groups of 64 fit, but then the groups' own rings span 8 nodes and their
# bytes leave nodes as ZeRO-3's do: a group must fit in a node to keep its traffic there.)
# ZeRO-3 fits with room; at A = 2 its bytes per GPU are still 3·A·Ψb, about 2 TB a step —
# they don't shrink with N (measured above: O(P)) — and whether its gathers overlap with
# compute depends on the link: the line above compares what a GPU would need with what the
# planner assumes. hpZ fits (ZeRO-3's states plus the 44 GB secondary copy) and, at A = 2,
# takes half of ZeRO-3's bytes off the nodes' links: of 3A = 6 crossings per step, one gather
# and two reduce-scatters remain. tp 8 × dp 128 doesn't fit; tp 16 fits but its
# all-reduces leave the node (the link time jumps). The pipelines fit with the fewest bytes;
# with 128 or 256 micro-batches per step their bubble is about 5 %, and the planner's link
# estimate does not include it, so weigh the two.
#
# The guide, each step backed by something measured above or in the earlier lessons:
#
# 1. **Does the model fit with plain data parallelism?** Per rank that is the whole model
#    (16Ψ bytes of states with Adam, plus activations). If yes, use DDP — or ZeRO-1/2, which
#    send the **same bytes** (measured equal in lessons 04–05) and free memory for a larger
#    micro-batch.
# 2. **States don't fit: shard them along dp.** ZeRO-1, then ZeRO-2; then the parameters too.
#    If 16Ψ/g fits on a GPU (g = a node's GPUs), **HSDP** keeps the gathers in the node and
#    crosses nodes once a step; if not, ZeRO-3 over every rank — 1.5 × DDP's bytes per
#    micro-batch (measured above) — with **hpZ** where a 2Ψ/g secondary copy fits. Offload
#    (lesson 09) trades GPU memory for PCIe.
# 3. **Activations, or one layer, too large — or the dp traffic too much for the inter-node
#    link: add tensor parallelism inside the node.** tp divides states and activations, but
#    all-reduces `b·s·h` four times per layer: keep tp ≤ the GPUs that share NVLink (tp 16
#    across two nodes: the planner's link time jumps).
# 4. **Still too large: add pipeline stages across nodes.** pp sends only point-to-point
#    activations at stage boundaries (the smallest traffic in every table above) but idles
#    `(p − 1)/(m + p − 1)` of the step (lesson 08 has Megatron's form too): keep m ≥ 4p, use
#    1F1B for memory (lesson 08), interleaving or zero-bubble schedules for time. Only ZeRO-1
#    goes with it.
# 5. **Then let the planner rank what fits** — `zerokit plan --preset … --gpus …` or
#    `zerokit.plan(...).advise()`, which ranks DDP, ZeRO-1–3, HSDP and hpZ together — and
#    measure the chosen layout small, as above, before spending the cluster.
#
# The planner panel puts steps 1–2 on sliders for real models (memory per GPU by strategy):

# %%
course.PlanPanel(preset="llama-13b", gpus=8, gpu_memory_gb=80, strategy="zero1", micro_batch_size=1,
                 checkpointing="full")

# %% [markdown]
# ## Try it: the grid panel
#
# Set the degrees of dp, cp, ep, tp and pp (at most 8 ranks: dp · cp · tp · pp, ep carved from
# dp), the ZeRO stage on the data-parallel group and, with cp above 1, ring attention or Ulysses.
# Each change trains the tiny GPT with experts on that mesh for a step — real ranks, real
# ledgers — and draws each rank's model states (stacked by category, the formula as a tick) and
# its bytes on every axis the run used (the ledger's bars next to the formula's hatched ones),
# each rank labelled with its coordinates. It opens on the dp 2 × ep 2 × tp 2 run above.
# Set ep to 1 and the experts' gradients join dp's bars; then watch the optimizer states halve
# when dp goes from 1 to 2 under ZeRO-1, and the dp bars grow by half when ddp becomes zero3.
# Cut the sequence (cp 2) and `dp_cp` takes dp's place; switching ring to Ulysses changes only
# the cp bars. Every combination zerokit refuses — ep or cp with a pipeline, ep with cp, Ulysses
# on heads cp · tp does not divide, ZeRO-2 or 3 with a pipeline — shows its reason in the
# status line and runs nothing.

# %%
panel = course.GridPanel(moe, dp=2, ep=2, tp=2, pp=1, stage="zero1", micro_batches=M,
                         report=five["dp 2 × ep 2 × tp 2, experts"])
panel

# %% [markdown]
# ## Summary
#
# - A 2 × 2 × 2 mesh of 8 ranks (ZeRO-1 on dp, Megatron TP on tp, 1F1B on pp) trains the
#   model one process trains (the same losses, parameters within 1e-5); every rank's model
#   states and every axis's bytes equal `zerokit.theory`'s, to the byte.
# - ZeRO shards along dp only: the optimizer states of a rank's (tp, pp) shard divided by dp;
#   with a pipeline zerokit takes ZeRO-1 at most (ZeRO-2/3 refused, as DeepSpeed's PipelineEngine refuses them);
#   torchtitan runs FSDP2 with pipeline parallelism, reduce-scattering once per step.
# - The seed's table, measured on one model: data parallelism is O(P) per rank, ZeRO-3 O(P/N)
#   in memory but 1.5 × DDP in traffic (not O(P/N)); model parallelism divides the states by
#   tp × pp and sends activations; only a pipeline idles, (p − 1)/(m + p − 1).
# - Five axes, each cutting one thing: dp the batch, cp the sequence, ep the experts (carved
#   from dp, no ranks of its own), tp the hidden size and heads, pp the layers; each exchanges on
#   its own group (the gradients on dp × cp once cp cuts the sequence, the experts' on `edp`
#   when dp > ep). dp 2 × ep 2 × tp 2 (with experts) and cp 2 × tp 2 (without) train the model
#   one process trains, every axis's bytes equal to its formula; zerokit refuses cp with pp and ep with cp or pp — its
#   current choice, not the field's (Megatron-Core runs them together).
# - Choose by memory first, then by which link each axis crosses, at the global batch the
#   recipe fixes: DDP/ZeRO-1/2 while states fit; HSDP when 16Ψ/g fits a GPU (one all-reduce
#   across nodes a step), else ZeRO-3 (1.5 × DDP's bytes per micro-batch), with hpZ to keep
#   every gather after the step's first in the node, or offload; TP inside a node, PP across nodes with m ≫ p; and
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
# 2. *You have 1024 GPUs, 8 per node, and a 175 B model. Why tp = 8 and not 16, and what
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
#
# 3. *Your 7 B model trains with ZeRO-3 on 64 GPUs (8 per node) and the inter-node link is
#    the bottleneck. What do you change, and what does it cost?*
#
#    <details><summary>Answer</summary>
#
#    Shard inside the node and replicate across: HSDP (FSDP2 with a 2-D mesh, DeepSpeed's
#    MiCS). Gathers and reduce-scatters then ride NVLink and only the gradient shard crosses
#    nodes, once a step — about DDP's bytes leaving a node, against ZeRO-3's 1.5 × DDP's per
#    micro-batch (13.5 × less at 8 micro-batches, in the table above). The cost is memory:
#    16Ψ/8 = 14 GB of states per GPU instead of 16Ψ/64. If that does not fit, ZeRO++'s hpZ
#    keeps ZeRO-3's sharding, adds a 2Ψ/8 secondary copy, and serves every gather after the
#    step's first from inside the node: (1 + A)/(3A) of ZeRO-3's crossing bytes, 3/8 at A = 8. Where 4Ψ + 12Ψ/N and the activations fit,
#    ZeRO-1 with gradient accumulation also crosses nodes once a step.
#
#    </details>

# %% [markdown]
# **Exercise:** [exercises/09_predict.ipynb](../exercises/09_predict.ipynb) — predict a rank's
# ZeRO-1 bytes, ZeRO-3's bytes per step and a 1F1B bubble before a run shows them, graded by
# `zerokit grade 09` · **Next:** [lesson 12 — the interview](12_the_interview.ipynb); HSDP and
# hpZ, planned here, are run and measured in [lesson 17 — beyond one node](17_beyond_one_node.ipynb)
