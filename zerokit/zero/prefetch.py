"""ZeRO-3 prefetch: gather the next units while this one computes (DeepSpeed's prefetch coordinator).

Lifecycle. During the first step nothing is prefetched: the strategy reports each unit
as its forward and its backward begin (``record``), and at the end of that backward
the two orders are frozen (``close_pass``). From the second step on, when a unit
begins, ``prefetch`` walks the units after it in the recorded order and launches their
all-gathers asynchronously, so they are in flight while this unit computes.

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

from typing import Callable, List, Optional

from .units import State, Unit

PHASES = ("forward", "backward")


class Prefetcher:
    """Unit order per phase (recorded once) and budgeted asynchronous gathers ahead of the current unit."""

    def __init__(self, units: List[Unit], budget_numel: int, enabled: bool):
        self.units = units
        self.budget_numel = budget_numel
        self.enabled = enabled
        #: unit indices in the order their forward / backward began (None until the first pass closed)
        self.order = {phase: None for phase in PHASES}
        self._seen = {phase: [] for phase in PHASES}
        self.max_ahead_numel = 0
        self.max_units_in_flight = 0

    def record(self, phase: str, unit: Unit) -> None:
        if self.order[phase] is None:
            self._seen[phase].append(unit.index)

    def close_pass(self) -> None:
        """End of a backward: freeze the orders the first pass recorded."""
        if self.order["forward"] is None and self._seen["forward"]:
            for phase in PHASES:
                self.order[phase] = list(dict.fromkeys(self._seen[phase]))
        self.drop_pass()

    def drop_pass(self) -> None:
        self._seen = {phase: [] for phase in PHASES}

    def prefetch(self, phase: str, current: Unit, gather: Callable[[Unit], None]) -> None:
        """Launch the gathers of the units after ``current`` in ``phase``'s order that fit in the budget."""
        order: Optional[List[int]] = self.order[phase]
        if self.enabled and order is not None and current.index in order:
            budget = self.budget_numel
            for index in order[order.index(current.index) + 1:]:
                unit = self.units[index]
                budget -= unit.flat.padded_numel
                if budget < 0:
                    break
                if unit.state is State.SHARDED:
                    gather(unit)
        self._measure(phase, current)

    def _measure(self, phase: str, current: Unit) -> None:
        order = self.order[phase] or []
        after = order[order.index(current.index) + 1:] if current.index in order else []
        ahead = sum(self.units[i].in_flight_numel for i in after)
        self.max_ahead_numel = max(self.max_ahead_numel, ahead)
        in_flight = sum(1 for u in self.units if u.state is not State.SHARDED)
        self.max_units_in_flight = max(self.max_units_in_flight, in_flight)
