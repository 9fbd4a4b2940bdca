"""``zerokit.measure``: the memory and communication ledgers around any block of a user's loop.

::

    with zerokit.measure(engine) as m:          # or a wrapper, a ShardedOptimizer, a torch optimizer, a module
        loss = loss_fn(engine(x), y); engine.backward(loss); engine.step()
    print(m.table()); m.plot()

Lifecycle: on entry a :class:`~zerokit.runtime.memory.MemoryLedger` is told where each
object keeps its tensors (an engine or wrapper says it itself; a torch optimizer gives
its states; a module its parameters, gradients and buffers), every module's forward and
every gradient samples it, and saved activations are watched; the communication ledger
is marked. On exit the ledgers are read: bytes per category now and at the peak
(measured from tensor storages), and the collectives issued inside the block per axis,
phase and op (calls and payload measured; ring cost by formula on those payloads).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from ..runtime import comm
from ..runtime.memory import CATEGORIES, MemoryLedger


class Measurement:
    """What :func:`measure` read: ``memory`` (now), ``peak`` (per category), ``collectives`` (rows)."""

    def __init__(self):
        self.ledger = MemoryLedger()
        self.memory: dict = {}
        self.peak: dict = {}
        self.collectives: list = []

    def table(self) -> str:
        lines = ["memory (measured, MiB)   " + " ".join(f"{c:>11}" for c in CATEGORIES) + f"{'total':>11}"]
        for label, row in (("now", self.memory), ("peak of each", self.peak)):
            total = row.get("total", sum(row.get(c, 0) for c in CATEGORIES))
            lines.append(f"{label:<25}" + " ".join(f"{row.get(c, 0) / 2**20:>11.3f}" for c in CATEGORIES)
                         + f"{total / 2**20:>11.3f}")
        lines.append("")
        lines.append(f"{'axis':<6}{'phase':<10}{'op':<16}{'calls':>6}{'payload B (measured)':>22}"
                     f"{'ring cost B (formula)':>23}")
        for r in self.collectives:
            lines.append(f"{r['axis']:<6}{r['phase']:<10}{r['op']:<16}{r['calls']:>6}{r['payload_bytes']:>22,}"
                         f"{r['ring_cost_bytes']:>23,.0f}")
        if not self.collectives:
            lines.append("(no collectives inside the block)")
        return "\n".join(lines)

    def plot(self, ax=None):
        """Bars of the measured bytes per category, now and at each category's peak."""
        from matplotlib.figure import Figure

        if ax is None:
            ax = Figure(figsize=(6, 3), dpi=100).add_subplot(1, 1, 1)
        xs = range(len(CATEGORIES))
        ax.bar([x - 0.2 for x in xs], [self.memory.get(c, 0) / 2**20 for c in CATEGORIES], 0.4, label="now")
        ax.bar([x + 0.2 for x in xs], [self.peak.get(c, 0) / 2**20 for c in CATEGORIES], 0.4, label="peak")
        ax.set_xticks(list(xs), CATEGORIES)
        ax.set_ylabel("MiB (measured)")
        ax.legend(frameon=False)
        return ax.figure


def _track(ledger: MemoryLedger, obj) -> None:
    if hasattr(obj, "track_memory"):
        obj.track_memory(ledger)
    elif isinstance(obj, torch.optim.Optimizer):
        ledger.track_optimizer(obj)
    elif isinstance(obj, torch.nn.Module):
        ledger.track_model(obj)
    else:
        raise ValueError(f"zerokit.measure({type(obj).__name__}): pass engines, zerokit wrappers, "
                         f"ShardedOptimizers, torch optimizers or nn.Modules")


def _modules(obj):
    for attr in ("module", "model"):
        module = getattr(obj, attr, None)
        if isinstance(module, torch.nn.Module):
            return module
    return obj if isinstance(obj, torch.nn.Module) else None


@contextmanager
def measure(*objects) -> Iterator[Measurement]:
    """Measure the block (see the module docstring)."""
    if not objects:
        raise ValueError("zerokit.measure(): name what to measure, e.g. zerokit.measure(engine) or "
                         "zerokit.measure(model, optimizer)")
    m = Measurement()
    for obj in objects:
        _track(m.ledger, obj)
    for module in {id(x): x for x in map(_modules, objects) if x is not None}.values():
        m.ledger.instrument(module)
    ledger = comm.ledger()
    start = len(ledger.records)
    m.ledger.sample("start")
    try:
        with m.ledger.watch_activations():
            yield m
    finally:
        m.ledger.sample("end")
        m.ledger.remove_hooks()
        m.memory = m.ledger.current()
        m.peak = dict(m.ledger.peak_by_category, total=m.ledger.peak_total)
        rows: dict = {}
        for r in ledger.records[start:]:
            row = rows.setdefault((r.axis, r.phase, r.op), {"axis": r.axis, "phase": r.phase, "op": r.op,
                                                            "calls": 0, "payload_bytes": 0, "ring_cost_bytes": 0})
            row["calls"] += 1
            row["payload_bytes"] += r.payload_bytes
            row["ring_cost_bytes"] += r.ring_cost_bytes
        m.collectives = list(rows.values())
