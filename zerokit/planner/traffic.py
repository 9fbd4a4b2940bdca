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
from .cluster import ORDER, axis_link, group_link
from .layout import DDP_BUCKET_BYTES


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


def dp_transfers(layout, cluster, psi: int, units) -> list:
    """Data-parallel collectives of one rank per step, by kind."""
    n, m = layout.dp, layout.micro_batches
    if n <= 1:
        return []
    if layout.hierarchical:
        return hierarchical_transfers(layout, cluster, psi, units)
    b = theory.param_bytes_per_element(layout.precision)
    link = axis_link(cluster, layout.degrees(), "dp")
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
        out.append(Transfer("dp", kind, nbytes, calls[kind], link.name,
                            theory.link_seconds(nbytes, messages, link.bandwidth, link.latency),
                            f"{formulas[kind]}, Ψ = {psi:,}, N = {n}, A = {m}",
                            _leaving(layout, cluster, "dp", nbytes)))
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
    s, b, h, m = model.seq_len, layout.micro_batch_size, model.hidden, layout.micro_batches
    layers = model.layers // layout.pp
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
        from .memory import stage_tensors

        whole = sum(p.numel for p in stage_tensors(model, layout.pp, stage) if not p.tp_sharded)
        out.append(transfer("all_reduce (sequence-parallel grads)",
                            theory.sequence_parallel_grad_bytes(whole, t, e, m), m,
                            f"2(t−1)/t·b·{whole:,} parameters kept whole (norms, row-parallel biases, positions), "
                            "per backward"))
    return out


def pp_transfers(layout, cluster, model, stage: int) -> list:
    p = layout.pp
    if p <= 1:
        return []
    e = theory.param_bytes_per_element(layout.precision)
    m = layout.micro_batches
    one_way = theory.pipeline_p2p_bytes(model.seq_len, layout.micro_batch_size, model.hidden, m, e, layout.tp,
                                        layout.sp)
    directions = (stage < p - 1) + (stage > 0)
    link = axis_link(cluster, layout.degrees(), "pp")
    nbytes = directions * one_way
    return [Transfer("pp", "send/recv", nbytes, directions * m, link.name,
                     theory.link_seconds(nbytes, directions * m, link.bandwidth, link.latency),
                     f"m·s·b·h·e per boundary each way{' / t (sequence parallel)' if layout.sp else ''}; stage "
                     f"{stage} sends {'forward and backward' if directions == 2 else 'one way'}",
                     _leaving(layout, cluster, "pp", nbytes))]


def host_transfers(layout, cluster, psi: int) -> list:
    if layout.offload == "none":
        return []
    shard = -(-psi // layout.dp)
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
    out = dp_transfers(layout, cluster, memory.psi_rank, memory.units)
    if model.has_shape:
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
