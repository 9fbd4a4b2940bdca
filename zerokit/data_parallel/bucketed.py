"""``ddp-bucketed``: the same averaging as ``ddp-naive``, in a few large calls instead of many small ones.

After backward each rank copies its gradients into flat buckets of about
``bucket_mb`` MiB (reverse registration order, like torch's reducer:
:mod:`zerokit.data_parallel.buckets`), all-reduces one bucket per call and copies the
averaged bucket back into ``p.grad``. Every call pays a latency, so fewer, larger calls
are faster; the bytes sent stay 2(N−1)/N·Ψb for every bucket size (FACTS §2).

The buckets are a second copy of the gradients, counted under "buffers" by the memory
ledger; ``ddp`` removes that copy by making the gradients views into the buckets.
"""
from __future__ import annotations

from ..strategies.base import Option, positive_number, register
from .buckets import GradBuckets
from .base import DataParallel


@register
class BucketedDataParallel(DataParallel):
    """Gradients copied into flat buckets after backward; one all-reduce per bucket."""

    name = "ddp-bucketed"
    options = {
        **DataParallel.options,
        "bucket_mb": Option(25.0, positive_number, "a positive number of MiB (torch DDP's bucket_cap_mb)"),
    }

    def __init__(self, model, ctx, config, **options):
        super().__init__(model, ctx, config, **options)
        self.buckets = GradBuckets(self.params, self.opts["bucket_mb"])

    def reduce_gradients(self) -> None:
        self.handle_unused(self.missing_gradients(self.params))
        for bucket in self.buckets:
            self.buckets.copy_in(bucket)  # a parameter without a gradient (find_unused_parameters) adds zeros
            self.average(bucket.buffer, tag=f"bucket {bucket.index}")
            self.buckets.copy_out(bucket)

    def track_memory(self, ledger):
        super().track_memory(ledger)
        ledger.track("buffers", self.buckets.buffers)

    def reduction_units(self):
        return self.buckets.sizes
