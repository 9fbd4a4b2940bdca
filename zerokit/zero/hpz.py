"""hpZ (ZeRO++, arXiv 2306.10209 §3.2): a secondary copy of the weights sharded inside a node, for backward.

Lifecycle: at setup every unit gets a secondary shard of P/s elements in the compute dtype (P the unit's
N-padded size, s the hpZ partition: ``zero_hpz_partition_size``, DeepSpeed's name), held for the whole run
(the memory ledger counts it under ``params``: :func:`zerokit.theory.zeropp.hpz_secondary_numel`).

1. **forward**: the unit's all-gather over all N ranks lands (quantized or not); the rank copies slice j of
   the full buffer (j its place in its hpZ group of s consecutive ranks) into its secondary shard — no
   extra transfer — and marks it fresh;
2. **backward**: the unit is gathered from the secondary shards over the hpZ group (s ranks, inside a node
   when s divides the node), in the compute dtype: the same values the forward used, bit for bit;
3. **step**: the shards change, every secondary copy is stale until the next forward refills it.

A backward gather of a unit whose copy is not fresh falls back to the global gather.
"""
from __future__ import annotations

from typing import List

import torch

from ..runtime import comm


class SecondaryPartition:
    """Each unit's secondary shard over an hpZ group of ``size`` ranks, this rank at place ``place``."""

    def __init__(self, flats: list, group, size: int, place: int):
        self.group, self.size, self.place = group, size, place
        self.shards: List[torch.Tensor] = [torch.zeros(f.padded_numel // size, dtype=f.dtype, device=f.device)
                                           for f in flats]
        self.fresh = [False] * len(flats)

    @torch.no_grad()
    def keep(self, index: int, full: torch.Tensor) -> None:
        """The forward gather of unit ``index`` landed in ``full``: keep this rank's 1/s slice."""
        n = self.shards[index].numel()
        self.shards[index].copy_(full[self.place * n:(self.place + 1) * n])
        self.fresh[index] = True

    def gather(self, index: int, out: torch.Tensor, tag: str):
        """All-gather unit ``index`` from the secondary shards of the hpZ group into ``out`` (a Work)."""
        return comm.all_gather(out, self.shards[index], group=self.group, async_op=True, tag=f"{tag} secondary")

    def expire(self) -> None:
        """The step changed the weights: no secondary copy may be read before a forward refills it."""
        self.fresh = [False] * len(self.fresh)
