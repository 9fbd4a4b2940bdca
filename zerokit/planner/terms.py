"""The planner's labelled terms, and the flat units zerokit would form, for :mod:`.memory` and :mod:`.state_variants`.

A :class:`Term` is one labelled quantity of a plan's memory (category, bytes, formula,
assumption); :func:`units_of` is the units a ZeRO stage would form from a rank's tensor
sizes (the flat buckets of stages 1–2, one unit per transformer layer under stage 3);
:func:`split_experts` parts a rank's sizes into the dense ones and the experts'.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..theory import experts as ep_theory
from ..zero.flat_buffer import assign_units


@dataclass(frozen=True)
class Term:
    """One labelled quantity: what it is, its bytes, the formula and the assumption behind it."""

    category: str
    name: str
    bytes: float
    formula: str
    assumption: str = ""

    def as_dict(self) -> dict:
        return {"category": self.category, "name": self.name, "bytes": self.bytes, "formula": self.formula,
                "assumption": self.assumption}


class _Sized:
    """A tensor size for :func:`zerokit.zero.flat_buffer.assign_units` (which reads ``numel()``)."""

    def __init__(self, numel):
        self._numel = numel

    def numel(self):
        return self._numel


def units_of(sizes: list, layout) -> tuple:
    """zerokit's flat units on this rank: (unit sizes, persistent elements, stepped tensors)."""
    if layout.stage in (1, 2):
        groups = assign_units([_Sized(n) for n, _ in sizes], layout.reduce_bucket_size)
        units = [sum(sizes[j][0] for j in g) for g in groups]
        return units, 0, len(units)
    if layout.stage == 3:
        persistent = sum(n for n, _ in sizes if n < layout.param_persistence_threshold)
        by_unit: dict = {}
        for n, p in sizes:  # block units: one per transformer layer, the root takes the rest
            if n >= layout.param_persistence_threshold:
                by_unit[p.layer] = by_unit.get(p.layer, 0) + n
        units = list(by_unit.values())
        return units, persistent, len(units) + (1 if persistent else 0)
    return None, 0, len(sizes)


def split_experts(sizes: list) -> tuple:
    """(dense sizes, expert sizes) of a rank's (elements, tensor) list."""
    return [x for x in sizes if not ep_theory.is_expert(x[1])], [x for x in sizes if ep_theory.is_expert(x[1])]


def theory_term(category, name, nbytes, formula, assumption="") -> Term:
    return Term(category, name, float(nbytes), formula, assumption)
