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
# **Time:** about 30 min to read and run (the run itself: 10 s on a 2-core laptop) ·
# **Needs:** lessons 01 (the ring, α), 03 (buckets, overlap, timelines) and 04 (ZeRO-1),
# nothing else · **After it you can answer:** *"ZeRO-2 = all-reduce the gradients, then drop
# the ones you don't own" — right?* · *Does ZeRO-2 communicate more than DDP, and when would you
# pick ZeRO-1 instead?* · *What do small gradient buckets cost, and what do big ones?*
#
# **What you will see.** ZeRO-2 (`zero2`: reduce-scatter each bucket during backward, then
# free it) next to the seed's version (`zero2-naive`) and ZeRO-1, on 4 ranks: the model
# states after a step (the same), the **peak** (not the same: the naive version holds every
# gradient), the traffic (the ring cost of the naive version's payloads is 1.5× as much),
# the timeline, what the bucket size costs in calls and holds in memory, ZeRO-2 on zerokit's
# ring — its reduce-scatters' bytes counted on the wire — and gradient accumulation, where
# ZeRO-2 pays a reduce-scatter per micro-batch.

# %%
%matplotlib inline
import dataclasses

import matplotlib

import zerokit
from zerokit import course, theory
from zerokit.cli import compare
from zerokit.course.tables import RING_COST
from zerokit.course.timeline_figure import step_time

matplotlib.rcParams["figure.dpi"] = course.DPI
work = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=12)
psi = work.param_count()
bucket = 4096  # elements per gradient bucket (DeepSpeed's reduce_bucket_size counts elements)
b = theory.param_bytes_per_element("bf16-mixed")
print(f"{work.description}\nΨ = {psi:,} parameters")


def peak_figure(results, labels, title, width):
    """Each rank of ``results`` at its peak by category (course.peak_bars), labelled ``labels`` (None: each rank
    under its bar, the strategy once under its ranks), the key outside."""
    fig, ax = course.new_figure(width, 3.8)
    course.peak_bars(zerokit.Report(list(results)), ax=ax, labels=labels)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig, ax


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
# applied to the payloads the ledger measured — what a ring would send, not a count of the
# backend's wire ([lesson 01, why gloo's times are not a ring's](01_collectives.ipynb#Why-gloo's-times-are-not-a-ring's)).
#
# **Predict before you run.** After a step, which holds more bytes of model states per rank:
# the seed's version or ZeRO-2 — and at the peak, during the step?
#
# <details><summary>Answer</summary>
#
# After the step, the same: both end with `2Ψ + 14Ψ/N` (the "model states" column). At the
# peak, the naive version holds every gradient — 4× ZeRO-2's peak gradients here ("peak
# grads"), because it all-reduces the whole buffer before dropping three quarters of it.
#
# </details>

# %%
n = 4
sharded = ("zero1", "zero2")
report = compare(work, n, ["single", "zero1", "zero2-naive", "zero2"], steps=2, precision="bf16-mixed",
                 keep_records=True, options_for=lambda name: {"reduce_bucket_size": bucket} if name in sharded else {})
stage = {"zero1": 1, "zero2-naive": 2, "zero2": 2}
rows = []
for result in report.results[1:]:
    rank0 = result.ranks[0]
    rows.append({"strategy": result.strategy, "model states B (measured)": sum(rank0.model_state_bytes.values()),
                 "paper's formula B": theory.paper_model_state_bytes(stage[result.strategy], psi, n),
                 "peak grads B (measured)": rank0.peak_breakdown["grads"],
                 "peak B (measured)": rank0.peak_bytes, RING_COST: rank0.comm_ring_cost_bytes_per_step})
course.table(rows)

# %% [checks]
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
# **Check yourself.** Does ZeRO-2 send more than DDP's 2(N − 1)/N · Ψ · b per step? Predict it, then run the cell: it prints its
# verdict, and stops with an `AssertionError` if the run disagrees.

# %%
rank = zero2.ranks[0]
print(f"ZeRO-2 on N = {n}: ring cost {rank.comm_ring_cost_bytes_per_step:,} B per rank per step; "
      f"theory {rank.theory_comm_bytes_per_step:,} B — "
      f"{'equal' if rank.comm_ring_cost_bytes_per_step == rank.theory_comm_bytes_per_step else 'different'}")
assert rank.comm_ring_cost_bytes_per_step == rank.theory_comm_bytes_per_step

# %% [markdown]
# After the step both are ZeRO-2 — `2Ψ + 14Ψ/N` (ZeRO-1: `4Ψ + 12Ψ/N`), the table's first
# columns, measured to the byte against the formula (the folded cell). On the way there they
# are not:
#
# - **memory**: the naive version's gradients peak at the full padded buffer, on every
#   rank; ZeRO-2's never exceed the own shard plus the buckets in flight;
# - **traffic** (ring cost): the naive version all-reduces (`2(N−1)/N·Ψb`) *and*
#   all-gathers the updated parameters (`(N−1)/N·Ψb`): `3(N−1)/N·Ψb`, as much as ZeRO-3
#   will send, for ZeRO-2's memory. ZeRO-2 proper costs DDP's `2(N−1)/N·Ψb` on a ring.
#
# Each rank at its peak, by category:

# %%
fig, _ = peak_figure((zero1, naive, zero2), None, "each rank at its peak, by category (measured), N = 4", width=11)
fig

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
                     "ring cost B (2 steps, formula)": row["ring_cost_bytes"]})
    rows.append({"strategy": name, "phase": "2nd step", "op": "launched during / after backward",
                 "calls (2 steps)": f"{launched['during backward']} / {launched['after backward']}"})
course.table(rows)

# %% [checks]
assert course.comm_launch_positions(naive.ranks[0], step=1)["during backward"] == 0
assert course.comm_launch_positions(zero2.ranks[0], step=1)["during backward"] > 0
assert {(r["phase"], r["op"]) for r in zero2.ranks[0].comm_summary} == {("backward", "reduce_scatter"),
                                                                        ("step", "all_gather")}

# %% [markdown]
# The same two on a timeline — on **2** ranks, not 4: four ranks on two cores take turns, so
# at any moment two of them are not running, and most of what each waits for is a peer that
# has not reached the collective yet (a straggler wait, lesson 03), not the collective. Each
# panel draws the step of 1–3 whose ranks waited least for each other, on a time axis of its
# own (the two steps differ several-fold: on one axis the naive one would be a sliver), and its
# title gives that step's length and splits every rank's exposed time into the part once both
# had launched and the straggler wait; the sentence under the picture compares the two steps:

# %%
pair = {name: zerokit.train(work, name, world_size=2, steps=4, precision="bf16-mixed", keep_records=True,
                            reference=False, track_peak=False, **({"reduce_bucket_size": bucket}
                                                                  if name == "zero2" else {}))
        for name in ("zero2-naive", "zero2")}
display(course.timeline_figure(pair, steps=range(1, 4), calmest=True, shared_axis=False))
(naive_pair_s, naive_pair_spread), (zero2_pair_s, zero2_pair_spread) = (step_time(r, range(1, 4))
                                                                        for r in pair.values())
course.show(course.speed_sentence(
    "ZeRO-2's step (steps 1–3, median)", zero2_pair_s, "the naive version's", naive_pair_s,
    spread=max(naive_pair_spread, zero2_pair_spread),
    elsewhere="Read each panel against its own ticks. ZeRO-2's many small calls each pay lesson 01's α, and on two "
              "shared cores the calls in flight take turns with backward's compute: the next section prices them."))

# %% [markdown]
# The naive version computes all of backward, then blocks on one all-reduce of everything and
# on the all-gather after the step. ZeRO-2 launches each bucket's reduce-scatter as backward
# fills it: its collectives are in flight under backward's compute, and what shows in red is
# each small call's wait. How much time that costs depends on the number of calls — next.
#
# ## What small buckets cost: lesson 01's α
#
# Time the three a few steps each on 4 ranks: the naive version, ZeRO-2 with the 4,096-element
# buckets used above, and ZeRO-2 with one bucket larger than Ψ. The bytes are the same; the
# number of calls is not. A call of 4,096 bf16 elements (8 KiB) sits on the flat,
# latency-bound part of lesson 01's curve: it costs its rounds × α, whatever its size.
# Measure α as lesson 01 did — ring all-reduces on 4 ranks from 96 B to 384 KiB, fitted —
# and price each variant's calls: calls × ring rounds × α (gloo runs a reduce-scatter as an
# all-reduce — lesson 01 — so its calls count `2(N−1)` rounds, an all-gather `N−1`).

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
                 "median step ms (measured)": round(1e3 * result.step_time_s_median, 1)})
display(course.table(rows, title=f"α = {1e3 * fit['alpha_s']:.2f} ms per round (lesson 01's fit, this machine, "
                                 f"4 ranks)"))
(naive_s, naive_spread), (small_s, small_spread), (large_s, large_spread) = (step_time(r) for r in timed.values())
course.show(" ".join([
    course.speed_sentence("ZeRO-2 with 4,096-element buckets", small_s, "ZeRO-2 with one bucket > Ψ", large_s,
                          spread=max(small_spread, large_spread)),
    course.speed_sentence("ZeRO-2 with one bucket > Ψ", large_s, "the naive version", naive_s,
                          spread=max(large_spread, naive_spread),
                          elsewhere="Where α is microseconds (NVLink, InfiniBand) a dozen calls cost next to "
                                    "nothing, and the bucket size is chosen for memory and overlap instead.")]))

# %% [checks]
naive_t, small_t, large_t = timed.values()
assert small_t.ranks[0].comm_calls_per_step > 10 * large_t.ranks[0].comm_calls_per_step  # many small calls
assert large_t.ranks[0].comm_calls_per_step == naive_t.ranks[0].comm_calls_per_step == 2  # one of each op
for result in (small_t, large_t):
    for rank in result.ranks:  # the bucket size changes the calls, never the bytes
        assert rank.comm_ring_cost_bytes_per_step == rank.theory_comm_bytes_per_step
# the times themselves are compared by the sentences above, chosen from the numbers (a busy machine can reorder
# them): what holds on every machine is the calls and the bytes

# %% [markdown]
# With 4,096-element buckets ZeRO-2 issues a reduce-scatter and an all-gather per bucket, a
# dozen of each per step, and each pays its rounds of α: the model column, next to the time
# the rank was blocked (the calls partly overlap backward and each other; the calls are exact,
# the times this shared machine's). One bucket larger than Ψ issues two calls, as the naive
# version does, with ZeRO-2's bytes. The sentences under the table compare the measured steps.
# α here is of the order of a millisecond per round — Python processes on one CPU; on NVLink
# it is microseconds, but the rule is the same: size buckets so each call is bandwidth-bound
# (DeepSpeed's default `reduce_bucket_size` is 5e8 elements).
#
# Why not always one bucket, then? A bucket is gradient memory in flight.
#
# **Predict before you run.** ZeRO-2 with one bucket larger than Ψ: are its peak gradients
# below the naive version's, as with 4,096-element buckets?
#
# <details><summary>Answer</summary>
#
# No. One bucket holds every gradient until backward ends, then reduce-scatters it: its
# gradients peak at the whole bf16 buffer — as much as the naive version's, plus the
# shard it reduces into (the orange in the figure). Small buckets bound what is in
# flight; that, and starting to reduce early in backward, is what they are for in a model of
# real size — DeepSpeed's 5e8-element default is a bound on memory, not one bucket per model.
#
# </details>

# %%
fig, _ = peak_figure([dataclasses.replace(result, ranks=result.ranks[:1]) for result in timed.values()],
                     ["zero2-naive", "zero2,\n4,096-element buckets", "zero2,\none bucket > Ψ"],
                     "rank 0 at its peak, by category (measured), N = 4", width=8)
fig

# %% [checks]
grads = {label: result.ranks[0].peak_breakdown["grads"] for label, result in timed.items()}
assert grads["zero2, 4,096-element buckets"] < grads["zero2-naive"] <= grads["zero2, one bucket > Ψ"]

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
        rows.append({"algorithm": row["algorithm"], "op": row["op"], "calls": row["calls"],
                     "payload B (measured)": row["payload_bytes"], "ring cost B (formula)": row["ring_cost_bytes"],
                     "sent B (measured, ring)": row["sent_bytes"]})
backend = on_backend.result.ranks[0].comm_records[0]["backend"]
gloo_scatter = next(row for row in on_backend.result.ranks[0].comm_summary if row["op"] == "reduce_scatter")
print(f"backend: {backend}")
print(f"ledger's note on its reduce-scatter: {gloo_scatter['note'] or '(none)'}")
course.table(rows)

# %% [checks]
for rank in on_ring.result.ranks:
    scatters = [row for row in rank.comm_summary if row["op"] == "reduce_scatter"]
    assert scatters and all(row["algorithm"] == "ring" for row in scatters)
    for row in scatters:  # measured on the wire: (N−1)/N of the buffer, as the formula says
        assert row["sent_bytes"] * n_ring == (n_ring - 1) * row["payload_bytes"]
        assert row["sent_bytes"] == row["ring_cost_bytes"]
assert gloo_scatter["sent_bytes"] is None  # the backend ran it: nothing counted its wire
if backend == "gloo":
    assert "all-reduce" in gloo_scatter["note"]

# %% [markdown]
# On the ring, every rank sent exactly `(N−1)/N` of each reduce-scatter's buffer — measured,
# and equal to the ring cost. The backend's run has payloads and their ring cost, but no
# "sent" (—); on gloo the ledger's note above says what it runs instead, and [lesson 01](01_collectives.ipynb#Why-gloo's-times-are-not-a-ring's)
# why that is not a ring's cost. That an all-reduce splits into two halves costing the same
# in all is a property of the ring, not of every backend.
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
    rows.append({"strategy": result.strategy, "micro-batches": 3, RING_COST: cost,
                 "theory B/step": rank0.theory_comm_bytes_per_step,
                 "÷ DDP's 2(N−1)/N·Ψb": round(cost / theory.comm_bytes_per_step(0, psi, 2, b), 3),
                 "model states B": sum(rank0.model_state_bytes.values())})
course.table(rows)

# %% [checks]
for result in accumulation.results:
    for rank in result.ranks:
        assert rank.comm_ring_cost_bytes_per_step == rank.theory_comm_bytes_per_step
z1, z2 = (accumulation[name].ranks[0].comm_ring_cost_bytes_per_step for name in ("zero1", "zero2"))
assert z2 / z1 == (3 + 1) / 2  # (A + 1) halves against 2

# %% [markdown]
# ## Try it
#
# The bucket size and overlap of ZeRO-2's reduce-scatters: smaller buckets launch earlier
# and hold less, more calls pay more latency; with `overlap_comm` off each reduce-scatter
# blocks backward where it is launched. The timeline shades what is exposed (straggler waits
# apart); the bars on the right are each rank's peak — move the bucket size to `500000000`,
# DeepSpeed's default, larger than this model, and watch them grow to the one-bucket figure's.

# %%
course.TimelinePanel(work, "zero2", controls={"reduce_bucket_size": [1024, 2048, 4096, 16384, 500_000_000],
                                              "overlap_comm": True},
                     world_size=2, steps=3, precision="bf16-mixed", show_memory=True)

# %% [markdown]
# ## Summary
#
# - ZeRO-2 shards gradients and optimizer states: `2Ψ + 14Ψ/N` per rank, measured.
# - It gets there by reduce-scattering each bucket *during* backward and freeing it; no rank
#   ever holds all gradients, and on a ring it sends what DDP sends — the ring cost of the
#   measured payloads, and the bytes zerokit's ring counted: `(N−1)/N` of each buffer (on gloo
#   the wire carries more: lesson 01).
# - "All-reduce, then drop" ends with the same model states but peaks at the full
#   gradients and costs `3(N−1)/N·Ψb` — ZeRO-3's traffic for ZeRO-2's memory.
# - With accumulation, ZeRO-2 reduce-scatters every micro-batch: `(A + 1)/2` × DDP's bytes.
# - Small buckets cost calls, not bytes: each latency-bound call pays its rounds × α (lesson
#   01), which matters where α is large next to a bucket's transfer. One bucket larger than Ψ
#   makes two calls per step but holds every gradient until backward ends: the bucket size is
#   a bound on memory in flight as much as a number of calls.
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
# 2. *Does ZeRO-2 communicate more than DDP, and when would you pick ZeRO-1 instead?*
#
#    <details><summary>Answer</summary>
#
#    On a ring, not per step without accumulation (each reduce-scatter sends `(N−1)/N` of its
#    buffer, measured on zerokit's ring above); with A micro-batches it sends `(A + 1)/2` × as
#    much (the accumulation table). So with many micro-batches per step and memory to spare for
#    full gradients, ZeRO-1, which reduces once per step.
#
#    </details>
#
# 3. *What do small gradient buckets cost, and what do big ones?*
#
#    <details><summary>Answer</summary>
#
#    Small: one call per bucket, each paying the collective's latency (rounds × α) — many
#    calls where α is large. Big: fewer calls, but a bucket's gradients are held until it is
#    full and reduced, so one bucket ≥ Ψ holds all of them (as much as DDP) and starts reducing
#    only when backward ends. DeepSpeed's `reduce_bucket_size` (5e8 elements) bounds that.
#
#    </details>

# %% [markdown]
# **Exercise:** [exercises/05_zero2.ipynb](../exercises/05_zero2.ipynb) — graded by `zerokit grade 05` ·
# **Next:** [lesson 06 — ZeRO-3: sharding the parameters](06_zero3.ipynb)
