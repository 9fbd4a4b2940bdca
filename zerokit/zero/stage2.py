"""``zero2``: ZeRO stage 2, + gradient partitioning (P_os+g, arXiv 1910.02054 §5.2).

The parameters are laid out in flat units of at most ``reduce_bucket_size`` elements,
as in ``zero1``; what changes is the gradients. No rank ever holds all of them:

1. As backward produces a parameter's gradient (a post-accumulate-grad hook), it is
   copied into its unit's *bucket* — a flat buffer of the unit's padded layout,
   allocated when the unit's first gradient arrives — and ``p.grad`` is dropped at once.
2. When a bucket is full it is reduce-scattered (divided by N, then summed) straight
   into the rank's gradient *shard*, during backward, units launching in order. With
   ``overlap_comm`` the reduce-scatter is asynchronous and the next bucket fills while
   it is in flight (double buffering: before a bucket launches, the one before it is
   waited for); without, it is synchronous. Once reduced, the bucket is freed.
3. Only the rank's shard of the gradients lives to the step, which steps the own shard
   of the parameters and all-gathers them, as ``zero1`` does.

So the gradient memory of a rank never exceeds its shard + the buckets in flight (one,
two with ``overlap_comm``) + the gradient autograd just produced; ``zero2-naive``
(all-reduce everything after backward, then drop) peaks at the full gradients.
Traffic per step: a reduce-scatter of every micro-batch — non-owned gradients are
freed, so they cannot accumulate — plus one all-gather: (A + 1)(N−1)/N·Ψb
(FACTS §2); 2(N−1)/N·Ψb without accumulation, as DDP. ``no_sync`` cannot apply.

``contiguous_gradients`` (DeepSpeed's name): the shards of all units live in one flat
buffer, allocated once (True), or each unit's shard is its own tensor, allocated when
it is first reduced in a step (False). The bytes are the same.

``offload="optimizer"`` (:mod:`zerokit.offload`): after each backward the reduced shards are
copied to the host, which accumulates the micro-batches and steps there; the device keeps
no gradient between backward and step.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import List, Optional

import torch

from ..strategies.base import Option, boolean, register
from ..data_parallel.reducer import Reducer
from .sharded import SHARED_OPTIONS, ShardedDataParallel, stage_option


@register
class ZeroStage2(ShardedDataParallel):
    """ZeRO-2: gradients reduce-scattered bucket by bucket during backward; only the own shard is kept."""

    name = "zero2"
    stage = 2
    #: data parallelism over tensor-parallel shards; expert parallelism's experts sharded over edp (:mod:`.experts`)
    axes = ("dp", "cp", "ep", "tp")
    options = {
        "stage": stage_option(2),
        **SHARED_OPTIONS,
        "contiguous_gradients": Option(True, boolean, "True (all gradient shards in one flat buffer) or False "
                                                      "(one shard tensor per unit)"),
    }

    def __init__(self, model, ctx, config, **options):
        super().__init__(model, ctx, config, **options)
        self.slot = {p: (unit.offsets[i], p.numel()) for unit in self.units for i, p in enumerate(unit.params)}
        total = sum(unit.shard_numel for unit in self.units)
        if self.opts["contiguous_gradients"]:
            self.shard_buffer = torch.zeros(total, dtype=self.units[0].dtype, device=self.units[0].device)
            offsets = [0]
            for unit in self.units:
                offsets.append(offsets[-1] + unit.shard_numel)
            self.shards: List[Optional[torch.Tensor]] = [self.shard_buffer[a:b]
                                                         for a, b in zip(offsets, offsets[1:])]
        else:
            self.shard_buffer = None
            self.shards = [None] * len(self.units)
        #: units whose shard holds this step's gradients already (later micro-batches add)
        self._written = [False] * len(self.units)
        self.buckets: List[Optional[torch.Tensor]] = [None] * len(self.units)
        #: (bucket, reduced output) of each reduction in flight, for the memory ledger
        self._in_flight: list = []
        self.reducer = Reducer([len(u.params) for u in self.units], self._launch,
                               before_finish=self._fill_missing, on_abort=self._drop_buckets)
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_gradient_ready) for p in self.params]

    # -- during backward (every micro-batch) ---------------------------------------------
    def _bucket(self, unit) -> torch.Tensor:
        if self.buckets[unit.index] is None:
            self.buckets[unit.index] = unit.new_bucket()
        return self.buckets[unit.index]

    @torch.no_grad()
    def _on_gradient_ready(self, p) -> None:
        """Copy ``p.grad`` into its unit's bucket, drop it, and launch the buckets that are full."""
        unit = self.unit_of[p]
        offset, numel = self.slot[p]
        view = self._bucket(unit)[offset:offset + numel].view_as(p)
        if self.reducer.ready(unit.index, p):
            view.copy_(p.grad)
        else:  # the same parameter a second time in one backward (a reused module): accumulate
            view.add_(p.grad)
        p.grad = None
        self.reducer.launch_full()

    def _launch(self, index: int) -> None:
        """Reduce a full bucket into the own shard; at most one other reduction stays in flight."""
        unit = self.units[index]
        bucket = self._bucket(unit)
        i = unit.index
        if self.shards[i] is None:
            self.shards[i] = unit.new_shard()
        first = not self._written[i]
        self._written[i] = True
        overlap = self.opts["overlap_comm"]
        if self.opts["reduce_scatter"]:
            out = self.shards[i] if first else unit.new_shard()
        else:
            out = unit.shard(bucket)  # all-reduce in place, then keep the own slice
        shard = self.shards[i]
        copy = not (first and self.opts["reduce_scatter"])
        work = self.reduce_unit(unit, bucket, out, async_op=overlap)
        if overlap:
            self.reducer.wait_all()  # double buffering: the previous bucket is done before this one is tracked
        self.buckets[i] = None
        flight = [bucket, out]
        self._in_flight.append(flight)

        def land():
            if copy:
                shard.copy_(out) if first else shard.add_(out)
            return shard

        def done():
            flight[0] = flight[1] = None  # the bucket's memory goes back now
            self._in_flight[:] = [f for f in self._in_flight if f is not flight]  # by identity (lists of tensors)
            self.after_reduce_scatter(unit, out, land)

        self.reducer.track(work, bucket.numel(), done)

    def after_reduce_scatter(self, unit, reduced: torch.Tensor, land) -> None:
        """One micro-batch's reduced gradient shard of ``unit`` has landed in ``reduced``; ``land()`` adds it to the
        step's shard (and returns that shard): here at once (``hsdp-zero2`` all-reduces across the replicas around
        it)."""
        land()

    def _fill_missing(self) -> None:
        """End of backward: a parameter without a gradient adds zeros to its unit's bucket."""
        for unit in self.units:
            if not self.reducer.is_full(unit.index):
                missing = {p for p in unit.params if p not in self.reducer.seen}
                unit.zero_slots(self._bucket(unit), missing)  # zeros where no gradient came

    def _drop_buckets(self) -> None:
        """Backward failed: the half-filled buckets are dropped; the next backward starts afresh."""
        self.buckets = [None] * len(self.units)
        self._in_flight.clear()

    def backward(self, loss):
        self.reducer.backward(loss)
        self.offload.after_backward()  # offload: the reduced shards go to the host, the device keeps none

    @contextmanager
    def no_sync(self):
        """ZeRO-2 reduces every micro-batch: a rank cannot keep the gradients it does not own (FACTS §2)."""
        yield

    def zero_grad(self):
        self._written = [False] * len(self.units)
        if self.shard_buffer is None:
            self.shards = [None] * len(self.units)
        for p in self.params:
            p.grad = None

    def grad_shards(self):
        return self.shards

    # -- measurement -----------------------------------------------------------------
    def track_memory(self, ledger):
        super().track_memory(ledger)

        def gradient_memory():
            yield from (s for s in self.shards if s is not None)
            yield from (b for b in self.buckets if b is not None)
            for flight in self._in_flight:
                yield from (t for t in flight if t is not None)

        ledger.track("grads", gradient_memory)
