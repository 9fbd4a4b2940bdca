"""The layout: strategy, offload, the dp × tp × pp mesh, micro-batches, checkpointing, precision.

:class:`Layout` holds what a training job decides about parallelism and memory, checked
against the model and the cluster before anything is computed (:func:`check`): degrees
must multiply to the GPU count, tp must divide the heads; offload needs ZeRO (parameters:
stage 3) and 16-bit training. The pipeline's stages hold L/pp layers each, pp dividing the
layers, unless they are given unevenly (:func:`stage_layer_counts`): every stage's count
(``stage_layers``, torchtitan's split points as counts), or the first and last stages' with the
rest shared evenly by the stages between (``first_stage_layers``/``last_stage_layers``,
Megatron's ``--decoder-first-pipeline-num-layers``/``--decoder-last-pipeline-num-layers``) —
Llama 3 405B trains 126 layers on pp = 16 as 7, 8 × 14, 7: the first and last stages, which
hold the embedding and the head, one layer short (Dubey et al. 2024, §3.3.2). ``hsdp`` and ``hpz`` are the hierarchical
layouts (:mod:`zerokit.theory.hierarchical`): ZeRO-3 inside a shard group of
``shard_group`` data-parallel ranks, replicated across groups (FSDP2's 2-D mesh, DeepSpeed's
MiCS), and ZeRO-3 over every rank with a secondary parameter copy sharded over the group
(ZeRO++'s hpZ); the group defaults to the data-parallel ranks of one node. ``cp`` cuts every
sequence over cp ranks (context parallelism: ring attention or Ulysses, ``cp_attention``; the
world is dp × cp × tp × pp and the gradients are reduced over dp × cp); ``ep`` spreads a mixture
of experts' experts over ep of the data-parallel ranks (it divides dp and the experts). :func:`from_deepspeed_config` reads a
DeepSpeed config with :func:`zerokit.zero.config.from_deepspeed` for its
``zero_optimization`` section and takes the batch, precision and offload keys itself.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .. import theory
from ..pipeline_parallel.partition import first_last_counts
from ..runtime.mesh import parse_parallel
from ..theory import context as cp_theory
from ..zero.config import from_deepspeed, load_deepspeed_config, NOT_IMPLEMENTED

#: the flat data-parallel strategies (one group of every dp rank)
STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
#: hierarchical sharding: groups inside nodes (HSDP, ZeRO++'s hpZ)
HIERARCHICAL = ("hsdp", "hpz")
#: every strategy the planner plans and the advisor ranks
ALL_STRATEGIES = STRATEGIES + HIERARCHICAL
#: hsdp and hpz shard parameters, gradients and optimizer states as stage 3 does
STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "hsdp": 3, "hpz": 3}
OFFLOADS = ("none", "optimizer", "params")
SCHEDULES = ("1f1b", "gpipe")
#: the axes plan()'s ``parallel`` dict names
PARALLEL_AXES = ("dp", "cp", "ep", "tp", "pp")
#: DeepSpeed's defaults, in elements (FACTS §7)
REDUCE_BUCKET = 500_000_000
PREFETCH_BUCKET = 50_000_000
#: torch DDP's bucket_cap_mb, for counting its calls
DDP_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class Layout:
    strategy: str = "ddp"
    offload: str = "none"
    dp: int | None = None
    tp: int = 1
    pp: int = 1
    micro_batch_size: int = 1
    micro_batches: int = 1
    checkpointing: str = "none"
    #: layers per checkpointed segment for ``every-k``
    segment_layers: int | None = None
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    #: None: on whenever tp > 1 (Megatron's sequence parallelism)
    sequence_parallel: bool | None = None
    #: with sequence parallelism a column-parallel layer keeps the shard of its input and gathers it again in
    #: backward (Megatron, Korthikanti's 34/t); False: it saves the gathered input (zerokit's tiny GPT plan today)
    sequence_parallel_regather: bool = True
    schedule: str = "1f1b"
    reduce_bucket_size: int = REDUCE_BUCKET
    overlap_comm: bool | None = None
    prefetch: bool = True
    prefetch_bucket_size: int = PREFETCH_BUCKET
    param_persistence_threshold: int = 0
    #: DeepSpeed's train_batch_size, checked against micro-batch × micro-batches × dp
    global_batch: int | None = None
    #: where the layout came from (a DeepSpeed config's path), and what of it was not modelled
    notes: tuple = ()
    #: hsdp: the data-parallel ranks a parameter is sharded over (FSDP2's shard mesh dimension, MiCS's
    #: mics_shard_size); hpz: the ranks its secondary copy is sharded over (zero_hpz_partition_size).
    #: None: the data-parallel ranks of one node, gpus_per_node // tp (at most dp)
    shard_group: int | None = None
    #: context parallelism: ranks each sequence is cut over, and how attention reaches the other ranks' keys
    cp: int = 1
    cp_attention: str = "ring"
    #: expert parallelism: data-parallel ranks a mixture of experts' experts are spread over
    ep: int = 1
    #: uneven pipeline stages: every stage's layer count (None: L/pp each); after :func:`check`, the counts
    #: whatever way they were asked for
    stage_layers: tuple | None = None
    #: uneven pipeline stages, Megatron's way: the first and/or last stage's layers, the rest shared evenly
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None

    @property
    def stage(self) -> int:
        return STAGE[self.strategy]

    @property
    def sp(self) -> bool:
        return self.tp > 1 if self.sequence_parallel is None else bool(self.sequence_parallel and self.tp > 1)

    @property
    def hierarchical(self) -> bool:
        return self.strategy in HIERARCHICAL

    @property
    def replicas(self) -> int:
        """HSDP's replica groups (dp / shard_group); 1 for every other layout."""
        return self.dp // self.shard_group if self.hierarchical else 1

    @property
    def overlap(self) -> bool:
        """DeepSpeed's ``overlap_comm`` default: off for stages 1-2, on for stage 3."""
        return self.stage == 3 if self.overlap_comm is None else self.overlap_comm

    def degrees(self) -> dict:
        return {"dp": self.dp, "cp": self.cp, "tp": self.tp, "pp": self.pp}

    @property
    def dp_axis(self) -> str:
        """The axis the weights' gradients are reduced over: ``dp``, or ``dp_cp`` (dp × cp, Megatron's data-parallel
        group with context parallelism) — the name zerokit's ledger gives it."""
        return "dp_cp" if self.cp > 1 else "dp"

    @property
    def edp(self) -> int:
        """The data-parallel ranks that hold the same experts, dp / ep."""
        return self.dp // self.ep

    def describe(self) -> str:
        off = f" + offload {self.offload}" if self.offload != "none" else ""
        if self.strategy == "hsdp":
            off = f" (shard over {self.shard_group} × replicate over {self.replicas})"
        elif self.strategy == "hpz":
            off = f" (ZeRO-3 over {self.dp}, secondary copy over {self.shard_group})"
        ckpt = self.checkpointing if self.checkpointing != "every-k" else f"every {self.segment_layers} layers"
        sp = ", sequence parallel" if self.sp else ""
        sp += f" cp={self.cp} ({self.cp_attention})" if self.cp > 1 else ""
        sp += f" ep={self.ep} (experts' gradients over {self.edp})" if self.ep > 1 else ""
        if self.stage_layers is not None:
            sp += f"; layers per stage {describe_counts(self.stage_layers)}"
        return (f"{self.strategy}{off}; dp={self.dp} tp={self.tp} pp={self.pp}{sp}; micro-batch "
                f"{self.micro_batch_size} × {self.micro_batches}; checkpointing {ckpt}; {self.precision} "
                f"{self.optimizer}" + (f"; schedule {self.schedule}" if self.pp > 1 else ""))


def describe_counts(counts) -> str:
    """``(7, 8, 8, …, 8, 7)`` -> ``"7, 8 × 14, 7"``: runs of equal counts written once."""
    runs: list = []
    for c in counts:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    return ", ".join(f"{c} × {n}" if n > 1 else f"{c}" for c, n in runs)


def stage_layer_counts(layout: Layout, layers: int) -> tuple:
    """Layers per pipeline stage: ``stage_layers``, or the first and last stages' with the rest shared evenly over
    the stages between (Megatron's rule: they must divide it), or L/pp each (pp dividing L). Every stage holds at
    least one layer. A ValueError names the argument."""
    pp, first, last = layout.pp, layout.first_stage_layers, layout.last_stage_layers
    if layout.stage_layers is not None:
        if first is not None or last is not None:
            raise ValueError("stage_layers: give every stage's count, or first_stage_layers/last_stage_layers, not "
                             "both")
        counts = tuple(layout.stage_layers)
        if len(counts) != pp or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts) \
                or sum(counts) != layers:
            raise ValueError(f"stage_layers={list(counts)!r}: give pp={pp} positive layer counts, one per stage, "
                             f"summing to the model's {layers} layers")
        return counts
    if first is None and last is None:
        if layers % pp:
            raise ValueError(f"pp={pp} does not divide the {layers} layers; give uneven stages: first_stage_layers/"
                             f"last_stage_layers (Megatron's), or stage_layers, every stage's count")
        return (layers // pp,) * pp
    if pp == 1:
        raise ValueError(f"first_stage_layers/last_stage_layers need pp > 1 (pp={pp})")
    return tuple(first_last_counts(layers, pp, first, last, names=("first_stage_layers", "last_stage_layers"),
                                   unit="layers"))


def stage_layer_range(counts, stage: int) -> range:
    """The layers pipeline ``stage`` holds, given every stage's count."""
    start = sum(counts[:stage])
    return range(start, start + counts[stage])


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive whole number")
    return value


def parse_checkpointing(text: str) -> tuple:
    """``none``, ``full``, ``sqrt``, ``every-K`` (or ``every-k`` with ``segment_layers``) → (policy, K)."""
    text = str(text).strip().lower()
    if text in ("none", "full", "sqrt"):
        return text, None
    if text.startswith("every-"):
        k = text.removeprefix("every-")
        if k.isdigit() and int(k) >= 1:
            return "every-k", int(k)
    raise ValueError(f"checkpointing={text!r}; allowed: none, full, sqrt, every-K (K layers per segment, e.g. "
                     f"every-4)")


def parse_parallel_text(text: str) -> dict:
    """``"dp=8,tp=2,pp=1"`` → ``{"dp": 8, "tp": 2, "pp": 1}`` (degrees checked later against the GPUs); cp and ep
    have flags of their own (``--cp``, ``--ep``), and plan()'s ``parallel`` dict takes them too."""
    out = {}
    for item in str(text).split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or key not in ("dp", "tp", "pp") or not value.lstrip("-").isdigit():
            raise ValueError(f"parallel {text!r}: {item.strip()!r} is not AXIS=N with AXIS one of dp, tp, pp (context "
                             f"and expert parallelism: --cp N, --ep N)")
        if key in out:
            raise ValueError(f"parallel {text!r}: {key} is given twice")
        out[key] = int(value)
    return out


def check(layout: Layout, model, cluster) -> Layout:
    """The layout with dp filled in, every degree and choice checked against the model and cluster."""
    if layout.strategy not in ALL_STRATEGIES:
        raise ValueError(f"strategy={layout.strategy!r}; allowed: {', '.join(ALL_STRATEGIES)}")
    if layout.offload not in OFFLOADS:
        raise ValueError(f"offload={layout.offload!r}; allowed: {', '.join(OFFLOADS)}")
    if layout.schedule not in SCHEDULES:
        raise ValueError(f"schedule={layout.schedule!r}; allowed: {', '.join(SCHEDULES)}")
    theory.check_precision(layout.precision)
    theory.check_optimizer(layout.optimizer)
    for name in ("micro_batch_size", "micro_batches", "tp", "pp", "cp", "ep"):
        _positive(name, getattr(layout, name))
    asked = {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep} | (
        {} if layout.dp is None else {"dp": _positive("dp", layout.dp)})
    try:
        shape = parse_parallel(asked, cluster.gpus)
    except ValueError as e:
        raise ValueError(f"{e} (gpus={cluster.gpus})") from None
    policy, k = parse_checkpointing(layout.checkpointing if layout.checkpointing != "every-k"
                                    else f"every-{layout.segment_layers}")
    layout = replace(layout, dp=shape["dp"], checkpointing=policy, segment_layers=k)
    layout = _check_shard_group(layout, cluster)
    _check_cp_ep(layout, model)
    if not model.has_shape:
        if layout.tp > 1 or layout.pp > 1:
            raise ValueError(f"tp={layout.tp}, pp={layout.pp}: a bare parameter count has no layers or heads to "
                             f"split; give a preset or a shape")
        if layout.stage_layers is not None or layout.first_stage_layers is not None \
                or layout.last_stage_layers is not None:
            raise ValueError("stage_layers: a bare parameter count has no layers to split; give a preset or a shape")
    else:
        if model.heads % layout.tp or (model.kv_heads or model.heads) % layout.tp:
            raise ValueError(f"tp={layout.tp} does not divide the {model.heads} attention heads"
                             + (f" ({model.kv_heads} KV heads)" if model.kv_heads else ""))
        counts = stage_layer_counts(layout, model.layers)
        even = len(set(counts)) == 1
        layout = replace(layout, stage_layers=None if even else counts, first_stage_layers=None,
                         last_stage_layers=None)
    if layout.offload != "none":
        if layout.stage == 0:
            raise ValueError("offload: DeepSpeed offloads the optimizer with ZeRO stages 1-3 only; choose zero1-3")
        if layout.offload == "params" and layout.stage != 3:
            raise ValueError("offload=params: parameters are offloaded with ZeRO-3 only (offload_param)")
        if layout.precision != "bf16-mixed":
            raise ValueError("offload: ZeRO-Offload keeps 16-bit parameters on the GPU and the fp32 master on the "
                             "host; it needs precision bf16-mixed")
    for name in ("reduce_bucket_size", "prefetch_bucket_size"):
        _positive(name, getattr(layout, name))
    expected = layout.micro_batch_size * layout.micro_batches * layout.dp
    if layout.global_batch is not None and layout.global_batch != expected:
        raise ValueError(f"train_batch_size={layout.global_batch} but micro-batch {layout.micro_batch_size} × "
                         f"micro-batches {layout.micro_batches} × dp {layout.dp} = {expected}")
    return layout


def _check_cp_ep(layout: Layout, model) -> None:
    """Context and expert parallelism checked against the model: a sequence to cut, experts to spread."""
    if layout.cp > 1 or layout.cp_attention != "ring":
        if not model.has_shape:
            raise ValueError(f"cp={layout.cp}: a bare parameter count has no sequence to cut; give a preset or a "
                             f"shape")
        cp_theory.check_context_parallel(layout.cp, model.seq_len, model.heads, layout.cp_attention, model.kv_heads,
                                      layout.tp)
        if layout.cp > 1 and layout.hierarchical:
            raise ValueError(f"cp={layout.cp}: the planner models context parallelism with ddp and zero1-3 (sharded "
                             f"over dp × cp), not {layout.strategy}")
    if layout.ep > 1:
        if not model.has_shape or not model.moe:
            raise ValueError(f"ep={layout.ep}: the model has no experts to spread; give experts (--experts E "
                             f"--top-k k) or a preset with experts (mixtral-8x7b)")
        if model.experts % layout.ep:
            raise ValueError(f"ep={layout.ep} must divide the {model.experts} experts per layer")
        if layout.cp > 1:
            raise ValueError(f"ep={layout.ep} with cp={layout.cp}: the planner models expert parallelism without "
                             f"context parallelism (set one of them to 1)")
        if layout.hierarchical or layout.offload != "none":
            raise ValueError(f"ep={layout.ep}: the planner models expert parallelism with ddp and zero1-3 without "
                             f"offload, not {layout.strategy}" + (f" + offload {layout.offload}"
                                                                 if layout.offload != "none" else ""))


def _check_shard_group(layout: Layout, cluster) -> Layout:
    """The shard group filled in (the dp ranks of one node) and checked: hsdp and hpz only, dividing dp."""
    if not layout.hierarchical:
        if layout.shard_group is not None:
            raise ValueError(f"shard_group={layout.shard_group!r} applies to strategy hsdp or hpz, not "
                             f"{layout.strategy}")
        return layout
    if layout.offload != "none":
        raise ValueError(f"offload: the planner models {layout.strategy} without offload; choose zero1-3 to offload")
    s = layout.shard_group
    if s is None:
        s = max(1, min(layout.dp, cluster.gpus_per_node // layout.tp))
        while layout.dp % s:
            s -= 1
    _positive("shard_group", s)
    if s > layout.dp or layout.dp % s:
        raise ValueError(f"shard_group={s} must divide dp={layout.dp}: {layout.strategy} needs dp = replicas × "
                         f"shard_group (e.g. shard_group={min(layout.dp, cluster.gpus_per_node)})")
    return replace(layout, shard_group=s)


#: top-level DeepSpeed keys the planner reads itself
TOP_LEVEL = ("zero_optimization", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "train_batch_size", "bf16", "fp16", "optimizer", "gradient_clipping", "steps_per_print",
             "wall_clock_breakdown")


def _enabled(section) -> bool:
    return isinstance(section, dict) and bool(section.get("enabled", False))


def from_deepspeed_config(source) -> dict:
    """The Layout fields a DeepSpeed config (dict or JSON path) sets: stage, buckets, offload, batch, precision."""
    config = load_deepspeed_config(source)
    where = "DeepSpeed config" if isinstance(source, dict) else f"DeepSpeed config {Path(source).name}"
    unknown = sorted(set(config) - set(TOP_LEVEL))
    if unknown:
        raise ValueError(f"DeepSpeed config key {unknown[0]!r} is unknown to the planner; allowed at the top level: "
                         f"{', '.join(TOP_LEVEL)}")
    zero = dict(config.get("zero_optimization") or {})
    notes = [f"from {where}"]
    offload = "none"
    for key, kind in (("offload_optimizer", "optimizer"), ("offload_param", "params")):
        section = zero.pop(key, None)
        if section is None:
            continue
        device = section.get("device", "none") if isinstance(section, dict) else None
        if device not in ("none", "cpu", "nvme"):
            raise ValueError(f"zero_optimization.{key}={section!r}: expected {{\"device\": \"cpu\"}} or \"none\"")
        if device == "nvme":
            notes.append(f"{key} to NVMe is planned as host memory")
        if device != "none":
            offload = kind if offload == "none" or kind == "params" else offload
    for key in [k for k in zero if k in NOT_IMPLEMENTED]:
        notes.append(f"zero_optimization.{key} not modelled")
        zero.pop(key)
    for key in ("zero_quantized_weights", "zero_quantized_gradients"):  # ZeRO++'s qwZ and qgZ (zerokit's zeropp)
        if zero.pop(key, False):
            notes.append(f"zero_optimization.{key} not modelled (the planner counts 16-bit traffic)")
    hierarchical = {}
    for key, strategy in (("zero_hpz_partition_size", "hpz"), ("mics_shard_size", "hsdp")):
        if key in zero:
            value = zero.pop(key)
            if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
                raise ValueError(f"zero_optimization.{key}={value!r} must be a positive whole number")
            if value > 1:
                hierarchical = dict(strategy=strategy, shard_group=value)
    options = from_deepspeed({"zero_optimization": zero, "gradient_clipping": 0})
    stage = options.pop("stage")
    if hierarchical and stage != 3:
        raise ValueError(f"zero_optimization: hpZ (zero_hpz_partition_size) and MiCS (mics_shard_size) shard "
                         f"parameters: they need stage 3, not {stage}")
    changes = dict(strategy=STRATEGIES[stage], offload=offload, notes=tuple(notes)) | hierarchical
    for name in ("reduce_bucket_size", "overlap_comm", "prefetch", "prefetch_bucket_size",
                 "param_persistence_threshold"):
        if name in options:
            changes[name] = int(options[name]) if name.endswith("size") or name.endswith("threshold") \
                else options[name]
    if "train_micro_batch_size_per_gpu" in config:
        changes["micro_batch_size"] = _positive("train_micro_batch_size_per_gpu",
                                                config["train_micro_batch_size_per_gpu"])
    if "gradient_accumulation_steps" in config:
        changes["micro_batches"] = _positive("gradient_accumulation_steps", config["gradient_accumulation_steps"])
    if _enabled(config.get("bf16")) or _enabled(config.get("fp16")):
        changes["precision"] = "bf16-mixed"
        if _enabled(config.get("fp16")):
            notes.append("fp16 planned as bf16-mixed: the same bytes per element (its loss scaler is not counted)")
    elif "bf16" in config or "fp16" in config:
        changes["precision"] = "fp32"
    opt = config.get("optimizer")
    if opt is not None:
        kind = str(opt.get("type", "")).lower() if isinstance(opt, dict) else ""
        if kind not in ("adam", "adamw", "sgd"):
            raise ValueError(f"DeepSpeed config optimizer {opt!r}: the planner knows Adam, AdamW and SGD")
        changes["optimizer"] = "sgd" if kind == "sgd" else "adamw"
    if "train_batch_size" in config:
        changes["global_batch"] = _positive("train_batch_size", config["train_batch_size"])
    changes["notes"] = tuple(notes)
    return changes
