"""The engine: one strategy behind DeepSpeed's verbs, for a user's own training loop.

``zerokit.initialize`` returns one; ``zerokit.train`` drives the same object, so a loop
written by hand and the measured runs go through one code path. Lifecycle per
optimizer step, with ``gradient_accumulation_steps`` = A:

1. ``engine(x)`` (forward, phase ``forward``): for the first A − 1 micro-batches the
   forward and its backward run under the strategy's ``no_sync`` (gradients accumulate
   locally; a wrapped torch DDP must see ``no_sync`` already at forward);
2. ``engine.backward(loss)`` (phase ``backward``): the loss divided by A, as DeepSpeed
   does, then the strategy's backward; the A-th one reduces the gradients;
3. ``engine.step()`` (phase ``step``): at the accumulation boundary the strategy steps
   its optimizer (on its shards) and the gradients are zeroed; in between it only counts.

``engine.module`` is the model, ``engine.strategy`` the mechanism (``ddp``, ``zero1``,
``zero2``, ``zero3``…), ``engine.full_state_dict()`` the whole parameters on rank 0, and
``zerokit.measure(engine)`` reads its ledgers around any block of the loop.

Wrapping needs a process group: inside ``zerokit.launch`` or under ``torchrun``
(:func:`zerokit.runtime.wrapping.rank_context` says how to start one when there is none).
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from ..runtime import comm
from ..runtime.wrapping import mark_wrapped, rank_context, wrapper_kind  # noqa: F401 - the wrappers' setup
from ..expert_parallel.moe import backward_scale
from ..zero.state_dict import full_state_dict
from .optimizer_face import EngineOptimizer


class Engine:
    """A strategy behind ``engine(x)``, ``engine.backward(loss)``, ``engine.step()`` (see the module docstring)."""

    def __init__(self, strategy, gradient_accumulation_steps: int = 1, zero_grad_after_step: bool = True):
        if isinstance(gradient_accumulation_steps, bool) or not isinstance(gradient_accumulation_steps, int) \
                or gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps={gradient_accumulation_steps!r} must be a positive integer")
        self.strategy = strategy
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.zero_grad_after_step = zero_grad_after_step
        #: micro-batches seen since the last optimizer step
        self.micro_steps = 0
        #: optimizer steps taken
        self.global_steps = 0
        self._no_sync = None
        self._optimizer = None
        #: DeepSpeed's ``scheduler`` block (zerokit.initialize), stepped after every optimizer step; None: none
        self.lr_scheduler = None

    # -- the model ------------------------------------------------------------------------
    @property
    def module(self) -> torch.nn.Module:
        return self.strategy.model

    @property
    def optimizer(self):
        """DeepSpeed's ``engine.optimizer``: a ``torch.optim.Optimizer`` whose ``param_groups`` are those of the torch
        optimizer stepping this rank's tensors (fp32 masters of its shards under ZeRO), so torch's LR schedulers drive
        it; its ``step()`` is :meth:`step` (:mod:`.optimizer_face`)."""
        if self._optimizer is None:
            held = getattr(self.strategy, "optimizer", None)
            inner = getattr(held, "optimizer", held)
            self._optimizer = EngineOptimizer(self, inner) if isinstance(inner, torch.optim.Optimizer) else held
        return self._optimizer

    def is_gradient_accumulation_boundary(self) -> bool:
        """True for the micro-batch whose backward reduces the gradients (the A-th of a step)."""
        return (self.micro_steps + 1) % self.gradient_accumulation_steps == 0

    # -- DeepSpeed's verbs ----------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        if self._no_sync is None and not self.is_gradient_accumulation_boundary():
            self._no_sync = self.strategy.no_sync()
            self._no_sync.__enter__()
        with comm.phase("forward"):
            return self.strategy.forward(*args, **kwargs)

    def backward(self, loss: torch.Tensor, scale: bool = True) -> None:
        """Back-propagate ``loss`` / A (``scale=False``: as given); reduce at the accumulation boundary."""
        factor = 1.0
        if scale and self.gradient_accumulation_steps > 1:
            factor = 1.0 / self.gradient_accumulation_steps
            loss = loss / self.gradient_accumulation_steps
        try:
            with comm.phase("backward"), backward_scale(factor):  # a mixture of experts' aux loss, scaled alike
                self.strategy.backward(loss)
        finally:
            self._leave_no_sync()
        self.micro_steps += 1

    def _leave_no_sync(self) -> None:
        if self._no_sync is not None:
            ctx, self._no_sync = self._no_sync, None
            ctx.__exit__(None, None, None)

    def step(self) -> None:
        """At the accumulation boundary: the optimizer step (then ``zero_grad``); otherwise nothing. It goes through
        ``engine.optimizer.step()``, so an LR scheduler on ``engine.optimizer`` sees the step."""
        optimizer = self.optimizer
        if hasattr(optimizer, "_engine"):
            optimizer.step()
        else:
            self._step()

    def _step(self) -> None:
        if self.micro_steps % self.gradient_accumulation_steps:
            return
        if self.micro_steps == 0:
            raise RuntimeError("engine.step() before any engine.backward(loss): nothing to step")
        with comm.phase("step"):
            self.strategy.step()
        if self.lr_scheduler is not None:  # as DeepSpeed's engine: the config's scheduler after every step
            self.lr_scheduler.step()
        self.global_steps += 1
        self.micro_steps = 0
        if self.zero_grad_after_step:
            self.zero_grad()

    def zero_grad(self) -> None:
        self.strategy.zero_grad()

    def no_sync(self):
        """Accumulate without reducing, as torch DDP's ``no_sync`` (the engine does it by itself for A > 1)."""
        return self.strategy.no_sync()

    # -- what it holds ---------------------------------------------------------------------
    def full_state_dict(self):
        """Every parameter whole, on rank 0 (a collective: every rank calls it); None elsewhere."""
        return full_state_dict(self.strategy)

    def track_memory(self, ledger) -> None:
        self.strategy.track_memory(ledger)

    def gathered(self):
        """Parameters whole inside the block (ZeRO-3 gathers every unit; the others hold them already)."""
        gathered = getattr(self.strategy, "gathered", None)
        return gathered() if gathered is not None else nullcontext()
