"""The side stream the offload copies run on, and the waits that order it with the compute stream.

On CUDA a device↔host copy that runs on the compute stream stops the GPU's compute for as
long as PCIe takes; offload therefore copies on a side stream, from and into *pinned* host
memory (pageable memory makes ``non_blocking`` copies synchronous), as DeepSpeed's offload
and torch's FSDP2 CPU offload do. Two streams need ordering, and that is this file's whole
job. Lifecycle of one :class:`SideStream` (one per :class:`~.host_optimizer.HostOptimizer`
and per :class:`~.param_offload.ParamOffload`):

1. **made for the rank's device** (:func:`side_stream`): never for a tensor's device — a
   shard resting on the host would name the CPU. On the CPU there is no side stream
   (None): copies are synchronous, between two buffers of the same RAM;
2. **host buffers** come from :meth:`SideStream.host_buffer`: pinned;
3. **before a copy touches a device tensor** (reads a gradient the backward produced, or
   overwrites a shard the forward may still be reading): :meth:`after_compute` — the side
   stream waits for the compute stream (``wait_stream``), and the tensor is marked used by
   the side stream (``record_stream``), so the caching allocator does not hand its memory
   out while the copy is in flight;
4. **the copy** (:meth:`copy`): ``non_blocking`` on the side stream;
5. **before the compute stream reads what arrived on the device**: :meth:`before_compute` —
   the compute stream waits for the side stream; the tensor is marked used by it;
6. **before the host reads what arrived on the host**: :meth:`synchronize`.

The rules are checked on the CPU by ``tests/offload/test_offload_streams.py``, which replaces
:func:`side_stream` with a recorder and runs ZeRO-2 and ZeRO-3 offload steps.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch


class SideStream:
    """A CUDA side stream for device↔host copies, and the waits that order it with the compute stream."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def host_buffer(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """A pinned host buffer (a ``non_blocking`` copy from pageable memory would be synchronous)."""
        return torch.empty(shape, dtype=dtype, device="cpu", pin_memory=True)

    def after_compute(self, tensors: Iterable[torch.Tensor] = ()) -> None:
        """The side stream waits for the compute stream; ``tensors`` are kept alive for the side stream."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        for t in tensors:
            t.record_stream(self.stream)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, direction: str) -> None:
        """``dst.copy_(src)`` on the side stream, non-blocking (``direction``: ``d2h`` or ``h2d``)."""
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)

    def before_compute(self, tensors: Iterable[torch.Tensor] = ()) -> None:
        """The compute stream waits for the side stream's copies; ``tensors`` are kept alive for it."""
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        for t in tensors:
            t.record_stream(current)

    def synchronize(self) -> None:
        """The host waits for every copy queued so far (before it reads a host buffer they fill)."""
        self.stream.synchronize()


def side_stream(device: torch.device) -> Optional[SideStream]:
    """The side stream for the rank's ``device``; None on the CPU (copies are synchronous there)."""
    return SideStream(device) if device.type == "cuda" else None
