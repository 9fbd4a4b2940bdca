"""The cluster: how many GPUs, their memory, how they are grouped in nodes, and the links between them.

Defaults describe a common 8-GPU node: 80 GB per GPU, NVLink inside a node (300 GB/s per
GPU each way), one 200 Gb/s InfiniBand link per GPU between nodes (25 GB/s), PCIe 4
to the host (25 GB/s). They are assumptions, printed with every plan; change them.

:func:`axis_link` says which link an axis of the mesh runs on. Ranks are laid out as
:mod:`zerokit.runtime.mesh` lays them out — ``tp`` innermost, then ``cp``, ``dp``,
``pp`` outermost (``ep`` is ep consecutive dp ranks) — so an axis's group spans ``stride × degree`` consecutive ranks (stride: the
product of the degrees inside it). If that span fits in one node, the axis uses the
intra-node link; otherwise its ring crosses nodes and the slower inter-node link bounds it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    name: str
    #: bytes per second, one direction, per GPU
    bandwidth: float
    #: seconds per message
    latency: float


@dataclass(frozen=True)
class Cluster:
    gpus: int = 8
    #: bytes per GPU
    gpu_memory: float = 80e9
    gpus_per_node: int = 8
    intra_bandwidth: float = 300e9
    inter_bandwidth: float = 25e9
    intra_latency: float = 3e-6
    inter_latency: float = 10e-6
    host_bandwidth: float = 25e9
    #: host memory per node, bytes (None: not checked)
    host_memory: float | None = None

    @property
    def assumptions(self) -> tuple:
        """The links as planned, each marked with what the default stands for."""
        default = Cluster.__dataclass_fields__

        def mark(names, what):
            return what if all(getattr(self, n) == default[n].default for n in names) else "given"

        return (f"intra-node {self.intra_bandwidth / 1e9:g} GB/s per GPU each way, {self.intra_latency * 1e6:g} µs "
                f"per message ({mark(('intra_bandwidth', 'intra_latency'), 'NVLink 3')})",
                f"inter-node {self.inter_bandwidth / 1e9:g} GB/s per GPU, {self.inter_latency * 1e6:g} µs per message "
                f"({mark(('inter_bandwidth', 'inter_latency'), 'one 200 Gb/s InfiniBand link per GPU')})",
                f"host {self.host_bandwidth / 1e9:g} GB/s per GPU ({mark(('host_bandwidth',), 'PCIe 4 ×16')})")

    def __post_init__(self):
        for name in ("gpus", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive whole number")
        for name in ("gpu_memory", "intra_bandwidth", "inter_bandwidth", "host_bandwidth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive number")
        for name in ("intra_latency", "inter_latency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name}={value!r} must be a number of seconds >= 0")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise ValueError(f"gpus={self.gpus} is not a whole number of nodes of gpus_per_node="
                             f"{self.gpus_per_node}")

    @property
    def nodes(self) -> int:
        return max(1, -(-self.gpus // self.gpus_per_node))

    @property
    def gpus_in_a_node(self) -> int:
        return min(self.gpus, self.gpus_per_node)

    def intra(self) -> Link:
        return Link("intra-node", self.intra_bandwidth, self.intra_latency)

    def inter(self) -> Link:
        return Link("inter-node", self.inter_bandwidth, self.inter_latency)

    def host(self) -> Link:
        return Link("host (PCIe)", self.host_bandwidth, 0.0)

    def describe(self, unit) -> str:
        return (f"{self.gpus} GPUs ({self.nodes} node{'s' if self.nodes > 1 else ''} of {self.gpus_in_a_node}), "
                f"{unit.text(self.gpu_memory)} each; links: intra {self.intra_bandwidth / 1e9:g} GB/s, "
                f"inter {self.inter_bandwidth / 1e9:g} GB/s, host {self.host_bandwidth / 1e9:g} GB/s")


#: axes from innermost to outermost, as zerokit.runtime.mesh lays ranks out
ORDER = ("tp", "cp", "dp", "pp")


def group_link(cluster: Cluster, size: int, stride: int) -> Link:
    """The link a collective over ``size`` ranks ``stride`` apart runs on: intra-node if its span fits in a node."""
    return cluster.intra() if size * stride <= cluster.gpus_per_node else cluster.inter()


def axis_link(cluster: Cluster, degrees: dict, axis: str) -> Link:
    """The link an axis's collectives run on: intra-node if its group's span fits in one node."""
    stride = 1
    for inner in ORDER[:ORDER.index(axis)]:
        stride *= degrees[inner]
    span = stride * degrees[axis]
    return cluster.intra() if span <= cluster.gpus_per_node else cluster.inter()
