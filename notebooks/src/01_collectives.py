# %% [markdown]
# # 01 · Collectives: all-reduce = reduce-scatter + all-gather
#
# **The question.** The seed lists ZeRO's communication as *"分组AllGather/Reduce"* and says
# ZeRO *"将AllReduce拆分为多个小通信操作"* — splits the all-reduce into smaller operations.
# What *is* an all-reduce made of, how many bytes does each rank send for one, and why is it
# bandwidth, not latency, that sets its cost for gradients?
#
# **What you will see.** The ring algorithm drawn round by round; a ring reduce-scatter
# followed by a ring all-gather, run on real ranks over send/recv, giving exactly
# `torch.distributed.all_reduce`'s result; the bytes each phase really sent — counted on
# send/recv, measured — `(N−1)/N` of the tensor, next to the formula; the traffic per rank
# against the world size; the time of an all-reduce against its size, fitted by the
# latency–bandwidth (α-β) model; and what the course's ledger records for a backend's
# collective — its payload and its ring cost — and why gloo's times do not follow the ring.
#
# **Time:** about 25 min to read and run (the run itself: about 7 s on a 2-core laptop) ·
# **Needs:** lesson 00, nothing else ·
# **After it you can answer:** *Why is an all-reduce a reduce-scatter plus an all-gather?* ·
# *How many bytes does each GPU send per all-reduce, and how does that change from 8 to 64
# GPUs?* · *When is a collective latency-bound, and why does NCCL also use trees?* · *What
# is a collective's "ring cost", and why does a backend's time not follow it?*

# %%
%matplotlib inline
import matplotlib
import torch

import zerokit
from zerokit import course, ring, theory

matplotlib.rcParams["figure.dpi"] = course.DPI

# %% [markdown]
# ## The ring, round by round
#
# Cut the tensor into N chunks. In every round, each rank sends one chunk to its right
# neighbour and receives one from its left.
#
# - **Reduce-scatter** (N−1 rounds): the received chunk is *added* into the local one;
#   after N−1 rounds, rank r holds the full sum of chunk r — one N-th of the result.
# - **All-gather** (N−1 rounds): the received chunk is *copied*; after N−1 rounds every rank
#   holds every summed chunk.
#
# So an all-reduce is a reduce-scatter followed by an all-gather, `2(N−1)` rounds. Which
# chunk moves when is plain data, `zerokit.runtime.ring.ring_schedule(op, n, rank)`:

# %%
course.ring_schedule_figure(4, "all_reduce")

# %% [checks]
for rank in range(4):
    assert len(ring.ring_schedule("all_reduce", 4, rank)) == theory.ring_steps("all_reduce", 4) == 2 * (4 - 1)
    assert len(ring.ring_schedule("reduce_scatter", 4, rank)) == theory.ring_steps("reduce_scatter", 4)

# %% [markdown]
# **Check yourself.** How many rounds does a ring all-reduce take on 4 ranks? Predict it, then run the cell: it prints its
# verdict, and stops with an `AssertionError` if the run disagrees.

# %%
rounds = len(ring.ring_schedule("all_reduce", 4, 0))
print(f"a ring all-reduce on N = 4 ranks: {rounds} rounds; 2(N − 1) = {2 * (4 - 1)} — "
      f"{'as predicted' if rounds == 2 * (4 - 1) else 'not as predicted'}")
assert rounds == 2 * (4 - 1)

# %% [markdown]
# ## The two halves on real ranks
#
# `ring.ring_reduce_scatter` and `ring.ring_all_gather` run that schedule on
# `torch.distributed` send/recv and count every byte they send: their ledger records carry
# `sent_bytes`, **measured** on the wire, next to the payload (the tensor's bytes, measured).
# Run one after the other and compare with torch's own all-reduce of the same tensors:

# %%
def all_reduce_in_two_halves(ctx, numel):
    x = torch.randn(numel, generator=torch.Generator().manual_seed(ctx.rank)).to(ctx.device)
    shard, out = x.new_empty(numel // ctx.world_size), x.new_empty(numel)
    ring.ring_reduce_scatter(shard, x)   # rank r now holds the sum of chunk r
    ring.ring_all_gather(out, shard)     # every rank now holds every summed chunk
    expected = x.clone()
    torch.distributed.all_reduce(expected)
    rs, ag = zerokit.comm.ledger().records[-2:]
    return {"rank": ctx.rank, "payload B (measured)": rs.payload_bytes,
            "reduce-scatter sent B (measured)": rs.sent_bytes, "all-gather sent B (measured)": ag.sent_bytes,
            "max |ring − torch|": (out - expected).abs().max().item()}


world, numel = 4, 3 * 4096
rows = zerokit.launch(all_reduce_in_two_halves, world, numel)
for row in rows:
    row["ring formula: each half B"] = theory.ring_bytes_sent("reduce_scatter", row["payload B (measured)"], world)
course.table(rows)

# %% [checks]
for row in rows:
    assert row["max |ring − torch|"] < 1e-5  # same sum, another order of additions
    assert row["reduce-scatter sent B (measured)"] == row["all-gather sent B (measured)"] \
        == row["ring formula: each half B"]
    assert row["reduce-scatter sent B (measured)"] + row["all-gather sent B (measured)"] == theory.ring_bytes_sent(
        "all_reduce", row["payload B (measured)"], world)

# %% [markdown]
# Each half sends `(N−1)/N·S` — here 3/4 of the 48 KiB tensor — and together they send what
# an all-reduce sends, `2(N−1)/N·S`. This is why ZeRO can replace DDP's all-reduce by a
# reduce-scatter of the gradients and, later, an all-gather of the parameters **without
# sending one byte more** (lessons 04–05).
#
# ## Traffic per rank against the world size
#
# Time the ring all-reduce on 2, 3 and 4 ranks over payloads from 96 B to 6 MiB, and run the
# largest on 6 and 8 ranks too; every call records the bytes it really sent (`sent_bytes`,
# measured on send/recv).
#
# **Predict before you run.** The largest payload is S = 6 MiB. How many MiB does each rank
# send to all-reduce it on 2 ranks, and on 8 — 8× as much, 4×, or about the same?
#
# <details><summary>Answer</summary>
#
# 6 MiB on 2 ranks and 10.5 MiB on 8 — the dots of the picture below: `2(N−1)/N·S` is S at
# N = 2 and tends to 2S, so 4× the ranks cost each rank only 1.75× the bytes. What grows
# with N is the number of rounds, `2(N−1)`.
#
# </details>

# %%
payloads = [96 * 4 ** k for k in range(9)]  # 96 B … 6 MiB: whole chunks on 2, 3, 4, 6 and 8 ranks
points = course.time_ring_all_reduce([2, 3, 4], payloads, repeats=3)
largest = max(payloads)
at_largest = [p for p in points if p["payload_bytes"] == largest]
at_largest += course.time_ring_all_reduce([6, 8], [largest], repeats=1)  # bytes only: 8 ranks share 2 cores
series = {"ring all-reduce": {
    "N": [p["n"] for p in at_largest], "sent": [p["sent_bytes"] / 2**20 for p in at_largest],
    "theory_N": list(range(2, 9)),
    "theory": [theory.ring_bytes_sent("all_reduce", largest, n) / 2**20 for n in range(2, 9)]}}
course.volume_figure(series, ylabel="MiB sent per rank", reference=(2 * largest / 2**20, "2S"),
                     title=f"all-reduce of S = {largest / 2**20:.0f} MiB: bytes per rank approach 2S")

# %% [checks]
for p in points + at_largest:
    assert p["sent_bytes"] == theory.ring_bytes_sent("all_reduce", p["payload_bytes"], p["n"])  # measured = formula

# %%
growth = {f"{a} → {b} ranks": {"bytes per rank": theory.ring_bytes_sent("all_reduce", largest, b)
                                                 / theory.ring_bytes_sent("all_reduce", largest, a),
                               "rounds": theory.ring_steps("all_reduce", b) / theory.ring_steps("all_reduce", a)}
          for a, b in [(2, 4), (8, 64)]}
course.table([{"scaling": k, "bytes per rank ×": round(v["bytes per rank"], 3), "rounds ×": round(v["rounds"], 2)}
              for k, v in growth.items()])

# %% [markdown]
# `2(N−1)/N·S` grows from `S` at N = 2 towards `2S`: adding ranks barely adds bytes per
# rank. The ring is *bandwidth-optimal* — no all-reduce can send less per rank. What grows
# with N is the number of rounds, `2(N−1)`, each paying a fixed latency.
#
# ## Latency or bandwidth?
#
# The α-β model prices one collective as *rounds × α + bytes sent per rank / β*: α is the
# fixed cost of a round (a message's start-up), β the link's bandwidth. Fit it to the
# timings above (`course.fit_latency_bandwidth` takes the rounds and bytes from the ring
# formulas of `zerokit.theory` — equal, as just checked, to the bytes the ring sent):

# %%
fit = course.fit_latency_bandwidth(points)
course.latency_bandwidth_figure(points, fit)

# %% [markdown]
# Small calls sit on the flat part of the curve: their time is rounds × α, whatever their
# size. Large calls sit on the rising part: their time is bytes / β. Where does a gradient
# fall? Ask the fitted model about this notebook's tiny GPT (its fp32 gradient), about one
# of torch DDP's default 25 MiB buckets, and about the bf16 gradient of a 1.5 B-parameter
# GPT-2, all at N = 4:

# %%
psi_tiny = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2).param_count()
cases = {"tiny GPT, fp32 gradient": 4 * psi_tiny, "one 25 MiB DDP bucket": 25 * 2**20,
         "GPT-2 1.5B, bf16 gradient": 2 * 1_500_000_000}
rows = []
for name, size in cases.items():
    model = course.modelled_seconds(fit, "all_reduce", size, 4)
    rows.append({"payload": name, "S (B)": size, "latency ms": round(1e3 * model["latency_s"], 2),
                 "bandwidth ms": round(1e3 * model["bandwidth_s"], 2),
                 "latency share": f"{100 * model['latency_share']:.1f} %"})
course.table(rows)

# %% [checks]
largest_points = {p["n"]: p["seconds"] for p in points if p["payload_bytes"] == largest}
smallest_points = {p["n"]: p["seconds"] for p in points if p["payload_bytes"] == min(payloads)}
for n in largest_points:  # 65 536 × the bytes take longer, on every world size
    assert largest_points[n] > smallest_points[n]
shares = [course.modelled_seconds(fit, "all_reduce", size, 4)["latency_share"] for size in cases.values()]
assert shares == sorted(shares, reverse=True)  # the larger the payload, the smaller latency's share

# %% [markdown]
# Your α and β are this machine's (processes on one CPU, Python in every round), not a
# cluster's — but the shape holds everywhere: a gradient of real size is deep in the
# bandwidth regime, so the cost of data parallelism is *bytes per rank per step*, and that
# is what the rest of the course counts. Latency matters for many small calls — which is
# why DDP packs gradients into buckets (lesson 03).
#
# ## The latency term grows with N: why NCCL also has trees
#
# The ring's bytes per rank are nearly flat in N; its rounds are not. `2(N−1)` rounds, each
# paying α: 14α on 8 ranks, 2,046α on 1,024 — for a small message, the whole cost. Where the
# machine is quiet, the rounds measured above show it: the smallest payload runs 6 rounds on
# 4 ranks against 2 on 2 ranks (this run's two times are compared under the next table).
# NCCL therefore also runs all-reduce on a **tree** (a
# pipelined double binary tree): reduce up the tree, broadcast down, `2⌈log₂N⌉` hops — 20
# on 1,024 ranks — for about `2S/β` of bandwidth whatever N: twice the ring's
# `2(N−1)/N·S/β` at N = 2, a little more than it on many ranks. Small messages or many
# ranks: the tree; large messages on few ranks: the
# ring (NCCL chooses per call). `theory.communication.all_reduce_seconds` prices both —
# first with the α and β fitted on this machine, for one 25 MiB bucket:

# %%
from zerokit.theory.communication import all_reduce_rounds, all_reduce_seconds

bucket_bytes = cases["one 25 MiB DDP bucket"]
rows, latency = [], {}
for n in (2, 8, 64, 1024):
    ring_t, tree_t = (all_reduce_seconds(bucket_bytes, n, fit["alpha_s"], fit["beta_Bps"], a) for a in ("ring", "tree"))
    latency[n] = {"ring": ring_t["latency_s"], "tree": tree_t["latency_s"]}
    rows.append({"N": n, "ring hops 2(N−1)": all_reduce_rounds(n, "ring"), "tree hops 2⌈log₂N⌉": all_reduce_rounds(n, "tree"),
                 "ring latency ms": round(1e3 * ring_t["latency_s"], 2),
                 "ring total ms": round(1e3 * ring_t["total_s"], 1), "tree total ms": round(1e3 * tree_t["total_s"], 1)})
course.table(rows, title="α-β model with this machine's fitted α and β (a formula, extrapolated)")

# %%
course.show(course.speed_sentence(
    "the smallest payload on 4 ranks (6 rounds)", smallest_points[4], "on 2 ranks (2 rounds)", smallest_points[2],
    elsewhere="Where each rank has its own core or GPU, the 6 rounds take longer; two ranks sharing these cores "
              "with the others can hide it in the noise."))

# %% [checks]
for n in (2, 3, 4):  # the fitted model's latency term is the ring's 2(N−1) rounds of α
    assert course.modelled_seconds(fit, "all_reduce", min(payloads), n)["latency_s"] == \
        all_reduce_seconds(min(payloads), n, fit["alpha_s"], fit["beta_Bps"], "ring")["latency_s"]
assert latency[1024]["tree"] < latency[1024]["ring"] / 50  # log N against N

# %% [markdown]
# ### Your link
#
# This machine's α is a Python process's, not a GPU's. Type the α and β of the link you care
# about — a datasheet's or your own measurement (e.g. `nccl-tests`' `all_reduce_perf` on
# small and large sizes); the defaults below are **assumed** round numbers, not measured —
# and the model extrapolates both algorithms from 2 to 4,096 ranks for a few payloads:

# %%
my_link = {"alpha_s": 5e-6, "beta_Bps": 50e9}  # ← yours: seconds per hop, bytes per second (assumed here)
course.latency_bandwidth.all_reduce_scaling_figure(my_link, payload_bytes=[64 * 2**10, 25 * 2**20, 2**30],
                                 world_sizes=[2 ** k for k in range(1, 13)])

# %% [markdown]
# Solid lines, the ring: flat for large payloads (bandwidth-bound, bytes per rank barely
# grow), then rising linearly once `2(N−1)·α` dominates — the smaller the payload, the
# sooner. Dashed, the tree: its latency grows with log N, and its bandwidth term stays
# about `2S/β` whatever N — twice the ring's at N = 2, close to it at large N. So each
# payload's tree line starts above its ring line and crosses below it, at a world size that
# grows with the payload: the crossover is where `2S/(Nβ)` — the tree's extra bandwidth
# cost — equals `2(N − 1 − ⌈log₂N⌉)·α`, the latency it saves.
#
# ## Why gloo's times are not a ring's
#
# From lesson 03 on, the collectives are the backend's — gloo here, NCCL on GPUs — not
# zerokit's ring. For each call zerokit's **ledger** records, never mixed:
#
# - the **payload** B, *measured*: the bytes of the tensor the call was issued on (the input
#   of a reduce-scatter, the output of an all-gather);
# - the **ring cost**, a *formula*: what one rank sends for that payload under this lesson's
#   ring — `2(N−1)/N·B` for an all-reduce, `(N−1)/N·B` for a reduce-scatter or an
#   all-gather, in `2(N−1)` or `N−1` rounds (`theory.ring_bytes_sent` applied to B);
# - the **sent** bytes, *measured* — only when zerokit's ring ran the call on send/recv;
#   empty (—) for the backend's collectives, whose wire nothing in zerokit sees;
# - and the times, *measured*: when the call was issued, when it returned, how long the
#   rank was blocked in it.
#
# The ring cost is what the course holds every byte figure to: it is what the ZeRO paper
# counts, and what a ring sends on any machine. But a backend runs its own algorithms, so
# its bytes and its times need not follow this lesson's ring:
#
# - **gloo's all-reduce** (the one torch calls for CPU tensors) is a ring of its own: it cuts
#   every chunk into at least two segments and pipelines them, so it sends about the ring's
#   bytes in more, smaller messages — its time is not `2(N−1)·α + 2(N−1)/N·B/β` with this
#   lesson's α (fitted above on zerokit's Python ring);
# - **gloo's reduce-scatter is not a ring reduce-scatter**: torch's gloo backend runs a whole
#   all-reduce and keeps its slice, so it sends an all-reduce's bytes, twice its ring cost,
#   and takes at least an all-reduce's time. ZeRO-2 and ZeRO-3 pay that on gloo; the ring cost
#   in their tables does not show it;
# - **NCCL** chooses per call between rings and trees (above) and among its protocols, so
#   its times follow neither formula exactly; its reduce-scatter is a real one;
# - and **here every rank is a process on shared cores**: a call's time includes waiting for
#   a peer that has not arrived yet (a *straggler wait*, lesson 03), and the copies through
#   the loopback compete with the compute.
#
# So the course checks *bytes* against the ring formula, and reads *times* as this machine's:
# measured, compared by the numbers each run gives, never by a sentence typed in advance.
#
# **Predict before you run.** 2 ranks, a 16 MiB tensor. A reduce-scatter's ring cost is half
# an all-reduce's. Does gloo's reduce-scatter take about half the time of gloo's all-reduce?
# And zerokit's ring reduce-scatter, against zerokit's ring all-reduce?
#
# <details><summary>Answer</summary>
#
# On gloo, no: its reduce-scatter is an all-reduce and a slice, so it costs at least an
# all-reduce (the first sentence under the run gives this machine's times). zerokit's ring
# reduce-scatter runs half the rounds and sends half the bytes of its all-reduce — measured
# in the "sent" column. Whether its time halves too is this machine's to say: with Python
# in every round and the ranks sharing cores, the second sentence gives what this run
# measured — about half where the copies set the pace, within the noise where they don't.
#
# </details>

# %%
import statistics
import time


def gloo_and_ring(ctx, numel, repeats=9):
    """Each rank times the four calls, step starts aligned by a barrier; the ledger's last four records."""
    x = torch.ones(numel, device=ctx.device)
    shard = x.new_empty(numel // ctx.world_size)
    calls = {("gloo", "all_reduce"): lambda: zerokit.comm.all_reduce(x),
             ("gloo", "reduce_scatter"): lambda: zerokit.comm.reduce_scatter(shard, x),
             ("zerokit ring", "all_reduce"): lambda: ring.ring_all_reduce(x),
             ("zerokit ring", "reduce_scatter"): lambda: ring.ring_reduce_scatter(shard, x)}
    seconds = {key: [] for key in calls}
    for _ in range(repeats):
        for key, call in calls.items():
            torch.distributed.barrier()  # aligned starts: no straggler wait inside the time
            start = time.perf_counter()
            call()
            seconds[key].append(time.perf_counter() - start)
    return seconds, zerokit.comm.ledger().records[-len(calls):]


per_rank = zerokit.launch(gloo_and_ring, 2, 4 * 2**20)  # 4 Mi fp32 elements: 16 MiB
timing = {}
for key in per_rank[0][0]:  # a call lasts until its slowest rank returns
    slowest = [max(rank[0][key][i] for rank in per_rank) for i in range(len(per_rank[0][0][key]))]
    q1, _, q3 = statistics.quantiles(slowest, n=4)
    timing[key] = (statistics.median(slowest), (q3 - q1) / statistics.median(slowest))
course.table([{"algorithm": algorithm, "op": record.op, "payload B (measured)": record.payload_bytes,
               "ring cost B (formula)": record.ring_cost_bytes, "sent B (measured)": record.sent_bytes,
               "ms per call (measured)": round(1e3 * timing[(algorithm, record.op)][0], 2)}
              for (algorithm, _), record in zip(per_rank[0][0], per_rank[0][1])])

# %%
for algorithm, elsewhere in (
        ("gloo", "On NCCL, whose reduce-scatter is a real one, a large reduce-scatter would take about half an "
                 "all-reduce's time."),
        ("zerokit ring", "The ring's reduce-scatter has half the rounds and half the bytes of its all-reduce: "
                         "where each rank has a core of its own and the link sets the pace, about half the time.")):
    (rs, rs_spread), (ar, ar_spread) = timing[(algorithm, "reduce_scatter")], timing[(algorithm, "all_reduce")]
    course.show(course.speed_sentence(f"{algorithm}'s reduce-scatter", rs, f"{algorithm}'s all-reduce", ar,
                                      spread=max(rs_spread, ar_spread), elsewhere=elsewhere))

# %% [checks]
for (algorithm, op), record in zip(per_rank[0][0], per_rank[0][1]):
    assert record.op == op and record.payload_bytes == 16 * 2**20
    assert record.ring_cost_bytes == theory.ring_bytes_sent(op, record.payload_bytes, 2)  # the formula, on B
    assert record.sent_bytes == (record.ring_cost_bytes if algorithm == "zerokit ring" else None)  # wire: ring only

# %% [markdown]
# ## Try it
#
# Pick a collective, a world size and a payload; the panel runs the ring on that many ranks
# and shows the rounds and the bytes each rank sent (measured) next to the ring formula.
# Watch the rounds grow with N while the bytes per rank stay below the payload
# (reduce-scatter, all-gather) or twice it (all-reduce).

# %%
course.CollectivePanel(world_sizes=(2, 3, 4, 6, 8), payload_kib=(4, 64, 1024))

# %% [markdown]
# ## Summary
#
# - All-reduce = reduce-scatter + all-gather: the ring runs N−1 rounds of each, `2(N−1)` in all.
# - Each half sends `(N−1)/N·S` per rank, the all-reduce `2(N−1)/N·S` — measured on send/recv
#   above, equal to `theory.ring_bytes_sent`. Bytes per rank are nearly flat in N. From
#   lesson 03 on, the backend runs the collectives and the ledger can only apply this formula
#   to the payloads it measures: the **ring cost**, not a count of the wire.
# - Time = rounds·α + bytes/β. Real gradients are bandwidth-bound; latency is fought with
#   fewer, larger calls (buckets).
# - For a backend's collective the ledger records the **payload** (measured) and its **ring
#   cost** (the formula on it); only zerokit's ring measures what it sent. gloo's
#   reduce-scatter is an all-reduce underneath, so its bytes and its time are an all-reduce's:
#   the course checks bytes against the ring and reads times as this machine's.
# - The ring's latency term, `2(N−1)·α`, grows with N; a tree's, `2⌈log₂N⌉·α`, with log N —
#   which is why NCCL runs small messages and large worlds on trees.
#
# ## Interview questions
#
# 1. *Why is an all-reduce the same traffic as a reduce-scatter plus an all-gather?*
#
#    <details><summary>Answer</summary>
#
#    It *is* one: the ring all-reduce runs a reduce-scatter then an all-gather, `(N−1)/N·S`
#    each.
#
#    </details>
#
# 2. *Going from 8 to 64 GPUs, how much more does each GPU send per all-reduce?*
#
#    <details><summary>Answer</summary>
#
#    Barely more (the "8 → 64" row above): bytes per rank approach 2S, while the rounds grow 9×,
#    which only matters for small messages.
#
#    </details>
#
# 3. *Why does DDP bucket gradients instead of all-reducing each tensor?*
#
#    <details><summary>Answer</summary>
#
#    Each call pays `2(N−1)·α`; many small tensors are latency-bound, one large bucket is
#    bandwidth-bound.
#
#    </details>

# %% [markdown]
# **Exercise:** [exercises/01_ring_allreduce.ipynb](../exercises/01_ring_allreduce.ipynb) — the
# ring all-reduce from send/recv, graded by `zerokit grade exercises/01_ring_allreduce.ipynb` ·
# **Next:** [lesson 02 — anatomy of training memory](02_training_memory.ipynb)
