"""``zerokit.DistributedDataParallel``: torch's DDP interface over zerokit's ``ddp`` strategy.

Lifecycle, as with ``torch.nn.parallel.DistributedDataParallel``:

1. construction (every rank, same module structure): rank 0's parameters and buffers
   are broadcast over the data-parallel group (phase ``setup``), so ranks that built
   their models from different seeds start equal; parameters with
   ``requires_grad=False`` are left alone (broadcast, never reduced); the gradient
   buckets and hooks of zerokit's ``ddp`` (:mod:`zerokit.data_parallel.overlap`) are
   attached to the module's own parameters — a tied parameter is one parameter, so it
   is reduced once;
2. ``wrapper(x)`` runs ``wrapper.module``; ``loss.backward()`` launches each full
   bucket's all-reduce from the hooks and, when it returns, every gradient holds the
   mean over the ranks (the end-of-backward callback waited for them);
3. ``with wrapper.no_sync():`` accumulates locally; the first backward outside it
   reduces the sum; ``finish_gradient_synchronization()`` reduces accumulated gradients
   without another backward (what a pipeline does);
4. the user's own optimizer, built on ``wrapper.parameters()`` (the module's), steps.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ..parallelize import parallelize
from ..runtime import comm
from ..runtime.wrapping import broadcast_from_first, mark_wrapped, rank_context  # noqa: F401 - the wrappers' setup
from ..data_parallel.overlap import OverlappedDataParallel
from ..strategies.base import TrainConfig


def precision_of(module: nn.Module) -> str:
    dtypes = {p.dtype for p in module.parameters()}
    return "bf16-mixed" if torch.bfloat16 in dtypes else "fp32"


class DistributedDataParallel(nn.Module):
    """torch's DDP, zerokit's buckets and hooks; see the module docstring."""

    data_parallel_wrapper = "zerokit.DistributedDataParallel"  # what runtime.wrapping.wrapper_kind calls it

    def __init__(self, module: nn.Module, bucket_mb: float = 25.0, first_bucket_mb: Optional[float] = None,
                 overlap: bool = True, find_unused_parameters: bool = False):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"zerokit.DistributedDataParallel(module=…) needs an nn.Module, got {type(module).__name__}")
        ctx = rank_context("zerokit.DistributedDataParallel")
        mark_wrapped(module, "zerokit.DistributedDataParallel")
        self.module = module

        broadcast_from_first(module, ctx)
        strategy = parallelize(module, ctx, strategy=OverlappedDataParallel, config=TrainConfig(precision_of(module)),
                               options=dict(bucket_mb=bucket_mb, first_bucket_mb=first_bucket_mb, overlap=overlap,
                                            find_unused_parameters=find_unused_parameters)).strategy
        object.__setattr__(self, "strategy", strategy)  # not a submodule: parameters() stays the module's
        module.__dict__["_zerokit_dp"] = self  # zerokit.pipeline's step holds the reduction to its last micro-batch
        for p in strategy.params:  # a ShardedOptimizer over them steps what this wrapper reduced (no second reduction)
            p._zerokit_reduced_by = "zerokit.DistributedDataParallel"

    def forward(self, *args, **kwargs):
        with comm.phase("forward"):
            return self.module(*args, **kwargs)

    def no_sync(self):
        return self.strategy.no_sync()

    def finish_gradient_synchronization(self) -> None:
        """Reduce the gradients accumulated under ``no_sync`` now, without another backward."""
        with comm.phase("backward"):
            self.strategy.finish_gradient_synchronization()

    def track_memory(self, ledger) -> None:
        """For ``zerokit.measure``: the module, its gradient buckets (the user's optimizer is passed separately)."""
        ledger.track_model(self.module)
        ledger.track("grads", self.strategy.buckets.buffers)
