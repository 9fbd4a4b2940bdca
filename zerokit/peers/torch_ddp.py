"""Peers: the same jobs run by torch's own implementations, measured in the same ledgers.

``torch-ddp`` is torch's DistributedDataParallel with a communication hook that sends
each bucket through :mod:`zerokit.comm`, so the ledger counts what DDP really
reduces (its buckets), by the same rules as zerokit's own strategies; the same hook shows
the memory ledger the buckets themselves (:class:`BucketBuffers`).
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager

from torch.nn.parallel import DistributedDataParallel

from ..runtime.torch_recording import ledgered_allreduce_hook as _ledgered_allreduce_hook
from ..strategies.base import Option, Replicated, boolean, positive_number, register


class BucketBuffers:
    """The flat bucket tensors torch DDP's reducer holds, as its comm hook sees them (weakly, by bucket index).

    With ``gradient_as_bucket_view`` every ``p.grad`` is a view into a bucket, but after
    ``zero_grad(set_to_none=True)`` the gradients are None while the reducer keeps the
    buckets allocated: the ledger would not see that memory through ``p.grad``. The hook
    files each bucket here (the hook state), and :meth:`track` counts them under grads.
    Weak references: buckets the reducer rebuilt after the first step are not kept alive.
    """

    def __init__(self):
        self.buffers: dict = {}

    def file(self, bucket) -> None:
        self.buffers[bucket.index()] = weakref.ref(bucket.buffer())

    def track(self, ledger) -> None:
        ledger.track("grads", lambda: [t for t in (ref() for ref in self.buffers.values()) if t is not None])


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
        self.buckets = BucketBuffers()
        self.ddp.register_comm_hook(self.buckets, _ledgered_allreduce_hook)

    def forward(self, inputs):
        return self.ddp(inputs)

    def track_memory(self, ledger):
        super().track_memory(ledger)
        self.buckets.track(ledger)

    @contextmanager
    def no_sync(self):
        with self.ddp.no_sync():
            yield

