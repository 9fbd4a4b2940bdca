"""Collectives over torch.distributed that keep a communication ledger.

Every call records the op, the training phase it ran in (forward, backward, step,
or setup), the element count, dtype and payload bytes, and the bytes this rank
sends under the ring algorithm (:func:`zerokit.theory.ring_bytes_sent`). Async calls
return a :class:`Work` whose ``wait`` records when the rank stopped waiting and how
long it was blocked: the *exposed* communication the timeline shades.

gloo implements its reduce-scatter as a full all-reduce plus a slice (FACTS §9), so
the ring bytes recorded here are the algorithm's; :mod:`zerokit.ring` runs the ring on
send/recv and counts what it really sends.
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
    payload_bytes: int
    bytes_sent: float
    group_size: int
    async_op: bool
    t_launch: float
    t_end: Optional[float] = None
    #: seconds the calling thread was blocked on this collective (sync call or wait)
    blocked_s: float = 0.0
    algorithm: str = "torch"
    tag: str = ""


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

    def bytes_sent(self, **where) -> float:
        return sum(r.bytes_sent for r in self.select(**where))

    def calls(self, **where) -> int:
        return len(self.select(**where))

    def bytes_sent_per_step(self) -> dict:
        """Bytes sent in each training step (setup excluded)."""
        per: dict = {}
        for r in self.select():
            per[r.step] = per.get(r.step, 0) + r.bytes_sent
        return per

    def calls_per_step(self) -> dict:
        per: dict = {}
        for r in self.select():
            per[r.step] = per.get(r.step, 0) + 1
        return per

    def summary(self) -> list:
        """One row per (phase, op): calls, payload bytes, bytes sent, seconds blocked."""
        rows: dict = {}
        for r in self.select():
            row = rows.setdefault((r.phase, r.op), {"phase": r.phase, "op": r.op, "calls": 0,
                                                    "payload_bytes": 0, "bytes_sent": 0, "blocked_s": 0.0})
            row["calls"] += 1
            row["payload_bytes"] += r.payload_bytes
            row["bytes_sent"] += r.bytes_sent
            row["blocked_s"] += r.blocked_s
        return list(rows.values())

    def to_list(self) -> list:
        return [asdict(r) for r in self.records]


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
        t0 = time.perf_counter()
        self._work.wait()
        t1 = time.perf_counter()
        self.record.t_end = t1
        self.record.blocked_s += t1 - t0

    def is_completed(self) -> bool:
        return self._work.is_completed()


def _group_size(group) -> int:
    return dist.get_world_size(group)


def _start(op: str, tensor: torch.Tensor, payload_bytes: int, group, async_op: bool,
           tag: str = "", **formula) -> CommRecord:
    n = _group_size(group)
    sent = theory.ring_bytes_sent(op, payload_bytes, n, **formula)
    record = CommRecord(op=op, phase=_ledger.phase, step=_ledger.step, numel=payload_bytes // tensor.element_size(),
                        dtype=str(tensor.dtype).replace("torch.", ""), payload_bytes=payload_bytes,
                        bytes_sent=sent, group_size=n, async_op=async_op, t_launch=time.perf_counter(), tag=tag)
    note_collective(f"{op} {record.numel} {record.dtype} [{record.phase}, step {record.step}]")
    return _ledger.add(record)


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
