"""``zerokit.plan(...)``: what a model needs per GPU on a cluster under a layout, and what it sends.

It resolves the model (:mod:`.models`), the cluster (:mod:`.cluster`) and the layout
(:mod:`.layout`, or a DeepSpeed config), computes every pipeline stage's memory
(:mod:`.memory`) and answers for the fullest stage: model states by category,
activations, buffers, total, whether it fits; its traffic per step by axis and collective
with an estimated time on the links (:mod:`.traffic`), the pipeline bubble, and the step's
estimated time and MFU (:mod:`.step_time`). Every number is a :class:`~.memory.Term` or a
:class:`~.traffic.Transfer` carrying its formula.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from ..theory import systems
from . import layout as layouts, memory as mem, step_time as step_estimate, traffic
from .advisor import advise
from .cluster import Cluster
from .conventions import convention as get_convention, DIFFERENCE
from .models import check as check_spec, resolve
from .render import render


@dataclass
class Plan:
    model: object
    cluster: Cluster
    layout: layouts.Layout
    convention: object
    memory: mem.StageMemory
    stages: list
    transfers: list
    host_bytes_per_node: float
    host_formula: str
    notes: list = field(default_factory=list)
    #: the advisor may try other dp/tp/pp degrees (the caller did not fix them)
    explore_parallel: bool = False
    #: :func:`.step_time.estimate`'s options: gpu_peak, compute_fraction, overlap, virtual_stages
    step_time_options: dict = field(default_factory=dict)

    @property
    def total_bytes(self) -> float:
        return self.memory.total

    @property
    def fits(self) -> bool:
        host_ok = self.cluster.host_memory is None or self.host_bytes_per_node <= self.cluster.host_memory
        return self.memory.total <= self.cluster.gpu_memory and host_ok

    @property
    def comm_bytes_per_step(self) -> dict:
        return traffic.by_axis(self.transfers)

    @property
    def comm_bytes_by_link(self) -> dict:
        """Bytes one GPU sends per step on each link: ``{"intra-node": …, "inter-node": …, "host (PCIe)": …}``."""
        return traffic.by_link(self.transfers)

    @property
    def bytes_leaving_node(self) -> float:
        """Bytes that leave each node per step (:func:`zerokit.theory.ring_bytes_leaving_a_node`, summed)."""
        return sum(t.leaving_node for t in self.transfers)

    @property
    def comm_seconds(self) -> float:
        """Estimated seconds per step on the links, every transfer one after another (no overlap)."""
        return sum(t.seconds for t in self.transfers)

    @property
    def bubble(self) -> dict:
        return traffic.bubble(self.layout)

    @property
    def step_time(self):
        """The step's estimated time, term by term (:class:`.step_time.StepTimeEstimate`); None without a shape."""
        if not self.model.has_shape:
            return None
        return step_estimate.estimate(self, **self.step_time_options)

    def per_gpu(self) -> dict:
        s = self.memory.model_states
        return {"pipeline_stage": self.memory.stage, "params_on_rank": self.memory.psi_rank,
                "model_state_bytes": {"params": s.params, "grads": s.grads, "optimizer": s.optimizer,
                                      "total": s.total},
                "activation_bytes": self.memory.activations, "buffer_bytes": self.memory.buffers,
                "total_bytes": self.memory.total, "gpu_memory_bytes": self.cluster.gpu_memory, "fits": self.fits,
                "host_bytes_per_node": self.host_bytes_per_node,
                "comm_bytes_per_step": self.comm_bytes_per_step,
                "comm_bytes_per_step_by_link": self.comm_bytes_by_link,
                "bytes_leaving_each_node_per_step": self.bytes_leaving_node,
                "comm_seconds_per_step_estimate": self.comm_seconds}

    def to_dict(self, advice: bool = True) -> dict:
        model = {k: v for k, v in asdict(self.model).items() if v is not None}
        model["param_count"] = self.model.param_count
        out = {"model": model,
               "cluster": asdict(self.cluster) | {"nodes": self.cluster.nodes,
                                                  "assumptions": list(self.cluster.assumptions)},
               "layout": asdict(self.layout) | {"stage": self.layout.stage, "sequence_parallel": self.layout.sp},
               "convention": self.convention.name, "unit": self.convention.unit_name,
               "per_gpu": self.per_gpu(),
               "terms": [t.as_dict() for t in self.memory.terms],
               "traffic": [t.as_dict() for t in self.transfers],
               "pipeline_bubble": self.bubble,
               "step_time_estimate": None if self.step_time is None else self.step_time.as_dict(),
               "stages_total_bytes": [s.total for s in self.stages],
               "notes": list(self.notes), "convention_difference": DIFFERENCE}
        if advice:
            out["advisor"] = self.advise().to_dict()
        return out

    def advise(self, explore: bool | None = None):
        return advise(self, explore=explore)

    def with_layout(self, layout: layouts.Layout) -> "Plan":
        """The same model, cluster and convention under another layout (the advisor's candidates)."""
        out = build(self.model, self.cluster, layout, self.convention)
        out.step_time_options = dict(self.step_time_options)
        return out

    def table(self, advice: bool = True) -> str:
        return render(self, advice=advice)

    def __str__(self) -> str:
        return self.table(advice=False)


def build(model, cluster: Cluster, layout: layouts.Layout, convention, notes=()) -> Plan:
    """The plan for a resolved model, cluster and layout (the layout is checked here)."""
    layout = layouts.check(layout, model, cluster)
    if convention.name == "deepspeed" and (layout.precision != "bf16-mixed" or layout.optimizer != "adamw"):
        raise ValueError("convention=deepspeed: DeepSpeed's estimators assume 16-bit training with Adam; use "
                         "precision bf16-mixed and optimizer adamw, or convention paper")
    stages = [mem.stage_memory(model, layout, convention, i) for i in range(layout.pp)]
    worst = max(stages, key=lambda s: s.total)
    host, host_formula = mem.host_bytes_per_node(model, layout, cluster, convention, worst)
    notes = list(notes) + list(layout.notes)
    if layout.pp > 1 and layout.stage >= 2:
        notes.append("DeepSpeed refuses ZeRO-2 and ZeRO-3 with pipeline parallelism (pipeline + ZeRO-1 is the "
                     "combination); these figures are what it would take")
    if layout.pp > 1 and model.tied:
        notes.append("tied embeddings with pp > 1: the all-reduce of the embedding's gradient between the first "
                     "and last stage is not counted")
    if model.cross_attention_layers:
        notes.append("encoder-decoder: the encoder and decoder sequences are both taken as seq_len; the encoder "
                     "output each cross-attention reads is not counted")
    if layout.ep > 1:
        notes.append(f"ep = {layout.ep}: the all-to-all bytes assume uniform routing (each of a token's {model.top_k} "
                     f"slots equally likely on every rank, dropless); a router that favours some experts sends "
                     f"more to their ranks, and the busiest rank sets the step's time")
    if layout.cp > 1:
        notes.append(f"cp = {layout.cp} ({layout.cp_attention}): every sequence is cut into 2·cp zig-zag chunks, "
                     f"so causal work is balanced; the weights' gradients are reduced over dp × cp "
                     f"= {layout.dp * layout.cp} ranks")
    transfers = traffic.transfers(model, layout, cluster, worst)
    if any(t.link == "inter-node" and t.leaving_node < cluster.gpus_in_a_node * t.bytes for t in transfers):
        notes.append("a ring whose ranks share a node and span nodes is estimated at one GPU's inter-node link for "
                     "all its bytes (one rail); NCCL spreads a ring's channels over the node's network cards, which "
                     "can make it up to gpus_per_node times quicker than this estimate. The bytes that leave each "
                     "node do not depend on that: compare layouts by them too")
    if layout.offload != "none":
        notes.append("offload: CPU Adam's speed decides whether the step keeps up (users report 10-50× slower "
                     "steps when it is not vectorised); not in the time estimate")
    return Plan(model, cluster, layout, convention, worst, stages, transfers, host, host_formula, notes)


def parse_memory(value, convention) -> float:
    """Bytes from 80e9, "80GB", "80GiB", or a bare "80" in the convention's unit (GB or GiB)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"gpu_memory={value!r} must be positive")
        return float(value)
    text = str(value).strip()
    for suffix, scale in (("gib", 2**30), ("gb", 1e9), ("tib", 2**40), ("tb", 1e12)):
        if text.lower().endswith(suffix):
            number, unit = text[:-len(suffix)], scale
            break
    else:
        number, unit = text, convention.unit_bytes
    try:
        amount = float(number)
    except ValueError:
        raise ValueError(f"gpu_memory={value!r}: write a size such as 80, 80GB or 80GiB") from None
    if not amount > 0:
        raise ValueError(f"gpu_memory={value!r} must be positive")
    return amount * unit


def plan(model=None, *, params=None, preset=None, layers=None, hidden=None, heads=None, ffn=None, vocab=None,
         seq_len=None, tied=None, gpus: int = 8, gpu_memory=None, gpus_per_node=None, system=None, strategy=None,
         offload=None, parallel=None, micro_batch_size=None, micro_batches=None, checkpointing="none",
         precision=None, optimizer=None, convention: str = "paper", deepspeed_config=None,
         sequence_parallel=None, schedule: str = "1f1b", fused_attention=None, sequence_parallel_regather=True,
         shard_group=None, cp=None, ep=None, cp_attention=None, experts=None, top_k=None, gpu_peak=None,
         compute_fraction=None, overlap=None, virtual_stages=None, stage_layers=None, first_stage_layers=None,
         last_stage_layers=None, **links) -> Plan:
    """What ``model`` needs per GPU, and sends per step, on ``gpus`` GPUs under a layout.

    The model: a preset name or :class:`~.models.ModelSpec` (``model``), ``params=7.5e9``,
    ``preset="llama-7b"``, or a shape (``layers``, ``hidden``, ``heads``, ``ffn``, ``vocab``,
    ``seq_len``, ``tied``). The layout: ``strategy`` (ddp, zero1-3, hsdp, hpz; default ddp), ``offload``
    (none, optimizer, params), ``parallel`` ({"dp", "tp", "pp"} or "dp=8,tp=2"),
    ``micro_batch_size``, ``micro_batches``, ``checkpointing`` (none, full, sqrt, every-K),
    ``precision`` (bf16-mixed default, as the paper), or ``deepspeed_config`` (a dict or JSON
    path) for the stage, buckets, offload, batch and precision. ``links``: any other
    :class:`~.cluster.Cluster` field (intra_bandwidth, inter_latency, host_memory, …).
    ``system``: a named system of :mod:`zerokit.theory.systems` (``"dgx-h100"``) or its GPU (``"h100"``) —
    its memory, GPUs per node, links and peak together (default ``"dgx-a100"``); ``gpu_memory``,
    ``gpus_per_node``, the ``links`` and ``gpu_peak`` override its figures one by one. Bandwidths are
    bytes per second (``intra_bandwidth=450e9``; under 1 MB/s is refused as GB/s given as bytes).
    ``convention``: "paper" or "deepspeed" (see :mod:`.conventions`). ``fused_attention``
    overrides the model's (True: flash attention, no s×s scores saved);
    ``sequence_parallel_regather=False`` counts a column-parallel layer's gathered input as
    saved whole (what zerokit's tiny GPT plan does today; Megatron re-gathers it).
    ``shard_group`` (hsdp, hpz): the data-parallel ranks a parameter (hsdp) or the secondary
    copy (hpz) is sharded over; default the data-parallel ranks of one node.
    ``cp`` (or ``parallel`` "cp=…"): context parallelism, each sequence cut over cp ranks, attention by
    ``cp_attention`` "ring" (default) or "ulysses"; ``ep``: expert parallelism over ep of the dp ranks, for a model
    with experts (a preset such as "mixtral-8x7b", or ``experts=E, top_k=k`` on a shape or preset).
    Uneven pipeline stages (default: L/pp layers each, pp dividing L): ``stage_layers`` (every stage's
    count, e.g. ``[7] + [8] * 14 + [7]``, torchtitan's split points as counts), or ``first_stage_layers``
    and/or ``last_stage_layers`` with the rest shared evenly by the stages between (Megatron's
    ``--decoder-first-pipeline-num-layers``/``--decoder-last-pipeline-num-layers``); the fullest stage
    is reported and the busiest sets the step's pace.
    The step-time estimate (:mod:`.step_time`): ``gpu_peak`` (default the system's GPU; a100, h100, … or FLOP/s),
    ``compute_fraction`` (share of peak while computing, default
    :data:`zerokit.theory.step_time.DEFAULT_COMPUTE_FRACTION`), ``overlap`` (dp default, or none),
    ``virtual_stages`` (v of an interleaved pipeline schedule, default 1).
    """
    conv = get_convention(convention)
    spec = resolve(model, params, preset, **{k: v for k, v in dict(
        layers=layers, hidden=hidden, heads=heads, ffn=ffn, vocab=vocab, seq_len=seq_len, tied=tied).items()
        if v is not None})
    if fused_attention is not None:
        spec = replace(spec, fused_attention=bool(fused_attention))
    if experts is not None or top_k is not None:
        if not spec.has_shape:
            raise ValueError(f"experts={experts!r}: a bare parameter count has no MLPs to turn into experts; give a "
                             f"preset or a shape")
        moe = dict(experts=spec.experts if experts is None else experts,
                   top_k=(spec.top_k or 1) if top_k is None else top_k)
        spec = check_spec(replace(spec, **moe, name=f"{spec.name} ({moe['experts']} experts, top-{moe['top_k']})"))
    unknown = sorted(set(links) - set(Cluster.__dataclass_fields__) | set(links) & {"gpus", "gpu_memory",
                                                                                     "gpus_per_node"})
    if unknown:
        raise ValueError(f"plan() got an unknown argument {unknown[0]!r}; cluster fields: "
                         f"{', '.join(Cluster.__dataclass_fields__)}")
    cluster = Cluster.of(systems.DEFAULT_SYSTEM if system is None else system, gpus=gpus,
                         gpu_memory=None if gpu_memory is None else parse_memory(gpu_memory, conv),
                         gpus_per_node=gpus_per_node, **links)
    if gpu_peak is None:  # the system's GPU
        gpu_peak = cluster.spec.gpu.peak_flops
    base = layouts.Layout(schedule=schedule, sequence_parallel=sequence_parallel,
                          sequence_parallel_regather=bool(sequence_parallel_regather))
    given = {k: v for k, v in dict(strategy=strategy, offload=offload, micro_batch_size=micro_batch_size,
                                   micro_batches=micro_batches, precision=precision, optimizer=optimizer,
                                   shard_group=shard_group, cp=cp, ep=ep, cp_attention=cp_attention,
                                   stage_layers=None if stage_layers is None else tuple(stage_layers),
                                   first_stage_layers=first_stage_layers,
                                   last_stage_layers=last_stage_layers).items()
             if v is not None}
    if deepspeed_config is not None:
        from_config = layouts.from_deepspeed_config(deepspeed_config)
        for name, value in given.items():
            if name in from_config and from_config[name] != value:
                raise ValueError(f"{name}={value!r} contradicts the DeepSpeed config, which sets "
                                 f"{from_config[name]!r}")
        base = replace(base, **from_config)
    base = replace(base, **given)
    if parallel is not None:
        degrees = layouts.parse_parallel_text(parallel) if isinstance(parallel, str) else dict(parallel)
        unknown_axes = sorted(set(degrees) - set(layouts.PARALLEL_AXES))
        if unknown_axes:
            raise ValueError(f"parallel: unknown axis {unknown_axes[0]!r}; allowed: {', '.join(layouts.PARALLEL_AXES)}")
        for axis in ("cp", "ep"):
            if axis in degrees and axis in given and degrees[axis] != given[axis]:
                raise ValueError(f"{axis}={given[axis]!r} contradicts parallel, which sets {axis}={degrees[axis]!r}")
        base = replace(base, **degrees)
    policy, k = layouts.parse_checkpointing(checkpointing)
    base = replace(base, checkpointing=policy, segment_layers=k)
    result = build(spec, cluster, base, conv)
    result.explore_parallel = parallel is None and cp is None and ep is None and spec.has_shape
    result.step_time_options = {k: v for k, v in dict(gpu_peak=gpu_peak, compute_fraction=compute_fraction,
                                                      overlap=overlap, virtual_stages=virtual_stages).items()
                                if v is not None}
    if result.model.has_shape:  # bad options are refused here, naming the argument
        step_estimate.estimate(result, **result.step_time_options)
    else:
        step_estimate.check_options(**result.step_time_options)
    return result
