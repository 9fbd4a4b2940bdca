"""Bytes one GPU sends per optimizer step, by axis and collective, and an estimate of the time on the links.

- ``dp``: :func:`zerokit.theory.zero_collective_bytes` on the rank's Ψ_rank (ZeRO §7.2:
  2(N−1)/N·Ψb for DDP, ZeRO-1 and ZeRO-2 without accumulation, 3(N−1)/N·Ψb for ZeRO-3);
- ``tp``: :func:`~zerokit.theory.tp_bytes_sent_per_step`, four all-reduces of b·s·h per
  layer per micro-batch (Megatron §3), 1.5 × with the forward recomputed; the embedding's,
  the head's and the loss's (:func:`~zerokit.theory.tp_edge_bytes_per_step`); with sequence
  parallelism the whole parameters' gradients (:func:`~zerokit.theory.sequence_parallel_grad_bytes`);
- ``pp``: :func:`~zerokit.theory.pipeline_p2p_bytes` across the stage's boundaries;
- hierarchical dp (``hsdp``, ``hpz``): :func:`~zerokit.theory.hsdp_collective_bytes` and
  :func:`~zerokit.theory.hpz_collective_bytes`, each collective on the link its own group
  runs on (the shard group inside a node, the replicas or all N across nodes);
- ``cp`` (context parallelism): every attention call's ring sends or Ulysses all-to-alls,
  :func:`zerokit.theory.context.cp_attention_bytes`; the weights' gradients then go over
  ``dp_cp`` (dp × cp ranks, the name zerokit's ledger gives that group);
- ``ep`` (expert parallelism): each MoE layer's dispatch and combine all-to-alls under uniform
  routing, :func:`zerokit.theory.experts.moe_alltoall_bytes_uniform` (an assumption: a real
  router sends more to some ranks); the experts' gradients go over ``edp`` (the dp/ep ranks
  holding the same experts), the dense ones over ``dp``;
- ``host``: ZeRO-Offload's gradients out and parameters back
  (:func:`~zerokit.theory.offload_traffic_bytes_accumulated`, :func:`~zerokit.theory.param_offload_traffic_bytes`).

Times are :func:`~zerokit.theory.link_seconds` (α-β) on the link each axis runs on
(:func:`~zerokit.planner.cluster.axis_link`), with ring rounds as messages: an estimate
that assumes the ring reaches the link's bandwidth and that nothing overlaps with compute.
The pipeline bubble is :func:`~zerokit.theory.bubble_fraction`. Every network transfer also
carries the bytes it makes leave each node per step
(:func:`~zerokit.theory.ring_bytes_leaving_a_node`), which does not depend on how a ring
spanning nodes is spread over the node's network cards.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import theory
from ..theory import context as cp_theory, experts as ep_theory
from ..theory.experts import is_expert
from .cluster import axis_link, group_link, ORDER
from .layout import DDP_BUCKET_BYTES, stage_layer_counts, stage_layer_range
from .memory import stage_tensors


def stage_layers(model, layout, stage: int) -> range:
    """The layers pipeline ``stage`` holds (every layer when pp = 1)."""
    return stage_layer_range(stage_layer_counts(layout, model.layers), stage)


@dataclass(frozen=True)
class Transfer:
    """One kind of traffic: which axis and collective, bytes sent per step, calls, the link, the estimated time."""

    axis: str
    collective: str
    bytes: float
    calls: float
    link: str
    seconds: float
    formula: str
    #: bytes this transfer makes leave each node per step (0: it stays in the node, or goes to the host)
    leaving_node: float = 0.0

    def as_dict(self) -> dict:
        return {"axis": self.axis, "collective": self.collective, "bytes": self.bytes, "calls": self.calls,
                "link": self.link, "seconds": self.seconds, "formula": self.formula,
                "leaving_node_bytes": self.leaving_node}


def _stride(layout, axis: str) -> int:
    stride = 1
    for inner in ORDER[:ORDER.index(axis)]:
        stride *= layout.degrees()[inner]
    return stride


def _leaving(layout, cluster, axis: str, nbytes: float) -> float:
    """Bytes leaving each node for a ring over ``axis`` whose every rank sends ``nbytes``."""
    return float(theory.ring_bytes_leaving_a_node(nbytes, layout.degrees()[axis], _stride(layout, axis),
                                                  cluster.gpus_per_node))


def _rounds(collective: str, n: int) -> int:
    return theory.ring_steps("all_reduce" if collective == "all_reduce" else "all_gather", n)


def dp_transfers(layout, cluster, psi: int, units, expert_psi: int = 0, expert_units=None) -> list:
    """Data-parallel collectives of one rank per step, by kind: over dp (dp × cp with context parallelism); with
    expert parallelism the dense part over dp and the experts over edp."""
    if layout.ep > 1:
        edp = layout.edp
        dense = _flat_dp_transfers(layout, cluster, psi - expert_psi, units, layout.dp, "dp",
                                   group_link(cluster, layout.dp, layout.tp * layout.cp))
        experts = _flat_dp_transfers(layout, cluster, expert_psi, expert_units, edp, "edp",
                                     group_link(cluster, edp, layout.tp * layout.cp * layout.ep), stride_in_dp=layout.ep)
        return dense + experts
    n = layout.dp * layout.cp
    if n <= 1:
        return []
    if layout.hierarchical:
        return hierarchical_transfers(layout, cluster, psi, units)
    link = axis_link(cluster, layout.degrees(), "dp") if layout.cp == 1 else group_link(cluster, n, layout.tp)
    return _flat_dp_transfers(layout, cluster, psi, units, n, layout.dp_axis, link)


def _flat_dp_transfers(layout, cluster, psi: int, units, n: int, axis: str, link, stride_in_dp: int = 1) -> list:
    """One group's ZeRO (or DDP) collectives: ``n`` ranks, ``psi`` elements in ``units``, named ``axis``."""
    m = layout.micro_batches
    if n <= 1 or psi <= 0:
        return []
    b = theory.param_bytes_per_element(layout.precision)
    by_kind = theory.zero_collective_bytes(layout.stage, psi, n, b, m, units)
    unit_count = len(units) if units else max(1, math.ceil(psi / layout.reduce_bucket_size))
    calls = {0: {"all_reduce": max(1, math.ceil(psi * b / DDP_BUCKET_BYTES))},
             1: {"reduce_scatter": unit_count, "all_gather": unit_count},
             2: {"reduce_scatter": m * unit_count, "all_gather": unit_count},
             3: {"all_gather": 2 * m * unit_count, "reduce_scatter": m * unit_count}}[layout.stage]
    formulas = {0: {"all_reduce": "2(N−1)/N·Ψ·b, once per step (no_sync)"},
                1: {"reduce_scatter": "(N−1)/N·Ψ·b", "all_gather": "(N−1)/N·Ψ·b"},
                2: {"reduce_scatter": "A·(N−1)/N·Ψ·b", "all_gather": "(N−1)/N·Ψ·b"},
                3: {"all_gather": "2A·(N−1)/N·Ψ·b", "reduce_scatter": "A·(N−1)/N·Ψ·b"}}[layout.stage]
    out = []
    for kind, nbytes in by_kind.items():
        messages = calls[kind] * _rounds(kind, n)
        stride = layout.tp * (layout.cp * stride_in_dp if axis != "dp_cp" else 1)
        out.append(Transfer(axis, kind, nbytes, calls[kind], link.name,
                            theory.link_seconds(nbytes, messages, link.bandwidth, link.latency),
                            f"{formulas[kind]}, Ψ = {psi:,}, N = {n}, A = {m}"
                            + {"dp_cp": " (dp × cp ranks)", "edp": " (experts: the dp/ep ranks holding the same ones)",
                               "dp": " (dense: every dp rank)" if layout.ep > 1 else ""}[axis],
                            float(theory.ring_bytes_leaving_a_node(nbytes, n, stride, cluster.gpus_per_node))))
    return out


def hierarchical_transfers(layout, cluster, psi: int, units) -> list:
    """HSDP's and hpZ's collectives of one rank per step, each on its own group's link."""
    n, m, s, t = layout.dp, layout.micro_batches, layout.shard_group, layout.tp
    r = n // s
    b = theory.param_bytes_per_element(layout.precision)
    unit_count = len(units) if units else 1
    if layout.strategy == "hsdp":
        by = theory.hsdp_collective_bytes(psi, n, s, b, m, units)
        plan = [("shard", "all_gather", s, t, 2 * m * unit_count,
                 "2A·(s−1)/s·Ψ·b: forward and backward, in the group"),
                ("shard", "reduce_scatter", s, t, m * unit_count, "A·(s−1)/s·Ψ·b: gradients, in the group"),
                ("replicate", "all_reduce", r, t * s, unit_count,
                 "2(r−1)/r·(Ψ/s)·b: the gradient shard across the replicas, once per step")]
    else:
        by = theory.hpz_collective_bytes(psi, n, s, b, m, units)
        plan = [("global", "all_gather", n, t, m * unit_count, "A·(N−1)/N·Ψ·b: forward, over all N"),
                ("secondary", "all_gather", s, t, m * unit_count,
                 "A·(s−1)/s·Ψ·b: backward, from the secondary copy"),
                ("global", "reduce_scatter", n, t, m * unit_count, "A·(N−1)/N·Ψ·b: gradients, over all N")]
    out = []
    for group, kind, size, stride, calls, formula in plan:
        nbytes = by[group].get(kind, 0)
        if not nbytes:
            continue
        link = group_link(cluster, size, stride)
        messages = calls * _rounds(kind, size)
        leaving = float(theory.ring_bytes_leaving_a_node(nbytes, size, stride, cluster.gpus_per_node))
        out.append(Transfer("dp", f"{kind}, {group}", nbytes, calls, link.name,
                            theory.link_seconds(nbytes, messages, link.bandwidth, link.latency),
                            f"{formula}; {size} ranks, Ψ = {psi:,}, N = {n}, s = {s}, r = {r}, A = {m}", leaving))
    return out


def tp_transfers(layout, cluster, model, stage: int) -> list:
    """Tensor-parallel collectives of one rank of ``stage``: the layers', the embedding's, the head's and the
    loss's, and with sequence parallelism the gradient sums of the parameters kept whole."""
    t = layout.tp
    if t <= 1:
        return []
    e = theory.param_bytes_per_element(layout.precision)
    recompute = layout.checkpointing != "none"
    s, b, h, m = model.seq_len // layout.cp, layout.micro_batch_size, model.hidden, layout.micro_batches
    layers = len(stage_layers(model, layout, stage))
    link = axis_link(cluster, layout.degrees(), "tp")
    rounds = _rounds("all_reduce", t)

    def transfer(kind, nbytes, calls, formula):
        return Transfer("tp", kind, nbytes, calls, link.name,
                        theory.link_seconds(nbytes, calls * rounds, link.bandwidth, link.latency), formula,
                        _leaving(layout, cluster, "tp", nbytes))

    pair = "all_gather + reduce_scatter" if layout.sp else "all_reduce"
    out = [transfer(f"{pair} (layers)", theory.tp_bytes_sent_per_step(s, b, h, t, layers, m, e, recompute),
                    4 * layers * m * (1.5 if recompute else 1),
                    "8·b·s·h·(t−1)/t·e per layer per micro-batch"
                    f"{' × 1.5 (forward recomputed)' if recompute else ''}, {layers} layers, t = {t}")]
    edges = theory.tp_edge_bytes_per_step(s, b, h, t, m, e, embedding=stage == 0, head=stage == layout.pp - 1)
    what = {"embedding": "vocabulary-parallel embedding: 2(t−1)/t·b·s·h·e per micro-batch",
            "head": "column-parallel head's input gradient: 2(t−1)/t·b·s·h·e per micro-batch",
            "loss": "vocabulary-parallel cross-entropy: 3 fp32 per token, 2(t−1)/t·3·b·s·4 per micro-batch"}
    for part, nbytes in edges.items():
        out.append(transfer(f"{pair if part != 'loss' else 'all_reduce'} ({part})", nbytes, m, what[part]))
    if layout.sp:
        whole = sum(p.numel for p in stage_tensors(model, layout, stage) if not p.tp_sharded)
        out.append(transfer("all_reduce (sequence-parallel grads)",
                            theory.sequence_parallel_grad_bytes(whole, t, e, m), m,
                            f"2(t−1)/t·b·{whole:,} parameters kept whole (norms, row-parallel biases, positions), "
                            "per backward"))
    if model.moe:  # zerokit's tensor-parallel experts: the gates' gradients, and the output biases' without sp
        out.append(transfer("all_reduce (MoE gates)", theory.moe_gates_tp_bytes(s * b, model.top_k, t, layers, m),
                            layers * m, f"2(t−1)/t·b·s·k·4 per MoE layer per micro-batch (k = {model.top_k} fp32 "
                            f"gates per token)"))
        if not layout.sp:
            biases = sum(p.numel for p in stage_tensors(model, layout, stage)
                         if is_expert(p) and not p.tp_sharded) // layout.ep
            if biases:
                out.append(transfer("all_reduce (expert output biases)",
                                    theory.sequence_parallel_grad_bytes(biases, t, e, m), m,
                                    f"2(t−1)/t·b·{biases:,} expert output-bias elements (added on one tp rank), "
                                    "per backward"))
    return out


def pp_transfers(layout, cluster, model, stage: int) -> list:
    p = layout.pp
    if p <= 1:
        return []
    e = theory.param_bytes_per_element(layout.precision)
    m = layout.micro_batches
    one_way = theory.pipeline_p2p_bytes(model.seq_len // layout.cp, layout.micro_batch_size, model.hidden, m, e, layout.tp,
                                        layout.sp)
    directions = (stage < p - 1) + (stage > 0)
    link = axis_link(cluster, layout.degrees(), "pp")
    nbytes = directions * one_way
    return [Transfer("pp", "send/recv", nbytes, directions * m, link.name,
                     theory.link_seconds(nbytes, directions * m, link.bandwidth, link.latency),
                     f"m·s·b·h·e per boundary each way{' / t (sequence parallel)' if layout.sp else ''}; stage "
                     f"{stage} sends {'forward and backward' if directions == 2 else 'one way'}",
                     _leaving(layout, cluster, "pp", nbytes))]


def cp_transfers(layout, cluster, model, stage: int = 0) -> list:
    """Context parallelism's bytes of one rank per step: every attention layer's ring sends or Ulysses all-to-alls,
    forward and backward (the forward again when checkpointing recomputes it), per micro-batch."""
    cp = layout.cp
    if cp <= 1:
        return []
    e = theory.param_bytes_per_element(layout.precision)
    t, m, att = layout.tp, layout.micro_batches, layout.cp_attention
    mine = stage_layers(model, layout, stage)  # each layer's self-attention, and its cross-attention if it has one
    calls_per = len(mine) + sum(1 for i in mine if i >= model.layers - model.cross_attention_layers)
    per = cp_theory.cp_attention_bytes(att, cp, model.seq_len, layout.micro_batch_size, model.q_dim // t,
                                       model.kv_dim // t, e)
    calls = cp_theory.cp_attention_calls(att, cp)
    forwards = 2 if layout.checkpointing != "none" else 1
    nbytes = calls_per * m * (forwards * per["forward"] + per["backward"])
    n_calls = calls_per * m * (forwards * calls["forward"] + calls["backward"])
    link = axis_link(cluster, layout.degrees(), "cp")
    rounds = 1 if att == "ring" else cp - 1  # a ring step is one message; an all-to-all cp − 1
    formula = ("ring: forward 2(cp−1)·|K|, backward 4(cp−1)·|K| + 2·|K|, |K| = b·(s/cp)·kv_dim·e"
               if att == "ring" else "Ulysses: 4 all-to-alls each way (q, k, v, output), together (cp−1)/cp·b·(s/cp)·(2q + 2kv)·e")
    out = [Transfer("cp", "send/recv (ring attention)" if att == "ring" else "all_to_all (Ulysses)", nbytes,
                    n_calls, link.name, theory.link_seconds(nbytes, n_calls * rounds, link.bandwidth, link.latency),
                    f"{formula}; per attention layer and micro-batch"
                    f"{', forward twice (recomputed)' if forwards == 2 else ''}, {calls_per} layers, cp = {cp}",
                    _leaving(layout, cluster, "cp", nbytes))]
    if model.moe:  # the load-balancing loss's per-sequence statistics, summed over the cp ranks' chunks
        layers = len(mine)
        aux = layers * m * cp_theory.moe_aux_cp_bytes(layout.micro_batch_size, model.experts, cp)
        out.append(Transfer("cp", "all_reduce (MoE load-balancing statistics)", aux, 3 * layers * m, link.name,
                            theory.link_seconds(aux, 3 * layers * m * _rounds("all_reduce", cp), link.bandwidth,
                                                link.latency),
                            "3 · 2(cp−1)/cp · b · E · 4 per MoE layer and micro-batch (slots and probability mass per "
                            "expert and sequence, forward; the mass's gradient, backward)",
                            _leaving(layout, cluster, "cp", aux)))
    return out


def ep_transfers(layout, cluster, model, stage: int = 0) -> list:
    """Expert parallelism's all-to-alls of one rank per step, under uniform routing (each MoE layer: counts,
    dispatch with expert ids and combine in forward, their gradients in backward; per micro-batch)."""
    ep = layout.ep
    if ep <= 1:
        return []
    e = theory.param_bytes_per_element(layout.precision)
    m, layers = layout.micro_batches, len(stage_layers(model, layout, stage))
    tokens = layout.micro_batch_size * model.seq_len // layout.cp
    per = ep_theory.moe_alltoall_bytes_uniform(tokens, model.top_k, model.hidden, e, ep)
    forwards = 2 if layout.checkpointing != "none" else 1
    nbytes = float(layers * m * (forwards * per["forward"] + per["backward"]))
    n_calls = layers * m * (forwards * 4 + 2)
    link = group_link(cluster, ep, layout.tp * layout.cp)
    leaving = float(theory.ring_bytes_leaving_a_node(nbytes, ep, layout.tp * layout.cp, cluster.gpus_per_node))
    return [Transfer("ep", "all_to_all (dispatch, combine)", nbytes, n_calls, link.name,
                     theory.link_seconds(nbytes, n_calls * (ep - 1), link.bandwidth, link.latency),
                     f"uniform routing (assumed): S = T·k·(ep−1)/ep rows leave per layer, T = {tokens:,} tokens, "
                     f"k = {model.top_k}; forward 8(ep−1) + (2h·b + 4)·S, backward 2h·b·S; {layers} MoE layers × "
                     f"{m} micro-batches{', forward twice (recomputed)' if forwards == 2 else ''}, ep = {ep}",
                     leaving)]


def host_transfers(layout, cluster, psi: int) -> list:
    if layout.offload == "none":
        return []
    shard = -(-psi // (layout.dp * layout.cp))
    m = layout.micro_batches
    link = cluster.host()
    nbytes = theory.offload_traffic_bytes_accumulated(shard, 2, m)
    out = [Transfer("host", "gradients out, parameters back", nbytes, m + 1, link.name,
                    theory.link_seconds(nbytes, m + 1, link.bandwidth, link.latency),
                    "(A + 1)·2·Ψ/N: each micro-batch's gradient shard out, the updated 16-bit shard back")]
    if layout.offload == "params":
        extra = theory.param_offload_traffic_bytes(shard, 2, m)
        out.append(Transfer("host", "parameter shards in", extra, 2 * m, link.name,
                            theory.link_seconds(extra, 2 * m, link.bandwidth, link.latency),
                            "2A·2·Ψ/N: each gather first fetches the shard from the host"))
    return out


def transfers(model, layout, cluster, memory) -> list:
    """Every transfer of one rank of the stage ``memory`` describes."""
    out = dp_transfers(layout, cluster, memory.psi_rank, memory.units, memory.expert_psi, memory.expert_units)
    if model.has_shape:
        out += cp_transfers(layout, cluster, model, memory.stage)
        out += ep_transfers(layout, cluster, model, memory.stage)
        out += tp_transfers(layout, cluster, model, memory.stage)
        out += pp_transfers(layout, cluster, model, memory.stage)
    return out + host_transfers(layout, cluster, memory.psi_rank)


def by_axis(items: list) -> dict:
    """Bytes per step per axis: ``{"dp": …, "tp": …, "pp": …, "host": …}`` (axes with traffic)."""
    out: dict = {}
    for item in items:
        out[item.axis] = out.get(item.axis, 0) + item.bytes
    return out


def by_link(items: list) -> dict:
    """Bytes per step per link: ``{"intra-node": …, "inter-node": …, "host (PCIe)": …}`` (links with traffic)."""
    out: dict = {}
    for item in items:
        out[item.link] = out.get(item.link, 0) + item.bytes
    return out


def bubble(layout) -> dict:
    """The pipeline bubble: share of wall time idle, and over ideal compute (GPipe; Megatron §2.2)."""
    p, m = layout.pp, layout.micro_batches
    return {"fraction_of_wall_time": theory.bubble_fraction(p, m), "over_ideal": theory.bubble_over_ideal(p, m),
            "formula": "(p − 1)/(m + p − 1) of wall time, (p − 1)/m over ideal", "p": p, "m": m}
