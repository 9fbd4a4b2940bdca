"""Timelines: what each rank computed and communicated, when, on one time axis.

A :class:`Tracer` on each rank records timestamped compute spans — the training loop's
"forward", "backward" and "step", and every leaf module's forward and backward — as
plain dicts. Collectives come from the communication ledger: each record's launch
(``t_launch``), the moment the rank knew it finished (``t_end``) and how long the
compute thread was *blocked* on it (``blocked_s``: the whole call for a synchronous
collective, the ``wait`` for an asynchronous one). Communication that overlaps compute
costs nothing; the blocked time is the *exposed* communication, the part that adds to
the step time.

The loop's "backward" span runs until ``engine.backward`` returns, which for a strategy
that reduces after backward includes its all-reduces: :func:`rank_timeline` ends
"backward" where the last module's backward ended and calls the rest "grad sync".
Under an emulated link (:mod:`.link`) each collective also carries the link's span
(``emulated_start`` to ``emulated_end``, kind "emulated") and ``held_s``, the part of its
blocked time the rank slept for it; :func:`straggler_waits` finds the blocked time spent
waiting for a peer that had not yet launched the same collective.

Every time is a mark of :mod:`.clock` (a CUDA event on a GPU, where a call returns at
enqueue), read as ``perf_counter`` seconds by :meth:`Tracer.events` after the run.
``time.perf_counter`` is per process, so each tracer records one ``(perf_counter,
time.time)`` pair when it starts; :func:`rank_timeline` puts every rank's spans and
collectives on the wall-clock axis with it, and :func:`zerokit.plot.timeline` draws
them as one Gantt row per rank.
"""
from __future__ import annotations

import time
import warnings
from contextlib import contextmanager
from typing import Iterator, List, Optional

import torch

from . import clock

#: event kinds a tracer records ("block": a compute span inside a module, :func:`block`)
KINDS = ("clock", "span", "forward", "backward", "block")

#: the tracer recording in this process (between :meth:`Tracer.instrument` and :meth:`Tracer.remove_hooks`)
_active: Optional["Tracer"] = None


@contextmanager
def block(name: str) -> Iterator[None]:
    """A compute span inside a module's forward or backward (ring attention's block ``s``), recorded by the
    active tracer as kind "block"; nothing without one."""
    tracer = _active
    if tracer is None:
        yield
        return
    start = clock.mark()
    try:
        yield
    finally:
        tracer._add("block", name, start, clock.mark())


class Tracer:
    """Timestamped compute events of one rank (``train(..., keep_records=True)`` makes one per rank)."""

    def __init__(self, rank: int):
        self.rank = rank
        self.perf0 = time.perf_counter()
        self.wall0 = time.time()
        self._events: list = []
        self._open: dict = {}
        self._hooks: list = []

    def _add(self, kind: str, name: str, start: float, end: float) -> None:
        self._events.append({"rank": self.rank, "kind": kind, "name": name, "start": start, "end": end})

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Record the block as one compute span called ``name``."""
        start = clock.mark()
        try:
            yield
        finally:
            self._add("span", name, start, clock.mark())

    def instrument(self, model: torch.nn.Module) -> None:
        """Record the forward and the backward of every leaf module, through module hooks."""
        # a module whose inputs need no gradient (an embedding, a first layer) gets its
        # backward hooks called as soon as its output's gradient exists; that is fine here
        global _active
        _active = self
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        for name, module in model.named_modules():
            if next(module.children(), None) is not None:
                continue
            label = name or type(module).__name__
            self._hooks += [
                module.register_forward_pre_hook(lambda m, i, label=label: self._begin("forward", label)),
                module.register_forward_hook(lambda m, i, o, label=label: self._finish("forward", label)),
                module.register_full_backward_pre_hook(lambda m, g, label=label: self._begin("backward", label)),
                module.register_full_backward_hook(lambda m, gi, go, label=label: self._finish("backward", label)),
            ]

    def _begin(self, kind: str, label: str) -> None:
        self._open[(kind, label)] = clock.mark()

    def _finish(self, kind: str, label: str) -> None:
        start = self._open.pop((kind, label), None)
        if start is not None:
            self._add(kind, label, start, clock.mark())

    def remove_hooks(self) -> None:
        global _active
        if _active is self:
            _active = None
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def events(self) -> list:
        """Every event as a plain dict (picklable), the clock pair first."""
        events = [dict(e, start=clock.seconds(e["start"]), end=clock.seconds(e["end"])) for e in self._events]
        origin = {"rank": self.rank, "kind": "clock", "name": "origin", "start": self.perf0, "end": self.perf0,
                  "wall": self.wall0}
        return [origin, *events]


# --- reading a rank's result ----------------------------------------------------------------

def _records(rank_result) -> list:
    records = getattr(rank_result, "comm_records", None)
    if records is None:
        raise ValueError(f"rank {rank_result.rank} kept no communication records; run zerokit.train(..., "
                         f"keep_records=True)")
    return records


def exposed_comm_s(rank_result, steps: Optional[range] = None) -> float:
    """Seconds this rank's compute thread was blocked on collectives in training (setup excluded).

    That is every synchronous collective's whole duration plus every ``wait`` on an
    asynchronous one: the communication that did not hide behind compute. Peers whose
    library waits internally (torch DDP) record no blocked time; their exposed time is
    not visible to the ledger. Under an emulated link it includes the sleep for the link
    (:func:`held_comm_s`).
    """
    return sum(r["blocked_s"] for r in _records(rank_result)
               if r["phase"] != "setup" and (steps is None or r["step"] in steps))


def held_comm_s(rank_result, steps: Optional[range] = None) -> float:
    """Seconds this rank slept for an emulated link's completions in training: the emulated part of
    :func:`exposed_comm_s` (0 without a link)."""
    return sum(r.get("held_s", 0.0) for r in _records(rank_result)
               if r["phase"] != "setup" and (steps is None or r["step"] in steps))


def comm_in_flight_s(rank_result, steps: Optional[range] = None) -> float:
    """Seconds from launch to known completion, summed over the training collectives."""
    return sum((r["t_end"] or r["t_launch"]) - r["t_launch"] for r in _records(rank_result)
               if r["phase"] != "setup" and (steps is None or r["step"] in steps))


def rank_timeline(rank_result) -> dict:
    """One rank's compute spans and collectives on the wall-clock axis (seconds since the epoch).

    Returns ``{"rank", "compute": [...], "modules": [...], "comm": [...], "exposed_s"}`` where
    compute entries are the loop's spans, modules the per-module forward/backward
    spans (both with the training ``step`` they belong to), and comm entries carry
    ``start``, ``end``, ``blocked_start`` (where the blocked part begins) and the
    ledger's ``op``, ``tag``, ``phase``, ``step``.
    """
    trace = getattr(rank_result, "trace", None)
    if not trace:
        raise ValueError(f"rank {rank_result.rank} has no trace; run zerokit.train(..., keep_records=True)")
    clock = next(e for e in trace if e["kind"] == "clock")
    offset = clock["wall"] - clock["start"]
    compute, step = [], 0
    for e in trace:  # the loop's spans come in order; a step ends with its "step" span
        if e["kind"] == "span":
            compute.append({**e, "start": e["start"] + offset, "end": e["end"] + offset, "step": step})
            step += e["name"] == "step"
    ends = [c["end"] for c in compute if c["name"] == "step"]
    modules = []
    for e in trace:
        if e["kind"] in ("forward", "backward", "block"):
            start = e["start"] + offset
            modules.append({**e, "start": start, "end": e["end"] + offset,
                            "step": next((k for k, end in enumerate(ends) if start <= end), len(ends))})
    compute = _split_backward(compute, modules)
    comm = []
    for r in _records(rank_result):
        end = r["t_end"] if r["t_end"] is not None else r["t_launch"]
        emulated_end = r.get("emulated_end")
        emulated = {} if emulated_end is None else {
            "kind": "emulated", "link": r["link"], "emulated_s": r["emulated_s"], "held_s": r["held_s"],
            "emulated_start": emulated_end - r["emulated_s"] + offset, "emulated_end": emulated_end + offset}
        comm.append({**emulated, "op": r["op"], "tag": r["tag"], "phase": r["phase"], "step": r["step"],
                     "algorithm": r.get("algorithm", "torch"), "axis": r.get("axis", "world"),
                     "payload_bytes": r["payload_bytes"], "ring_cost_bytes": r["ring_cost_bytes"],
                     "sent_bytes": r.get("sent_bytes"),
                     "start": r["t_launch"] + offset, "end": end + offset,
                     "blocked_start": end - r["blocked_s"] + offset, "blocked_s": r["blocked_s"]})
    return {"rank": rank_result.rank, "compute": compute, "modules": modules, "comm": comm,
            "exposed_s": exposed_comm_s(rank_result)}


def _split_backward(compute: list, modules: list) -> list:
    """End each "backward" span where its last module backward ended; the rest becomes "grad sync"."""
    out = []
    for c in compute:
        ends = [m["end"] for m in modules
                if m["kind"] == "backward" and c["name"] == "backward" and c["start"] <= m["start"] <= c["end"]]
        if not ends or max(ends) >= c["end"]:
            out.append(c)
            continue
        out.append({**c, "end": max(ends)})
        out.append({**c, "name": "grad sync", "start": max(ends)})
    return out


def overlap(rank_result, tag_prefix: str) -> dict:
    """How much of the transfers whose ledger tag starts with ``tag_prefix`` the rank's ``block`` spans covered
    (measured, training steps only): ``transfers`` (ledger records: each send and each receive),
    ``in_flight_s`` (launch to the end of the wait), ``computing_s`` (the part of that during which a block
    was being computed: the overlap) and ``blocked_s`` (the wait after it: exposed). A transfer posted before
    the block and waited after it has its whole window minus the wait covered; one waited at once has nothing
    covered."""
    line = rank_timeline(rank_result)
    blocks = [(m["start"], m["end"]) for m in line["modules"] if m["kind"] == "block"]
    out = {"transfers": 0, "in_flight_s": 0.0, "computing_s": 0.0, "blocked_s": 0.0}
    for c in line["comm"]:
        if c["phase"] == "setup" or not c["tag"].startswith(tag_prefix):
            continue
        out["transfers"] += 1
        out["in_flight_s"] += c["end"] - c["start"]
        out["blocked_s"] += c["blocked_s"]
        out["computing_s"] += sum(max(0.0, min(end, c["blocked_start"]) - max(start, c["start"]))
                                  for start, end in blocks)
    return out


def straggler_waits(lines: list) -> list:
    """The blocked time each rank spent waiting for a peer that launched the same collective later.

    ``lines``: every rank's :func:`rank_timeline` (one wall clock: the ranks share a
    machine). The k-th training collective of a step on one rank is matched with the k-th
    on the others (every rank issues the same sequence). Returns one entry per wait:
    ``rank``, ``step``, ``op``, ``start``, ``end`` (the blocked part before the last peer
    launched) and ``peer``, the rank that launched last.
    """
    by_rank = {line["rank"]: {} for line in lines}
    for line in lines:
        for c in line["comm"]:
            if c["phase"] != "setup":
                by_rank[line["rank"]].setdefault(c["step"], []).append(c)
    waits = []
    for rank, steps in by_rank.items():
        for step, calls in steps.items():
            for k, c in enumerate(calls):
                peers = {other: s[step][k] for other, s in by_rank.items()
                         if other != rank and step in s and k < len(s[step]) and s[step][k]["op"] == c["op"]}
                if not peers or c["blocked_s"] <= 0:
                    continue
                peer, late = max(((p, pc["start"]) for p, pc in peers.items()), key=lambda x: x[1])
                end = min(late, c["end"])
                if end > c["blocked_start"]:
                    waits.append({"rank": rank, "step": step, "op": c["op"], "peer": peer,
                                  "start": c["blocked_start"], "end": end})
    return waits


def ranks_of(source) -> List:
    """The RankResults of a Report (its first strategy), a StrategyResult, a list, or one RankResult."""
    if hasattr(source, "results"):
        source = source.result
    if hasattr(source, "ranks"):
        return list(source.ranks)
    if isinstance(source, (list, tuple)):
        return list(source)
    return [source]
