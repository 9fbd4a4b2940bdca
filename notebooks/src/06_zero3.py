# %% [markdown]
# # 06 · ZeRO-3: sharding the parameters — prefetch, reshard_after_forward and the 1.5× traffic
#
# **The question.** The seed (the interview article the course answers, [docs/seed.md](../docs/seed.md))
# makes three claims about ZeRO-3: per-GPU memory is *"(parameters + gradients + optimizer
# states)/N + temporary buffers"* (“(模型参数 + 梯度 + 优化器状态)/N + 临时缓存”); its
# communication is *O(P/N)*; and in one case study it moves *"92 % less communication than a
# conventional all-reduce"* (“通信量减少92%（相比传统AllReduce）”). Which of these hold? What
# does a ZeRO-3 rank hold at its peak, what does it send, and what do prefetching and
# `reshard_after_forward` trade? And its follow-up, *"How does ZeRO handle a dynamic computation
# graph?"* (“ZeRO如何处理动态计算图？”): what happens to ZeRO-3 when the model's forward takes a
# branch chosen by the input?
#
# **Time:** about 35 min to read and run (the run itself: 11 s on a 2-core laptop) ·
# **Needs:** lessons 01 (the ring), 02 (training memory), 03 (timelines, the emulated link) and
# 04–05 (ZeRO-1 and 2), nothing else · **After it you can answer:** *How much does ZeRO-3 communicate
# compared with DDP, and what do prefetch and reshard_after_forward change?* · *ZeRO-3 on 8 GPUs:
# is memory per GPU 16Ψ/8?* · *How does ZeRO-3 handle a dynamic computation graph?*
#
# **What you will see.** ZeRO-3 (`zero3`) next to DDP on 2, 3 and 4 ranks: model states at
# `16Ψ/N`, measured; the traffic — the ring cost of the payloads the ledger measured — at
# `3(N−1)/N·Ψb`, 1.5× DDP's, flat in N; each rank's peak with the gathered parameters on
# top of the shards; the four combinations of `prefetch` and `reshard_after_forward`; prefetch
# behind an emulated 1 GbE link; a model whose branch changes with its input, and what the
# prefetcher does about it; and the seed's numbers, checked.

# %%
%matplotlib inline
import statistics

import matplotlib
import torch
import torch.nn as nn
import torch.nn.functional as F

import zerokit
from zerokit import course, theory
from zerokit.cli import compare
from zerokit.workloads import Block, Workload
from zerokit.zero.units import form_units

matplotlib.rcParams["figure.dpi"] = course.DPI
work = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=12)
psi = work.param_count()
b = theory.param_bytes_per_element("bf16-mixed")
print(f"{work.description}\nΨ = {psi:,} parameters")


def spread(times):
    """The relative spread of some step times: interquartile range over median."""
    q = statistics.quantiles(times, n=4)
    return (q[2] - q[0]) / statistics.median(times)

# %% [markdown]
# ## The lifecycle of a unit
#
# ZeRO-3 (§5.3, P_os+g+p) shards the parameters too: at rest, a rank holds one N-th of
# everything. To compute, it gathers parameters back in groups — **units** — and frees them
# after use. How the libraries form the units:
#
# - **FSDP2**: each `fully_shard(module)` call makes one unit, of the module's parameters that
#   no inner call claimed. The usual wrapping is one call per transformer block, then one on the
#   root (embeddings, final norm, head).
# - **DeepSpeed ZeRO-3**: nothing to wrap. It hooks every module, and when a module's forward
#   begins it fetches that module's *own* parameters (a leaf module — `set_z3_leaf_modules`, or
#   `stage3_module_granularity_threshold` — brings its whole subtree). What is fetched ahead is set
#   by its trace of the module order and `stage3_prefetch_bucket_size` (both below).
# - **zerokit's choice**: `unit_size="block"` by default — one unit per repeated block, the root
#   taking the rest — FSDP2's usual wrapping; `unit_size=0` makes every module with parameters of
#   its own a unit, DeepSpeed's granularity. Each unit is one flat buffer.
#
# For every unit, every step:
#
# 1. before its forward: **all-gather** the unit; 2. after its forward: **free** it;
# 3. before its backward: **all-gather** it again; 4. after its backward: **reduce-scatter**
#    its gradients into the own shard, and free the gathered parameters.
#
# Two gathers and one reduce-scatter, each `(N−1)/N` of the unit on a ring: `3(N−1)/N·Ψb`
# per step. The tables below show the **ring cost**: that ring formula applied to the
# payloads the ledger measured (why not gloo's own bytes or times: [lesson 01, why gloo's times
# are not a ring's](01_collectives.ipynb#Why-gloo's-times-are-not-a-ring's)).

# %%
runs = {n: compare(work, n, ["single", "ddp", "zero3"], steps=2, precision="bf16-mixed") for n in (2, 3, 4)}
rows = []
for n, report in runs.items():
    ddp, zero3 = report["ddp"].ranks[0], report["zero3"].ranks[0]
    rows.append({"N": n, "ZeRO-3 states B (measured)": sum(zero3.model_state_bytes.values()),
                 "16Ψ/N B (paper)": theory.paper_model_state_bytes(3, psi, n),
                 "ZeRO-3 ring cost B/step": zero3.comm_ring_cost_bytes_per_step,
                 "DDP ring cost B/step": ddp.comm_ring_cost_bytes_per_step,
                 "ZeRO-3 ÷ DDP": round(zero3.comm_ring_cost_bytes_per_step / ddp.comm_ring_cost_bytes_per_step, 4)})
course.table(rows)

# %% [checks]
for n, report in runs.items():
    zero3 = report["zero3"]
    assert zero3.param_diff["max_rel"] <= 1e-2  # the same training, to bf16 rounding
    for rank in zero3.ranks:
        assert rank.model_state_bytes == {k: rank.theory_model_states[k] for k in ("params", "grads", "optimizer")}
        assert rank.comm_ring_cost_bytes_per_step == rank.theory_comm_bytes_per_step
        total = sum(rank.model_state_bytes.values())
        assert abs(total - theory.paper_model_state_bytes(3, psi, n)) / total < 0.01  # 16Ψ/N, up to padding
    ratio = zero3.ranks[0].comm_ring_cost_bytes_per_step / report["ddp"].ranks[0].comm_ring_cost_bytes_per_step
    assert abs(ratio - theory.comm_bytes_per_step(3, psi, n, b) / theory.comm_bytes_per_step(0, psi, n, b)) < 0.01
    assert abs(ratio - 1.5) < 0.01

# %% [markdown]
# **Check yourself.** How many times DDP's bytes does ZeRO-3 send per step? Predict it, then run the cell: it prints its
# verdict, and stops with an `AssertionError` if the run disagrees.

# %%
n_most = max(runs)
zero3_sent, ddp_sent = (runs[n_most][s].ranks[0].comm_ring_cost_bytes_per_step for s in ("zero3", "ddp"))
print(f"N = {n_most}: ZeRO-3 sends {zero3_sent / ddp_sent:.3f} × DDP's bytes per step — "
      f"{'1.5 ×, as predicted' if abs(zero3_sent / ddp_sent - 1.5) < 0.01 else 'not 1.5 ×'}")
assert abs(zero3_sent / ddp_sent - 1.5) < 0.01

# %%
ns = list(runs)
course.volume_figure(
    {"DDP": {"N": ns, "ring_cost": [runs[n]["ddp"].ranks[0].comm_ring_cost_bytes_per_step / 1024 for n in ns],
             "theory_N": list(range(2, 17)), "theory": [theory.comm_bytes_per_step(0, psi, n, b) / 1024 for n in range(2, 17)]},
     "ZeRO-3": {"N": ns, "ring_cost": [runs[n]["zero3"].ranks[0].comm_ring_cost_bytes_per_step / 1024 for n in ns],
                "theory_N": list(range(2, 17)), "theory": [theory.comm_bytes_per_step(3, psi, n, b) / 1024 for n in range(2, 17)]}},
    ylabel="KiB per rank per step (ring)",
    title="ring cost of the measured payloads per rank per step: ZeRO-3 = 1.5 × DDP at every N")

# %% [markdown]
# ZeRO-3's traffic is **not** O(Ψ/N): its ring cost tends to `3Ψb` per rank, flat in N, and
# is exactly 1.5× DDP's at every N. The memory is what divides by N — the traffic doesn't.
#
# ## What a rank holds at its peak
#
# `16Ψ/N` is the model states *at rest*. To compute a unit, a rank needs the whole unit, so
# at its peak it also holds the gathered parameters — the unit being computed and those
# prefetched ahead — and the activations, which ZeRO doesn't shard at all (all measured):

# %%
model = work.build_model()
largest_unit = max(sum(p.numel() for p in params) for _, _, params in form_units(model, "block", set()))
rows = []
for n, report in runs.items():
    for name in ("ddp", "zero3"):
        rank0 = report[name].ranks[0]
        rows.append({"N": n, "strategy": name, "peak B": rank0.peak_bytes,
                     "gathered params at peak B": rank0.peak_breakdown["params"] - rank0.model_state_bytes["params"],
                     "activations at peak B": rank0.peak_breakdown["activations"], "peak at": rank0.peak_where})
course.table(rows)

# %% [checks]
for n, report in runs.items():
    for rank in report["zero3"].ranks:
        gathered = rank.peak_breakdown["params"] - rank.model_state_bytes["params"]
        assert gathered >= b * largest_unit  # at least one whole unit in flight on top of the shard
        assert rank.peak_breakdown["activations"] > 0
        assert rank.peak_bytes > sum(rank.model_state_bytes.values())

# %% [markdown]
# Why does ZeRO-3's activations column read *less* than DDP's, when ZeRO doesn't shard
# activations? The table splits each rank's **peak** — the moment its total was highest — by
# category. DDP's total peaks right after forward, every activation alive. ZeRO-3's peaks
# later, in backward, when a unit gathered for its backward comes on top of the shards: by then
# backward has freed the activations of the layers behind it. Each category's own peak over the
# step (`peak_by_category`) tells the two apart:

# %%
acts = []
for n, report in runs.items():
    for name in ("ddp", "zero3"):
        rank0 = report[name].ranks[0]
        acts.append({"N": n, "strategy": name, "peak at": rank0.peak_where,
                     "activations at the peak B": rank0.peak_breakdown["activations"],
                     "activations, own peak B": rank0.peak_by_category["activations"],
                     "freed before the peak B": (rank0.peak_by_category["activations"]
                                                 - rank0.peak_breakdown["activations"])})
display(course.table(acts))
low = {a["strategy"]: a for a in acts if a["N"] == min(runs)}
course.show(f"At N = {min(runs)}, ZeRO-3's rank 0 peaks at `{low['zero3']['peak at']}`, with "
            f"{low['zero3']['freed before the peak B']:,} B of its activations already freed: "
            f"{low['zero3']['activations at the peak B']:,} B are left of their own peak, "
            f"{low['zero3']['activations, own peak B']:,} B — DDP's {low['ddp']['activations, own peak B']:,} B, "
            f"to the byte. ZeRO doesn't shard activations; its peak comes later, when some are gone.")

# %% [checks]
peak_table = {(r["N"], r["strategy"]): r["activations at peak B"] for r in rows}  # the table above
for a in acts:
    assert a["activations at the peak B"] == peak_table[(a["N"], a["strategy"])]  # the numbers explained are its
for n, report in runs.items():
    ddp, zero3 = (report[name].ranks[0] for name in ("ddp", "zero3"))
    assert zero3.peak_by_category["activations"] == ddp.peak_by_category["activations"]  # not sharded: the same
    assert ddp.peak_breakdown["activations"] == ddp.peak_by_category["activations"]  # DDP's peak holds all of them
    assert zero3.peak_where.startswith("backward")  # later than DDP's, some activations already freed
    assert zero3.peak_breakdown["activations"] < ddp.peak_breakdown["activations"]

# %%
ax = course.peak_bars(zerokit.Report([runs[4]["ddp"], runs[4]["zero3"]]))
ax.set_title("N = 4, bf16-mixed: each rank at its peak; the line is the model states at rest", fontsize=9)
ax.figure

# %% [markdown]
# So the seed's `(P + G + O)/N + buffers` is right for the model states and needs two more
# terms at the peak: the gathered units (bounded by the prefetch budget) and the
# activations (bounded by the micro-batch, and by checkpointing — not by N).
#
# ## prefetch and reshard_after_forward
#
# - **prefetch**: from the second step on, ZeRO-3 knows the order the units run in (it
#   recorded the first step's: its **trace**), and launches the gathers of the next units while
#   the current one computes. More gathered parameters are held at once; the wait before a unit
#   shrinks where the gather takes long enough to be worth overlapping.
# - **reshard_after_forward = False**: keep each unit gathered from its forward to its
#   backward (ZeRO-2-like memory for parameters): one gather per step instead of two, so
#   `2(N−1)/N·Ψb` — DDP's traffic — for more memory.
#
# **Predict before you run.** All four combinations, 2 ranks, 3 steps. Does turning prefetch
# on change the bytes a rank sends per step? And how many all-gathers does prefetch put in
# flight at once, on this model of three units (two blocks and the root)?
#
# <details><summary>Answer</summary>
#
# No byte changes: the ring cost column is the same with and without prefetch, and only
# `reshard_after_forward=False` lowers it (3 → 2 gathers' worth). In flight: 1 without
# prefetch, 3 with it — the root, the unit computing and the next one — the "in flight" column.
#
# </details>

# %%
combos = [(prefetch, reshard) for reshard in (True, False) for prefetch in (False, True)]
grid = {(prefetch, reshard): zerokit.train(work, "zero3", world_size=2, steps=3, precision="bf16-mixed",
                                           keep_records=True, reference=False, prefetch=prefetch,
                                           reshard_after_forward=reshard)
        for prefetch, reshard in combos}
rows = []
for (prefetch, reshard), report in grid.items():
    rank0 = report.result.ranks[0]
    rows.append({"prefetch": prefetch, "reshard_after_forward": reshard,
                 "ring cost B/step": rank0.comm_ring_cost_bytes_per_step,
                 "all-gathers in flight (max)": course.max_in_flight(rank0, "all_gather", step=2),
                 "peak B": max(r.peak_bytes for r in report.result.ranks)})
course.table(rows)

# %% [checks]
for (prefetch, reshard), report in grid.items():
    for rank in report.result.ranks:
        assert rank.comm_ring_cost_bytes_per_step == rank.theory_comm_bytes_per_step
        in_flight = course.max_in_flight(rank, "all_gather", step=2)
        assert (in_flight > 1) if prefetch else (in_flight == 1)  # prefetch = the next gathers launched ahead
cost = {key: r.result.ranks[0].comm_ring_cost_bytes_per_step for key, r in grid.items()}
peak = {key: max(x.peak_bytes for x in r.result.ranks) for key, r in grid.items()}
assert cost[(False, True)] / cost[(False, False)] == 3 / 2  # two gathers per step, or one
assert cost[(True, True)] == cost[(False, True)]             # prefetch moves no byte
assert peak[(True, True)] > peak[(False, True)]              # prefetched units are held early
assert peak[(False, False)] > peak[(False, True)]            # kept units are held until backward

# %% [markdown]
# Prefetch changes *when* bytes move and *how much is held*, never how many; only
# `reshard_after_forward` changes the bytes (3 → 2). These runs keep the memory ledger on
# every allocation, so their step times measure the ledger more than the step: they are not shown.
#
# ## Prefetch behind an emulated link
#
# What prefetch buys is time, and only where a gather takes long next to the compute it could
# overlap. Here the ranks talk over shared memory, and a unit of this small model is 25 KB in
# bf16: little for a gather to take, and little to overlap. So, as in lesson 03, the ranks sit
# behind an emulated **1 GbE**
# link (`link="1gbe"`: each collective runs for real on gloo, and completes when the link's
# `rounds·α + bytes/bandwidth` has passed), with a wider model — 4 blocks of width 128, fp32 —
# whose blocks take the link a few milliseconds each. No memory ledger, 5 steps, medians over
# steps 1–4:

# %%
wide = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=128, n_layer=4, n_head=4, batch_size=12)
steady = range(1, 5)
linked = {f"prefetch={p}, 1gbe": zerokit.train(wide, "zero3", world_size=2, steps=5, keep_records=True,
                                               reference=False, track_peak=False, prefetch=p, link="1gbe")
          for p in (False, True)}
gathers = [c for c in linked["prefetch=False, 1gbe"].result.ranks[0].comm_records
           if c["op"] == "all_gather" and c["step"] == 4 and c["tag"].startswith("params blocks")]
print(f"one block's all-gather holds the link {1e3 * gathers[0]['emulated_s']:.1f} ms (formula: "
      f"{gathers[0]['ring_cost_bytes']:,} B of ring cost at 125 MB/s, plus α)")
course.table([{"run": label, **{k: round(v, 1) for k, v in row.items()}}
              for label, r in linked.items() for row in course.timeline_stats(r, steady)],
             ["run", "rank", "step ms", "exposed ms", "emulated held ms", "straggler wait ms"])

# %%
off, on = ([r.result.ranks[0].step_times_s[k] for k in steady] for r in linked.values())
course.show(course.speed_sentence(
    "prefetch", statistics.median(on), "no prefetch", statistics.median(off), spread=max(spread(on), spread(off)),
    elsewhere="Where the link is fast next to a unit's compute (NVLink inside a node, for a small model), there is "
              "little to overlap and prefetch mostly costs memory; where it is slow (across nodes, for large units), "
              "each gather it launches early can overlap the compute of the unit before it."))
link_stats = {label: course.timeline_stats(r, steady) for label, r in linked.items()}
held = {label: sum(row["emulated held ms"] for row in rows) / sum(row["exposed ms"] for row in rows)
        for label, rows in link_stats.items()}  # the table's two columns, summed over the ranks
off_share, on_share = held["prefetch=False, 1gbe"], held["prefetch=True, 1gbe"]
course.show(f"Without prefetch the link's hold (the table's \"emulated held\") was {course.share_words(off_share)} "
            f"the exposed time ({off_share:.0%} over both ranks; the rest is gloo's own time and the straggler waits); "
            f"with prefetch, {course.share_words(on_share)} it ({on_share:.0%}).")

# %%
course.timeline_figure(linked, steps=range(4, 5))

# %% [checks]
gbe = zerokit.links.LINKS["1gbe"]
for label, r in linked.items():
    for rank in r.result.ranks:
        train = [c for c in rank.comm_records if c["phase"] != "setup"]
        assert all(c["link"] == "1gbe" and abs(c["emulated_s"] - theory.link_seconds(
            c["ring_cost_bytes"], theory.ring_steps(c["op"], 2), gbe.bandwidth_Bps, gbe.alpha_s)) < 1e-9 for c in train)
        assert rank.comm_ring_cost_bytes_per_step == rank.theory_comm_bytes_per_step
        in_flight = course.max_in_flight(rank, "all_gather", step=4)
        assert (in_flight > 1) if "True" in label else (in_flight == 1)

# %% [markdown]
# Without prefetch each unit's gather is launched when the unit begins and waited for at once:
# the whole link time of every gather is exposed — slept as the link's hold, or waited while a
# peer is still in its own (the table's columns; the second sentence above says how much of the
# exposed time was the hold). With prefetch the next gathers are launched while the current
# unit computes, and a unit waits only for what the link has not finished by then. The
# sentences above are chosen by this run's numbers; the grey link bars in the picture show why.
#
# ## How far ahead: the prefetch budget
#
# The runs above prefetched with a budget (`prefetch_bucket_size`, in elements, as
# DeepSpeed's `stage3_prefetch_bucket_size`) far above Ψ: every unit may be launched ahead,
# which is prefetch's extreme. The budget caps the elements of the gathers in flight. This
# model's units are its two blocks and the root (below); sweep budgets **below Ψ** and watch
# the gathers in flight, and the gathered parameters a rank holds at its peak, change.
# Next to them, the term DeepSpeed's ZeRO-3 estimator adds for what is gathered:
# **4 × the largest layer** (`theory.deepspeed_zero3_estimate`: `4·L` bytes, L the largest
# module's own parameter count).

# %%
units = [sum(p.numel() for p in params) for _, _, params in form_units(model, "block", set())]
largest_layer = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
deepspeed_gathered = theory.deepspeed_zero3_estimate(psi, largest_layer, gpus_per_node=2)[2]
budgets = [2_048, 13_000, 50_000_000]
sweep = {budget: zerokit.train(work, "zero3", world_size=2, steps=3, precision="bf16-mixed", keep_records=True,
                               reference=False, prefetch=True, prefetch_bucket_size=budget)
         for budget in budgets}
print(f"units (elements): {units}; Ψ = {psi:,}; largest layer L = {largest_layer:,} parameters; "
      f"DeepSpeed's 4 × largest layer = {deepspeed_gathered:,} B (formula)")
rows = []
for budget, report in sweep.items():
    rank0 = report.result.ranks[0]
    rows.append({"prefetch budget (elements)": budget, "budget ÷ Ψ": round(budget / psi, 2),
                 "all-gathers in flight (max)": course.max_in_flight(rank0, "all_gather", step=2),
                 "gathered params at peak B": rank0.peak_breakdown["params"] - rank0.model_state_bytes["params"],
                 "peak B": max(r.peak_bytes for r in report.result.ranks)})
course.table(rows)

# %% [checks]
in_flight = [row["all-gathers in flight (max)"] for row in rows]
gathered = [row["gathered params at peak B"] for row in rows]
assert in_flight == sorted(in_flight) and len(set(in_flight)) == 3  # the budget sets how many gathers run ahead
assert gathered == sorted(gathered)                                # and how much a rank holds at its peak
assert gathered[0] >= b * max(units)                               # at least the unit being computed
assert gathered[-1] == b * theory.padded_numel(units, 2)            # budget > Ψ: the whole model gathered
for rank in (r for report in sweep.values() for r in report.result.ranks):
    assert rank.comm_ring_cost_bytes_per_step == rank.theory_comm_bytes_per_step  # the budget moves no byte
assert all(g > deepspeed_gathered for g in gathered)               # whole blocks gathered, not single layers

# %% [markdown]
# A budget below one block (2,048) launches nothing ahead: one gather in flight, as without
# prefetch. A budget that fits one block runs one gather ahead (2 in flight); one above Ψ lets
# every unit of this small model run ahead (3 in flight). The gathered parameters at the peak
# follow: the root and one block with nothing ahead, the whole model as soon as one gather runs
# ahead (three units: the root, the block computing, the next one). The bytes per step never
# change. (All measured, by the ledgers.)
#
# DeepSpeed's `4 × largest layer` is smaller than every measured row: DeepSpeed fetches module
# by module — each module's own parameters, its largest layer here the MLP's first linear —
# while zerokit's units are whole blocks, three times that size, and a rank holds the unit it
# computes plus what its budget lets run ahead. An estimate's "+ buffers" term is only as good
# as its idea of what is gathered at once: ask what the unit is, and what the prefetch budget
# allows.
#
# ## A dynamic graph: the branch changes, the trace is stale
#
# The seed's follow-up *"How does ZeRO handle a dynamic computation graph?"* (“ZeRO如何处理动态
# 计算图？”) gets the answer *"use static shapes to avoid frequent all-gathers; enable
# torch.compile to optimise the dynamic sharding path"*. What a data-dependent branch really does
# to ZeRO-3 is to its **trace**: prefetch walks the order the units ran in, and a branch chosen
# by the input changes that order.
#
# The model: a trunk of two blocks, then **one of two task blocks, chosen by the batch's first
# token** (a task id), then the head — a Python `if` on a tensor's value, as a multi-task model,
# a mixture of experts or a layer-skipping model has. zerokit cuts it into five units
# (`trunk.0`, `trunk.1`, `tasks.0`, `tasks.1` and the root). Each global batch is one task, so
# every rank takes the same branch — this matters: a unit's gather is a collective, and ranks
# that gather different units pair the wrong calls (an error or a hang). The tasks per step are
# 0, 0, 1, 1, 0, 0; the ranks sit behind the emulated 1 GbE link again, so a gather waited for on
# demand shows up as exposed time.
#
# What zerokit's prefetcher does with its trace (`zerokit/zero/trace.py`), as DeepSpeed's does:
# **record** the order units begin in, per phase, during the first step; **follow** it, comparing
# each unit that begins with the one the trace expects; at the first mismatch **invalidate** it
# for the rest of the pass — free what it prefetched for the stale branch, gather the remaining
# units on demand — and **re-record**: the order this pass ran becomes the trace (zerokit's
# choice: the diverging pass's own order, so the very next step prefetches again).

# %%
VOCAB, SEQ, WIDTH, BATCH = 64, 16, 128, 12
TASKS = [0, 0, 1, 1, 0, 0]  # the task of each step's batch


class TaskRouted(nn.Module):
    """A trunk of two blocks, then the block of the batch's task (its first token), then the head."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.trunk = nn.ModuleList(Block(WIDTH, 4) for _ in range(2))
        self.tasks = nn.ModuleList(Block(WIDTH, 4) for _ in range(2))
        self.ln_f, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.trunk:
            x = block(x)
        x = self.tasks[int(idx[0, 0])](x)  # data-dependent: the input picks the block
        return self.head(self.ln_f(x))


def task_batch(step):
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(2, VOCAB, (BATCH, SEQ + 1), generator=g)
    tokens[:, 0] = TASKS[step]  # the whole global batch is one task
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


routed = Workload("task-routed", TaskRouted, task_batch,
                  lambda logits, targets: F.cross_entropy(logits.flatten(0, 1), targets.flatten()))
print([label for _, label, _ in form_units(routed.build_model(), "block", set())])

# %% [markdown]
# **Predict before you run.** Every step runs four units — the root, the two trunk blocks and
# one task block — and gathers each twice (forward and backward): 8 all-gathers. At step 2
# the input picks `tasks.1`, while the trace (recorded at step 0) expects `tasks.0`. How many
# all-gathers does step 2 launch, and how many step 3, the second step on task 1?
#
# <details><summary>Answer</summary>
#
# 9 and 8: at step 2 the prefetcher, following its trace, had launched `tasks.0`'s gather while
# `trunk.1` computed; `tasks.1` began instead, the trace was invalidated and `tasks.0` freed
# unused — one extra gather. Step 2's order was re-recorded, so step 3 gathers exactly what it
# runs. Step 4, back on task 0, pays the extra gather once more (the table's "extra" column).
#
# </details>

# %%
dynamic = zerokit.train(routed, "zero3", world_size=2, steps=len(TASKS), keep_records=True, reference=False,
                        track_peak=False, link="1gbe")
rank0 = dynamic.result.ranks[0]
gathered = [c for c in rank0.comm_records if c["op"] == "all_gather" and c["tag"].startswith("params ")]
first = sorted((c for c in gathered if c["step"] == 0), key=lambda c: c["t_launch"])
for phase in ("forward", "backward"):
    print(f"the {phase} order recorded at step 0 (the trace): "
          + " → ".join(c["tag"].removeprefix("params ") for c in first if c["phase"] == phase))
rows = []
for step, task in enumerate(TASKS):
    calls = [c for c in gathered if c["step"] == step]
    rows.append({"step": step, "task": task, "all-gathers": len(calls), "extra all-gathers": len(calls) - 2 * 4,
                 "exposed all-gather ms": round(1e3 * sum(c["blocked_s"] for c in calls), 1),
                 "step ms": round(1e3 * rank0.step_times_s[step], 1)})
course.table(rows)

# %%
followed = [rank0.step_times_s[s] for s in (1, 3, 5)]
diverged = [rank0.step_times_s[s] for s in (2, 4)]
course.show(course.speed_sentence(
    "a step that followed its trace", statistics.median(followed),
    "a step that invalidated it", statistics.median(diverged), spread=max(spread(followed), spread(diverged)),
    elsewhere="(Medians of steps 1, 3, 5 and of steps 2, 4.) Where gathers are cheap next to the compute (a fast "
              "link, large units' compute), an invalidated step would cost little more than the extra gather's "
              "bytes; where they are slow, each invalidation exposes the rest of that pass's gathers."))

# %% [checks]
extra = [row["extra all-gathers"] for row in rows]
assert extra == [0, 0, 1, 0, 1, 0]  # one stale gather at each change of branch, none once re-recorded
for step in (2, 4):
    stale = [c["tag"] for c in gathered if c["step"] == step]
    assert stale.count(f"params tasks.{1 - TASKS[step]}") == 1  # the stale task's block, in forward only
assert [c["tag"] for c in first if c["phase"] == "forward"] == ["params TaskRouted", "params trunk.0",
                                                               "params trunk.1", "params tasks.0"]
for rank in dynamic.result.ranks:
    assert all(c["link"] == "1gbe" for c in rank.comm_records if c["phase"] != "setup")

# %% [markdown]
# Step 0 records: nothing is prefetched, every gather waits for the link. Steps 1, 3 and 5
# follow their trace. Steps 2 and 4 diverge at the task block: one gather wasted on the stale
# task (its bytes crossed the link for nothing), and the rest of that pass — the new task block,
# and the whole backward, whose order came from the same stale pass — gathered on demand.
#
# **What DeepSpeed does.** Its `PartitionedParameterCoordinator` records the order in which
# modules are fetched during one forward and backward (the *trace*) and prefetches parameters
# along it, up to `stage3_prefetch_bucket_size` elements. As each module begins,
# `trace_prologue` compares it with the trace; on a mismatch it invalidates the trace — the
# message `Invalidate trace cache @ step …: expected module …, but got module …` that users of
# conditional models see in their logs — frees what it had prefetched, and fetches on demand
# for the rest of the pass. The next pass records a new trace and the one after prefetches from
# it: one step later than zerokit's choice above. When it records a trace it also checks that
# every rank recorded the same module order (zerokit does not). For mixture-of-experts layers,
# whose expert order changes from pass to pass, `deepspeed.utils.set_z3_leaf_modules` marks a
# module as a leaf: its whole subtree is fetched when it begins, so the order the trace sees is
# static again — more bytes gathered (every expert) for no invalidations.
#
# **What FSDP2 does.** No recorded order in forward: its default ("implicit") prefetch issues a
# unit's all-gather when the unit's forward is reached, on a separate CUDA stream, so the gather
# can overlap the compute the CPU already queued — correct for any branch. In backward it
# prefetches the unit before the current one in *this* iteration's forward order, rebuilt every
# iteration. The explicit lists, `set_modules_to_forward_prefetch` and
# `set_modules_to_backward_prefetch`, are yours and static; PyTorch's FSDP notes say explicit
# forward prefetch should only be used for models whose execution order is fixed from iteration
# to iteration (a "static graph"). A list entry is gathered whether or not the step then runs it.
#
# **torch.compile's role.** A Python `if` on a tensor's value — `self.tasks[int(idx[0, 0])]` —
# is a data-dependent operation: torch.compile graph-breaks there (PyTorch's "common graph
# breaks") and runs it in Python, so the branch, and the unit order it changes, stay. Branches on
# Python values or shapes are specialised and guarded instead: a new value or shape recompiles.
# `torch.cond` puts a data-dependent branch inside one graph (a prototype). Compile does not make
# ZeRO-3's unit order static.
#
# **The seed's answer, checked.** "Static shapes" do not change what ZeRO-3 gathers — a unit is
# gathered whole whatever the batch's shape; shapes matter to torch.compile (recompiles) and to
# CUDA graphs. What costs gathers is a change in the **order of units**: an invalidated trace,
# an extra gather for the stale branch and a pass gathered on demand, as measured above. What
# helps: keep the order independent of the data (the branching modules in one unit —
# DeepSpeed's leaf modules, one `fully_shard` over the routed group — at the cost of gathering
# every branch), or accept an invalidation each time the branch changes; and make every rank
# take the same branch.
#
# ## The seed's numbers
#
# The seed's case study puts GPT-2 1.5B under ZeRO-3 at 4.1 GB per GPU on 8 GPUs and T5-3B
# (about 2.85 B parameters) at 4.3 GB. The model states alone, by `16Ψ/N`:

# %%
claims = {"GPT-2 1.5B": (1_500_000_000, 4.1), "T5-3B": (2_850_000_000, 4.3)}
course.table([{"model": name, "Ψ": size, "seed's GB per GPU (N = 8)": claimed,
               "16Ψ/N model states alone (GB)": theory.paper_model_state_bytes(3, size, 8) / 1e9,
               "left for activations and gathered units (GB)": round(claimed - theory.paper_model_state_bytes(3, size, 8) / 1e9, 2)}
              for name, (size, claimed) in claims.items()])

# %% [markdown]
# The model states are only part of a GPU's memory. The planner (`zerokit.plan`: the
# formulas of `zerokit.theory`, nothing runs) adds the activations of one 1,024-token
# sequence (Korthikanti et al., with and without activation checkpointing), the buckets and
# the gathered units, on 8 GPUs of the seed's sizes (GPT-2 at 4.1 GB, T5-3B at 4.3 GB; all
# computed) — and, as a third row each, with the optimizer offloaded to the host (ZeRO-Offload,
# [lesson 09](09_offload.ipynb): the fp32 master, m and v on the host, the gradients streamed
# out to it):

# %%
rows = []
for preset, claimed in (("gpt2-1.5b", 4.1), ("t5-3b", 4.3)):
    for checkpointing, offload in (("none", "none"), ("full", "none"), ("full", "optimizer")):
        per_gpu = zerokit.plan(preset=preset, gpus=8, strategy="zero3", micro_batch_size=1, offload=offload,
                               checkpointing=checkpointing, gpu_memory=claimed * 1e9).to_dict()["per_gpu"]
        rows.append({"model": preset, "checkpointing": checkpointing, "offload": offload, "seed's GB": claimed,
                     "layout": f"checkpointing {checkpointing}" + (", optimizer offloaded" if offload != "none" else ""),
                     "model states GB": round(per_gpu["model_state_bytes"]["total"] / 1e9, 2),
                     "activations GB": round(per_gpu["activation_bytes"] / 1e9, 2),
                     "buffers GB": round(per_gpu["buffer_bytes"] / 1e9, 2),
                     "total GB": round(per_gpu["total_bytes"] / 1e9, 2), "fits": per_gpu["fits"]})
display(course.table(rows, ["model", "layout", "model states GB", "activations GB", "buffers GB", "total GB"]))
fits = {(r["model"], r["offload"]): r for r in rows if r["checkpointing"] == "full"}
t5_alone, t5_offloaded, gpt2_offloaded = fits[("t5-3b", "none")], fits[("t5-3b", "optimizer")], \
    fits[("gpt2-1.5b", "optimizer")]
t5_gb, gpt2_gb = t5_alone["seed's GB"], gpt2_offloaded["seed's GB"]
course.show(f"Without offload T5-3B's model states alone, {t5_alone['model states GB']:.2f} GB, exceed the seed's "
            f"{t5_gb} GB. With the optimizer offloaded a GPU keeps of them only its 16-bit parameter shard, "
            f"{t5_offloaded['model states GB']:.2f} GB, and the whole plan comes to {t5_offloaded['total GB']:.2f} GB: "
            + ("it fits" if t5_offloaded["fits"] else "it still does not fit") + f" in {t5_gb} GB, and GPT-2's "
            f"offloaded plan ({gpt2_offloaded['total GB']:.2f} GB) "
            + ("fits" if gpt2_offloaded["fits"] else "does not fit") + f" in {gpt2_gb} GB.")

# %% [checks]
t5 = [r for r in rows if r["model"] == "t5-3b" and r["offload"] == "none"]
assert all(not r["fits"] and r["model states GB"] > r["seed's GB"] for r in t5)  # without offload: impossible
assert t5_offloaded["fits"] and t5_offloaded["model states GB"] < t5_offloaded["seed's GB"]  # offloaded, it fits
gpt2 = [r for r in rows if r["model"] == "gpt2-1.5b" and r["offload"] == "none"]
assert all(r["model states GB"] < r["seed's GB"] for r in gpt2)  # the states fit; the rest decides
assert gpt2[1]["activations GB"] < gpt2[0]["activations GB"]     # checkpointing is what leaves room
assert fits[("gpt2-1.5b", "optimizer")]["fits"] and not fits[("gpt2-1.5b", "none")]["fits"]

# %% [markdown]
# GPT-2 1.5B is tight but possible: its model states fit in 4.1 GB, and the rest fits only with
# activation checkpointing and either buckets much smaller than DeepSpeed's defaults (the
# 2 GB of buffers above) or the optimizer offloaded to the host — `zerokit plan --preset
# gpt2-1.5b --gpus 8 --gpu-memory 4.1GB --strategy zero3 --checkpointing full` lists the
# layouts that fit. T5-3B at 4.3 GB is impossible **without offload**: its model states alone
# take more. The answer GPT-2 gets is T5-3B's too: ZeRO-Offload ([lesson 09](09_offload.ipynb))
# moves the optimizer states — three quarters of the model states — to the host, and the
# offloaded row above is what is left on the GPU (the sentence under the table says whether it
# fits). So the seed's T5-3B row is impossible under ZeRO-3 as it names it, possible as another
# layout, which pays the host's memory, PCIe every step and the host's Adam (lesson 09). And
# "92 % less communication than an all-reduce": by the ring cost of the payloads measured
# above, ZeRO-3 sends **50 % more**.
#
# ## Try it
#
# prefetch, `reshard_after_forward` and the prefetch budget (in elements): the panel trains
# ZeRO-3 on 2 ranks and redraws the last step's timeline, with each rank's peak memory on
# the right.

# %%
course.TimelinePanel(work, "zero3", controls={"prefetch": True, "reshard_after_forward": True,
                                              "prefetch_bucket_size": [1024, 4096, 16384, 50_000_000]},
                     world_size=2, steps=3, precision="bf16-mixed", show_memory=True)

# %% [markdown]
# And all four stages side by side — choose the world size and the precision:

# %%
course.MemoryPanel(work, strategies=("ddp", "zero1", "zero2", "zero3"), world_sizes=(1, 2, 3, 4), world_size=4,
                   precision="bf16-mixed", steps=2)

# %% [markdown]
# ## Summary
#
# - ZeRO-3 shards everything: `16Ψ/N` model states per rank, measured — the only stage whose
#   memory is O(Ψ/N).
# - On a ring it sends `3(N−1)/N·Ψb` per step (the ring cost of the payloads measured
#   above), **1.5× DDP at every N** — not O(Ψ/N), not 92 % less.
# - At its peak a rank also holds the gathered units and the activations; prefetch trades
#   memory for exposed time where gathers are slow next to compute (behind the emulated link
#   here), `reshard_after_forward=False` trades memory for bytes (3 → 2).
# - Units: one per `fully_shard` call in FSDP2, each module's own parameters in DeepSpeed,
#   one per block by zerokit's choice. The prefetch budget sets how many gathers run ahead;
#   DeepSpeed's `+ 4 × largest layer` assumes layer-sized fetches and is below what whole-block
#   units hold.
# - A data-dependent branch changes the unit order: the trace is invalidated, the stale gather
#   wasted, the rest of the pass gathered on demand, the new order re-recorded (zerokit, one step
#   sooner than DeepSpeed); FSDP2's default prefetch needs no recorded order in forward.
#
# ## Interview questions
#
# 1. *How much does ZeRO-3 communicate compared with DDP, and what do prefetch and
#    reshard_after_forward change?*
#
#    <details><summary>Answer</summary>
#
#    1.5×: parameters are gathered in forward and again in backward, gradients reduce-scattered
#    (the table and the plot). Prefetch changes no byte, only when they move and how much is held:
#    memory for exposed time, where a gather takes long next to the compute it can overlap (the
#    link run and its sentence). `reshard_after_forward=False` keeps units gathered until their
#    backward: one gather fewer, DDP's 2Ψ, for more memory (the 2 × 2 table).
#
#    </details>
#
# 2. *ZeRO-3 on 8 GPUs: is memory per GPU 16Ψ/8?*
#
#    <details><summary>Answer</summary>
#
#    For model states at rest, yes; at the peak add the gathered units and the activations (the
#    peak table). So T5-3B cannot train under ZeRO-3 alone in 4.3 GB per GPU: its states alone
#    are 5.7 GB (the planner's table). With the optimizer offloaded to the host (ZeRO-Offload,
#    lesson 09) a GPU keeps only its 16-bit parameter shard, and it can.
#
#    </details>
#
# 3. *How does ZeRO-3 handle a dynamic computation graph?*
#
#    <details><summary>Answer</summary>
#
#    Prefetch follows the unit order recorded from an earlier pass. When a data-dependent branch
#    changes it, DeepSpeed invalidates its trace ("Invalidate trace cache"), fetches on demand and
#    re-records; zerokit does the same, re-recording from the diverging pass (the dynamic table:
#    one extra gather per change, none the step after). FSDP2's default forward prefetch needs no
#    recorded order. torch.compile graph-breaks on the branch; it doesn't fix the order. Keep the
#    order static (leaf modules, one unit over the branches) when the branch changes every step,
#    and make every rank take the same branch.
#
#    </details>

# %% [markdown]
# **Exercise:** [exercises/06_zero3.ipynb](../exercises/06_zero3.ipynb) — ZeRO-3's gather and free,
# unit by unit, graded by `zerokit grade 06`; then [exercises/13_zero3_prefetch.ipynb](../exercises/13_zero3_prefetch.ipynb)
# — prefetch under a dynamic graph, graded by `zerokit grade 13` · **Next:** [lesson 07 — tensor parallelism: f and g,
# column → row](07_tensor_parallel.ipynb)
