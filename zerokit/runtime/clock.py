"""Time on the device's timeline: when work ran, not when it was queued.

On the CPU a call returns when its work is done, so ``time.perf_counter()`` around it is
its duration. On a GPU a kernel launch, a copy or an NCCL collective returns once it is
*queued*: ``perf_counter`` around it measures the enqueue (microseconds), a synchronous
all-reduce looks free and the exposed communication reads ≈ 0. torch's profiler and
nccl-tests time the stream with CUDA events instead, and so does this clock. Every time
zerokit measures inside a step — a collective's launch, end and blocked time
(:mod:`.comm`, :mod:`.ring`, the peers' recordings), the tracer's spans
(:mod:`.timeline`), the pipeline executor's actions — is a :func:`mark` of this clock.

Lifecycle on a rank:

1. :func:`use` with the rank's device when the rank starts (``zerokit.train`` does; a
   user's loop under :func:`zerokit.measure` too). On the CPU a mark is a
   ``perf_counter`` float, and nothing else happens.
2. On CUDA, :func:`anchor` pairs the two timelines: it synchronizes the device, records
   an event and notes ``perf_counter`` at that instant (``use`` anchors once; the
   training loop anchors again at each step, where it synchronizes anyway).
3. :func:`mark` records an event on the current stream: it completes when the stream
   reaches that point, i.e. when everything queued before it has run.
4. :func:`seconds` turns a mark into ``perf_counter`` seconds — the anchor's host time
   plus the GPU time elapsed from the anchor's event to the mark's. It waits for the
   mark's event, so it is read after the step (``CommLedger.resolve``, ``Tracer.events``,
   the pipeline's spans), never inside it.
"""
from __future__ import annotations

import time
from typing import Optional, Union

import torch


class Anchor:
    """A CUDA event and the ``perf_counter`` time at which it completed (the device was idle)."""

    __slots__ = ("host_s", "event")

    def __init__(self, host_s: float, event):
        self.host_s, self.event = host_s, event


class GpuMark:
    """A CUDA event on the current stream, read against the anchor that was current when it was recorded."""

    __slots__ = ("event", "anchor")

    def __init__(self, event, anchor: Anchor):
        self.event, self.anchor = event, anchor


Mark = Union[float, GpuMark]

_device: Optional[torch.device] = None  # a CUDA device, or None: the CPU's perf_counter
_anchor: Optional[Anchor] = None
#: a stand-in for torch.cuda.Event (tests replay a GPU's timeline on the CPU with it)
_event_factory = None


def _event():
    if _event_factory is not None:
        return _event_factory()
    return torch.cuda.Event(enable_timing=True)


def use(device: Optional[torch.device]) -> None:
    """Measure on ``device``'s timeline from now on: CUDA events on a GPU, ``perf_counter`` elsewhere."""
    global _device, _anchor
    _device = device if device is not None and device.type == "cuda" else None
    _anchor = None
    if _device is not None:
        anchor()


def on_device() -> bool:
    """Whether marks are CUDA events (the rank's device is a GPU)."""
    return _device is not None


def anchor() -> None:
    """Pair the device's timeline with ``perf_counter``: synchronize, record an event, note the time (CUDA only)."""
    global _anchor
    if _device is None:
        return
    if _event_factory is None:
        torch.cuda.synchronize(_device)
    event = _event()
    event.record()
    if _event_factory is None:
        event.synchronize()
    _anchor = Anchor(time.perf_counter(), event)


def mark() -> Mark:
    """Now, on the device's timeline: a ``perf_counter`` float on the CPU, a recorded CUDA event on a GPU."""
    if _device is None:
        return time.perf_counter()
    event = _event()
    event.record()
    return GpuMark(event, _anchor)


def seconds(m: Optional[Mark]) -> Optional[float]:
    """A mark as ``perf_counter`` seconds (waits for a CUDA mark's event: read it after the step)."""
    if m is None or isinstance(m, (int, float)):
        return m
    m.event.synchronize()
    return m.anchor.host_s + m.anchor.event.elapsed_time(m.event) / 1000.0


def elapsed(start: Optional[Mark], end: Optional[Mark]) -> float:
    """Seconds from ``start`` to ``end`` on the device's timeline (0 when either is missing)."""
    if start is None or end is None:
        return 0.0
    return seconds(end) - seconds(start)
