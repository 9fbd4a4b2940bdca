"""Collectives over torch.distributed that keep a communication ledger.

Every call records the op, the training phase it ran in (forward, backward, step,
or setup), the mesh axis of its group (``dp``, ``tp``, ``pp``, or ``world``), the
element count and dtype, and three traffic quantities that are kept apart everywhere:

- ``payload_bytes`` — **measured**: the bytes of the tensor the collective was issued on;
- ``ring_cost_bytes`` — **formula**: what this rank would send for that payload under the
  ring algorithm (:func:`zerokit.theory.ring_bytes_sent` applied to the measured
  payload). It is not a measurement of the wire: gloo runs its reduce-scatter as a full
  all-reduce plus a slice (FACTS §9), so gloo really sends more than this;
- ``sent_bytes`` — **measured on the wire**: the bytes this rank handed to send, which
  exist only when the collective ran on zerokit's ring over send/recv
  (:mod:`zerokit.runtime.ring`); None for the backend's own collectives.

Async calls return a :class:`Work` whose ``wait`` records when the rank stopped waiting
and how long it was blocked: the *exposed* communication the timeline shades. On CUDA
(NCCL), ``wait`` returns at once and only orders the streams, so the blocked time is
measured with CUDA events around the wait on the current stream instead, read when
the step's records are summarised.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from .. import theory
from .context import note_collective

PHASES = ("setup", "forward", "backward", "step")

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


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
    t_launch: float
    t_end: Optional[float] = None
    #: seconds the calling thread was blocked on this collective (sync call or wait)
    blocked_s: float = 0.0
    algorithm: str = "torch"
    tag: str = ""
    #: measured: bytes handed to send by zerokit's ring; None when the backend ran the collective
    sent_bytes: Optional[int] = None
    #: the mesh axis of the group: dp, tp, pp, or world
    axis: str = "world"
    #: the backend that ran it (gloo's reduce-scatter is an all-reduce underneath)
    backend: str = ""
    #: CUDA events (before, after) around a wait on the current stream; resolved into blocked_s
    _cuda_events: Optional[tuple] = field(default=None, repr=False)

    def resolve(self) -> None:
        """Turn the CUDA events of a wait into blocked seconds (the stream waited this long)."""
        if self._cuda_events is not None:
            before, after = self._cuda_events
            after.synchronize()
            self.blocked_s += before.elapsed_time(after) / 1000.0
            self._cuda_events = None


@dataclass
class CommLedger:
    """The communication of one rank, one record per call."""

    records: list = field(default_factory=list)
    step: int = 0
    phase: str = "setup"
    enabled: bool = True

    def reset(self) -> None:
        self.records.clear()
        self.step = 0
        self.phase = "setup"

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
        """Read the CUDA events of every wait (no-op on the CPU)."""
        for r in self.records:
            r.resolve()

    def calls_per_step(self) -> dict:
        per: dict = {}
        for r in self.select():
            per[r.step] = per.get(r.step, 0) + 1
        return per

    def summary(self) -> list:
        """One row per (axis, phase, op, algorithm): calls, the three traffic quantities, seconds blocked, and a
        note where the backend's algorithm is not the ring the cost formula assumes."""
        rows: dict = {}
        for r in self.select():
            key = (r.axis, r.phase, r.op, r.algorithm)
            row = rows.setdefault(key, {"axis": r.axis, "phase": r.phase, "op": r.op, "algorithm": r.algorithm,
                                        "calls": 0, "payload_bytes": 0, "ring_cost_bytes": 0, "sent_bytes": 0,
                                        "blocked_s": 0.0, "note": backend_note(r)})
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
            d.pop("_cuda_events", None)
            out.append(d)
        return out


#: the three traffic quantities of a record, in the order tables show them
TRAFFIC = ("payload_bytes", "ring_cost_bytes", "sent_bytes")


def backend_note(record: CommRecord) -> str:
    """What the backend really runs, where it is not the ring that ``ring_cost_bytes`` assumes."""
    if record.algorithm == "torch" and record.backend == "gloo" and record.op == "reduce_scatter":
        return "gloo runs reduce-scatter as an all-reduce + slice: it sends an all-reduce's bytes"
    return ""


_ledger = CommLedger()


def ledger() -> CommLedger:
    """This process's communication ledger."""
    return _ledger


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Tag the collectives issued inside the block with a training phase."""
    if name not in PHASES:
        raise ValueError(f"phase={name!r}; allowed: {', '.join(PHASES)}")
    previous = _ledger.phase
    _ledger.phase = name
    try:
        yield
    finally:
        _ledger.phase = previous


def set_step(step: int) -> None:
    _ledger.step = step


class Work:
    """An async collective in flight; ``wait`` records completion and blocked time."""

    def __init__(self, work, record: CommRecord):
        self._work = work
        self.record = record

    def wait(self) -> None:
        if self.record.t_end is not None:
            return
        cuda = self.record.backend == "nccl" and torch.cuda.is_available()
        if cuda:
            before = torch.cuda.Event(enable_timing=True)
            after = torch.cuda.Event(enable_timing=True)
            before.record()
        t0 = time.perf_counter()
        self._work.wait()
        t1 = time.perf_counter()
        self.record.t_end = t1
        if cuda:  # NCCL's wait only makes the current stream wait: time the stream, not the CPU
            after.record()
            self.record._cuda_events = (before, after)
        else:
            self.record.blocked_s += t1 - t0

    def is_completed(self) -> bool:
        return self._work.is_completed()


def _group_size(group) -> int:
    return dist.get_world_size(group)


def axis_of(group) -> str:
    """The mesh axis of ``group`` on this rank ("world" outside a mesh or for the whole world)."""
    from . import context

    if group is dist.group.WORLD:
        group = None
    ctx = context._current
    if ctx is None:  # collectives outside zerokit.launch / torchrun: no mesh was laid out
        return "world"
    return ctx.mesh.axis_of(group)


def _backend(group) -> str:
    try:
        return str(dist.get_backend(group))
    except Exception:  # noqa: BLE001 - a world of one without a process group
        return ""


def new_record(op: str, tensor: torch.Tensor, payload_bytes: int, group, async_op: bool, tag: str = "",
               algorithm: str = "torch", **formula) -> CommRecord:
    """A ledger record for a collective this rank is entering, with its payload and its ring cost."""
    n = _group_size(group) if (group is not None or dist.is_initialized()) else 1
    record = CommRecord(op=op, phase=_ledger.phase, step=_ledger.step, numel=payload_bytes // tensor.element_size(),
                        dtype=str(tensor.dtype).replace("torch.", ""), payload_bytes=payload_bytes,
                        ring_cost_bytes=theory.ring_bytes_sent(op, payload_bytes, n, **formula), group_size=n,
                        async_op=async_op, t_launch=time.perf_counter(), algorithm=algorithm, tag=tag,
                        axis=axis_of(group), backend=_backend(group))
    prefix = "ring " if algorithm == "ring" else ""
    note_collective(f"{prefix}{op} {record.numel} {record.dtype} on {record.axis} [{record.phase}, step {record.step}]")
    return _ledger.add(record)


def _start(op: str, tensor: torch.Tensor, payload_bytes: int, group, async_op: bool,
           tag: str = "", **formula) -> CommRecord:
    return new_record(op, tensor, payload_bytes, group, async_op, tag, **formula)


def _finish(work, record: CommRecord, async_op: bool):
    if async_op:
        return Work(work, record)
    record.t_end = time.perf_counter()
    record.blocked_s = record.t_end - record.t_launch
    return None


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, group=None, async_op: bool = False, tag: str = ""):
    """All-reduce in place; a rank sends 2(n−1)/n of the tensor's bytes."""
    record = _start("all_reduce", tensor, _bytes(tensor), group, async_op, tag)
    work = dist.all_reduce(tensor, op=op, group=group, async_op=async_op)
    return _finish(work, record, async_op)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, op=dist.ReduceOp.SUM, group=None,
                   async_op: bool = False, tag: str = ""):
    """Reduce ``input`` (n equal chunks) and leave chunk ``rank`` in ``output``; sends (n−1)/n of input."""
    n = _group_size(group)
    if input.numel() != output.numel() * n:
        raise ValueError(f"reduce_scatter: input has {input.numel()} elements, expected output.numel() * "
                         f"world size = {output.numel()} * {n}; pad flat buffers to a multiple of the world size")
    record = _start("reduce_scatter", input, _bytes(input), group, async_op, tag)
    work = _reduce_scatter(output, input, op=op, group=group, async_op=async_op)
    return _finish(work, record, async_op)


def all_gather(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False, tag: str = ""):
    """Gather every rank's ``input`` into ``output`` (n chunks, by rank); sends (n−1)/n of output."""
    n = _group_size(group)
    if output.numel() != input.numel() * n:
        raise ValueError(f"all_gather: output has {output.numel()} elements, expected input.numel() * "
                         f"world size = {input.numel()} * {n}")
    record = _start("all_gather", output, _bytes(output), group, async_op, tag)
    work = _all_gather(output, input, group=group, async_op=async_op)
    return _finish(work, record, async_op)


def broadcast(tensor: torch.Tensor, src: int, group=None, async_op: bool = False, tag: str = ""):
    """Broadcast from global rank ``src``; counted as a pipelined chain (every rank but the last sends S)."""
    rank = dist.get_rank(group)
    group_src = dist.get_group_rank(group, src) if group is not None else src
    record = _start("broadcast", tensor, _bytes(tensor), group, async_op, tag, rank=rank, src=group_src)
    work = dist.broadcast(tensor, src=src, group=group, async_op=async_op)
    return _finish(work, record, async_op)


def send(tensor: torch.Tensor, dst: int, group=None, tag: str = ""):
    record = _start("send", tensor, _bytes(tensor), group, False, tag)
    dist.send(tensor, dst=dst, group=group)
    _finish(None, record, False)


def recv(tensor: torch.Tensor, src: int, group=None, tag: str = ""):
    record = _start("recv", tensor, _bytes(tensor), group, False, tag)
    dist.recv(tensor, src=src, group=group)
    _finish(None, record, False)


def isend(tensor: torch.Tensor, dst: int, group=None, tag: str = "") -> Work:
    record = _start("send", tensor, _bytes(tensor), group, True, tag)
    return Work(dist.isend(tensor, dst=dst, group=group), record)


def irecv(tensor: torch.Tensor, src: int, group=None, tag: str = "") -> Work:
    record = _start("recv", tensor, _bytes(tensor), group, True, tag)
    return Work(dist.irecv(tensor, src=src, group=group), record)
