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
and how long it was blocked: the *exposed* communication the timeline shades. Every time
is a mark of :mod:`.clock`: on CUDA (NCCL) a call, and a ``wait``, return once the work is
queued and only order the streams, so launch, end and blocked time are CUDA events on
the current stream, read when the step's records are resolved (``CommLedger.resolve``).

Under an emulated link (:mod:`.link`, ``train(..., link=...)``) each call still runs on
the backend; its completion is then held until the link's modelled time has passed: a
synchronous call sleeps right after the backend returns, an asynchronous one in ``wait``
for what is left of it. Without a link nothing is booked and nothing sleeps.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d  # P2POp accepts only these two functions

from .. import theory
from .comm_ledger import TRAFFIC, CommLedger, CommRecord, backend_note  # noqa: F401 - part of comm's API
from . import clock as _clock, context, link as _link
from .hang import check_signature

PHASES = ("setup", "forward", "backward", "step")

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


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
    _ledger.phase_depth += 1
    try:
        yield
    finally:
        _ledger.phase = previous
        _ledger.phase_depth -= 1


@contextmanager
def note(text: str) -> Iterator[None]:
    """Say why the collectives issued inside the block run as they do (a strategy's fallback, say): the records
    carry ``text``, the ledger's summary rows and a result's notes show it."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"note={text!r} must be a non-empty string")
    previous = _ledger.note
    _ledger.note = text
    try:
        yield
    finally:
        _ledger.note = previous


def current_phase() -> str:
    """The phase a collective issued now belongs to: the innermost ``phase`` block's; outside any, "backward"
    while autograd runs a backward (a user's own ``loss.backward()`` firing a wrapper's hooks), else "setup"."""
    if _ledger.phase_depth == 0 and torch._C._current_graph_task_id() != -1:
        return "backward"
    return _ledger.phase


def set_step(step: int) -> None:
    _ledger.step = step


def set_link(link) -> None:
    """Put this process's collectives behind an emulated link (:mod:`.link`; None: none)."""
    _link.set_link(link)


class Work:
    """An async collective in flight; ``wait`` records completion and blocked time. The works of one
    ``batch_isend_irecv`` that the backend completes with one handle (NCCL coalesces the batch) share it: waiting
    for any of them ends every record it covers, and only the waiter's record counts the time blocked."""

    def __init__(self, work, record: CommRecord, covers: tuple = ()):
        self._work = work
        self.record = record
        self._covers = covers  # the records of the batch's other ops (records only: no cycle keeps a work alive)

    def wait(self) -> None:
        if self.record.t_end is not None:
            return
        call = getattr(self.record, "_call", None)
        if call is not None:
            context.wait_collective(*call)
        before = _clock.mark()
        self._work.wait()
        _ended(self.record, before)
        for record in self._covers:
            _ended(record, None)

    def is_completed(self) -> bool:
        due = self.record.emulated_end
        if due is not None and time.perf_counter() < due:
            return False
        return self._work.is_completed()


def _ended(record: CommRecord, before) -> None:
    """The backend finished ``record``'s work; ``before``: the mark the rank began waiting (None: it did not)."""
    if record.t_end is not None:
        return
    link = _link.clock()
    if link is not None:  # an emulated link (gloo only): sleep for what is left of its time
        if record.op == "recv":  # the data just came: its bytes cross the link from now
            link.book(record, start=time.perf_counter())
        link.hold(record)
    record.t_end = _clock.mark()  # NCCL's wait only makes the current stream wait: a mark on that stream
    if before is not None:
        record.add_blocked(before, record.t_end)
    call = getattr(record, "_call", None)
    if call is not None:
        context.leave_collective(*call)


def _group_size(group) -> int:
    return dist.get_world_size(group)


def axis_of(group) -> str:
    """The mesh axis of ``group`` on this rank ("world" outside a mesh or for the whole world)."""
    ctx = context._current
    if ctx is None:  # collectives outside zerokit.launch / torchrun: no mesh was laid out
        return "world"
    if ctx._mesh is None:
        # no mesh laid out yet: the default one puts every rank on dp. Its names, without building it here — building
        # creates process groups, a collective that a collective called by some ranks only must not start
        return "dp" if group is None or group is dist.group.WORLD else "world"
    named = ctx.mesh.axis_of(group)  # a flattened group (dp_cp) may be the world group's own object
    if named == "world" and group is dist.group.WORLD:
        named = ctx.mesh.axis_of(None)
    return named


def _backend(group) -> str:
    try:
        return str(dist.get_backend(group))
    except Exception:  # noqa: BLE001 - a world of one without a process group
        return ""


def new_record(op: str, tensor: torch.Tensor, payload_bytes: int, group, async_op: bool, tag: str = "",
               algorithm: str = "torch", **formula) -> CommRecord:
    """A ledger record for a collective this rank is entering, with its payload and its ring cost."""
    n = _group_size(group) if (group is not None or dist.is_initialized()) else 1
    record = CommRecord(op=op, phase=current_phase(), step=_ledger.step, numel=payload_bytes // tensor.element_size(),
                        dtype=str(tensor.dtype).replace("torch.", ""), payload_bytes=payload_bytes,
                        ring_cost_bytes=theory.ring_bytes_sent(op, payload_bytes, n, **formula), group_size=n,
                        async_op=async_op, t_launch=_clock.mark(), algorithm=algorithm, tag=tag,
                        axis=axis_of(group), backend=_backend(group), note=_ledger.note)
    name = f"ring {op}" if algorithm == "ring" else op
    detail = f"{record.numel} {record.dtype} on {record.axis}, step {record.step}"
    number = context.enter_collective(name, record.phase, detail, async_op)
    record._call = (number, name, record.phase, detail)  # for the slot when it is waited for and left
    if context.collectives_checked():
        check_signature(op, record.numel, tensor.dtype, record.phase, number, group, record.axis)
    return _ledger.add(record)


def _finish(work, record: CommRecord, async_op: bool):
    clock = _link.clock()
    if clock is not None:  # book the transfer on the emulated link (a receive books when its data comes)
        if record.op != "recv":
            clock.book(record)
        elif not async_op:
            clock.book(record, start=time.perf_counter())
    if async_op:
        return Work(work, record)
    if clock is not None:
        clock.hold(record)
    record.t_end = _clock.mark()
    record.add_blocked(record.t_launch, record.t_end)
    context.leave_collective(*record._call)
    return None


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, group=None, async_op: bool = False, tag: str = ""):
    """All-reduce in place; a rank sends 2(n−1)/n of the tensor's bytes."""
    record = new_record("all_reduce", tensor, _bytes(tensor), group, async_op, tag)
    work = dist.all_reduce(tensor, op=op, group=group, async_op=async_op)
    return _finish(work, record, async_op)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, op=dist.ReduceOp.SUM, group=None,
                   async_op: bool = False, tag: str = ""):
    """Reduce ``input`` (n equal chunks) and leave chunk ``rank`` in ``output``; sends (n−1)/n of input."""
    n = _group_size(group)
    if input.numel() != output.numel() * n:
        raise ValueError(f"reduce_scatter: input has {input.numel()} elements, expected output.numel() * "
                         f"world size = {output.numel()} * {n}; pad flat buffers to a multiple of the world size")
    record = new_record("reduce_scatter", input, _bytes(input), group, async_op, tag)
    work = _reduce_scatter(output, input, op=op, group=group, async_op=async_op)
    return _finish(work, record, async_op)


def all_gather(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False, tag: str = ""):
    """Gather every rank's ``input`` into ``output`` (n chunks, by rank); sends (n−1)/n of output."""
    n = _group_size(group)
    if output.numel() != input.numel() * n:
        raise ValueError(f"all_gather: output has {output.numel()} elements, expected input.numel() * "
                         f"world size = {input.numel()} * {n}")
    record = new_record("all_gather", output, _bytes(output), group, async_op, tag)
    work = _all_gather(output, input, group=group, async_op=async_op)
    return _finish(work, record, async_op)


def all_to_all_single(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False, tag: str = "",
                      output_split_sizes=None, input_split_sizes=None):
    """Split ``input`` along dim 0, chunk j to rank j; ``output`` chunk j from rank j. Equal chunks by default, sending
    (n−1)/n of the input (context parallelism's Ulysses); with split sizes (expert parallelism's dispatch and
    combine: rows per peer) the ring cost is exactly the rows that leave this rank."""
    n = _group_size(group)
    if input_split_sizes is None:
        if input.shape[0] % n or output.numel() != input.numel():
            raise ValueError(f"all_to_all_single: input dim 0 ({input.shape[0]}) must split in {n} equal chunks and "
                             f"the output hold as many elements ({output.numel()} vs {input.numel()})")
        record = new_record("all_to_all", input, _bytes(input), group, async_op, tag)
    else:
        row = math.prod(input.shape[1:]) * input.element_size()
        me = dist.get_rank(group)
        record = new_record("all_to_all", input, _bytes(input), group, async_op, tag)
        record.ring_cost_bytes = (sum(input_split_sizes) - input_split_sizes[me]) * row
    work = dist.all_to_all_single(output, input, output_split_sizes=output_split_sizes,
                                  input_split_sizes=input_split_sizes, group=group, async_op=async_op)
    return _finish(work, record, async_op)


def broadcast(tensor: torch.Tensor, src: int, group=None, async_op: bool = False, tag: str = ""):
    """Broadcast from global rank ``src``; counted as a pipelined chain (every rank but the last sends S)."""
    rank = dist.get_rank(group)
    group_src = dist.get_group_rank(group, src) if group is not None else src
    record = new_record("broadcast", tensor, _bytes(tensor), group, async_op, tag, rank=rank, src=group_src)
    work = dist.broadcast(tensor, src=src, group=group, async_op=async_op)
    return _finish(work, record, async_op)


def _p2p(kind: str, tensor: torch.Tensor, peer: int, group, channel: int = 0):
    return dist.P2POp(c10d.isend if kind == "send" else c10d.irecv, tensor, peer, group=group, tag=channel)


def send(tensor: torch.Tensor, dst: int, group=None, tag: str = ""):
    """Send to global rank ``dst`` and wait; posted as a ``batch_isend_irecv`` of one (:func:`batch_isend_irecv`)."""
    record = new_record("send", tensor, _bytes(tensor), group, False, tag)
    dist.batch_isend_irecv([_p2p("send", tensor, dst, group)])[0].wait()  # a batch of one: one work, gloo or NCCL
    _finish(None, record, False)


def recv(tensor: torch.Tensor, src: int, group=None, tag: str = ""):
    """Receive from global rank ``src`` and wait; posted as a ``batch_isend_irecv`` of one."""
    record = new_record("recv", tensor, _bytes(tensor), group, False, tag)
    dist.batch_isend_irecv([_p2p("recv", tensor, src, group)])[0].wait()
    _finish(None, record, False)


def isend(tensor: torch.Tensor, dst: int, group=None, tag: str = "") -> Work:
    """Post a send to global rank ``dst``; posted as a ``batch_isend_irecv`` of one."""
    return batch_isend_irecv([("send", tensor, dst, tag)], group)[0]


def irecv(tensor: torch.Tensor, src: int, group=None, tag: str = "") -> Work:
    """Post a receive from global rank ``src``; posted as a ``batch_isend_irecv`` of one."""
    return batch_isend_irecv([("recv", tensor, src, tag)], group)[0]


def batch_isend_irecv(ops: list, group=None, channel: int = 0) -> list:
    """Post ``ops`` — ``("send" | "recv", tensor, peer's global rank, tag)`` — as one group, as torch's
    ``batch_isend_irecv`` does (``ncclGroupStart/End`` on NCCL); one :class:`Work` per op. Every point-to-point
    call of zerokit is posted this way, a single operation too: on NCCL a batch runs on its group's communicator
    and a lone ``isend`` / ``irecv`` on the two ranks' own, and a message posted on different ones by its sender
    and its receiver never finishes (:mod:`.p2p_replay`). Gloo returns one work per op, NCCL one for the batch:
    waited for, it ends every op's record. ``channel``: torch's p2p ``tag``, so two exchanges in flight between
    the same ranks are matched each with its own (gloo matches by it; NCCL keeps the posting order)."""
    records = [new_record(kind, tensor, _bytes(tensor), group, True, tag) for kind, tensor, _, tag in ops]
    works = dist.batch_isend_irecv([_p2p(kind, tensor, peer, group, channel) for kind, tensor, peer, _ in ops])
    if len(works) == len(records):
        return [_finish(work, record, True) for work, record in zip(works, records)]
    if len(works) != 1:
        raise RuntimeError(f"batch_isend_irecv returned {len(works)} works for {len(records)} operations")
    covered = [_finish(works[0], record, True) for record in records]
    for work in covered:
        work._covers = tuple(r for r in records if r is not work.record)
    return covered
