"""Bytes one GPU holds: model states by category, activations, buffers — each a labelled term.

For pipeline stage i of a model split over ``pp`` stages and ``tp`` tensor-parallel ranks,
a rank holds the stage's tensors (layers i·L/p … (i+1)·L/p − 1, or the stage's share of uneven
stages, :func:`.layout.stage_layer_counts`; the embeddings on the
first stage, the final norm and the head on the last, and with tied embeddings a copy of
the embedding there too when p > 1), each split tensor ⌈numel/t⌉ elements and the rest
whole (Megatron 1909.08053 §3). ZeRO then shards those Ψ_rank elements over dp:

- model states: :func:`zerokit.theory.model_state_bytes` on Ψ_rank with the flat units
  zerokit would form (``paper``), or :func:`~zerokit.theory.deepspeed_model_state_bytes`
  (``deepspeed``); with offload, :func:`~zerokit.theory.offload_model_state_bytes`;
- activations: :func:`~zerokit.theory.transformer_layer_activation_bytes` per layer
  (Korthikanti et al. §4, with TP and sequence parallelism), under the checkpointing policy
  (:func:`~zerokit.theory.checkpointed_activation_bytes`) and times the micro-batches a
  1F1B / GPipe stage stashes (:func:`~zerokit.theory.peak_stashed_microbatches`);
- buffers: DDP's buckets, ZeRO's gradient buckets, ZeRO-3's gathered unit and prefetch.

With context parallelism (``cp``) a rank holds s/cp tokens of every sequence: the activations
are :func:`zerokit.theory.context.cp_layer_activation_bytes` (÷ cp, but for the scores'
rows, which span every key). With expert parallelism (``ep``) a rank holds E/ep of every MoE
layer's experts: Ψ_rank = Ψ_dense + Ψ_experts/ep; ZeRO shards the dense part over dp and the
experts over the dp/ep ranks that hold the same experts (DeepSpeed-MoE §4, Megatron's expert
data parallelism). A MoE layer's activations add :func:`zerokit.theory.experts.moe_extra_activation_bytes`
(dropless, uniform routing).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import theory
from ..theory import context as cp_theory
from ..theory import experts as ep_theory
from . import state_variants  # offload, hierarchical sharding, experts: their own groups and terms
from .layout import stage_layer_counts, stage_layer_range
from .terms import Term, split_experts, theory_term, units_of  # noqa: F401 - read from here too


@dataclass
class StageMemory:
    """What a rank of pipeline stage ``stage`` holds."""

    stage: int
    psi_rank: int
    model_states: theory.ModelStates
    activations: float
    buffers: float
    host_bytes_per_gpu: float
    terms: list = field(default_factory=list)
    #: sizes the dp traffic and the advisor need
    units: list | None = None
    largest_unit: int = 0
    #: expert parallelism: this rank's expert elements (in ``psi_rank``) and their units (``units``: the dense ones)
    expert_psi: int = 0
    expert_units: list | None = None

    @property
    def total(self) -> float:
        return self.model_states.total + self.activations + self.buffers


def stage_tensors(model, layout, i: int) -> list:
    """The parameter tensors pipeline stage i of a checked ``layout`` holds (all of them when pp = 1)."""
    pp = layout.pp
    if pp == 1:
        return list(model.tensors)
    layers = stage_layer_range(stage_layer_counts(layout, model.layers), i)
    first, last = i == 0, i == pp - 1
    out = []
    for p in model.tensors:
        if p.layer is not None:
            if p.layer in layers:
                out.append(p)
        elif p.module in ("tok", "pos") or p.module.startswith("relative_bias"):
            if first:
                out.append(p)
            if last and p.module == "tok" and model.tied:  # Megatron keeps a copy as the head on the last stage
                out.append(theory.ParamTensor("head.weight", p.numel, "head", None, True))
        elif last:
            out.append(p)
    return out


def rank_sizes(tensors: list, t: int) -> list:
    """(elements on one TP rank, tensor) per tensor: split ones ⌈numel/t⌉, the others whole."""
    return [(-(-p.numel // t) if p.tp_sharded else p.numel, p) for p in tensors]


def model_state_terms(psi: int, sizes: list, layout, dp: int, convention, largest_module: int) -> tuple:
    """(device ModelStates, host bytes per GPU, terms, units) for Ψ_rank = ``psi`` over ``dp`` ranks."""
    stage, n = layout.stage, dp
    known = bool(sizes)
    if layout.offload != "none":
        return state_variants.offload_terms(psi, layout, n, convention, largest_module)
    if layout.hierarchical:
        return state_variants.hierarchical_terms(psi, sizes, layout, n, convention, largest_module)
    if layout.ep > 1 and layout.stage > 0:
        return state_variants.expert_terms(sizes, layout, n, convention, largest_module)
    if convention.name == "deepspeed":
        states = theory.deepspeed_model_state_bytes(stage, psi, n, largest_module)
        formulas = {0: ("2Ψ", "6Ψ (16-bit + fp32)", "12Ψ"), 1: ("2Ψ", "2Ψ + 4Ψ/N", "12Ψ/N"),
                    2: ("2Ψ", "6Ψ/N", "12Ψ/N"), 3: ("4·L (largest layer)", "6Ψ/N", "12Ψ/N")}[stage]
        note = "DeepSpeed has no estimator for this stage: its convention extended" if stage < 2 else \
            "DeepSpeed's estimator"
        terms = [theory_term("params", f"params (DeepSpeed convention, stage {stage})", states.params, formulas[0],
                             note),
                 theory_term("grads", "grads", states.grads, formulas[1], note),
                 theory_term("optimizer", "optimizer states", states.optimizer, formulas[2], note)]
        return states, 0.0, terms, None
    units, persistent, tensors = units_of(sizes, layout) if known else (None, 0, 0)
    steps = tensors if known and layout.optimizer == "adamw" else 0
    states = theory.model_state_bytes(stage, psi, n, layout.precision, layout.optimizer, units=units,
                                      optimizer_tensors=steps, persistent_numel=persistent)
    b = theory.param_bytes_per_element(layout.precision)
    k = theory.optimizer_bytes_per_element(layout.precision, layout.optimizer)
    shard = {0: ("Ψ", "Ψ", "Ψ"), 1: ("Ψ", "Ψ", "Ψ/N"), 2: ("Ψ", "Ψ/N", "Ψ/N"),
             3: ("Ψ/N", "Ψ/N", "Ψ/N")}[stage]
    pad = "flat units padded to a multiple of N" if units else "no padding (one buffer)"
    step_note = (f"+ 4 B × {steps} Adam step scalars (one per stepped tensor)" if steps
                 else "Adam's step scalars not counted (tensors unknown)" if layout.optimizer == "adamw" else "")
    terms = [theory_term("params", "params", states.params, f"{b}·{shard[0]}", f"{layout.precision}; {pad}"),
             theory_term("grads", "grads", states.grads, f"{b}·{shard[1]}", layout.precision),
             theory_term("optimizer", "optimizer states", states.optimizer, f"K·{shard[2]}, K = {k}",
                         f"{layout.optimizer}{' with an fp32 master copy' if layout.precision != 'fp32' else ''}; "
                         f"{step_note}")]
    return states, 0.0, terms, units


def activation_terms(model, layout, stage: int, element_bytes: int) -> tuple:
    """(bytes, terms) of the activations one rank of ``stage`` holds at its peak."""
    if not model.has_shape:
        return 0.0, [Term("activations", "activations", 0.0, "not counted", "a bare parameter count has no shape; "
                                                                              "give a preset or a shape")]
    whole, b, h, a, t, cp = model.seq_len, layout.micro_batch_size, model.hidden, model.heads, layout.tp, layout.cp
    s = whole // cp  # this rank's tokens of each sequence
    layers = stage_layer_range(stage_layer_counts(layout, model.layers), stage)
    first_cross = model.layers - model.cross_attention_layers
    common = dict(t=t, sequence_parallel=layout.sp, ffn=model.ffn, q_dim=model.q_dim, kv_dim=model.kv_dim,
                  element_bytes=element_bytes, dropout=model.dropout, fused_attention=model.fused_attention,
                  mlp=model.mlp, regather=layout.sequence_parallel_regather)
    if cp > 1:
        per_layer = [cp_theory.cp_layer_activation_bytes(whole, b, h, a, cp, layout.cp_attention,
                                                         cross_attention=i >= first_cross, **common) for i in layers]
    else:
        per_layer = [theory.transformer_layer_activation_bytes(s, b, h, a, cross_attention=i >= first_cross,
                                                               **common) for i in layers]
    moe = 0.0
    if model.moe:
        moe = ep_theory.moe_extra_activation_bytes(s, b, h, model.ffn, model.experts, model.top_k, t, element_bytes,
                                                   model.mlp, layout.ep)
        per_layer = [x + moe for x in per_layer]
    mean_layer = sum(per_layer) / len(per_layer)
    boundary = element_bytes * s * b * h / (t if layout.sp else 1)
    p, m = layout.pp, layout.micro_batches
    in_flight = theory.peak_stashed_microbatches(layout.schedule, p, m, stage) if p > 1 else 1
    stored = theory.checkpointed_activation_bytes(len(per_layer), mean_layer, boundary, layout.checkpointing,
                                                  layout.segment_layers, in_flight)
    korthikanti = "s·b·h·(34 + 5·a·s/h)" if t == 1 else (
        "s·b·h·(34/t + 5·a·s/(h·t))" if layout.sp else "s·b·h·(10 + 24/t + 5·a·s/(h·t))")
    kinds = [("no dropout" if not model.dropout else "dropout masks"),
             *(["sequence parallel: gathered linear inputs saved whole"] if layout.sp and
               not layout.sequence_parallel_regather else []),
             ("fused attention: fp32 log-sum-exp, no s×s scores" if model.fused_attention else "s×s scores saved"),
             *([f"cp = {cp}: s/cp = {s} tokens per rank ({layout.cp_attention}"
                + (": + the fp32 output accumulator, 4·q per token" if layout.cp_attention == "ring" and element_bytes != 4
                   else "")
                + ("; score rows span all s keys" if not model.fused_attention else "") + ")"] if cp > 1 else []),
             *([f"MoE: top-{model.top_k} of {model.experts}, the MLP's inputs × k, router probabilities and gated "
                f"outputs (+{moe:,.0f} B per layer; dropless, uniform routing)"] if model.moe else []),
             f"{model.mlp} MLP of {model.ffn}", f"{element_bytes}-byte activations"]
    policy = {"none": "n·A, every layer's activations", "full": "n·X + A: each layer's input, one layer recomputed",
              "every-k": f"⌈n/k⌉·X + k·A, k = {layout.segment_layers}: segment inputs, one segment recomputed",
              "sqrt": "⌈n/k⌉·X + k·A, k ≈ √n: segment inputs, one segment recomputed"}[layout.checkpointing]
    terms = [Term("activations", f"{len(per_layer)} layers, checkpointing {layout.checkpointing}", stored,
                  f"{policy}; A = {korthikanti} per layer (Korthikanti §4, term by term) = {mean_layer:,.0f} B, "
                  f"X = {boundary:,.0f} B; × {in_flight} micro-batch(es) in flight",
                  "; ".join(kinds) + (f"; {layout.schedule} stage {stage} stashes {in_flight}" if p > 1 else ""))]
    total = stored
    if stage == 0 and model.dropout:
        emb = in_flight * theory.embedding_activation_bytes(s, b, h, t, layout.sp, model.dropout)
        terms.append(Term("activations", "embedding dropout mask", emb, "s·b·h (1 byte each)", "Korthikanti §4.3"))
        total += emb
    if stage == p - 1:
        out = in_flight * theory.output_activation_bytes(s, b, h, model.vocab, t, layout.sp, element_bytes)
        terms.append(Term("activations", "final norm, head input and fp32 logits", out, "2·e·s·b·h + 4·s·b·v/t",
                          "cross-entropy keeps fp32 log-probabilities of the whole vocabulary"))
        total += out
    return total, terms


def buffer_terms(layout, psi: int, units, largest_unit: int, convention) -> tuple:
    """(bytes, terms) of what the strategy allocates beyond model states at the peak (backward)."""
    b = theory.param_bytes_per_element(layout.precision)
    terms = []
    if layout.stage == 0:
        terms.append(Term("buffers", "DDP buckets", b * psi, "b·Ψ",
                          "torch DDP's buckets are a second copy of every gradient (gradient_as_bucket_view=False, "
                          "its default)"))
    else:
        copies = 2 if layout.overlap else 1
        bucket = min(layout.reduce_bucket_size, psi)
        terms.append(Term("buffers", "gradient bucket(s)", copies * b * bucket,
                          f"{copies} × b·min(reduce_bucket_size, Ψ)",
                          f"reduce_bucket_size = {layout.reduce_bucket_size:,} elements; two with overlap_comm"))
    if layout.stage == 3 and convention.name == "paper":
        terms.append(Term("buffers", "gathered unit", b * largest_unit, "b·(largest unit)",
                          "block units: one transformer layer, or the root (embeddings, final norm, head)"
                          if largest_unit else "unknown: a bare parameter count has no units; counted as 0"))
        if layout.prefetch:
            ahead = min(layout.prefetch_bucket_size, largest_unit)
            terms.append(Term("buffers", "prefetched unit", b * ahead, "b·min(prefetch_bucket_size, unit)",
                              "the next unit gathered while this one computes"))
    return sum(term.bytes for term in terms), terms


def expert_share(tensors: list, experts: int, ep: int) -> list:
    """The tensors an ep rank holds: the dense ones and E/ep experts of every MoE layer (the first rank's share:
    every rank's is the same size)."""
    if ep <= 1:
        return tensors
    per = experts // ep
    return [p for p in tensors if not ep_theory.is_expert(p) or int(p.module.split(".mlp.experts.")[1].split(".")[0])
            < per]


def stage_memory(model, layout, convention, stage: int) -> StageMemory:
    """Everything one rank of pipeline stage ``stage`` holds, with its terms."""
    if model.has_shape:
        sizes = rank_sizes(expert_share(stage_tensors(model, layout, stage), model.experts or 1, layout.ep),
                           layout.tp)
        psi = sum(n for n, _ in sizes)
        modules: dict = {}
        for n, p in sizes:
            modules[p.module] = modules.get(p.module, 0) + n
        largest_module = max(modules.values(), default=0)
    else:
        sizes, psi, largest_module = [], model.param_count, 0
    # ZeRO shards over the ranks that reduce the gradients: dp, or dp × cp with context parallelism
    states, host, terms, units = model_state_terms(psi, sizes, layout, layout.dp * layout.cp, convention,
                                                   largest_module)
    expert_psi, expert_units = 0, None
    if layout.ep > 1:
        dense, experts = split_experts(sizes)
        expert_psi = sum(n for n, _ in experts)
        if layout.stage > 0:
            units, expert_units = units if units else (units_of(dense, layout)[0], units_of(experts, layout)[0])
    if layout.stage == 3 and not units and sizes:
        units = units_of(sizes, layout)[0]
    every_unit = (units or []) + (expert_units or [])
    largest_unit = max(every_unit) if every_unit and sizes else 0  # a bare count has no units to gather
    e = theory.param_bytes_per_element(layout.precision)
    acts, act_terms = activation_terms(model, layout, stage, e)
    bufs, buf_terms = buffer_terms(layout, psi, every_unit or None, largest_unit, convention)
    return StageMemory(stage, psi, states, acts, bufs, host, terms + act_terms + buf_terms, units, largest_unit,
                       expert_psi, expert_units)


def host_bytes_per_node(model, layout, cluster, convention, memory: StageMemory) -> tuple:
    """(bytes of host memory per node, formula): the offloaded states of the node's GPUs, or DeepSpeed's figure."""
    if convention.name == "deepspeed" and layout.stage >= 1:
        psi = memory.psi_rank * layout.tp * layout.pp
        offload = layout.offload != "none"
        if layout.stage == 3:
            largest = model.largest_module()
            host = theory.deepspeed_zero3_estimate(psi, largest, cluster.gpus_in_a_node, cluster.nodes, offload,
                                                   layout.offload == "params")[0]
            return float(host), "DeepSpeed's ZeRO-3 estimator, × 1.5 buffer factor"
        host = theory.deepspeed_zero2_estimate(psi, cluster.gpus_in_a_node, cluster.nodes, offload)[0]
        return float(host), "DeepSpeed's ZeRO-2 estimator, × 1.5 buffer factor" + (
            " (it has none for ZeRO-1)" if layout.stage == 1 else "")
    return memory.host_bytes_per_gpu * cluster.gpus_in_a_node, "offloaded states × GPUs per node"
