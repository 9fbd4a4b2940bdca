# %% [markdown]
# # 12 · The interview: data vs model parallelism, and how ZeRO combines them — every claim checked
#
# **The question.** The seed is an interview article: *"What is the difference between data
# parallelism and model parallelism? How does the ZeRO optimizer combine the two?"* (数据并行与
# 模型并行的区别是什么？ZeRO优化器如何结合二者？). Its answer is well organised and full of
# numbers: ZeRO-1 saves 33 %, ZeRO-3's traffic is O(P/N), data parallelism stops at N ≤ 8,
# DeepSpeed trained LLaMA-65B at 78 % utilisation with 92 % less communication, GPT-2 1.5 B
# under ZeRO-3 takes 4.1 GB per GPU… If an interviewer asked you the question and then each
# follow-up, which of those numbers would survive being checked on the spot?
#
# **What you will see.** The interview in its order — the two parallelisms, ZeRO's stages,
# the follow-ups — each answered by a small run on 2–4 CPU ranks or a call to
# `zerokit.theory` / the planner, never a retyped formula. Every claim the seed makes (FACTS
# §8) gets its check, the figure here next to the seed's, and a verdict: true, false or
# half-true. A memory panel to replay ZeRO's stages, a plan panel for the seed's GPU table,
# the verdict table, and the one-page answer to give in the room.

# %%
%matplotlib inline
import matplotlib

import zerokit
from zerokit import course, theory
from zerokit.planner import preset

matplotlib.rcParams["figure.dpi"] = course.DPI
work = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=8)
TRAINING = ("forward", "backward", "step")  # the phases of a step (setup and the final gathers left out)
verdicts = []  # one row per seed claim, filled as the interview goes


def ops(rank, axis=None):
    """The collectives a rank issued during training steps, on one axis or all."""
    return sorted({row["op"] for row in rank.comm_summary if row["phase"] in TRAINING and axis in (None, row["axis"])})


print(work.description)

# %% [markdown]
# ## Q1. "What is the difference between data parallelism and model parallelism?"
#
# Answer with one model on 2 ranks three ways: data parallel (DDP: every rank the whole
# model, half the batch), tensor parallel (Megatron: every layer split in two), pipeline
# parallel (two stages, 2 micro-batches). What each rank holds and what it sends, measured,
# next to the formulas; DDP runs on zerokit's own ring, so its bytes are counted on the wire.

# %%
q1 = {"data parallel (DDP)": zerokit.train(work, "ddp", world_size=2, steps=1, algorithm="ring", reference=False),
      "tensor parallel": zerokit.train(work, "tp", world_size=2, steps=1, parallel={"tp": 2}, reference=False),
      "pipeline parallel": zerokit.train(work, "pp", world_size=2, steps=1, micro_batches=2, reference=False)}
psi = q1["data parallel (DDP)"].results[0].param_count
one_process = theory.model_state_bytes(0, psi, 1, "fp32", "adamw").total
rows = []
for name, report in q1.items():
    for rank in report.results[0].ranks:
        axis = next(a for a in ("dp", "tp", "pp") if report.results[0].parallel.get(a, 1) > 1)
        rows.append({"layout": name, "rank": rank.rank, "states B (measured)": sum(rank.model_state_bytes.values()),
                     "states B (theory)": rank.theory_model_states["total"],
                     "÷ one process": round(sum(rank.model_state_bytes.values()) / one_process, 2),
                     "sends (ops)": ", ".join(ops(rank, axis)), "on": axis,
                     "B/step (ledger)": rank.comm_bytes_by_axis[axis]["ring_cost_bytes"],
                     "B/step (theory)": rank.theory_comm_bytes_by_axis[axis]})
course.table(rows)

# %%
for row in rows:
    assert row["states B (measured)"] == row["states B (theory)"] and row["B/step (ledger)"] == row["B/step (theory)"]
ddp_rank = q1["data parallel (DDP)"].results[0].ranks[0]
assert ddp_rank.comm_sent_bytes_per_step == theory.comm_bytes_per_step(0, psi, 2, 4)  # on the wire: 2(N−1)/N·Ψb
assert all(r["÷ one process"] >= 1 for r in rows if r["layout"].startswith("data"))  # the whole model per rank
assert all(r["÷ one process"] < 0.75 for r in rows if not r["layout"].startswith("data"))
assert {r["sends (ops)"] for r in rows if r["layout"] == "pipeline parallel"} == {"recv, send"}

# %% [markdown]
# **The answer, from the table.** Data parallelism copies the model and splits the *data*:
# each rank holds everything (O(P) per rank — the seed's O(N×P) is the whole cluster) and
# all-reduces the *gradients*, `2(N−1)/N·Ψb` per step, whatever the batch. Model parallelism
# splits the *model*: each rank holds part of it and sends *activations* — all-reduces inside
# every layer for tensor parallelism, point-to-point sends at the stage boundary for a
# pipeline — bytes that grow with batch × sequence × hidden, not with Ψ.
#
# ## Q2. "How does ZeRO combine the two?"
#
# ZeRO keeps data parallelism's compute (each rank a full forward and backward on its own
# data) and borrows model parallelism's partitioning for the **states**: stage 1 shards the
# optimizer states, stage 2 also the gradients, stage 3 also the parameters — each rank owns
# 1/N and gets the rest by collectives when it needs them. The panel trains DDP and ZeRO
# 1–3 on 4 ranks in bf16 mixed precision (the paper's setting: K = 12) and draws each rank's
# states next to the formula; the interview's next three claims read its report.

# %%
panel = course.MemoryPanel(work, strategies=("ddp", "zero1", "zero2", "zero3"), world_sizes=(2, 4), world_size=4,
                           precision="bf16-mixed", steps=1)
stages = panel.last_report
N = 4
panel

# %%
course.table([{"strategy": r.strategy, "states B/rank (measured)": sum(r.ranks[0].model_state_bytes.values()),
               "states B/rank (theory)": r.ranks[0].theory_model_states["total"],
               "ring cost B/step (ledger)": r.ranks[0].comm_ring_cost_bytes_per_step,
               "B/step (theory)": r.ranks[0].theory_comm_bytes_per_step,
               "ops": ", ".join(ops(r.ranks[0]))} for r in stages.results])

# %% [markdown]
# ### "ZeRO-1 saves 33 % of the memory"
#
# The seed divides Adam's states by the devices and lands on a third. ZeRO-1 shards K·Ψ of
# the 16Ψ: the saving is `(K/16)·(1 − 1/N)` — 0.75·(1 − 1/N) in mixed precision. Measured at
# N = 4 from the panel's runs, and `theory.zero1_saving_fraction` at other N:

# %%
states = {r.strategy: sum(r.ranks[0].model_state_bytes.values()) for r in stages.results}
saving_measured = 1 - states["zero1"] / states["ddp"]
saving_by_n = {n: theory.zero1_saving_fraction(n) for n in (2, 4, 8, 64)}
print(f"ZeRO-1 saving at N = {N}: measured {saving_measured:.1%}, theory {theory.zero1_saving_fraction(N):.1%}; "
      + ", ".join(f"N = {n}: {s:.1%}" for n, s in saving_by_n.items()) + " (theory)")
verdicts.append({"seed's claim": "ZeRO-1 saves 33 % of memory", "checked with": "MemoryPanel run, zero1_saving_fraction",
                 "figure here": f"{saving_measured:.1%} measured at N = {N}; 0.75·(1 − 1/N): "
                                + ", ".join(f"{s:.0%}" for s in saving_by_n.values()) + " at N = 2, 4, 8, 64",
                 "verdict": "false" if abs(saving_measured - 1 / 3) > 0.05 else "true"})

# %%
assert abs(saving_measured - theory.zero1_saving_fraction(N)) < 0.01  # the step scalars: 4 B per tensor
assert all(abs(s - 1 / 3) > 0.04 for s in saving_by_n.values())  # at no N is it a third
assert verdicts[-1]["verdict"] == "false"

# %% [markdown]
# ### "ZeRO-3 memory = (parameters + gradients + optimizer states)/N + buffers"
#
# At rest, measured: ZeRO-3's states are `16Ψ/N` (the formula, to the byte). At its peak a
# rank also holds the **gathered unit** in flight and its **activations**, which ZeRO does
# not shard — the seed's "buffers" is where they hide:

# %%
z3 = stages["zero3"].ranks[0]
at_rest = sum(z3.model_state_bytes.values())
peak = z3.peak_by_category
course.table([{"rank 0, ZeRO-3, N = 4": "model states at rest (measured)", "B": at_rest},
              {"rank 0, ZeRO-3, N = 4": "16Ψ/N (theory)", "B": theory.model_state_bytes(3, psi, N, "bf16-mixed").total},
              {"rank 0, ZeRO-3, N = 4": "params at peak (own shard + gathered unit, measured)", "B": peak["params"]},
              {"rank 0, ZeRO-3, N = 4": "activations at peak (measured, not sharded)", "B": peak["activations"]},
              {"rank 0, ZeRO-3, N = 4": "peak, everything (measured)", "B": z3.peak_bytes}])

# %%
assert at_rest == z3.theory_model_states["total"]
assert peak["params"] > z3.model_state_bytes["params"] and peak["activations"] > 0 and z3.peak_bytes > at_rest
verdicts.append({"seed's claim": "ZeRO-3 memory = (P + G + O)/N + buffers", "checked with": "MemoryPanel run (ledger)",
                 "figure here": f"at rest {at_rest:,} B = 16Ψ/N; peak {z3.peak_bytes:,} B with the gathered unit "
                                f"and activations",
                 "verdict": "half-true: true at rest; at the peak add the gathered unit and the activations"})

# %% [markdown]
# ### "ZeRO-3's communication is O(P/N)" — and "92 % less communication than all-reduce"
#
# ZeRO-3 gathers every parameter in forward, again in backward, and reduce-scatters the
# gradients: three passes of `(N−1)/N·Ψb` against DDP's two. Measured in the panel's runs
# at N = 4 (ring cost of the ledger's calls), and on the wire with zerokit's ring at N = 2:

# %%
n2 = {s: zerokit.train(work, s, world_size=2, steps=1, precision="bf16-mixed", algorithm="ring", reference=False)
      for s in ("ddp", "zero3")}
ratio_n4 = stages["zero3"].ranks[0].comm_ring_cost_bytes_per_step / stages["ddp"].ranks[0].comm_ring_cost_bytes_per_step
sent = {s: r.results[0].ranks[0].comm_sent_bytes_per_step for s, r in n2.items()}
ratio_n2 = sent["zero3"] / sent["ddp"]
course.table([{"N": 4, "DDP B/step": stages["ddp"].ranks[0].comm_ring_cost_bytes_per_step,
               "ZeRO-3 B/step": stages["zero3"].ranks[0].comm_ring_cost_bytes_per_step, "kind": "ledger ring cost",
               "ZeRO-3 ÷ DDP": round(ratio_n4, 3)},
              {"N": 2, "DDP B/step": sent["ddp"], "ZeRO-3 B/step": sent["zero3"], "kind": "sent on the wire (measured)",
               "ZeRO-3 ÷ DDP": round(ratio_n2, 3)},
              {"N": 1024, "DDP B/step": theory.comm_bytes_per_step(0, psi, 1024, 2),
               "ZeRO-3 B/step": theory.comm_bytes_per_step(3, psi, 1024, 2), "kind": "theory",
               "ZeRO-3 ÷ DDP": round(theory.comm_bytes_per_step(3, psi, 1024, 2) / theory.comm_bytes_per_step(0, psi, 1024, 2), 3)}])

# %%
for ratio in (ratio_n2, ratio_n4):
    assert abs(ratio - 1.5) < 0.01  # 1.5 × DDP (padding aside), at every N: O(P), flat in N
# per rank, the bytes grow towards 3Ψb as N grows — they never shrink like P/N
assert theory.comm_bytes_per_step(3, psi, 1024, 2) > theory.comm_bytes_per_step(3, psi, 4, 2)
verdicts.append({"seed's claim": "ZeRO-3 communication O(P/N)", "checked with": "ledger (N = 4), zerokit ring (N = 2)",
                 "figure here": f"ZeRO-3 ÷ DDP = {ratio_n4:.2f} (N = 4), {ratio_n2:.2f} on the wire (N = 2): 3(N−1)/N·Ψb",
                 "verdict": "false: O(P), 1.5 × DDP, flat in N"})
verdicts.append({"seed's claim": "92 % less communication than all-reduce", "checked with": "the same runs",
                 "figure here": f"{ratio_n2 - 1:+.0%} against DDP's all-reduce",
                 "verdict": f"false: ZeRO-3 moves {ratio_n2 - 1:.0%} more"})

# %% [markdown]
# ### "ZeRO-2: all-reduce the gradients, then drop the ones you don't own"
#
# The seed's code all-reduces every gradient and sets the non-owned ones to `None`. zerokit
# runs exactly that as `zero2-naive`, next to ZeRO-2 as the paper has it (each bucket
# reduce-scattered to its owner during backward, then freed; buckets of Ψ/8 elements here, so
# that a small model has several). Which collectives, and the gradients each rank holds at
# its peak:

# %%
bucket = psi // 8  # elements: ZeRO-2 reduce-scatters a bucket as soon as it fills (one bucket would hold them all)
q2 = {s: zerokit.train(work, s, world_size=2, steps=1, precision="bf16-mixed", reference=False,
                       **({"reduce_bucket_size": bucket} if s == "zero2" else {})) for s in ("zero2-naive", "zero2")}
full_grads = 2 * theory.padded_numel([psi], 2)  # every gradient, 16-bit, padded
course.table([{"strategy": s, "ops per step": ", ".join(ops(r.results[0].ranks[0])),
               "grads at the peak B (measured)": r.results[0].ranks[0].peak_breakdown["grads"],
               "all gradients B (theory)": full_grads,
               "grads at rest B (measured)": r.results[0].ranks[0].model_state_bytes["grads"]} for s, r in q2.items()])

# %%
naive, proper = (q2[s].results[0].ranks[0] for s in ("zero2-naive", "zero2"))
assert "all_reduce" in ops(naive) and "reduce_scatter" in ops(proper) and "all_reduce" not in ops(proper)
assert naive.peak_breakdown["grads"] == full_grads > proper.peak_breakdown["grads"]
assert naive.model_state_bytes["grads"] == proper.model_state_bytes["grads"]  # the same at rest: the difference is the peak
verdicts.append({"seed's claim": "ZeRO-2 = all-reduce, then drop non-owned grads", "checked with": "zero2-naive vs zero2 (ledger)",
                 "figure here": f"naive peaks at all {full_grads:,} B of gradients; ZeRO-2 at "
                                f"{proper.peak_breakdown['grads']:,} B, by reduce-scatter during backward",
                 "verdict": "half-true (misleading): the same at rest, not the same peak or traffic"})

# %% [markdown]
# ## Follow-ups: scaling, speed, the seed's case studies
#
# ### "Data parallelism scales to N ≤ 8 (memory bottleneck)"
#
# DP's memory per rank doesn't depend on N (the whole model, every rank), and its bytes per
# rank approach `2Ψb` as N grows — nothing about 8. What stops at 8 is **tensor**
# parallelism: its all-reduces run inside every layer, and past the GPUs of one node they
# leave NVLink. The planner on LLaMA-7B, 8 GPUs per node:

# %%
dp8, dp64 = (zerokit.plan(preset="llama-7b", gpus=n, strategy="ddp") for n in (8, 64))
tp8, tp16 = (zerokit.plan(preset="llama-7b", gpus=64, strategy="zero1", parallel={"dp": 64 // t, "tp": t})
             for t in (8, 16))


def on_axis(p, axis):
    """The planner's bytes, estimated seconds and links for one axis of a plan."""
    moves = [t for t in p.transfers if t.axis == axis]
    return {"GB per GPU (formula)": round(p.total_bytes / 1e9, 1), "axis": axis,
            "GB/step on it (formula)": round(sum(t.bytes for t in moves) / 1e9, 2),
            "s/step on it (estimate)": round(sum(t.seconds for t in moves), 3),
            "link": ", ".join(sorted({t.link for t in moves}))}


course.table([{"plan": "DDP, 8 GPUs", **on_axis(dp8, "dp")}, {"plan": "DDP, 64 GPUs", **on_axis(dp64, "dp")},
              {"plan": "ZeRO-1, tp 8 (one node)", **on_axis(tp8, "tp")},
              {"plan": "ZeRO-1, tp 16 (two nodes)", **on_axis(tp16, "tp")}])

# %%
tp_seconds = {t: sum(x.seconds for x in p.transfers if x.axis == "tp") for t, p in ((8, tp8), (16, tp16))}
assert dp8.memory.model_states.total == dp64.memory.model_states.total  # DP's states per GPU: flat in N
assert dp64.comm_bytes_per_step["dp"] < 1.15 * dp8.comm_bytes_per_step["dp"]  # 2(N−1)/N·Ψb: +12.5 % from 8 to 64
assert tp_seconds[16] > 3 * tp_seconds[8]  # tp across nodes: the limit of 8 is here
verdicts.append({"seed's claim": "DP scales to N ≤ 8", "checked with": "zerokit.plan (llama-7b)",
                 "figure here": f"DDP states/GPU equal at 8 and 64 GPUs; tp 16's all-reduces ≈ "
                                f"{tp_seconds[16] / tp_seconds[8]:.0f}× tp 8's time",
                 "verdict": "false: that limit belongs to TP (a node's GPUs)"})

# %% [markdown]
# ### "28× the model on 32 GPUs", "29× more memory saved", "ZeRO-3 1.3× faster than model parallelism on a DGX-A100", "ZeRO-2 15 % faster than ZeRO-3", "checkpointing saves 45 %/78 % for 18 %/22 % more compute"
#
# None of these has a source, and a CPU can't time a DGX. What can be checked is what they
# are ratios of. Model states shrink exactly N-fold under ZeRO-3 (`theory.model_state_bytes`
# at N = 32: 32×, not 28× — activations, which ZeRO doesn't shard, pull the trainable size
# down by an amount that depends on the batch). ZeRO-2 vs ZeRO-3 is a traffic ratio (1.5×,
# measured above) plus how much of it overlaps — a property of the cluster. And activation
# checkpointing saves the same whatever the ZeRO stage, since ZeRO doesn't touch activations:

# %%
ckpt = {(s, c): zerokit.train(work, s, world_size=2, steps=1, checkpointing=c, reference=False)
        for s in ("zero2", "zero3") for c in ("none", "every")}
rows = []
for s in ("zero2", "zero3"):
    off, on = (ckpt[(s, c)].results[0].ranks[0] for c in ("none", "every"))
    rows.append({"stage": s, "activations B, none (measured)": off.peak_by_category["activations"],
                 "activations B, every block (measured)": on.peak_by_category["activations"],
                 "saving (measured)": round(1 - on.peak_by_category["activations"] / off.peak_by_category["activations"], 3),
                 "forwards recomputed / step": on.recomputed_forwards})
traffic_3_over_2 = stages["zero3"].ranks[0].comm_ring_cost_bytes_per_step / stages["zero2"].ranks[0].comm_ring_cost_bytes_per_step
states_ratio_32 = theory.model_state_bytes(0, psi, 32, "bf16-mixed").total / theory.model_state_bytes(3, psi, 32, "bf16-mixed").total
print(f"model states, DDP ÷ ZeRO-3 at N = 32 (theory): {states_ratio_32:.1f}×")
course.table(rows)

# %%
assert rows[0]["saving (measured)"] == rows[1]["saving (measured)"] > 0  # the same saving at either stage
assert rows[0]["forwards recomputed / step"] == rows[1]["forwards recomputed / step"] == 2  # one per block
assert 31 < states_ratio_32 <= 32 and abs(traffic_3_over_2 - 1.5) < 0.01
verdicts.append({"seed's claim": "28× on 32 GPUs; 1.3× faster on DGX-A100; ZeRO-2 15 % faster; checkpointing "
                                 "45 %/78 % for 18 %/22 %",
                 "checked with": "theory.model_state_bytes, ledger, checkpointing runs",
                 "figure here": f"states {states_ratio_32:.0f}× at N = 32; ZeRO-3 ÷ ZeRO-2 traffic {traffic_3_over_2:.2f}× (ledger); checkpointing "
                                f"saves {rows[0]['saving (measured)']:.0%} at both stages",
                 "verdict": "no source: measurable only as ratios; the checkpointing saving does not depend on the stage"})

# %% [markdown]
# ### "DeepSpeed trained LLaMA-65B at 78 % hardware utilisation"
#
# LLaMA was trained with Meta's own code (Touvron et al., 2302.13971 §2.4: "380 tokens/sec/GPU
# on 2048 A100 with 80 GB"). Model FLOPs utilisation from that throughput and the A100's
# 312 TFLOP/s dense bf16, with the preset's Ψ:

# %%
llama = preset("llama-65b")
mfu = theory.model_flops_utilization(llama.param_count, tokens_per_second_per_gpu=380, peak_flops=312e12)
print(f"LLaMA-65B: Ψ = {llama.param_count:,}; 6Ψ FLOPs per token × 380 tokens/s ÷ 312 TFLOP/s = {mfu:.1%} MFU")

# %%
assert 0.4 < mfu < 0.55
verdicts.append({"seed's claim": "DeepSpeed trained LLaMA-65B at 78 % utilisation", "checked with":
                 "theory.model_flops_utilization, preset llama-65b", "figure here": f"≈ {mfu:.0%} MFU (380 tokens/s/GPU)",
                 "verdict": "false: Meta's own code, about half that"})

# %% [markdown]
# ### The seed's Megatron-DeepSpeed table: "GPT-2 1.5 B, ZeRO-3: 4.1 GB × 8"; "T5-3B, ZeRO-3: 4.3 GB × 8"
#
# ZeRO-3's model states alone are 16Ψ/N. The planner, 8 GPUs (paper convention, decimal GB),
# with the smallest activations a step can have (one sequence per micro-batch, every layer
# checkpointed):

# %%
claimed = {"gpt2-1.5b": 4.1, "t5-3b": 4.3}
table_plans = {name: zerokit.plan(preset=name, gpus=8, strategy="zero3", micro_batch_size=1, checkpointing="full")
               for name in claimed}
course.table([{"model": name, "seed's GB per GPU": claimed[name], "Ψ": p.model.param_count,
               "ZeRO-3 model states GB (formula)": round(p.memory.model_states.total / 1e9, 2),
               "+ activations (micro-batch 1, checkpointed) GB (formula)": round(p.total_bytes / 1e9, 2)}
              for name, p in table_plans.items()])

# %%
gpt2_states, t5_states = (table_plans[n].memory.model_states.total / 1e9 for n in ("gpt2-1.5b", "t5-3b"))
assert gpt2_states < claimed["gpt2-1.5b"]  # the states fit under the claim: possible, if activations are small
assert t5_states > claimed["t5-3b"]  # the states alone exceed the claim: impossible
verdicts.append({"seed's claim": "GPT-2 1.5B ZeRO-3 4.1 GB × 8; T5-3B 4.3 GB × 8", "checked with": "zerokit.plan",
                 "figure here": f"states alone: GPT-2 {gpt2_states:.1f} GB, T5-3B {t5_states:.1f} GB",
                 "verdict": f"half-true: GPT-2's states fit under 4.1 GB, a step needs ≈ "
                            f"{table_plans['gpt2-1.5b'].total_bytes / 1e9:.1f}; T5-3B impossible"})

# %% [markdown]
# The planner panel, to try other GPU sizes, stages and models (T5-3B on 8 GPUs of 16 GB):

# %%
course.PlanPanel(preset="t5-3b", gpus=8, gpu_memory_gb=16, strategy="zero3", micro_batch_size=1)

# %% [markdown]
# ### The seed's config: `"pipeline": {"stages": 2, "partition_method": "parameters"}`
#
# Hand the seed's config to `zerokit.initialize`, which reads DeepSpeed configs:

# %%
try:
    zerokit.initialize(model=work.build_model(), config={"train_micro_batch_size_per_gpu": 8,
                                                         "zero_optimization": {"stage": 3},
                                                         "pipeline": {"stages": 2, "partition_method": "parameters"}})
except ValueError as exc:
    refusal = str(exc)
print(refusal)

# %%
assert "PipelineModule" in refusal and "not a DeepSpeed config key" in refusal
verdicts.append({"seed's claim": "\"pipeline\": {stages, partition_method} in the DeepSpeed config",
                 "checked with": "zerokit.initialize", "figure here": "refused: PipelineModule(num_stages=…, "
                 "partition_method=…) in code", "verdict": "false: not the API"})

# %% [markdown]
# ## The verdicts
#
# Every claim of the seed that FACTS §8 lists, with the check run above and the figure it
# gave:

# %%
course.table(verdicts)

# %%
assert len(verdicts) == 10  # every claim of FACTS §8 has its check
for row in verdicts:
    assert row["verdict"].split(":")[0] in ("true", "false", "half-true", "half-true (misleading)", "no source"), row

# %% [markdown]
# ## The one-page answer
#
# **Data vs model parallelism.** Data parallelism copies the model to every rank and splits
# the batch; each rank holds all of it (16Ψ bytes of states with Adam) and all-reduces the
# gradients every step, `2(N−1)/N·Ψb` per rank — the memory doesn't shrink with N, the
# traffic doesn't grow with it. Model parallelism splits the model: tensor parallelism cuts
# every layer (f/g all-reduces of activations, four per layer, so it lives inside a node),
# pipeline parallelism cuts the stack into stages (point-to-point activations at the
# boundaries, and a bubble of `(p − 1)/(m + p − 1)`).
#
# **How ZeRO combines them.** ZeRO keeps data parallelism's compute and partitions its
# redundant states as model parallelism would: optimizer states (stage 1), gradients (2),
# parameters (3), each rank owning 1/N and fetching the rest by collectives. Per rank in mixed
# precision: `4Ψ + 12Ψ/N`, `2Ψ + 14Ψ/N`, `16Ψ/N`. Stages 1–2 send what DDP sends (the
# all-reduce split into its reduce-scatter and all-gather, the reduce-scatter during
# backward); stage 3 sends 1.5× (parameters gathered in forward and again in backward). It
# does not shard activations, so checkpointing or TP still matter.
#
# **In practice.** Memory first: DDP or ZeRO-1/2 while the model fits, ZeRO-3 or offload when
# it doesn't; TP inside a node when a layer or the activations are too large; PP across nodes
# with many micro-batches; ZeRO-1 on the data-parallel axis of a 3-D mesh (DeepSpeed refuses
# ZeRO-2/3 with a pipeline). And the numbers to correct if you hear them: ZeRO-1 saves
# 0.75·(1 − 1/N), not 33 %; ZeRO-3's traffic is 1.5× DDP's, not O(P/N) and not 92 % less;
# the "N ≤ 8" limit is tensor parallelism's.
#
# ## Summary
#
# - The seed's question answered with measurements on 2–4 ranks: data parallelism holds the
#   whole model per rank and sends gradients; model parallelism holds a part and sends
#   activations; ZeRO partitions data parallelism's states, stage by stage, at DDP's traffic
#   (stages 1–2) or 1.5× (stage 3).
# - Of the seed's ten claims (FACTS §8), none survives as written: 33 %, O(P/N), N ≤ 8, 78 %
#   and 92 % are false; ZeRO-2's description, ZeRO-3's memory formula and the GPU table are
#   half-true; the speed-ups have no source and only their ratios can be checked; the config
#   block is not DeepSpeed's API.
# - Each verdict came from a run (the ledgers) or a library call (`zerokit.theory`, the
#   planner), with the figure next to the seed's.
#
# ## Interview questions
#
# 1. *Your colleague says ZeRO-1 cut memory by a third on 8 GPUs. Is that what you'd expect?*
#
#    <details><summary>Answer</summary>
#
#    No: in mixed precision with Adam it cuts 0.75·(1 − 1/8) ≈ 66 % of the model states
#    (the optimizer states are 12 of the 16 bytes per parameter, and each rank keeps 1/8 of
#    them). A third would be plain fp32 at N = 3, or activations dominating the total — the
#    measured saving at N = 4 matched `theory.zero1_saving_fraction` above.
#
#    </details>
#
# 2. *Does ZeRO-3 reduce communication compared with DDP?*
#
#    <details><summary>Answer</summary>
#
#    No, it increases it by half: parameters are all-gathered in forward and again in
#    backward, gradients reduce-scattered — `3(N−1)/N·Ψb` against DDP's `2(N−1)/N·Ψb`,
#    flat in N. Measured above at 2 ranks (on the wire) and 4 (ledger): 1.5×.
#
#    </details>
#
# 3. *Why is tensor parallelism usually limited to 8 GPUs, and data parallelism not?*
#
#    <details><summary>Answer</summary>
#
#    TP all-reduces activations inside every layer, forward and backward, so it needs the
#    fastest link — the GPUs of one node (8 on NVLink); across nodes its time jumps (the
#    planner's tp 16 row). DP communicates once per step, `2(N−1)/N·Ψb` per rank whatever N,
#    and overlaps it with backward: it scales across nodes.
#
#    </details>
