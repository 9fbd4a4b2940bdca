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
# send/recv, measured — `(N−1)/N` of the tensor, next to the formula; the traffic per rank against the world size; and the time
# of an all-reduce against its size, fitted by the latency–bandwidth (α-β) model.

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

# %%
for rank in range(4):
    assert len(ring.ring_schedule("all_reduce", 4, rank)) == theory.ring_steps("all_reduce", 4) == 2 * (4 - 1)
    assert len(ring.ring_schedule("reduce_scatter", 4, rank)) == theory.ring_steps("reduce_scatter", 4)

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

# %%
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

# %%
for p in points + at_largest:
    assert p["sent_bytes"] == theory.ring_bytes_sent("all_reduce", p["payload_bytes"], p["n"])  # measured = formula
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

# %%
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
# paying α: 14α on 8 ranks, 2,046α on 1,024 — for a small message, the whole cost. The
# rounds measured above already show it: the smallest payload takes longer on 4 ranks (6
# rounds) than on 2 (2 rounds). NCCL therefore also runs all-reduce on a **tree** (a
# pipelined double binary tree): reduce up the tree, broadcast down, `2⌈log₂N⌉` hops — 20
# on 1,024 ranks — for about `2S/β` of bandwidth, a little more than the ring's
# `2(N−1)/N·S/β`. Small messages or many ranks: the tree; large messages on few ranks: the
# ring (NCCL chooses per call). `theory.communication.all_reduce_seconds` prices both —
# first with the α and β fitted on this machine, for one 25 MiB bucket:

# %%
from zerokit.theory.communication import all_reduce_rounds, all_reduce_seconds

bucket_bytes = cases["one 25 MiB DDP bucket"]
rows = []
for n in (2, 8, 64, 1024):
    ring_t, tree_t = (all_reduce_seconds(bucket_bytes, n, fit["alpha_s"], fit["beta_Bps"], a) for a in ("ring", "tree"))
    rows.append({"N": n, "ring hops 2(N−1)": all_reduce_rounds(n, "ring"), "tree hops 2⌈log₂N⌉": all_reduce_rounds(n, "tree"),
                 "ring latency ms": round(1e3 * ring_t["latency_s"], 2), "tree latency ms": round(1e3 * tree_t["latency_s"], 2),
                 "ring total ms": round(1e3 * ring_t["total_s"], 1), "tree total ms": round(1e3 * tree_t["total_s"], 1)})
course.table(rows, title="α-β model with this machine's fitted α and β (a formula, extrapolated)")

# %%
assert smallest_points[4] > smallest_points[2]  # measured: 6 rounds of α take longer than 2
for n in (2, 3, 4):  # the fitted model's latency term is the ring's 2(N−1) rounds of α
    assert course.modelled_seconds(fit, "all_reduce", min(payloads), n)["latency_s"] == \
        all_reduce_seconds(min(payloads), n, fit["alpha_s"], fit["beta_Bps"], "ring")["latency_s"]
big = [row for row in rows if row["N"] == 1024][0]
assert big["tree latency ms"] < big["ring latency ms"] / 50  # log N against N

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
# sooner. Dashed, the tree: its latency grows with log N, so at scale it wins for all but
# the largest payloads, which it sends at a little less than the ring's bandwidth. The
# crossover is where `2S/(Nβ)` — the tree's extra bandwidth cost — equals
# `2(N − 1 − ⌈log₂N⌉)·α`, the latency it saves.
#
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
