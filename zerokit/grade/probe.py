"""What a learner's code did with torch.distributed, recorded inside a rank while the grader runs it.

Lifecycle: a scenario's rank function calls :func:`install` first, in the rank's own
process (never in the grader's); from then on every collective and point-to-point call
of ``torch.distributed`` — made directly or through :mod:`zerokit.comm` — appends a
:class:`Call`, and :meth:`Probe.calls` hands them back to the grader as plain dicts,
the grader's own ledger: op, bytes, whether it was asynchronous, whether it was launched
inside backward, whether it was waited for.

Asynchronous collectives are made *lazy*: the call records the launch and returns a work
whose ``wait`` runs the collective then, after checking that its buffers were neither
freed nor overwritten in the meantime. A timing mistake — a bucket freed or reused before
its reduction finished, a reduction never waited for — then shows the same way on every
run instead of depending on how fast the backend happened to be. Ranks run the same code,
so they wait in the same order and the collectives still match. Point-to-point calls run
as they are. A mistake found here raises :class:`Mistake`, whose ``kind`` tells the grader
which check it answers.
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

from ..runtime import comm
from ..runtime.context import note_collective

#: torch.distributed name -> (op recorded, the argument whose bytes count, the argument read before it runs)
WRAPPED = {
    "all_reduce": ("all_reduce", "tensor", "tensor"),
    "reduce_scatter_tensor": ("reduce_scatter", "input", "input"),
    "reduce_scatter_single": ("reduce_scatter", "input", "input"),
    "all_gather_into_tensor": ("all_gather", "output_tensor", "input_tensor"),
    "all_gather_single": ("all_gather", "output_tensor", "input_tensor"),
    "all_gather": ("all_gather", "tensor_list", "tensor"),
    "reduce_scatter": ("reduce_scatter", "input_list", "input_list"),
    "broadcast": ("broadcast", "tensor", "tensor"),
    "reduce": ("reduce", "tensor", "tensor"),
    "send": ("send", "tensor", "tensor"),
    "recv": ("recv", "tensor", None),
    "isend": ("send", "tensor", "tensor"),
    "irecv": ("recv", "tensor", None),
}
POINT_TO_POINT = ("send", "recv")

_probe: Optional["Probe"] = None


class Mistake(Exception):
    """A mistake the probe saw while the learner's code ran; ``kind`` names it for the grader."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(f"[{kind}] {message}")


@dataclass
class Call:
    """One call to torch.distributed, as the grader's ledger keeps it."""

    index: int
    op: str
    nbytes: int
    group_size: int
    async_op: bool
    in_backward: bool
    phase: str
    waited: bool
    shape: tuple


def _nbytes(value) -> int:
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def _tensors(value) -> list:
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return [value] if isinstance(value, torch.Tensor) else []


def _alive(t: torch.Tensor) -> bool:
    need = (t.storage_offset() + t.numel()) * t.element_size()
    return t.numel() == 0 or t.untyped_storage().nbytes() >= need


class LazyWork:
    """An asynchronous collective whose work happens at ``wait``, once its buffers are checked."""

    def __init__(self, run: Callable[[], None], call: Call, read: list, written: list):
        self._run, self.call = run, call
        self._read = [(t, t.detach().clone()) for t in read]
        self._written = written
        self.done = False

    def wait(self, *args, **kwargs) -> bool:
        if self.done:
            return True
        what = f"the asynchronous {self.call.op} #{self.call.index} ({self.call.nbytes} B)"
        for t in [t for t, _ in self._read] + self._written:
            if not _alive(t):
                raise Mistake("freed-in-flight", f"{what} was waited for after one of its buffers had been freed "
                                                 f"(storage resized to 0): memory in flight belongs to the "
                                                 f"collective until wait() returns; free it after the wait")
        for t, before in self._read:
            if not torch.equal(t, before):
                raise Mistake("overwritten-in-flight", f"{what} read a buffer that was written to after the launch "
                                                       f"and before wait(): reuse a bucket only once its "
                                                       f"reduction has finished")
        self._run()
        self.done = self.call.waited = True
        return True

    def is_completed(self) -> bool:
        return self.done


class Probe:
    """The calls this rank made; ``phase`` labels them with the part of the step the grader is in."""

    def __init__(self):
        self.records: List[Call] = []
        self.phase_name = "setup"
        self._originals: dict = {}

    @contextmanager
    def phase(self, name: str):
        previous, self.phase_name = self.phase_name, name
        try:
            yield
        finally:
            self.phase_name = previous

    def calls(self, phase: Optional[str] = None) -> List[dict]:
        return [asdict(c) for c in self.records if phase is None or c.phase == phase]

    def reset(self) -> None:
        self.records.clear()

    def _wrap(self, name: str, original: Callable) -> Callable:
        op, counted, read = WRAPPED[name]
        signature = inspect.signature(original)
        probe = self

        def recorded(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            values = bound.arguments
            group = values.get("group")
            size = dist.get_world_size(group)
            lazy = bool(values.get("async_op", False))
            payload = values.get(counted)
            call = Call(len(probe.records), op, _nbytes(payload), size, lazy or name in ("isend", "irecv"),
                        torch._C._current_graph_task_id() != -1, probe.phase_name, not lazy,
                        tuple(payload.shape) if isinstance(payload, torch.Tensor) else ())
            probe.records.append(call)
            _note(f"{op} of {call.nbytes} B (grader's call #{call.index})")
            if not lazy:
                return original(*bound.args, **bound.kwargs)
            values["async_op"] = False
            read_tensors = _tensors(values.get(read)) if read else []
            written = [t for t in _tensors(payload) if all(t is not r for r in read_tensors)]
            return LazyWork(lambda: original(*bound.args, **bound.kwargs), call, read_tensors, written)

        recorded.__wrapped__ = original
        return recorded

    def install(self) -> "Probe":
        for name in WRAPPED:
            original = getattr(dist, name, None)
            if original is None:
                continue
            self._originals[name] = original
            setattr(dist, name, self._wrap(name, original))
        # zerokit.comm bound its reduce-scatter and all-gather at import time: route them through the probe too
        for attr in ("_reduce_scatter", "_all_gather"):
            original = getattr(comm, attr)
            name = getattr(original, "__name__", "")
            if name in WRAPPED:
                self._originals[f"comm.{attr}"] = original
                setattr(comm, attr, self._wrap(name, original))
        return self


def _note(text: str) -> None:
    """Tell the launcher what this rank entered last, so that a hang names it."""
    note_collective(text)


def install() -> Probe:
    """Start recording in this rank (idempotent); returns the probe."""
    global _probe
    if _probe is None:
        _probe = Probe().install()
    return _probe


def current() -> Optional[Probe]:
    return _probe
