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
a side stream, and the compute stream (which issues the all-gather) waits for it; that path
is written for CUDA and not tested on this CPU-only machine, where the fetch is a real,
synchronous copy between two buffers of the same RAM.
"""
from __future__ import annotations

from typing import Callable

import torch

from .transfers import to_device, to_host


class ParamOffload:
    """Moves ``units``' parameter shards to the host and fetches them back before each all-gather."""

    def __init__(self, units, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        for unit in units:
            unit.shard = to_host(unit.shard, f"rest {unit.label}", self.stream)
        if self.stream is not None:
            self.stream.synchronize()
        #: shards fetched (h2d) so far, for tests and the course
        self.fetches = 0

    def fetching(self, gather: Callable) -> Callable:
        """``gather(out, shard, tag)`` with the host shard fetched to the device first."""
        def fetch_then_gather(out: torch.Tensor, shard: torch.Tensor, tag: str):
            if self.stream is not None:
                self.stream.wait_stream(torch.cuda.current_stream(self.device))  # ``out`` was just allocated there
            staged = to_device(shard, self.device, f"fetch {tag}", self.stream)
            if self.stream is not None:
                current = torch.cuda.current_stream(self.device)
                current.wait_stream(self.stream)
                staged.record_stream(current)
            self.fetches += 1
            work = gather(out, staged, tag)
            if work is not None:
                work.fetched = staged  # alive until the collective has landed and the unit drops its work
            return work

        return fetch_then_gather
