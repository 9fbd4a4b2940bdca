# %% [markdown]
# # 09 · CPU offload: the optimizer on the host (ZeRO-Offload)
#
# **The question.** ZeRO shards the model states across GPUs; ZeRO-Offload (arXiv
# 2101.06840) moves part of them off the GPU altogether, into host memory, and runs the
# optimizer step on the CPU. What does offloading the optimizer to the CPU buy — how many
# bytes leave the device — and what does it cost: how many bytes cross between device and
# host every step, and how fast must the CPU's Adam be for the step to keep up?
#
# **What you will see.** `zero1`, `zero2` and `zero3` with `offload="optimizer"` and `zero3`
# with `offload="params"` on 2 ranks in bf16 mixed precision, next to the same stages without
# offload: each rank's device and host bytes from the memory ledger, and every device↔host
# copy from the transfer ledger, both equal to `zerokit.theory.offload` to the byte;
# ZeRO-Offload's 4Ψ bytes per step; the host AdamW's three kernels timed (fused, foreach,
# for-loop); the step time with and without offload on this machine, and what the same
# choice means for a 7 B model on 8 GPUs; the seed's "ZeRO-3 and CPU offload" table, row by
# row, next to what the ledgers measured; and a panel over stage, offload and world size.
#
# **Time:** about 20 min to read and run (the run itself: about 13 s on a 2-core laptop) ·
# **Needs:** lessons 02 (the 16 bytes per parameter) and 04–06 (the three ZeRO stages), nothing
# else · **After it you can answer:** *What does ZeRO-Offload put on the CPU, and what stays on
# the GPU?* · *How many bytes cross PCIe per step?* · *When does offload cost time, and when
# is it worth it?*

# %%
%matplotlib inline
import matplotlib
import torch
from IPython.display import display

import zerokit
from zerokit import course, theory
from zerokit.bench.offload import TRAINING_GPT, adamw_rows, training_configs, training_ratios
from zerokit.bench.rounds import run_rounds
from zerokit.report import param_difference

matplotlib.rcParams["figure.dpi"] = course.DPI
N, PRECISION = 2, "bf16-mixed"
work = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=12)
psi, b = work.param_count(), theory.param_bytes_per_element(PRECISION)
print(f"{work.description}\nΨ = {psi:,} parameters; N = {N}; {PRECISION}: {b}-byte parameters and gradients")

# %% [markdown]
# ## What moves where
#
# ZeRO-Offload (§4) keeps on the device what the forward and backward need — the 16-bit
# parameters — and moves the rest to the host: the fp32 master copy, Adam's m and v, the step.
# One training step then runs:
#
# 1. forward and backward on the device, as before; each rank's gradients are reduced to its
#    shard (a reduce-scatter, ZeRO's usual collective);
# 2. **device → host** (`d2h`): the rank's 16-bit gradient shard, `2Ψ/N` bytes;
# 3. the host casts it to fp32 and runs AdamW on its shard (`torch.optim.AdamW(fused=True)`);
# 4. **host → device** (`h2d`): the updated shard, cast to 16 bits, `2Ψ/N` bytes; the usual
#    all-gather then gives every rank the whole model.
#
# Over the N ranks that is `2Ψ` bytes out and `2Ψ` back: ZeRO-Offload's **4Ψ per step**.
# `offload="params"` (stage 3, DeepSpeed's `offload_param`) goes further: the 16-bit
# parameter shards *rest* on the host too, and each all-gather first fetches the rank's shard.
#
# Each configuration below trains 3 steps next to one process (`reference`), and the ledgers
# read what each rank holds and copies.
#
# **Predict before you run.** Ψ = 30,080 parameters, N = 2, bf16 (2-byte values). Under
# `zero2` with `offload="optimizer"`, how many bytes does rank 0 copy device → host per step,
# how many host → device, and what is left on its device?
#
# <details><summary>Answer</summary>
#
# `2Ψ/N = 30,080` bytes each way — its 16-bit gradient shard out, its updated 16-bit shard
# back — and on the device only the 16-bit parameters, `2Ψ = 60,160` bytes, where `zero2`
# without offload holds `2Ψ + 14Ψ/N` (plus the Adam step counters): the two `zero2` rows of the
# table below.
#
# </details>

# %%
CONFIGS = [("zero1", "none"), ("zero1", "optimizer"), ("zero2", "none"), ("zero2", "optimizer"),
           ("zero3", "none"), ("zero3", "optimizer"), ("zero3", "params")]
runs = {(stage, mode): zerokit.train(work, stage, world_size=N, steps=3, precision=PRECISION, offload=mode).result
        for stage, mode in CONFIGS}
rows = course.offload_rows(zerokit.Report(list(runs.values())))
course.table([row for row in rows if row["rank"] == 0],
             columns=["strategy", "offload", "device B (measured)", "host B (measured)", "d2h B/step (measured)",
                      "h2d B/step (measured)"])

# %% [checks]
for row in rows:  # every figure in the table equals its formula (theory.offload_states, theory.offload_transfer_bytes)
    for what in ("device B", "host B", "d2h B/step", "h2d B/step"):
        assert row[f"{what} (measured)"] == row[f"{what} (theory)"], (row["strategy"], row["offload"], what)
for (stage, mode), result in runs.items():
    assert result.param_diff["max_rel"] <= 1e-2, (stage, mode)  # the same training as one process, to bf16 rounding
    same = param_difference(result.ranks[0].params, runs[(stage, "none")].ranks[0].params)
    assert same["max_rel"] <= 1e-2, (stage, mode)  # and as the same stage without offload
    for rank in result.ranks:
        host_theory = rank.theory_model_states.get("host", {"params": 0, "grads": 0, "optimizer": 0})
        assert rank.model_state_bytes == {k: rank.theory_model_states[k] for k in ("params", "grads", "optimizer")}
        assert rank.host_model_state_bytes == {k: host_theory[k] for k in ("params", "grads", "optimizer")}
        assert rank.transfer_bytes_per_step == rank.theory_transfer_bytes_per_step  # d2h and h2d, to the byte
for stage in ("zero1", "zero2", "zero3"):
    moved = sum(sum(r.transfer_bytes_per_step.values()) for r in runs[(stage, "optimizer")].ranks)
    shard = runs[(stage, "optimizer")].ranks[0].transfer_bytes_per_step["d2h"] / b  # the padded Ψ/N
    assert moved == theory.offload_traffic_bytes(N * shard, b)  # 2Ψ out + 2Ψ back over the ranks: 4Ψ
assert runs[("zero3", "params")].ranks[0].model_state_bytes == {"params": 0, "grads": 0, "optimizer": 0}

# %% [markdown]
# **Check yourself.** Do the device, host and PCIe bytes of every offload run equal their formulas? Predict it, then run the cell: it prints its
# verdict, and stops with an `AssertionError` if the run disagrees.

# %%
kinds = ("device B", "host B", "d2h B/step", "h2d B/step")
same = all(row[f"{w} (measured)"] == row[f"{w} (theory)"] for row in rows for w in kinds)
print(f"{len(rows)} runs, four figures each, measured against theory — {'all equal' if same else 'some differ'}")
assert same

# %% [markdown]
# Each measured figure equals the formula's to the byte (the collapsed checks cell). The device keeps only the 16-bit parameters (`2Ψ`; `2Ψ/N` at stage 3, nothing at rest with
# `offload="params"`), and stage 1 its whole 16-bit gradients until they are reduced. The host
# takes `2Ψ/N` of gradients and `12Ψ/N` of fp32 master, m and v (plus 4 bytes per Adam step
# scalar), the part of ZeRO's 16 bytes per parameter that is 12. So the offload trades the
# *optimizer's* bytes — three quarters of the model states in mixed precision — for a copy of
# `2Ψ/N` each way per step. Drawn for rank 0, device and host side by side:

# %%
fig, (left, right) = course.new_figure(11, 3.8, ncols=2, width_ratios=[3, 2])
course.offload_bars(zerokit.Report([runs[c] for c in (("zero2", "none"), ("zero2", "optimizer"), ("zero3", "params"))]),
                    left, right)
left.set_ylim(0, 1.3 * left.get_ylim()[1])  # headroom: the key in one row above the bars, off the data
left.legend(fontsize=8, loc="upper center", ncol=4, frameon=False)
fig.suptitle(f"{work.description}: Ψ = {psi:,}, N = {N}, {PRECISION}", fontsize=9)
fig.tight_layout()
fig

# %% [markdown]
# ## The transfers, with gradient accumulation
#
# The copies out depend on when a stage reduces. Stage 1 reduces once per step (after the
# last micro-batch), so its gradient shard goes out once; stages 2 and 3 reduce-scatter after
# every micro-batch and free the rest, so each micro-batch's shard goes out and the *host*
# adds them: `A·2Ψ/N` out, `2Ψ/N` back. With `offload="params"` each all-gather fetches the
# shard first — forward and backward, every micro-batch: `2·A·2Ψ/N` in.
# `theory.offload_transfer_bytes(stage, shard, b, A, offload_params)` next to the transfer
# ledger, A = 2:

# %%
A = 2
accumulated = {(stage, mode): zerokit.train(work, stage, world_size=N, steps=2, precision=PRECISION, micro_batches=A,
                                            offload=mode, reference=False).result
               for stage, mode in (("zero1", "optimizer"), ("zero2", "optimizer"), ("zero3", "params"))}
rows = []
for (stage, mode), result in accumulated.items():
    rank = result.ranks[0]
    shard = runs[(stage, mode)].ranks[0].transfer_bytes_per_step["d2h"] / b  # Ψ/N of the padded units (A = 1 above)
    formula = theory.offload_transfer_bytes(int(stage[-1]), int(shard), b, A, offload_params=mode == "params")
    rows.append({"run (A = 2)": f"{stage}, offload={mode}", "copies d2h/step": rank.transfer_copies_per_step["d2h"],
                 "d2h B/step (measured)": rank.transfer_bytes_per_step["d2h"], "d2h B (formula)": formula["d2h"],
                 "h2d B/step (measured)": rank.transfer_bytes_per_step["h2d"], "h2d B (formula)": formula["h2d"]})
course.table(rows)

# %% [checks]
for row in rows:
    assert row["d2h B/step (measured)"] == row["d2h B (formula)"] and row["h2d B/step (measured)"] == row["h2d B (formula)"]
assert rows[0]["d2h B/step (measured)"] * A == rows[1]["d2h B/step (measured)"]  # stage 1 out once, stage 2 every micro-batch

# %% [markdown]
# ## How fast the host's Adam must be
#
# Offload is only as fast as the step on the host: every step, each rank's CPU reads and
# writes the fp32 master, m, v and the gradient of its `Ψ/N` elements. Users of other
# frameworks report steps 10–50× slower when that loop is not vectorised. torch has three
# CPU implementations of AdamW; the bench suite (`zerokit bench offload`) times them on the
# same fp32 tensors, one thread, medians of interleaved rounds:

# %%
threads = torch.get_num_threads()
torch.set_num_threads(1)
try:
    adam = adamw_rows([2**18, 2**20, 2**22], tensors=16, repeats=5, rounds=3, log=lambda line: None)
finally:
    torch.set_num_threads(threads)
display(course.table([{"elements": r["numel"], "fused ms (measured)": 1000 * r["fused_s"],
                        "foreach ms (measured)": 1000 * r["foreach_s"], "for-loop ms (measured)": 1000 * r["for-loop_s"],
                        "for-loop / fused": r["for-loop/fused"], "fused ns per element": 1e9 * r["fused_s"] / r["numel"]}
                       for r in adam]))
largest = adam[-1]
course.show(course.speed_sentence(
    "fused", largest["fused_s"], "for-loop", largest["for-loop_s"], spread=largest["noise"],
    elsewhere=f"({largest['numel']:,} elements, one thread.) Where the for-loop is what runs, each of Adam's "
              f"operations makes its own pass over memory; the fused kernel makes one."))

# %% [markdown]
# The fused kernel is the one zerokit's host optimizer uses (DeepSpeed ships its own
# vectorised CPU Adam for the same reason). On a CPU-only machine zerokit's *device*
# optimizer is torch's for-loop AdamW over one flat shard; on a GPU it is the fused kernel.
#
# ## What the step costs here, and what it would cost on a GPU
#
# On this CPU-only machine the "device" is a separately counted pool of the same RAM: the
# copies are real copies into distinct buffers, so their **bytes** are exact, but their
# **time** is a memory copy, not PCIe, and the device does not get faster by shedding the
# optimizer. The bench's training part, run here (the bench's tiny GPT, fp32, 2 rounds
# interleaved, medians):

# %%
bench_work = zerokit.tiny_gpt(**TRAINING_GPT)
timed = run_rounds(bench_work, [N], training_configs, steps=4, rounds=2, timeout_s=300, log=lambda line: None)
ratios = training_ratios(timed)  # keys like "N=2 zero2 offload/none"
display(course.table([{"configuration": r["label"], "step ms (median, measured)": 1000 * r["step_s"],
                       "noise (IQR / median)": r["noise"], "offload / none (measured)": ratios.get(f"N={N} {r['label']}/none")}
                      for r in timed]))
by_label = {r["label"]: r for r in timed}
for stage in ("zero1", "zero2", "zero3"):
    with_, without = by_label[f"{stage} offload"], by_label[stage]
    course.show(course.speed_sentence(
        f"{stage} with offload", with_["step_s"], f"{stage} without", without["step_s"],
        spread=max(with_["noise"], without["noise"]),
        elsewhere="" if stage != "zero3" else
        "Here the copies run between two buffers of one RAM, and the offloaded step runs the fused AdamW where the "
        "other runs the for-loop: neither is what a GPU sees. On a GPU every step adds the PCIe copies and the host's "
        "Adam unless they overlap the backward (estimated for 7 B below)."))

# %% [markdown]
# What offload costs on a GPU is what these bytes take over PCIe and what the CPU's Adam
# takes — the planner (`zerokit plan`) computes both from the same theory, for LLaMA-7B on
# one node of 8 × 80 GB GPUs (PCIe 4 ×16 assumed at 25 GB/s); the host AdamW time below
# extrapolates the fused kernel's measured ns per element (one core) to a GPU's shard:

# %%
ns_per_element = adam[-1]["fused_s"] / adam[-1]["numel"]
GPUS, rows = 8, []
for strategy, mode in (("zero2", "none"), ("zero2", "optimizer"), ("zero3", "optimizer"), ("zero3", "params")):
    p = zerokit.plan(preset="llama-7b", gpus=GPUS, strategy=strategy, offload=mode)
    host = [t for t in p.transfers if t.axis == "host"]
    per_gpu = p.to_dict()["per_gpu"]
    shard = per_gpu["params_on_rank"] / GPUS  # the elements each GPU's host optimizer steps
    rows.append({"layout": f"{strategy}, offload={mode}",
                 "model states GB/GPU (formula)": per_gpu["model_state_bytes"]["total"] / 1e9,
                 "host GB/node (formula)": p.host_bytes_per_node / 1e9,
                 "PCIe GB/step (formula)": sum(t.bytes for t in host) / 1e9,
                 "PCIe s/step (estimate)": sum(t.seconds for t in host),
                 "host AdamW s/step (extrapolated, 1 core)": ns_per_element * shard if mode != "none" else None})
course.table(rows)

# %% [markdown]
# Read the rows top to bottom: offloading the optimizer leaves ZeRO-2 with only the 16-bit
# parameters on each GPU (`offload="params"` at stage 3: nothing at rest), and in exchange
# every step moves gigabytes over PCIe (the PCIe columns, before any overlap) and steps Ψ/N
# elements of Adam on the host (the last column, at the single-core speed measured above).
# That is why DeepSpeed's CPU Adam is vectorised across many cores and its copies overlap the
# backward. Offload is for memory: it pays in time only where the memory it frees buys
# something — a model that would not fit, a larger micro-batch, a layout that communicates
# less on the same GPUs (ZeRO-Offload trains on one GPU models that need several without it).
#
# ## The seed's "ZeRO-3 and CPU offload" table, row by row
#
# The seed answers *"How do ZeRO-3 and CPU offload work together?"* (“ZeRO-3与CPU卸载的协同？”)
# with a table: parameters "sharded, need AllGather" (“分片存储”, “需要AllGather”); gradients
# "sharded, asynchronous transfer hides the latency" (“分片存储”, “异步传输隐藏延迟”); optimizer
# "fully offloaded, bandwidth-sensitive (RDMA recommended)" (“完全卸载”, “带宽敏感（建议RDMA）”).
# Each row next to what rank 0 held and copied in the `zero3` runs above
# (N = 2, bf16, one micro-batch; `offload="params"` is DeepSpeed's `offload_param`):

# %%
z3 = {mode: runs[("zero3", mode)].ranks[0] for mode in ("none", "optimizer", "params")}
SEED = {"params": "sharded; need AllGather", "grads": "sharded; async copy hides the latency",
        "optimizer": "fully offloaded; bandwidth-sensitive (RDMA)"}
seed_rows = []
for component, mode, crossing in (("params", "optimizer", "h2d"), ("params", "params", "h2d"),
                                  ("grads", "optimizer", "d2h"), ("optimizer", "optimizer", None)):
    rank = z3[mode]
    seed_rows.append({"seed's row": component, "seed says": SEED[component], "zerokit run": f"zero3, offload={mode}",
                      "device B (measured)": rank.model_state_bytes[component],
                      "host B (measured)": rank.host_model_state_bytes[component],
                      "copied B/step (measured)": f"{crossing} {int(rank.transfer_bytes_per_step[crossing]):,}" if crossing
                      else "none of it"})
course.table(seed_rows)

# %% [checks]
shard = z3["optimizer"].transfer_bytes_per_step["d2h"] // b  # Ψ/N elements (padded)
assert z3["none"].model_state_bytes["params"] == z3["optimizer"].model_state_bytes["params"] == b * shard  # sharded
assert z3["params"].model_state_bytes["params"] == 0 and z3["params"].host_model_state_bytes["params"] == b * shard
assert z3["optimizer"].model_state_bytes["grads"] == 0 and z3["optimizer"].host_model_state_bytes["grads"] == b * shard
assert z3["optimizer"].model_state_bytes["optimizer"] == 0  # fully offloaded
assert z3["optimizer"].transfer_bytes_per_step == {"d2h": b * shard, "h2d": b * shard}
assert z3["params"].transfer_bytes_per_step["h2d"] == 2 * b * shard  # a fetch before each gather: forward, backward

# %% [markdown]
# - **Parameters — "sharded, need AllGather": true, and the gather is not a host transfer.**
#   The 16-bit parameters stay sharded on the device (`2Ψ/N`, as without offload) and are
#   gathered device to device, over NVLink or the network, as in lesson 06. What crosses to
#   the host for them is the updated shard coming back, `2Ψ/N` per step. Only with
#   `offload_param` do they rest on the host, and then every gather first fetches the shard:
#   forward and backward, every micro-batch (`2·A·2Ψ/N` in; the accumulation table).
# - **Gradients — "sharded, the asynchronous copy hides the latency": sharded, yes; hidden
#   is a condition.** Each rank's reduced shard (`2Ψ/N` per micro-batch at stages 2–3) goes
#   to the host and nothing of it stays on the device. On a GPU, DeepSpeed and zerokit copy it
#   on a side stream from pinned memory while the backward goes on: the copy is hidden where
#   PCIe carries a bucket's shard in less time than the backward's remaining layers take;
#   the last bucket's copy ends after the backward whatever the link, and the host's step
#   waits for it (ZeRO-Offload's one-step delayed parameter update moves the host's step
#   behind the next step's compute, at the price of updating with gradients one step old).
#   This machine has no PCIe to time: the bytes are exact, the latency is not measurable here.
# - **Optimizer — "fully offloaded, bandwidth-sensitive, RDMA recommended": fully offloaded,
#   yes; the rest is misplaced.** The device holds none of it (0 B), the host `12Ψ/N` plus
#   the step counters, and the states themselves never cross: the traffic is the gradients
#   out and the parameters back, 4Ψ over the ranks, each GPU over its own PCIe link to its
#   host. RDMA (a network card reading another node's memory) carries none of it. Where
#   the host's Adam takes longer than the copies — compare the last two columns of the 7 B
#   table — the CPU, not the link, is what the step waits for: DeepSpeed's answer is a
#   vectorised multi-core CPU Adam, not a faster network.
#
# ## Try it
#
# Choose the stage, the offload and the world size: the panel trains the stage with and
# without offload and draws rank 0's device and host bytes and its copies per step, measured,
# with the formula's ticks. `params` below stage 3 is refused, as DeepSpeed refuses
# `offload_param` there.

# %%
course.OffloadPanel(work, stage="zero3", offload="params", world_sizes=(2, 3, 4), steps=2)

# %% [markdown]
# ## Summary
#
# - ZeRO-Offload keeps the 16-bit parameters (and forward/backward) on the device and moves the
#   gradient shard, the fp32 master, m, v and the step to the host: the device sheds the 12Ψ/N
#   of optimizer states and the gradients (measured = `theory.offload_states`, to the byte).
# - Every step each rank copies its `2Ψ/N` gradient shard out and `2Ψ/N` parameters back:
#   **4Ψ bytes over the N ranks**, `theory.offload_traffic_bytes`; stages 2–3 copy every
#   micro-batch's shard out, stage 1 once; parameter offload adds a fetch per gather.
# - The cost is PCIe time and the CPU's Adam, whose kernel matters (the sentence under the
#   AdamW table compares the fused kernel and the for-loop on this machine); at 7 B on 8 GPUs
#   the planner's estimate is gigabytes of PCIe per step, for the optimizer's 12Ψ/N bytes off
#   each GPU.
# - On a CPU-only machine the bytes are exact, the time is not PCIe's: the step times with and
#   without offload compare copies within one RAM, and say nothing of a GPU.
# - The seed's ZeRO-3 + offload table: parameters sharded and gathered device to device,
#   gradients sharded and copied out (hidden only where the backward outlasts the copy), the
#   optimizer wholly on the host — and RDMA has no part in it.
#
# ## Interview questions
#
# 1. *What does ZeRO-Offload put on the CPU, and what stays on the GPU?*
#
#    <details><summary>Answer</summary>
#
#    The gradient shard, the fp32 master parameters, Adam's m and v and the optimizer step go
#    to the host; the 16-bit parameters and all forward/backward compute stay on the GPU. Per
#    rank the device drops from `2Ψ + 14Ψ/N` (ZeRO-2) to `2Ψ`, the host holds `2Ψ/N + 12Ψ/N`
#    (the first table and its assertions).
#
#    </details>
#
# 2. *How many bytes cross PCIe per step with optimizer offload, and why that many?*
#
#    <details><summary>Answer</summary>
#
#    About 4Ψ in 16-bit over all GPUs: each rank sends its `2Ψ/N` gradient shard out and
#    receives its `2Ψ/N` updated shard back. With gradient accumulation at stages 2–3 each
#    micro-batch's shard goes out (`(A + 1)·2Ψ/N`); with parameter offload every all-gather
#    fetches the shard first (the transfer-ledger tables).
#
#    </details>
#
# 3. *If turning on offload made your training 20× slower, what do you check first?*
#
#    <details><summary>Answer</summary>
#
#    The CPU optimizer: a non-vectorised Adam (a Python for-loop over tensors, or too few
#    threads) can take several times a fused kernel's time (the AdamW table above compares the
#    two on this machine), and the step waits for it. Then whether the copies overlap the backward and use pinned memory. Then
#    whether offload is needed at all: it is there for memory. On a GPU its copies and host step
#    add to every step unless they overlap the backward, and it pays back in time only where the
#    memory it frees buys a larger micro-batch or a layout that communicates less.
#
#    </details>

# %% [markdown]
# **Exercise:** [exercises/11_cpu_offload.ipynb](../exercises/11_cpu_offload.ipynb) — the ZeRO-2
# optimizer step on the host, written by you, graded by `zerokit grade 11` · **Next:** [lesson 10 —
# activation checkpointing](10_activation_checkpointing.ipynb)
