"""The cluster: how many GPUs, their memory, how they are grouped in nodes, and the links between them.

A cluster is built of a named system (:mod:`zerokit.theory.systems`, the table the emulated
links read too); the default is a DGX A100: 8 GPUs of 80 GB per node, NVLink 3 inside a node
(300 GB/s per GPU each way), one 200 Gb/s HDR InfiniBand card per GPU between nodes (25 GB/s),
PCIe 4 to the host (25 GB/s). ``system="dgx-h100"`` (or ``--gpu h100``) takes another's figures
together; any figure given on its own overrides the system's. Every plan prints the system it
assumed and marks each figure given apart from it. Bandwidths are bytes per second: one under
1 MB/s is refused as a figure meant in GB/s.

:func:`axis_link` says which link an axis of the mesh runs on. Ranks are laid out as
:mod:`zerokit.runtime.mesh` lays them out — ``tp`` innermost, then ``cp``, ``dp``,
``pp`` outermost (``ep`` is ep consecutive dp ranks) — so an axis's group spans ``stride × degree`` consecutive ranks (stride: the
product of the degrees inside it). If that span fits in one node, the axis uses the
intra-node link; otherwise its ring crosses nodes and the slower inter-node link bounds it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..theory import systems


@dataclass(frozen=True)
class Link:
    name: str
    #: bytes per second, one direction, per GPU
    bandwidth: float
    #: seconds per message
    latency: float


_DEFAULT = systems.SYSTEMS[systems.DEFAULT_SYSTEM]


@dataclass(frozen=True)
class Cluster:
    gpus: int = 8
    #: bytes per GPU
    gpu_memory: float = _DEFAULT.gpu.memory
    gpus_per_node: int = _DEFAULT.gpus_per_node
    #: bytes per second, one direction, per GPU (not GB/s: under 1 MB/s is refused)
    intra_bandwidth: float = _DEFAULT.intra.bandwidth
    inter_bandwidth: float = _DEFAULT.inter.bandwidth
    intra_latency: float = _DEFAULT.intra.latency
    inter_latency: float = _DEFAULT.inter.latency
    host_bandwidth: float = _DEFAULT.host.bandwidth
    #: host memory per node, bytes (None: not checked)
    host_memory: float | None = None
    #: the named system (:data:`zerokit.theory.systems.SYSTEMS`) the figures not given come from
    system: str = systems.DEFAULT_SYSTEM

    @classmethod
    def of(cls, system: str = systems.DEFAULT_SYSTEM, **given) -> "Cluster":
        """A cluster of ``system`` (a system's name or its GPU's: ``"h100"``), ``given`` figures overriding its."""
        spec = systems.system(system)
        figures = dict(gpu_memory=spec.gpu.memory, gpus_per_node=spec.gpus_per_node,
                       intra_bandwidth=spec.intra.bandwidth, inter_bandwidth=spec.inter.bandwidth,
                       intra_latency=spec.intra.latency, inter_latency=spec.inter.latency,
                       host_bandwidth=spec.host.bandwidth)
        return cls(**(figures | {k: v for k, v in given.items() if v is not None}), system=spec.name)

    @property
    def spec(self) -> systems.System:
        return systems.system(self.system)

    def given(self) -> list:
        """The figures that differ from the system's, by field name."""
        spec = self.spec
        theirs = dict(gpu_memory=spec.gpu.memory, gpus_per_node=spec.gpus_per_node,
                      intra_bandwidth=spec.intra.bandwidth, inter_bandwidth=spec.inter.bandwidth,
                      intra_latency=spec.intra.latency, inter_latency=spec.inter.latency,
                      host_bandwidth=spec.host.bandwidth)
        return [name for name, value in theirs.items() if getattr(self, name) != value]

    @property
    def assumptions(self) -> tuple:
        """The links as planned, each marked with the system's link it stands for, or "given"."""
        spec, given = self.spec, set(self.given())

        def mark(names, link):
            return "given" if given & set(names) else f"{spec.title}: {link.what}"

        return (f"intra-node {self.intra_bandwidth / 1e9:g} GB/s per GPU each way, {self.intra_latency * 1e6:g} µs "
                f"per message ({mark(('intra_bandwidth', 'intra_latency'), spec.intra)})",
                f"inter-node {self.inter_bandwidth / 1e9:g} GB/s per GPU, {self.inter_latency * 1e6:g} µs per message "
                f"({mark(('inter_bandwidth', 'inter_latency'), spec.inter)})",
                f"host {self.host_bandwidth / 1e9:g} GB/s per GPU ({mark(('host_bandwidth',), spec.host)})")

    def __post_init__(self):
        # a name of the table (a GPU's name stands for its system), or a ValueError listing them
        object.__setattr__(self, "system", systems.system(self.system).name)
        for name in ("gpus", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive whole number")
        value = self.gpu_memory
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"gpu_memory={value!r} must be a positive number")
        for name in ("intra_bandwidth", "inter_bandwidth", "host_bandwidth"):
            systems.check_bandwidth(name, getattr(self, name))
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

    def describe_system(self) -> str:
        """The system assumed, and which of its figures were given instead."""
        given = self.given()
        default = " (the default; another: --gpu h100, --system NAME or plan(system=...))" \
            if self.system == systems.DEFAULT_SYSTEM else ""
        return (f"{self.spec.describe()}{default}"
                + (f"; given instead of its figures: {', '.join(given)}" if given else ""))


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
