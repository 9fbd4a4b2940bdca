"""ZeRO-3's trace: the order units begin in, recorded once, followed, invalidated when a pass diverges, re-recorded.

Prefetch (:mod:`.prefetch`) can only launch the *next* unit's gather if it knows which
unit comes next. Eager PyTorch does not say, so ZeRO-3 learns it: the first pass
records the order in which the units begin, per phase (forward, backward), and later
passes prefetch along that order. A model with a data-dependent branch (a block skipped,
an expert chosen by the input) runs a different order on some steps; a trace that never
changes keeps prefetching the branch it first saw. Lifecycle, per phase:

1. **record**: no trace yet; every unit that begins is appended (a unit that begins twice
   in one pass, a block applied twice, counts once);
2. **follow**: each unit that begins is compared with the next one in the trace; while
   they match, prefetch walks the trace;
3. **invalidate**: at the first unit that does not match, the trace is invalid for the rest
   of the pass: no more prefetch in that phase (units are gathered on demand as they
   begin), and the prefetcher frees what it launched for the stale order (those gathers
   were wasted). A forward that diverged invalidates the same pass's backward up front:
   both orders come from one pass. A pass that ends before its trace does (the branch
   skipped the last units) is invalidated when it closes;
4. **re-record**: when the pass closes (the end of its backward), the order it ran becomes
   the trace — zerokit's choice: the diverging pass's own order, so the next pass
   prefetches again. DeepSpeed's coordinator, which this follows (``trace_prologue``,
   ``_invalidate_trace``), instead records afresh during the pass after the invalidation
   and prefetches from the one after that.

``events`` keeps what happened — ``recorded``, ``invalidated`` (with the unit expected and
the one that began; ``None`` for "the pass ended"), ``re-recorded`` — with the pass they
happened in, for tests and for the course. Indices are the units' indices.
"""
from __future__ import annotations

from typing import Dict, List, Optional

PHASES = ("forward", "backward")
RECORD, FOLLOW, INVALID = "record", "follow", "invalid"


class Trace:
    """Per phase: the recorded unit order, where this pass stands in it, and what happened to it."""

    def __init__(self):
        #: unit indices in the order they began, per phase (None until the first pass closed)
        self.order: Dict[str, Optional[List[int]]] = {phase: None for phase in PHASES}
        #: passes closed so far (a pass ends with its backward)
        self.passes = 0
        #: what happened to the trace: dicts with pass, phase, event, and for ``invalidated`` expected/got
        self.events: List[dict] = []
        self._reset_pass()

    def _reset_pass(self) -> None:
        self._seen: Dict[str, List[int]] = {phase: [] for phase in PHASES}
        self._position = {phase: 0 for phase in PHASES}
        self._mode = {phase: RECORD if self.order[phase] is None else FOLLOW for phase in PHASES}

    def mode(self, phase: str) -> str:
        """``record``, ``follow`` or ``invalid`` for this pass."""
        return self._mode[phase]

    def begin(self, phase: str, index: int) -> bool:
        """Unit ``index`` begins its ``phase``; False when this invalidated the phase's trace just now."""
        if index in self._seen[phase]:
            return True  # a unit applied twice in one pass: the trace keeps its first use
        self._seen[phase].append(index)
        if self._mode[phase] != FOLLOW:
            return True
        order = self.order[phase]
        expected = order[self._position[phase]] if self._position[phase] < len(order) else None
        if index == expected:
            self._position[phase] += 1
            return True
        self.invalidate(phase, expected, index)
        if phase == "forward" and self._mode["backward"] == FOLLOW:
            self.invalidate("backward", None, None)  # the backward of a diverged forward: on demand
        return False

    def invalidate(self, phase: str, expected: Optional[int], got: Optional[int]) -> None:
        self._mode[phase] = INVALID
        self.events.append({"pass": self.passes, "phase": phase, "event": "invalidated",
                            "expected": expected, "got": got})

    def ahead(self, phase: str, index: int) -> List[int]:
        """The units after ``index`` in the phase's trace, while the trace is followed; [] otherwise."""
        order = self.order[phase]
        if order is None or self._mode[phase] == INVALID or index not in order:
            return []
        return order[order.index(index) + 1:]

    def close(self) -> None:
        """The end of a backward: record or re-record the orders this pass ran, where they differ."""
        if self._seen["forward"]:
            for phase in PHASES:
                seen, order = self._seen[phase], self.order[phase]
                if order is None:
                    self.order[phase] = list(seen)
                    self.events.append({"pass": self.passes, "phase": phase, "event": "recorded"})
                elif seen != order:
                    if self._mode[phase] == FOLLOW:  # every unit matched, but the pass ended early
                        self.invalidate(phase, order[self._position[phase]], None)
                    self.order[phase] = list(seen)
                    self.events.append({"pass": self.passes, "phase": phase, "event": "re-recorded"})
            self.passes += 1
        self._reset_pass()

    def drop(self) -> None:
        """A backward failed: forget this pass, keep the trace."""
        self._reset_pass()
