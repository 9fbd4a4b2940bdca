# %% [markdown]
# # 03 · Data parallelism: naive → bucketed → overlapped
#
# **The question.** The seed (the interview article the course answers, [docs/seed.md](../docs/seed.md))
# sums up data parallelism as *"every GPU keeps the whole model … the gradients are all-reduced
# automatically"* (“每个GPU保存完整模型 … 自动AllReduce梯度同步”), at the cost of *"communication
# overhead: an all-reduce every iteration"* (“通信开销（每次迭代AllReduce）”). How many bytes is
# that per step, does packing gradients into buckets change it, and how much of it can hide
# behind backward? (And is it true, as the seed says, that data parallelism stops scaling at
# N ≤ 8?)
#
# **Time:** about 30 min to read and run (the run itself: 11 s on a 2-core laptop) ·
# **Needs:** lessons 01 (the ring, α and β) and 02 (the 16Ψ of model states), nothing else ·
# **After it you can answer:** *How many bytes does each GPU send per step in DDP, and does the
# bucket size change them?* · *Does data parallelism stop scaling at 8 GPUs?* · *How does DDP
# overlap communication with backward, what can never overlap, and when does overlap pay?* ·
# *Is a rank blocked on an all-reduce always waiting for communication?*
#
# **What you will see.** Three data-parallel strategies built up one mechanism at a time —
# an all-reduce per tensor, then per bucket, then launched from gradient hooks during
# backward — and torch's own DDP beside them, all matching single-process training; the
# gradient bytes each all-reduces per step (the payload, measured) and their ring cost (the
# ring formula applied to that payload) against the theory's `2(N−1)/N·Ψb`; each rank's
# **timeline**, with the **exposed** communication split into the collective itself and the
# time a rank waited for a late peer; whether overlap pays on this machine, measured; the same
# strategies behind an **emulated 1 GbE link**; and a panel where the bucket size, overlap and
# the link are yours.

# %%
%matplotlib inline
import math
import statistics

import matplotlib

import zerokit
from zerokit import course, theory
from zerokit.cli import compare
from zerokit.course.tables import RING_COST, THEORY
from zerokit.course.timeline_figure import step_time

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
report = compare(work, 2, strategies, steps=5, keep_records=True,
                 options_for=lambda name: {"bucket_mb": bucket_mb} if name in bucketed else {})
course.table(course.summary_rows(report), ["strategy", "calls/step", "payload B/step (measured)", RING_COST,
                                           THEORY, "|Δparam| vs single"])

# %% [checks]
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
# **Check yourself.** Does the overlapped DDP send more per step than 2(N − 1)/N · Ψ · b? Predict it, then run the cell: it prints its
# verdict, and stops with an `AssertionError` if the run disagrees.

# %%
sent = report[strategies[-1]].ranks[0].comm_ring_cost_bytes_per_step
print(f"{strategies[-1]}: ring cost {sent:,} B per rank per step; 2(N − 1)/N · Ψ · b = {expected_bytes:,} B — "
      f"{'equal' if sent == expected_bytes else 'different'}")
assert sent == expected_bytes

# %% [markdown]
# Every variant all-reduces every gradient once: the ledger measured `Ψ·4` bytes of payload
# per step, whose ring cost — the ring formula applied to that payload — is `2(N−1)/N·Ψ·4`
# per rank, the theory's number (a formula, not a count of gloo's wire: [lesson 01, why
# gloo's times are not a ring's](01_collectives.ipynb#Why-gloo's-times-are-not-a-ring's)).
# Every variant ends where single-process training ends, up to fp32 rounding (the ranks sum
# in another order); its model states are the 16Ψ of lesson 02 on every rank (checked in the
# folded cell). Buckets change the **number of calls**, never the bytes.
#
# One figure in the table is not a whole number: `torch-ddp`'s calls per step, a mean over the
# run's steps. Before its first backward torch's DDP cannot know in which order the gradients
# will arrive, so its first iteration puts every gradient into one bucket (with
# `find_unused_parameters=False` and no static graph: torch's `compute_bucket_size_limits`);
# at the end of it the reducer rebuilds its buckets of `bucket_cap_mb` in the order the
# gradients came. The ledger, step by step:

# %%
steps_run = range(len(report["torch-ddp"].ranks[0].step_times_s))
per_step = {name: [sum(1 for c in report[name].ranks[0].comm_records if c["step"] == k and c["phase"] != "setup")
                   for k in steps_run] for name in ("ddp", "torch-ddp")}
for name, calls in per_step.items():
    print(f"{name:9s} all-reduces in steps {steps_run.start}–{steps_run.stop - 1}: {calls}, {sum(calls)} in "
          f"{len(calls)} steps = {sum(calls) / len(calls):g} per step")

# %% [checks]
torch_calls = per_step["torch-ddp"]
assert sum(torch_calls) / len(torch_calls) == report["torch-ddp"].ranks[0].comm_calls_per_step  # the table's figure
assert torch_calls[0] == 1  # the first iteration: every gradient in one bucket
assert set(torch_calls[1:]) == set(per_step["ddp"]) == {report["ddp"].ranks[0].comm_calls_per_step}  # then ddp's

# %% [markdown]
# ## The timeline
#
# Each rank's step on one time axis: compute on top (forward; backward, which ends where the
# last module's backward ends; "grad sync", the rest of `backward()` — the after-backward
# all-reduces of the non-overlapped strategies — and the optimizer step), communication
# below, from launch to known completion (in flight). The part of a collective during which
# the rank's compute thread was **blocked** is the **exposed** communication, the only part
# that adds to the step time. It has two parts, both read from the ledgers:
#
# - **straggler wait** (orange): blocked while the other rank had not even launched the same
#   collective — it was still computing (or, behind an emulated link below, still sleeping
#   out the link's time). No link carries anything then; the rank waits for its peer. Ranks
#   sharing a machine's cores (with everything else it runs) drift apart every step, so this
#   part can be most of the blocked time;
# - **exposed − wait** (red): blocked once both ranks had launched — the collective itself,
#   the communication that did not hide. This is the idea of the lesson.
#
# Each panel draws one step: of steps 1–4 (step 0 warms up), the one whose ranks waited least
# for each other, named in its title with every rank's two parts. Both panels share the x-axis
# (ms from the start of the step).

# %%
last, steady = range(4, 5), range(1, 5)
course.timeline_figure({name: report[name] for name in ["ddp-bucketed", "ddp"]}, steps=steady, calmest=True)

# %% [markdown]
# **Predict before you run.** `ddp-bucketed` and `ddp` cut the gradients into the same
# buckets. Of each one's buckets, how many all-reduces are launched while backward is still
# computing — and which of `ddp`'s buckets can never be?
#
# <details><summary>Answer</summary>
#
# `ddp-bucketed`: none, it waits for backward to end. `ddp`: all but one — 4 of its 5 here,
# the "launched during / after" column below — and torch's reducer does the same. The one
# left is the **last** bucket, holding the first layers' gradients, which backward computes
# last: it can only leave when backward is done. (The launch positions do not depend on the
# machine; the milliseconds do.)
#
# </details>

# %%
positions = {name: [course.comm_launch_positions(rank, step=4) for rank in report[name].ranks]
             for name in ["ddp-naive", "ddp-bucketed", "ddp", "torch-ddp"]}
rows = []
for name in positions:
    for rank, row in zip(report[name].ranks, course.timeline_rows(zerokit.Report([report[name]]), steady)):
        where = positions[name][rank.rank]
        rows.append({**row, "launched during / after backward": f"{where['during backward']} / "
                                                                 f"{where['after backward']}"})
course.table(rows, ["strategy", "rank", "launched during / after backward", "exposed − wait ms/step",
                    "straggler wait ms/step", "step ms"])

# %% [checks]
from zerokit.runtime.timeline import comm_in_flight_s, exposed_comm_s

for rank in range(2):
    assert positions["ddp-naive"][rank]["during backward"] == 0       # everything waits for backward to end
    assert positions["ddp-bucketed"][rank]["during backward"] == 0
    assert positions["ddp"][rank]["during backward"] > 0              # buckets leave while backward computes
    assert positions["torch-ddp"][rank]["during backward"] > 0        # torch's reducer does the same
    overlapped = report["ddp"].ranks[rank]
    assert exposed_comm_s(overlapped, last) < comm_in_flight_s(overlapped, last)  # part of it is hidden
for name in positions:  # the split adds up to the ledger's blocked time
    for row in course.timeline_stats(report[name], steady):
        assert math.isclose(row["exposed − wait ms"] + row["straggler wait ms"], row["exposed ms"], abs_tol=1e-9)

# %% [markdown]
# Without overlap every collective starts after backward and the rank waits for all of it.
# With overlap, all buckets but the last leave while backward is still computing; only what
# is still in flight when backward ends is exposed. The **last** bucket (the first layers,
# whose gradients come last) can never hide. (Table: medians over steps 1–4. torch's DDP waits
# inside its own reducer, where the ledger cannot see: its exposed time reads 0.)
#
# torch's DDP makes one bucket small, and it is the **first**, not that last one. With
# `bucket_cap_mb` left at its default (25 MiB), one bucket is capped at
# `torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB. After the first iteration the reducer
# rebuilds its buckets in the order the gradients arrived (`find_unused_parameters=False`, the
# default), and the 1 MiB cap goes to bucket 0: the last layers' gradients, which backward
# computes first and which are reduced first. A small first bucket fills early, so the first
# all-reduce leaves early in backward instead of waiting for 25 MiB of gradients — communication
# starts sooner; the exposed last bucket keeps its 25 MiB. (torch's reducer puts the small cap
# on the last bucket only when asked, `DDP_SET_LAST_BUCKET_CAP=1`, or with
# `find_unused_parameters=True`, whose buckets are never rebuilt and keep the small one for the
# first-defined parameters. A `bucket_cap_mb` you pass, as this lesson's `bucket_mb`, caps every
# bucket alike.)
#
# ## Does overlap pay on this machine?
#
# Overlap saves time only if there is communication to hide *and* something else runs it
# while the cores compute. Here the ranks talk through shared memory, and this model's
# gradients are 120 KB: what there is to hide is the "in flight" time printed below; and the
# machine may have as few cores as ranks: then gloo's threads, which run an all-reduce
# launched during backward, take a core that backward needed, and overlapped backward
# stretches (the backward compute printed below, with and without overlap). Where the cores
# are spare it stretches less. On a GPU the all-reduce is
# NCCL kernels on a stream of their own: they occupy some of the GPU's SMs and share its
# memory bandwidth with backward's kernels, so backward still stretches a little there —
# overlap lowers what communication costs the step, it does not remove it.
#
# **Predict before you run.** On your machine, will `ddp`'s step be shorter than
# `ddp-bucketed`'s?
#
# <details><summary>Answer</summary>
#
# It depends on the machine, and the sentences under the next cell give this run's verdict
# from its numbers. Where the ranks share every core expect little or nothing: little
# communication to hide, and backward stretched by the gloo threads that hide it. With spare
# cores, or on GPUs, the hidden part is a saving.
#
# </details>

# %%
stats = {name: course.timeline_stats(report[name], steady) for name in ["ddp-bucketed", "ddp"]}
mean = lambda name, key: statistics.mean(row[key] for row in stats[name])  # noqa: E731 - over the ranks
for name in stats:
    print(f"{name:13s} backward compute {mean(name, 'backward ms'):5.1f} ms, in flight {mean(name, 'in flight ms'):5.1f} "
          f"ms, exposed {mean(name, 'exposed − wait ms'):4.1f} ms once both launched + straggler wait "
          f"{mean(name, 'straggler wait ms'):4.1f} ms (each the mean of the ranks' medians); step "
          f"{1e3 * step_time(report[name], steady)[0]:5.1f} ms (the median over steps of the slower rank)")
(t_overlap, spread_overlap), (t_after, spread_after) = step_time(report["ddp"], steady), step_time(
    report["ddp-bucketed"], steady)
course.show(course.speed_sentence(
    "`ddp` (overlapped)", t_overlap, "`ddp-bucketed`", t_after, spread=max(spread_overlap, spread_after),
    elsewhere="Where the ranks have cores to spare, or on GPUs, backward stretches less and the hidden part of the "
              "communication comes off the step, less what the collectives still take from backward (on a GPU, "
              "NCCL's kernels hold some SMs and memory bandwidth)."))
with_overlap, without = (round(mean(name, "backward ms"), 1) for name in ("ddp", "ddp-bucketed"))
course.show(f"Backward computed for {with_overlap:.1f} ms with overlap and {without:.1f} ms without: "
            + ("longer with the all-reduces running beside it (by how much is this run's, noise included)."
               if with_overlap > without else "no longer with the all-reduces running beside it, on this run."))

# %% [markdown]
# Where ranks share cores, a straggler wait is one rank waiting for the other's compute, not
# for the wire. On a GPU, NCCL runs the all-reduce as kernels on a separate stream, on a few
# of the SMs, while backward's kernels compute on the rest, and the link is slow next to the
# compute: that is the case overlap was built for (the kernels still take SMs and memory
# bandwidth from backward, so what they hide is not quite free). This machine cannot show it
# with a real link — so emulate one.
#
# ## Behind an emulated link
#
# `zerokit.train(..., link=...)` keeps every collective running for real on gloo but holds
# its completion until an **emulated** link has carried the ring's bytes — each rank's
# transfers one after another, `rounds·α + bytes/bandwidth` by `theory.link_seconds`. The hold
# is a sleep, so the cores stay wholly free for backward — overlap's best case, freer than a
# GPU whose NCCL kernels take some SMs and memory bandwidth. A gradient big enough to matter on
# a link needs a bigger model: the tiny GPT at width 256 and 4 layers. First, what each named
# link would take for its gradients (the formula), against what this machine's gloo took
# (measured, `ddp-bucketed`, which waits for all of it). The links are those of
# `zerokit.theory.systems`, the table the planner reads too (each figure with its source there;
# `nvlink` and `pcie` are old names of two of them):

# %%
wide = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=256, n_layer=4, n_head=4, batch_size=12)
linked = {f"{name}, {link}": zerokit.train(wide, name, world_size=2, steps=5, bucket_mb=2.0, keep_records=True,
                                           reference=False, track_peak=False, link=link)
          for link in ("this machine", "1gbe") for name in ("ddp-bucketed", "ddp")}
calls = [c for c in linked["ddp-bucketed, this machine"].result.ranks[0].comm_records if c["step"] == 4]
gloo_ms = 1e3 * sum(c["t_end"] - c["t_launch"] for c in calls)
link_ms = {name: 1e3 * sum(zerokit.links.LINKS[name].seconds(c["op"], c["ring_cost_bytes"], 2) for c in calls)
           for name in theory.systems.LINKS}
old_names = {new: old for old, new in zerokit.links.ALIASES.items()}
rows = [{"link": name + (f" (or {old_names[name]})" if name in old_names else ""), "what": spec.what,
         "α µs": 1e6 * spec.latency, "GB/s": spec.bandwidth / 1e9, "link ms/step (formula)": round(link_ms[name], 2)}
        for name, spec in theory.systems.LINKS.items()]
print("links whose formula time exceeds this machine's gloo here, so their holds show:",
      ", ".join(name for name, ms in link_ms.items() if ms > gloo_ms) or "none")
course.table(rows + [{"link": "this machine", "what": "gloo, measured", "link ms/step (formula)": round(gloo_ms, 1)}])

# %% [markdown]
# A link only ever *delays* a collective: it completes at the later of gloo's end and the
# link's. Where the link's formula time is below gloo's own (the table's last row), nothing is
# held; where it is above — the links printed above the table — the holds show. The runs
# behind `1gbe` and on this machine alone, medians over steps 1–4, the mean of the two ranks:

# %%
columns = ("in flight ms", "exposed − wait ms", "emulated held ms", "straggler wait ms")
means = {label: {k: statistics.mean(row[k] for row in course.timeline_stats(r, steady)) for k in columns}
         for label, r in linked.items()}
display(course.table([{"run": label, "step ms": round(1e3 * step_time(r, steady)[0], 1),
                       **{k: round(means[label][k], 1) for k in columns}} for label, r in linked.items()]))
(t_overlap, spread_overlap), (t_after, spread_after) = (step_time(linked[f"{name}, 1gbe"], steady)
                                                        for name in ("ddp", "ddp-bucketed"))
course.show(course.speed_sentence(
    "`ddp` behind the emulated 1 GbE link", t_overlap, "`ddp-bucketed` behind it", t_after,
    spread=max(spread_overlap, spread_after),
    elsewhere="The link is emulated — a sleep while the cores go on with backward, overlap's best case (on a GPU, "
              "NCCL's kernels also take SMs and memory bandwidth from backward): where the link is slower than the "
              "compute, overlap hides what backward has time for."))
# how much of the link's time overlap hid: the link's formula time per step, less what ddp still held after backward
link_per_step, held = link_ms["1gbe"], means["ddp, 1gbe"]["emulated held ms"]
hidden_share = max(0.0, 1 - held / link_per_step)
course.show(f"Behind the emulated 1 GbE link, overlapped `ddp` still held {held:.1f} ms a step after backward "
            f"(the table), of the link's time per step in the links table above: it hid "
            f"{course.share_words(hidden_share)} the link's time ({hidden_share:.0%}).")

# %% [markdown]
# **Why can "in flight" be longer than the step?** The column sums each collective's
# launch-to-completion time. Behind the link, `ddp`'s buckets leave during backward and are
# carried one after another, so a bucket launched while others are still crossing waits in
# flight behind them, and each counts its whole wait: the sum can pass the step, while the time
# at least one bucket was in flight — the union of their spans — stays inside it
# (`zerokit.course.in_flight`). The same runs, medians over steps 1–4, the mean of the two ranks:

# %%
from zerokit.course.in_flight import in_flight_by_step

by_step = {label: [in_flight_by_step(rank, steady) for rank in r.result.ranks] for label, r in linked.items()}
in_flight = {label: {key: statistics.mean(statistics.median(row[key] for row in rows) for rows in per_rank)
                     for key in ("summed_s", "union_s")} for label, per_rank in by_step.items()}
course.table([{"run": label, "step ms": round(1e3 * step_time(linked[label], steady)[0], 1),
               "in flight ms (summed)": round(1e3 * v["summed_s"], 1),
               "at least one in flight ms": round(1e3 * v["union_s"], 1),
               "most in flight at once": max(row["most_at_once"] for rows in by_step[label] for row in rows)}
              for label, v in in_flight.items()])

# %% [checks]
for label, v in in_flight.items():
    assert math.isclose(1e3 * v["summed_s"], means[label]["in flight ms"], abs_tol=1e-6)  # the table above's figure
    for rows in by_step[label]:
        for row in rows:  # n spans at most k at once: their sum is at most k × their union
            assert row["union_s"] <= row["summed_s"] + 1e-12
            assert row["summed_s"] <= row["most_at_once"] * row["union_s"] + 1e-12

# %%
display(course.timeline_figure({label: linked[label] for label in ("ddp-bucketed, 1gbe", "ddp, 1gbe")},
                               steps=steady, calmest=True))
# ddp-bucketed's blocked time behind the link, as the table above splits it (the same rounding)
bucketed = {k: round(v, 1) for k, v in means["ddp-bucketed, 1gbe"].items()}
blocked = bucketed["exposed − wait ms"] + bucketed["straggler wait ms"]
against = "about" if abs(blocked / link_per_step - 1) <= 0.2 else "more than" if blocked > link_per_step else "less than"
course.show(
    f"After backward, `ddp-bucketed` waits for every bucket to cross the link (grey: the link busy). The table splits "
    f"its blocked time into {bucketed['exposed − wait ms']:.1f} ms once both ranks had launched and "
    f"{bucketed['straggler wait ms']:.1f} ms of straggler wait: {blocked:.1f} ms a step, {against} the link's "
    f"{round(link_per_step, 2):.4g} ms per step (the links table). "
    + ("Behind an emulated link a straggler wait can be the link too: each rank sleeps out its own copy of the "
       "link's time after each bucket, and the rank whose sleep ends first launches the next bucket and waits there "
       "for its peer, still asleep — waiting for the emulated wire, not for the peer's compute."
       if bucketed["straggler wait ms"] > 0 else "None of it was straggler wait on this run."))

# %% [checks]
gbe = zerokit.links.LINKS["1gbe"]
for label, r in linked.items():
    for rank in r.result.ranks:
        train = [c for c in rank.comm_records if c["phase"] != "setup"]
        if label.endswith("1gbe"):  # every collective booked on the link for its ring bytes and rounds
            assert all(c["link"] == "1gbe" and math.isclose(c["emulated_s"], theory.link_seconds(
                c["ring_cost_bytes"], theory.ring_steps(c["op"], 2), gbe.bandwidth_Bps, gbe.alpha_s)) for c in train)
        else:
            assert all(c["emulated_s"] == 0 and c["held_s"] == 0 for c in train)
exposed = {label: statistics.mean(row["exposed ms"] for row in course.timeline_stats(r, steady))
           for label, r in linked.items()}
assert exposed["ddp, 1gbe"] < exposed["ddp-bucketed, 1gbe"]  # overlap hides the link behind backward

# %% [markdown]
# Overlapped `ddp` launches each bucket as backward fills it, but the link carries them one
# after another: what it has carried by the end of backward is hidden, the rest is "emulated
# held" — the part of the link's time the sleep could not hide behind backward. Overlap can
# hide at most backward's own length of the link's time; the sentences under the table say
# how much it hid in this run and what the step came to. On a real link the link's time is the
# same formula, with no sleep on either rank to be read as a wait: it is the exposed − wait part
# that sets the step.
#
# ## Bucket size: calls, not bytes
#
# Sweep the bucket size of `ddp` from a few KiB to torch's default 25 MiB (one bucket here):

# %%
sizes = [0.005, 0.02, 0.05, 25.0]
sweep = {mb: zerokit.train(work, "ddp", world_size=2, steps=4, bucket_mb=mb, reference=False) for mb in sizes}
display(course.table([{"bucket_mb": mb, "calls/step": r.result.ranks[0].comm_calls_per_step,
               "payload B/step (measured)": r.result.ranks[0].comm_payload_bytes_per_step,
               RING_COST: r.result.ranks[0].comm_ring_cost_bytes_per_step,
               "median step ms, steps 1-3": round(1e3 * step_time(r)[0], 1)}
              for mb, r in sweep.items()]))
(t_small, spread_small), (t_one, spread_one) = step_time(sweep[sizes[0]]), step_time(sweep[sizes[-1]])
course.show(course.speed_sentence(
    f"{sweep[sizes[0]].result.ranks[0].comm_calls_per_step:.0f} buckets", t_small, "one bucket", t_one,
    spread=max(spread_small, spread_one),
    elsewhere="Where each call's latency α is large next to its bytes, the many small buckets pay it many times; "
              "where the link is slow and backward long, the one big bucket gives up all overlap."))

# %% [checks]
calls = [sweep[mb].result.ranks[0].comm_calls_per_step for mb in sizes]
assert calls == sorted(calls, reverse=True) and calls[-1] == 1
for r in sweep.values():
    assert all(rank.comm_payload_bytes_per_step == gradient_bytes for rank in r.result.ranks)
    assert all(rank.comm_ring_cost_bytes_per_step == expected_bytes for rank in r.result.ranks)

# %% [markdown]
# Small buckets: many calls, each paying the ring's latency (lesson 01), but the first
# can leave early. One huge bucket: one call, which can only start when the whole
# backward is done — no overlap at all. The sweet spot sits in between where the link is
# slow enough to matter; with as little communication to trade as here (this model's 120 KB
# over shared memory), the step times may not separate from their noise (the sentence above
# says whether they did).
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

# %% [checks]
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
# Move the bucket size, switch overlap off and on, pick another strategy or put the ranks
# behind an emulated link (a link only holds a collective when its formula time exceeds
# gloo's own: compare its grey spans with gloo's): the panel trains again on 2 ranks and
# redraws the last step's timeline, with the ring cost of the measured payloads and every
# rank's exposed time — the collective's part and the straggler wait apart — below it.

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
#   in flight when backward ends is exposed — the last bucket always is.
# - A rank's blocked time is the collective's exposed part plus straggler waits, the time a
#   late peer's compute kept it waiting; ranks sharing cores drift apart, and that part is not
#   the wire.
# - Overlap pays where there is communication to hide and something runs it beside the
#   compute — on a GPU, NCCL's kernels on their own stream (they still take some SMs and
#   memory bandwidth: overlap lowers the cost, it does not remove it), or the emulated link
#   here; it hides at most backward's length of the link's time. Where the ranks share every
#   core, the measured sentences above say what it came to.
# - Bytes per rank are flat in N: data parallelism is limited by memory, not by N ≤ 8.
#
# ## Interview questions
#
# 1. *How many bytes does each GPU send per step in DDP — does the bucket size change them, and do
#    they grow with N (does data parallelism stop scaling at 8 GPUs)?*
#
#    <details><summary>Answer</summary>
#
#    `2(N−1)/N·Ψb` under a ring; the bucket size changes only the number of calls, never the
#    bytes (the sweep). Per rank they approach `2Ψb` for any N, so no: the "N ≤ 8" limit is
#    tensor parallelism's; data parallelism is limited by memory (16Ψ on every rank).
#
#    </details>
#
# 2. *How does DDP overlap communication with computation, what can never overlap, and when
#    does overlap not pay?*
#
#    <details><summary>Answer</summary>
#
#    Gradient hooks launch a bucket's all-reduce as soon as it is full, during backward; the
#    last bucket, launched when backward ends, is always exposed. It does not pay when there is
#    little to hide and the communication competes with backward for the same cores — two
#    ranks on two shared CPU cores over shared memory. Behind a link slower than the compute
#    (here emulated) it hides the part of the link's time that backward lasts, and no more:
#    a link busy for longer than backward leaves the rest exposed.
#
#    </details>
#
# 3. *A timeline shows a rank blocked for 20 ms on an all-reduce. Is that 20 ms of communication?*
#
#    <details><summary>Answer</summary>
#
#    Not necessarily: part of it may be a straggler wait — the peer had not launched the
#    collective yet, still computing. Only the part after every rank launched is the
#    collective's exposed time; the rest is load imbalance (or noise on shared cores).
#
#    </details>

# %% [markdown]
# **Exercises:** [exercises/02_naive_ddp.ipynb](../exercises/02_naive_ddp.ipynb) — one all-reduce per
# gradient, graded by `zerokit grade 02`; then [exercises/03_bucketed_ddp.ipynb](../exercises/03_bucketed_ddp.ipynb)
# — buckets, graded by `zerokit grade 03` · **Next:** [lesson 04 — ZeRO-1: sharding the optimizer states](04_zero1.ipynb)
