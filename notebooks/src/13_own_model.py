# %% [markdown]
# # 13 · Your own model: one line from DDP to ZeRO-3
#
# **The question.** The seed trains with *"model_engine, optimizer, _, _ =
# deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)"*
# and a `zero_optimization` block at stage 3. The lessons so far trained zerokit's own
# model through `zerokit.train`. What does it take to put *your* model — written by you,
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
# what the seed's `"pipeline"` block gets.

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
# gradients' norm at 1.0 — DeepSpeed's default, and `zerokit.initialize`'s. DDP and
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
            "gradient_clipping": 0,  # DeepSpeed's default is 1.0; the plain copy below does not clip
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

# %%
def single(optimizer):
    torch.manual_seed(0)
    model = GPT(config)
    opt_class, hyper = OPTIMIZERS[optimizer]
    opt = opt_class(trainable(model), **hyper)
    losses = []
    for s in range(STEPS):
        x, y = batch(s)
        opt.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


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
                     **{f"loss step {i}": f"{v:.6f}" for i, v in enumerate(losses)},
                     "max |Δ| vs single process": f"{max(abs(a - b) for a, b in zip(losses, reference[opt])):.1e}"})
course.table(rows)

# %%
for setup in SETUPS:
    sgd = mean_losses(runs[setup, "sgd"])
    assert max(abs(a - b) for a, b in zip(sgd, reference["sgd"])) < 1e-5       # the same training, to fp32 rounding
    adamw = mean_losses(runs[setup, "adamw"])
    assert max(abs(a - b) for a, b in zip(adamw, reference["adamw"])) < 1e-5
assert reference["sgd"][-1] < reference["sgd"][0] and reference["adamw"][-1] < reference["adamw"][0]  # it learns

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

# %%
for setup in SETUPS:
    expected = formula(setup)
    for rank in runs[setup, "adamw"]:
        assert rank["memory"] == {"params": expected.params, "grads": expected.grads, "optimizer": expected.optimizer}
assert runs["seed's config", "adamw"][0]["memory"] == runs["ZeRO-3", "adamw"][0]["memory"]
assert formula("ZeRO-3").params - formula("ZeRO-3").grads == 4 * frozen     # the frozen table stays whole
assert formula("DDP").optimizer == 8 * trained + 4 * len(trainable(model))  # m and v, plus a step per tensor

# %% [markdown]
# Measured and formula agree to the byte on both ranks. The frozen position table is in
# the params row at every stage, whole — ZeRO-3 shards only what it trains — and it adds
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

# %%
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
fig, ax = course.new_figure(7.0, 3.2)
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
              fontsize=8)
ax.set_ylabel("KiB per rank (measured)")
ax.set_title(f"your GPT (Ψ = {psi:,}, fp32 AdamW) on 2 ranks: model states per rank, rank 0", fontsize=9)
ax.legend(fontsize=7, frameon=False)
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
# **Your model on the other axes.** Each has its own-loop call, with torch's convention:
#
# - *tensor parallelism*: `zerokit.parallelize_module(model, tp_mesh, {"blocks.*.mlp.c_fc":
#   ColwiseParallel(), "blocks.*.mlp.c_proj": RowwiseParallel(), …})`, and the style
#   `"attention"` for an `nn.MultiheadAttention` (split by whole heads). A hand-written
#   attention like the one above reads its widths from the whole embedding (`C // n_head`);
#   with t ranks each holds `n_head / t` heads, so its forward must use the local width —
#   the same change torch's own tensor parallelism asks of it;
# - *a pipeline*: `pipe = zerokit.pipeline(model, split_points=[…], schedule="1f1b",
#   micro_batches=m, loss_fn=…)` on an `nn.Sequential` (or a model with `pipeline_pieces()`),
#   `pipe.step(x, target=y)` on every rank, your optimizer on `pipe.parameters()`;
# - *activation checkpointing*: `zerokit.apply_checkpointing(model, "every" | "selective")`
#   on the repeated blocks, lesson 10's policies on your model.

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
#   or `zerokit.initialize(model=…, model_parameters=…, config=ds_config)` — the seed's
#   DeepSpeed snippet with `deepspeed` replaced by `zerokit`.
# - It trains the same model: every setup's losses equal a single process's to fp32
#   rounding (within 1e-5, with SGD and with AdamW).
# - Each rank holds what `theory.model_state_bytes` says, to the byte, with a tied head
#   (one tensor, counted once) and a frozen table (whole on every rank, no gradient, no
#   optimizer state): 4 + 4 + 8 bytes per trained parameter under DDP in fp32 AdamW, a
#   category divided by N at each stage from ZeRO-1 to ZeRO-3.
# - The seed's stage-3 block runs as written (`allgather_bucket_size` ignored with a
#   warning, as DeepSpeed ignores it); its `"pipeline"` block is not a DeepSpeed config
#   key, and is refused with DeepSpeed's real API (`PipelineModule`).
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
#    Nothing: a frozen weight is held whole on every rank, with no gradient and no optimizer
#    state to shard, and no step sends it (the frozen table in the params row at every stage,
#    and in no step's payload).
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
