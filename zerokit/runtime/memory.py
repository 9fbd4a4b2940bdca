"""The memory ledger: bytes a rank holds, by category, measured from tensor storages.

Categories follow ZeRO §3: ``params``, ``grads``, ``optimizer`` (states, and the fp32
master copy in mixed precision), ``buffers`` (what a strategy allocates for itself:
buckets, shards, gather buffers, and the model's registered buffers) and
``activations`` (tensors autograd saved for backward, seen through saved-tensor hooks).

The ledger is told *where* to look (a model, an optimizer, a strategy's buffers) and
reads the bytes itself, every time, from ``untyped_storage().nbytes()``. Each storage is
counted once, in the first category that holds it (params, grads, optimizer, buffers,
activations), so a parameter that is a view into a flat buffer costs the buffer once,
and a storage resized to 0 — a released shard — costs nothing.

Host categories (``host_params``, ``host_grads``, ``host_optimizer``) hold the model states
that :mod:`zerokit.offload` keeps on the host. They are read the same way, after the
device's, and counted apart: ``total`` and the peak are the device's, ``host_total`` the
host's. A ledger made for a ``device`` counts in a device category only the storages on
that device: a model state found elsewhere is the host's (torch's non-fused Adam keeps
its ``step`` scalars on the host while the parameters are on a GPU), and a buffer or
activation elsewhere is not the device's memory.

On CUDA each sample also reads the caching allocator (``torch.cuda.memory_allocated``):
``allocator_at_peak`` is its count at the ledger's peak sample, ``allocator_gap_max`` the
largest allocated − ledger over the samples and ``allocator_gap_where`` where. The gap is
what the ledger does not name — transients such as the logits' gradient, the fp32 copies
of 16-bit gradients, cuBLAS's workspace (:func:`zerokit.theory.step_transients` sizes
them) — reported next to the ledger, never folded into it.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Optional, Union

import torch

CATEGORIES = ("params", "grads", "optimizer", "buffers", "activations")
#: model states resting on the host (zerokit.offload): never part of the device's ``total``
HOST_CATEGORIES = ("host_params", "host_grads", "host_optimizer")

TensorSource = Union[torch.Tensor, Callable[[], Iterable[torch.Tensor]]]


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor whose storage holds ``t``'s bytes on this rank: under a wrapper subclass (a DTensor,
    an async collective's result) its local shard, else ``t`` itself. A wrapper has no storage of its own."""
    while type(t) is not torch.Tensor and hasattr(t, "__tensor_flatten__"):
        inner, _ = t.__tensor_flatten__()
        if not inner:
            break
        t = getattr(t, inner[0])
    return t


def _storage_key(t: torch.Tensor):
    s = local_tensor(t).untyped_storage()
    return (s.data_ptr(), s.device), s.nbytes()


class _Saved:
    """What autograd holds for a saved tensor while the ledger watches activations."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class MemoryLedger:
    """Current and peak bytes per category on one rank."""

    def __init__(self, device: Optional[torch.device] = None):
        #: the rank's device: only its storages count in the device categories (None: every storage counts)
        self.device = device
        self._sources: dict = {c: [] for c in CATEGORIES + HOST_CATEGORIES}
        self._saved: list = []
        self.peak_total = 0
        self.peak_breakdown = {c: 0 for c in CATEGORIES}
        self.peak_where = ""
        #: the largest value each category reached at any sample (its own peak, not at the total's)
        self.peak_by_category = {c: 0 for c in CATEGORIES + HOST_CATEGORIES}
        self.samples = 0
        self._hooks: list = []
        #: id → weak reference of every tensor whose gradient is sampled (:meth:`instrument`)
        self._watched: dict = {}
        #: measured by the allocator (CUDA only, else None): bytes allocated at the ledger's peak sample, and the
        #: largest allocated − ledger total over the samples, with where it was sampled
        self.allocator_at_peak: Optional[int] = None
        self.allocator_gap_max: Optional[int] = None
        self.allocator_gap_where = ""

    # -- where to look ----------------------------------------------------------------
    def track(self, category: str, source: TensorSource) -> None:
        """Watch a tensor, or a callable returning tensors, under ``category``."""
        if category not in CATEGORIES[:-1] + HOST_CATEGORIES:
            raise ValueError(f"category={category!r}; allowed: {', '.join(CATEGORIES[:-1] + HOST_CATEGORIES)}")
        self._sources[category].append(source)

    def track_model(self, model: torch.nn.Module) -> None:
        """Parameters, their gradients and the model's registered buffers."""
        self.track("params", lambda: [p for p in model.parameters()])
        self.track("grads", lambda: [p.grad for p in model.parameters() if p.grad is not None])
        self.track("buffers", lambda: list(model.buffers()))

    def track_optimizer(self, optimizer: torch.optim.Optimizer, host: bool = False) -> None:
        """Optimizer states, the parameters it steps (fp32 masters) and their gradients (``host``: on the host)."""
        where = "host_" if host else ""
        def states():
            for state in optimizer.state.values():
                for v in state.values():
                    if torch.is_tensor(v):
                        yield v
            for group in optimizer.param_groups:
                yield from group["params"]

        def master_grads():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        yield p.grad

        self.track(f"{where}grads", master_grads)
        self.track(f"{where}optimizer", states)

    # -- activations ------------------------------------------------------------------
    @contextmanager
    def watch_activations(self) -> Iterator[None]:
        """Count tensors saved for backward inside the block until autograd frees them."""
        def pack(t):
            # detached: the same storage, without the grad_fn that holds this very holder — a saved output kept
            # with its grad_fn would make a cycle through autograd's C++ nodes that no collector frees, and a
            # graph kept by retain_graph=True (ZB-H1's split backward) would then never be freed
            holder = _Saved(t.detach())
            self._saved.append(weakref.ref(holder))
            return holder

        def unpack(holder):
            return holder.tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    def _saved_tensors(self) -> list:
        alive, tensors = [], []
        for ref in self._saved:
            holder = ref()
            if holder is not None:
                alive.append(ref)
                tensors.append(holder.tensor)
        self._saved = alive
        return tensors

    # -- reading ----------------------------------------------------------------------
    def _tensors(self, category: str) -> Iterator[torch.Tensor]:
        if category == "activations":
            yield from self._saved_tensors()
            return
        for source in self._sources[category]:
            items = [source] if torch.is_tensor(source) else source()
            for t in items:
                if t is not None:
                    yield t

    def _elsewhere(self, key) -> bool:
        """Whether a storage (by its key) is off this ledger's device."""
        if self.device is None:
            return False
        device = key[1]
        return device.type != self.device.type or (self.device.index is not None and device.index != self.device.index)

    def current(self) -> dict:
        """Bytes per category now, each storage counted once; ``total`` on the device, ``host_total`` on the host."""
        seen: set = set()
        out = {c: 0 for c in CATEGORIES + HOST_CATEGORIES}
        for category in CATEGORIES + HOST_CATEGORIES:
            for t in self._tensors(category):
                key, nbytes = _storage_key(t)
                if nbytes == 0 or key in seen:
                    continue
                seen.add(key)
                if category in CATEGORIES and self._elsewhere(key):
                    if f"host_{category}" in out:  # a model state held off the device: the host's
                        out[f"host_{category}"] += nbytes
                    continue
                out[category] += nbytes
        out["total"] = sum(out[c] for c in CATEGORIES)
        out["host_total"] = sum(out[c] for c in HOST_CATEGORIES)
        return out

    def model_states(self) -> dict:
        now = self.current()
        return {"params": now["params"], "grads": now["grads"], "optimizer": now["optimizer"]}

    def sample(self, where: str = "") -> int:
        """Read the current bytes and keep the peak; returns the current total."""
        now = self.current()
        allocated = _allocated(self.device)
        self.samples += 1
        for c in CATEGORIES + HOST_CATEGORIES:
            self.peak_by_category[c] = max(self.peak_by_category[c], now[c])
        if now["total"] > self.peak_total:
            self.peak_total = now["total"]
            self.peak_breakdown = {c: now[c] for c in CATEGORIES}
            self.peak_where = where
            self.allocator_at_peak = allocated
        if allocated is not None and (self.allocator_gap_max is None or allocated - now["total"] > self.allocator_gap_max):
            self.allocator_gap_max, self.allocator_gap_where = allocated - now["total"], where
        return now["total"]

    def reset_peak(self) -> None:
        self.peak_total = 0
        self.peak_breakdown = {c: 0 for c in CATEGORIES}
        self.peak_where = ""
        self.peak_by_category = {c: 0 for c in CATEGORIES + HOST_CATEGORIES}
        self.allocator_at_peak = self.allocator_gap_max = None
        self.allocator_gap_where = ""

    # -- sampling points --------------------------------------------------------------
    def instrument(self, model: torch.nn.Module) -> None:
        """Sample after every module's forward and as every parameter's gradient is produced.

        The parameters watched are those the model holds now and those a module holds when its forward
        begins, each once, under its module's name: a sharded model swaps its gathered parameters into the
        modules for the forward (FSDP2's unsharded parameters, ``zerokit.fully_shard``'s whole ones), and
        autograd gives the gradients to those, never to the shards it holds at rest — so backward is sampled
        there, per parameter, as it is for a model whose parameters stay put."""
        for name, p in model.named_parameters():
            self._watch_gradient(p, name)
        for name, module in model.named_modules():
            label = name or type(module).__name__
            prefix = f"{name}." if name else ""
            self._hooks.append(module.register_forward_pre_hook(
                lambda m, args, prefix=prefix: self._watch_registered(m, prefix)))
            self._hooks.append(module.register_forward_hook(
                lambda m, i, o, label=label: self._sample_hook(f"forward {label}")))

    def _watch_registered(self, module: torch.nn.Module, prefix: str) -> None:
        """A module's forward begins: watch the parameters registered in it now (after the strategy's own
        pre-forward hooks, which swap gathered parameters in)."""
        for name, p in module._parameters.items():
            if p is not None:
                self._watch_gradient(p, prefix + name)

    def _watch_gradient(self, p: torch.Tensor, name: str) -> None:
        """Sample when autograd produces ``p``'s gradient (before it lands in ``.grad``); once per tensor."""
        if not p.requires_grad:
            return
        seen = self._watched.get(id(p))
        if seen is not None and seen() is p:
            return
        self._watched[id(p)] = weakref.ref(p)
        self._hooks.append(p.register_hook(lambda g, name=name: self._sample_hook(f"backward {name}")))

    def _sample_hook(self, where: str) -> None:
        """A hook must return None, or it would replace the module's output or the gradient."""
        self.sample(where)

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._watched.clear()


def _allocated(device: Optional[torch.device]) -> Optional[int]:
    """The caching allocator's bytes in use on a CUDA ``device``; None elsewhere."""
    if device is not None and device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return None


def reset_cuda_peak(device: torch.device) -> None:
    """Start torch's peak count again (after setup, so that it covers what the ledger samples: the steps)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def cuda_peak_bytes(device: torch.device):
    """torch's own count of the peak since :func:`reset_cuda_peak`, to cross-check the ledger on CUDA; None
    elsewhere."""
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated(device))
    return None
