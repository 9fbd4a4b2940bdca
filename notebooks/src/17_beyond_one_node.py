# %% [markdown]
# # 17 · Beyond one node: HSDP and ZeRO++
#
# **The question.** Lesson 06 counted ZeRO-3's traffic as one number, 3(N−1)/N·Ψ·b per rank
# per step, as if every link were the same. A cluster has two tiers: the GPUs of one node
# talk over NVLink, the nodes over a network several times narrower per GPU (how many
# times, the table of named systems below computes from their datasheets). Which of ZeRO-3's
# bytes cross that network, and what do FSDP2's **HSDP** (shard inside a node, replicate
# across) and DeepSpeed's **ZeRO++** (quantize the weights, keep a copy per node, quantize
# the gradients) each do about them — at what price in memory and in accuracy?
#
# **What you will see.** The two tiers' links of named systems, and for a 7 B model on 4 nodes of 8 GPUs the
# bytes each layout sends inside and across nodes, from `zerokit.theory`; the tiny GPT on
# 4 ranks laid out as 2 emulated nodes of 2, trained under `zero3`, `hsdp` (and torch's own
# HSDP, FSDP2 on a 2-D mesh) and `zeropp` (each of ZeRO++'s three pieces alone, then all
# three), every group's bytes read off the ledger next to its formula, the bytes leaving a
# node next to the paper's 3M → 0.75M, and the memory each layout holds; ZeRO++'s
# quantization error per step and its loss curve over a couple of hundred steps next to
# exact ZeRO-3; and a panel over the quantizer's block size and bits.
#
# **Time:** about 30 min to read and run (the run itself: about 20 s on a 2-core laptop) ·
# **Needs:** lesson 06 (ZeRO-3); lesson 11's first look at HSDP helps ·
# **After it you can answer:** *Which of ZeRO-3's bytes cross the network between nodes?* ·
# *What does HSDP trade for keeping them inside the node?* · *What are ZeRO++'s qwZ, hpZ
# and qgZ, and how does 3M become 0.75M?* · *What does quantizing the weights cost the
# training?*

# %%
%matplotlib inline
import matplotlib
import torch
from IPython.display import display

import zerokit
from zerokit import course, theory
from zerokit.theory import systems
from zerokit.zero.units import form_units
from zerokit.course.quantization_panel import loss_effect_figure
from zerokit.zero.zeropp_error import zeropp_loss_effect

matplotlib.rcParams["figure.dpi"] = course.DPI
N, G = 4, 2  # data-parallel ranks, ranks per emulated node: two nodes of two ranks
work = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=8)
UNITS = [sum(p.numel() for p in params) for _, _, params in form_units(work.build_model(), "block", set())]
PSI, B = work.param_count(), 2  # parameters; bytes per element of the bf16 weights and gradients
print(f"{work.description}\nΨ = {PSI:,} parameters in {len(UNITS)} ZeRO-3 units {UNITS}; "
      f"{N} ranks as {N // G} nodes of {G}")

# %% [markdown]
# ## Two tiers of links
#
# Inside a node, NVLink (PCIe where there is none); between nodes, InfiniBand or Ethernet,
# one network card per GPU at best. zerokit's named systems, `zerokit.theory.systems`, give
# each GPU's two bandwidths, one direction, each figure with its datasheet source
# (`systems.SYSTEMS["dgx-h100"].source`) — one table, read both by the planner (`zerokit plan
# --system dgx-h100`) and by the emulated links (`link="dgx-h100"`):

# %%
display(course.table([{"system": s.title, "inside a node": s.intra.what, "GB/s per GPU inside": s.intra.bandwidth / 1e9,
               "between nodes": s.inter.what, "GB/s per GPU between": s.inter.bandwidth / 1e9,
               "inside ÷ between": round(s.intra.bandwidth / s.inter.bandwidth, 1)}
                      for s in systems.SYSTEMS.values()]))
SYSTEM = systems.system(systems.DEFAULT_SYSTEM)  # the planner's default: the estimates below price its two tiers
fast, slow = SYSTEM.intra, SYSTEM.inter
dgx = [systems.system(name) for name in ("dgx-a100", "dgx-h100")]
course.show(" ".join(f"A {s.title}'s NVLink gives each GPU {s.intra.bandwidth / s.inter.bandwidth:.0f}× the "
                     f"bandwidth of its network card ({s.intra.bandwidth / 1e9:.0f} against "
                     f"{s.inter.bandwidth / 1e9:.0f} GB/s)." for s in dgx)
            + f" The estimates below price a rank's bytes on the planner's default, the {SYSTEM.title}.")

# %% [markdown]
# A collective over a group runs at the pace of its slowest hop. ZeRO-3's all-gathers and
# reduce-scatters run over **all** N ranks, so every ring crosses the node boundary, and
# where the network is that much narrower than NVLink, the bytes that **leave a node** set
# the step's communication time. Counting them: a ring's members inside one node are
# consecutive, so the ring leaves the node once, on an edge that carries one rank's bytes; a
# node of g GPUs holds g/k rings of a group with k members per node
# (`theory.ring_bytes_leaving_a_node`). So a flat ZeRO-3 ring sends as much out of each node
# as one rank sends in all; HSDP's all-reduce among one rank per node sends g times a rank's
# (smaller) share.
#
# For a 7 B model in bf16 on 4 nodes of 8 GPUs, per step (formulas: `theory.hierarchical_link_bytes`,
# `theory.zeropp_bytes_leaving_a_node`; GB = 10⁹ B):

# %%
P7, N7, G7, A = 7_000_000_000, 32, 8, 4  # parameters, GPUs, GPUs per node, micro-batches per step (last column)
LAYOUTS7 = {"ZeRO-3 over 32": ("zero3", {}), "HSDP: shard 8, replicate 4": ("hsdp", {"s": G7}),
            "ZeRO-3 + hpZ (8)": ("hpz", {"s": G7})}
layouts = {name: [theory.hierarchical_link_bytes(strategy, P7, N7, G7, B, micro_batches=a, **kw) for a in (1, A)]
           for name, (strategy, kw) in LAYOUTS7.items()}
zpp7 = [theory.zeropp_bytes_leaving_a_node([P7], N7, B, ranks_per_node=G7, hpz_partition_size=G7, micro_batches=a,
                                           quantized_weights=True, quantized_gradients=True) for a in (1, A)]


def link_s(v):
    """A rank's seconds on the links per step: its bytes inside the node at the fast tier's bandwidth, those on
    rings across nodes at the slow tier's (one rail per GPU, the planner's assumption; latency left out)."""
    return (theory.link_seconds(v["intra_node"], 0, fast.bandwidth, 0)
            + theory.link_seconds(v["inter_node"], 0, slow.bandwidth, 0))


course.table([{"layout": name, "a rank sends in its node, GB (formula)": round(v[0]["intra_node"] / 1e9, 2),
               "a rank sends across, GB (formula)": round(v[0]["inter_node"] / 1e9, 2),
               f"a rank's link time on a {SYSTEM.title}, s (estimate)": round(link_s(v[0]), 2),
               "leaving each node, GB (formula)": round(v[0]["leaving_node"] / 1e9, 2),
               f"… with {A} micro-batches, GB (formula)": round(v[1]["leaving_node"] / 1e9, 2)}
              for name, v in layouts.items()]
             + [{"layout": "ZeRO++: qwZ + hpZ (8) + qgZ", "a rank sends in its node, GB (formula)": "",
                 "a rank sends across, GB (formula)": "", f"a rank's link time on a {SYSTEM.title}, s (estimate)": "",
                 "leaving each node, GB (formula)": round(sum(zpp7[0].values()) / 1e9, 2),
                 f"… with {A} micro-batches, GB (formula)": round(sum(zpp7[1].values()) / 1e9, 2)}])

# %% [checks]
z3, hs = layouts["ZeRO-3 over 32"], layouts["HSDP: shard 8, replicate 4"]
assert z3[0]["intra_node"] == 0 and z3[0]["leaving_node"] == z3[0]["inter_node"]  # every ZeRO-3 ring spans the nodes
assert hs[0]["leaving_node"] < z3[0]["leaving_node"] * 2 / 3  # 2(r−1)/r·Ψb against 3(N−1)/N·Ψb
assert hs[1]["leaving_node"] == hs[0]["leaving_node"] and z3[1]["leaving_node"] == A * z3[0]["leaving_node"]
assert sum(zpp7[0].values()) < z3[0]["leaving_node"] / 3  # ZeRO++: about a quarter, the paper's 0.75M of 3M
# over A micro-batches the secondary copy serves every gather after the step's first: one gather crosses, A gradients
assert zpp7[1]["forward_all_gather"] == zpp7[0]["forward_all_gather"] and zpp7[1]["backward_all_gather"] == 0
assert zpp7[1]["gradient_reduce_scatter"] == A * zpp7[0]["gradient_reduce_scatter"]
hp = layouts["ZeRO-3 + hpZ (8)"]
assert hp[1]["leaving_node"] == (A + 1) / 2 * hp[0]["leaving_node"]  # hpZ alone: one gather and A reduce-scatters
assert link_s(hs[0]) < link_s(z3[0]) / 5  # the same traffic, mostly moved onto the fast tier

# %% [markdown]
# The time column is why layouts care: it prices each rank's bytes at its tier's bandwidth,
# and HSDP, sending about as many bytes in all as ZeRO-3, spends a fraction of ZeRO-3's
# time on the links, because most of its bytes move onto the fast tier. (An estimate on the
# planner's default system's two tiers, named in the column, one network card per GPU; the
# runs below count bytes.)
#
# HSDP's cross-node bytes are the replicas' all-reduce: 2(r−1)/r·Ψb leave each node,
# against ZeRO-3's 3(N−1)/N·Ψb — about half here with r = 4 replicas, two thirds with
# many: a cut, not a tenfold one. Its larger gain is in the last column:
# ZeRO-3 gathers and reduce-scatters across the nodes for every micro-batch, while HSDP's
# all-reduce waits for the step's last one (FSDP2's `set_requires_all_reduce(False)` on the
# others). ZeRO++ cuts the per-micro-batch bytes themselves: hpZ's secondary copy, filled by
# the step's first forward gather, serves every later gather of the step — the other
# micro-batches' forwards too, as DeepSpeed gathers from its `ds_secondary_tensor` until the
# optimizer's step changes the weights — so one int8 gather (0.5M) and A int4 gradient
# reductions (0.25M each) cross: (0.5 + 0.25·A)M, about 1.3M at A = 4, where ZeRO-3 sends
# 3A·M (the (n−1)/n and the scales kept in the table). hpZ alone likewise: (1 + A)M.

# %% [markdown]
# The rest of the lesson measures these ratios on the tiny GPT: 4 ranks, each pair of them an
# **emulated node** (`zerokit.train(..., ranks_per_node=2)`: ranks 0–1 on node 0, ranks 2–3
# on node 1; the ledger names each group by where it runs). The links here are this
# machine's loopback, so the lesson counts bytes, not seconds.
#
# ## HSDP: ZeRO-3 inside the node, replicas across
#
# FSDP2's `fully_shard(model, mesh=init_device_mesh("cuda", (r, s)))` — a 2-D mesh of r
# replicas × s shards, torchtitan's `dp_replicate × dp_shard`, DeepSpeed's MiCS — and
# zerokit's `hsdp` strategy (`shard_group_size=s`, by default one node): each group of s
# consecutive ranks runs ZeRO-3 among itself, gathering the parameters in forward and in
# backward and reduce-scattering the gradients — all over **`dp_shard`**, inside the node;
# then rank j of every group holds the same shard j of a partial sum, and the r ranks holding
# shard j all-reduce it over **`dp_replicate`**, across the nodes: the only bytes that leave.
# Per rank and step (ring formulas, `theory.hsdp_collective_bytes`):
# `3(s−1)/s·Ψb` inside, `2(r−1)/r·(Ψ/s)·b` across. The price: each rank holds 1/s of the
# model states, not 1/N. As FSDP2 with `set_requires_all_reduce(False)` on the micro-batches
# before the last, the replicas' all-reduce runs once per optimizer step, not after every
# micro-batch: in the last micro-batch's backward, each unit's all-reduce launched as soon as
# its reduce-scatter lands, in flight while the rest of backward computes (ledger phase
# `backward`; `replicate_all_reduce="step"` holds it to the step, all of it exposed). Next to
# zerokit's `hsdp`, torch's own: FSDP2's `fully_shard` on that 2-D mesh, run on gloo
# through zerokit's peer `fsdp2-hsdp`, its groups named on the same ledger.

# %%
def run(strategy, **options):
    """Two bf16-mixed steps of the tiny GPT on N ranks in emulated nodes of G, the ledger kept."""
    return zerokit.train(work, strategy, world_size=N, steps=2, precision="bf16-mixed", keep_records=True,
                         reference=False, ranks_per_node=G, **options).result


#: each ledger axis: (its group size, the stride between its ranks) — which says whether it leaves the node
GROUPS = {"dp": (N, 1), "dp_shard": (G, 1), "dp_replicate": (N // G, G), "hpz": (G, 1), "node": (G, 1),
          "inter_node": (N // G, G)}


def axis_rows(name, result):
    """Rank 0's bytes per step on each axis, measured (ring cost on the ledger's payloads) and from the formula."""
    rank = result.ranks[0]
    return [{"run": name, "axis": axis, "B/step (measured)": row["ring_cost_bytes"],
             "B/step (formula)": rank.theory_comm_bytes_by_axis[axis],
             "leaves the node?": "yes" if theory.group_spans_nodes(*GROUPS[axis], G) else "no",
             "leaving a node, B/step (formula on measured)":
                 theory.ring_bytes_leaving_a_node(row["ring_cost_bytes"], *GROUPS[axis], G)}
            for axis, row in rank.comm_bytes_by_axis.items()]


zero3, hsdp, fsdp2 = run("zero3"), run("hsdp", shard_group_size=G), run("fsdp2-hsdp", shard_group_size=G)
HSDP_RUNS = {"zero3": (zero3, "zero3"), f"hsdp (s = {G})": (hsdp, "hsdp"), f"fsdp2-hsdp (s = {G})": (fsdp2, "hsdp")}
course.table([row for name, (result, _) in HSDP_RUNS.items() for row in axis_rows(name, result)])

# %%
def leaving(result):
    return sum(r["leaving a node, B/step (formula on measured)"] for r in axis_rows("", result))


course.table([{"run": name, "leaving a node, B/step (formula on measured)": leaving(result),
               "leaving a node, B/step (formula)": theory.hierarchical_link_bytes(
                   strategy, PSI, N, G, B, s=G, units=UNITS)["leaving_node"],
               "model states B (measured)": sum(result.ranks[0].model_state_bytes.values()),
               "model states B (formula)": result.ranks[0].theory_model_states["total"]}
              for name, (result, strategy) in HSDP_RUNS.items()])

# %% [checks]
for result in (zero3, hsdp, fsdp2):
    for rank in result.ranks:
        for axis, row in rank.comm_bytes_by_axis.items():
            assert row["ring_cost_bytes"] == rank.theory_comm_bytes_by_axis[axis]  # each axis = its formula
assert set(hsdp.ranks[0].comm_bytes_by_axis) == {"dp_shard", "dp_replicate"}
hsdp_by = theory.hsdp_collective_bytes(PSI, N, G, B, units=UNITS)
assert hsdp.ranks[0].comm_bytes_by_axis["dp_replicate"]["ring_cost_bytes"] == sum(hsdp_by["replicate"].values())
assert leaving(hsdp) == theory.hierarchical_link_bytes("hsdp", PSI, N, G, B, s=G, units=UNITS)["leaving_node"]
assert leaving(zero3) == theory.hierarchical_link_bytes("zero3", PSI, N, G, B, units=UNITS)["leaving_node"]
assert leaving(hsdp) < leaving(zero3)
for result in (hsdp, fsdp2):  # the replicas' all-reduce in backward, in zerokit's HSDP as in torch's
    assert {r["phase"] for r in result.ranks[0].comm_records if r["axis"] == "dp_replicate"} == {"backward"}
for a, b in zip(hsdp.ranks, fsdp2.ranks):  # torch's HSDP moves the same bytes on each axis
    assert {k: v["ring_cost_bytes"] for k, v in a.comm_bytes_by_axis.items()} == \
        {k: v["ring_cost_bytes"] for k, v in b.comm_bytes_by_axis.items()}
assert sum(fsdp2.ranks[0].model_state_bytes.values()) == fsdp2.ranks[0].theory_model_states["total"]
states = {name: r.ranks[0].theory_model_states["total"] for name, r in (("zero3", zero3), ("hsdp", hsdp))}
assert states["hsdp"] > 1.9 * states["zero3"]  # 1/s of the states, not 1/N: twice ZeRO-3's at s = N/2

# %% [markdown]
# HSDP's gathers and reduce-scatters now run on `dp_shard`, inside the node, and what
# leaves a node is the replicas' all-reduce of one shard (on two nodes, under half of
# ZeRO-3's bytes; toward two thirds with many nodes, as the 7 B table showed). Its memory is
# ZeRO-3's over s ranks: the model states ÷ 8 on a node of 8 GPUs, whatever the number of
# nodes — fine while a node's memory holds the model's 16Ψ/s, out of reach once it does not.
# FSDP2 moves the same bytes on each axis; its states split differently (it keeps the
# sharded parameters in fp32 and casts them for compute, where zerokit keeps bf16
# parameters and fp32 masters in the optimizer), each total equal to its own formula.
# What a rank holds besides them follows FSDP2's defaults, where `zero3` follows
# DeepSpeed's: a unit's gradients stay in `.grad` until the unit is complete, one
# reduce-scatter is in flight, one unit is gathered ahead in backward and none in forward,
# and `zero_grad` frees the gradient shards; of the parameters it holds at most the shards,
# the root and two blocks (`theory.hsdp_peak_param_bytes`).
#
# ## ZeRO++: ZeRO-3's three collectives, each cut
#
# ZeRO++ (Wang et al. 2023, arXiv 2306.10209; DeepSpeed's `zero_quantized_weights`,
# `zero_hpz_partition_size`, `zero_quantized_gradients`) keeps ZeRO-3's sharding over all N
# ranks — its memory stays 16Ψ/N — and replaces each collective that crosses the nodes:
#
# - **qwZ** (§3.1), the forward all-gather: each rank sends its weight shard as int8 in
#   blocks, one scale per block (this lesson's exercise; `zerokit.zero.quantize`): about half of
#   bf16's bytes, each weight off by at most half its block's scale;
# - **hpZ** (§3.2), the backward all-gather: each node keeps a **secondary copy** of the
#   weights, sharded over its own g GPUs, filled from the step's first forward gather;
#   backward gathers from it, inside the node — and with gradient accumulation so do the
#   forwards of micro-batches 2 … A, until the step changes the weights, as DeepSpeed does.
#   Memory: + 2Ψ/g per rank;
# - **qgZ** (§3.3), the gradient reduce-scatter: an all-to-all in int4 blocks inside the
#   node, each rank summing its pieces, then a second all-to-all in int4 across the nodes:
#   a quarter of bf16's bytes cross, with a quantization error of its own.
#
# The paper counts what crosses nodes in units of M = the model's bf16 bytes, with
# (n−1)/n → 1 and the scales left out: ZeRO-3's M + M + M becomes 0.5M + 0 + 0.25M
# (`theory.paper_cross_node_volume`). zerokit counts it to the byte: the (n−1)/n, the
# padding and 4 bytes per block of scales kept (`theory.zeropp_bytes_leaving_a_node`).
#
# **Predict before you run.** With blocks of 256 elements (zerokit's default), by what
# factor does qwZ shrink the forward all-gather of bf16 weights — exactly 0.5, or a little
# more? And which axis do you expect hpZ's backward gather on?
#
# <details><summary>Answer</summary>
#
# A little more than 0.5: each block of 256 int8 codes carries a 4-byte float32 scale, so
# (256 + 4)/(2·256) ≈ 0.508, and a shard's short last block has a scale of its own. The
# qwZ run's `dp` row holds its two gathers (without hpZ the backward gather is quantized
# too, as DeepSpeed does) and the unchanged reduce-scatter. hpZ's gather runs on the `hpz`
# axis, the two ranks of one node: it never leaves it.
#
# </details>

# %%
PIECES = {"zero3": ("zero3", {}),
          "qwZ": ("zeropp", dict(zero_quantized_weights=True)),
          "hpZ": ("zeropp", dict(zero_hpz_partition_size=G)),
          "qgZ": ("zeropp", dict(zero_quantized_gradients=True)),
          "qwZ + hpZ + qgZ": ("zeropp", dict(zero_quantized_weights=True, zero_hpz_partition_size=G,
                                             zero_quantized_gradients=True))}
zpp = {name: (zero3 if name == "zero3" else run(strategy, **options)) for name, (strategy, options) in PIECES.items()}
course.table([row for name, result in zpp.items() for row in axis_rows(name, result) if name != "zero3"])

# %%
def zerokit_terms(name):
    """zerokit's count of the bytes leaving a node per step, by term, to the byte (scales and (n−1)/n kept)."""
    options = PIECES[name][1]
    return theory.zeropp_bytes_leaving_a_node(UNITS, N, B, ranks_per_node=G,
                                              hpz_partition_size=options.get("zero_hpz_partition_size", 1),
                                              quantized_weights=options.get("zero_quantized_weights", False),
                                              quantized_gradients=options.get("zero_quantized_gradients", False))


def paper_m(name):
    """The paper's cross-node volume, in M per step (ZeRO-3: 3)."""
    return theory.paper_cross_node_volume(quantized_weights="qwZ" in name, hpz="hpZ" in name,
                                          quantized_gradients="qgZ" in name)


base = leaving(zpp["zero3"])
cross = [{"run": name, "leaving a node, B/step (formula on measured)": leaving(result),
          "leaving a node, B/step (formula)": sum(zerokit_terms(name).values()),
          "÷ ZeRO-3's (formula on measured)": f"{leaving(result) / base:.3f}",
          "÷ ZeRO-3's (paper, in M)": f"{sum(paper_m(name).values()) / 3:.3f}",
          "model states B (measured)": sum(result.ranks[0].model_state_bytes.values())}
         for name, result in zpp.items()]
course.table(cross)

# %% [checks]
for name, result in zpp.items():
    for rank in result.ranks:
        for axis, row in rank.comm_bytes_by_axis.items():
            assert row["ring_cost_bytes"] == rank.theory_comm_bytes_by_axis[axis], (name, axis)
    assert leaving(result) == sum(zerokit_terms(name).values()), name  # bytes leaving a node: to the byte
third = zero3.ranks[0].theory_comm_bytes_by_axis["dp"] / 3  # ZeRO-3: forward gather, backward gather, reduce-scatter
qw_gathers = zpp["qwZ"].ranks[0].comm_bytes_by_axis["dp"]["ring_cost_bytes"] - third  # both gathers quantized
assert 0.5 < qw_gathers / (2 * third) < 0.53  # int8 + a float32 scale per 256: a little over half of bf16
assert "hpz" in zpp["hpZ"].ranks[0].comm_bytes_by_axis and not theory.group_spans_nodes(*GROUPS["hpz"], G)
assert {"node", "inter_node"} <= set(zpp["qgZ"].ranks[0].comm_bytes_by_axis)
all3 = leaving(zpp["qwZ + hpZ + qgZ"]) / base
assert 0.2 < all3 < 0.3  # the paper's 0.75M / 3M = 0.25, plus the scales and the (n−1)/n
hpz_extra = sum(zpp["hpZ"].ranks[0].model_state_bytes.values()) - sum(zero3.ranks[0].model_state_bytes.values())
assert hpz_extra == B * theory.hpz_secondary_numel(UNITS, N, G)  # the secondary copy: b·Σ P/s

# %% [markdown]
# Read the table from the paper's side: qwZ halves the forward term (a little over half:
# the scales), hpZ removes the backward term from the network (its gather is on `hpz`,
# inside the node) at the price of the secondary copy — the "model states" column's growth
# over `zero3` is exactly b·`theory.hpz_secondary_numel` — and qgZ sends the gradients as
# int4 across, a quarter of bf16, after a first hop inside the node. All three: about a
# quarter of ZeRO-3's bytes leave each node, the paper's 0.75M of 3M. Three choices to name.
# zerokit's hpZ gathers the secondary copy in bf16, as the paper's Fig. 5 draws it;
# DeepSpeed quantizes that gather too under qwZ. zerokit's quantizer uses a fixed block of
# `quantization_block_size` elements; DeepSpeed's qwZ chooses a group count per fetch (the
# shards of the parameters it gathers together, in groups of at most 8,000 elements) and
# its qgZ kernels use int4 groups sized by the tensor and the world. And zerokit's codes sit
# on a symmetric grid: scale = absmax/127 at int8 (absmax/7 at int4), codes −127 … 127, so
# ±absmax are on the grid and every weight comes back within scale/2. DeepSpeed's kernels
# use scale = absmax/128 (absmax/8) and the codes −128 … 127: −absmax is exact, +absmax is
# clipped to 127 and comes back a whole step low — the same bytes, about twice the worst
# error. `quantization_grid="deepspeed"` runs DeepSpeed's grid (`zerokit.zero.quantize`'s
# docstring reads both from DeepSpeed's source).
#
# ## What quantization costs the training
#
# The bytes are exact; the weights are not. With qwZ every forward (and backward) computes
# with ŵ, each weight within half its block's scale of w; the optimizer's shards stay exact,
# so errors do not pile up in the weights — but each step's gradient is a little off, and
# qgZ adds its own error to the gradients. No formula says how far the loss curve drifts;
# only a run does. `zeropp_loss_effect` trains ZeRO-3 and ZeRO++ (qwZ + qgZ, here on 2
# ranks as 2 nodes of one — hpZ changes where a gather runs, not what it returns) from the
# same weights on the same batches, in fp32 so that ZeRO-3 is exact and every difference is
# ZeRO++'s, and records each step's measured round-trip error next to its bound:

# %%
STEPS = 200
effect = zeropp_loss_effect(work, 2, STEPS, options=dict(zero_quantized_weights=True, zero_quantized_gradients=True),
                            ranks_per_node=1, precision="fp32")
weights, grads = effect["weight_error"], effect["gradient_error"]
# the loss curves; then the weights' and the gradients' errors, each on its own scale, the bound dashed over them
loss_effect_figure(effect, title=f"tiny GPT, {STEPS} steps, fp32, 2 ranks; ZeRO++ = qwZ + qgZ")

# %%
gap = [abs(d) for d in effect["loss_difference"]]
course.table([{"steps": f"{a}–{b - 1}", "mean loss ZeRO-3 (measured)": round(sum(effect["losses"]["zero3"][a:b]) / (b - a), 4),
               "mean |loss ZeRO++ − ZeRO-3| (measured)": round(sum(gap[a:b]) / (b - a), 4),
               "weights: max |w − ŵ| / largest scale/2": round(max(w["max_abs"] for w in weights[a:b])
                                                               / max(w["max_bound"] for w in weights[a:b]), 3),
               "elements over their bound": sum(w["over_bound"] + g["over_bound"]
                                                for w, g in zip(weights[a:b], grads[a:b]))}
              for a, b in ((0, 10), (10, 100), (100, STEPS))])

# %% [checks]
assert all(w["over_bound"] == 0 and g["over_bound"] == 0 for w, g in zip(weights, grads))  # every element in bound
assert all(w["max_abs"] <= w["max_bound"] * (1 + 1e-4) for w in weights)
assert effect["losses"]["zeropp"][-1] < effect["losses"]["zeropp"][0] - 1  # ZeRO++ trains
assert max(gap) < 0.1 * effect["losses"]["zero3"][0]  # and stays near exact ZeRO-3 on this model

# %% [markdown]
# Every weight and every gradient piece came back within its own block's scale/2 at every
# step (the bound is a theorem; `over_bound` counts the exceptions, and there are none). The
# loss curves are a measurement about *this* model and data: they agree closely, and the
# gap grows slowly as the runs' weights part ways, the way two runs with different
# rounding do. The paper reports the same kind of agreement for its pretraining runs
# against ZeRO-3. What the bound does not cover is a model whose
# blocks hold a few large outliers: its scale is set by the outlier, and the small weights
# of that block lose their digits — smaller blocks, at 4 bytes of scale each, are the
# remedy the panel below shows.
#
# **Check yourself.** In qwZ's forward all-gathers, each rank contributes its shard of each
# unit, ⌈u/N⌉ elements, as int8 codes plus a float32 scale per 256. How many bytes is that
# for the tiny GPT's units? Predict it with `theory.quantized_bytes`, then run the cell: it
# prints its verdict, and stops with an `AssertionError` if the ledger disagrees.

# %%
gathers = [r for r in zpp["qwZ"].ranks[0].comm_records if r["step"] == 1 and r["phase"] == "forward"]
measured = sum(r["payload_bytes"] for r in gathers) // N  # each all-gather's output holds N shards' messages
formula = sum(theory.quantized_bytes(-(-u // N), 256) for u in UNITS)  # one shard of each unit, int8, blocks of 256
print(f"one rank's forward shards, {len(gathers)} units: {measured:,} B on the ledger; theory.quantized_bytes: "
      f"{formula:,} B — {'the same, to the byte' if measured == formula else 'they differ'}")
assert measured == formula

# %% [markdown]
# ## Try it
#
# The quantizer on the tiny GPT's weights, all of them as one flat tensor: choose the block
# size and int8 or int4 (qgZ's width). The histogram shows how much of its bound each
# weight used (never more than all of it); the bars, the bytes against bf16 and fp32, with
# `theory.quantized_bytes` on the measured bar; the table under them, every block size at
# once — printed under the cell too, as the first draw left it, for a reader without a
# kernel. Try blocks of 16 against 4,096: the scales' bytes against the error of the small
# weights.

# %%
panel = course.QuantizationPanel(torch.cat([p.detach().reshape(-1) for p in work.build_model().parameters()]),
                                 block_size=256, bits=8)
display(panel)
panel.table()  # the table under the picture, as the first draw left it

# %% [markdown]
# ## Summary
#
# - A cluster has two tiers of links; ZeRO-3's all-gathers and reduce-scatters run over
#   every rank, so its rings cross the network, and what leaves a node per step is as much
#   as one rank sends in all (`theory.ring_bytes_leaving_a_node`).
# - HSDP shards inside a group of s ranks (a node) and all-reduces the shards across the
#   groups: the bytes leaving a node shrink to the replicas' all-reduce of one shard
#   (measured on `dp_shard` / `dp_replicate` = `theory.hsdp_collective_bytes`), and each rank
#   holds 1/s of the model states instead of 1/N.
# - ZeRO++ keeps ZeRO-3's 1/N and cuts each collective: qwZ sends the forward gather as int8
#   + scales, hpZ moves the backward gather into the node from a secondary copy (+ 2Ψ/g),
#   qgZ sends the gradients as int4 in two hops; the bytes leaving a node fall to about a
#   quarter (the paper's 3M → 0.75M; zerokit's count to the byte, scales included, matches
#   the ledger).
# - Quantization is exact in bytes and bounded per element: every weight within half its
#   block's scale, every step; the loss curve's drift is measured, not proved — small here.
#
# ## Interview questions
#
# 1. *Your ZeRO-3 job scales well on one node and poorly on four. Why, and what are the two
#    standard fixes?*
#
#    <details><summary>Answer</summary>
#
#    On one node every ring runs on NVLink; on four, every all-gather and reduce-scatter of
#    ZeRO-3 is a ring over all ranks that crosses the network, and each node sends out as
#    much as one rank sends in all — 3Ψb per step — over links several times narrower than
#    NVLink (the systems table at the top).
#    HSDP (FSDP2's 2-D mesh, MiCS) shards inside the node and only all-reduces a shard
#    across, at the price of 1/g instead of 1/N memory. ZeRO++ keeps 1/N and cuts the
#    cross-node bytes to about a quarter: int8 weights (qwZ), a per-node secondary copy for
#    backward (hpZ, + 2Ψ/g memory), int4 gradients in two hops (qgZ).
#
#    </details>
#
# 2. *How does ZeRO++ get from 3M to 0.75M, and what does the count leave out?*
#
#    <details><summary>Answer</summary>
#
#    ZeRO-3 moves M (the model's bf16 bytes) across nodes three times per step: forward
#    gather, backward gather, gradient reduce-scatter. qwZ sends the forward gather in int8
#    (0.5M), hpZ serves the backward gather from a copy inside the node (0), qgZ sends the
#    gradients in int4 across (0.25M). The count drops the (n−1)/n factors and the scales
#    (4 bytes per block of 256: 1.6 % over int8's codes, 3.1 % over int4's), and hpZ's
#    price in memory; the ratio measured to the byte differs from a quarter for those
#    reasons.
#
#    </details>
#
# 3. *Does quantizing the weights' all-gather make training diverge?*
#
#    <details><summary>Answer</summary>
#
#    Not by itself: only the gathered copy used for compute is quantized; the optimizer
#    steps the exact fp32 shards, so errors do not accumulate in the weights. Each element
#    is within half its block's scale (absmax/254 in int8 on zerokit's grid; on DeepSpeed's
#    absmax/256, but up to a whole step, absmax/128, near +absmax, which it clips), and
#    blocks keep one outlier from costing the whole tensor its precision. The effect on
#    the loss is an empirical question: measured here and in the paper, the curves stay
#    close to ZeRO-3's. Gradients are the touchier part: a ring reduce-scatter would
#    quantize and dequantize at each of its n−1 steps and pile the errors up; qgZ's two
#    all-to-all hops quantize twice, summing in full precision in between
#    (`theory.qgz_error_bound`).
#
#    </details>

# %% [markdown]
# **Exercise:** [exercises/17_quantized_allgather.ipynb](../exercises/17_quantized_allgather.ipynb)
# — block quantize and dequantize (int8, absmax per block, a short last block, an all-zero
# block) and the quantized all-gather through zerokit's ledgered collectives, graded by
# `zerokit grade 17` · **Next:** the path ends here: back to the [course map](README.md);
# [lesson 12 — the interview](12_the_interview.ipynb) gathers the axes, and lesson 11's
# planner (`zerokit plan --strategy hsdp`) sizes HSDP and hpZ for real clusters
