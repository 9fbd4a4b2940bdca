"""The transfer ledger: every device↔host copy a rank made, next to the communication ledger.

Lifecycle: :func:`copy` (and :func:`to_host`, which allocates the destination) is the only way zerokit's offload moves bytes between the device and the
host. Each call copies for real — into a distinct buffer, even on a CPU-only machine where
both sides are the same RAM — and appends a :class:`Transfer` with the direction (``d2h``
or ``h2d``), the bytes of the tensor that crossed (measured: ``numel · element_size`` of
the source; source and destination have one dtype, a cast happens on one side, never on
the link), and the phase and step the communication ledger is in. ``zerokit.train`` resets
the ledger before the first step and sums it per step (setup excluded) after the last.

On CUDA a copy with ``stream`` runs on that side stream, non-blocking from pinned host
memory; the caller orders the streams (:mod:`.streams`). The ledger then records the launch, not the time the
bytes took: PCIe time is not measured here, on any machine.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

from ..runtime import comm
from .streams import SideStream

DIRECTIONS = ("d2h", "h2d")


@dataclass
class Transfer:
    direction: str
    phase: str
    step: int
    numel: int
    dtype: str
    #: measured: bytes of the tensor that crossed (source = destination dtype)
    payload_bytes: int
    tag: str = ""
    t_launch: float = 0.0


@dataclass
class TransferLedger:
    """The device↔host copies of one rank, one record per copy."""

    records: list = field(default_factory=list)
    enabled: bool = True

    def reset(self) -> None:
        self.records.clear()

    def add(self, record: Transfer) -> Transfer:
        if self.enabled:
            self.records.append(record)
        return record

    def select(self, direction: Optional[str] = None, phase: Optional[str] = None, exclude_setup: bool = True):
        return [r for r in self.records
                if (direction is None or r.direction == direction) and (phase is None or r.phase == phase)
                and not (phase is None and exclude_setup and r.phase == "setup")]

    def bytes_per_step(self, steps: int) -> dict:
        """Measured: ``{"d2h": bytes, "h2d": bytes}`` per training step, averaged over ``steps`` (setup excluded)."""
        return {d: sum(r.payload_bytes for r in self.select(d)) / steps for d in DIRECTIONS}

    def copies_per_step(self, steps: int) -> dict:
        return {d: len(self.select(d)) / steps for d in DIRECTIONS}

    def to_list(self) -> list:
        return [asdict(r) for r in self.records]


_ledger = TransferLedger()


def ledger() -> TransferLedger:
    """This process's transfer ledger."""
    return _ledger


def _where():
    return comm.ledger().phase, comm.ledger().step


def copy(dst: torch.Tensor, src: torch.Tensor, direction: str, tag: str = "",
         stream: Optional[SideStream] = None) -> torch.Tensor:
    """``dst.copy_(src)`` across the device↔host boundary, recorded; returns ``dst``. With ``stream`` (CUDA) the copy
    runs there, non-blocking; the caller has ordered the streams (:mod:`.streams`)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r}; allowed: {', '.join(DIRECTIONS)}")
    if dst.dtype != src.dtype or dst.numel() != src.numel():
        raise ValueError(f"transfer {tag!r}: {src.numel()} {src.dtype} into {dst.numel()} {dst.dtype}; cast on one "
                         f"side first, so that the link carries the bytes the ledger counts")
    if dst.untyped_storage().data_ptr() == src.untyped_storage().data_ptr() and dst.numel():
        raise ValueError(f"transfer {tag!r}: source and destination share memory; a transfer is a real copy")
    phase, step = _where()
    _ledger.add(Transfer(direction, phase, step, src.numel(), str(src.dtype).replace("torch.", ""),
                         src.numel() * src.element_size(), tag, time.perf_counter()))
    with torch.no_grad():
        if stream is not None:
            stream.copy(dst, src, direction)
        else:
            dst.copy_(src)
    return dst


def host_empty(like: torch.Tensor, dtype: Optional[torch.dtype] = None,
               stream: Optional[SideStream] = None) -> torch.Tensor:
    """A host buffer shaped like ``like``: pinned when copies run on a side ``stream`` (CUDA), so they can be
    asynchronous — whether ``like`` itself is on the device or already on the host."""
    if stream is not None:
        return stream.host_buffer(like.shape, dtype or like.dtype)
    return torch.empty(like.shape, dtype=dtype or like.dtype, device="cpu")


def to_host(t: torch.Tensor, tag: str = "", stream: Optional[SideStream] = None) -> torch.Tensor:
    """A new host copy of device tensor ``t`` (d2h, recorded); the caller ordered ``stream`` after compute."""
    return copy(host_empty(t, stream=stream), t, "d2h", tag, stream)
