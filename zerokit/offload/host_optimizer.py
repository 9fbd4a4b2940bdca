"""The optimizer on the host (ZeRO-Offload, arXiv 2101.06840 §4): fp32 master, Adam's states and the step.

:class:`HostOptimizer` takes the place of :class:`~zerokit.optim.MasterOptimizer` for a ZeRO
strategy with ``offload="optimizer"`` or ``"params"``. Its lifecycle, per step:

1. **setup**: every stepped tensor (a rank's flat parameter shard, on the device) is copied
   to the host once (d2h) and becomes the fp32 *master* there; Adam's m, v and step live
   next to it. A host gradient buffer of the shard's dtype is allocated per tensor. A
   tensor that already *rests* on the host (a ZeRO-3 shard under ``offload="params"``)
   needs no copy; in fp32 it is its own master.
2. **gradients out** (:meth:`grads_out`): the device's reduced gradient shard is copied
   into the host buffer (d2h), 16-bit as it is; a later micro-batch's shard of the same
   step is copied next to it and added on the host.
3. **step** (:meth:`step`): the host casts the gradients to fp32 and runs, on a GPU machine
   with this rank's share of the cores (:func:`host_threads`), torch's fastest CPU optimizer — ``AdamW(fused=True)`` (``SGD(fused=True)`` for SGD; a spec carrying a
   torch optimizer class is built with its own arguments, fused where torch has a fused
   kernel); the bench suite ``zerokit bench offload`` measures it against ``foreach`` and
   the for-loop.
4. **parameters back** (:meth:`params_in`): the updated master is cast to the shard's dtype
   on the host, into the gradient buffer (free by now: it doubles as the staging buffer,
   so the host holds no third copy), and copied to the device shard (h2d). A shard that
   rests on the host is written there, and nothing crosses.

Every copy goes through :mod:`.transfers`, so the bytes are counted where they cross.

On CUDA the host buffers are pinned and the copies run non-blocking on a side stream,
ordered with the compute stream by :mod:`.streams` (made for the rank's ``device``, never
a resting shard's): the side stream waits for the compute stream before a copy reads a
gradient or overwrites a shard; the step waits for the side stream before it reads the
host buffers; the compute stream waits for the parameter copies before anything reads
the shards. The order is checked on the CPU with a recording stream
(``tests/offload/test_offload_streams.py``); the GPU run is ``benchmarks/gpu_check.py``'s.
On the CPU the copies are synchronous: bytes and copies are real, PCIe time is not.
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence

import torch
import torch.nn as nn

from ..optim import OptimizerSpec
from . import streams
from .transfers import copy, host_empty, to_host

#: torch's three CPU implementations of the optimizers: one fused kernel, multi-tensor, one tensor at a time
IMPLEMENTATIONS = ("fused", "foreach", "for-loop")


def build_optimizer(params, spec: OptimizerSpec, implementation: str = "fused") -> torch.optim.Optimizer:
    """``spec``'s torch optimizer over ``params`` in one of :data:`IMPLEMENTATIONS` (same arithmetic, other kernels)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r}; allowed: {', '.join(IMPLEMENTATIONS)}")
    flags = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}[implementation]
    custom = getattr(spec, "optimizer_class", None)
    if custom is not None:  # any torch optimizer class with its own arguments; torch's fused kernel where it has one
        kwargs = dict(getattr(spec, "kwargs", ()))
        if custom in (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD) and not {"fused", "foreach"} & set(kwargs):
            kwargs.update(flags)
        return custom(params, **kwargs)
    if spec.name == "adamw":
        return torch.optim.AdamW(params, lr=spec.lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay,
                                 **flags)
    if spec.name == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay, **flags)
    raise ValueError(f"optimizer {spec.name!r}: the host optimizer steps adamw or sgd, or a torch optimizer class")


def host_threads(device: torch.device) -> Optional[int]:
    """CPU threads for the host step: on a GPU machine the cores idle while the GPUs compute, so each local rank
    takes its share of them (``os.cpu_count() // LOCAL_WORLD_SIZE``, as DeepSpeed's CPU Adam runs on OpenMP's
    threads); None on the CPU, where the cores are the ranks' compute and ``threads_per_rank`` decides."""
    if device.type != "cuda":
        return None
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or max(torch.cuda.device_count(), 1)
    return max(1, (os.cpu_count() or 1) // local)


class HostOptimizer:
    """A torch optimizer stepping fp32 masters on the host for ``tensors`` that live on the device (or rest on the
    host where ``resident`` says so)."""

    #: the masters are copies of the tensors: loading a state dict refreshes them (:mod:`zerokit.zero.state_dict`)
    mixed = True

    def __init__(self, tensors: Sequence[torch.Tensor], spec: OptimizerSpec,
                 resident: Optional[Sequence[bool]] = None, implementation: str = "fused",
                 device: Optional[torch.device] = None):
        self.tensors = list(tensors)
        self.resident = list(resident) if resident is not None else [False] * len(self.tensors)
        if device is None:  # the device of the tensors that do not rest on the host
            device = next((t.device for t, resting in zip(self.tensors, self.resident) if not resting),
                          torch.device("cpu"))
        #: the side stream of the copies (CUDA only): the rank's device's, whatever the first tensor's is
        self.stream = streams.side_stream(device)
        #: threads for the host step (None: the process's setting; see :func:`host_threads`)
        self.threads = host_threads(device)
        #: :class:`zerokit.optim.GradientClipping` before each step (None: none)
        self.clipping = None
        self._after_compute([t for t, resting in zip(self.tensors, self.resident) if not resting])
        copies = [t.detach() if resting else to_host(t.detach(), f"master {i}", self.stream)
                  for i, (t, resting) in enumerate(zip(self.tensors, self.resident))]
        self._sync()
        #: True where the master is the tensor itself (an fp32 shard resting on the host)
        self.own_master = [resting and t.dtype == torch.float32 for t, resting in zip(self.tensors, self.resident)]
        self.masters: List[nn.Parameter] = [nn.Parameter(c if c.dtype == torch.float32 else c.float()) for c in copies]
        #: one host gradient buffer per tensor, in the tensor's dtype; after the step, the 16-bit staging buffer
        self.host_grads = [host_empty(t.detach(), stream=self.stream) for t in self.tensors]
        self._arrived = [False] * len(self.tensors)
        self.optimizer = build_optimizer(self.masters, spec, implementation)

    # -- the copies ------------------------------------------------------------------
    def _sync(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    def _after_compute(self, tensors) -> None:
        """CUDA: the side stream waits for the compute stream; the device tensors stay alive for it."""
        if self.stream is not None:
            self.stream.after_compute(tensors)

    @torch.no_grad()
    def grads_out(self, grads: Sequence[Optional[torch.Tensor]]) -> None:
        """Copy each device gradient shard to the host (d2h); a second one in the same step is added to the first.
        None: this tensor has no gradient from the device now."""
        self._after_compute([g for g in grads if g is not None])
        for i, g in enumerate(grads):
            if g is None:
                continue
            if not self._arrived[i]:
                copy(self.host_grads[i], g.detach(), "d2h", f"grads {i}", self.stream)
                self._arrived[i] = True
            else:  # accumulation: the host adds the micro-batches' shards
                staged = to_host(g.detach(), f"grads {i}", self.stream)
                self._sync()
                self.host_grads[i].add_(staged)

    @torch.no_grad()
    def params_in(self) -> None:
        """The updated masters back where the shards live: cast on the host, then copied to the device (h2d)."""
        crossing = [i for i in range(len(self.tensors)) if not (self.own_master[i] or self.resident[i])]
        self._after_compute([self.tensors[i] for i in crossing])  # the compute stream may still read the old shard
        for i, (t, master) in enumerate(zip(self.tensors, self.masters)):
            if self.own_master[i]:
                continue
            if self.resident[i]:
                t.copy_(master)  # the shard rests on the host: a cast in place, nothing crosses
                continue
            source = master if t.dtype == torch.float32 else self.host_grads[i].copy_(master)
            copy(t, source, "h2d", f"params {i}", self.stream)
        if self.stream is not None:
            self.stream.before_compute([self.tensors[i] for i in crossing])

    # -- the step ---------------------------------------------------------------------
    def step(self, grads: Optional[Sequence[Optional[torch.Tensor]]] = None) -> None:
        """Copy ``grads`` out (None entries: already on the host, or none), step on the host, copy params back."""
        if grads is not None:
            self.grads_out(grads)
        self._sync()
        for master, g, arrived in zip(self.masters, self.host_grads, self._arrived):
            master.grad = (g if g.dtype == torch.float32 else g.float()) if arrived else None
        if self.clipping is not None:  # on the host's fp32 gradients (the norm's all-reduce: on the device group)
            self.clipping([master.grad for master in self.masters])
        threads = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        try:
            self.optimizer.step()
        finally:
            torch.set_num_threads(threads)
        for master in self.masters:
            master.grad = None
        self._arrived = [False] * len(self.tensors)
        self.params_in()

    @property
    def step_scalars(self) -> int:
        """Number of Adam ``step`` tensors (one per stepped tensor), on the host."""
        return len(self.masters) if isinstance(self.optimizer, torch.optim.Adam | torch.optim.AdamW) else 0

    # -- measurement ------------------------------------------------------------------
    def track_memory(self, ledger) -> None:
        """The host's share in the memory ledger: masters and states (``host_optimizer``), gradient buffers and the
        fp32 gradients of a step in progress (``host_grads``)."""
        ledger.track("host_grads", lambda: self.host_grads)
        ledger.track_optimizer(self.optimizer, host=True)
