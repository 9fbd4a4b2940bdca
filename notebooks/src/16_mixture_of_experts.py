# %% [markdown]
# # 16 · Mixture of experts: routing, capacity, and the all-to-all
#
# **The question.** A mixture-of-experts (MoE) layer replaces the MLP by E experts and lets a
# router send each token to k of them: E times the parameters, k experts' compute per token.
# How does a token find its experts, what happens when too many tokens pick the same one,
# what keeps the router from choosing one expert for everything — and when the experts live
# on different ranks, what must travel, how many bytes is it, and why do DeepSpeed-MoE and
# Megatron move *tokens* to the experts rather than split the experts with tensor
# parallelism?
#
# **What you will see.** One MoE layer's router measured: top-k, gates, the output rebuilt
# by hand; the slots each expert receives and the slots dropped as the capacity factor
# changes; the Switch / GShard load-balancing loss measured at initialisation, on a skewed
# router and while it trains the router; the tiny MoE GPT trained with its experts on two
# ranks (`parallel={"dp": 2, "ep": 2}`) next to one process, every all-to-all in the ledger
# next to `theory.moe_dispatch_payload` and `theory.moe_alltoall_bytes`, the parameters each
# rank holds; expert parallelism against tensor parallelism on the experts, byte for byte
# from `zerokit.theory`; and a panel over experts, top-k, capacity and ep.
#
# **Time:** about 25 min to read and run (the run itself: about 5 s on a 2-core laptop) ·
# **Needs:** lessons 03 (data parallelism) and 07 (tensor parallelism), nothing else ·
# **After it you can answer:** *What does a MoE layer's capacity factor trade?* · *What is
# the load-balancing loss, and what is its value when routing is even?* · *How many bytes
# does expert parallelism move per layer?* · *Expert parallelism or tensor parallelism for
# the experts?*

# %%
%matplotlib inline
import matplotlib
import torch

import zerokit
from zerokit import course, theory
from zerokit.cli import compare
from zerokit.expert_parallel import MoEMLP

matplotlib.rcParams["figure.dpi"] = course.DPI
B, S, H, L, E, K = 8, 16, 32, 2, 4, 2  # sequences, tokens per sequence, width, layers, experts, top-k
work = zerokit.tiny_gpt(vocab=64, seq_len=S, d_model=H, n_layer=L, n_head=2, batch_size=B, n_experts=E, top_k=K)
print(f"{work.description}\nΨ = {work.param_count():,} parameters")

# %% [markdown]
# ## Routing: top-k and the gates
#
# The router is one linear layer, `d → E`: its softmax gives each token a probability per
# expert; the token goes to its **top-k** experts, and its output is the sum of their
# outputs weighted by those probabilities — the **gates** (Shazeer et al. 2017; GShard
# 2006.16668; Switch 2101.03961 with k = 1). A (token, chosen expert) pair is a **slot**: a
# batch of T tokens makes T·k slots. The gates are how the router learns: a chosen expert's
# output reaches the loss multiplied by its gate. zerokit's choice: the gates are the
# softmax probabilities of the chosen experts as they are; GShard's top-2, DeepSpeed's
# top-2 gate and Mixtral renormalise the k gates to sum to 1.
#
# One layer (E = 4, k = 2, d = 32) on 8 sequences of 16 random tokens; the first four
# tokens' routing, and the layer's output rebuilt by hand from the gates and the experts:

# %%
torch.manual_seed(0)
layer = MoEMLP(H, E, top_k=K)
x = torch.randn(B, S, H)
y = layer(x).detach()
probs = torch.softmax(layer.router(x), dim=-1)
gates, chosen = probs.topk(K, dim=-1)
by_hand = torch.zeros_like(x)
with torch.no_grad():
    for b in range(B):
        for t in range(S):
            for j in range(K):  # each chosen expert's output on the token, weighted by its gate
                by_hand[b, t] += gates[b, t, j] * layer.experts[str(int(chosen[b, t, j]))](x[b, t])
course.table([{"token": t, "router probabilities": ", ".join(f"{p:.2f}" for p in probs[0, t].tolist()),
               "top-2 experts": chosen[0, t].tolist(), "gates": ", ".join(f"{g:.2f}" for g in gates[0, t].tolist())}
              for t in range(4)])

# %%
print(f"max |layer output − Σ gate·expert(x) by hand| = {float((y - by_hand).abs().max()):.1e}; "
      f"slots per expert (measured): {layer.tokens_per_expert.tolist()} — {B * S * K} slots in all")

# %% [checks]
assert float((y - by_hand).abs().max()) < 1e-5  # the output is the gated sum of the chosen experts
assert int(layer.tokens_per_expert.sum()) == B * S * K and layer.dropped == 0  # dropless: every slot served

# %% [markdown]
# **Check yourself.** With no capacity limit, how many expert slots are served and how many tokens dropped? Predict it, then run the cell: it prints its
# verdict, and stops with an `AssertionError` if the run disagrees.

# %%
served = int(layer.tokens_per_expert.sum())
print(f"{B * S} tokens × top-{K} = {B * S * K} slots; the experts served {served} and dropped {layer.dropped} — "
      f"{'dropless' if served == B * S * K and layer.dropped == 0 else 'not dropless'}")
assert served == B * S * K and layer.dropped == 0

# %% [markdown]
# ## Capacity: what happens when too many tokens pick one expert
#
# Compiled kernels and buffers want shapes fixed before the router runs (GShard and Switch ran
# under XLA on TPUs), so GShard and Switch give each expert a **capacity**: `C = ⌈c · T · k / E⌉` slots for T tokens in a
# routing group (here a sequence), with the **capacity factor** c; slots beyond C are
# **dropped** — the token skips that expert, its residual connection carries it on. c = 1
# is exactly the even share; c > 1 is slack. A dropless layer (Megatron-core's and
# zerokit's default, MegaBlocks) takes every slot and pays with uneven expert batches and
# uneven all-to-alls.
#
# **Predict before you run.** The router above is at initialisation: its loads per expert were
# 64, 72, 50 and 70 slots against an even 64. With c = 1.0, will any slot be dropped? With
# c = 2, how many?
#
# <details><summary>Answer</summary>
#
# At c = 1.0, yes: capacity is counted per sequence, and any expert that gets more than its
# even share of a sequence's slots (⌈16·2/4⌉ = 8) drops the excess, so even the experts whose
# *total* is under 64 lose slots in some sequences — the `dropped` column's c = 1.0 row. At
# c = 2 none: 16 slots per expert per sequence is more than any expert received.
#
# </details>

# %%
sweep = {}
for c in (None, 2.0, 1.25, 1.0, 0.75, 0.5):
    capped = MoEMLP(H, E, top_k=K, capacity_factor=c)
    capped.load_state_dict(layer.state_dict())
    capped(x)
    sweep[c] = capped
course.table([{"capacity factor c": "dropless" if c is None else c,
               "capacity C per sequence (formula)": "—" if c is None else -(-int(c * S * K) // E),
               "slots per expert (measured)": m.tokens_per_expert.tolist(), "dropped (measured)": m.dropped,
               "dropped share": f"{m.dropped / (B * S * K):.0%}"} for c, m in sweep.items()])

# %%
fig, ax = course.new_figure(8, 3.4)
shown = (None, 1.0, 0.5)
width = 0.8 / len(shown)
for i, (c, color) in enumerate(zip(shown, ("#4C72B0", "#DD8452", "#55A868"))):
    m = sweep[c]
    ax.bar([e + (i - 1) * width for e in range(E)], m.tokens_per_expert.tolist(), width, color=color,
           label=("dropless" if c is None else f"c = {c:g}") + f": {m.dropped} dropped")
ax.axhline(B * S * K / E, color="#333333", ls=":", lw=1.5, label="even share T·k/E")
ax.set_xticks(range(E), [f"expert {e}" for e in range(E)])
ax.set_ylabel("slots received (8 sequences)")
ax.set_title("one MoE layer at initialisation: slots per expert, measured", fontsize=10)
course.figures.legend_outside(ax, "right")
fig.tight_layout()
fig

# %% [checks]
dropped = [m.dropped for m in sweep.values()]
assert dropped == sorted(dropped) and dropped[0] == 0 and sweep[1.0].dropped > 0 and sweep[2.0].dropped == 0
for c, m in sweep.items():
    assert int(m.tokens_per_expert.sum()) + m.dropped == B * S * K  # every slot is served or dropped
    if c is not None:
        assert int(m.tokens_per_expert.max()) <= B * -(-int(c * S * K) // E)  # no expert beyond C per sequence

# %% [markdown]
# ## The load-balancing loss
#
# Nothing in the language-model loss asks the router to spread its tokens: an expert that
# starts a little better gets more tokens, learns more, and gets more still — the others
# starve, their capacity is dropped or, dropless, one rank does all the work. Switch (§2.2)
# adds an auxiliary loss `α · E · Σ_e f_e · P_e`: f_e the fraction of the slots routed to
# expert e, P_e its mean router probability. f has no gradient (it counts); P does, and the
# loss pushes probability away from the experts that are already busy. When routing is even,
# `f_e = P_e = 1/E` and the loss is exactly **1**; a router that sends everything to one
# expert scores about E. 1 is not a floor: with f held fixed the loss is linear in P, and
# putting P on the least-loaded expert gives `E·min_e f_e`, below 1 whenever f is uneven.
# What holds is that a router whose probabilities match its loads (P = f) scores
# `E·Σ_e f_e² ≥ 1`, equal only when routing is even. α is about 1e-2 (zerokit's `aux_weight`).
# It is not linear in the batch, so a distributed run must say over which tokens it is
# counted: zerokit counts it per sequence and averages (GShard's per-group form), so each
# rank's part, averaged, equals the one process's — what lets the parity below hold. With
# k > 1, f counts all k choices, as Megatron-core does; Switch's k = 1 counts the one.
#
# Measured: the layer above at initialisation, a copy whose router is skewed toward expert
# 0 (tokens with a common component, which expert 0's row favours), and that skewed router
# trained on the auxiliary loss alone (α = 1, SGD) for 30 steps:

# %%
skewed = MoEMLP(H, E, top_k=K, aux_weight=1.0)
skewed.load_state_dict(layer.state_dict())
with torch.no_grad():
    skewed.router.weight[0] += 0.15
shifted = x + 1.0  # every token shares a direction that expert 0's row now favours
opt = torch.optim.SGD(skewed.router.parameters(), lr=0.2)
trace = []
for step in range(31):
    opt.zero_grad()
    out = skewed(shifted)
    out.backward(torch.zeros_like(out))  # only the auxiliary loss's gradient reaches the router (AuxLoss)
    if step in (0, 5, 10, 30):
        trace.append({"router": "skewed" if step == 0 else f"after {step} steps on the aux loss",
                      "aux loss E·Σ f·P (measured)": round(float(skewed.aux), 3),
                      "slots per expert (measured)": skewed.tokens_per_expert.tolist()})
    opt.step()
course.table([{"router": "at initialisation", "aux loss E·Σ f·P (measured)": round(float(layer.aux), 3),
               "slots per expert (measured)": layer.tokens_per_expert.tolist()}] + trace)

# %% [checks]
assert abs(float(layer.aux) - 1.0) < 0.05  # near even routing: near 1
assert trace[0]["aux loss E·Σ f·P (measured)"] > 1.5 and trace[-1]["aux loss E·Σ f·P (measured)"] < 1.2
assert max(trace[-1]["slots per expert (measured)"]) < max(trace[0]["slots per expert (measured)"])

# %% [markdown]
# ## Experts on ranks: the all-to-all
#
# **Expert parallelism** puts E/ep experts on each of the ep ranks of a group. zerokit's
# choice, as DeepSpeed-MoE's and Megatron's: `ep` is carved from the data-parallel ranks, so
# each rank still has its *own* tokens. Per MoE layer, each rank:
#
# 1. routes its T tokens (T·k slots) and sorts the slots by the rank that owns their expert;
# 2. exchanges the **counts** (the router decided them: an uneven split each step);
# 3. **dispatch**: one all-to-all sends each slot's row (d elements) to its expert's rank —
#    the dispatch payload is **T·k·d·b** bytes per rank (`theory.moe_dispatch_payload`), of
#    which (ep−1)/ep leaves the rank when routing is even;
# 4. runs its experts on the rows that arrived;
# 5. **combine**: the reverse all-to-all brings the outputs home, where they are weighted by
#    the gates and summed per token.
#
# Backward runs the two all-to-alls again the other way: 4 all-to-alls of T·k·d per layer.
# The dense weights' gradients are averaged over dp as in DDP; an expert's over the ranks
# that hold the *same* expert (`edp`, dp/ep of them). Below, the tiny MoE GPT trains 3 steps
# on dp = 2 ranks with ep = 2 — each rank holds 2 of the 4 experts of each layer — next to
# one process; one step's all-to-alls as the ledger recorded them on rank 0.
#
# **Predict before you run.** Each rank dispatches T·k = 64·2 = 128 rows per layer. About how
# many of them leave the rank at ep = 2?
#
# <details><summary>Answer</summary>
#
# About half: a slot stays when its expert is one of the rank's own two, which an even
# router picks half the time. The "leaving B" column of the dispatch rows shows the split
# this router chose on rank 0 — near half, not exactly, and different per layer — which is
# why zerokit's formula is evaluated on the measured split.
#
# </details>

# %%
T_RANK = B * S // 2  # tokens per rank at dp = 2
run = compare(work, 2, ["single", "ddp"], steps=3, optimizer="sgd", lr=0.1, parallel={"dp": 2, "ep": 2},
              keep_records=True)
ep_run = run["ddp"]
step1 = [r for r in ep_run.ranks[0].comm_records if r["step"] == 1 and r["axis"] == "ep"]
course.table([{"all-to-all": r["tag"], "phase": r["phase"], "payload B (measured)": r["payload_bytes"],
               "leaving B (measured)": r["ring_cost_bytes"],
               "T·k·d·b (formula)": theory.moe_dispatch_payload(T_RANK, K, H, 4) if r["tag"] == "moe dispatch" else ""}
              for r in step1])

# %% [markdown]
# Besides the rows, zerokit's layer sends the counts (one int64 per peer) and each row's
# expert id (one element) with the dispatch. Per step, the ep bytes are a formula on the
# split the router chose — `theory.moe_alltoall_bytes(sent away, received, d, b, ep)`,
# which the run evaluates on the rows its ranks counted — and the other axes are DDP's:

# %%
course.table([{"rank": rank.rank, "axis": axis, "what": {"dp": "dense gradients (all-reduce)",
                                                          "ep": "tokens (all-to-alls)",
                                                          "edp": "expert gradients"}[axis],
               "B/step (measured, ring cost)": row["ring_cost_bytes"],
               "B/step (formula)": rank.theory_comm_bytes_by_axis[axis]}
              for rank in ep_run.ranks for axis, row in rank.comm_bytes_by_axis.items()])

# %%
course.table([{"run": "dp = 2, ep = 2 vs one process", "param diff (max)": ep_run.param_diff["max_abs"],
               "loss diff (max)": max(abs(a - b) for a, b in zip(ep_run.losses, run["single"].losses)),
               "losses": ", ".join(f"{v:.4f}" for v in ep_run.losses)}])

# %% [checks]
assert ep_run.param_diff["max_abs"] <= 1e-5  # fp32: the same training as one process
assert max(abs(a - b) for a, b in zip(ep_run.losses, run["single"].losses)) <= 1e-5
for rank in ep_run.ranks:
    measured = {axis: row["ring_cost_bytes"] for axis, row in rank.comm_bytes_by_axis.items()}
    assert set(measured) == {"dp", "ep"}
    assert all(abs(measured[a] - rank.theory_comm_bytes_by_axis[a]) <= 0.5 for a in measured)  # each = its formula
    dispatch = [r for r in rank.comm_records if r["tag"] == "moe dispatch" and r["phase"] == "forward"]
    assert len(dispatch) == 3 * L and all(r["payload_bytes"] == theory.moe_dispatch_payload(T_RANK, K, H, 4)
                                          for r in dispatch)  # T·k·d·b per layer per step, dropless
    leaving = sum(r["ring_cost_bytes"] for r in dispatch) / sum(r["payload_bytes"] for r in dispatch)
    assert 0.3 < leaving < 0.7  # about (ep−1)/ep = 1/2 of the rows leave the rank

# %% [markdown]
# ## What a rank holds: expert parameters ÷ ep
#
# The dense weights (embeddings, attention, norms, routers) are on every rank; each rank
# holds E/ep of each layer's experts. Measured by the memory ledger after training:

# %%
model = work.build_model()
expert_numel = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
dense_numel = sum(p.numel() for p in model.parameters()) - expert_numel
print(f"the experts hold {expert_numel:,} of the model's {expert_numel + dense_numel:,} parameters: "
      f"{expert_numel / (expert_numel + dense_numel):.0%}")
course.table([{"layout": "one process (ep = 1)", "expert params": expert_numel, "dense params": dense_numel,
               "params B (computed, fp32)": 4 * (dense_numel + expert_numel), "params B (measured)": ""}]
             + [{"layout": f"dp = 2, ep = 2: rank {rank.rank}", "expert params": expert_numel // 2,
                 "dense params": dense_numel, "params B (computed, fp32)": 4 * (dense_numel + expert_numel // 2),
                 "params B (measured)": rank.model_state_bytes["params"]} for rank in ep_run.ranks])

# %% [checks]
for rank in ep_run.ranks:
    assert rank.model_state_bytes["params"] == 4 * (dense_numel + expert_numel // 2)

# %% [markdown]
# The experts are most of a MoE model's parameters (the share printed above the table; in
# Mixtral-8x7B about 45 of 47 B), so ÷ ep is most of the saving. It composes with ZeRO over each parameter
# group's own data-parallel ranks: dense over dp, experts over edp (DeepSpeed-MoE's
# expert-data-parallel groups).
#
# ## Expert parallel or tensor parallel on the experts?
#
# Reason it out per MoE layer and rank, forward and backward, with T tokens, width d, k
# experts per token and n ranks:
#
# - **Expert parallelism moves tokens.** 4 all-to-alls of T·k·d elements; each rank keeps
#   1/n of them when routing is even: `4 · (n−1)/n · T·k·d·b` — and each of the n ranks
#   brings its *own* T tokens.
# - **Tensor parallelism on the experts** (every expert's matmuls split column → row over n
#   ranks, as lesson 07's MLP) moves no tokens between ranks but all-reduces activations: the
#   f/g pair of an MLP, one all-reduce of T·d forward and one backward:
#   `2 · 2(n−1)/n · T·d·b`, with the n ranks sharing the *same* T tokens. That holds when the
#   reductions wait for the whole layer — each expert's output is a partial sum, and the gated
#   sum over a token's k experts is still one, so one g after the combine does for all of them
#   (Megatron's dispatcher does the same). zerokit's `MoEMLP.split_experts` does this; its gates'
#   gradient is partial too, so it adds an all-reduce of k fp32 values per token.
#
# Per rank the two are k/1 apart; per token the group processes, tensor parallelism moves
# n/k times more, because its n ranks work on one set of tokens. It also splits each
# expert's already small matmuls n ways, while expert parallelism keeps whole experts whole.
# Expert parallelism's price is elsewhere: the all-to-all crosses every pair of ranks (at
# scale, nodes), and a popular expert makes its rank the straggler. The bytes from
# `zerokit.theory`, for this lesson's layer and for a Mixtral-8x7B-sized one (d = 4096,
# k = 2, E = 8 on n = 8 ranks, 4096 tokens per rank, bf16):

# %%
def per_layer(T, d, k, n, b):
    """Bytes one rank sends per MoE layer, forward + backward, even routing: EP's 4 all-to-alls, TP's 2 all-reduces."""
    ep = 4 * theory.ring_bytes_sent("all_to_all", theory.moe_dispatch_payload(T, k, d, b), n)
    tp = theory.tp_comm_bytes_per_step(T, 2 * d, n, b)  # one f/g pair: T·d all-reduced forward (g), backward (f)
    return ep, tp


ep_step = [r for r in ep_run.ranks[0].comm_records if r["step"] == 1 and r["axis"] == "ep"]  # rank 0, one step (the same in the table below)
measured_ep = sum(r["ring_cost_bytes"] for r in ep_step) / L  # incl. the counts and the ids
rows = []
for name, (T, d, k, n, b) in {"this lesson's layer (fp32)": (T_RANK, H, K, 2, 4),
                              "Mixtral-8x7B-sized layer (bf16)": (4096, 4096, 2, 8, 2)}.items():
    ep_b, tp_b = per_layer(T, d, k, n, b)
    rows.append({"layer": name, "EP B per rank (formula)": ep_b,
                 "EP B per rank (ledger, rank 0, one step)": measured_ep if T == T_RANK else "",
                 "expert-TP B per rank (formula)": tp_b,
                 "EP B per token of the group (formula)": ep_b * n / (n * T),
                 "expert-TP B per token of the group (formula)": tp_b * n / T})
course.table(rows)

# %% [checks]
for row in rows:
    assert abs(row["EP B per rank (formula)"] - K * row["expert-TP B per rank (formula)"]) < 1e-6  # k/1 per rank
assert abs(measured_ep / rows[0]["EP B per rank (formula)"] - 1) < 0.2  # the measured split is near even

# %% [markdown]
# Both run here. The same MoE GPT at tp = 2 (no ep: every rank holds every expert, split), its
# MoE layers' collectives read off the ledger by their tags, next to the expert-parallel run
# above. Per rank and layer, forward + backward, one step:

# %%
tp_report = compare(work, 2, ["single", "ddp"], steps=1, optimizer="sgd", lr=0.1, parallel={"tp": 2},
                    keep_records=True)
tp_run = tp_report["ddp"]
moe_tp = [r for r in tp_run.ranks[0].comm_records if r["phase"] != "setup" and r["tag"].startswith("moe")]
T_TP = B * S  # at tp = 2 both ranks see the whole batch
course.table([
    {"run": "ep = 2 (dp = 2)", "tokens per rank": T_RANK, "calls per layer (ledger)": len(ep_step) // L,
     "B per layer (ledger, one step)": measured_ep,
     "B per layer (formula)": per_layer(T_RANK, H, K, 2, 4)[0], "max |Δ param| vs one process": ep_run.param_diff["max_abs"]},
    {"run": "tp = 2 on the experts", "tokens per rank": T_TP, "calls per layer (ledger)": len(moe_tp) // L,
     "B per layer (ledger, one step)": sum(r["ring_cost_bytes"] for r in moe_tp) / L,
     "B per layer (formula)": theory.tp_comm_bytes_per_step(T_TP, 2 * H, 2, 4, loss_reductions=K),
     "max |Δ param| vs one process": tp_run.param_diff["max_abs"]}])

# %% [checks]
assert tp_run.param_diff["max_abs"] <= 1e-5 and ep_run.param_diff["max_abs"] <= 1e-5
assert sum(r["ring_cost_bytes"] for r in moe_tp) == L * theory.tp_comm_bytes_per_step(T_TP, 2 * H, 2, 4,
                                                                                     loss_reductions=K)
assert len(moe_tp) == 3 * L  # f on the tokens, f on the gates, g on the output: per layer, not per expert

# %% [markdown]
# The ep row's formula is the even-routing estimate (the ledger's is the router's real split,
# plus the counts and the expert ids); the tp row's is exact, since no routing decides it. The
# tp run carries twice the tokens per rank — its two ranks share one batch — which is the
# "per token of the group" column above, measured.
#
# **Who does what.** zerokit's default is expert parallelism: `ep` carved from dp, whole
# experts per rank, dropless by default, uneven all-to-alls with split sizes (the counts
# exchanged first); with tp above 1 the experts are split by tp as well (both at once:
# `parallel={"dp": 2, "ep": 2, "tp": 2}`). DeepSpeed-MoE (`deepspeed.moe.layer.MoE(…, ep_size=…)`) carves the same
# expert-parallel groups from the data-parallel ranks and reduces the experts' gradients over
# the expert-data-parallel ones; its gates pad every expert to its capacity, so its
# all-to-alls are even-sized, GShard's way; for inference on more GPUs than experts it adds
# *expert slicing* (tensor parallelism inside the experts). Megatron-core has both axes: an
# expert-parallel degree and an expert-tensor-parallel degree, chosen apart from the dense
# layers' tensor parallelism, with a dropless all-to-all token dispatcher.
#
# ## Try it
#
# Choose the experts, top-k, the capacity factor and the ep and dp degrees: the panel trains
# the tiny MoE GPT one step on those ranks and draws the slots each expert received on the
# step's batch (with the capacity line and the slots dropped) and rank 0's bytes on each
# axis, measured, next to the formula. Its table lists, per rank, the slots its dispatch
# carried (the ledger), the bytes per axis and the parameters it holds; the cell prints it
# under the panel too, as the first run left it, for a reader without a kernel (the panel's
# own copy follows its controls). Try c = 1.0 against dropless, top-k 1 against 2, and
# dp = 4 with ep = 2 for the `edp` axis.

# %%
from IPython.display import display

panel = course.MoEPanel(dict(vocab=64, seq_len=S, d_model=H, n_layer=L, n_head=2, batch_size=B), n_experts=E,
                        top_k=K, capacity=None, ep=2, dp=2)
display(panel)
panel.table()  # the table under the picture, as the first run left it

# %% [markdown]
# ## Summary
#
# - A MoE layer routes each token to its top-k experts and sums their outputs weighted by
#   the gates (the router's probabilities): E times the parameters, k experts' compute per
#   token (rebuilt by hand above).
# - A capacity of ⌈c·T·k/E⌉ slots per expert fixes the experts' batch sizes and drops the
#   excess; at c = 1 any imbalance drops slots (measured per capacity factor); dropless
#   layers take every slot and pay with uneven batches and all-to-alls.
# - The load-balancing loss E·Σ f_e·P_e is 1 when routing is even and about E when one
#   expert takes everything; its gradient moves probability off the busy experts (measured
#   while it trained a skewed router).
# - Expert parallelism moves tokens: 4 all-to-alls of T·k·d per layer per rank, the rows that
#   leave a rank set by the router's split (`theory.moe_alltoall_bytes` on the measured
#   split = the ledger), expert parameters ÷ ep, the same training as one process.
# - Tensor parallelism on the experts all-reduces T·d twice per layer instead, over tokens
#   the ranks share: n/k times EP's bytes per token, on split matmuls.
#
# ## Interview questions
#
# 1. *What does a MoE layer's capacity factor trade?*
#
#    <details><summary>Answer</summary>
#
#    Fixed, even expert batches (and fixed-size all-to-alls, the buffers known in advance)
#    against dropped tokens. C = ⌈c·T·k/E⌉ per routing group; slots beyond it skip the expert
#    and ride the residual. At c = 1 any imbalance drops slots (the sweep: none dropless, a
#    tenth of the slots at c = 1.0 in this layer); a larger c drops fewer and pads more.
#    Dropless layers (Megatron-core, MegaBlocks, zerokit's default) take every slot with
#    uneven batches and all-to-alls whose sizes are exchanged each step.
#
#    </details>
#
# 2. *What is the load-balancing loss, and what is its value when routing is even?*
#
#    <details><summary>Answer</summary>
#
#    Switch's α·E·Σ_e f_e·P_e, with f_e the share of slots routed to expert e and P_e its mean
#    router probability. Even routing gives f = P = 1/E and a loss of exactly 1 (×α); one
#    expert taking everything gives about E. 1 is the minimum only while P matches f
#    (`E·Σ f² ≥ 1`): with f fixed, P on the least-loaded expert scores `E·min f`, below 1. Only P carries a gradient, which lowers the
#    probability of busy experts (the skewed router's 1.95 fell to about 1.1). It is not
#    linear in the batch, so a distributed run must fix its group — per sequence or per
#    rank's tokens, then averaged — and the single-process reference must use the same.
#
#    </details>
#
# 3. *Expert parallelism or tensor parallelism for the experts — what does each communicate?*
#
#    <details><summary>Answer</summary>
#
#    EP moves tokens: per layer and rank 4 all-to-alls of T·k·d (dispatch and combine, forward
#    and backward), (n−1)/n of it leaving under even routing, each rank with its own T
#    tokens; experts stay whole, their parameters ÷ n. Expert TP moves activations: 2
#    all-reduces of T·d per layer over tokens the n ranks share — n/k times EP's bytes per
#    token — and splits small matmuls further. EP's costs are the all-to-all across every
#    pair of ranks and stragglers from popular experts. DeepSpeed-MoE trains with EP carved
#    from dp; Megatron-core offers EP and expert TP as separate degrees; zerokit implements
#    EP.
#
#    </details>

# %% [markdown]
# **Exercise:** [exercises/16_moe_dispatch.ipynb](../exercises/16_moe_dispatch.ipynb) — the
# dispatch (slots sorted by owner rank, counts exchanged, rows all-to-all'd) and the combine
# (back, token order, gates, sum per token), graded by `zerokit grade 16` · **Next:** [lesson
# 17 — beyond one node: HSDP and ZeRO++](17_beyond_one_node.ipynb); [lesson 12 — the
# interview](12_the_interview.ipynb) gathers all five axes
