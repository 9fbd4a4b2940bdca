"""A transformer's parameters, tensor by tensor, from its shape (layers, hidden, heads, FFN,
vocabulary, tied embeddings)."""
from __future__ import annotations

from dataclasses import dataclass


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


def training_flops_per_token(psi: float) -> float:
    """Model FLOPs to train on one token, 6Ψ: 2Ψ forward, 4Ψ backward (Kaplan et al. 2001.08361 §2.1;
    the PaLM paper's MFU, 2204.02311 App. B, without its attention term, which is small at s ≪ 6h)."""
    if psi <= 0:
        raise ValueError(f"psi={psi!r}: the parameter count must be positive")
    return 6.0 * psi


def model_flops_utilization(psi: float, tokens_per_second_per_gpu: float, peak_flops: float) -> float:
    """MFU: the model FLOPs a GPU did per second (6Ψ per token) over its peak (dense bf16: 312e12 for an A100)."""
    if tokens_per_second_per_gpu < 0 or peak_flops <= 0:
        raise ValueError(f"tokens_per_second_per_gpu={tokens_per_second_per_gpu!r} must be >= 0 and "
                         f"peak_flops={peak_flops!r} > 0")
    return training_flops_per_token(psi) * tokens_per_second_per_gpu / peak_flops
