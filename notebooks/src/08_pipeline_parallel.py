# %% [markdown]
# # 08 · Pipeline parallelism: schedules as data, the bubble, and 1F1B's memory
#
# **The question.** A pipeline gives each rank a contiguous slice of the layers (a
# **stage**) and streams **micro-batches** through them: rank i works on micro-batch j while
# rank i + 1 works on micro-batch j − 1. At the start and the end of every step some ranks
# have nothing to do — the **bubble**. How large is it: `(p − 1)/(m + p − 1)`, as GPipe
# writes it, or `(p − 1)/m`, as Megatron does — and which is right? What do 1F1B,
# interleaving and zero-bubble schedules change: the idle time, the memory, or both? And
# what does a pipeline send?
#
# **What you will see.** GPipe, 1F1B, interleaved 1F1B and ZB-H1 as tables of actions and as
# pictures, built from the same data the executor runs; the bubble simulated next to each
# schedule's formula, in both of the papers' forms, and measured on a real 2-rank run next to
# its simulation;
# the activations each rank stashes, measured, against the schedule's peak in flight; the
# point-to-point bytes next to `theory.pipeline_p2p_bytes`; and a panel where stages,
# micro-batches and the schedule change the picture.
#
# **Time:** about 20 min to read and run (the run itself: about 9 s on a 2-core laptop) ·
# **Needs:** lessons 00 (ranks) and 02 (what activations are), nothing else ·
# **After it you can answer:** *What is the pipeline bubble and how do you shrink it?* ·
# *1F1B idles as long as GPipe: why use it?* · *What does a zero-bubble schedule change, and
# when does it shorten a step?* · *What does a pipeline send?*

# %%
%matplotlib inline
import matplotlib
from IPython.display import display

import zerokit
from zerokit import course, theory
from zerokit.course.pipeline_panel import schedule_figure, side_by_side_figure
from zerokit.course.timeline_figure import step_time
from zerokit.pipeline_parallel import measured

matplotlib.rcParams["figure.dpi"] = course.DPI
NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1")

# %% [markdown]
# ## Schedules are data
#
# A schedule is, for each rank, the ordered list of what it does — written as torch's
# pipelining IR writes it: `1F0` is stage 1's forward of micro-batch 0, `0B3` stage 0's full
# backward of micro-batch 3; ZB-H1 splits the backward into `I` (the input gradient, which
# the previous stage waits for) and `W` (the weight gradient, which nobody waits for).
# `zerokit.schedule(name, stages, micro_batches, chunks)` builds one; here 4 stages and 8
# micro-batches (interleaved: 2 model chunks per rank, stage s on rank s mod 4):

# %%
p, m = 4, 8
schedules = {name: zerokit.schedule(name, p, m, chunks=2 if name == "interleaved" else 1) for name in NAMES}
for name in ("gpipe", "1f1b", "zb-h1"):
    print(schedules[name], end="\n\n")

# %% [markdown]
# - **GPipe**: all forwards, then all backwards. Every rank holds all m micro-batches'
#   activations before the first backward.
# - **1F1B** (PipeDream-Flush, Megatron): rank i does `p − i` warm-up forwards, then
#   alternates one forward, one backward. The same idle time, but a micro-batch's
#   activations are freed as soon as its backward runs.
# - **Interleaved 1F1B**: each rank holds v chunks of non-contiguous layers, so a
#   micro-batch passes every rank v times and the ramp-up is v times shorter.
# - **ZB-H1** (Qi et al., 2401.10241): 1F1B with each backward split into I and W, the W
#   passes moved into the idle slots.
#
# `zerokit.simulate` plays each schedule out without processes (t_b = 2·t_f, so for ZB-H1
# I = W = t_f), respecting only the dependencies: a stage's forward waits for the previous
# stage's forward of the same micro-batch, its backward for the next stage's backward.

# %%
simulated = {name: zerokit.simulate(s) for name, s in schedules.items()}
for name, result in simulated.items():  # each with its key: micro-batch colours, pass shades, the m.c labels
    display(schedule_figure(result, title=f"{name}, p = {p}, m = {m}: bubble {result.bubble_fraction:.1%} of the "
                                          f"step, peak micro-batches in flight per rank {result.peak_in_flight}"))

# %% [markdown]
# ## The bubble: simulated next to the formula
#
# With p equal stages and m micro-batches, the first rank starts the last forward after
# `m` forwards and the last rank ends its first backward `p − 1` slots late: the step takes
# `(m + p − 1)(t_f + t_b)` and each rank works `m(t_f + t_b)` of it — the **ideal** time, a
# step without a bubble — and idles `(p − 1)(t_f + t_b)`. The papers divide that idle time
# by different things, so the same bubble has two formulas:
#
# - **a share of the step** (of wall time): `(p − 1)/(m + p − 1)` — GPipe's form (Huang et
#   al. 2019, §2.3: O((K − 1)/(M + K − 1)) for K partitions), `theory.bubble_fraction`;
# - **a fraction of the ideal time**: `(p − 1)/m` — Megatron's form (Narayanan et al.
#   2021, §2.2.1: "bubble time fraction = (p − 1)/m"), `theory.bubble_over_ideal`. It is
#   the step's share x as x/(1 − x), larger, and grows past 1 when m < p − 1.
#
# Both hold for GPipe and 1F1B alike. Interleaving with v chunks divides the ramp by v:
# `(p − 1)/(v·m + p − 1)` of the step, Megatron's `(p − 1)/(v·m)` of the ideal time. ZB-H1
# (m ≥ p, I = W = t_f; Qi et al. 2024) has its own: `(p − 1)/(3m + p − 1)` of the step
# (`theory.zb_h1_bubble_fraction`), a third of 1F1B's idle time. Say which form a number
# is: "the bubble is 3/8" at p = 4, m = 8 is Megatron's form of GPipe's 3/11.
#
# **Predict before you run.** At p = 4 stages, what share of the step does GPipe idle with
# m = 8 micro-batches, and what share does 1F1B idle? How many micro-batches does rank 0 hold
# at its peak under each?
#
# <details><summary>Answer</summary>
#
# Both idle `(p − 1)/(m + p − 1) = 3/11 ≈ 27.3 %` of the step — `(p − 1)/m = 3/8` of the ideal
# time in Megatron's form — the `m = 8` rows of the table below, where the simulated bubble
# equals its schedule's formula in both forms. They differ in what rank 0 holds: all 8
# micro-batches under GPipe, `p − 0 = 4` under 1F1B (the last column). Interleaved's count is
# in *chunk* micro-batches — one micro-batch through one of rank 0's v chunks, 1/v of its
# layers — so its activations are that count ÷ v stages' worth, to compare with 1F1B's 4.
#
# </details>

# %%
#: each schedule's own closed form for the share of the step it idles
FORMULA = {"gpipe": "(p − 1)/(m + p − 1)", "1f1b": "(p − 1)/(m + p − 1)", "interleaved": "(p − 1)/(v·m + p − 1)",
           "zb-h1": "(p − 1)/(3m + p − 1)"}
rows, over_ideal = [], []
for m_ in (4, 8, 16):
    for name in NAMES:
        v = 2 if name == "interleaved" else 1
        result = zerokit.simulate(zerokit.schedule(name, p, m_, chunks=v))
        formula = theory.zb_h1_bubble_fraction(p, m_) if name == "zb-h1" else theory.bubble_fraction(p, m_, v)
        # Megatron's form: idle time over the ideal (busy) time, simulated; its closed form for all but ZB-H1
        ideal = result.bubble_fraction / (1 - result.bubble_fraction)
        over_ideal.append((name, m_, v, ideal))
        rows.append({"schedule (v)": f"{name} ({v})", "m": m_,
                     "÷ step (simulated · formula)": f"{result.bubble_fraction:.4f} · {formula:.4f}",
                     "÷ ideal time (simulated · Megatron's (p − 1)/(v·m))":
                         f"{ideal:.4f} · " + ("—" if name == "zb-h1" else f"{theory.bubble_over_ideal(p, m_, v):.4f}"),
                     # interleaved holds chunk micro-batches: each is one micro-batch through 1/v of the stage's layers
                     "peak in flight, rank 0": f"{result.peak_in_flight[0]} micro-batches" if v == 1 else
                     f"{result.peak_in_flight[0]} chunk micro-batches (1/{v} stage each: "
                     f"{result.peak_in_flight[0] / v:g} stages' worth)",
                     "share-of-step formula": FORMULA[name]})
course.table(rows)

# %% [checks]
for row in rows:
    simulated_, formula_ = (float(x) for x in row["÷ step (simulated · formula)"].split(" · "))
    assert abs(simulated_ - formula_) < 1e-4, row
for name, m_, v, ideal in over_ideal:  # Megatron's form: (p − 1)/(v·m) of the ideal time; ZB-H1: (p − 1)/(3m)
    assert abs(ideal - ((p - 1) / (3 * m_) if name == "zb-h1" else theory.bubble_over_ideal(p, m_, v))) < 1e-9, name
for m_ in (4, 8, 16):  # 1F1B idles exactly as long as GPipe, and holds min(p − i, m) micro-batches, not m
    gp, ofob = (zerokit.simulate(zerokit.schedule(n, p, m_)) for n in ("gpipe", "1f1b"))
    assert gp.bubble_fraction == ofob.bubble_fraction
    assert gp.peak_in_flight == [theory.peak_stashed_microbatches("gpipe", p, m_, i) for i in range(p)]
    assert ofob.peak_in_flight == [theory.peak_stashed_microbatches("1f1b", p, m_, i) for i in range(p)]

# %% [markdown]
# **Check yourself.** Does each schedule's simulated bubble equal its own formula —
# `(p − 1)/(m + p − 1)` for GPipe and 1F1B, `(p − 1)/(v·m + p − 1)` interleaved,
# `(p − 1)/(3m + p − 1)` ZB-H1 — in every row of the table? Predict it, then run the cell: it
# prints its verdict, and stops with an `AssertionError` if the run disagrees.

# %%
gaps = [abs(a - b) for a, b in (map(float, row["÷ step (simulated · formula)"].split(" · ")) for row in rows)]
print(f"{len(rows)} rows, {len(FORMULA)} schedules, each against its own formula: the largest gap is "
      f"{max(gaps):.1e} — {'each formula holds' if max(gaps) < 1e-4 else 'a formula does not hold'}")
assert max(gaps) < 1e-4

# %% [markdown]
# The only lever on the bubble of GPipe and 1F1B is m: more, smaller micro-batches. 1F1B
# leaves the idle time as it is — it buys **memory** (the next section). In the simulation
# (equal stage times, messages free) interleaving and ZB-H1 also shrink the idle time:
# interleaving at the price of v times more point-to-point messages, ZB-H1 by moving work
# that nobody waits for into the gaps. (ZB-H1's "in flight" counts a micro-batch until its W
# has run; W needs only the weight layers' inputs and output gradients, and the paper keeps
# ZB-H1's peak memory at 1F1B's.)
#
# ## Measured: a real pipeline on 2 ranks
#
# `zerokit.train(work, "pp", world_size=2, micro_batches=4, schedule=…)` cuts the GPT into
# 2 stages (embeddings with the first, final norm and head with the last) and runs the same
# actions over send/recv, recording each one's start and end. 5 steps of each schedule; the
# step time is the median over the last 4 of the longer of the two ranks' times. The memory ledger is off
# (`track_peak=False`): its bookkeeping of every saved tensor would cost more than these
# micro-batches' arithmetic. Per micro-batch, rank 0's forward and backward (B, or I + W for
# ZB-H1) are measured too: the simulation assumes B = 2·F and I = W = F.

# %%
work = zerokit.tiny_gpt(vocab=64, seq_len=64, d_model=128, n_layer=4, n_head=2, batch_size=16)
P2, M2 = 2, 4
runs = {name: zerokit.train(work, "pp", world_size=P2, steps=5, micro_batches=M2, schedule=name, optimizer="sgd",
                            lr=0.1, reference=(name == "1f1b"), track_peak=False)
        for name in ("gpipe", "1f1b", "zb-h1")}


def spans(report):
    return [r.pipeline_spans for r in sorted(report.results[0].ranks, key=lambda r: r.coords["pp"])]


def per_micro_batch_ms(real, kinds):
    """Rank 0's time in the given passes (F, B, I, W) in the last step, per micro-batch, measured."""
    return 1e3 * sum(end - start for a, start, end in real.spans[0] if a.kind in kinds) / M2


rows, timed = [], {}
for name, report in runs.items():
    sched = zerokit.schedule(name, P2, M2)
    real, sim = measured(sched, spans(report)), zerokit.simulate(sched)
    timed[name] = step_time(report)  # (median seconds, IQR / median)
    rows.append({"schedule": name, "bubble ÷ step (measured)": round(real.bubble_fraction, 3),
                 "bubble ÷ step (simulated)": round(sim.bubble_fraction, 3),
                 "step ms (measured)": round(timed[name][0] * 1e3, 1),
                 "forward ms / micro-batch": round(per_micro_batch_ms(real, "F"), 2),
                 "backward ms / micro-batch (B or I + W)": round(per_micro_batch_ms(real, "BIW"), 2)})
display(course.table(rows))
simulated_gain = 1 - zerokit.simulate(zerokit.schedule("zb-h1", P2, M2)).makespan / \
    zerokit.simulate(zerokit.schedule("1f1b", P2, M2)).makespan
course.show(course.speed_sentence(
    "ZB-H1", timed["zb-h1"][0], "1F1B", timed["1f1b"][0], spread=max(timed["zb-h1"][1], timed["1f1b"][1]),
    elsewhere=f"The simulation, where I + W cost what B costs and messages are free, makes ZB-H1's step "
              f"{simulated_gain:.0%} shorter than 1F1B's at p = {P2}, m = {M2}: a gain this machine shows only where "
              f"it exceeds the noise of two ranks sharing its cores."))

# %% [checks]
assert runs["1f1b"].results[0].max_abs_param_diff <= 1e-6  # the same training as one process
for name, report in runs.items():
    sched = zerokit.schedule(name, P2, M2)
    for rank in report.results[0].ranks:  # every rank ran its schedule's actions, in order
        assert [a for a, _, _ in rank.pipeline_spans] == [str(a) for a in sched.actions[rank.coords["pp"]]]
    real = measured(sched, spans(report))
    assert real.peak_in_flight == zerokit.simulate(sched).peak_in_flight
    assert 0 < real.bubble_fraction < 1

# %%
sched_1f1b = zerokit.schedule("1f1b", P2, M2)
side_by_side_figure(sched_1f1b, spans(runs["1f1b"]))

# %% [markdown]
# The order of the actions is exact — the same list, run — and so is what each rank holds
# (the checks above compare each rank's peak in flight with the simulation's). The **time is
# not** the simulation's, and the table says why from the run:
#
# - a rank's wait in a receive counts as idle, and two ranks share two CPU cores with
#   everything else running: the measured bubble sits above the simulated one;
# - the simulation assumes B = 2·F and, for ZB-H1, I + W = B. Compare the last two columns:
#   where the backward is not twice the forward, or the split backward costs more than the
#   whole one, the simulated bubble is not the one you get. zerokit's choice for W runs one
#   autograd call per weight-owning module (each Linear, LayerNorm and Embedding; torch's
#   pipelining splits at the same weight nodes), and each call has a fixed cost that is not
#   small next to a matmul this size;
# - on a GPU with layers large enough that each pass is its arithmetic, I + W ≈ B and a
#   rank's W passes fill the slots where it would wait, so ZB-H1's step approaches the
#   simulated one: when F, B and W take equal time, Qi et al. cut 1F1B's bubble to about a
#   third at the same peak memory.
#
# `benchmarks/RESULTS.md` ("Pipeline bubble") measured the bubble on a larger GPT: at p = 2
# it follows the formula for small m and stays near 0.25–0.35 as m grows (the formula falls
# to 0.11 at m = 8); at p = 4 on two cores it is 0.41–0.53 whatever the schedule, since four
# ranks can't compute at once on two cores. The simulation is the picture of a GPU cluster
# with equal stages; the run is the proof that the schedule runs.
#
# ## 1F1B's memory: the activations each rank stashes
#
# A stage must keep each micro-batch's activations from its forward until its backward.
# GPipe runs all m forwards first: every rank stashes m micro-batches. 1F1B starts the
# backwards after `p − i` forwards on rank i: `min(p − i, m)`. Measured on 4 ranks, 8
# micro-batches, one step, each rank's peak activation bytes from the memory ledger (a small
# GPT, so four ranks on two cores stay quick):

# %%
small = zerokit.tiny_gpt(vocab=64, seq_len=8, d_model=16, n_layer=4, n_head=2, batch_size=8)
P4, M8 = 4, 8
mem = {name: zerokit.train(small, "pp", world_size=P4, steps=1, micro_batches=M8, schedule=name, optimizer="sgd",
                           lr=0.1, reference=False) for name in ("gpipe", "1f1b")}
ranks = {name: sorted(report.results[0].ranks, key=lambda r: r.coords["pp"]) for name, report in mem.items()}
rows = []
for g, f in zip(ranks["gpipe"], ranks["1f1b"]):
    i = g.coords["pp"]
    per_micro = g.peak_by_category["activations"] / theory.peak_stashed_microbatches("gpipe", P4, M8, i)
    rows.append({"stage": i, "GPipe activations B (measured)": g.peak_by_category["activations"],
                 "1F1B activations B (measured)": f.peak_by_category["activations"],
                 "1F1B stash min(p − i, m)": theory.peak_stashed_microbatches("1f1b", P4, M8, i),
                 "1F1B B (computed: per micro-batch × stash)": round(per_micro * theory.peak_stashed_microbatches("1f1b", P4, M8, i)),
                 "1F1B ÷ GPipe": round(f.peak_by_category["activations"] / g.peak_by_category["activations"], 3)})
course.table(rows)

# %% [checks]
for g, f in zip(ranks["gpipe"], ranks["1f1b"]):
    i = g.coords["pp"]
    per_micro = g.peak_by_category["activations"] / theory.peak_stashed_microbatches("gpipe", P4, M8, i)
    expected = theory.peak_stashed_microbatches("1f1b", P4, M8, i) * per_micro
    assert abs(f.peak_by_category["activations"] - expected) <= 1e-9 * expected, i

# %%
fig, ax = course.new_figure(7, 3.0)
stages = [r["stage"] for r in rows]
ax.bar([s - 0.2 for s in stages], [r["GPipe activations B (measured)"] / 1024 for r in rows], 0.4, color="#8C8C8C",
       label="GPipe: m")
ax.bar([s + 0.2 for s in stages], [r["1F1B activations B (measured)"] / 1024 for r in rows], 0.4, color="#4C72B0",
       label="1F1B: min(p − i, m)")
ax.set_xticks(stages, [f"stage {s}" for s in stages])
ax.set_ylabel("activations at peak, KiB (measured)")
ax.set_title(f"p = {P4}, m = {M8}: micro-batches stashed per stage, measured", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
fig

# %% [markdown]
# The first stage stashes the most — p micro-batches under 1F1B, whatever m — which is why
# 1F1B lets m grow (and the bubble shrink) without the memory growing with it.
#
# ## What a pipeline sends
#
# Only point-to-point messages, at the stage boundaries: per boundary per step, m
# activations of `b·s·h` forward and m gradients of the same size back
# (`theory.pipeline_p2p_bytes`) — no collective, and nothing that grows with the parameter
# count. A middle stage has two boundaries. From the 1F1B run above (fp32, micro-batch of
# `8/8 = 1` sequence). A send is counted as the bytes handed to it; the caveat about gloo's
# collectives ([lesson 01, why gloo's times are not a ring's](01_collectives.ipynb#Why-gloo's-times-are-not-a-ring's))
# concerns collectives, and a pipeline runs none:

# %%
b_micro = 8 // M8
per_boundary = theory.pipeline_p2p_bytes(8, b_micro, 16, M8, element_bytes=4)
rows = []
for rank in ranks["1f1b"]:
    i = rank.coords["pp"]
    boundaries = (i < P4 - 1) + (i > 0)
    rows.append({"stage": i, "boundaries": boundaries, "ops": ", ".join(sorted({row["op"] for row in rank.comm_summary})),
                 "sent B/step (measured)": rank.comm_bytes_by_axis["pp"]["ring_cost_bytes"],
                 "sent B/step (formula)": boundaries * per_boundary,
                 "calls/step": rank.comm_bytes_by_axis["pp"]["calls"]})
course.table(rows)

# %% [checks]
for rank, row in zip(ranks["1f1b"], rows):
    assert set(rank.comm_bytes_by_axis) == {"pp"} and row["ops"] in ("recv, send",)
    assert row["sent B/step (measured)"] == row["sent B/step (formula)"]  # boundaries × theory.pipeline_p2p_bytes
    assert row["calls/step"] == 2 * row["boundaries"] * M8  # a send and a receive per micro-batch each way

# %% [markdown]
# ## Try it
#
# Stages, micro-batches, the schedule and (for interleaved) the chunks: the panel builds the
# schedule, simulates it and redraws, with the bubble next to the formula and each rank's
# peak in flight. Watch the bubble shrink as m grows, 1F1B's picture idle exactly as long as
# GPipe's, and ZB-H1's W passes fill the gaps.

# %%
course.PipelinePanel(stages=(2, 3, 4, 8), micro_batches=(1, 2, 4, 8, 16, 32), p=4, m=4, name="1f1b")

# %% [markdown]
# ## Summary
#
# - A schedule is a list of actions per rank; the simulator, the pictures and the executor
#   read the same list, and a real run executes it in order.
# - GPipe and 1F1B idle `(p − 1)/(m + p − 1)` of the step — `(p − 1)/m` of the ideal time,
#   as Megatron states the same bubble (simulated = formula, in both forms); only more
#   micro-batches shrink it. Interleaving: `(p − 1)/(v·m + p − 1)` of the step, `(p − 1)/(v·m)`
#   of the ideal time; ZB-H1 fills the bubble with weight-gradient passes, `(p − 1)/(3m + p − 1)`
#   of the step. A bubble figure means little until it says which of the two it divides by.
# - Measured on 2 shared CPU cores the bubble is noisy and larger than simulated; the order
#   of the actions and what each rank holds are exact. ZB-H1 shortens a real step only where
#   I + W costs about what B costs and the gain exceeds the noise: the sentence under the
#   measured table says what this machine showed.
# - 1F1B stashes `min(p − i, m)` micro-batches on stage i instead of m (measured); a
#   pipeline sends only point-to-point activations and gradients, `m·b·s·h` per boundary
#   each way (= `theory.pipeline_p2p_bytes`).
#
# ## Interview questions
#
# 1. *What is the pipeline bubble and how do you shrink it?*
#
#    <details><summary>Answer</summary>
#
#    The time a stage idles while the pipeline fills and drains: `(p − 1)/(m + p − 1)` of the
#    step, or `(p − 1)/m` of the ideal time as Megatron writes it — the same idle time over
#    another denominator, so say which. Shrink it with more micro-batches, interleaved chunks
#    (`v·m`), or zero-bubble schedules that move weight-gradient work into the gaps (the
#    simulated table and the panel).
#
#    </details>
#
# 2. *1F1B has the same bubble as GPipe: why use it?*
#
#    <details><summary>Answer</summary>
#
#    Memory: stage i holds `min(p − i, m)` micro-batches' activations, not m, so m can grow
#    without the memory growing (the measured bars).
#
#    </details>
#
# 3. *What does pipeline parallelism communicate, compared with tensor parallelism?*
#
#    <details><summary>Answer</summary>
#
#    Only activations and their gradients at stage boundaries, `m·b·s·h` each way per step,
#    point to point; TP all-reduces `b·s·h` four times per layer, which is why PP crosses nodes
#    and TP stays inside one (the traffic table).
#
#    </details>

# %% [markdown]
# **Exercise:** [exercises/08_one_f_one_b.ipynb](../exercises/08_one_f_one_b.ipynb) — 1F1B written
# as data, graded by `zerokit grade 08`; then [exercises/14_interleaved_1f1b.ipynb](../exercises/14_interleaved_1f1b.ipynb)
# — interleaved 1F1B, graded by `zerokit grade 14` · **Next:** [lesson 09 — CPU offload: the optimizer on the
# host](09_offload.ipynb)
