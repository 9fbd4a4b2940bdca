"""The communication ledger: one record per collective a rank issued, and sums over them.

A record (:class:`CommRecord`) keeps three traffic quantities apart, named so everywhere:
``payload_bytes`` (measured: the tensor the collective was issued on), ``ring_cost_bytes``
(a formula: the ring algorithm's bytes for that payload) and ``sent_bytes`` (measured on
the wire, only when zerokit's ring ran it). :class:`CommLedger` selects records by phase,
op and step and sums them per step, per mesh axis, and per (axis, phase, op, algorithm)
with a note where the backend is not the ring the cost assumes, or where the strategy said why it ran
this collective (``comm.note``). :mod:`.comm` fills it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from . import clock


@dataclass
class CommRecord:
    op: str
    phase: str
    step: int
    numel: int
    dtype: str
    #: measured: bytes of the tensor the collective was issued on
    payload_bytes: int
    #: formula: the ring algorithm's bytes sent by this rank for that payload
    ring_cost_bytes: float
    group_size: int
    async_op: bool
    #: when it was issued and when it completed, on the device's timeline (:mod:`.clock`): perf_counter seconds
    #: once resolved; on CUDA, until :meth:`CommLedger.resolve`, the marks (CUDA events) themselves
    t_launch: Any
    t_end: Any = None
    #: measured: seconds this rank was blocked on this collective (a sync call, or a wait); on CUDA the time its
    #: compute stream stood still for it, from CUDA events (:mod:`.clock`)
    blocked_s: float = 0.0
    algorithm: str = "torch"
    tag: str = ""
    #: measured: bytes handed to send by zerokit's ring; None when the backend ran the collective
    sent_bytes: Optional[int] = None
    #: the mesh axis of the group: dp, tp, pp, or world
    axis: str = "world"
    #: the backend that ran it (gloo's reduce-scatter is an all-reduce underneath)
    backend: str = ""
    #: emulated (a formula, :mod:`.link`): the link's rounds·α + bytes·β for this transfer; 0 without a link
    emulated_s: float = 0.0
    #: measured: seconds this rank slept for the emulated completion (part of ``blocked_s``); 0 without a link
    held_s: float = 0.0
    #: the emulated link's name; "" when the backend ran at its own speed
    link: str = ""
    #: emulated: when (perf_counter) the link finished carrying this transfer; None without a link
    emulated_end: Optional[float] = None
    #: why the strategy ran this collective where it is not the obvious one (``comm.note``; "" when not said)
    note: str = ""
    #: blocked intervals (start mark, end mark) on a GPU's timeline, not yet read; resolved into blocked_s
    _blocked_marks: Optional[list] = field(default=None, repr=False)

    def add_blocked(self, start, end) -> None:
        """This rank was blocked from mark ``start`` to mark ``end``: added now on the CPU, at resolve on a GPU."""
        if isinstance(start, float) and isinstance(end, float):
            self.blocked_s += end - start
        else:
            self._blocked_marks = (self._blocked_marks or []) + [(start, end)]

    def resolve(self) -> None:
        """Read the GPU marks (no-op on the CPU): blocked intervals into ``blocked_s``, times into seconds."""
        if self._blocked_marks is not None:
            self.blocked_s += sum(clock.elapsed(a, b) for a, b in self._blocked_marks)
            self._blocked_marks = None
        self.t_launch, self.t_end = clock.seconds(self.t_launch), clock.seconds(self.t_end)


@dataclass
class CommLedger:
    """The communication of one rank, one record per call."""

    records: list = field(default_factory=list)
    step: int = 0
    phase: str = "setup"
    enabled: bool = True
    #: blocks of ``comm.phase`` currently open (0: nobody said; see ``comm.current_phase``)
    phase_depth: int = 0
    #: the note of the innermost open ``comm.note`` block, given to every record made inside it
    note: str = ""

    def reset(self) -> None:
        self.records.clear()
        self.step = 0
        self.phase = "setup"
        self.phase_depth = 0
        self.note = ""

    def add(self, record: CommRecord) -> CommRecord:
        if self.enabled:
            self.records.append(record)
        return record

    def select(self, phase: Optional[str] = None, op: Optional[str] = None,
               steps: Optional[range] = None, exclude_setup: bool = True) -> list:
        out = []
        for r in self.records:
            if phase is not None and r.phase != phase:
                continue
            if phase is None and exclude_setup and r.phase == "setup":
                continue
            if op is not None and r.op != op:
                continue
            if steps is not None and r.step not in steps:
                continue
            out.append(r)
        return out

    def payload_bytes(self, **where) -> int:
        """Measured: bytes of the tensors the selected collectives were issued on."""
        return sum(r.payload_bytes for r in self.select(**where))

    def ring_cost_bytes(self, **where) -> float:
        """Formula: the ring algorithm's bytes sent for the selected collectives' measured payloads."""
        return sum(r.ring_cost_bytes for r in self.select(**where))

    def sent_bytes(self, **where) -> Optional[int]:
        """Measured on the wire: bytes zerokit's ring sent; None if any selected collective ran on the backend."""
        records = self.select(**where)
        if any(r.sent_bytes is None for r in records):
            return None
        return sum(r.sent_bytes for r in records)

    def calls(self, **where) -> int:
        return len(self.select(**where))

    def per_step(self, quantity: str) -> dict:
        """``payload_bytes``, ``ring_cost_bytes`` or ``sent_bytes`` summed per training step (setup excluded);
        ``sent_bytes`` of a step is None when one of its collectives ran on the backend."""
        if quantity not in TRAFFIC:
            raise ValueError(f"quantity={quantity!r}; allowed: {', '.join(TRAFFIC)}")
        per: dict = {}
        for r in self.select():
            value = getattr(r, quantity)
            if value is None or per.get(r.step, 0) is None:
                per[r.step] = None
            else:
                per[r.step] = per.get(r.step, 0) + value
        return per

    def by_axis(self) -> dict:
        """Per mesh axis: calls and the three traffic quantities, summed over the training steps."""
        out: dict = {}
        for r in self.select():
            row = out.setdefault(r.axis, {"calls": 0, "payload_bytes": 0, "ring_cost_bytes": 0, "sent_bytes": 0})
            row["calls"] += 1
            row["payload_bytes"] += r.payload_bytes
            row["ring_cost_bytes"] += r.ring_cost_bytes
            row["sent_bytes"] = None if (r.sent_bytes is None or row["sent_bytes"] is None) \
                else row["sent_bytes"] + r.sent_bytes
        return out

    def resolve(self) -> None:
        """Read every record's GPU marks (no-op on the CPU): call after the step, before reading times."""
        for r in self.records:
            r.resolve()

    def calls_per_step(self) -> dict:
        per: dict = {}
        for r in self.select():
            per[r.step] = per.get(r.step, 0) + 1
        return per

    def summary(self) -> list:
        """One row per (axis, phase, op, algorithm): calls, the three traffic quantities, seconds blocked, and a
        note where the backend's algorithm is not the ring the cost formula assumes, and the strategy's notes on its
        records (each distinct one once)."""
        rows: dict = {}
        for r in self.select():
            key = (r.axis, r.phase, r.op, r.algorithm)
            row = rows.setdefault(key, {"axis": r.axis, "phase": r.phase, "op": r.op, "algorithm": r.algorithm,
                                        "calls": 0, "payload_bytes": 0, "ring_cost_bytes": 0, "sent_bytes": 0,
                                        "blocked_s": 0.0, "note": backend_note(r)})
            if r.note and r.note not in row["note"]:
                row["note"] = "; ".join(filter(None, (row["note"], r.note)))
            row["calls"] += 1
            row["payload_bytes"] += r.payload_bytes
            row["ring_cost_bytes"] += r.ring_cost_bytes
            row["sent_bytes"] = None if (r.sent_bytes is None or row["sent_bytes"] is None) \
                else row["sent_bytes"] + r.sent_bytes
            row["blocked_s"] += r.blocked_s
        return list(rows.values())

    def to_list(self) -> list:
        out = []
        for r in self.records:
            d = asdict(r)
            d.pop("_blocked_marks", None)
            out.append(d)
        return out


#: the three traffic quantities of a record, in the order tables show them
TRAFFIC = ("payload_bytes", "ring_cost_bytes", "sent_bytes")


def backend_note(record: CommRecord) -> str:
    """What the backend really runs, where it is not the ring that ``ring_cost_bytes`` assumes."""
    if record.algorithm == "torch" and record.backend == "gloo" and record.op == "reduce_scatter":
        return "gloo runs reduce-scatter as an all-reduce + slice: it sends an all-reduce's bytes"
    return ""
