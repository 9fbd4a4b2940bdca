"""``torch-zero1``: torch's ZeroRedundancyOptimizer on top of torch DDP, ZeRO-1 as torch ships it.

Lifecycle of one step:

1. **setup**: the model is wrapped in ``DistributedDataParallel`` whose gradient
   all-reduce goes through the ledger by a comm hook (as ``torch-ddp``); a
   ``ZeroRedundancyOptimizer`` assigns whole parameter tensors to owner ranks and builds
   the local torch optimizer (AdamW or SGD) over the owned ones only;
2. **forward / backward**: DDP's buckets are all-reduced (averaged) through the hook;
3. **step**: each rank steps the tensors it owns, then broadcasts them to the others
   (those broadcasts are counted by :mod:`.recording`).

It shards whole tensors, not a flat buffer, so each rank holds Ψ/N of the optimizer
states only on average. fp32 only: it steps the model's own parameters.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.nn.parallel import DistributedDataParallel

from .. import theory
from ..strategies.base import Option, positive_number, register
from .recording import Peer, fp32_only
from .torch_ddp import BucketBuffers, _ledgered_allreduce_hook


@register
class TorchZero1(Peer):
    """torch DDP (ledgered comm hook) + ZeroRedundancyOptimizer: ZeRO-1 as torch ships it."""

    name = "torch-zero1"
    stage = 1
    options = {"bucket_mb": Option(25.0, positive_number, "a positive number of MiB (DDP's bucket_cap_mb)")}

    def __init__(self, model, ctx, config, **options):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        super().__init__(model, ctx, config, **options)
        fp32_only(self.name, config)
        self.ddp = DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                                           bucket_cap_mb=self.opts["bucket_mb"], gradient_as_bucket_view=True)
        self.buckets = BucketBuffers()
        self.ddp.register_comm_hook(self.buckets, _ledgered_allreduce_hook)
        spec = config.optimizer
        if spec.name == "adamw":
            kwargs = dict(optimizer_class=torch.optim.AdamW, lr=spec.lr, betas=spec.betas, eps=spec.eps,
                          weight_decay=spec.weight_decay, foreach=False)
        else:
            kwargs = dict(optimizer_class=torch.optim.SGD, lr=spec.lr, momentum=spec.momentum,
                          weight_decay=spec.weight_decay, foreach=False)
        self.optimizer = ZeroRedundancyOptimizer(list(model.parameters()), **kwargs)

    def run_forward(self, inputs):
        return self.ddp(inputs)

    @contextmanager
    def no_sync(self):
        with self.ddp.no_sync():
            yield

    def run_step(self):
        self.optimizer.step()

    def track_memory(self, ledger):
        super().track_memory(ledger)
        self.buckets.track(ledger)
        ledger.track_optimizer(self.optimizer.optim)

    def optimizer_tensors(self):
        local = self.optimizer.optim
        return sum(len(g["params"]) for g in local.param_groups) if self.config.optimizer.name == "adamw" else 0

    def theory_model_states(self, psi):
        # ZeroRedundancyOptimizer shards whole tensors, not a flat buffer: Ψ/N only on average
        return theory.model_state_bytes(1, psi, self.ctx.world_size, self.config.precision,
                                        self.config.optimizer.name, units=[psi],
                                        optimizer_tensors=self.optimizer_tensors())

    def theory_comm_bytes(self, psi):
        """The theory shown is DDP's all-reduce, 2(N−1)/N·Ψb; the owners' broadcasts of updated tensors come on top."""
        b = theory.param_bytes_per_element(self.config.precision)
        return theory.comm_bytes_per_step(0, psi, self.ctx.world_size, b)
