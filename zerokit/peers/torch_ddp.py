"""Peers: the same jobs run by torch's own implementations, measured in the same ledgers.

``torch-ddp`` is torch's DistributedDataParallel with a communication hook that sends
each bucket through :mod:`zerokit.comm`, so the ledger counts what DDP really
reduces (its buckets), by the same rules as zerokit's own strategies.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..runtime import comm
from ..strategies.base import Option, Replicated, boolean, positive_number, register


def _ledgered_allreduce_hook(process_group, bucket):
    """DDP's default hook (divide by N, all-reduce), routed through zerokit.comm."""
    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size(group))
    work = comm.all_reduce(tensor, group=process_group, async_op=True, tag="torch-ddp bucket")
    record = work.record

    def done(fut):
        record.t_end = time.perf_counter()
        return fut.value()[0]

    return work._work.get_future().then(done)


@register
class TorchDDP(Replicated):
    """torch.nn.parallel.DistributedDataParallel: the first peer."""

    name = "torch-ddp"
    stage = 0
    peer = True
    options = {
        "bucket_mb": Option(25.0, positive_number, "a positive number of MiB (DDP's bucket_cap_mb)"),
        "gradient_as_bucket_view": Option(True, boolean, "True or False"),
    }

    def __init__(self, model, ctx, config, **options):
        super().__init__(model, ctx, config, **options)
        self.ddp = DistributedDataParallel(
            model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            bucket_cap_mb=self.opts["bucket_mb"], gradient_as_bucket_view=self.opts["gradient_as_bucket_view"])
        self.ddp.register_comm_hook(None, _ledgered_allreduce_hook)

    def forward(self, inputs):
        return self.ddp(inputs)

    @contextmanager
    def no_sync(self):
        with self.ddp.no_sync():
            yield

