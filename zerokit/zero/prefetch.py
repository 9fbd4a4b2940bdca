"""ZeRO-3 prefetch: gather the next units while this one computes (DeepSpeed's prefetch coordinator).

Lifecycle. During the first step nothing is prefetched: the strategy reports each unit
as its forward and its backward begin (``record``), and at the end of that backward
the two orders become the trace (``close_pass``; :mod:`.trace`). From the second step
on, when a unit begins, ``prefetch`` walks the units after it in the trace and launches
their all-gathers asynchronously, so they are in flight while this unit computes. When
a unit begins that the trace did not expect (a data-dependent branch), the trace is
invalidated for the rest of the pass: the gathers launched for the stale order are
freed unused (``extra_gathers`` counts them), the remaining units are gathered on demand,
and the pass's own order becomes the trace when it closes.

The budget, ``prefetch_bucket_size`` elements (DeepSpeed's
``stage3_prefetch_bucket_size``), bounds what is *ahead in flight*: every unit after the
current one that is already gathering or gathered counts against it, whether this call
or an earlier one launched it, and the walk stops at the first unit that would not fit.
So the gathered memory ahead of the computation never exceeds the budget (plus the
current unit and the units that enclose it, like the root).

``max_ahead_numel`` and ``max_units_in_flight`` record what really was in flight at
the worst moment, for tests and for the course's prefetch panel.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch

from .trace import PHASES, Trace
from .units import State, Unit


class Prefetcher:
    """The unit order per phase (a :class:`~.trace.Trace`) and budgeted asynchronous gathers ahead of the current unit."""

    def __init__(self, units: List[Unit], budget_numel: int, enabled: bool):
        self.units = units
        self.budget_numel = budget_numel
        self.enabled = enabled
        #: the recorded unit order per phase, and what happened to it (:class:`~.trace.Trace`)
        self.trace = Trace()
        #: gathers launched ahead for a unit that then did not begin (the trace was stale): wasted
        self.extra_gathers = 0
        self._launched = {phase: [] for phase in PHASES}  # prefetched in this pass, not yet begun
        self.max_ahead_numel = 0
        self.max_units_in_flight = 0

    @property
    def order(self) -> Dict[str, Optional[List[int]]]:
        """Unit indices in the order their forward / backward began (None until the first pass closed)."""
        return self.trace.order

    def record(self, phase: str, unit: Unit) -> None:
        """``unit`` begins ``phase`` (training passes): compare it with the trace; a mismatch frees the stale gathers."""
        if unit in self._launched[phase]:
            self._launched[phase].remove(unit)
        if not self.trace.begin(phase, unit.index):
            for stale in PHASES if phase == "forward" else (phase,):
                self._drop_launched(stale)

    def _drop_launched(self, phase: str) -> None:
        for unit in self._launched[phase]:
            if unit.state is not State.SHARDED:
                unit.free()
                self.extra_gathers += 1
        self._launched[phase] = []

    def close_pass(self) -> None:
        """End of a backward: record, or re-record where this pass ran another order (:meth:`Trace.close`)."""
        for phase in PHASES:  # launched ahead, never begun: the units it expected did not run (freed by now)
            self.extra_gathers += len(self._launched[phase])
        self._launched = {phase: [] for phase in PHASES}
        self.trace.close()

    def drop_pass(self) -> None:
        self._launched = {phase: [] for phase in PHASES}
        self.trace.drop()

    def prefetch(self, phase: str, current: Unit, gather: Callable[[Unit], None]) -> None:
        """Launch the gathers of the units after ``current`` in ``phase``'s trace that fit in the budget."""
        if self.enabled:
            budget = self.budget_numel
            for index in self.trace.ahead(phase, current.index):
                unit = self.units[index]
                budget -= unit.flat.padded_numel
                if budget < 0:
                    break
                if unit.state is State.SHARDED:
                    gather(unit)
                    if phase == "backward" or torch.is_grad_enabled():  # an evaluation forward compares nothing
                        self._launched[phase].append(unit)
        self._measure(phase, current)

    def _measure(self, phase: str, current: Unit) -> None:
        order = self.order[phase] or []
        after = order[order.index(current.index) + 1:] if current.index in order else []
        ahead = sum(self.units[i].in_flight_numel for i in after)
        self.max_ahead_numel = max(self.max_ahead_numel, ahead)
        in_flight = sum(1 for u in self.units if u.state is not State.SHARDED)
        self.max_units_in_flight = max(self.max_units_in_flight, in_flight)
