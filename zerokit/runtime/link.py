"""An emulated link: collectives run for real on the backend, and complete when an α-β link says so.

On this machine the ranks talk through shared memory, so communication is nearly free
next to compute and overlap has nothing to hide. ``zerokit.train(..., link="10gbe")``
puts each rank behind a modelled link instead:

- a :class:`Link` is a latency ``alpha_s`` (seconds per message round) and a
  ``bandwidth_Bps`` (bytes per second, one direction; β = 1/bandwidth seconds per byte);
- each collective **still runs on the backend** (gloo), with real data; when it is
  launched, :class:`LinkClock` books it on this rank's link: it starts at
  max(launch time, the moment the link is free) — transfers on one link are serialised —
  and takes rounds·α + bytes·β, where bytes are the ring cost this rank sends
  (:func:`zerokit.theory.ring_bytes_sent`) and rounds the ring's send/recv rounds
  (:func:`zerokit.theory.ring_steps`; one message for a send, a receive or a broadcast);
  the time is :func:`zerokit.theory.link_seconds`;
- its completion is held until then with ``time.sleep`` (the compute thread keeps the
  CPU while it sleeps): a synchronous call sleeps right after the backend returns, an
  asynchronous one at ``wait`` for whatever of the emulated time has not yet passed — so
  an overlapped all-reduce really hides its emulated time behind the backward compute;
- a receive cannot know when its sender sent; it books its transfer from the moment the
  backend delivered the data (≈ when the sender sent, on shared memory), for the bytes
  received.

The ledger keeps what was emulated apart from what was measured: every record carries
``emulated_s`` (the link's time for it, a formula) and ``held_s`` (seconds the rank slept
waiting for the emulated completion, part of the measured ``blocked_s``) and ``link``
(the link's name). Without a link nothing is booked and nothing sleeps.

Presets (one direction, per rank) are the links of :data:`zerokit.theory.systems.LINKS`, the table the
planner reads too, each figure with its source there:

- ``"nvlink3"``: 300 GB/s, 3 µs — NVLink 3 on A100 SXM (600 GB/s bidirectional);
- ``"nvlink4"``: 450 GB/s, 3 µs — NVLink 4 on H100/H200 SXM (900 GB/s bidirectional);
  ``"nvlink"`` is its old name, kept;
- ``"pcie4"``: 25 GB/s, 5 µs — PCIe 4.0 ×16, about 25 of its 31.5 GB/s reached; ``"pcie"`` is its old
  name, kept; ``"pcie5"``: 50 GB/s, 5 µs;
- ``"ib-100g"``, ``"ib-200g"``, ``"ib-400g"``: 12.5, 25 and 50 GB/s, 10 µs — InfiniBand EDR, HDR
  (a DGX A100's card per GPU) and NDR (a DGX H100's);
- ``"10gbe"``: 1.25 GB/s, 30 µs and ``"1gbe"``: 125 MB/s, 50 µs — Ethernet through the kernel's TCP
  stack; 1 GbE is slower than this machine's gloo over shared memory even for large payloads, so its
  holds show on a CPU;
- a named system (``"dgx-a100"``, ``"dgx-h100"``, ``"dgx-h200"``, ``"pcie-box"``, ``"pcie-10gbe"``):
  its two tiers, e.g. ``"dgx-h100"`` is ``"nvlink4/ib-400g"`` (see below);
- ``"this machine"`` (or None, "none"): no link — the backend's own speed.

The latencies are NCCL's own ring-step model, rounded (3.4 µs over NVLink, 5.7 over PCIe, 9.6 over
the network).

A link is emulated on gloo only: on NCCL the sleep would delay the CPU thread, not the
CUDA stream the collective runs on, so it is refused there (:func:`check_backend`).

A link only ever delays: completion is the later of the backend's and the link's, so a
link faster than the backend itself (10 GbE against gloo on two busy shared cores, for
megabytes) holds nothing — ``held_s`` stays 0.

Two tiers, as a cluster has them: ``link="nvlink/10gbe"`` (or ``TieredLink("nvlink", "10gbe")``,
each tier a preset name or a :class:`Link`) is fast inside a node and slow between nodes. The
nodes are :mod:`.nodes`' (torchrun's ``LOCAL_WORLD_SIZE``, or ``zerokit.launch(...,
ranks_per_node=k)`` / ``zerokit.train(..., ranks_per_node=k)`` on one machine). Each
collective books the tier of its group: the intra-node tier when every rank of the group is on
this rank's node, else the inter-node one (:func:`.nodes.spans_nodes` of the group's ranks, read
from the mesh axis the ledger names the group by; a group the mesh does not name counts as the
world). Each tier is a link of its own, with its own queue: an all-reduce inside the node does
not wait behind one between nodes. A record's ``link`` names the tier's link (``"nvlink"`` or
``"10gbe"``). A send or a receive books its group's tier too: the booking sees the group, not
the peer, so a pipeline's point-to-point group that spans nodes books the inter-node tier for
every neighbour.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Optional, Tuple, Union

from .. import theory
from ..theory import systems
from . import context, nodes


@dataclass(frozen=True)
class Link:
    """A modelled link: ``alpha_s`` seconds per message round, ``bandwidth_Bps`` bytes per second."""

    name: str
    alpha_s: float
    bandwidth_Bps: float

    def __post_init__(self):
        for field, value in (("alpha_s", self.alpha_s), ("bandwidth_Bps", self.bandwidth_Bps)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"link: {field}={value!r} must be a finite number")
        if self.alpha_s < 0:
            raise ValueError(f"link: alpha_s={self.alpha_s!r} must be >= 0 seconds")
        if self.bandwidth_Bps <= 0:
            raise ValueError(f"link: bandwidth_Bps={self.bandwidth_Bps!r} must be > 0 bytes per second")

    def rounds(self, op: str, n: int) -> int:
        """Message rounds of ``op`` on ``n`` ranks: the ring's for the reductions and gathers, else one."""
        if n <= 1 and op not in ("send", "recv"):
            return 0
        if op in ("all_reduce", "reduce_scatter", "all_gather"):
            return theory.ring_steps(op, n)
        return 1

    def seconds(self, op: str, nbytes: float, n: int) -> float:
        """The link's time for ``op`` moving ``nbytes`` from this rank: rounds·α + bytes·β (a formula)."""
        return theory.link_seconds(nbytes, self.rounds(op, n), self.bandwidth_Bps, self.alpha_s)


#: the old preset names, kept: the link of the table each one is
ALIASES = {"nvlink": "nvlink4", "pcie": "pcie4"}

#: the named links (one direction, per rank): :data:`zerokit.theory.systems.LINKS`, and the old names
LINKS = {name: Link(name, spec.latency, spec.bandwidth)
         for name, spec in [*systems.LINKS.items(), *((old, systems.LINKS[new]) for old, new in ALIASES.items())]}
#: a named system's two tiers (intra-node, inter-node), as link names
SYSTEM_TIERS = {name: (s.intra.name, s.inter.name) for name, s in systems.SYSTEMS.items()}
#: names meaning "no emulated link": the backend's own speed
NO_LINK = ("this machine", "none")
#: what ``link=`` accepts by name
PRESETS = (*LINKS, *SYSTEM_TIERS, "this machine")


@dataclass(frozen=True)
class TieredLink:
    """Two links: ``intra`` between ranks of one node, ``inter`` between nodes (each a preset name or a
    :class:`Link`); named ``"intra/inter"``, as ``link=`` takes it."""

    intra: Union[str, Link]
    inter: Union[str, Link]

    def __post_init__(self):
        for field, value in (("intra", self.intra), ("inter", self.inter)):
            tier = LINKS.get(value) if isinstance(value, str) else value
            if not isinstance(tier, Link):
                raise ValueError(f"TieredLink: {field}={value!r}; each tier is one of "
                                 f"{', '.join(map(repr, LINKS))} or a zerokit.Link")
            object.__setattr__(self, field, tier)

    @property
    def name(self) -> str:
        return f"{self.intra.name}/{self.inter.name}"

    def tier(self, ranks, per_node: int) -> Link:
        """The link a collective over global ``ranks`` runs on: ``inter`` when they span nodes, else ``intra``."""
        return self.inter if nodes.spans_nodes(ranks, per_node) else self.intra


def _allowed(link) -> str:
    return (f"link={link!r}; allowed: one of {', '.join(repr(p) for p in PRESETS)}, None, "
            f"zerokit.Link(name, alpha_s, bandwidth_Bps) with alpha_s >= 0 and bandwidth_Bps > 0, or two tiers "
            f"'intra/inter' (e.g. 'nvlink/10gbe': fast inside a node, slow between nodes; a named system such as "
            f"'dgx-h100' is its two tiers) or "
            f"zerokit.links.TieredLink(intra, inter)")


def resolve(link: Union[str, Link, TieredLink, None]) -> Union[Link, TieredLink, None]:
    """``link=`` as given → a :class:`Link` or :class:`TieredLink` (None for none), or a ValueError naming what is
    allowed."""
    if link is None or isinstance(link, (Link, TieredLink)):
        return link
    if isinstance(link, str):
        if link in LINKS:
            return LINKS[link]
        if link in NO_LINK:
            return None
        if link in SYSTEM_TIERS:  # a named system: fast inside a node, slow between nodes
            return TieredLink(*SYSTEM_TIERS[link])
        if "/" in link:
            tiers = link.split("/")
            unknown = [t for t in tiers if t not in LINKS]
            if len(tiers) != 2 or unknown:
                why = (f"{len(tiers)} tiers, two wanted (intra-node/inter-node)" if len(tiers) != 2 else
                       f"unknown tier {', '.join(map(repr, unknown))}")
                raise ValueError(f"{_allowed(link)}: {why}; a tier is one of {', '.join(map(repr, LINKS))}")
            return TieredLink(*tiers)
    raise ValueError(_allowed(link))


def custom(alpha_s: float, bandwidth_Bps: float, name: str = "custom") -> Link:
    """A link of your own figures (``link=zerokit.links.custom(1e-3, 50e6)``), checked."""
    return Link(name, alpha_s, bandwidth_Bps)


class LinkClock:
    """This rank's link: books each transfer after the previous one on its link, and holds completions until due.
    With a :class:`TieredLink` each tier is a link of its own, with its own queue."""

    def __init__(self, link: Union[Link, TieredLink]):
        self.link = link
        #: perf_counter time at which each tier ("intra", "inter"; "link" for one link) finishes what is booked on it
        self.free: dict = {}
        #: ranks per node, read at the first booking (the world's size is known then)
        self._per_node: Optional[int] = None

    @property
    def free_at(self) -> float:
        """When the last tier to finish is free (one tier: its link's queue)."""
        return max(self.free.values(), default=0.0)

    def tier(self, record) -> Tuple[str, Link]:
        """(which tier, its link) ``record``'s transfer runs on: the link itself, or the tier of the record's group."""
        if isinstance(self.link, Link):
            return "link", self.link
        ranks, world = _group_ranks(record.axis)
        if self._per_node is None:
            self._per_node = nodes.ranks_per_node(world)
        if nodes.spans_nodes(ranks, self._per_node):
            return "inter", self.link.inter
        return "intra", self.link.intra

    def book(self, record, start: Optional[float] = None) -> None:
        """Book ``record``'s transfer from ``start`` (default: its launch) or when its tier frees up."""
        tier, link = self.tier(record)
        nbytes = record.payload_bytes if record.op == "recv" else record.ring_cost_bytes
        record.emulated_s = link.seconds(record.op, nbytes, record.group_size)
        begin = max(record.t_launch if start is None else start, self.free.get(tier, 0.0))
        self.free[tier] = record.emulated_end = begin + record.emulated_s
        record.link = link.name

    @staticmethod
    def hold(record) -> float:
        """Sleep until ``record``'s emulated completion; returns the seconds slept (also added to ``held_s``)."""
        due = record.emulated_end
        if due is None:
            return 0.0
        start = time.perf_counter()
        if due <= start:
            return 0.0
        time.sleep(due - start)
        slept = time.perf_counter() - start
        record.held_s += slept
        return slept


def _group_ranks(axis: str):
    """(the global ranks of this rank's group along mesh ``axis``, the world's size); the world's ranks for "world"
    or outside a rank context."""
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    ctx = context._current
    if ctx is None or axis == "world" or ctx._mesh is None:
        return range(world), world
    try:
        return ctx.mesh.ranks(axis), world
    except (ValueError, KeyError):  # not an axis of this mesh: counted as the world
        return range(world), world


_clock: Optional[LinkClock] = None


#: why ``link=`` is refused on NCCL
NCCL_REASON = ("an emulated link holds a collective's completion by sleeping the rank's CPU thread; on NCCL the "
               "collective runs on a CUDA stream that the sleep does not delay, so the GPU would run at the real "
               "link's speed while the ledger reported the emulated one")


def check_backend(link: Union[Link, TieredLink, None], backend: str) -> None:
    """Refuse an emulated link on NCCL, with the reason and what to do instead."""
    if link is not None and "nccl" in backend:
        raise ValueError(f"link={link.name!r} cannot be emulated on backend 'nccl': {NCCL_REASON}. On GPUs measure "
                         f"the real link (link=None); to see an emulated one, run on CPU ranks with backend='gloo'")


def set_link(link: Union[str, Link, TieredLink, None]) -> Union[Link, TieredLink, None]:
    """Put this process's collectives behind ``link`` (None: the backend's own speed); a fresh clock.
    Refused when this process's group runs on NCCL (:func:`check_backend`)."""
    global _clock
    resolved = resolve(link)
    if resolved is not None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            check_backend(resolved, str(dist.get_backend()))
    _clock = LinkClock(resolved) if resolved is not None else None
    return resolved


def clock() -> Optional[LinkClock]:
    """This process's link clock, or None when no link is emulated."""
    return _clock
