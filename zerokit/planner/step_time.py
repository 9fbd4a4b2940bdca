"""A plan's step time, estimated: compute, the pipeline bubble, each axis's traffic and how much of it is exposed, MFU.

From a :class:`~.plan.Plan` (a model with a shape, a cluster, a checked layout and its
transfers) :func:`estimate` composes :mod:`zerokit.theory.step_time`: the step's model and
hardware FLOPs over its tokens (b · m · dp sequences of s tokens), split evenly over the GPUs
(with uneven pipeline stages, stretched to the busiest stage's layers, :func:`stage_imbalance`)
and run at ``compute_fraction`` of ``gpu_peak``; every transfer's α-β seconds from :mod:`.traffic`,
exposed or hidden by the ``overlap`` rule; the bubble (p − 1)/(v·m). Nothing here is measured:
every number is an estimate and is named so (``*_estimate``), with the assumptions it rests on.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import theory
from ..theory import step_time as st
from ..theory.experts import is_expert
from .layout import describe_counts, stage_layer_counts

#: the axes whose traffic is the data-parallel gradient (and parameter) exchange
DP_AXES = ("dp", "dp_cp", "edp")


@dataclass(frozen=True)
class AxisTime:
    """One axis's estimated seconds on the links per step, and the part of them not hidden behind compute."""

    axis: str
    seconds: float
    exposed_seconds: float
    rule: str

    def as_dict(self) -> dict:
        return {"axis": self.axis, "comm_seconds_estimate": self.seconds,
                "exposed_seconds_estimate": self.exposed_seconds, "overlap": self.rule}


@dataclass(frozen=True)
class StepTimeEstimate:
    """The estimated step, term by term (seconds per step, on the busiest GPU)."""

    compute_seconds: float
    bubble_seconds: float
    axes: tuple
    step_seconds: float
    tokens_per_step: int
    model_flops_per_step: float
    hardware_flops_per_step: float
    gpus: int
    peak_flops: float
    compute_fraction: float
    overlap: str
    virtual_stages: int
    recompute: str
    bubble_over_ideal: float
    assumptions: tuple = field(default_factory=tuple)

    @property
    def exposed_comm_seconds(self) -> float:
        return sum(a.exposed_seconds for a in self.axes)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.step_seconds

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs / (step × GPUs × peak)."""
        return st.flops_utilization(self.model_flops_per_step, self.step_seconds, self.gpus, self.peak_flops)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: the same with recomputation counted."""
        return st.flops_utilization(self.hardware_flops_per_step, self.step_seconds, self.gpus, self.peak_flops)

    @property
    def achieved_flops_per_gpu(self) -> float:
        """Hardware FLOP/s per GPU over the whole step: what Narayanan et al. 2021 call achieved FLOP/s."""
        return self.hardware_flops_per_step / (self.step_seconds * self.gpus)

    def as_dict(self) -> dict:
        return {"compute_seconds_estimate": self.compute_seconds, "bubble_seconds_estimate": self.bubble_seconds,
                "axes": [a.as_dict() for a in self.axes],
                "exposed_comm_seconds_estimate": self.exposed_comm_seconds,
                "step_seconds_estimate": self.step_seconds, "tokens_per_step": self.tokens_per_step,
                "tokens_per_second_estimate": self.tokens_per_second,
                "model_flops_per_step": self.model_flops_per_step,
                "hardware_flops_per_step": self.hardware_flops_per_step,
                "mfu_estimate": self.mfu, "hfu_estimate": self.hfu,
                "achieved_flops_per_gpu_estimate": self.achieved_flops_per_gpu,
                "gpu_peak_flops": self.peak_flops, "compute_fraction": self.compute_fraction,
                "overlap": self.overlap, "virtual_stages": self.virtual_stages, "recompute": self.recompute,
                "bubble_over_ideal": self.bubble_over_ideal, "assumptions": list(self.assumptions)}


def flop_counts(model) -> tuple:
    """(Ψ that multiplies per token, Ψ inside the layers, attention layers, attention width) of a shaped model.

    Lookups do no multiply: an untied token embedding and learned positions are left out of Ψ
    (a tied embedding is the head's weight and counts once). A mixture of experts counts its
    active experts only, k of E per token.
    """
    psi, inside = 0.0, 0.0
    active = model.top_k / model.experts if model.moe else 1.0
    for p in model.tensors:
        if p.name == "pos.weight" or (p.name == "tok.weight" and not model.tied):
            continue
        numel = p.numel * (active if is_expert(p) else 1.0)
        psi += numel
        if p.layer is not None:
            inside += numel
    attention_layers = model.layers + model.cross_attention_layers
    return psi, inside, attention_layers, model.q_dim


def check_options(gpu_peak="a100", compute_fraction: float = st.DEFAULT_COMPUTE_FRACTION, overlap: str = "dp",
                  virtual_stages: int = 1, recompute: str | None = None) -> None:
    """Refuse a bad option of :func:`estimate` before any plan is needed, naming it."""
    st.gpu_peak_flops(gpu_peak)
    st.check_compute_fraction(compute_fraction)
    st.check_overlap(overlap)
    if isinstance(virtual_stages, bool) or not isinstance(virtual_stages, int) or virtual_stages < 1:
        raise ValueError(f"virtual_stages={virtual_stages!r} must be a positive whole number (1: no interleaving)")
    if recompute is not None and recompute not in st.RECOMPUTE:
        raise ValueError(f"recompute={recompute!r}; allowed: {', '.join(st.RECOMPUTE)}")


def _check_virtual_stages(v, layout, model) -> int:
    if v > 1 and (layout.pp == 1 or model.layers % (layout.pp * v)):
        raise ValueError(f"virtual_stages={v}: the interleaved schedule needs pp > 1 and pp × v dividing the "
                         f"{model.layers} layers (pp = {layout.pp})")
    if v > 1 and layout.stage_layers is not None:
        raise ValueError(f"virtual_stages={v}: the interleaved schedule is planned with even stages only (Megatron "
                         f"refused uneven first/last stages with virtual stages too); layers per stage "
                         f"{describe_counts(layout.stage_layers)}")
    return v


def stage_imbalance(layout, model) -> float:
    """The busiest pipeline stage's layers over the mean, L_max / (L/p): 1 for even stages. Every stage waits for
    the slowest at each step of the schedule, so the pipelined work stretches by this much (layers weighed alike,
    the embedding and head not weighed)."""
    if layout.pp == 1:
        return 1.0
    counts = stage_layer_counts(layout, model.layers)
    return max(counts) * layout.pp / model.layers


def estimate(plan, gpu_peak="a100", compute_fraction: float = st.DEFAULT_COMPUTE_FRACTION, overlap: str = "dp",
             virtual_stages: int = 1, recompute: str | None = None) -> StepTimeEstimate:
    """The plan's step time, estimated. ``gpu_peak``: a GPU name (a100, h100, …) or FLOP/s; ``compute_fraction``:
    the share of that peak while computing; ``overlap``: ``dp`` (data-parallel traffic hidden behind the backward,
    up to :func:`zerokit.theory.step_time.dp_overlap_window`) or ``none``; ``virtual_stages``: v of the
    interleaved schedule; ``recompute``: ``none``, ``selective`` or ``full`` (default: ``full`` when the layout
    checkpoints, else ``none``)."""
    model, layout, cluster = plan.model, plan.layout, plan.cluster
    if not model.has_shape:
        raise ValueError("step time: a bare parameter count has no sequence length or layers to count FLOPs over; "
                         "give a preset or a shape")
    check_options(gpu_peak, compute_fraction, overlap, virtual_stages, recompute)
    peak, fraction = st.gpu_peak_flops(gpu_peak), float(compute_fraction)
    v = _check_virtual_stages(virtual_stages, layout, model)
    recompute = recompute if recompute is not None else ("none" if layout.checkpointing == "none" else "full")
    psi, inside, attention_layers, width = flop_counts(model)
    s = model.seq_len
    tokens = layout.micro_batch_size * layout.micro_batches * layout.dp * s
    model_flops = tokens * st.model_flops_per_token(psi, attention_layers, s, width)
    hardware_flops = tokens * st.hardware_flops_per_token(psi, attention_layers, s, width, recompute, inside)
    imbalance = stage_imbalance(layout, model)
    compute = st.compute_seconds(hardware_flops / cluster.gpus, peak, fraction) * imbalance
    forward = compute * (model_flops / 3) / hardware_flops
    window = st.dp_overlap_window(compute - forward, forward, layout.micro_batches, layout.stage) \
        if overlap == "dp" else 0.0
    seconds: dict = {}
    for t in plan.transfers:
        seconds[t.axis] = seconds.get(t.axis, 0.0) + t.seconds
    dp_total = sum(x for a, x in seconds.items() if a in DP_AXES)
    dp_exposed = st.exposed_seconds(dp_total, window)
    axes, pipelined, after = [], compute, 0.0
    for axis, x in seconds.items():
        if axis in DP_AXES:
            exposed = dp_exposed * x / dp_total if dp_total else 0.0
            rule = ("hidden behind the backward up to the window, the rest after it" if overlap == "dp"
                    else "exposed, after the last backward")
            after += exposed
        elif axis == "host":
            exposed, rule = x, "exposed, after the last backward (offload: the CPU's Adam not counted)"
            after += exposed
        else:
            exposed, rule = x, "exposed, on every micro-batch's critical path"
            pipelined += exposed
        axes.append(AxisTime(axis, x, exposed, rule))
    bubble = theory.bubble_over_ideal(layout.pp, layout.micro_batches, v)
    step = st.step_seconds(pipelined, bubble, after)
    assumptions = (f"peak {peak / 1e12:g} TFLOP/s per GPU at {fraction:g} of it while computing",
                   f"FLOPs 6Ψ + 12·L·s·d per token (Ψ = {psi:,.0f} multiplying, L = {attention_layers}, s = {s}, "
                   f"d = {width}), recomputation {recompute}",
                   "tp, cp, ep and pp traffic on the critical path; dp "
                   + ("hidden behind the backward (DDP/ZeRO-1: the last micro-batch's, ZeRO-2: every one's, "
                      "ZeRO-3: all compute)" if overlap == "dp" else "not overlapped"),
                   f"bubble (p − 1)/(v·m) = {bubble:.3g} over ideal (p = {layout.pp}, v = {v}, m = "
                   f"{layout.micro_batches}); "
                   + ("stages and GPUs share the FLOPs evenly" if imbalance == 1 else
                      f"uneven stages ({describe_counts(layout.stage_layers)} layers): the busiest sets the pace, "
                      f"× {imbalance:.4g} the even share (layers weighed alike, embedding and head not)"))
    return StepTimeEstimate(compute, pipelined * bubble, tuple(axes), step, tokens, model_flops, hardware_flops,
                            cluster.gpus, peak, fraction, overlap, v, recompute, bubble, assumptions)
