"""``zerokit.measure``: the memory and communication ledgers around any block of a user's loop.

::

    with zerokit.measure(engine) as m:          # or a wrapper, a ShardedOptimizer, a torch optimizer, a module
        loss = loss_fn(engine(x), y); engine.backward(loss); engine.step()
    print(m.table()); m.plot()

Lifecycle: on entry a :class:`~zerokit.runtime.memory.MemoryLedger` is told where each
object keeps its tensors (an engine or wrapper says it itself; a torch optimizer gives
its states; a module its parameters, gradients and buffers), every module's forward and
every gradient samples it, and saved activations are watched; the communication ledger
is marked. torch's own wrappers are seen too: a torch DDP's buckets are routed through
zerokit's ledgered all-reduce hook (the default hook's arithmetic), and FSDP2's and
ZeroRedundancyOptimizer's torch.distributed calls are recorded while the block runs. On
exit the ledgers are read: the block's time (measured on the device's timeline), bytes
per category now and at the peak (measured from tensor storages; offloaded model states
on the host apart), and the collectives issued inside the block per axis, phase and op
(calls and payload measured; ring cost by formula on those payloads). The ledger is told the
rank's device (in a bare torchrun loop, the context :func:`zerokit.runtime.context.current` keeps
for the user's process group, which also times the block with CUDA events): on CUDA it reads
the caching allocator at each sample too (``allocator_at_peak``, ``allocator_gap_max``).
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Iterator

import torch

from ..runtime import clock, comm, context
from ..runtime.memory import CATEGORIES, HOST_CATEGORIES, MemoryLedger
from ..runtime.torch_recording import ledgered_allreduce_hook, ledgered_torch_collectives
from ..runtime.wrapping import wrapper_kind


def _torch_side(obj) -> bool:
    """A torch wrapper or optimizer whose collectives zerokit.comm does not issue (torch DDP, FSDP2, ZeRO-1's
    ZeroRedundancyOptimizer): measure records torch.distributed's calls while the block runs."""
    kind = wrapper_kind(obj) if isinstance(obj, torch.nn.Module) else ""
    if kind and not kind.startswith("zerokit"):
        return True
    if isinstance(obj, torch.nn.Module):
        fsdp = getattr(torch.distributed, "fsdp", None)
        return fsdp is not None and any(isinstance(m, getattr(fsdp, "FSDPModule", ())) for m in obj.modules())
    return type(obj).__name__ == "ZeroRedundancyOptimizer"


def _route_torch_ddp(obj) -> None:
    """torch's DDP all-reduces its buckets in C++, out of Python's sight: route them through zerokit's ledgered
    all-reduce hook — the default hook's arithmetic (divide by N, all-reduce) — once, if it has no hook of its own."""
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    if isinstance(obj, TorchDDP) and not getattr(obj, "_zerokit_ledgered", False):
        try:
            obj.register_comm_hook(None, ledgered_allreduce_hook)
        except RuntimeError as e:  # a hook of the user's: its collectives stay unseen, and the table says so
            obj._zerokit_ledgered = f"(torch DDP's buckets: your comm hook's collectives are not recorded: {e})"
            return
        obj._zerokit_ledgered = True


class Measurement:
    """What :func:`measure` read: ``memory`` (now), ``peak`` (per category), ``collectives`` (rows); on CUDA
    ``allocator_at_peak`` (``torch.cuda.memory_allocated`` at the ledger's peak sample) and ``allocator_gap_max``
    (the largest allocated − ledger: what the ledger does not name), None elsewhere."""

    def __init__(self, device=None):
        #: told the rank's device, the ledger counts that device's storages and reads its caching allocator
        self.ledger = MemoryLedger(device)
        self.allocator_at_peak = self.allocator_gap_max = None
        self.memory: dict = {}
        self.peak: dict = {}
        self.collectives: list = []
        #: measured: the block's seconds, on the device's timeline (zerokit.runtime.clock)
        self.seconds: float = 0.0
        #: what the table could not see (a torch DDP with a comm hook of the user's)
        self.notes: list = []

    def table(self) -> str:
        lines = [f"block time (measured): {self.seconds * 1e3:.1f} ms",
                 "memory (measured, MiB)   " + " ".join(f"{c:>11}" for c in CATEGORIES) + f"{'total':>11}"]
        for label, row in (("now", self.memory), ("peak of each", self.peak)):
            total = row.get("total", sum(row.get(c, 0) for c in CATEGORIES))
            lines.append(f"{label:<25}" + " ".join(f"{row.get(c, 0) / 2**20:>11.3f}" for c in CATEGORIES)
                         + f"{total / 2**20:>11.3f}")
        host = [c for c in HOST_CATEGORIES if self.memory.get(c) or self.peak.get(c)]
        if host:  # offloaded model states: on the host, not in the device's total
            lines.append("host (measured, MiB)     " + " ".join(f"{c:>15}" for c in host))
            for label, row in (("now", self.memory), ("peak of each", self.peak)):
                lines.append(f"{label:<25}" + " ".join(f"{row.get(c, 0) / 2**20:>15.3f}" for c in host))
        lines.append("")
        lines.append(f"{'axis':<6}{'phase':<10}{'op':<16}{'calls':>6}{'payload B (measured)':>22}"
                     f"{'ring cost B (formula)':>23}")
        for r in self.collectives:
            lines.append(f"{r['axis']:<6}{r['phase']:<10}{r['op']:<16}{r['calls']:>6}{r['payload_bytes']:>22,}"
                         f"{r['ring_cost_bytes']:>23,.0f}")
        if not self.collectives:
            lines.append("(no collectives inside the block)")
        if self.allocator_at_peak is not None:
            lines.append(f"CUDA allocator at the ledger's peak (measured): {self.allocator_at_peak / 2**20:.3f} MiB; "
                         f"largest allocated − ledger: {self.allocator_gap_max / 2**20:.3f} MiB")
        lines += self.notes
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


def _device_of(objects):
    """The device whose memory the block uses: the rank's, in a launch or the user's process group; else the
    device of the first parameter among ``objects`` (a loop on one GPU); None when there is none."""
    import torch.distributed as dist

    if context._current is not None or (dist.is_available() and dist.is_initialized()):
        return context.current().device
    for obj in objects:
        module = _modules(obj)
        for p in module.parameters() if module is not None else ():
            return p.device
    return None


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
    m = Measurement(_device_of(objects))  # in a bare torchrun loop: its context (and device clock) from here on
    for obj in objects:
        _track(m.ledger, obj)
    torch_side = any(_torch_side(obj) for obj in objects)
    for obj in objects:
        _route_torch_ddp(obj)
    m.notes = [obj._zerokit_ledgered for obj in objects if isinstance(getattr(obj, "_zerokit_ledgered", None), str)]
    for module in {id(x): x for x in map(_modules, objects) if x is not None}.values():
        m.ledger.instrument(module)
    ledger = comm.ledger()
    start = len(ledger.records)
    m.ledger.sample("start")
    began = clock.mark()
    try:
        # torch's own wrappers issue their collectives through torch.distributed: record them while the block runs
        recording = ledgered_torch_collectives("measure") if torch_side else nullcontext()
        with m.ledger.watch_activations(), recording:
            yield m
    finally:
        m.seconds = clock.elapsed(began, clock.mark())
        m.ledger.sample("end")
        m.ledger.remove_hooks()
        m.memory = m.ledger.current()
        m.peak = dict(m.ledger.peak_by_category, total=m.ledger.peak_total)
        m.allocator_at_peak, m.allocator_gap_max = m.ledger.allocator_at_peak, m.ledger.allocator_gap_max
        rows: dict = {}
        for r in ledger.records[start:]:
            row = rows.setdefault((r.axis, r.phase, r.op), {"axis": r.axis, "phase": r.phase, "op": r.op,
                                                            "calls": 0, "payload_bytes": 0, "ring_cost_bytes": 0})
            row["calls"] += 1
            row["payload_bytes"] += r.payload_bytes
            row["ring_cost_bytes"] += r.ring_cost_bytes
        m.collectives = list(rows.values())
