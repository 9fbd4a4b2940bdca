# %% [markdown]
# # 13 · Your own model: one line from DDP to ZeRO-3
#
# **The question.** The seed ([docs/seed.md](../docs/seed.md)) trains with
# `model = deepspeed.initialize(model=model, model_parameters=params, config={…})` and a
# `zero_optimization` block at stage 3 (its own line; `deepspeed.initialize` returns four
# things — the engine, the optimizer, a data loader and a scheduler — hence DeepSpeed's
# `model_engine, optimizer, _, _ = deepspeed.initialize(…)`). The lessons so far trained
# zerokit's own model through `zerokit.train`. What does it take to put *your* model — written by you,
# with a tied head and a frozen weight — under DDP, ZeRO-1, ZeRO-2 and ZeRO-3 in *your*
# training loop? Does the loop change, does it still train the same model, and does each
# rank hold what the formulas say?
#
# **What you will see.** A nanoGPT-style GPT defined in this notebook, trained by a plain
# loop on 2 ranks; one line switches it from DDP (`zerokit.DistributedDataParallel`) to
# ZeRO-1 (`zerokit.ShardedOptimizer`), ZeRO-2 and ZeRO-3 (`zerokit.initialize` with a
# DeepSpeed config), ZeRO-3 the FSDP2 way (`zerokit.fully_shard`, your own optimizer) and
# finally the seed's own stage-3 block. After each: the losses next to
# a single-process copy, and the params, gradients and optimizer states of each rank —
# measured by `zerokit.measure` around a step — next to `theory.model_state_bytes`. And
# what the seed's `"pipeline"` block gets. Then your model on the other axes, each next to a
# single-process copy: split by heads and columns over 2 ranks (`zerokit.parallelize_module`),
# cut into two pipeline stages (`zerokit.pipeline`), and checkpointed in one process
# (`zerokit.apply_checkpointing`).
#
# **Time:** about 25 min to read and run (the run itself: about 8 s on a 2-core laptop) ·
# **Needs:** lessons 03–06 (DDP and the three ZeRO stages), nothing else ·
# **After it you can answer:** *What changes in my loop from DDP to ZeRO-3?* · *Does ZeRO
# change what the model learns?* · *What does ZeRO-3 do with a frozen or a tied weight?* ·
# *How do I put my own model under tensor or pipeline parallelism?*

# %%
%matplotlib inline
import math
import warnings
from dataclasses import dataclass

import matplotlib
import torch
import torch.nn as nn
import torch.nn.functional as F

import zerokit
from zerokit import course, theory
from zerokit.plot import CATEGORY_COLORS

matplotlib.rcParams["figure.dpi"] = course.DPI

# %% [markdown]
# ## The model: a GPT of your own
#
# nanoGPT's model, cut to its bones: token and position embeddings, `n_layer` blocks of
# causal self-attention and an MLP, a final LayerNorm and a head **tied** to the token
# embedding (one tensor, two uses). One change for the lesson: the position table is
# **frozen** (`requires_grad=False`), as a weight loaded from a checkpoint and kept fixed
# would be. Nothing in it knows about zerokit.

# %%
@dataclass
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 16
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(config.n_embd), CausalSelfAttention(config)
        self.ln_2, self.mlp = nn.LayerNorm(config.n_embd), MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            ln_f=nn.LayerNorm(config.n_embd)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight          # tied: one tensor, two uses
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        self.transformer.wpe.weight.requires_grad_(False)          # frozen: held, never trained

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))

# %% [markdown]
# The data: a character-level text, as nanoGPT's Shakespeare example, and a batch of 8
# windows per step drawn from it by the step number — every rank and the single-process
# copy see the same batch, and each rank trains on its own 4 of the 8.

# %%
TEXT = ("Shall I compare thee to a summer's day? Thou art more lovely and more temperate: "
        "Rough winds do shake the darling buds of May, And summer's lease hath all too short a date; "
        "Sometime too hot the eye of heaven shines, And often is his gold complexion dimm'd;")
chars = sorted(set(TEXT))
data = torch.tensor([chars.index(c) for c in TEXT])
config = GPTConfig(vocab_size=len(chars))
WORLD, BATCH, STEPS = 2, 8, 4


def batch(step):
    """The step's whole batch: 8 windows of block_size characters and their next characters."""
    g = torch.Generator().manual_seed(step)
    starts = torch.randint(0, len(data) - config.block_size - 1, (BATCH,), generator=g)
    x = torch.stack([data[s:s + config.block_size] for s in starts])
    y = torch.stack([data[s + 1:s + config.block_size + 1] for s in starts])
    return x, y


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


torch.manual_seed(0)
model = GPT(config)
psi = sum(p.numel() for p in model.parameters())        # parameters() yields the tied tensor once
frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
print(f"{config}\nΨ = {psi:,} parameters: {psi - frozen:,} trained in {len(trainable(model))} tensors, "
      f"{frozen:,} frozen (wpe); lm_head is wte: {model.lm_head.weight is model.transformer.wte.weight}")

# %% [markdown]
# ## The loop, and the one line
#
# A training loop as you would write it for one GPU — batch, forward, loss, backward,
# step — run on 2 ranks by `zerokit.launch` from a cell, each rank on its half of the
# batch. What changes between the setups is the line that wraps the model or the optimizer:
#
# | setup | the line |
# |---|---|
# | DDP | `model = zerokit.DistributedDataParallel(model)`, then your optimizer as usual |
# | ZeRO-1 | `opt = zerokit.ShardedOptimizer(params, torch.optim.AdamW, lr=…)` (torch's `ZeroRedundancyOptimizer` interface) |
# | ZeRO-2, ZeRO-3 | `engine, _, _, _ = zerokit.initialize(model=model, model_parameters=params, config=ds_config)` |
# | ZeRO-3, FSDP2's way | `zerokit.fully_shard(block)` for each block, then `zerokit.fully_shard(model)`; your optimizer on `model.parameters()`, now this rank's shards |
#
# `initialize` is DeepSpeed's entry point with `deepspeed` replaced by `zerokit`; as in
# DeepSpeed, the engine takes over the backward (`engine.backward(loss)`: divided by the
# accumulation steps, reduced at their boundary) and the step (`engine.step()`: on this
# rank's shards). `zerokit.measure(...)` wraps each step and reads the ledgers: bytes per
# category, measured from the tensors' storages, and the collectives issued inside.
#
# One default to know: a DeepSpeed config **without** `gradient_clipping` clips the
# gradients' norm at 1.0 — DeepSpeed's default in the release this course was checked against
# (0.19.8: `GRADIENT_CLIPPING_DEFAULT = 1.0` in `deepspeed/runtime/constants.py`; older
# releases defaulted to 0, no clipping: check yours), and `zerokit.initialize`'s. DDP and
# ZeroRedundancyOptimizer never clip. To compare every setup with one plain copy, the configs
# below say `"gradient_clipping": 0`; leave the key out and the engine setups clip, as
# DeepSpeed would.

# %%
OPTIMIZERS = {"sgd": (torch.optim.SGD, {"lr": 0.1}), "adamw": (torch.optim.AdamW, {"lr": 3e-3})}
SEED_ZERO = {"stage": 3, "allgather_partitions": True, "allgather_bucket_size": 5e8, "reduce_scatter": True,
             "overlap_comm": True, "contiguous_gradients": True}                   # the seed's block, verbatim


def ds_config(zero, optimizer):
    opt_class, hyper = OPTIMIZERS[optimizer]
    return {"train_micro_batch_size_per_gpu": BATCH // WORLD, "gradient_accumulation_steps": 1,
            "gradient_clipping": 0,  # DeepSpeed 0.19.8's default is 1.0; the plain copy below does not clip
            "optimizer": {"type": opt_class.__name__, "params": hyper}, "zero_optimization": zero}


CONFIGS = {"ZeRO-2": {"stage": 2}, "ZeRO-3": {"stage": 3}, "seed's config": SEED_ZERO}


def wrap(setup, model, optimizer):
    """The one line per setup; returns what the loop calls and what measure reads."""
    opt_class, hyper = OPTIMIZERS[optimizer]
    if setup == "DDP":
        model = zerokit.DistributedDataParallel(model)
        opt = opt_class(trainable(model), **hyper)
    elif setup == "ZeRO-1":
        opt = zerokit.ShardedOptimizer(trainable(model), opt_class, **hyper)
    elif setup == "fully_shard":                       # FSDP2's convention: the blocks, then the root
        for block in model.transformer.h:
            zerokit.fully_shard(block)
        zerokit.fully_shard(model)
        opt = opt_class(trainable(model), **hyper)     # your optimizer, on this rank's shards
    else:
        engine, _, _, _ = zerokit.initialize(model=model, model_parameters=trainable(model),
                                             config=ds_config(CONFIGS[setup], optimizer))
        return engine, engine.backward, engine.step, engine.zero_grad, (engine,)
    return model, torch.Tensor.backward, opt.step, opt.zero_grad, (model, opt)


def train(ctx, setup, optimizer):
    torch.manual_seed(0)
    model = GPT(config).to(ctx.device)                 # ctx.device: this rank's GPU under NCCL, else the CPU
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, backward, step, zero_grad, measured = wrap(setup, model, optimizer)   # ← the setup's one line
    per = BATCH // ctx.world_size
    mine = slice(ctx.rank * per, (ctx.rank + 1) * per)
    losses = []
    for s in range(STEPS):
        x, y = (t.to(ctx.device) for t in batch(s))
        zero_grad()
        with zerokit.measure(*measured) as m:
            loss = F.cross_entropy(model(x[mine]).flatten(0, 1), y[mine].flatten())
            backward(loss)
            step()
        losses.append(loss.item())
    ops = {}
    for row in m.collectives:                          # one row per (phase, op): summed per op
        calls, payload = ops.get(row["op"], (0, 0))
        ops[row["op"]] = (calls + row["calls"], payload + row["payload_bytes"])
    return {"losses": losses, "memory": {k: m.memory[k] for k in ("params", "grads", "optimizer")}, "ops": ops,
            "warnings": [str(w.message) for w in caught]}

# %% [markdown]
# The single-process copy: the same model from the same seed, the whole batch, a plain
# torch optimizer, in this kernel.
#
# **Predict before you run.** With AdamW, will ZeRO-3's losses equal the single process's to
# fp32 rounding, or drift apart over the steps — ZeRO-3 steps flat shards, cut across
# tensors, where the single process steps whole tensors?
#
# <details><summary>Answer</summary>
#
# Equal to fp32 rounding: the loss table below shows the largest difference for every setup.
# Adam is elementwise, so where the tensors are cut changes no update; only the order in
# which the ranks' gradients are summed differs.
#
# </details>

# %%
def plain_steps(model, opt, steps):
    """The plain loop on the whole batch: the single-process copy (and, later, each tensor-parallel rank's loop)."""
    losses = []
    for s in range(steps):
        x, y = (t.to(next(model.parameters()).device) for t in batch(s))
        opt.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def single(optimizer):
    torch.manual_seed(0)
    model = GPT(config)
    opt_class, hyper = OPTIMIZERS[optimizer]
    return plain_steps(model, opt_class(trainable(model), **hyper), STEPS)


SETUPS = ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "fully_shard", "seed's config"]
reference = {opt: single(opt) for opt in OPTIMIZERS}
runs = {(setup, opt): zerokit.launch(train, WORLD, setup, opt) for setup in SETUPS for opt in OPTIMIZERS}


def mean_losses(ranks):
    """The whole batch's loss: the mean of the two halves' (equal halves, a mean loss)."""
    return [sum(r["losses"][i] for r in ranks) / len(ranks) for i in range(STEPS)]


rows = []
for opt in OPTIMIZERS:
    for setup in ["single process"] + SETUPS:
        losses = reference[opt] if setup == "single process" else mean_losses(runs[setup, opt])
        rows.append({"optimizer": opt, "setup": setup if setup == "single process" else f"{setup}, 2 ranks",
                     "losses, step by step": "  ".join(f"{v:.6f}" for v in losses),
                     "max |Δ| vs single process": f"{max(abs(a - b) for a, b in zip(losses, reference[opt])):.1e}"})
course.table(rows)

# %% [checks]
for setup in SETUPS:
    sgd = mean_losses(runs[setup, "sgd"])
    assert max(abs(a - b) for a, b in zip(sgd, reference["sgd"])) < 1e-5       # the same training, to fp32 rounding
    adamw = mean_losses(runs[setup, "adamw"])
    assert max(abs(a - b) for a, b in zip(adamw, reference["adamw"])) < 1e-5
assert reference["sgd"][-1] < reference["sgd"][0] and reference["adamw"][-1] < reference["adamw"][0]  # it learns

# %% [markdown]
# **Check yourself.** Does every setup train your model as one process does? Predict it, then run the cell: it prints its
# verdict, and stops with an `AssertionError` if the run disagrees.

# %%
gaps = {setup: max(abs(a - b) for a, b in zip(mean_losses(runs[setup, "adamw"]), reference["adamw"]))
        for setup in SETUPS}
print(f"{len(gaps)} setups with AdamW against one process: largest loss difference {max(gaps.values()):.1e} — "
      f"{'one training' if max(gaps.values()) < 1e-5 else 'different trainings'}")
assert max(gaps.values()) < 1e-5

# %% [markdown]
# Six setups, one training: with SGD and with AdamW the losses agree with the single
# process to fp32 rounding — the ranks add their halves' gradients in another order than
# one process does, and that is all. Sharding changes where the states live, not the
# arithmetic. `fully_shard` and `initialize` at stage 3 are one mechanism (zerokit's
# `zero3`) behind two faces: FSDP2's, where your own optimizer steps the shards (so Adam keeps
# a `step` per parameter, not per flat unit), and DeepSpeed's, where the engine does.
#
# ## What each rank holds
#
# The AdamW runs (plain SGD keeps no optimizer state, so it would show nothing sharded).
# `zerokit.measure` read the bytes at the end of the last step; the formula,
# `theory.model_state_bytes`, needs what the model is made of: Ψ, the frozen elements (held
# whole on every rank, never sharded: no gradient, no optimizer state), and how the
# parameters are laid out in flat buffers — ZeRO-1 and 2 put all trained parameters in one
# buffer (DeepSpeed's default bucket, 5e8 elements, is larger than this model); ZeRO-3 makes
# one unit per block and gives the root the rest, the tied embedding and head among it.
# AdamW keeps one `step` scalar per tensor it steps: one per trained tensor under DDP, one per
# flat buffer under ZeRO.

# %%
blocks = [sum(p.numel() for p in block.parameters()) for block in model.transformer.h]
trained = psi - frozen
LAYOUT = {"DDP": (0, None), "ZeRO-1": (1, [trained]), "ZeRO-2": (2, [trained]),
          "ZeRO-3": (3, blocks + [trained - sum(blocks)]), "fully_shard": (3, blocks + [trained - sum(blocks)]),
          "seed's config": (3, blocks + [trained - sum(blocks)])}


def formula(setup):
    stage, units = LAYOUT[setup]
    # Adam's step scalars: one per tensor it steps — your optimizer steps every (sharded) parameter under
    # DDP and fully_shard, zerokit's engine one flat shard per unit
    tensors = len(trainable(model)) if units is None or setup == "fully_shard" else len(units)
    return theory.model_state_bytes(stage, psi, WORLD, "fp32", "adamw", units=units, optimizer_tensors=tensors,
                                    frozen_numel=frozen)


SHARDED_FROM = {"optimizer": 1, "grads": 2, "params": 3}  # the stage that starts sharding each category
rows = []
for setup in SETUPS:
    ranks, expected = runs[setup, "adamw"], formula(setup)
    for category in ("params", "grads", "optimizer"):
        rows.append({"setup": setup, "category": category,
                     **{f"rank {r} B (measured)": ranks[r]["memory"][category] for r in range(WORLD)},
                     "theory.model_state_bytes B": getattr(expected, category),
                     "sharded": "yes" if LAYOUT[setup][0] >= SHARDED_FROM[category] else "no"})
    rows.append({"setup": setup, "category": "total",
                 **{f"rank {r} B (measured)": sum(ranks[r]["memory"].values()) for r in range(WORLD)},
                 "theory.model_state_bytes B": expected.total, "sharded": ""})
course.table(rows)

# %% [checks]
for setup in SETUPS:
    expected = formula(setup)
    for rank in runs[setup, "adamw"]:
        assert rank["memory"] == {"params": expected.params, "grads": expected.grads, "optimizer": expected.optimizer}
assert runs["seed's config", "adamw"][0]["memory"] == runs["ZeRO-3", "adamw"][0]["memory"]
assert formula("ZeRO-3").params - formula("ZeRO-3").grads == 4 * frozen     # the frozen table stays whole
assert formula("DDP").optimizer == 8 * trained + 4 * len(trainable(model))  # m and v, plus a step per tensor

# %% [markdown]
# Measured and formula agree to the byte on both ranks. The frozen position table is in
# the params row at every stage, whole — zerokit's ZeRO-3 shards only what it trains, which is
# zerokit's choice: DeepSpeed's ZeRO-3 and FSDP2 shard frozen parameters too (question 2
# below) — and it adds
# nothing to the gradients or the optimizer. The tied tensor is counted once: one
# parameter, one gradient, one pair of Adam moments.
#
# And what each setup sent inside the step: the collectives the ledger saw, their calls and
# payloads (measured):

# %%
OPS = ("all_reduce", "reduce_scatter", "all_gather")
course.table([{"setup": setup, **{f"{op}: calls, payload B": (f"{calls}, {payload:,}" if (calls, payload) != (0, 0) else None)
                                  for op in OPS for calls, payload in [runs[setup, "adamw"][0]["ops"].get(op, (0, 0))]}}
              for setup in SETUPS])

# %% [checks]
for setup in SETUPS:
    stage, units = LAYOUT[setup]
    full = 4 * (trained if units is None else theory.padded_numel(units, WORLD))  # the trained parameters, fp32
    expected = {0: {"all_reduce": full}, 1: {"reduce_scatter": full, "all_gather": full},
                2: {"reduce_scatter": full, "all_gather": full},
                3: {"reduce_scatter": full, "all_gather": 2 * full}}[stage]       # ZeRO-3 gathers twice
    for rank in runs[setup, "adamw"]:
        assert {op: payload for op, (calls, payload) in rank["ops"].items()} == expected

# %% [markdown]
# DDP all-reduces the gradients once; ZeRO-1 and ZeRO-2 cut that all-reduce in its two
# halves — reduce-scatter the gradients, all-gather the updated parameters; ZeRO-3 gathers
# each unit twice (for its forward, again for its backward) and reduce-scatters once: the
# 1.5× of lesson 06, on your model, and the frozen table never moves.

# %%
fig, ax = course.new_figure(9.0, 3.6)
four = SETUPS[:4]
bottom = [0.0] * len(four)
for category in ("params", "grads", "optimizer"):
    heights = [runs[s, "adamw"][0]["memory"][category] / 1024 for s in four]
    ax.bar(range(len(four)), heights, 0.6, bottom=bottom, color=CATEGORY_COLORS[category], label=category)
    bottom = [b + h for b, h in zip(bottom, heights)]
ax.scatter(range(len(four)), [formula(s).total / 1024 for s in four], marker="_", s=900, color="black", zorder=3,
           label="theory.model_state_bytes")
ax.set_xticks(range(len(four)), [f"{s}\n{w}" for s, w in zip(four, ("DistributedDataParallel", "ShardedOptimizer",
                                                                     "initialize, stage 2", "initialize, stage 3"))],
              fontsize=9)
ax.set_ylabel("KiB per rank (measured)")
ax.set_title(f"your GPT (Ψ = {psi:,}, fp32 AdamW) on 2 ranks:\nmodel states of rank 0", fontsize=11)
course.figures.legend_outside(ax, "right")  # off the bars
fig.tight_layout()
fig

# %% [markdown]
# ## The seed's config
#
# The seed's stage-3 block ran above unchanged (`"seed's config"`), with the same losses,
# bytes and collectives as a bare `{"stage": 3}`: `allgather_partitions`, `reduce_scatter`,
# `overlap_comm` and `contiguous_gradients` name what stage 3 does by default, and
# `allgather_bucket_size` is a stage 1–2 knob. DeepSpeed accepts it at stage 3 and ignores it; zerokit does the same,
# and says so — each rank caught this warning while `initialize` read the config:

# %%
caught = runs["seed's config", "adamw"][0]["warnings"]
print("\n".join(caught))
assert any("allgather_bucket_size" in w and "ignores it" in w for w in caught)
assert not runs["ZeRO-3", "adamw"][0]["warnings"]

# %% [markdown]
# The seed's config also carries a `"pipeline"` block. DeepSpeed has no such config key:
# its pipeline parallelism is built in code. zerokit refuses it and says what the real API
# is (the config is read before anything starts, so no ranks are needed to see it):

# %%
try:
    zerokit.initialize(model=GPT(config), config={"pipeline": {"stages": 2, "partition_method": "parameters"},
                                                  "zero_optimization": {"stage": 1}})
except ValueError as error:
    refusal = str(error)
print(refusal)
assert "PipelineModule" in refusal and "ZeRO stage 0 or 1" in refusal

# %% [markdown]
# ## Your model on the other axes
#
# DDP and ZeRO split the batch and the model *states*; the model itself computes whole on
# every rank. The other axes split the model's work: its layers' columns and heads (tensor
# parallelism), its layers into stages (a pipeline), or — in one process — what its forward
# keeps for backward (activation checkpointing). Each has its own-loop call with torch's
# convention, and each runs below on this notebook's GPT next to a single-process copy.
#
# ### Tensor parallelism: `zerokit.parallelize_module`
#
# Split every block's attention by heads and its MLP by columns over 2 ranks: does it still
# train the same model, and what does each rank hold?
#
# The hand-written attention above reads its head width from the whole embedding
# (`C // n_head`); with t ranks each holds `n_head / t` heads, so its forward would have to
# use the local width — the same change torch's own tensor parallelism asks of it. torch's
# `nn.MultiheadAttention` needs no change: the plan's style `"attention"` replaces it with
# one that runs this rank's whole heads. So the GPT here is yours with `nn.MultiheadAttention`
# in its blocks (`MHAGPT`); the MLP takes torch's own `ColwiseParallel()` /
# `RowwiseParallel()`. Both ranks see the whole batch — they split the layers, not the data —
# and step a plain SGD over their parameters, some of them now shards.

# %%
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from zerokit.tensor_parallel import full_parameters


class MHABlock(Block):
    """Your block with torch's nn.MultiheadAttention as its attention, causal by a mask."""

    def __init__(self, config):
        super().__init__(config)
        self.attn = nn.MultiheadAttention(config.n_embd, config.n_head, batch_first=True)
        self.register_buffer("causal", torch.ones(config.block_size, config.block_size, dtype=torch.bool).triu(1),
                             persistent=False)

    def forward(self, x):
        h, T = self.ln_1(x), x.shape[1]
        x = x + self.attn(h, h, h, attn_mask=self.causal[:T, :T], need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class MHAGPT(GPT):
    """Your GPT (tied head, frozen position table) with those blocks."""

    def __init__(self, config):
        super().__init__(config)
        self.transformer.h = nn.ModuleList(MHABlock(config) for _ in range(config.n_layer))


PLAN = {"transformer.h.*.attn": "attention",               # nn.MultiheadAttention, by whole heads
        "transformer.h.*.mlp.c_fc": ColwiseParallel(),    # torch's styles, with their default layouts
        "transformer.h.*.mlp.c_proj": RowwiseParallel()}
TP_STEPS = 3
#: the split attention keeps q/k/v as one packed layer, qkv; these are the names nn.MultiheadAttention gives them
TORCH_NAMES = {"attn.qkv.weight": "attn.in_proj_weight", "attn.qkv.bias": "attn.in_proj_bias"}


def torch_name(name):
    for ours, theirs in TORCH_NAMES.items():
        name = name.replace(ours, theirs)
    return name


def storage_bytes(module):
    """Each parameter's bytes, read from its tensor's storage (measured: a shard that were a view into the whole
    tensor would show the whole tensor's bytes)."""
    return {torch_name(n): p.untyped_storage().nbytes() for n, p in module.named_parameters()}


def sgd_steps(model, steps):
    return plain_steps(model, torch.optim.SGD(trainable(model), lr=0.1), steps)


def tp_train(ctx):
    torch.manual_seed(0)
    model = MHAGPT(config).to(ctx.device)
    zerokit.parallelize_module(model, None, PLAN)      # None: every rank is on tp here; ← the one line
    losses = sgd_steps(model, TP_STEPS)
    whole = full_parameters(model)                     # the shards all-gathered (a collective: every rank calls it)
    return {"losses": losses, "bytes": storage_bytes(model),
            "split": {torch_name(n): str(p.tp_shard) for n, p in model.named_parameters() if hasattr(p, "tp_shard")},
            "params": {torch_name(n): t.cpu() for n, t in whole.items()} if ctx.rank == 0 else None}


tp = zerokit.launch(tp_train, WORLD)
torch.manual_seed(0)
tp_reference = MHAGPT(config)
tp_whole_bytes = storage_bytes(tp_reference)           # the single process's tensors, before training
tp_reference_losses = sgd_steps(tp_reference, TP_STEPS)
tp_param_diff = max(float((t - dict(tp_reference.named_parameters())[n].detach()).abs().max())
                    for n, t in tp[0]["params"].items())
course.table([{"run": "single process", **{f"loss step {i}": f"{v:.6f}" for i, v in enumerate(tp_reference_losses)},
               "max |Δ| vs single process (measured)": None}]
             + [{"run": f"tp rank {r}", **{f"loss step {i}": f"{v:.6f}" for i, v in enumerate(rank["losses"])},
                 "max |Δ| vs single process (measured)":
                     f"{max(abs(a - b) for a, b in zip(rank['losses'], tp_reference_losses)):.1e}"}
                for r, rank in enumerate(tp)]
             + [{"run": f"parameters after {TP_STEPS} steps, gathered whole",
                 "max |Δ| vs single process (measured)": f"{tp_param_diff:.1e}"}])

# %% [markdown]
# What each rank holds of block 0 (every block is split alike), each parameter's bytes read
# from its tensor's storage on the rank:

# %%
block0 = [n for n in tp_whole_bytes if n.startswith("transformer.h.0.") and (".attn." in n or ".mlp." in n)]
tp_rows = [{"parameter": n.removeprefix("transformer.h.0."), "single process B (measured)": tp_whole_bytes[n],
            **{f"rank {r} B (measured)": rank["bytes"][n] for r, rank in enumerate(tp)},
            "split as": tp[0]["split"].get(n, "whole")} for n in block0]
tp_rows.append({"parameter": "the whole model", "single process B (measured)": sum(tp_whole_bytes.values()),
                **{f"rank {r} B (measured)": sum(rank["bytes"].values()) for r, rank in enumerate(tp)}})
course.table(tp_rows)

# %% [checks]
# fp32 keeps 24 bits: one ulp of a loss near 3.6 is 2**-22 ≈ 2.4e-7, of a weight below 1 at most 2**-24 ≈ 6e-8.
# The row-parallel layers sum the two ranks' partial products in an all-reduce, where one process sums them inside
# one matmul: another order, a few ulps per result, compounding over 3 steps. 1e-5 is ~40 ulps of the loss, and
# each step moves the loss by over 1000 times that (asserted below): rounding passes, a wrong model does not.
TP_TOL = 1e-5
for rank in tp:
    assert max(abs(a - b) for a, b in zip(rank["losses"], tp_reference_losses)) < TP_TOL
assert all(abs(a - b) > 1000 * TP_TOL for a, b in zip(tp_reference_losses, tp_reference_losses[1:]))
assert tp_param_diff < TP_TOL                                                   # every parameter, gathered whole
split_in_block0 = sorted(n.removeprefix("transformer.h.0.") for n in tp[0]["split"] if n in block0)
assert split_in_block0 == ["attn.in_proj_bias", "attn.in_proj_weight", "attn.out_proj.weight",
                           "mlp.c_fc.bias", "mlp.c_fc.weight", "mlp.c_proj.weight"]
assert tp[0]["split"]["transformer.h.0.attn.in_proj_weight"] == "Shard(dim=0, blocks=3)"    # q, k, v: whole heads
for rank in tp:
    assert rank["split"] == tp[0]["split"]
    for n, whole in tp_whole_bytes.items():
        assert rank["bytes"][n] == (whole // 2 if n in rank["split"] else whole), n   # halved, or whole
    split_bytes = sum(tp_whole_bytes[n] for n in rank["split"])
    assert sum(rank["bytes"].values()) == sum(tp_whole_bytes.values()) - split_bytes // 2

# %% [markdown]
# Both ranks computed the same loss at every step as the single process, within 1e-5 (the
# measured |Δ| is in the first table), and after 3 steps every parameter, its shards gathered
# whole (`zerokit.tensor_parallel.full_parameters`), equals the single process's within 1e-5
# too: the same training, split. On each rank the split tensors hold exactly half of their
# bytes: the packed q/k/v projection by whole heads (`blocks=3`: this rank's heads of q, of k
# and of v), `c_fc`'s weight and bias by output rows, `out_proj`'s and `c_proj`'s weights by
# input columns. Their biases stay whole: a row-parallel layer adds its bias once, after the
# all-reduce of the partial products. Everything outside the plan — embeddings and tied head,
# LayerNorms, the frozen table — is whole on both ranks, so a rank holds the whole model's
# bytes less half of the split tensors' (the last row).
#
# ### A pipeline: `zerokit.pipeline`
#
# Cut your GPT into two stages, one per rank, and push 4 micro-batches through them on the
# 1F1B schedule: does it train the same model, and what does each rank hold?
#
# zerokit reads a model as ordered pieces, and an `nn.Sequential` is one. Your GPT's forward
# already is a sequence — embeddings, the blocks, the final LayerNorm and head — so
# `as_sequential` lays out *its own modules* in that order: the same tensors, the tie between
# `wte` and `lm_head` and the frozen `wpe` kept. `split_points=["2"]` starts the second stage
# at piece `2`, the second block (torch's `SplitPoint.BEGINNING`). Every rank builds the whole
# model and keeps its stage, calls `pipe.step(x, target=y)` (the first stage reads `x`, the
# last computes the loss) and steps its own SGD over `pipe.parameters()`. The single-process
# copy is the first table's: the same GPT, seed, batches and SGD.

# %%
class Embeddings(nn.Module):
    """GPT.forward's first line as a piece: token plus position embeddings."""

    def __init__(self, wte, wpe):
        super().__init__()
        self.wte, self.wpe = wte, wpe

    def forward(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))


class Head(nn.Module):
    """GPT.forward's last line as a piece: the final LayerNorm and the (tied) head."""

    def __init__(self, ln_f, lm_head):
        super().__init__()
        self.ln_f, self.lm_head = ln_f, lm_head

    def forward(self, x):
        return self.lm_head(self.ln_f(x))


def as_sequential(gpt):
    t = gpt.transformer
    return nn.Sequential(Embeddings(t.wte, t.wpe), *t.h, Head(t.ln_f, gpt.lm_head))


def lm_loss(logits, y):
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def pp_train(ctx):
    torch.manual_seed(0)
    model = as_sequential(GPT(config).to(ctx.device))
    names = {id(p): n for n, p in model.named_parameters()}
    pipe = zerokit.pipeline(model, split_points=["2"], schedule="1f1b", micro_batches=4, loss_fn=lm_loss)
    opt = torch.optim.SGD(trainable(pipe), lr=0.1)     # this rank's stage only
    losses = []
    for s in range(STEPS):
        x, y = (t.to(ctx.device) for t in batch(s))
        micro = []
        losses.append(pipe.step(x, target=y, losses=micro))   # the step's mean loss, on every rank
        opt.step()
        opt.zero_grad()
    held = {id(p) for p in pipe.parameters()}
    return {"losses": losses, "micro": micro,
            "pieces": [f"{n} {type(m).__name__}" for n, m in model.named_children()
                       if all(id(p) in held for p in m.parameters())],
            "bytes": {names[id(p)]: p.untyped_storage().nbytes() for p in pipe.parameters()},
            "trained": sum(p.requires_grad for p in pipe.parameters()),
            "wte": model[0].wte.weight.detach().cpu() if id(model[0].wte.weight) in held else None}


x0, y0 = batch(0)
assert torch.equal(as_sequential(model)(x0), model(x0))                # the same function as your GPT
pp = zerokit.launch(pp_train, WORLD)
pp_whole_bytes = storage_bytes(as_sequential(model))
course.table([{"run": "single process (first table, SGD)",
               **{f"loss step {i}": f"{v:.6f}" for i, v in enumerate(reference["sgd"])},
               "max |Δ| vs single process (measured)": None}]
             + [{"run": f"pp rank {r}", **{f"loss step {i}": f"{v:.6f}" for i, v in enumerate(rank["losses"])},
                 "max |Δ| vs single process (measured)":
                     f"{max(abs(a - b) for a, b in zip(rank['losses'], reference['sgd'])):.1e}"}
                for r, rank in enumerate(pp)])

# %% [markdown]
# And what each rank holds, each parameter's bytes read from its tensor's storage:

# %%
course.table([{"rank": r, "pieces it runs": ", ".join(rank["pieces"]),
               "parameter tensors (trained)": f"{len(rank['bytes'])} ({rank['trained']})",
               "B (measured)": sum(rank["bytes"].values()),
               "holds the tied wte = lm_head": "yes" if rank["wte"] is not None else "no",
               "last step's micro-batch losses (losses=)": ", ".join(f"{v:.4f}" for v in rank["micro"]) or None}
              for r, rank in enumerate(pp)]
             + [{"rank": "single process", "parameter tensors": len(pp_whole_bytes),
                 "B (measured)": sum(pp_whole_bytes.values())}])

# %% [checks]
for rank in pp:
    assert max(abs(a - b) for a, b in zip(rank["losses"], reference["sgd"])) < TP_TOL   # fp32 rounding, as above
assert pp[0]["pieces"] == ["0 Embeddings", "1 Block"] and pp[1]["pieces"] == ["2 Block", "3 Head"]
assert not pp[0]["micro"] and len(pp[1]["micro"]) == 4                 # the last stage computes the losses
assert abs(sum(pp[1]["micro"]) / 4 - pp[1]["losses"][-1]) < 1e-6        # the step's loss is their mean
tied = set(pp[0]["bytes"]) & set(pp[1]["bytes"])
assert tied == {"0.wte.weight"} and set(pp[0]["bytes"]) | set(pp[1]["bytes"]) == set(pp_whole_bytes)
assert torch.equal(pp[0]["wte"], pp[1]["wte"])                         # both copies took the same steps
assert (sum(sum(rank["bytes"].values()) for rank in pp)
        == sum(pp_whole_bytes.values()) + pp_whole_bytes["0.wte.weight"])   # the whole model, the tied table twice

# %% [markdown]
# The step's mean loss, returned on both ranks, equals the single process's within 1e-5 at
# all 4 steps, and the last stage's `losses=` received the 4 micro-batch losses, whose mean is
# the step's. Rank 0 runs the embeddings and block 0, rank 1 block 1 and the head; between
# them the two hold every parameter once, except the tied `wte` = `lm_head`, which is on both
# — the first stage looks tokens up in it, the last projects onto it. zerokit sums its two
# gradients between the ranks that hold it (Megatron's embedding group), and after 4 steps the
# two copies are still equal, bit for bit. So the ranks' bytes add up to the whole model's
# plus one more copy of the tied table.
#
# ### Activation checkpointing: `zerokit.apply_checkpointing`
#
# In one process: install lesson 10's policies on your model's blocks — `"every"` (each block
# keeps only its input; backward runs it again) and `"selective"` (only the attention is
# recomputed) — does backward give the same gradients, and what does the forward keep?
#
# `apply_checkpointing` finds the repeated blocks itself (`transformer.h`) and changes no
# parameter name; `remove_checkpointing` undoes it. Both GPTs: your hand-written attention
# calls `scaled_dot_product_attention`, which `selective` recomputes alone; `nn.MultiheadAttention`
# computes its core in one function with its projections, and `selective` recomputes that
# whole call. The bytes come from `block_activations` (`zerokit.activation_checkpointing.measure`, as in
# lesson 10): the memory ledger's saved-tensor hooks around the blocks' forward and backward,
# on a copy of the model, from the first block's input.

# %%
from zerokit.activation_checkpointing.measure import block_activations


def gradients(net):
    net.zero_grad()
    F.cross_entropy(net(x0).flatten(0, 1), y0.flatten()).backward()
    return {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


ac = {}
for kind in (GPT, MHAGPT):
    torch.manual_seed(0)
    net = kind(config)
    with torch.no_grad():
        first_input = net.transformer.wte(x0) + net.transformer.wpe(torch.arange(x0.shape[1]))
    for policy in ("none", "every", "selective"):
        handle = zerokit.apply_checkpointing(net, policy)              # ← the one line
        grads = gradients(net)
        recomputed = handle.recomputed_forwards
        zerokit.remove_checkpointing(net)
        gradients(net)                                                 # once more, with the policy removed
        ac[kind.__name__, policy] = {"grads": grads, "recomputed": recomputed,
                                     "recomputed after remove": handle.recomputed_forwards - recomputed,
                                     **block_activations(net, first_input, policy, live=False)}
X = first_input.numel() * first_input.element_size()                   # a block's input: what a checkpoint keeps
EVERY = theory.checkpointed_activation_bytes(config.n_layer, 0, X, "full")   # one input per block (computed)
LSE = config.n_layer * BATCH * config.n_head * config.block_size * 4   # fp32 log-sum-exp per head and row (computed)
MODELS = {"GPT": "your GPT (scaled_dot_product_attention)", "MHAGPT": "with nn.MultiheadAttention"}
rows = []
for (kind, policy), got in ac.items():
    plain = ac[kind, "none"]
    grad_diff = max(float((got["grads"][n] - g).abs().max()) for n, g in plain["grads"].items())
    rows.append({"model": MODELS[kind], "policy": policy,
                 "stored B (ledger) / n·X (theory)": f"{got['stored']:,}" + (f" / {EVERY:,}" if policy == "every" else ""),
                 "peak B (ledger)": got["peak"], "recomputed forwards": got["recomputed"],
                 "max |Δ grad| vs none (measured)": f"{grad_diff:.1e}"})
course.table(rows)

# %%
for kind in ("GPT", "MHAGPT"):
    plain = ac[kind, "none"]
    for policy in ("every", "selective"):
        got = ac[kind, policy]
        assert max(float((got["grads"][n] - g).abs().max()) for n, g in plain["grads"].items()) < 1e-6  # same gradients
        assert got["recomputed"] == config.n_layer and got["recomputed after remove"] == 0
    assert ac[kind, "every"]["stored"] == EVERY                                 # exactly one input per block
    assert ac[kind, "every"]["peak"] < plain["peak"]
    assert ac[kind, "selective"]["stored"] < plain["stored"]
assert ac["GPT", "none"]["stored"] - ac["GPT", "selective"]["stored"] == LSE   # the core's own saved tensors
assert (ac["MHAGPT", "none"]["stored"] - ac["MHAGPT", "selective"]["stored"]
        > ac["GPT", "none"]["stored"] - ac["GPT", "selective"]["stored"])     # projections recomputed too

# %% [markdown]
# Both policies, on both models, give the gradients of no checkpointing within 1e-6 (the
# measured |Δ| is in the table), each recomputing one forward per block (the attention's,
# under `selective`); after `remove_checkpointing` a backward recomputed nothing. `every`
# keeps exactly one input per block after forward, n·X as the formula says, and peaks lower
# than no checkpointing. `selective` keeps less than no checkpointing on both, by different
# amounts: on your hand-written attention exactly what the fused kernel saved for its core,
# one fp32 log-sum-exp per head and query row; on `nn.MultiheadAttention` more, since its
# projections' outputs are recomputed with the core.

# %% [markdown]
# ## Try it
#
# This GPT is nanoGPT's; at `n_layer=48, n_head=25, n_embd=1600` and GPT-2's vocabulary it
# is GPT-2 XL (1.56 B parameters). What it would need per GPU at that size is a question for
# the planner (`zerokit.plan`: the formulas of `zerokit.theory`, nothing runs) — choose the
# GPUs, their memory and the stage:

# %%
course.PlanPanel(preset="gpt2-1.5b", gpus=8, gpu_memory_gb=16, strategy="zero3", micro_batch_size=1,
                 checkpointing="full")

# %% [markdown]
# ## Summary
#
# - Your own model goes under DDP, ZeRO-1, ZeRO-2 and ZeRO-3 with one line in your loop:
#   `zerokit.DistributedDataParallel(model)`, `zerokit.ShardedOptimizer(params, Adam, …)`,
#   or `engine, _, _, _ = zerokit.initialize(model=…, model_parameters=…, config=ds_config)` —
#   DeepSpeed's call, as the seed makes it, with `deepspeed` replaced by `zerokit`.
# - It trains the same model: every setup's losses equal a single process's to fp32
#   rounding (within 1e-5, with SGD and with AdamW).
# - Each rank holds what `theory.model_state_bytes` says, to the byte, with a tied head
#   (one tensor, counted once) and a frozen table (whole on every rank, no gradient, no
#   optimizer state): 4 + 4 + 8 bytes per trained parameter under DDP in fp32 AdamW, a
#   category divided by N at each stage from ZeRO-1 to ZeRO-3.
# - The seed's stage-3 block runs as written (`allgather_bucket_size` ignored with a
#   warning, as DeepSpeed ignores it); its `"pipeline"` block is not a DeepSpeed config
#   key, and is refused with DeepSpeed's real API (`PipelineModule`).
# - The other axes take your model in your loop too. `zerokit.parallelize_module(model, None,
#   plan)`, with torch's `ColwiseParallel()` / `RowwiseParallel()` for the MLP and `"attention"`
#   for `nn.MultiheadAttention`, trains like one process (losses and the gathered parameters
#   within 1e-5), each rank holding half of every split tensor's bytes, measured (the
#   row-parallel biases stay whole).
# - `zerokit.pipeline(as_sequential(gpt), split_points=["2"], schedule="1f1b",
#   micro_batches=4, loss_fn=…)` with your SGD over `pipe.parameters()` gives the single
#   process's losses (within 1e-5); each rank holds its stage, and both hold the tied
#   embedding and head, which stay equal.
# - `zerokit.apply_checkpointing(model, "every" | "selective")` leaves the gradients as they
#   were (within 1e-6); `every` keeps one input per block (n·X, the ledger's count equal to the
#   formula), `selective` less than none: the attention core's log-sum-exp on your hand-written
#   attention, more on `nn.MultiheadAttention`, whose projections it recomputes too.
#
# ## Interview questions
#
# 1. *You switch from DDP to ZeRO-3 and the loss curve changes. Is that expected?*
#
#    <details><summary>Answer</summary>
#
#    No: ZeRO changes where the states live, not the arithmetic; every setup above matches a
#    single process to fp32 rounding (the loss table). Something else changed — the data a rank
#    sees, the seed, the batch.
#
#    </details>
#
# 2. *A model has a 50 M-parameter frozen embedding. What does ZeRO-3 on 8 GPUs save on it?*
#
#    <details><summary>Answer</summary>
#
#    Under DeepSpeed's ZeRO-3 and under FSDP2, 7/8 of its bytes: both partition every parameter,
#    frozen ones included, and gather it for each forward like any other; it has no gradient and
#    no optimizer state, so nothing else is saved, and each step now gathers it for the forward
#    (and again for the backward where autograd needs the weight). zerokit's `zero3` makes the other
#    choice — a frozen weight stays whole on every rank and no step sends it: the frozen table
#    in the params row at every stage above, and in no step's payload. Which is better is the
#    trade of lesson 06: memory against a gather per forward.
#
#    </details>
#
# 3. *The seed's stage-3 config sets `allgather_bucket_size: 5e8`. What does that change?*
#
#    <details><summary>Answer</summary>
#
#    Nothing: it sizes the parameter all-gathers of stages 1 and 2; DeepSpeed ignores it at
#    stage 3, and zerokit warns and ignores it too (the seed's rows equal the bare stage-3 rows
#    in every table).
#
#    </details>

# %% [markdown]
# **Exercise:** [exercises/02_naive_ddp.ipynb](../exercises/02_naive_ddp.ipynb) — the DDP
# wrapper you used here, written by you, graded by `zerokit grade 02` · **Next:** [lesson 14 —
# failure labs](14_failure_labs.ipynb)
