# %% [markdown]
# # 05 · ZeRO-2: sharding the gradients — and why "all-reduce then drop" isn't it
#
# **The question.** The seed describes ZeRO-2 with this code:
#
# ```python
# for param in params:
#     dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
#     if not is_owner(param):  # 非本设备负责的梯度不保留
#         param.grad = None
# ```
#
# — all-reduce every gradient, then drop the ones this rank doesn't own. Is that ZeRO-2?
# What does ZeRO-2 hold, when does it communicate, and what does it send?
#
# **What you will see.** ZeRO-2 (`zero2`: reduce-scatter each bucket during backward, then
# free it) next to the seed's version (`zero2-naive`) and ZeRO-1, on 4 ranks: the model
# states after a step (the same), the **peak** (not the same: the naive version holds every
# gradient), the traffic (the ring cost of the naive version's payloads is 1.5× as much),
# the timeline, ZeRO-2 on zerokit's ring — its reduce-scatters' bytes counted on the wire —
# and gradient accumulation, where ZeRO-2 pays a reduce-scatter per micro-batch.

# %%
%matplotlib inline
import matplotlib
import matplotlib.pyplot as plt

import zerokit
from zerokit import course, plot, theory
from zerokit.cli import compare

matplotlib.rcParams["figure.dpi"] = course.DPI
work = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=12)
psi = work.param_count()
bucket = 4096  # elements per gradient bucket (DeepSpeed's reduce_bucket_size counts elements)
b = theory.param_bytes_per_element("bf16-mixed")
print(f"{work.description}\nΨ = {psi:,} parameters")

# %% [markdown]
# ## ZeRO-2 in the paper
#
# ZeRO-2 (§5.2, P_os+g) shards the gradients as well as the optimizer states. A rank needs
# the averaged gradient of its own shard only, so the paper **reduces each bucket to its
# owners during backward** — a reduce-scatter, launched as soon as the bucket is full — and
# frees the bucket. No rank ever holds all the gradients. The seed's version all-reduces
# everything after backward (so every rank holds all of it, averaged) and only then drops
# what it doesn't own.
#
# Traffic, until the section on zerokit's ring, is the **ring cost**: the ring formula
# applied to the payloads the ledger measured — what a ring would send, not a count of
# gloo's wire.

# %%
n = 4
sharded = ("zero1", "zero2")
report = compare(work, n, ["single", "zero1", "zero2-naive", "zero2"], steps=2, precision="bf16-mixed",
                 keep_records=True, options_for=lambda name: {"reduce_bucket_size": bucket} if name in sharded else {})
stage = {"zero1": 1, "zero2-naive": 2, "zero2": 2}
rows = []
for result in report.results[1:]:
    rank0 = result.ranks[0]
    rows.append({"strategy": result.strategy, "model states B": sum(rank0.model_state_bytes.values()),
                 "theory B": rank0.theory_model_states["total"],
                 "paper's formula B": theory.paper_model_state_bytes(stage[result.strategy], psi, n),
                 "peak grads B": rank0.peak_breakdown["grads"], "peak B": rank0.peak_bytes,
                 "ring cost B/step (formula on measured payload)": rank0.comm_ring_cost_bytes_per_step,
                 "theory B/step": rank0.theory_comm_bytes_per_step})
course.table(rows)

# %%
naive, zero2, zero1 = report["zero2-naive"], report["zero2"], report["zero1"]
for result in (zero1, naive, zero2):
    assert result.param_diff["max_rel"] <= 1e-2  # the same training, to bf16 rounding
    for rank in result.ranks:
        assert rank.model_state_bytes == {k: rank.theory_model_states[k] for k in ("params", "grads", "optimizer")}
        assert rank.comm_ring_cost_bytes_per_step == rank.theory_comm_bytes_per_step
states = {name: sum(report[name].ranks[0].model_state_bytes.values()) for name in ("zero2-naive", "zero2")}
for name, total in states.items():  # at rest both are ZeRO-2, within the padding of their shards
    assert abs(total - theory.paper_model_state_bytes(2, psi, n)) / total < 0.01
full_gradients = b * theory.padded_numel([psi], n)
for rank in naive.ranks:
    assert rank.peak_breakdown["grads"] == full_gradients  # the naive version holds every gradient
    # an all-reduce and an all-gather: 3(N−1)/N·Ψb, what ZeRO-3 sends
    assert rank.comm_ring_cost_bytes_per_step == theory.comm_bytes_per_step(3, psi, n, b, units=[psi])
for rank in zero2.ranks:
    assert rank.peak_breakdown["grads"] < full_gradients
    ddp_bytes = theory.comm_bytes_per_step(0, psi, n, b)
    assert ddp_bytes <= rank.comm_ring_cost_bytes_per_step < 1.01 * ddp_bytes  # DDP's traffic, up to padding
assert max(r.peak_bytes for r in zero2.ranks) < min(r.peak_bytes for r in naive.ranks)

# %% [markdown]
# After the step both are ZeRO-2 — `2Ψ + 14Ψ/N` (ZeRO-1: `4Ψ + 12Ψ/N`), the table's first
# columns. On the way there they are not:
#
# - **memory**: the naive version's gradients peak at the full padded buffer, on every
#   rank; ZeRO-2's never exceed the own shard plus the buckets in flight;
# - **traffic** (ring cost): the naive version all-reduces (`2(N−1)/N·Ψb`) *and*
#   all-gathers the updated parameters (`(N−1)/N·Ψb`): `3(N−1)/N·Ψb`, as much as ZeRO-3
#   will send, for ZeRO-2's memory. ZeRO-2 proper costs DDP's `2(N−1)/N·Ψb` on a ring.
#
# Each rank at its peak, by category:

# %%
course.peak_bars(zerokit.Report([zero1, naive, zero2])).figure

# %% [markdown]
# ## When they communicate
#
# The ledger records the phase of every collective. ZeRO-2 reduce-scatters bucket by
# bucket *during* backward; the naive version waits for backward to end:

# %%
rows = []
for name in ("zero1", "zero2-naive", "zero2"):
    rank0 = report[name].ranks[0]
    launched = course.comm_launch_positions(rank0, step=1)
    for row in rank0.comm_summary:
        rows.append({"strategy": name, "phase": row["phase"], "op": row["op"], "calls (2 steps)": row["calls"],
                     "payload B (2 steps, measured)": row["payload_bytes"],
                     "ring cost B (2 steps, formula on measured payload)": row["ring_cost_bytes"]})
    rows.append({"strategy": name, "phase": "2nd step", "op": "launched during / after backward",
                 "calls (2 steps)": f"{launched['during backward']} / {launched['after backward']}"})
course.table(rows)

# %%
assert course.comm_launch_positions(naive.ranks[0], step=1)["during backward"] == 0
assert course.comm_launch_positions(zero2.ranks[0], step=1)["during backward"] > 0
assert {(r["phase"], r["op"]) for r in zero2.ranks[0].comm_summary} == {("backward", "reduce_scatter"),
                                                                        ("step", "all_gather")}

# %%
fig, axes = plt.subplots(2, 1, figsize=(10, 5.4))
for ax, name in zip(axes, ["zero2-naive", "zero2"]):
    plot.timeline(report[name], ax=ax, steps=range(1, 2))
    ax.set_title(f"{name}: " + ax.get_title(), fontsize=9)
fig.tight_layout()

# %% [markdown]
# ## Why is correct ZeRO-2 slower here? Lesson 01's α
#
# Time the three a few steps each on 4 ranks: the naive version, ZeRO-2 with the 4,096-element
# buckets used above, and ZeRO-2 with one bucket larger than Ψ. The bytes are the same; the
# number of calls is not. A call of 4,096 bf16 elements (8 KiB) sits on the flat,
# latency-bound part of lesson 01's curve: it costs its rounds × α, whatever its size.
# Measure α as lesson 01 did — ring all-reduces on 4 ranks from 96 B to 384 KiB, fitted —
# and price each variant's calls: calls × ring rounds × α (gloo runs a reduce-scatter as an
# all-reduce, so its calls count `2(N−1)` rounds, an all-gather `N−1`).

# %%
fit = course.fit_latency_bandwidth(course.time_ring_all_reduce([4], [96, 96 * 4**3, 96 * 4**6], repeats=3))
variants = {"zero2-naive": {}, "zero2, 4,096-element buckets": {"reduce_bucket_size": bucket},
            "zero2, one bucket > Ψ": {"reduce_bucket_size": 1_000_000}}
timed = {label: zerokit.train(work, label.split(",")[0], world_size=4, steps=4, precision="bf16-mixed",
                              keep_records=True, reference=False, **options).result
         for label, options in variants.items()}
rounds = {"all_reduce": theory.ring_steps("all_reduce", 4), "all_gather": theory.ring_steps("all_gather", 4),
          "reduce_scatter": theory.ring_steps("all_reduce", 4)}  # gloo: an all-reduce underneath
rows = []
for label, result in timed.items():
    rank0 = result.ranks[0]
    steps = len(rank0.step_times_s)
    latency = sum(row["calls"] / steps * rounds[row["op"]] for row in rank0.comm_summary) * fit["alpha_s"]
    rows.append({"variant": label, "calls/step (measured)": rank0.comm_calls_per_step,
                 "calls × rounds × α ms/step (model)": round(1e3 * latency, 1),
                 "blocked on comm ms/step (measured)": round(1e3 * sum(r["blocked_s"] for r in rank0.comm_records
                                                                        if r["step"] >= 1) / (steps - 1), 1),
                 "median step ms (measured)": round(1e3 * result.step_time_s_median, 1),
                 "ring cost B/step (formula on measured payload)": rank0.comm_ring_cost_bytes_per_step})
course.table(rows, title=f"α = {1e3 * fit['alpha_s']:.2f} ms per round (lesson 01's fit, this machine, 4 ranks)")

# %%
naive_t, small_t, large_t = timed.values()
assert small_t.ranks[0].comm_calls_per_step > 10 * large_t.ranks[0].comm_calls_per_step  # many small calls
assert large_t.ranks[0].comm_calls_per_step == naive_t.ranks[0].comm_calls_per_step == 2  # one of each op
for result in (small_t, large_t):
    for rank in result.ranks:  # the bucket size changes the calls, never the bytes
        assert rank.comm_ring_cost_bytes_per_step == rank.theory_comm_bytes_per_step
blocked = {label: rows[i]["blocked on comm ms/step (measured)"] for i, label in enumerate(timed)}
assert blocked["zero2, 4,096-element buckets"] > blocked["zero2, one bucket > Ψ"]  # latency, paid per call
assert small_t.step_time_s_median > large_t.step_time_s_median  # (times: noisy here, so no tighter bound)

# %% [markdown]
# With 4,096-element buckets ZeRO-2 issues a reduce-scatter and an all-gather per bucket, a
# dozen of each per step, and each pays its rounds of α: compare the modelled latency with the
# measured step times — the gap between the 4,096-element row and the one-bucket row is of
# the size of the difference in calls × rounds × α (the calls partly overlap backward and
# each other, and the step times are this shared 2-core CPU's, noisy; the calls are exact).
# One bucket larger than Ψ issues two calls, like the naive version, and the gap closes —
# with ZeRO-2's bytes and memory. α here is about a millisecond per round — Python processes
# on one CPU; on NVLink it is microseconds, but the rule is the same: size buckets so each
# call is bandwidth-bound (DeepSpeed's default `reduce_bucket_size` is 5e8 elements). Small
# buckets exist to start reducing early in backward and to bound the memory in flight, which
# a model of real size needs and this one doesn't.

# %% [markdown]
# ## On zerokit's ring: the bytes on the wire
#
# Does a reduce-scatter really send only `(N−1)/N` of the buffer? The ring cost says so by
# formula; gloo counts nothing. With `algorithm="ring"`, ZeRO-2 runs its collectives on
# zerokit's ring over send/recv (lesson 01), which counts every byte it hands to send — the
# summary's `sent_bytes`, **measured**. One step on 3 ranks, and the same step on the
# backend's own collectives (the default):

# %%
n_ring = 3
on_ring = zerokit.train(work, "zero2", world_size=n_ring, steps=1, algorithm="ring", reference=False)
on_backend = zerokit.train(work, "zero2", world_size=n_ring, steps=1, reference=False, keep_records=True)
rows = []
for r in (on_ring, on_backend):
    for row in r.result.ranks[0].comm_summary:
        rows.append({"algorithm": row["algorithm"], "phase": row["phase"], "op": row["op"], "calls": row["calls"],
                     "payload B (measured)": row["payload_bytes"],
                     "ring cost B (formula on measured payload)": row["ring_cost_bytes"],
                     "sent B (measured, ring)": row["sent_bytes"], "note": row["note"]})
course.table(rows)

# %%
for rank in on_ring.result.ranks:
    scatters = [row for row in rank.comm_summary if row["op"] == "reduce_scatter"]
    assert scatters and all(row["algorithm"] == "ring" for row in scatters)
    for row in scatters:  # measured on the wire: (N−1)/N of the buffer, as the formula says
        assert row["sent_bytes"] * n_ring == (n_ring - 1) * row["payload_bytes"]
        assert row["sent_bytes"] == row["ring_cost_bytes"]
backend = on_backend.result.ranks[0].comm_records[0]["backend"]
gloo_scatter = next(row for row in on_backend.result.ranks[0].comm_summary if row["op"] == "reduce_scatter")
assert gloo_scatter["sent_bytes"] is None  # the backend ran it: nothing counted its wire
if backend == "gloo":
    assert "all-reduce" in gloo_scatter["note"]
print(f"backend: {backend}")
print(f"ledger's note on its reduce-scatter: {gloo_scatter['note'] or '(none)'}")

# %% [markdown]
# On the ring, every rank sent exactly `(N−1)/N` of each reduce-scatter's buffer — measured,
# and equal to the ring cost. The backend's run has payloads and their ring cost, but no
# "sent" (—): and on gloo the ledger's note says why its ring cost is not what its wire
# carries — gloo's reduce-scatter is an all-reduce underneath, `2(N−1)/N` of the
# buffer, then a slice. That an all-reduce splits into two halves costing the same in all
# is a property of the ring, not of every backend.
#
# ## Gradient accumulation
#
# With A micro-batches per step, DDP (`no_sync`) and ZeRO-1 accumulate the full gradients
# locally and reduce once. ZeRO-2 cannot: the gradients it doesn't own are freed after each
# reduce-scatter, so it reduce-scatters **every micro-batch** — `(A + 1)(N−1)/N·Ψb` per step
# with the final all-gather, against ZeRO-1's `2(N−1)/N·Ψb`. Memory for bytes:

# %%
accumulation = compare(work, 2, ["zero1", "zero2"], steps=2, micro_batches=3, precision="bf16-mixed",
                       options_for=lambda name: {"reduce_bucket_size": bucket})
rows = []
for result in accumulation.results:
    rank0 = result.ranks[0]
    cost = rank0.comm_ring_cost_bytes_per_step
    rows.append({"strategy": result.strategy, "micro-batches": 3,
                 "ring cost B/step (formula on measured payload)": cost,
                 "theory B/step": rank0.theory_comm_bytes_per_step,
                 "÷ DDP's 2(N−1)/N·Ψb": round(cost / theory.comm_bytes_per_step(0, psi, 2, b), 3),
                 "model states B": sum(rank0.model_state_bytes.values())})
course.table(rows)

# %%
for result in accumulation.results:
    for rank in result.ranks:
        assert rank.comm_ring_cost_bytes_per_step == rank.theory_comm_bytes_per_step
z1, z2 = (accumulation[name].ranks[0].comm_ring_cost_bytes_per_step for name in ("zero1", "zero2"))
assert z2 / z1 == (3 + 1) / 2  # (A + 1) halves against 2

# %% [markdown]
# ## Try it
#
# The bucket size and overlap of ZeRO-2's reduce-scatters: smaller buckets launch earlier
# and hold less, more calls cost more latency; with `overlap_comm` off each reduce-scatter
# blocks backward where it is launched. The timeline shades what is exposed; the bars on
# the right are each rank's peak.

# %%
course.TimelinePanel(work, "zero2", controls={"reduce_bucket_size": [1024, 2048, 4096, 16384, 500_000_000],
                                              "overlap_comm": True},
                     world_size=2, steps=3, precision="bf16-mixed", show_memory=True)

# %% [markdown]
# And the memory of the three, by stage, world size and precision — switch "show" to *peak*
# to see the naive version's full gradients:

# %%
course.MemoryPanel(work, strategies=("zero1", "zero2-naive", "zero2"), world_sizes=(2, 3, 4), world_size=4,
                   precision="bf16-mixed", steps=2, view="peak")

# %% [markdown]
# ## Summary
#
# - ZeRO-2 shards gradients and optimizer states: `2Ψ + 14Ψ/N` per rank, measured.
# - It gets there by reduce-scattering each bucket *during* backward and freeing it; no rank
#   ever holds all gradients, and on a ring it sends what DDP sends — the ring cost of the
#   measured payloads, and the bytes zerokit's ring counted: `(N−1)/N` of each buffer.
# - gloo's reduce-scatter is an all-reduce underneath: on that backend the wire carries more
#   than the ring cost (the ledger's note).
# - "All-reduce, then drop" ends with the same model states but peaks at the full
#   gradients and costs `3(N−1)/N·Ψb` — ZeRO-3's traffic for ZeRO-2's memory.
# - With accumulation, ZeRO-2 reduce-scatters every micro-batch: `(A + 1)/2` × DDP's bytes.
# - Small buckets cost calls, not bytes: each latency-bound call pays its rounds × α (lesson
#   01). That is why ZeRO-2 with 4,096-element buckets is slower here than the naive version;
#   one bucket larger than Ψ makes two calls per step and closes the gap.
#
# ## Interview questions
#
# 1. *"ZeRO-2 = all-reduce the gradients, then drop the ones you don't own" — right?*
#
#    <details><summary>Answer</summary>
#
#    No: that peaks at full gradients and costs 1.5× DDP; ZeRO-2 reduce-scatters during
#    backward.
#
#    </details>
#
# 2. *Does ZeRO-2 communicate more than DDP?*
#
#    <details><summary>Answer</summary>
#
#    On a ring, not per step without accumulation (each reduce-scatter sends `(N−1)/N` of its
#    buffer, measured on zerokit's ring above); with A micro-batches it sends `(A + 1)/2` × as
#    much (the accumulation table).
#
#    </details>
#
# 3. *When would you pick ZeRO-1 over ZeRO-2?*
#
#    <details><summary>Answer</summary>
#
#    With many micro-batches per step and memory to spare for full gradients: ZeRO-1 reduces
#    once per step.
#
#    </details>
