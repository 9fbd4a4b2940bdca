"""Named systems: the GPUs, memory and links of the machines zerokit plans for and emulates, each figure sourced.

One table, read by both sides of zerokit that speak of links:

- the planner (:mod:`zerokit.planner`): ``zerokit plan --gpu h100`` / ``plan(system="dgx-h100")``
  takes the system's peak, memory, GPUs per node and its three links together (intra-node,
  inter-node, host); its default is :data:`DEFAULT_SYSTEM`;
- the emulated links (:mod:`zerokit.runtime.link`): every preset of ``link=`` is a link of
  :data:`LINKS`, and a system's name (``link="dgx-h100"``) is its two tiers, fast inside a node
  and slow between nodes.

Bandwidths are bytes per second **one direction, per GPU**. NVIDIA's datasheets give NVLink as a
bidirectional total (A100: 600 GB/s, H100: 900 GB/s), so a GPU sends half of it: 300 and 450 GB/s.
A network card's rate is in bits: 200 Gb/s HDR InfiniBand is 25 GB/s, 400 Gb/s NDR is 50 GB/s.

Latencies are seconds per message round, as zerokit's α-β model takes them
(:func:`zerokit.theory.link_seconds`): NCCL's own tuning model charges a ring step about 3.4 µs
over NVLink, 5.7 µs over PCIe and 9.6 µs over the network with its Simple protocol (NCCL
``src/graph/tuning.cc``, ``hwLat``), rounded here to 3, 5 and 10 µs; Ethernet through the kernel's
TCP stack 30 µs (10 GbE) and 50 µs (1 GbE), typical round trips.

Peaks are :data:`zerokit.theory.step_time.GPU_PEAK_FLOPS` (dense 16-bit, NVIDIA's datasheets).
"""
from __future__ import annotations

from dataclasses import dataclass

from .step_time import GPU_PEAK_FLOPS


@dataclass(frozen=True)
class LinkSpec:
    """One kind of link: ``bandwidth`` bytes per second one direction per GPU, ``latency`` seconds per message."""

    name: str
    bandwidth: float
    latency: float
    #: what it is, in words
    what: str
    #: where the figures come from
    source: str


@dataclass(frozen=True)
class GPUSpec:
    """A GPU: its dense 16-bit peak (FLOP/s) and its memory (bytes)."""

    name: str
    peak_flops: float
    memory: float
    what: str
    source: str


@dataclass(frozen=True)
class System:
    """A named machine: ``gpus_per_node`` GPUs of one kind, the links inside a node, between nodes and to the host."""

    name: str
    title: str
    gpu: GPUSpec
    gpus_per_node: int
    intra: LinkSpec
    inter: LinkSpec
    host: LinkSpec
    source: str

    def describe(self) -> str:
        """One line: the GPUs and the three links by name (their figures are the cluster's)."""
        return (f"{self.title} — {self.gpus_per_node}× {self.gpu.what}, {self.intra.what} inside a node, "
                f"{self.inter.what} between nodes, {self.host.what} to the host")


_NCCL_LATENCY = "latency: NCCL's ring-step model (src/graph/tuning.cc hwLat, Simple protocol)"

#: every named link, one direction per GPU
LINKS = {
    "nvlink3": LinkSpec("nvlink3", 300e9, 3e-6, "NVLink 3",
                        "NVIDIA A100 datasheet: NVLink 600 GB/s bidirectional per GPU = 300 GB/s each way; "
                        + _NCCL_LATENCY + " 3.4 µs"),
    "nvlink4": LinkSpec("nvlink4", 450e9, 3e-6, "NVLink 4",
                        "NVIDIA H100 datasheet: NVLink 900 GB/s bidirectional per GPU = 450 GB/s each way; "
                        + _NCCL_LATENCY + " 3.4 µs"),
    "pcie4": LinkSpec("pcie4", 25e9, 5e-6, "PCIe 4.0 ×16",
                      "PCI-SIG PCIe 4.0: 31.5 GB/s raw per direction (A100 PCIe datasheet: 64 GB/s both ways); "
                      "about 25 GB/s reached (CUDA bandwidthTest); " + _NCCL_LATENCY + " 5.7 µs"),
    "pcie5": LinkSpec("pcie5", 50e9, 5e-6, "PCIe 5.0 ×16",
                      "PCI-SIG PCIe 5.0: 63 GB/s raw per direction (H100 datasheet: 128 GB/s both ways); 50 GB/s "
                      "taken as reached, the same 80 % of raw as PCIe 4's 25 of 31.5 (an assumption); "
                      + _NCCL_LATENCY + " 5.7 µs"),
    "ib-100g": LinkSpec("ib-100g", 12.5e9, 10e-6, "InfiniBand EDR 100 Gb/s",
                        "InfiniBand Trade Association: EDR 100 Gb/s = 12.5 GB/s line rate; " + _NCCL_LATENCY
                        + " 9.6 µs"),
    "ib-200g": LinkSpec("ib-200g", 25e9, 10e-6, "InfiniBand HDR 200 Gb/s",
                        "NVIDIA DGX A100 datasheet: 8× single-port ConnectX-6 VPI, 200 Gb/s HDR InfiniBand = 25 GB/s "
                        "per GPU; " + _NCCL_LATENCY + " 9.6 µs"),
    "ib-400g": LinkSpec("ib-400g", 50e9, 10e-6, "InfiniBand NDR 400 Gb/s",
                        "NVIDIA DGX H100 datasheet: 8× single-port ConnectX-7 VPI, 400 Gb/s NDR InfiniBand = 50 GB/s "
                        "per GPU; " + _NCCL_LATENCY + " 9.6 µs"),
    "10gbe": LinkSpec("10gbe", 1.25e9, 30e-6, "10 Gb Ethernet",
                      "IEEE 802.3ae: 10 Gb/s = 1.25 GB/s line rate; latency: 20-50 µs TCP round trips through the "
                      "kernel stack"),
    "1gbe": LinkSpec("1gbe", 125e6, 50e-6, "1 Gb Ethernet",
                     "IEEE 802.3ab: 1 Gb/s = 125 MB/s line rate; latency: TCP through the kernel stack"),
}

#: the GPUs the systems are built of
GPUS = {
    "a100": GPUSpec("a100", GPU_PEAK_FLOPS["a100"], 80e9, "A100 SXM4 80 GB",
                    "NVIDIA A100 datasheet: 312 TFLOP/s BF16 dense, 80 GB HBM2e"),
    "a100-pcie": GPUSpec("a100-pcie", GPU_PEAK_FLOPS["a100"], 80e9, "A100 PCIe 80 GB",
                         "NVIDIA A100 datasheet (PCIe column): 312 TFLOP/s BF16 dense, 80 GB HBM2e"),
    "h100": GPUSpec("h100", GPU_PEAK_FLOPS["h100"], 80e9, "H100 SXM5 80 GB",
                    "NVIDIA H100 datasheet: 989 TFLOP/s BF16 dense (1,979 with sparsity), 80 GB HBM3"),
    "h200": GPUSpec("h200", GPU_PEAK_FLOPS["h200"], 141e9, "H200 SXM 141 GB",
                    "NVIDIA H200 datasheet: 989 TFLOP/s BF16 dense, 141 GB HBM3e"),
}

#: the named systems; ``gpus_per_node`` 8 in each
SYSTEMS = {
    "dgx-a100": System("dgx-a100", "DGX A100", GPUS["a100"], 8, LINKS["nvlink3"], LINKS["ib-200g"], LINKS["pcie4"],
                       "NVIDIA DGX A100 datasheet: 8× A100 80 GB, 6 NVSwitches (600 GB/s bidirectional per GPU), "
                       "8× 200 Gb/s HDR InfiniBand, PCIe 4.0"),
    "dgx-h100": System("dgx-h100", "DGX H100", GPUS["h100"], 8, LINKS["nvlink4"], LINKS["ib-400g"], LINKS["pcie5"],
                       "NVIDIA DGX H100 datasheet: 8× H100 80 GB, 4 NVSwitches (900 GB/s bidirectional per GPU), "
                       "8× 400 Gb/s NDR InfiniBand (ConnectX-7), PCIe 5.0"),
    "dgx-h200": System("dgx-h200", "DGX H200", GPUS["h200"], 8, LINKS["nvlink4"], LINKS["ib-400g"], LINKS["pcie5"],
                       "NVIDIA DGX H200 datasheet: 8× H200 141 GB, 4 NVSwitches (900 GB/s bidirectional per GPU), "
                       "8× 400 Gb/s NDR InfiniBand (ConnectX-7), PCIe 5.0"),
    "pcie-box": System("pcie-box", "PCIe box", GPUS["a100-pcie"], 8, LINKS["pcie4"], LINKS["ib-100g"],
                       LINKS["pcie4"],
                       "8× A100 PCIe 80 GB in one server, no NVLink: GPU to GPU over PCIe 4.0; nodes joined by one "
                       "100 Gb/s EDR InfiniBand card, the ring's one rail (an assumed build, not a product)"),
    "pcie-10gbe": System("pcie-10gbe", "PCIe box on 10 GbE", GPUS["a100-pcie"], 8, LINKS["pcie4"], LINKS["10gbe"],
                         LINKS["pcie4"],
                         "the PCIe box with its nodes joined by one 10 Gb Ethernet port (an assumed build: "
                         "workstations on an office network)"),
}

#: what the planner assumes when no system is named
DEFAULT_SYSTEM = "dgx-a100"

#: a GPU's name -> the system it is planned in (``--gpu h100``: a DGX H100)
GPU_SYSTEMS = {"a100": "dgx-a100", "h100": "dgx-h100", "h200": "dgx-h200"}

#: the smallest bandwidth taken as bytes per second: anything under it was surely meant in GB/s
MIN_BANDWIDTH = 1e6


def system(name: str) -> System:
    """A system by its name (``dgx-h100``) or its GPU's (``h100``: the DGX H100); a ValueError lists the names."""
    key = str(name).strip().lower()
    key = GPU_SYSTEMS.get(key, key)
    if key not in SYSTEMS:
        raise ValueError(f"system={name!r}; allowed: a GPU ({', '.join(GPU_SYSTEMS)}) or a system "
                         f"({', '.join(SYSTEMS)})")
    return SYSTEMS[key]


def check_bandwidth(name: str, value) -> float:
    """A bandwidth in bytes per second, refused under :data:`MIN_BANDWIDTH` (a figure in GB/s given as bytes)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value == value or value <= 0 \
            or value == float("inf"):
        raise ValueError(f"{name}={value!r} must be a positive number of bytes per second")
    if value < MIN_BANDWIDTH:
        raise ValueError(f"{name}={value!r} is in bytes per second: under 1 MB/s, surely meant as GB/s; write "
                         f"{value:g}e9 for {value:g} GB/s (the command line's bandwidth flags take GB/s)")
    return float(value)
