"""The formulas zerokit is held against, in one place.

Every comparison in the library, the CLI and the notebooks takes its expected value
from here; nothing else re-types a formula. Sources: ZeRO (Rajbhandari et al.,
arXiv 1910.02054 §3.1, §5, §7), GPipe (1811.06965), Megatron-LM (1909.08053 §3,
2104.04473 §2.2), Korthikanti et al. (2205.05198 §4), Chen et al. (1604.06174),
ZeRO-Offload (2101.06840).

Notation: psi = parameter count, n = data-parallel degree, b = bytes per element.
Flat buffers are padded to a multiple of n, so a rank's shard of a unit of ``u``
elements is ``ceil(u / n)`` elements; pass the unit sizes to get exact figures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Sequence

PRECISIONS = ("fp32", "bf16-mixed")
OPTIMIZERS = ("adamw", "sgd")
STAGES = (0, 1, 2, 3)

#: torch's Adam/AdamW keeps one fp32 scalar ``step`` tensor per parameter tensor.
ADAM_STEP_SCALAR_BYTES = 4


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not supported; allowed: {', '.join(PRECISIONS)}")
    return precision


def check_optimizer(optimizer: str) -> str:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} is not supported; allowed: {', '.join(OPTIMIZERS)}")
    return optimizer


def param_bytes_per_element(precision: str) -> int:
    """Bytes of one parameter (and one gradient) element: 4 in fp32, 2 in bf16 mixed precision."""
    return 4 if check_precision(precision) == "fp32" else 2


def optimizer_bytes_per_element(precision: str, optimizer: str) -> int:
    """K of the ZeRO paper: optimizer-state bytes per parameter.

    Adam in mixed precision keeps an fp32 master copy plus m and v (K = 12); in plain
    fp32 the parameters are their own master, so K = 8 (m and v). Plain SGD (no
    momentum) keeps nothing in fp32 and only the fp32 master in mixed precision.
    """
    check_precision(precision)
    check_optimizer(optimizer)
    master = 4 if precision == "bf16-mixed" else 0
    moments = 8 if optimizer == "adamw" else 0
    return master + moments


def shard_numel(units: Iterable[int], n: int) -> int:
    """Elements a rank owns when each unit is a flat buffer padded to a multiple of n."""
    return sum(-(-int(u) // n) for u in units)


def padded_numel(units: Iterable[int], n: int) -> int:
    """Elements of the padded flat buffers holding ``units`` (n times the shard)."""
    return n * shard_numel(units, n)


@dataclass(frozen=True)
class ModelStates:
    """Bytes of model states on one rank, by category (ZeRO §3.1)."""

    params: int
    grads: int
    optimizer: int
    #: the part of ``optimizer`` that is Adam's per-tensor ``step`` scalars
    step_scalars: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def as_dict(self) -> dict:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "step_scalars": self.step_scalars, "total": self.total}


def model_state_bytes(stage: int, psi: int, n: int, precision: str = "fp32",
                      optimizer: str = "adamw", units: Sequence[int] | None = None,
                      optimizer_tensors: int = 0, persistent_numel: int = 0) -> ModelStates:
    """Model-state bytes per rank for ZeRO stage 0 (DDP) to 3 (ZeRO paper §5.1, Figure 1).

    stage 0: every rank holds params, grads and optimizer states for all psi elements.
    stage 1: optimizer states sharded; stage 2: + gradients; stage 3: + parameters.
    ``units`` are the sizes of the flat buffers the strategy shards (default: one
    buffer of psi elements); stages 1-3 pad each to a multiple of n. ``optimizer_tensors``
    is the number of tensors the optimizer steps (one Adam ``step`` scalar each).
    ``persistent_numel`` counts stage-3 parameters kept gathered (persistence threshold):
    they are held whole, with their gradients and optimizer states, outside the shards.
    """
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r} is not a ZeRO stage; allowed: 0, 1, 2, 3")
    if n < 1:
        raise ValueError(f"n={n!r}: the data-parallel degree must be >= 1")
    pb = param_bytes_per_element(precision)
    k = optimizer_bytes_per_element(precision, optimizer)
    steps = ADAM_STEP_SCALAR_BYTES * optimizer_tensors if optimizer == "adamw" else 0
    if stage == 0:
        return ModelStates(pb * psi, pb * psi, k * psi + steps, steps)
    units = [psi - persistent_numel] if units is None else list(units)
    shard = shard_numel(units, n)
    full = n * shard
    persistent = persistent_numel
    if stage == 1:
        return ModelStates(pb * full, pb * full, k * shard + steps, steps)
    if stage == 2:
        return ModelStates(pb * full, pb * shard, k * shard + steps, steps)
    return ModelStates(pb * (shard + persistent), pb * (shard + persistent),
                       k * (shard + persistent) + steps, steps)


def paper_model_state_bytes(stage: int, psi: int, n: int, k: int = 12) -> float:
    """The paper's own per-rank formula with 2-byte params and grads: (2 + 2 + K)·psi sharded by stage."""
    if stage == 0:
        return (2 + 2 + k) * psi
    if stage == 1:
        return 4 * psi + k * psi / n
    if stage == 2:
        return 2 * psi + (2 + k) * psi / n
    if stage == 3:
        return (2 + 2 + k) * psi / n
    raise ValueError(f"stage={stage!r} is not a ZeRO stage; allowed: 0, 1, 2, 3")


def zero1_saving_fraction(n: int, precision: str = "bf16-mixed") -> float:
    """Fraction of DDP's model-state memory that ZeRO-1 saves: 0.75·(1−1/n) mixed, 0.5·(1−1/n) fp32."""
    share = 12 / 16 if check_precision(precision) == "bf16-mixed" else 8 / 16
    return share * (1 - 1 / n)


def deepspeed_estimator_bytes_per_param() -> int:
    """DeepSpeed's estimator counts fp32 gradients: 2 + 4 + 12 = 18 bytes per parameter."""
    return 18


# --- communication (ZeRO §7; ring algorithms) -------------------------------------------

RING_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv")


def _exact(x: Fraction):
    return int(x) if x.denominator == 1 else float(x)


def ring_bytes_sent(op: str, payload_bytes: int, n: int, rank: int = 0, src: int = 0):
    """Bytes one rank sends for a collective under the ring algorithm.

    ``payload_bytes`` is the full tensor: the input of a reduce-scatter, the output of an
    all-gather. All-reduce = reduce-scatter + all-gather: 2(n−1)/n·S; each half (n−1)/n·S.
    A broadcast is a pipelined chain from ``src``: every rank but the last forwards S.
    """
    if n <= 1:
        return 0
    s = Fraction(int(payload_bytes))
    if op == "all_reduce":
        return _exact(2 * (n - 1) * s / n)
    if op in ("reduce_scatter", "all_gather"):
        return _exact((n - 1) * s / n)
    if op == "broadcast":
        last = (src - 1) % n
        return 0 if rank == last else int(s)
    if op == "send":
        return int(s)
    if op == "recv":
        return 0
    raise ValueError(f"op={op!r} has no ring formula; allowed: {', '.join(RING_OPS)}")


def ring_steps(op: str, n: int) -> int:
    """Send/recv rounds of the ring: n−1 for each half, 2(n−1) for all-reduce."""
    if op == "all_reduce":
        return 2 * (n - 1)
    if op in ("reduce_scatter", "all_gather"):
        return n - 1
    raise ValueError(f"op={op!r}: allowed all_reduce, reduce_scatter, all_gather")


def comm_bytes_per_step(stage: int, psi: int, n: int, bytes_per_element: int,
                        micro_batches: int = 1, units: Sequence[int] | None = None,
                        persistent_numel: int = 0, reshard_after_forward: bool = True):
    """Bytes a rank sends per optimizer step (ZeRO §7.2).

    DDP = ZeRO-1 = ZeRO-2 = 2(n−1)/n·psi·b; ZeRO-3 = 3(n−1)/n·psi·b (params gathered in
    forward and again in backward, grads reduce-scattered). With A micro-batches DDP
    (no_sync) and ZeRO-1 reduce once; ZeRO-2 and ZeRO-3 reduce-scatter every micro-batch,
    and ZeRO-3 gathers twice per micro-batch. Stages 1-3 move the padded buffers.
    Stage-3 persistent parameters are all-reduced like DDP's, once per micro-batch.
    Stage 3 with ``reshard_after_forward=False`` keeps each unit gathered from its
    forward to its backward: one gather per micro-batch, 2(n−1)/n·psi·b (ZeRO-2's traffic).
    """
    if n <= 1:
        return 0
    a = micro_batches
    b = bytes_per_element
    if stage == 0:
        return _exact(Fraction(2 * (n - 1) * psi * b, n))
    units = [psi - persistent_numel] if units is None else list(units)
    full = padded_numel(units, n)
    half = Fraction((n - 1) * full * b, n)
    if stage == 1:
        return _exact(2 * half)
    if stage == 2:
        return _exact(a * half + half)
    if stage == 3:
        persistent = Fraction(2 * (n - 1) * persistent_numel * b, n)
        gathers = 2 if reshard_after_forward else 1
        return _exact(a * ((gathers + 1) * half + persistent))
    raise ValueError(f"stage={stage!r} is not a ZeRO stage; allowed: 0, 1, 2, 3")


# --- pipeline parallelism (GPipe §2; Megatron 2104.04473 §2.2) -------------------------

def pipeline_makespan(p: int, m: int, t_f: float = 1.0, t_b: float = 1.0) -> float:
    """(m + p − 1)(t_f + t_b) for p equal stages and m micro-batches."""
    return (m + p - 1) * (t_f + t_b)


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Share of wall time the pipeline idles: (p − 1)/(v·m + p − 1)."""
    return (p - 1) / (v * m + p - 1)


def bubble_over_ideal(p: int, m: int, v: int = 1) -> float:
    """Bubble time over ideal compute time: (p − 1)/(v·m)."""
    return (p - 1) / (v * m)


def peak_stashed_microbatches(schedule: str, p: int, m: int, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` (0-indexed) holds at peak: GPipe m, 1F1B min(p − i, m)."""
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p - stage, m)
    raise ValueError(f"schedule={schedule!r}; allowed: gpipe, 1f1b")


# --- tensor parallelism (Megatron 1909.08053 §3) ---------------------------------------

def tp_elements_sent_per_layer(b: int, s: int, h: int, t: int) -> float:
    """Elements a device sends per transformer layer per micro-batch: 4 all-reduces of b·s·h, 8·b·s·h·(t−1)/t."""
    return 8 * b * s * h * (t - 1) / t


def tp_comm_bytes_per_step(tokens: int, reduced_width: int, t: int, bytes_per_element: int,
                           micro_batches: int = 1, gathered_width: int = 0, loss_reductions: int = 0,
                           sequence_parallel_numel: int = 0) -> float:
    """Bytes a rank sends on ``tp`` per step under the ring formula, for any model a plan split.

    Per micro-batch of ``tokens`` (local b·s): every conjugate pair f/g moves ``tokens``
    times its width once, as an all-reduce (2(t−1)/t) or, under sequence parallelism, as an
    all-gather + reduce-scatter pair ((t−1)/t each, the same bytes); ``reduced_width`` is
    the sum of those widths (Megatron's layer: 4h, so 8·b·s·h·(t−1)/t elements, §3).
    ``gathered_width``: outputs all-gathered whole, (t−1)/t. ``loss_reductions``: the
    vocabulary-parallel cross-entropy's all-reduces of ``tokens`` fp32 values (max,
    Σexp, target logit: 3). ``sequence_parallel_numel``: replicated parameters whose
    gradients are all-reduced over ``tp`` once per backward. The planner's per-term view of the
    same traffic for a Megatron transformer: :func:`tp_bytes_sent_per_step`,
    :func:`tp_edge_bytes_per_step`, :func:`sequence_parallel_grad_bytes`.
    """
    if t < 1:
        raise ValueError(f"t={t!r}: the tensor-parallel degree must be >= 1")
    if t == 1:
        return 0
    per_micro_batch = (2 * (t - 1) / t * tokens * reduced_width * bytes_per_element
                       + (t - 1) / t * tokens * gathered_width * bytes_per_element
                       + 2 * (t - 1) / t * tokens * loss_reductions * 4)
    return (per_micro_batch * micro_batches
            + sequence_parallel_grad_bytes(sequence_parallel_numel, t, bytes_per_element, micro_batches))


# --- activations and checkpointing ------------------------------------------------------

def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1) -> float:
    """Korthikanti et al. §4, 16-bit with dropout: s·b·h·(10 + 24/t + 5·a·s/(h·t)); t = 1 gives 34 + 5as/h."""
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def checkpointed_blocks(n: int, k: int) -> float:
    """Chen et al.: n blocks in k segments store about k + n/k block activations."""
    return k + n / k


def optimal_checkpoint_segments(n: int) -> int:
    """k = √n minimises k + n/k (at 2√n)."""
    return max(1, round(math.sqrt(n)))


# --- offload (ZeRO-Offload 2101.06840) --------------------------------------------------

def offload_traffic_bytes(psi: int, bytes_per_element: int = 2) -> int:
    """Device↔host bytes per step: gradients out and parameters back, 2·psi·b."""
    return 2 * psi * bytes_per_element


# --- planning real models and clusters (zerokit.planner) --------------------------------
#
# What zerokit.planner needs beyond the sections above: the parameter inventory of a
# transformer, Korthikanti's activations generalised (tensor and sequence parallelism,
# dropout, fused attention, gated MLPs) and under a checkpointing policy, the bytes of each
# collective per step, ZeRO-Offload's device/host split, DeepSpeed's two memory estimators
# as its code computes them, and the α-β time of a transfer on a link.

GIB = 2**30
GB = 10**9


def tp_model_state_bytes(sharded_numel: int, replicated_numel: int, t: int, precision: str = "bf16-mixed",
                         optimizer: str = "adamw", optimizer_tensors: int = 0) -> ModelStates:
    """Model states of one tensor-parallel rank (Megatron 1909.08053 §3), no data-parallel sharding.

    ``sharded_numel`` elements (the split weight matrices and their column-parallel biases)
    are divided over ``t`` ranks, ``ceil(sharded_numel / t)`` each; ``replicated_numel``
    (layer norms, row-parallel biases) are held whole by every rank. Each element costs
    what stage 0 of :func:`model_state_bytes` charges: params and grads ``b`` bytes, the
    optimizer K bytes (+ 4 per stepped tensor for Adam's ``step``).
    """
    if t < 1:
        raise ValueError(f"t={t!r}: the tensor-parallel degree must be >= 1")
    if sharded_numel < 0 or replicated_numel < 0:
        raise ValueError(f"sharded_numel={sharded_numel!r}, replicated_numel={replicated_numel!r} must be >= 0")
    per_rank = -(-int(sharded_numel) // t) + int(replicated_numel)
    return model_state_bytes(0, per_rank, 1, precision, optimizer, optimizer_tensors=optimizer_tensors)


def activation_bytes_per_layer_sequence_parallel(s: int, b: int, h: int, a: int, t: int) -> float:
    """Korthikanti et al. §4.2.2, 16-bit with dropout, tensor + sequence parallel: s·b·h·(34/t + 5·a·s/(h·t)).

    Sequence parallelism splits the layer norms, dropouts and the linear layers' inputs
    along the sequence, so the 10·s·b·h that tensor parallelism alone replicates is divided
    by t as well.
    """
    return s * b * h * (34 / t + 5 * a * s / (h * t))


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor of a transformer: its name, size, module, layer and how Megatron's TP splits it."""

    name: str
    numel: int
    #: the module that holds it (DeepSpeed's "largest layer" is the largest module)
    module: str
    #: the transformer layer it belongs to; None for embeddings, final norms and the head
    layer: int | None
    #: True: split over the tensor-parallel ranks; False: every TP rank holds it whole
    tp_sharded: bool


MLPS = ("gelu", "relu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rotary", "relative")


def transformer_parameters(layers: int, hidden: int, heads: int, ffn: int, vocab: int, seq_len: int,
                           tied: bool, kv_heads: int | None = None, head_dim: int | None = None,
                           mlp: str = "gelu", norm: str = "layernorm", bias: bool = True,
                           position: str = "learned", cross_attention_layers: int = 0,
                           relative_buckets: int = 32) -> list[ParamTensor]:
    """Every parameter tensor of a decoder (or encoder-decoder) transformer, in registration order.

    A layer: a norm, attention (Q of heads·head_dim, K and V of kv_heads·head_dim, an output
    projection), a second norm, an MLP (``gelu``/``relu``: h→ffn→h; ``swiglu``: gate and up
    h→ffn, down ffn→h); decoder layers of an encoder-decoder (the last
    ``cross_attention_layers``) add a norm and a cross-attention. Around the layers: the
    token embedding, a learned position embedding (``learned``) or relative-position biases
    (``relative``, one table per stack), the final norm(s) and the head (none if ``tied``).
    With ``mlp="gelu"``, one head size and learned positions this is GPT's
    12·L·h² + 13·L·h + (V + s)·h + 2h (+ V·h untied). Names follow zerokit's tiny GPT.
    """
    if mlp not in MLPS or norm not in NORMS or position not in POSITIONS:
        raise ValueError(f"mlp={mlp!r}, norm={norm!r}, position={position!r}; allowed: {MLPS}, {NORMS}, {POSITIONS}")
    kv_heads = heads if kv_heads is None else kv_heads
    head_dim = hidden // heads if head_dim is None else head_dim
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    out: list[ParamTensor] = []

    def add(module, kind, numel, layer, sharded):
        out.append(ParamTensor(f"{module}.{kind}", int(numel), module, layer, sharded))

    def norm_params(module, layer):
        add(module, "weight", hidden, layer, False)
        if norm == "layernorm":
            add(module, "bias", hidden, layer, False)

    def linear(module, n_in, n_out, layer, column):
        """A column-parallel linear splits its outputs (and bias); a row-parallel one its inputs, bias whole."""
        add(module, "weight", n_in * n_out, layer, True)
        if bias:
            add(module, "bias", n_out, layer, column)

    def attention(prefix, layer):
        if q_dim == kv_dim:
            linear(f"{prefix}.qkv", hidden, 3 * q_dim, layer, True)
        else:
            linear(f"{prefix}.q", hidden, q_dim, layer, True)
            linear(f"{prefix}.kv", hidden, 2 * kv_dim, layer, True)
        linear(f"{prefix}.proj", q_dim, hidden, layer, False)

    add("tok", "weight", vocab * hidden, None, True)
    if position == "learned":
        add("pos", "weight", seq_len * hidden, None, False)
    stacks = 2 if cross_attention_layers else 1
    if position == "relative":
        for stack in range(stacks):
            add(f"relative_bias.{stack}", "weight", relative_buckets * heads, None, True)
    for i in range(layers):
        block = f"blocks.{i}"
        norm_params(f"{block}.ln1", i)
        attention(f"{block}.attn", i)
        if i >= layers - cross_attention_layers:
            norm_params(f"{block}.ln_cross", i)
            attention(f"{block}.cross", i)
        norm_params(f"{block}.ln2", i)
        if mlp == "swiglu":
            linear(f"{block}.mlp.gate", hidden, ffn, i, True)
            linear(f"{block}.mlp.up", hidden, ffn, i, True)
            linear(f"{block}.mlp.down", ffn, hidden, i, False)
        else:
            linear(f"{block}.mlp.fc", hidden, ffn, i, True)
            linear(f"{block}.mlp.proj", ffn, hidden, i, False)
    for stack in range(stacks):
        norm_params("ln_f" if stack == stacks - 1 else "ln_enc", None)
    if not tied:
        add("head", "weight", vocab * hidden, None, True)
    return out


def transformer_param_count(*args, **kwargs) -> int:
    """Ψ of :func:`transformer_parameters` (same arguments): the sum of its tensors."""
    return sum(p.numel for p in transformer_parameters(*args, **kwargs))


def transformer_layer_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
                                       ffn: int | None = None, q_dim: int | None = None,
                                       kv_dim: int | None = None, element_bytes: int = 2, dropout: bool = True,
                                       fused_attention: bool = False, mlp: str = "gelu",
                                       cross_attention: bool = False, regather: bool = True) -> float:
    """Bytes one transformer layer saves for backward per micro-batch: Korthikanti et al. §4, term by term.

    Per token, ``e`` bytes per element: two norm inputs and the inputs of QKV and of the
    MLP (4e·h, kept whole on every TP rank unless sequence parallel) and two dropout masks
    (2h, 1 byte each); split over t: Q, K, V and the output projection's input
    (e·(2·q + 2·kv)), the MLP's activation input and second linear's input (2e·ffn; SwiGLU
    4e·ffn: gate, its SiLU, up, and their product), and per head either the materialised
    softmax (e·s) with its dropout mask (s) and output (e·s), or, fused (flash attention),
    the fp32 log-sum-exp (4 bytes). With e = 2, ffn = 4h, dropout, unfused this is
    s·b·h·(10 + 24/t + 5·a·s/(h·t)), and s·b·h·(34/t + 5·a·s/(h·t)) sequence parallel.
    A decoder layer's cross-attention adds a norm input, a query input, Q/K/V, the
    projection input, scores and a mask again (the encoder's output it reads is not counted).
    ``regather=False``: under sequence parallelism the column-parallel layers save their
    all-gathered input (e·h per token each, whole) instead of the shard Megatron keeps and
    gathers again in backward.
    """
    ffn = 4 * h if ffn is None else ffn
    q_dim = h if q_dim is None else q_dim
    kv_dim = q_dim if kv_dim is None else kv_dim
    e = element_bytes
    mask = 1 if dropout else 0
    norms, linear_inputs = 2 * e * h + 2 * mask * h, 2 * e * h
    mlp_bytes = (4 if mlp == "swiglu" else 2) * e * ffn
    attention = e * (2 * q_dim + 2 * kv_dim)
    scores = a * (4 if fused_attention else s * (e + mask * (1 + e)))
    if cross_attention:
        norms, linear_inputs = norms + e * h + mask * h, linear_inputs + e * h
        attention *= 2
        scores *= 2
    if sequence_parallel:
        norms, linear_inputs = norms / t, linear_inputs / t if regather else linear_inputs
    per_token = norms + linear_inputs + (attention + mlp_bytes + scores) / t
    return s * b * per_token


def embedding_activation_bytes(s: int, b: int, h: int, t: int = 1, sequence_parallel: bool = False,
                               dropout: bool = True) -> float:
    """The embedding's dropout mask, s·b·h bytes (Korthikanti §4.3); none without dropout (token ids not counted)."""
    if not dropout:
        return 0
    return s * b * h / (t if sequence_parallel else 1)


def output_activation_bytes(s: int, b: int, h: int, v: int, t: int = 1, sequence_parallel: bool = False,
                            element_bytes: int = 2) -> float:
    """The final norm's and the head's inputs (e·s·b·h each) and the fp32 logits cross-entropy keeps, 4·s·b·v/t.

    Korthikanti §4.3: "2sbh + 2sbh + 4sbv/t" in 16-bit; sequence parallelism splits the
    norm's input, the head's is gathered whole.
    """
    norm_input = element_bytes * s * b * h / (t if sequence_parallel else 1)
    return norm_input + element_bytes * s * b * h + 4 * s * b * v / t


CHECKPOINTING = ("none", "full", "every-k", "sqrt")


def checkpointed_activation_bytes(n: int, layer_bytes: float, boundary_bytes: float, policy: str = "none",
                                  segment_layers: int | None = None, in_flight: int = 1) -> float:
    """Activation bytes of n layers under a checkpointing policy, with ``in_flight`` micro-batches stashed.

    ``none``: every layer's activations, n·A per micro-batch. ``full`` (Korthikanti §5): each
    layer keeps only its input X (``boundary_bytes``), n·X, and one layer's A exists while
    it is recomputed. ``every-k`` (Chen et al. 1604.06174): segments of k layers keep their
    input, ⌈n/k⌉·X, and one segment's k·A during its recompute. ``sqrt``: k = √n, about
    2√n of Chen's blocks. Each in-flight micro-batch holds its stored part; the recompute
    working set exists once (one micro-batch is recomputed at a time).
    """
    if n < 0 or in_flight < 0:
        raise ValueError(f"n={n!r} and in_flight={in_flight!r} must be >= 0")
    if policy == "none":
        return in_flight * n * layer_bytes
    if n == 0:
        return 0
    if policy == "full":
        k = 1
    elif policy == "sqrt":
        k = -(-n // optimal_checkpoint_segments(n))
    elif policy == "every-k":
        if not isinstance(segment_layers, int) or segment_layers < 1:
            raise ValueError(f"segment_layers={segment_layers!r}: every-k needs a positive number of layers")
        k = min(segment_layers, n)
    else:
        raise ValueError(f"policy={policy!r} is not a checkpointing policy; allowed: {', '.join(CHECKPOINTING)}")
    return in_flight * -(-n // k) * boundary_bytes + k * layer_bytes


def zero_collective_bytes(stage: int, psi: int, n: int, bytes_per_element: int, micro_batches: int = 1,
                          units: Sequence[int] | None = None) -> dict:
    """:func:`comm_bytes_per_step` by collective: ``{"all_reduce" | "reduce_scatter" | "all_gather": bytes}``.

    DDP one all-reduce per step; ZeRO-1 a reduce-scatter and an all-gather; ZeRO-2 a
    reduce-scatter per micro-batch and one all-gather; ZeRO-3 two all-gathers and a
    reduce-scatter per micro-batch (ZeRO §7.2). The values sum to :func:`comm_bytes_per_step`.
    """
    if n <= 1:
        return {}
    a, b = micro_batches, bytes_per_element
    if stage == 0:
        return {"all_reduce": comm_bytes_per_step(0, psi, n, b)}
    units = [psi] if units is None else list(units)
    half = _exact(Fraction((n - 1) * padded_numel(units, n) * b, n))
    if stage == 1:
        return {"reduce_scatter": half, "all_gather": half}
    if stage == 2:
        return {"reduce_scatter": a * half, "all_gather": half}
    if stage == 3:
        return {"all_gather": 2 * a * half, "reduce_scatter": a * half}
    raise ValueError(f"stage={stage!r} is not a ZeRO stage; allowed: 0, 1, 2, 3")


def tp_bytes_sent_per_step(s: int, b: int, h: int, t: int, layers: int, micro_batches: int,
                           element_bytes: int = 2, recompute: bool = False) -> float:
    """Bytes a TP rank sends per step: 8·b·s·h·(t−1)/t elements per layer per micro-batch (Megatron §3).

    Sequence parallelism replaces each all-reduce by an all-gather + reduce-scatter of the
    same total (Korthikanti §4.2.2). Recomputing the forward (full checkpointing) repeats its
    two all-reduces: 1.5 × the traffic.
    """
    per_layer = tp_elements_sent_per_layer(b, s, h, t) * element_bytes
    return per_layer * layers * micro_batches * (1.5 if recompute else 1)


def tp_edge_bytes_per_step(s: int, b: int, h: int, t: int, micro_batches: int, element_bytes: int = 2,
                           embedding: bool = True, head: bool = True) -> dict:
    """Bytes a TP rank sends per step outside the layers (Megatron §3), by what sends them.

    The vocabulary-parallel embedding sums its partial lookups (g: an all-reduce of b·s·h
    forward); the column-parallel head's f all-reduces its input's gradient (b·s·h backward);
    the vocabulary-parallel cross-entropy all-reduces three fp32 numbers per token (the max
    logit, the sum of exponentials, the target's logit). Sequence parallelism swaps the first
    two for reduce-scatter/all-gather pairs of the same total. Each 2(t−1)/t of its size,
    per micro-batch.
    """
    if t <= 1:
        return {}
    ring = 2 * (t - 1) / t * micro_batches
    out = {}
    if embedding:
        out["embedding"] = ring * b * s * h * element_bytes
    if head:
        out["head"] = ring * b * s * h * element_bytes
        out["loss"] = ring * 3 * b * s * 4
    return out


def sequence_parallel_grad_bytes(replicated_numel: int, t: int, bytes_per_element: int = 2,
                                 micro_batches: int = 1) -> float:
    """Bytes a TP rank sends to sum the gradients of the parameters every rank holds whole (norms, row-parallel
    biases, positions), which under sequence parallelism each saw only 1/t of the sequence: an all-reduce of
    2(t−1)/t of them per backward (zerokit's hooks; Megatron once per step, after accumulation)."""
    if t <= 1:
        return 0.0
    return 2 * (t - 1) / t * replicated_numel * bytes_per_element * micro_batches


def pipeline_p2p_bytes(s: int, b: int, h: int, micro_batches: int, element_bytes: int = 2, t: int = 1,
                       sequence_parallel: bool = False) -> float:
    """Bytes a stage sends across one pipeline boundary per step, each way: m activations (or gradients) of s·b·h.

    A middle stage sends this forward and again backward. With sequence parallelism each
    TP rank sends its 1/t of the sequence.
    """
    return micro_batches * s * b * h * element_bytes / (t if sequence_parallel else 1)


def offload_model_state_bytes(stage: int, psi: int, n: int, optimizer: str = "adamw",
                              offload_params: bool = False) -> tuple:
    """ZeRO-Offload (2101.06840 §4): (device, host) model states per GPU in bf16 mixed precision.

    16-bit parameters stay on the device (2Ψ; 2Ψ/N at stage 3; none with ``offload_params``,
    stage 3 only, where the 16-bit shard lives on the host). The fp32 master, m and v of
    the rank's shard (K·Ψ/N) and its 16-bit gradient shard (2Ψ/N) live on the host, where
    the step runs. Stage 1 keeps its full 16-bit gradients on the device until they are
    reduced; stages 2-3 stream them out through the buckets.
    """
    if stage not in (1, 2, 3):
        raise ValueError(f"stage={stage!r}: offloading the optimizer needs ZeRO stage 1, 2 or 3 (DeepSpeed's rule)")
    if offload_params and stage != 3:
        raise ValueError(f"stage={stage!r}: offloading parameters needs ZeRO stage 3")
    k = optimizer_bytes_per_element("bf16-mixed", optimizer)
    shard = -(-psi // n)
    device_params = 0 if offload_params else (2 * shard if stage == 3 else 2 * psi)
    device_grads = 2 * psi if stage == 1 else 0
    device = ModelStates(device_params, device_grads, 0)
    host = ModelStates(2 * shard if offload_params else 0, 2 * shard, k * shard)
    return device, host


def deepspeed_zero2_estimate(psi: int, gpus_per_node: int = 1, nodes: int = 1, cpu_offload: bool = False,
                             buffer_factor: float = 1.5) -> tuple:
    """DeepSpeed's ``estimate_zero2_model_states_mem_needs`` as its code computes it: (host bytes, GPU bytes).

    GPU 2Ψ + 18Ψ/N (18 = 16-bit and fp32 grads, fp32 params, m, v) or 2Ψ with the
    optimizer offloaded; host 4Ψ per GPU of the node, or max(4N, 16)·Ψ offloaded, × the
    buffer factor 1.5 (FACTS §10).
    """
    total = nodes * gpus_per_node
    if cpu_offload:
        return int(psi * max(4 * total, 16) * buffer_factor), int(2 * psi)
    return int(psi * 4 * gpus_per_node * buffer_factor), int(2 * psi + int(18 * psi / total))


def deepspeed_zero3_estimate(psi: int, largest_layer: int, gpus_per_node: int = 1, nodes: int = 1,
                             cpu_offload: bool = False, cpu_offload_params: bool = False, zero_init: bool = True,
                             buffer_factor: float = 1.5) -> tuple:
    """DeepSpeed's ``estimate_zero3_model_states_mem_needs`` as its code computes it: (host, GPU, largest-layer bytes).

    GPU 4·L + 18Ψ/N, with L the largest module's parameter count; 4·L + 2Ψ/N with the
    optimizer offloaded; 4·L with the parameters offloaded too. Host memory per node
    carries the 1.5 buffer factor (FACTS §10).
    """
    total = nodes * gpus_per_node
    per_node = 1 / nodes
    largest = 4 * largest_layer
    if cpu_offload:
        if cpu_offload_params:
            gpu = largest
            cpu = psi * (18 * per_node if zero_init else max(4 * gpus_per_node, 18 * per_node)) * buffer_factor
        else:
            gpu = largest + int(2 * psi / total)
            cpu = psi * (16 * per_node if zero_init else max(4 * gpus_per_node, 16 * per_node)) * buffer_factor
    else:
        gpu = largest + int(18 * psi / total)
        cpu = (largest_layer if zero_init else psi) * 4 * gpus_per_node * buffer_factor
    return int(cpu), int(gpu), largest


def deepspeed_model_state_bytes(stage: int, psi: int, n: int, largest_layer: int = 0,
                                offload: str = "none") -> ModelStates:
    """Per-GPU model states in DeepSpeed's estimators' convention, split by category; totals equal theirs.

    Stage 2: params 2Ψ, grads 6Ψ/N (16-bit + fp32), optimizer 12Ψ/N (fp32 params, m, v):
    2Ψ + 18Ψ/N. Stage 3: the same 18Ψ/N sharded (its estimator names no separate 16-bit
    parameter shard) + 4 × the largest layer, counted as params. DeepSpeed has no stage 0
    or 1 estimator: zerokit extends its convention, stage 0 = 2Ψ + 2Ψ + 4Ψ + 12Ψ = 20Ψ,
    stage 1 = 2Ψ + 2Ψ + 16Ψ/N (full 16-bit grads, the fp32 gradient partition sharded).
    ``offload``: "optimizer" leaves the GPU 2Ψ (stages 1-2) or 4L + 2Ψ/N (stage 3);
    "params" (stage 3) leaves 4L.
    """
    if offload not in ("none", "optimizer", "params"):
        raise ValueError(f"offload={offload!r}; allowed: none, optimizer, params")
    if stage == 0:
        if offload != "none":
            raise ValueError("DeepSpeed offloads the optimizer for ZeRO stages 1-3 only")
        return ModelStates(2 * psi, 6 * psi, 12 * psi)
    if stage in (1, 2):
        if offload == "params":
            raise ValueError("DeepSpeed offloads parameters with ZeRO stage 3 only")
        if offload == "optimizer":
            return ModelStates(2 * psi, 0, 0)
        if stage == 1:
            return ModelStates(2 * psi, 2 * psi + int(4 * psi / n), int(16 * psi / n) - int(4 * psi / n))
        grads = int(6 * psi / n)
        return ModelStates(2 * psi, grads, int(18 * psi / n) - grads)
    if stage == 3:
        gathered = 4 * largest_layer
        if offload == "params":
            return ModelStates(gathered, 0, 0)
        if offload == "optimizer":
            return ModelStates(gathered + int(2 * psi / n), 0, 0)
        grads = int(6 * psi / n)
        return ModelStates(gathered, grads, int(18 * psi / n) - grads)
    raise ValueError(f"stage={stage!r} is not a ZeRO stage; allowed: 0, 1, 2, 3")


def link_seconds(nbytes: float, messages: float, bandwidth: float, latency: float) -> float:
    """The α-β estimate of a transfer: messages·α + bytes/β (bandwidth in bytes per second)."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth={bandwidth!r} must be > 0 bytes per second")
    return messages * latency + nbytes / bandwidth


def offload_traffic_bytes_accumulated(psi: int, bytes_per_element: int = 2, micro_batches: int = 1) -> int:
    """:func:`offload_traffic_bytes` with A micro-batches: each one's gradients go out (the host accumulates
    them), the updated parameters come back once: (A + 1)·psi·b; 2·psi·b for A = 1."""
    return (micro_batches + 1) * psi * bytes_per_element


def param_offload_traffic_bytes(shard_numel: int, bytes_per_element: int = 2, micro_batches: int = 1) -> int:
    """ZeRO-3 with offloaded parameters: each all-gather first brings the rank's 16-bit shard from the host,
    twice per micro-batch (forward and backward): 2·A·shard·b bytes host→device per step."""
    return 2 * micro_batches * shard_numel * bytes_per_element
