# %% [markdown]
# # 03 · Data parallelism: naive → bucketed → overlapped
#
# **The question.** The seed sums up data parallelism as *"每个GPU保存完整模型 … 自动AllReduce梯度同步"*
# — every GPU holds the whole model and the gradients are all-reduced — with the cost
# *"通信开销（每次迭代AllReduce）"*. How many bytes is that per step, does packing gradients
# into buckets change it, and how much of it can hide behind backward? (And is it true, as
# the seed says, that data parallelism stops scaling at N ≤ 8?)
#
# **What you will see.** Three data-parallel strategies built up one mechanism at a time —
# an all-reduce per tensor, then per bucket, then launched from gradient hooks during
# backward — and torch's own DDP beside them, all matching single-process training; the
# gradient bytes each all-reduces per step (the payload, measured) and their ring cost (the
# ring formula applied to that payload) against the theory's `2(N−1)/N·Ψb`; each rank's **timeline** with the
# **exposed** communication shaded; and a panel where the bucket size and overlap are yours.

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
tensors = len(list(work.build_model().parameters()))
bucket_mb = 0.02  # MiB: a few buckets of this model's fp32 gradients
print(f"{work.description}\nΨ = {psi:,} parameters in {tensors} tensors")

# %% [markdown]
# ## Three ways to average gradients
#
# Every rank holds the whole model, trains on its share of the global batch, and — before
# the optimizer step — the gradients are averaged over the ranks, so every replica takes
# the same step and they stay identical:
#
# - **`ddp-naive`**: after backward, one all-reduce per parameter tensor;
# - **`ddp-bucketed`**: after backward, gradients are copied into flat buckets of about
#   `bucket_mb` MiB, one all-reduce per bucket — fewer, larger calls;
# - **`ddp`**: the gradients *are* views into the buckets, and a bucket's all-reduce is
#   launched asynchronously from a gradient hook **as soon as the bucket is full**, while
#   backward goes on computing earlier layers (torch's reducer does this too);
# - **`torch-ddp`**: `torch.nn.parallel.DistributedDataParallel`, with the same bucket size.
#
# All four, against a single process training on the whole batch:

# %%
strategies = ["single", "ddp-naive", "ddp-bucketed", "ddp", "torch-ddp"]
bucketed = ("ddp-bucketed", "ddp", "torch-ddp")
report = compare(work, 2, strategies, steps=3, keep_records=True,
                 options_for=lambda name: {"bucket_mb": bucket_mb} if name in bucketed else {})
course.table(course.summary_rows(report), ["strategy", "N", "payload B/step (measured)",
                                           "ring cost B/step (formula on measured payload)",
                                           "theory B/step (formula on Ψ)", "calls/step",
                                           "model states B", "theory B", "|Δparam| vs single"])

# %%
gradient_bytes = psi * theory.param_bytes_per_element("fp32")
expected_bytes = theory.comm_bytes_per_step(0, psi, 2, theory.param_bytes_per_element("fp32"))
for name in strategies[1:]:
    result = report[name]
    assert result.param_diff["max_rel"] <= 1e-4  # the same training as one process, up to fp32 summation order
    for rank in result.ranks:
        assert rank.comm_payload_bytes_per_step == gradient_bytes  # measured: every gradient, once
        assert rank.comm_ring_cost_bytes_per_step == rank.theory_comm_bytes_per_step == expected_bytes
        assert sum(rank.model_state_bytes.values()) == rank.theory_model_states["total"]
assert report["ddp-naive"].ranks[0].comm_calls_per_step == tensors  # one all-reduce per tensor
assert report["ddp-bucketed"].ranks[0].comm_calls_per_step < tensors
assert report["ddp"].ranks[0].comm_calls_per_step == report["ddp-bucketed"].ranks[0].comm_calls_per_step

# %% [markdown]
# Every variant all-reduces every gradient once: the ledger measured `Ψ·4` bytes of payload
# per step, whose ring cost — the ring formula applied to that payload — is `2(N−1)/N·Ψ·4`
# per rank, the theory's number. (That is what a ring would send; gloo picks its own
# algorithm and reports no wire count, so the cost is a formula, not a measurement — lesson
# 01 measured the ring itself.) Every variant ends where single-process training ends, up
# to fp32 rounding (the ranks sum in another order). Buckets change the **number of calls**,
# never the bytes.
#
# ## The timeline
#
# Each rank's step on one time axis: compute on top (forward, backward, the optimizer step),
# communication below, from launch to known completion. The part of a collective during
# which the rank's compute thread was **blocked** waiting for it is shaded red: that is the
# **exposed** communication, the only part that adds to the step time. The last of the three
# steps, for the bucketed and the overlapped strategy:

# %%
last = range(2, 3)
fig, axes = plt.subplots(2, 1, figsize=(10, 5.4))
for ax, name in zip(axes, ["ddp-bucketed", "ddp"]):
    plot.timeline(report[name], ax=ax, steps=last)
    ax.set_title(f"{name}: " + ax.get_title(), fontsize=9)
fig.tight_layout()

# %%
positions = {name: [course.comm_launch_positions(rank, step=2) for rank in report[name].ranks]
             for name in ["ddp-naive", "ddp-bucketed", "ddp", "torch-ddp"]}
rows = []
for name in positions:
    for rank, row in zip(report[name].ranks, course.timeline_rows(zerokit.Report([report[name]]), last)):
        rows.append({**row, "launched during backward": positions[name][rank.rank]["during backward"],
                     "launched after backward": positions[name][rank.rank]["after backward"]})
course.table(rows, ["strategy", "rank", "calls/step", "launched during backward", "launched after backward",
                    "exposed ms/step", "step ms"])

# %%
from zerokit.runtime.timeline import comm_in_flight_s, exposed_comm_s

for rank in range(2):
    assert positions["ddp-naive"][rank]["during backward"] == 0       # everything waits for backward to end
    assert positions["ddp-bucketed"][rank]["during backward"] == 0
    assert positions["ddp"][rank]["during backward"] > 0              # buckets leave while backward computes
    assert positions["torch-ddp"][rank]["during backward"] > 0        # torch's reducer does the same
    overlapped = report["ddp"].ranks[rank]
    assert exposed_comm_s(overlapped, last) < comm_in_flight_s(overlapped, last)  # part of it is hidden

# %% [markdown]
# Without overlap every collective starts after backward and the rank waits for all of it.
# With overlap, all buckets but the last leave while backward is still computing; only
# what is still in flight when backward ends is exposed. The **last** bucket (the first
# layers, whose gradients come last) can never hide: it is why torch lets you make the
# first buckets small. (On this CPU the ranks' compute and gloo's threads share 2 cores, so
# the times are noisy; the launch positions are not.)
#
# torch's DDP waits inside its own reducer, where the ledger can't see it: its exposed time
# reads 0 — a limit of measuring a peer from outside, not a property of torch.
#
# ## Bucket size: calls, not bytes
#
# Sweep the bucket size of `ddp` from a few KiB to torch's default 25 MiB (one bucket here):

# %%
sizes = [0.005, 0.02, 0.05, 25.0]
sweep = {mb: zerokit.train(work, "ddp", world_size=2, steps=2, bucket_mb=mb, reference=False) for mb in sizes}
course.table([{"bucket_mb": mb, "calls/step": r.result.ranks[0].comm_calls_per_step,
               "payload B/step (measured)": r.result.ranks[0].comm_payload_bytes_per_step,
               "ring cost B/step (formula on measured payload)": r.result.ranks[0].comm_ring_cost_bytes_per_step,
               "theory B/step": expected_bytes,
               "step ms": round(1e3 * r.result.step_time_s_median, 1)} for mb, r in sweep.items()])

# %%
calls = [sweep[mb].result.ranks[0].comm_calls_per_step for mb in sizes]
assert calls == sorted(calls, reverse=True) and calls[-1] == 1
for r in sweep.values():
    assert all(rank.comm_payload_bytes_per_step == gradient_bytes for rank in r.result.ranks)
    assert all(rank.comm_ring_cost_bytes_per_step == expected_bytes for rank in r.result.ranks)

# %% [markdown]
# Small buckets: many calls, each paying the ring's latency (lesson 01), but the first
# can leave early. One huge bucket: one call, which can only start when the whole
# backward is done — no overlap at all. The sweet spot sits in between.
#
# ## Traffic per rank against the world size
#
# The seed claims data parallelism scales only to N ≤ 8. The bytes per rank say otherwise
# (the ring cost of the gradients the ledger measured, next to the theory on Ψ):

# %%
by_n = {n: zerokit.train(work, "ddp", world_size=n, steps=1, bucket_mb=bucket_mb, reference=False)
        for n in (2, 3, 4)}
b = theory.param_bytes_per_element("fp32")
course.volume_figure(
    {"ddp": {"N": list(by_n),
             "ring_cost": [r.result.ranks[0].comm_ring_cost_bytes_per_step / 1024 for r in by_n.values()],
             "theory_N": list(range(2, 17)),
             "theory": [theory.comm_bytes_per_step(0, psi, n, b) / 1024 for n in range(2, 17)]}},
    ylabel="KiB per rank per step (ring)", reference=(2 * psi * b / 1024, "2Ψb"),
    title="data parallelism: ring cost of the measured gradients per rank per step, and 2(N−1)/N·Ψb")

# %%
for n, r in by_n.items():
    assert all(rank.comm_payload_bytes_per_step == psi * b for rank in r.result.ranks)  # measured
    assert all(rank.comm_ring_cost_bytes_per_step == theory.comm_bytes_per_step(0, psi, n, b)
               for rank in r.result.ranks)

# %% [markdown]
# Per rank, the traffic of a step approaches `2Ψb` and stays there: it does not grow with
# the number of ranks. What limits data parallelism is memory — every rank holds all 16Ψ
# (lesson 02) — and the global batch size it implies, not N ≤ 8. That limit belongs to
# **tensor** parallelism, whose all-reduces per layer need a node's fast links.
#
# ## Try it
#
# Move the bucket size, switch overlap off and on, or pick another strategy: the panel
# trains again on 2 ranks and redraws the last step's timeline, with the calls, the ring
# cost of the measured payloads, the theory's bytes and the exposed time per rank below it.

# %%
course.TimelinePanel(work, ["ddp-naive", "ddp-bucketed", "ddp"],
                     controls={"bucket_mb": [0.005, 0.01, 0.02, 0.05, 0.1, 25.0], "overlap": True},
                     world_size=2, steps=3)

# %% [markdown]
# ## Summary
#
# - Data parallelism all-reduces `Ψb` of gradients per step — the payload, measured for four
#   implementations above, including torch's — which a ring sends as `2(N−1)/N·Ψb` per rank
#   (the ring cost, a formula on that payload), whatever the bucketing.
# - Buckets trade calls (latency) for how early communication can start.
# - Overlap launches each bucket from the gradient hooks during backward; only what is still
#   in flight when backward ends is exposed.
# - Bytes per rank are flat in N: data parallelism is limited by memory, not by N ≤ 8.
#
# ## Interview questions
#
# 1. *How many bytes does each GPU send per step in DDP, and does the bucket size change
#    it?* — `2(N−1)/N·Ψb`; no, only the number of calls (the sweep).
# 2. *How does DDP overlap communication with computation, and what can never overlap?* —
#    gradient hooks launch a bucket's all-reduce as soon as it is full, during backward; the
#    last bucket, launched when backward ends (the timeline and launch counts).
# 3. *Does data parallelism stop scaling at 8 GPUs?* — no: bytes per rank approach `2Ψb` for
#    any N; the "N ≤ 8" limit is tensor parallelism's.
