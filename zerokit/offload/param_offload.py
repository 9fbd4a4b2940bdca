"""ZeRO-3 parameter offload (ZeRO-Infinity's ``offload_param`` to CPU): parameter shards resting on the host.

With ``zero3(offload="params")`` a rank's 16-bit parameter shard of every unit lives on
the host between uses; the device holds no parameter of the unit at rest, only what is
gathered in flight. Lifecycle of one unit's shard:

1. **setup** (:class:`ParamOffload`): the shard is copied to the host once (d2h) and the
   device copy dropped; the host optimizer (:mod:`.host_optimizer`) steps it in place
   there, so the step sends nothing back;
2. **each gather** (:meth:`ParamOffload.fetching` wraps the strategy's all-gather): the
   shard is first fetched host→device into a fresh device tensor, which then goes into
   the all-gather as this rank's input. The fetch happens inside the gather, so whatever
   schedules gathers — the forward and backward hooks, the prefetcher walking ahead by
   ``prefetch_bucket_size`` — schedules the fetches too: prefetched like gathers;
3. the fetched tensor lives until the collective that reads it has landed (the work
   object holds it) and is released with it.

Traffic: one fetch of the shard per gather, twice per micro-batch with
``reshard_after_forward`` (:func:`zerokit.theory.param_offload_traffic_bytes`), on top of
the gradient shards going out. On CUDA the fetch runs non-blocking from pinned memory on
a side stream, ordered with the compute stream (which issues the all-gather) by
:mod:`.streams`; on the CPU the fetch is a real, synchronous copy between two buffers of
the same RAM.
"""
from __future__ import annotations

from typing import Callable

import torch

from . import streams
from .transfers import copy, to_host


class ParamOffload:
    """Moves ``units``' parameter shards to the host and fetches them back before each all-gather."""

    def __init__(self, units, device: torch.device):
        self.device = device
        self.stream = streams.side_stream(device)
        if self.stream is not None:  # the shards were just written by the compute stream (setup's scatter)
            self.stream.after_compute([unit.shard for unit in units])
        for unit in units:
            unit.shard = to_host(unit.shard, f"rest {unit.label}", self.stream)
        if self.stream is not None:
            self.stream.synchronize()
        #: shards fetched (h2d) so far, for tests and the course
        self.fetches = 0

    def fetching(self, gather: Callable) -> Callable:
        """``gather(out, shard, tag)`` with the host shard fetched to the device first."""
        def fetch_then_gather(out: torch.Tensor, shard: torch.Tensor, tag: str):
            staged = torch.empty(shard.shape, dtype=shard.dtype, device=self.device)
            if self.stream is not None:  # fresh memory the compute stream may have used until now
                self.stream.after_compute([staged])
            copy(staged, shard, "h2d", f"fetch {tag}", self.stream)
            if self.stream is not None:  # the all-gather, issued on the compute stream, reads it
                self.stream.before_compute([staged])
            self.fetches += 1
            work = gather(out, staged, tag)
            if work is not None:
                work.fetched = staged  # alive until the collective has landed and the unit drops its work
            return work

        return fetch_then_gather
