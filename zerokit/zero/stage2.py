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
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import List, Optional

import torch
from torch.autograd import Variable

from ..strategies.base import Option, boolean, register
from .stage1 import SHARED_OPTIONS, ShardedDataParallel, UnitLauncher, stage_option


class _InFlight:
    """A bucket whose reduction was launched: the buffer to free, where the result goes."""

    __slots__ = ("unit", "bucket", "work", "out", "into")

    def __init__(self, unit, bucket, work, out, into):
        self.unit, self.bucket, self.work, self.out, self.into = unit, bucket, work, out, into


@register
class ZeroStage2(ShardedDataParallel):
    """ZeRO-2: gradients reduce-scattered bucket by bucket during backward; only the own shard is kept."""

    name = "zero2"
    stage = 2
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
        self._in_flight: List[_InFlight] = []
        self.launcher = UnitLauncher(self.units, self._launch)
        self._callback_queued = False
        self._finished = False
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
        bucket = self._bucket(unit)
        view = bucket[offset:offset + numel].view_as(p)
        if self.launcher.ready(p):
            view.copy_(p.grad)
            self.launcher.count(unit)
        else:  # the same parameter a second time in one backward (a reused module): accumulate
            view.add_(p.grad)
        p.grad = None
        if not self._callback_queued:
            Variable._execution_engine.queue_callback(self._finish_backward)
            self._callback_queued = True
        self.launcher.launch_full()

    def _launch(self, unit) -> None:
        """Reduce a full bucket into the own shard; at most one other reduction stays in flight."""
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
        into = None if (first and self.opts["reduce_scatter"]) else (self.shards[i], first)
        work = self.reduce_unit(unit, bucket, out, async_op=overlap)
        self.buckets[i] = None
        flight = _InFlight(unit, bucket, work, out, into)
        if overlap:
            self._complete_all()  # double buffering: the previous bucket must be done before this one is
            self._in_flight.append(flight)
        else:
            self._complete(flight)

    def _complete(self, flight: _InFlight) -> None:
        if flight.work is not None:
            flight.work.wait()
        if flight.into is not None:
            shard, first = flight.into
            if first:
                shard.copy_(flight.out)
            else:
                shard.add_(flight.out)
        flight.bucket = flight.out = None  # the bucket's memory goes back now

    def _complete_all(self) -> None:
        while self._in_flight:
            self._complete(self._in_flight.pop(0))

    def _finish_backward(self) -> None:
        """After the whole backward: a parameter without a gradient adds zeros; reduce the rest, wait for all."""
        for unit in self.units:
            if self.launcher.counts[unit.index] < len(unit.params):
                missing = {p for p in unit.params if p not in self.launcher.seen}
                unit.zero_slots(self._bucket(unit), missing)  # zeros where no gradient came
        self.launcher.launch_rest()
        self._complete_all()
        self.launcher.reset()
        self._callback_queued = False
        self._finished = True

    def backward(self, loss):
        self._finished = False
        loss.backward()
        if not self._finished:
            self._finish_backward()

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
                yield from (t for t in (flight.bucket, flight.out) if t is not None)

        ledger.track("grads", gradient_memory)

    def buckets_in_flight(self) -> int:
        """Gradient buckets alive at once at most: the filling one, and with overlap_comm the one reducing."""
        return 2 if self.opts["overlap_comm"] else 1
