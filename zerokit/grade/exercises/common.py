"""What several graders share: traffic read off the probe's calls, and parity against a reference run.

Lifecycle: judges call these in the grader's process on the measurements a scenario
returned; the functions raise :class:`~..core.Fail` with the rank and the tensor where a
rank differs, so every exercise words the same finding the same way.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

from ... import theory
from .. import reference as ref
from ..core import Fail

COLLECTIVE_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")


def per_step_traffic(calls: Iterable[dict], steps: int, phase: Optional[str] = None,
                     ops: Iterable[str] = COLLECTIVE_OPS) -> Tuple[float, float, set]:
    """(payload bytes, ring-cost bytes, ops seen) per step of the collectives in ``phase`` (None: every phase)."""
    chosen = [c for c in calls if c["op"] in ops and (phase is None or c["phase"] == phase)]
    payload = sum(c["nbytes"] for c in chosen)
    cost = sum(theory.ring_bytes_sent(c["op"], c["nbytes"], c["group_size"]) for c in chosen)
    return payload / steps, cost / steps, {c["op"] for c in chosen}


def by_op(calls: Iterable[dict], phase: Optional[str] = None) -> Dict[str, dict]:
    """``{op: {"calls": k, "bytes": payload}}`` of the collectives in ``phase``."""
    out: Dict[str, dict] = {}
    for c in calls:
        if c["op"] in COLLECTIVE_OPS and (phase is None or c["phase"] == phase):
            row = out.setdefault(c["op"], {"calls": 0, "bytes": 0})
            row["calls"] += 1
            row["bytes"] += c["nbytes"]
    return out


def describe_ops(ops: Dict[str, dict], steps: int) -> str:
    """``"reduce_scatter ×1 (3,024 B)"`` per step, for a message."""
    if not ops:
        return "none"
    return ", ".join(f"{op} ×{row['calls'] / steps:g} ({row['bytes'] / steps:,.0f} B)" for op, row in sorted(ops.items()))


def same_params(results, expected: dict, steps: int, optimizer: str, atol: float = ref.PARAM_ATOL,
                model=None) -> str:
    """Fail unless every rank's ``params`` equal ``expected``; the pass line otherwise. ``model``: the reference's
    model, to place the parameter that differs in it (:func:`..reference.describe_parameter`)."""
    for rank, r in enumerate(results):
        diff, name = ref.worst(r["params"], expected)
        if diff > atol:
            where = "" if model is None else f" ({ref.describe_model(model)})"
            named = name if model is None else f"{ref.describe_parameter(model, name)},"
            raise Fail(f"after {steps} {optimizer} steps rank {rank}'s {named} differs from single-process training "
                       f"by {diff:.3g}{where}", f"≤ {atol:g}", f"{diff:.3g}", rank)
    return f"after {steps} {optimizer} steps every rank's parameters equal single-process training's " \
           f"(max |Δ| ≤ {atol:g})"


def unwaited(calls: Iterable[dict]) -> list:
    return [c for c in calls if not c["waited"]]
