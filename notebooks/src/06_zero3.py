# %% [markdown]
# # 06 · ZeRO-3: sharding the parameters — prefetch, reshard_after_forward and the 1.5× traffic
#
# **The question.** The seed makes three claims about ZeRO-3: per-GPU memory is
# *"(模型参数 + 梯度 + 优化器状态)/N + 临时缓存"*; its communication is *O(P/N)*; and in one case
# study it moves *"通信量减少92%（相比传统AllReduce）"* — 92 % less than an all-reduce. Which
# of these hold? What does a ZeRO-3 rank hold at its peak, what does it send, and what do
# prefetching and `reshard_after_forward` trade?
#
# **What you will see.** ZeRO-3 (`zero3`) next to DDP on 2, 3 and 4 ranks: model states at
# `16Ψ/N`, measured; the traffic — the ring cost of the payloads the ledger measured — at
# `3(N−1)/N·Ψb`, 1.5× DDP's, flat in N; each rank's peak with the gathered parameters on
# top of the shards; the four combinations of `prefetch` and `reshard_after_forward` on the
# timeline; and the seed's numbers, checked.

# %%
%matplotlib inline
import matplotlib
import matplotlib.pyplot as plt

import zerokit
from zerokit import course, plot, theory
from zerokit.cli import compare
from zerokit.zero.units import form_units

matplotlib.rcParams["figure.dpi"] = course.DPI
work = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=12)
psi = work.param_count()
b = theory.param_bytes_per_element("bf16-mixed")
print(f"{work.description}\nΨ = {psi:,} parameters")

# %% [markdown]
# ## The lifecycle of a unit
#
# ZeRO-3 (§5.3, P_os+g+p) shards the parameters too: at rest, a rank holds one N-th of
# everything. The model is cut into **units** (by default one per transformer block, the
# root taking the embeddings, the final norm and the head — as FSDP2 and DeepSpeed users
# wrap them), each a flat buffer. For every unit, every step (as FSDP's `fully_shard` does):
#
# 1. before its forward: **all-gather** the unit; 2. after its forward: **free** it;
# 3. before its backward: **all-gather** it again; 4. after its backward: **reduce-scatter**
#    its gradients into the own shard, and free the gathered parameters.
#
# Two gathers and one reduce-scatter, each `(N−1)/N` of the unit on a ring: `3(N−1)/N·Ψb`
# per step. The tables below show the **ring cost**: that ring formula applied to the
# payloads the ledger measured (gloo counts nothing on its wire).

# %%
runs = {n: compare(work, n, ["single", "ddp", "zero3"], steps=2, precision="bf16-mixed") for n in (2, 3, 4)}
rows = []
for n, report in runs.items():
    ddp, zero3 = report["ddp"].ranks[0], report["zero3"].ranks[0]
    rows.append({"N": n, "ZeRO-3 states B": sum(zero3.model_state_bytes.values()),
                 "theory B": zero3.theory_model_states["total"], "paper 16Ψ/N": theory.paper_model_state_bytes(3, psi, n),
                 "ZeRO-3 ring cost B/step (formula on measured payload)": zero3.comm_ring_cost_bytes_per_step,
                 "ZeRO-3 theory B/step": zero3.theory_comm_bytes_per_step,
                 "DDP ring cost B/step (formula on measured payload)": ddp.comm_ring_cost_bytes_per_step,
                 "ZeRO-3 ÷ DDP": round(zero3.comm_ring_cost_bytes_per_step / ddp.comm_ring_cost_bytes_per_step, 4)})
course.table(rows)

# %%
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
# prefetched ahead — and the activations, which ZeRO doesn't shard at all:

# %%
model = work.build_model()
largest_unit = max(sum(p.numel() for p in params) for _, _, params in form_units(model, "block", set()))
rows = []
for n, report in runs.items():
    for name in ("ddp", "zero3"):
        rank0 = report[name].ranks[0]
        rows.append({"N": n, "strategy": name, "peak at": rank0.peak_where, "peak B": rank0.peak_bytes,
                     "params at peak B": rank0.peak_breakdown["params"],
                     "params at rest B": rank0.model_state_bytes["params"],
                     "activations at peak B": rank0.peak_breakdown["activations"]})
course.table(rows)

# %%
for n, report in runs.items():
    for rank in report["zero3"].ranks:
        gathered = rank.peak_breakdown["params"] - rank.model_state_bytes["params"]
        assert gathered >= b * largest_unit  # at least one whole unit in flight on top of the shard
        assert rank.peak_breakdown["activations"] > 0
        assert rank.peak_bytes > sum(rank.model_state_bytes.values())

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
# - **prefetch**: from the second step on, ZeRO-3 knows the order the units run in, and
#   launches the gathers of the next units while the current one computes. The wait before a
#   unit's forward shrinks; more gathered parameters are held at once.
# - **reshard_after_forward = False**: keep each unit gathered from its forward to its
#   backward (ZeRO-2-like memory for parameters): one gather per step instead of two, so
#   `2(N−1)/N·Ψb` — DDP's traffic — for more memory.
#
# All four combinations, 2 ranks, the last of 3 steps:

# %%
combos = [(prefetch, reshard) for reshard in (True, False) for prefetch in (False, True)]
grid = {(prefetch, reshard): zerokit.train(work, "zero3", world_size=2, steps=3, precision="bf16-mixed",
                                           keep_records=True, reference=False, prefetch=prefetch,
                                           reshard_after_forward=reshard)
        for prefetch, reshard in combos}
last = range(2, 3)
rows = []
for (prefetch, reshard), report in grid.items():
    rank0 = report.result.ranks[0]
    rows.append({"prefetch": prefetch, "reshard_after_forward": reshard,
                 "ring cost B/step (formula on measured payload)": rank0.comm_ring_cost_bytes_per_step,
                 "theory B/step": rank0.theory_comm_bytes_per_step,
                 "gathers in flight (max)": course.max_in_flight(rank0, "all_gather", step=2),
                 "exposed ms (rank 0)": course.timeline_rows(report, last)[0]["exposed ms/step"],
                 "step ms (rank 0)": course.timeline_rows(report, last)[0]["step ms"],
                 "peak B": max(r.peak_bytes for r in report.result.ranks)})
course.table(rows)

# %%
for (prefetch, reshard), report in grid.items():
    for rank in report.result.ranks:
        assert rank.comm_ring_cost_bytes_per_step == rank.theory_comm_bytes_per_step
        in_flight = course.max_in_flight(rank, "all_gather", step=2)
        assert (in_flight > 1) if prefetch else (in_flight == 1)  # prefetch = the next gathers launched ahead
cost = {key: r.result.ranks[0].comm_ring_cost_bytes_per_step for key, r in grid.items()}
peak = {key: max(x.peak_bytes for x in r.result.ranks) for key, r in grid.items()}
assert cost[(False, True)] / cost[(False, False)] == 3 / 2  # two gathers per step, or one
assert peak[(True, True)] > peak[(False, True)]              # prefetched units are held early
assert peak[(False, False)] > peak[(False, True)]            # kept units are held until backward

# %%
fig, axes = plt.subplots(2, 1, figsize=(10, 5.4))
for ax, prefetch in zip(axes, (False, True)):
    plot.timeline(grid[(prefetch, True)].result, ax=ax, steps=last)
    ax.set_title(f"prefetch={prefetch}: " + ax.get_title(), fontsize=9)
fig.tight_layout()

# %% [markdown]
# Without prefetch, each unit's gather is launched at its forward and waited for at once:
# every gather is exposed. With prefetch, the next gathers are already in flight while the
# current unit computes. Prefetch changes *when* bytes move and *how much is held*, never how
# many; only `reshard_after_forward` changes the bytes (3 → 2). The launch pattern is exact
# (gathers in flight: 1 without prefetch); the milliseconds are this 2-core CPU's, noisy, and
# the reason the assertions above count gathers rather than time them.
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
budgets = [2_048, 13_000, 26_000, 50_000_000]
sweep = {budget: zerokit.train(work, "zero3", world_size=2, steps=3, precision="bf16-mixed", keep_records=True,
                               reference=False, prefetch=True, prefetch_bucket_size=budget)
         for budget in budgets}
print(f"units (elements): {units}; Ψ = {psi:,}; largest layer L = {largest_layer:,} parameters")
rows = []
for budget, report in sweep.items():
    rank0 = report.result.ranks[0]
    rows.append({"prefetch budget (elements)": budget, "budget ÷ Ψ": round(budget / psi, 2),
                 "gathers in flight (max, measured)": course.max_in_flight(rank0, "all_gather", step=2),
                 "gathered params at peak B (measured)": rank0.peak_breakdown["params"] - rank0.model_state_bytes["params"],
                 "DeepSpeed's 4 × largest layer B (formula)": deepspeed_gathered,
                 "peak B (measured)": max(r.peak_bytes for r in report.result.ranks), "peak at": rank0.peak_where})
course.table(rows)

# %%
in_flight = [row["gathers in flight (max, measured)"] for row in rows]
gathered = [row["gathered params at peak B (measured)"] for row in rows]
assert in_flight == sorted(in_flight) and len(set(in_flight)) == 3  # the budget sets how many gathers run ahead
assert gathered == sorted(gathered)                                # and how much a rank holds at its peak
assert gathered[0] >= b * max(units)                               # at least the unit being computed
assert gathered[-1] == b * theory.padded_numel(units, 2)            # budget > Ψ: the whole model gathered
for rank in (r for report in sweep.values() for r in report.result.ranks):
    assert rank.comm_ring_cost_bytes_per_step == rank.theory_comm_bytes_per_step  # the budget moves no byte
assert all(g > deepspeed_gathered for g in gathered)               # whole blocks gathered, not single layers

# %% [markdown]
# A budget below one block (2,048) launches nothing ahead: one gather in flight, as without
# prefetch. A budget that fits one block runs one gather ahead (2 in flight), one that fits
# two blocks runs two ahead — every unit of this small model. The gathered parameters at the
# peak follow: the root and one block with nothing ahead, the whole model as soon as one
# gather runs ahead (three units: the root, the block computing, the next one). The bytes
# per step never change.
#
# DeepSpeed's `4 × largest layer` is smaller than every measured row: it assumes parameters
# are fetched module by module (its largest layer here is the MLP's first linear), while
# these units are whole blocks, three times that size, and a rank holds the unit it
# computes plus what its budget lets run ahead. An estimate's "+ buffers" term is only as
# good as its idea of what is gathered at once: ask what the unit is, and what the prefetch
# budget allows.
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
# the gathered units, on 8 GPUs of the seed's sizes:

# %%
rows = []
for preset, claimed in (("gpt2-1.5b", 4.1), ("t5-3b", 4.3)):
    for checkpointing in ("none", "full"):
        per_gpu = zerokit.plan(preset=preset, gpus=8, strategy="zero3", micro_batch_size=1,
                               checkpointing=checkpointing, gpu_memory=claimed * 1e9).to_dict()["per_gpu"]
        rows.append({"model": preset, "checkpointing": checkpointing, "seed's GB": claimed,
                     "model states GB": round(per_gpu["model_state_bytes"]["total"] / 1e9, 2),
                     "activations GB": round(per_gpu["activation_bytes"] / 1e9, 2),
                     "buffers GB": round(per_gpu["buffer_bytes"] / 1e9, 2),
                     "total GB": round(per_gpu["total_bytes"] / 1e9, 2), "fits": per_gpu["fits"]})
course.table(rows)

# %%
t5 = [r for r in rows if r["model"] == "t5-3b"]
assert all(not r["fits"] and r["model states GB"] > r["seed's GB"] for r in t5)  # impossible whatever else
gpt2 = [r for r in rows if r["model"] == "gpt2-1.5b"]
assert all(r["model states GB"] < r["seed's GB"] for r in gpt2)  # the states fit; the rest decides
assert gpt2[1]["activations GB"] < gpt2[0]["activations GB"]     # checkpointing is what leaves room

# %% [markdown]
# GPT-2 1.5B is tight but possible: its model states fit, and the rest fits only with
# activation checkpointing and either buckets much smaller than DeepSpeed's defaults (the
# 2 GB of buffers above) or the optimizer offloaded to the host — `zerokit plan --preset
# gpt2-1.5b --gpus 8 --gpu-memory 4.1GB --strategy zero3 --checkpointing full` lists the
# layouts that fit. T5-3B at 4.3 GB is impossible: its model states alone take more. And "92 % less communication than an all-reduce": by the ring cost of the
# payloads measured above, ZeRO-3 sends **50 % more**.
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
#   memory for exposed time, `reshard_after_forward=False` trades memory for bytes (3 → 2).
# - The prefetch budget sets how many gathers run ahead (1, 2, 3 measured as it grows past
#   one block, two blocks), and so the gathered parameters at the peak; DeepSpeed's
#   `+ 4 × largest layer` assumes layer-sized fetches and is below what whole-block units hold.
#
# ## Interview questions
#
# 1. *How much does ZeRO-3 communicate compared with DDP?*
#
#    <details><summary>Answer</summary>
#
#    1.5×: parameters are gathered in forward and again in backward, gradients reduce-scattered
#    (the table and the plot).
#
#    </details>
#
# 2. *ZeRO-3 on 8 GPUs: is memory per GPU 16Ψ/8?*
#
#    <details><summary>Answer</summary>
#
#    For model states at rest, yes; at the peak add the gathered units and the activations (the
#    peak table). So T5-3B cannot train in 4.3 GB per GPU: its states alone are 5.7 GB (the
#    planner's table).
#
#    </details>
#
# 3. *What do prefetch and reshard_after_forward trade?*
#
#    <details><summary>Answer</summary>
#
#    Prefetch: memory for hidden gathers; `reshard_after_forward=False`: memory for one gather
#    fewer per step (the 2 × 2 table).
#
#    </details>
