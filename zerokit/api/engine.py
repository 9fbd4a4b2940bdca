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
(:func:`rank_context` says how to start one when there is none).
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from ..runtime import comm
from ..runtime.context import RankContext, current


def rank_context(who: str) -> RankContext:
    """This rank's context, or a clear error when no process group exists yet."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{who} needs a process group, and none exists in this process: run your loop inside "
                           f"zerokit.launch(fn, world_size) (from a notebook cell too), or start the script with "
                           f"torchrun --nproc-per-node N and call torch.distributed.init_process_group('gloo') first")
    return current()


def wrapper_kind(module) -> str:
    """What data-parallel wrapper ``module`` is (torch's DDP, zerokit's, FSDP2's ``fully_shard``), or ""."""
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    from .ddp import DistributedDataParallel

    if isinstance(module, TorchDDP):
        return "torch's DistributedDataParallel"
    if isinstance(module, DistributedDataParallel):
        return "zerokit.DistributedDataParallel"
    fsdp = getattr(torch.distributed, "fsdp", None)
    if fsdp is not None and isinstance(module, getattr(fsdp, "FSDPModule", ())):
        return "FSDP2's fully_shard"
    return ""


def mark_wrapped(module: torch.nn.Module, who: str) -> None:
    """Refuse a module some zerokit wrapper (or engine) already owns, or a data-parallel wrapper itself: each reduces
    the gradients, so two of them would reduce every gradient twice."""
    kind = wrapper_kind(module)
    if kind:
        raise ValueError(f"{who}: the module is already wrapped by {kind}, which reduces its gradients; a second "
                         f"wrapper would reduce them again. Pass the original model (the wrapper's .module), once")
    owner = getattr(module, "_zerokit_wrapped_by", None)
    if owner is not None:
        raise ValueError(f"{who}: this module is already wrapped by {owner}; wrap the original module once "
                         f"(use the existing wrapper, or rebuild the model)")
    module._zerokit_wrapped_by = who


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
            from .optimizer_face import EngineOptimizer

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
        from ..expert_parallel.moe import backward_scale

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
        from ..zero.state_dict import full_state_dict

        return full_state_dict(self.strategy)

    def track_memory(self, ledger) -> None:
        self.strategy.track_memory(ledger)

    def gathered(self):
        """Parameters whole inside the block (ZeRO-3 gathers every unit; the others hold them already)."""
        gathered = getattr(self.strategy, "gathered", None)
        return gathered() if gathered is not None else nullcontext()
