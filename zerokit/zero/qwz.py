"""qwZ (ZeRO++, arXiv 2306.10209 §3.1): ZeRO-3's weight all-gather in int8 blocks, dequantized on arrival.

Lifecycle of one gather: each rank block-quantizes its shard of the unit (:func:`~.quantize.encode`:
int8 codes and one float32 scale per ``block_size`` elements, one message), one all-gather of those
int8 messages over the group (the ledger records it: an ``all_gather`` of int8 on its axis), and a
:class:`ThenWork` whose ``wait`` decodes every rank's message into its chunk of the unit's full buffer,
in the compute dtype. The unit then computes with ŵ = deq(q(w)), |ŵ − w| ≤ scale/2 per element
(:func:`zerokit.theory.zeropp.block_quantization_error_bound`); the shards the optimizer steps stay
exact. Where asked (``measure_quantization_error``), each rank measures its own chunk's round-trip error
into an :class:`~.quantize.ErrorTally`, on the device, read once per step.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ..runtime import comm
from .quantize import ErrorTally, decode, encode


class ThenWork:
    """A collective in flight and what to do once it lands: ``wait`` waits for it, then runs ``then`` once."""

    def __init__(self, work, then: Callable[[], None]):
        self._work, self._then = work, then

    def wait(self) -> None:
        if self._work is not None:
            self._work.wait()
            self._work = None
        if self._then is not None:
            then, self._then = self._then, None
            then()

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()


def quantized_all_gather(out: torch.Tensor, shard: torch.Tensor, group, world: int, rank: int, block_size: int,
                         tag: str, tally: Optional[ErrorTally] = None, grid: str = "symmetric") -> ThenWork:
    """Fill ``out`` (``world`` chunks of ``shard.numel()``) with every rank's shard, sent as int8 blocks on
    ``grid``; ``tally`` (None: nothing measured) is handed this rank's own chunk's round trip."""
    numel = shard.numel()
    message = encode(shard, block_size, 8, grid)
    gathered = torch.empty(world * message.numel(), dtype=torch.int8, device=shard.device)
    work = comm.all_gather(gathered, message, group=group, async_op=True, tag=f"{tag} int8")

    def dequantize():
        for r, chunk in enumerate(gathered.view(world, -1)):
            out[r * numel:(r + 1) * numel].copy_(decode(chunk, block_size, numel, 8, out.dtype))
        if tally is not None:
            tally.add(shard, out[rank * numel:(rank + 1) * numel], message[numel:].clone().view(torch.float32),
                      block_size)

    return ThenWork(work, dequantize)
