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
# choice means for a 7 B model on 8 GPUs; and a panel over stage, offload and world size.

# %%
%matplotlib inline
import matplotlib
import torch

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
# read what each rank holds and copies:

# %%
CONFIGS = [("zero1", "none"), ("zero1", "optimizer"), ("zero2", "none"), ("zero2", "optimizer"),
           ("zero3", "none"), ("zero3", "optimizer"), ("zero3", "params")]
runs = {(stage, mode): zerokit.train(work, stage, world_size=N, steps=3, precision=PRECISION, offload=mode).result
        for stage, mode in CONFIGS}
rows = course.offload_rows(zerokit.Report(list(runs.values())))
course.table([row for row in rows if row["rank"] == 0])

# %%
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
# The device keeps only the 16-bit parameters (`2Ψ`; `2Ψ/N` at stage 3, nothing at rest with
# `offload="params"`), and stage 1 its whole 16-bit gradients until they are reduced. The host
# takes `2Ψ/N` of gradients and `12Ψ/N` of fp32 master, m and v (plus 4 bytes per Adam step
# scalar), the part of ZeRO's 16 bytes per parameter that is 12. So the offload trades the
# *optimizer's* bytes — three quarters of the model states in mixed precision — for a copy of
# `2Ψ/N` each way per step. Drawn for rank 0, device and host side by side:

# %%
fig, (left, right) = course.new_figure(11, 3.8, ncols=2, width_ratios=[3, 2])
course.offload_bars(zerokit.Report([runs[c] for c in (("zero2", "none"), ("zero2", "optimizer"), ("zero3", "params"))]),
                    left, right)
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
    rows.append({"strategy": stage, "offload": mode, "A": A, "copies d2h/step": rank.transfer_copies_per_step["d2h"],
                 "d2h B/step (measured)": rank.transfer_bytes_per_step["d2h"], "d2h B (theory)": formula["d2h"],
                 "h2d B/step (measured)": rank.transfer_bytes_per_step["h2d"], "h2d B (theory)": formula["h2d"]})
course.table(rows)

# %%
for row in rows:
    assert row["d2h B/step (measured)"] == row["d2h B (theory)"] and row["h2d B/step (measured)"] == row["h2d B (theory)"]
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
course.table([{"elements": r["numel"], "fused ms": 1000 * r["fused_s"], "foreach ms": 1000 * r["foreach_s"],
               "for-loop ms": 1000 * r["for-loop_s"], "for-loop / fused": r["for-loop/fused"],
               "fused ns per element": 1e9 * r["fused_s"] / r["numel"]} for r in adam])

# %% [markdown]
# The fused kernel is the one zerokit's host optimizer uses; it passes over memory once per
# step. The ratios are measured on 2 shared cores and move from run to run; the order does
# not. (zerokit's device-side optimizer uses the for-loop, so on this machine the offloaded
# step is not slower for that reason.)
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
course.table([{"configuration": r["label"], "step ms (median, measured)": 1000 * r["step_s"],
               "noise (IQR / median)": r["noise"], "offload / none (measured)": ratios.get(f"N={N} {r['label']}/none")} for r in timed])

# %% [markdown]
# Ratios near 1 with a noise column that large say only that copies between two buffers of one
# RAM are cheap. What offload costs on a GPU is what these bytes take over PCIe and what the
# CPU's Adam takes — the planner (`zerokit plan`) computes both from the same theory, for
# LLaMA-7B on one node of 8 × 80 GB GPUs (PCIe 4 ×16 assumed at 25 GB/s); the host AdamW time
# below extrapolates the fused kernel's measured ns per element (one core) to a GPU's shard:

# %%
ns_per_element = adam[-1]["fused_s"] / adam[-1]["numel"]
GPUS, rows = 8, []
for strategy, mode in (("zero2", "none"), ("zero2", "optimizer"), ("zero3", "optimizer"), ("zero3", "params")):
    p = zerokit.plan(preset="llama-7b", gpus=GPUS, strategy=strategy, offload=mode)
    host = [t for t in p.transfers if t.axis == "host"]
    per_gpu = p.to_dict()["per_gpu"]
    shard = per_gpu["params_on_rank"] / GPUS  # the elements each GPU's host optimizer steps
    rows.append({"layout": f"{strategy}, offload={mode}", "model states GB/GPU": per_gpu["model_state_bytes"]["total"] / 1e9,
                 "total GB/GPU (formula)": p.total_bytes / 1e9, "host GB/node (formula)": p.host_bytes_per_node / 1e9,
                 "PCIe GB/step (formula)": sum(t.bytes for t in host) / 1e9,
                 "PCIe s/step (estimate)": sum(t.seconds for t in host),
                 "host AdamW s/step (extrapolated, 1 core)": ns_per_element * shard if mode != "none" else None})
course.table(rows)

# %% [markdown]
# Read the rows top to bottom: offloading the optimizer leaves ZeRO-2 with only the 16-bit
# parameters on each GPU (`offload="params"` at stage 3: nothing at rest), and in exchange
# every step moves gigabytes over PCIe — tenths of a second at 25 GB/s, before any overlap —
# and steps Ψ/N elements of Adam on the host, which at the measured single-core speed takes
# seconds. That is why DeepSpeed's CPU Adam is vectorised across many cores and its copies
# overlap the backward, and why the trade is worth it when memory, not time, is what stops
# you: a bigger model or batch on the same GPUs.
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
# - The cost is PCIe time and the CPU's Adam: the fused kernel is several times faster than
#   the for-loop (measured here); at 7 B on 8 GPUs the planner's estimate is gigabytes and
#   tenths of a second of PCIe per step, for the optimizer's 12Ψ/N bytes off each GPU.
# - On a CPU-only machine the bytes are exact, the time is not PCIe's.
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
# 3. *Offload made your training 20× slower. What do you check first?*
#
#    <details><summary>Answer</summary>
#
#    The CPU optimizer: a non-vectorised Adam (a Python for-loop over tensors, or too few
#    threads) is several times slower than a fused kernel (measured above), and the step waits
#    for it. Then whether the copies overlap the backward and use pinned memory, and whether
#    offload is needed at all — it buys memory, never speed.
#
#    </details>
