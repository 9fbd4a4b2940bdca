"""The reducer: the bookkeeping of one backward that ``ddp`` and ZeRO stages 1–3 share.

Every strategy that reduces gradients during backward lays them out in numbered
buckets (``ddp``'s buckets, ZeRO's flat units) and needs the same four things, as
torch's ``Reducer`` and picotron's DP wrapper do them:

1. **Counting** (``ready``): a post-accumulate-grad hook reports each parameter once
   per backward; a bucket is *full* when all its parameters have reported.
2. **Launching** (``launch_full`` / ``launch_rest``): full buckets launch strictly in
   index order (``in_order=True``: every rank issues the same collectives in the same
   order, even if a later bucket fills first), or each as soon as it is full
   (``in_order=False``, ZeRO-3: its units fill in the order of the backward graph,
   which every rank shares).
3. **In flight** (``track``, ``reap``, ``wait_until``, ``wait_all``): launched
   collectives with what to do when each completes (copy into a shard, free a bucket),
   bounded by a number of elements in flight where the strategy asks.
4. **The end of backward**: a callback queued on the autograd engine once per
   backward (``queue_finish``) runs after the whole graph: the strategy fills what got
   no gradient (``before_finish``), the rest is launched and waited for, the strategy
   closes the pass (``after_finish``) and the counts reset. If nothing queued it (no
   parameter got a gradient), :meth:`backward` finishes anyway, so every rank issues
   the same collectives and none waits for a peer that never comes.

If backward raises (on every rank: the same model, the same data), :meth:`backward`
waits for the collectives already in flight, lets the strategy drop its half-built
state (``on_abort``) and resets, so the next step trains as if the failed one had not
happened. A backward the strategy did not start (``loss.backward()`` called directly)
that failed is noticed at the next ``ready`` and reset the same way.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import torch
from torch.autograd import Variable


def _graph_task() -> int:
    """The id of the backward the autograd engine is running on this thread (-1: none)."""
    return torch._C._current_graph_task_id()


class _InFlight:
    __slots__ = ("work", "numel", "done")

    def __init__(self, work, numel: int, done: Optional[Callable[[], None]]):
        self.work, self.numel, self.done = work, numel, done


class Reducer:
    """Counting, in-order launching, in-flight collectives and the end-of-backward callback for one strategy."""

    def __init__(self, sizes: List[int], launch: Callable[[int], None], in_order: bool = True,
                 before_finish: Optional[Callable[[], None]] = None,
                 after_finish: Optional[Callable[[], None]] = None,
                 on_abort: Optional[Callable[[], None]] = None):
        #: parameters each bucket waits for
        self.sizes = list(sizes)
        self.launch = launch
        self.in_order = in_order
        self.before_finish = before_finish
        self.after_finish = after_finish
        self.on_abort = on_abort
        self._in_flight: List[_InFlight] = []
        self.in_flight_numel = 0
        self._new_pass()

    def _new_pass(self) -> None:
        self.counts = [0] * len(self.sizes)
        self.seen: set = set()
        self.launched = [False] * len(self.sizes)
        self.next = 0
        self._queued = False
        self._task = -1
        self._finished = False

    # -- counting and launching ----------------------------------------------------------
    def begin(self) -> None:
        """Called from every backward hook: queue the end of this backward (once), after resetting a pass
        that an earlier, failed backward left half done."""
        if self._queued and self._task != _graph_task():
            self.abort()  # an earlier backward raised before its end-of-backward callback ran
        self.queue_finish()

    def ready(self, bucket: int, p) -> bool:
        """Count ``p`` ready in ``bucket`` (once per backward); True when it was new this pass."""
        self.begin()
        if p in self.seen:
            return False
        self.seen.add(p)
        self.counts[bucket] += 1
        return True

    def is_full(self, bucket: int) -> bool:
        return self.counts[bucket] == self.sizes[bucket]

    def launch_full(self, bucket: Optional[int] = None) -> None:
        """In order: launch the next buckets while they are full. Unordered: launch ``bucket`` if it is full."""
        if self.in_order:
            while self.next < len(self.sizes) and self.is_full(self.next):
                self._launch(self.next)
                self.next += 1
        elif bucket is not None and self.is_full(bucket) and not self.launched[bucket]:
            self._launch(bucket)

    def launch_rest(self) -> None:
        """Launch every bucket not launched yet, in index order (parameters without a gradient reduce zeros)."""
        for i in range(len(self.sizes)):
            if not self.launched[i]:
                self._launch(i)
        self.next = len(self.sizes)

    def _launch(self, bucket: int) -> None:
        self.launched[bucket] = True
        self.launch(bucket)

    # -- collectives in flight ----------------------------------------------------------
    def track(self, work, numel: int = 0, done: Optional[Callable[[], None]] = None) -> None:
        """Keep a launched collective (None: it already ran) until it completes; then call ``done``."""
        flight = _InFlight(work, numel, done)
        if work is None:
            self._complete(flight)
            return
        self._in_flight.append(flight)
        self.in_flight_numel += numel

    def _complete(self, flight: _InFlight) -> None:
        if flight.work is not None:
            flight.work.wait()
            self.in_flight_numel -= flight.numel
        if flight.done is not None:
            flight.done()

    def reap(self) -> None:
        """Complete the oldest collectives that have finished, without waiting for any."""
        while self._in_flight and self._in_flight[0].work.is_completed():
            self._complete(self._in_flight.pop(0))

    def wait_until(self, limit_numel: int, incoming: int = 0) -> None:
        """Wait for the oldest collectives until ``incoming`` more elements fit under ``limit_numel``."""
        self.reap()
        while self._in_flight and self.in_flight_numel + incoming > limit_numel:
            self._complete(self._in_flight.pop(0))

    def wait_all(self) -> None:
        while self._in_flight:
            self._complete(self._in_flight.pop(0))

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    # -- the end of backward -------------------------------------------------------------
    def queue_finish(self) -> None:
        """Queue the end-of-backward callback on the autograd engine, once per backward."""
        if not self._queued:
            Variable._execution_engine.queue_callback(self.finish)
            self._queued = True
            self._task = _graph_task()

    def finish(self) -> None:
        """After the whole backward: fill what is missing, launch the rest, wait for everything, reset."""
        if self.before_finish is not None:
            self.before_finish()
        self.launch_rest()
        self.wait_all()
        if self.after_finish is not None:
            self.after_finish()
        self._new_pass()
        self._finished = True

    def backward(self, loss, sync: bool = True) -> None:
        """``loss.backward()``, then the end of backward if no hook queued it (and ``sync``); reset on an error."""
        self._finished = False
        try:
            loss.backward()
        except BaseException:
            self.abort()
            raise
        if sync and not self._finished:
            self.finish()

    def abort(self) -> None:
        """Backward failed: let the collectives in flight land (every rank launched them), drop the pass."""
        flights, self._in_flight = self._in_flight, []
        for flight in flights:
            if flight.work is not None:
                flight.work.wait()
        self.in_flight_numel = 0
        if self.on_abort is not None:
            self.on_abort()
        self._new_pass()
        self._finished = True
