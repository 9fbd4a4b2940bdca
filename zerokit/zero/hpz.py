"""hpZ (ZeRO++, arXiv 2306.10209 §3.2): a secondary copy of the weights sharded inside a node.

Lifecycle: at setup every unit gets a secondary shard of P/s elements in the compute dtype (P the unit's
N-padded size, s the hpZ partition: ``zero_hpz_partition_size``, DeepSpeed's name), held for the whole run
(the memory ledger counts it under ``params``: :func:`zerokit.theory.zeropp.hpz_secondary_numel`).

1. **the step's first gather** (micro-batch 1's forward): the unit's all-gather over all N ranks lands
   (quantized or not); the rank copies slice j of the full buffer (j its place in its hpZ group of s
   consecutive ranks) into its secondary shard — no extra transfer — and marks it fresh;
2. **every later gather of the step** — micro-batch 1's backward, then forward and backward of every
   further micro-batch under gradient accumulation — reads the secondary shards over the hpZ group (s
   ranks, inside a node when s divides the node), in the compute dtype: the same values the first
   forward used, bit for bit. Per step and unit: 1 gather over N, 2A − 1 over s;
3. **step**: the shards change, every secondary copy is stale until the next forward refills it.

As DeepSpeed 0.19.8: its coordinator gathers a parameter from ``ds_secondary_tensor`` whenever one exists
(``partition_parameters.py``, ``all_gather_coalesced``), the release after a global gather fills it
(``_partition_param_sec``), and the optimizer's step drops it (``invalidate_secondary_tensor``). Two
differences, zerokit's choices: DeepSpeed also fills the copy when it first partitions the model, so its
very first forward gathers inside the group; zerokit's copy starts stale, so every step's ledger is alike,
the first one too. And under qwZ DeepSpeed quantizes the secondary gathers as well; zerokit's run in the
compute dtype (the paper's Fig. 5).
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
        """A gather of unit ``index`` over all N ranks landed in ``full``: keep this rank's 1/s slice."""
        n = self.shards[index].numel()
        self.shards[index].copy_(full[self.place * n:(self.place + 1) * n])
        self.fresh[index] = True

    def gather(self, index: int, out: torch.Tensor, tag: str):
        """All-gather unit ``index`` from the secondary shards of the hpZ group into ``out`` (a Work)."""
        return comm.all_gather(out, self.shards[index], group=self.group, async_op=True, tag=f"{tag} secondary")

    def expire(self) -> None:
        """The step changed the weights: no secondary copy may be read before a forward refills it."""
        self.fresh = [False] * len(self.fresh)
