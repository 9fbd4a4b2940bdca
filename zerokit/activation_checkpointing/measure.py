"""What a checkpointing policy keeps, measured on a model's chain of blocks, two ways.

Lifecycle of one measurement (:func:`block_activations`): a fresh copy of the model gets
the policy; an input (the first block's, detached and requiring a gradient, as the
embeddings' output would) runs through the first group of repeated blocks, chained, and
``sum()`` of the last output goes backward — nothing outside the blocks saves anything.

- **the ledger** (:class:`~zerokit.runtime.memory.MemoryLedger`, the model's parameters and
  gradients tracked so they are not counted again): ``watch_activations()`` is active for
  forward *and* backward, so it counts what autograd saves, the checkpoints' kept inputs and
  a recompute's tensors, deduplicated by storage; ``stored`` is read after forward, ``peak``
  is the largest value sampled after any module's forward (recomputes included) or any
  parameter's gradient. Blind to torch's own checkpoint, which keeps inputs in its frame and
  hides its saved tensors behind its innermost hooks.
- **live tensors** (:class:`LiveTensors`, a dispatch mode): every storage an operator
  created and that is still referenced, parameters and (pre-allocated) gradients left out:
  what the process really holds, any checkpointing implementation, temporaries included.

:func:`step_time` times forward + backward of the whole model (overhead ratios);
:func:`scale_chain` builds a chain whose blocks keep exactly their input's size (Chen's model).
"""
from __future__ import annotations

import copy
import time
import weakref
from typing import Optional

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..runtime.memory import MemoryLedger
from .policies import apply_checkpointing, block_groups


class ScaleBlock(nn.Module):
    """tanh(x·w): it saves its input and its output, so its activations are its input's size — Chen et al.'s
    model of a block, where n blocks in segments of k keep k + n/k blocks' worth at the peak."""

    def __init__(self, d: int):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, d))  # host: a CPU measurement model

    def forward(self, x):
        return torch.tanh(x * self.w)


def scale_chain(n: int, d: int) -> nn.Sequential:
    """n :class:`ScaleBlock` of width d, chained."""
    return nn.Sequential(*[ScaleBlock(d) for _ in range(n)])


def _key(t: torch.Tensor):
    s = t.untyped_storage()
    return (s.data_ptr(), str(s.device)), s.nbytes()


class LiveTensors(TorchDispatchMode):
    """Bytes of the storages operators created under the mode that are still alive; ``peak`` their maximum.

    Storages of ``exclude`` (parameters, gradients allocated beforehand) are never counted.
    """

    def __init__(self, exclude=()):
        super().__init__()
        self._excluded = {_key(t)[0] for t in exclude}
        self._live: dict = {}
        self._refs: dict = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and id(t) not in self._refs:
                self._track(t)
        return out

    def _track(self, t: torch.Tensor) -> None:
        key, nbytes = _key(t)
        if nbytes == 0 or key in self._excluded:
            return
        entry = self._live.get(key)
        if entry is None:
            entry = self._live[key] = [nbytes, 0]
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        ident = id(t)
        self._refs[ident] = weakref.ref(t, lambda _, key=key, ident=ident: self._release(key, ident))

    def _release(self, key, ident) -> None:
        self._refs.pop(ident, None)
        entry = self._live.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                self.current -= entry[0]
                del self._live[key]


def _chain(model: nn.Module):
    modules = dict(model.named_modules())
    groups = block_groups(model)
    if not groups:
        raise ValueError(f"{type(model).__name__} has no repeated blocks to measure")
    return [modules[name] for name in groups[0]]


def block_activations(model: nn.Module, x: torch.Tensor, policy: str = "none", every: Optional[int] = None,
                      seed: int = 0, live: bool = True) -> dict:
    """Bytes the first group of ``model``'s blocks keeps for backward under ``policy`` (on a copy of the model).

    Returns ``stored`` (ledger, after forward), ``peak`` (ledger, forward and backward),
    ``live_stored`` / ``live_peak`` (:class:`LiveTensors`; the chain's input and output are
    alive too and included; ``live=False`` skips this slower pass), ``recomputed_forwards``,
    ``blocks`` and ``segment_layers``.
    """
    out = {}
    for how in ("ledger", "live") if live else ("ledger",):
        m = copy.deepcopy(model)
        handle = apply_checkpointing(m, policy, every)
        blocks = _chain(m)
        for p in m.parameters():
            p.grad = torch.zeros_like(p) if p.requires_grad else None
        torch.manual_seed(seed)
        if how == "ledger":
            inp = x.detach().clone().requires_grad_()
            ledger = MemoryLedger()
            ledger.track_model(m)
            ledger.instrument(m)
            with ledger.watch_activations():
                y = inp
                for block in blocks:
                    y = block(y)
                out["stored"] = ledger.sample("after forward") and ledger.current()["activations"]
                y.sum().backward()
            ledger.remove_hooks()
            out["peak"] = ledger.peak_by_category["activations"]
        else:
            exclude = [t for p in m.parameters() for t in (p, p.grad) if t is not None]
            with LiveTensors(exclude) as live:
                y = inp = x.detach().clone().requires_grad_()  # created under the mode: counted, as a boundary
                for block in blocks:
                    y = block(y)
                out["live_stored"] = live.current
                y.sum().backward()
            out["live_peak"] = live.peak
        out["recomputed_forwards"] = handle.recomputed_forwards
        out["blocks"] = len(blocks)
        out["segment_layers"] = handle.segment_layers
        del y
    return out


def step_time(model: nn.Module, inputs: torch.Tensor, policy: str = "none", every: Optional[int] = None,
              repeats: int = 5, loss=lambda out: out.float().pow(2).mean()) -> float:
    """Median seconds of forward + backward of the whole model under ``policy`` (a copy; one warm-up)."""
    m = copy.deepcopy(model)
    apply_checkpointing(m, policy, every)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        loss(m(inputs)).backward()
        times.append(time.perf_counter() - t0)
    times = sorted(times[1:])
    return times[len(times) // 2]
