"""The models the planner knows: a transformer's shape, the presets, and a bare parameter count.

A :class:`ModelSpec` is either a transformer described by its shape (layers, hidden size,
heads, FFN size, vocabulary, sequence length, tied embeddings, and the few choices that
change the parameter count: MLP kind, norm, biases, positions, grouped-query heads,
cross-attention) or only a parameter count (``--params 7.5e9``), which is enough for model
states and data-parallel traffic but not for activations, tensor or pipeline parallelism.
The parameter inventory is :func:`zerokit.theory.transformer_parameters`; every preset's
count is that function's, checked against the published figure in the tests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Optional

from .. import theory
from ..theory.experts import is_expert, moe_parameters


@dataclass(frozen=True)
class ModelSpec:
    """A transformer by its shape, or a bare parameter count (``params`` alone)."""

    name: str
    params: Optional[int] = None
    layers: Optional[int] = None
    hidden: Optional[int] = None
    heads: Optional[int] = None
    ffn: Optional[int] = None
    vocab: Optional[int] = None
    seq_len: Optional[int] = None
    tied: bool = False
    kv_heads: Optional[int] = None
    head_dim: Optional[int] = None
    mlp: str = "gelu"
    norm: str = "layernorm"
    bias: bool = True
    position: str = "learned"
    cross_attention_layers: int = 0
    #: the model trains with dropout (Korthikanti's masks); LLaMA's recipe has none
    dropout: bool = True
    #: attention computed by a fused kernel (flash attention, torch's SDPA): no s×s scores are saved
    fused_attention: bool = False
    #: a mixture of experts: every layer's MLP is ``experts`` experts, each token routed to ``top_k`` of them
    experts: Optional[int] = None
    top_k: Optional[int] = None
    #: where the shape comes from
    source: str = ""

    @property
    def has_shape(self) -> bool:
        return self.layers is not None

    @cached_property
    def tensors(self) -> list:
        """Every parameter tensor (:class:`zerokit.theory.ParamTensor`); empty for a bare count."""
        if not self.has_shape:
            return []
        dense = theory.transformer_parameters(
            self.layers, self.hidden, self.heads, self.ffn, self.vocab, self.seq_len, self.tied,
            kv_heads=self.kv_heads, head_dim=self.head_dim, mlp=self.mlp, norm=self.norm, bias=self.bias,
            position=self.position, cross_attention_layers=self.cross_attention_layers)
        return moe_parameters(dense, self.experts, self.hidden) if self.moe else dense

    @property
    def moe(self) -> bool:
        """A mixture of experts (``experts`` > 1)."""
        return bool(self.experts and self.experts > 1)

    @property
    def expert_param_count(self) -> int:
        """Parameters in the experts (0 for a dense model): what expert parallelism divides by ep."""
        return sum(p.numel for p in self.tensors if is_expert(p))

    @property
    def param_count(self) -> int:
        """Ψ: the bare count, or the sum over the shape's tensors."""
        return int(self.params) if not self.has_shape else sum(p.numel for p in self.tensors)

    @property
    def q_dim(self) -> int:
        return self.heads * (self.head_dim or self.hidden // self.heads)

    @property
    def kv_dim(self) -> int:
        return (self.kv_heads or self.heads) * (self.head_dim or self.hidden // self.heads)

    def largest_module(self) -> int:
        """Parameters of the largest module (DeepSpeed's ``largest_layer_params``); 0 for a bare count."""
        sizes: dict = {}
        for p in self.tensors:
            sizes[p.module] = sizes.get(p.module, 0) + p.numel
        return max(sizes.values(), default=0)

    def describe(self) -> str:
        if not self.has_shape:
            return f"{self.name}: Ψ = {self.param_count:,} parameters (no shape: no activations, TP or PP)"
        kv = f", {self.kv_heads} KV heads" if self.kv_heads and self.kv_heads != self.heads else ""
        if self.moe:
            kv += f"; {self.experts} experts per layer, top-{self.top_k} (Ψ_experts = {self.expert_param_count:,})"
        cross = f" ({self.cross_attention_layers} with cross-attention)" if self.cross_attention_layers else ""
        return (f"{self.name}: {self.layers} layers{cross}, hidden {self.hidden}, {self.heads} heads{kv}, "
                f"FFN {self.ffn} ({self.mlp}), vocab {self.vocab}, sequence {self.seq_len}"
                f"{', tied embeddings' if self.tied else ''}; Ψ = {self.param_count:,}")


def _llama(name, layers, hidden, heads, ffn, vocab=32000, seq_len=2048, kv_heads=None, source="", **moe):
    return ModelSpec(name, layers=layers, hidden=hidden, heads=heads, ffn=ffn, vocab=vocab, seq_len=seq_len,
                     kv_heads=kv_heads, mlp="swiglu", norm="rmsnorm", bias=False, position="rotary",
                     dropout=False, source=source, **moe)


#: name -> the published shape; Ψ is computed (the tests hold each against the published count)
PRESETS = {
    "gpt2-1.5b": ModelSpec("gpt2-1.5b", layers=48, hidden=1600, heads=25, ffn=6400, vocab=50257, seq_len=1024,
                           tied=True, source="GPT-2 XL (Radford et al. 2019): 1,557,611,200 parameters"),
    "t5-3b": ModelSpec("t5-3b", layers=48, hidden=1024, heads=32, head_dim=128, ffn=16384, vocab=32128,
                       seq_len=512, tied=True, mlp="relu", norm="rmsnorm", bias=False, position="relative",
                       cross_attention_layers=24,
                       source="T5-3B (Raffel et al. 2020): 24 encoder + 24 decoder layers, 2,851,598,336 parameters"),
    "llama-7b": _llama("llama-7b", 32, 4096, 32, 11008, source="LLaMA (Touvron et al. 2023): 6,738,415,616"),
    "llama-13b": _llama("llama-13b", 40, 5120, 40, 13824, source="LLaMA: 13,015,864,320"),
    "llama-65b": _llama("llama-65b", 80, 8192, 64, 22016, source="LLaMA: 65,285,660,672"),
    "llama3-8b": _llama("llama3-8b", 32, 4096, 32, 14336, vocab=128256, seq_len=8192, kv_heads=8,
                        source="Llama 3 (Meta 2024): 8,030,261,248"),
    "llama3-70b": _llama("llama3-70b", 80, 8192, 64, 28672, vocab=128256, seq_len=8192, kv_heads=8,
                         source="Llama 3: 70,553,706,496"),
    "llama3-405b": _llama("llama3-405b", 126, 16384, 128, 53248, vocab=128256, seq_len=8192, kv_heads=8,
                          source="Llama 3 (Dubey et al. 2024, arXiv 2407.21783, Table 3): 126 layers, 16,384 wide, "
                                 "128 heads, 8 KV heads, FFN 53,248; 405,853,388,800 (the Llama 3.1 405B checkpoint); "
                                 "trained on pp = 16 with the first and last stages one layer short (§3.3.2)"),
    "gpt3-175b": ModelSpec("gpt3-175b", layers=96, hidden=12288, heads=96, ffn=4 * 12288, vocab=50257,
                           seq_len=2048, tied=True, source="GPT-3 (Brown et al. 2020): ≈ 175 B"),
}

#: mixtures of experts (the same shapes, each layer's MLP E experts with top-k routing); Ψ computed and held
#: against the published count in tests/planner/test_planner_cp_ep.py
MOE_PRESETS = {
    "mixtral-8x7b": _llama("mixtral-8x7b", 32, 4096, 32, 14336, seq_len=32768, kv_heads=8, experts=8, top_k=2,
                           source="Mixtral 8x7B (Jiang et al. 2024, arXiv 2401.04088): 8 SwiGLU experts of FFN 14336 "
                                  "per layer, top-2, 32k context; 46.7 B parameters, 12.9 B active per token"),
}


def preset(name: str) -> ModelSpec:
    """A preset by name (case and ``_`` forgiven); an unknown name is refused with the list."""
    key = name.strip().lower().replace("_", "-")
    if key in MOE_PRESETS:
        return MOE_PRESETS[key]
    if key not in PRESETS:
        raise ValueError(f"preset {name!r} is unknown; allowed: {', '.join([*PRESETS, *MOE_PRESETS])}")
    return PRESETS[key]


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive whole number")
    return int(value)


def from_params(params) -> ModelSpec:
    """A bare parameter count: ``7.5e9`` or ``"7.5e9"``."""
    try:
        value = float(params)
    except (TypeError, ValueError):
        raise ValueError(f"params={params!r} is not a number; write e.g. 7.5e9") from None
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"params={params!r} must be a positive number of parameters, e.g. 7.5e9")
    return ModelSpec(f"{value:g} parameters", params=int(round(value)), source="a bare parameter count")


def transformer(layers, hidden, heads, ffn=None, vocab=50257, seq_len=2048, tied=False, name="transformer",
                **choices) -> ModelSpec:
    """Any transformer from its shape (``ffn`` default 4·hidden); ``choices``: kv_heads, head_dim, mlp, norm,
    bias, position, cross_attention_layers, dropout, fused_attention."""
    shape = dict(layers=layers, hidden=hidden, heads=heads, ffn=4 * hidden if ffn is None else ffn, vocab=vocab,
                 seq_len=seq_len)
    shape = {k: _positive_int(k, v) for k, v in shape.items()}
    spec = ModelSpec(name, tied=bool(tied), source="shape given", **shape, **choices)
    return check(spec)


def check(spec: ModelSpec) -> ModelSpec:
    """Refuse shapes no transformer has, naming the argument."""
    if not spec.has_shape:
        return spec
    if spec.head_dim is None and spec.hidden % spec.heads:
        raise ValueError(f"hidden={spec.hidden} is not divisible by heads={spec.heads}")
    if spec.kv_heads is not None and (spec.kv_heads < 1 or spec.heads % spec.kv_heads):
        raise ValueError(f"kv_heads={spec.kv_heads} must divide heads={spec.heads}")
    if spec.top_k is not None and not spec.moe:
        raise ValueError(f"top_k={spec.top_k}: a dense model routes nothing; give experts (E > 1) too")
    if spec.experts is not None:
        if isinstance(spec.experts, bool) or not isinstance(spec.experts, int) or spec.experts < 1:
            raise ValueError(f"experts={spec.experts!r} must be a positive whole number (1: a dense MLP)")
        if spec.moe and (spec.top_k is None or not 1 <= spec.top_k <= spec.experts):
            raise ValueError(f"top_k={spec.top_k!r} must be between 1 and experts={spec.experts} (the experts each "
                             f"token is routed to)")
    if not 0 <= spec.cross_attention_layers <= spec.layers:
        raise ValueError(f"cross_attention_layers={spec.cross_attention_layers} must be between 0 and "
                         f"layers={spec.layers}")
    for name, allowed in (("mlp", theory.MLPS), ("norm", theory.NORMS), ("position", theory.POSITIONS)):
        if getattr(spec, name) not in allowed:
            raise ValueError(f"{name}={getattr(spec, name)!r}; allowed: {', '.join(allowed)}")
    return spec


def tiny_gpt_spec(vocab: int = 512, seq_len: int = 64, d_model: int = 128, n_layer: int = 4, n_head: int = 4,
                  tie_weights: bool = False, n_experts: int = 0, top_k: int = 1) -> ModelSpec:
    """The shape of :func:`zerokit.tiny_gpt` with the same arguments (its defaults too).

    Its blocks have no dropout and call ``F.scaled_dot_product_attention`` (fused: no s×s
    scores are saved), so the planner counts activations accordingly — but under context parallelism
    with Ulysses zerokit computes each rank's heads unfused (the softmax saved): plan that with
    ``fused_attention=False``. ``n_experts`` > 0: its
    MoE MLP (:mod:`zerokit.expert_parallel`), E experts of the same MLP and a router, top-``top_k``.
    """
    moe = dict(experts=n_experts, top_k=top_k) if n_experts and n_experts > 1 else {}
    spec = transformer(n_layer, d_model, n_head, 4 * d_model, vocab, seq_len, tie_weights,
                       name=f"tiny-gpt-{n_layer}x{d_model}" + ("-tied" if tie_weights else "")
                       + (f"-{n_experts}e-top{top_k}" if moe else ""),
                       dropout=False, fused_attention=True, **moe)
    return replace(spec, source="zerokit.tiny_gpt")


def resolve(model=None, params=None, preset_name=None, **shape) -> ModelSpec:
    """One ModelSpec from exactly one of: a ModelSpec or preset name (``model``), ``params``, or a shape."""
    given = [x for x in (model, params, preset_name) if x is not None] + ([shape] if shape else [])
    if len(given) != 1:
        raise ValueError("name the model once: a preset (e.g. preset='llama-7b'), a bare count (params=7.5e9) or "
                         f"a shape (layers, hidden, heads, …); allowed presets: "
                         f"{', '.join([*PRESETS, *MOE_PRESETS])}")
    if isinstance(model, ModelSpec):
        return check(model)
    if isinstance(model, str) or preset_name is not None:
        return preset(model if isinstance(model, str) else preset_name)
    if model is not None:
        return from_params(model)
    if params is not None:
        return from_params(params)
    missing = [k for k in ("layers", "hidden", "heads") if shape.get(k) is None]
    if missing:
        raise ValueError(f"a transformer shape needs {', '.join(missing)} (and optionally ffn, vocab, seq_len, tied)")
    return transformer(**{k: v for k, v in shape.items() if v is not None})
