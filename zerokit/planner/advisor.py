"""The advisor: every layout worth trying for a model on a cluster, those that fit ranked by communication time.

From a plan it tries each strategy (ddp, zero1-3, and the hierarchical hsdp and hpz with
the shard group of one node's data-parallel ranks, when that group is neither one rank nor
all of them), offloading the optimizer (zero1-3) or
the parameters too (zero3) and full checkpointing when the plan has none, on the plan's
dp × tp × pp. If none fits and the caller did not fix the degrees, it tries tensor
parallelism inside a node and pipeline parallelism (with DDP or ZeRO-1 only: DeepSpeed
refuses ZeRO-2/3 with a pipeline, FACTS §3), keeping the sequences per step: fewer dp
ranks take more micro-batches. Layouts that fit are ranked by the estimated seconds per step on the links
(:attr:`Plan.comm_seconds`, an α-β estimate, no overlap), then by memory; each gets one
line of reason. The others say what does not fit.

Context and expert parallelism: the plan's cp and ep are kept on every candidate (dp is what
tp × pp × cp leave). For a model with experts the advisor also ranks every other ep that
divides dp and the experts and stays in a node (ep = 1 included). When the caller left the
degrees free it tries cutting the sequence over cp = 2, 4, 8 ranks too: from the start where the
activations outweigh the model states (long context), else when nothing fits.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .. import theory
from .layout import ALL_STRATEGIES, HIERARCHICAL
from .render import seconds

LABEL = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "hsdp": "HSDP", "hpz": "ZeRO-3 + hpZ"}


@dataclass
class Option:
    label: str
    layout: object
    plan: object
    fits: bool
    reason: str

    def to_dict(self) -> dict:
        out = {"label": self.label, "fits": self.fits, "reason": self.reason}
        if self.plan is not None:
            out |= {"total_bytes": self.plan.total_bytes, "comm_seconds_per_step_estimate": self.plan.comm_seconds,
                    "comm_bytes_per_step": self.plan.comm_bytes_per_step,
                    "comm_bytes_per_step_by_link": self.plan.comm_bytes_by_link,
                    "bytes_leaving_each_node_per_step": self.plan.bytes_leaving_node}
        return out


@dataclass
class Advice:
    fits: list
    does_not_fit: list

    def to_dict(self) -> dict:
        return {"ranking": "layouts that fit, least estimated communication time per step first",
                "fits": [o.to_dict() for o in self.fits], "does_not_fit": [o.to_dict() for o in self.does_not_fit]}

    def lines(self, limit: int = 10) -> list:
        out = ["advisor — layouts that fit, least estimated communication time first:"]
        out += [f"  {i + 1}. {o.reason}" for i, o in enumerate(self.fits[:limit])] or ["  none fits"]
        if len(self.fits) > limit:
            out.append(f"  … and {len(self.fits) - limit} more that fit")
        if self.does_not_fit:
            out.append("does not fit:")
            out += [f"  {o.reason}" for o in self.does_not_fit[:limit]]
            if len(self.does_not_fit) > limit:
                out.append(f"  … and {len(self.does_not_fit) - limit} more")
        return out


def label(layout) -> str:
    parts = [LABEL[layout.strategy] + (f" + offload {layout.offload}" if layout.offload != "none" else "")
             + (f" (groups of {layout.shard_group})" if layout.strategy in HIERARCHICAL and layout.shard_group
                else "")]
    parts.append(f"dp={layout.dp}" + (f" cp={layout.cp} ({layout.cp_attention})" if layout.cp > 1 else "")
                 + (f" ep={layout.ep}" if layout.ep > 1 else "") + (f" tp={layout.tp}" if layout.tp > 1 else "")
                 + (f" pp={layout.pp}" if layout.pp > 1 else ""))
    if layout.checkpointing != "none":
        parts.append(f"checkpointing {layout.checkpointing}")
    return ", ".join(parts)


def _traffic_remark(plan) -> str:
    layout, unit = plan.layout, plan.convention
    if layout.dp == 1:
        dp = "no data-parallel traffic"
    elif layout.strategy == "hsdp":
        dp = (f"ZeRO-3's gathers and reduce-scatters inside groups of {layout.shard_group}, the gradient shard "
              f"all-reduced across {layout.replicas} groups")
    elif layout.strategy == "hpz":
        dp = f"ZeRO-3's traffic with the backward gather inside groups of {layout.shard_group}"
    elif layout.stage == 0:
        dp = "one all-reduce of the gradients, 2(N−1)/N·Ψb"
    elif layout.stage == 3:
        dp = "1.5 × DDP's traffic (parameters gathered in forward and backward)"
    elif layout.stage == 2 and layout.micro_batches > 1:
        dp = f"{(layout.micro_batches + 1) / 2:g} × DDP's traffic (a reduce-scatter every micro-batch)"
    else:
        dp = "same traffic as DDP"
    extra = []
    by_axis = plan.comm_bytes_per_step
    if "cp" in by_axis:
        extra.append(f"CP ({layout.cp_attention}) {unit.text(by_axis['cp'])} per step")
    if "ep" in by_axis:
        extra.append(f"all-to-all {unit.text(by_axis['ep'])} per step (uniform routing)")
    if "tp" in by_axis:
        extra.append(f"TP {unit.text(by_axis['tp'])} per step")
    if "host" in by_axis:
        extra.append(f"{unit.text(by_axis['host'])} per step over PCIe")
    if layout.pp > 1:
        extra.append(f"bubble {100 * theory.bubble_fraction(layout.pp, layout.micro_batches):.0f} %")
    if layout.checkpointing != "none":
        extra.append("one extra forward")
    if plan.bytes_leaving_node:
        extra.append(f"{unit.text(plan.bytes_leaving_node)} leave each node")
    return "; ".join([dp] + extra)


def _fit_reason(plan) -> str:
    u = plan.convention
    return (f"{label(plan.layout)}: {u.text(plan.total_bytes)} of {u.text(plan.cluster.gpu_memory)}; "
            f"{_traffic_remark(plan)}; ≈ {seconds(plan.comm_seconds)} per step on the links (estimate)")


def _overshoot(plan) -> float:
    """How far over its limit the tighter of GPU and host memory is (1.2: 20 % over)."""
    host = plan.host_bytes_per_node / plan.cluster.host_memory if plan.cluster.host_memory else 0.0
    return max(plan.total_bytes / plan.cluster.gpu_memory, host)


def _miss_reason(plan) -> str:
    u, m, cluster = plan.convention, plan.memory, plan.cluster
    if m.total <= cluster.gpu_memory:  # the GPU has room; the host does not
        return (f"{label(plan.layout)}: {u.text(m.total)} of {u.text(cluster.gpu_memory)} fits the GPU, but the host "
                f"needs {u.text(plan.host_bytes_per_node)} per node of {u.text(cluster.host_memory)}")
    parts = {"model states": m.model_states.total, "activations": m.activations, "buffers": m.buffers}
    biggest = max(parts, key=parts.get)
    why = (f"model states alone are {u.text(m.model_states.total)}" if m.model_states.total > cluster.gpu_memory
           else f"largest part: {biggest} {u.text(parts[biggest])}")
    return f"{label(plan.layout)}: needs {u.text(m.total)} of {u.text(cluster.gpu_memory)} — {why}"


def model_parallel_degrees(plan) -> list:
    """(tp, pp) pairs worth trying: tp within a node dividing the heads, pp dividing the layers, both the GPUs."""
    model, cluster = plan.model, plan.cluster
    out = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            if (tp, pp) != (plan.layout.tp, plan.layout.pp) and tp <= cluster.gpus_in_a_node \
                    and cluster.gpus % (tp * pp) == 0 and model.heads % tp == 0 \
                    and (model.kv_heads or model.heads) % tp == 0 and model.layers % pp == 0:
                out.append((tp, pp))
    return out


def candidates(plan, degrees: list) -> list:
    """Layouts to try on each (tp, pp): strategies × offload × checkpointing, the global batch kept.

    The micro-batch size stays; the number of micro-batches takes up what a smaller dp
    leaves, so every candidate trains on as many sequences per step as the plan.
    """
    base, model, cluster = plan.layout, plan.model, plan.cluster
    checkpointing = [base.checkpointing] + (["full"] if model.has_shape and base.checkpointing == "none" else [])
    sequences = base.micro_batch_size * base.micro_batches * base.dp
    out = []
    for degree in degrees:
        tp, pp, cp, ep = (tuple(degree) + (base.cp, base.ep))[:4]
        if cluster.gpus % (tp * pp * cp):
            continue
        dp = cluster.gpus // (tp * pp * cp)
        if dp % ep:
            continue
        micro_batches = sequences // (dp * base.micro_batch_size)
        if micro_batches < 1 or sequences % (dp * base.micro_batch_size):
            continue
        base_here = base
        base = replace(base, cp=cp, ep=ep)
        if pp != base.pp:  # uneven stages were asked for the plan's pp; another pp takes even ones
            base = replace(base, stage_layers=None, first_stage_layers=None, last_stage_layers=None)
        for strategy in ALL_STRATEGIES:
            if strategy in HIERARCHICAL and (ep > 1 or cp > 1):
                continue  # the planner models context and expert parallelism with ddp and zero1-3
            if strategy in HIERARCHICAL:
                group = base.shard_group if base.strategy in HIERARCHICAL else None
                size = group or _node_group(dp, tp, cluster.gpus_per_node)
                if not 1 < size < dp or dp % size:
                    continue  # one rank per group is DDP's memory, all of them ZeRO-3: nothing new to rank
                out += [replace(base, strategy=strategy, offload="none", tp=tp, pp=pp, dp=dp, shard_group=group,
                                micro_batches=micro_batches, checkpointing=ckpt,
                                segment_layers=base.segment_layers if ckpt == base.checkpointing else None)
                        for ckpt in checkpointing]
                continue
            offloads = ["none"]
            if strategy != "ddp" and base.precision == "bf16-mixed" and ep == 1:
                offloads += ["optimizer"] + (["params"] if strategy == "zero3" else [])
            for offload in offloads:
                for ckpt in checkpointing:
                    out.append(replace(base, strategy=strategy, offload=offload, tp=tp, pp=pp, dp=dp,
                                       micro_batches=micro_batches, checkpointing=ckpt, shard_group=None,
                                       segment_layers=base.segment_layers if ckpt == base.checkpointing else None))
        base = base_here
    return out


def expert_degrees(plan) -> list:
    """For a model with experts: (tp, pp, cp, ep) for every other ep dividing dp and the experts, within a node."""
    model, layout, cluster = plan.model, plan.layout, plan.cluster
    if not model.moe:
        return []
    return [(layout.tp, layout.pp, layout.cp, ep) for ep in range(1, model.experts + 1)
            if ep != layout.ep and model.experts % ep == 0 and layout.dp % ep == 0
            and ep * layout.tp * layout.cp <= cluster.gpus_in_a_node]


def context_degrees(plan) -> list:
    """(tp, pp, cp, ep) cutting the sequence over cp = 2, 4, 8 ranks where it divides the GPUs and the sequence."""
    model, layout, cluster = plan.model, plan.layout, plan.cluster
    if not model.has_shape or layout.ep > 1:
        return []
    return [(layout.tp, layout.pp, cp, 1) for cp in (2, 4, 8) if cp != layout.cp
            and cluster.gpus % (cp * layout.tp * layout.pp) == 0 and model.seq_len % (2 * cp) == 0
            and cp * layout.tp <= cluster.gpus_in_a_node]


def _node_group(dp: int, tp: int, gpus_per_node: int) -> int:
    """The default shard group: the data-parallel ranks of one node (the largest divisor of dp that fits)."""
    size = max(1, min(dp, gpus_per_node // tp))
    while dp % size:
        size -= 1
    return size


def _try(plan, layouts: list) -> tuple:
    """(options that fit, options that don't) among ``layouts``."""
    fits, misses = [], []
    for layout in layouts:
        if layout.pp > 1 and layout.stage >= 2:
            continue  # DeepSpeed refuses it; the plan for such a layout says so when asked directly
        try:
            option = plan.with_layout(layout)
        except ValueError as e:
            misses.append(Option(label(layout), layout, None, False, f"{label(layout)}: {e}"))
            continue
        if option.fits:
            fits.append(Option(label(option.layout), option.layout, option, True, _fit_reason(option)))
        else:
            misses.append(Option(label(option.layout), option.layout, option, False, _miss_reason(option)))
    return fits, misses


def advise(plan, explore: bool | None = None) -> Advice:
    """Rank every candidate layout for ``plan``'s model, cluster and convention.

    The plan's own degrees first; if nothing fits there and the caller left the degrees
    free (``explore``), tensor and pipeline parallelism too.
    """
    if explore is None:
        explore = getattr(plan, "explore_parallel", False)
    # long sequences: where activations outweigh the model states, cutting the sequence is ranked from the start
    long_context = explore and plan.model.has_shape and plan.memory.activations > plan.memory.model_states.total
    first = [(plan.layout.tp, plan.layout.pp)] + expert_degrees(plan) + (context_degrees(plan) if long_context else [])
    fits, misses = _try(plan, candidates(plan, first))
    if not fits and explore and plan.model.has_shape:  # data parallelism first; model parallelism when it must
        more = model_parallel_degrees(plan) + ([] if long_context else context_degrees(plan))
        more_fits, more_misses = _try(plan, candidates(plan, more))
        fits, misses = more_fits, misses + more_misses
    fits.sort(key=lambda o: (round(o.plan.comm_seconds, 9), o.plan.total_bytes))
    misses.sort(key=lambda o: _overshoot(o.plan) if o.plan else float("inf"))
    return Advice(fits, misses)
