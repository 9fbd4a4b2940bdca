"""How a sequence is cut over the ``cp`` ranks: zig-zag (head-tail) chunks, so causal work is balanced.

Under a causal mask the token at position t attends to t + 1 keys. Cut a sequence of T
tokens into cp contiguous pieces and the last rank's queries see every key while the
first's see only their own: the last rank does about 2cp − 1 times the first's work, and a
ring step waits for the slowest rank. The zig-zag layout (Megatron-LM's context
parallelism, ring-flash-attention's "zigzag") cuts the sequence into 2·cp chunks of
c = T / (2cp) tokens and gives rank r the chunks r and 2cp − 1 − r: one early, one late,
so every rank holds the same number of (query, key) pairs under the mask.

Lifecycle: :func:`positions` names the global positions a rank holds (what its position
embedding reads, what the attention mask compares); :func:`split` cuts a whole batch
``[B, T, …]`` into this rank's ``[B, 2c, …]``; :func:`gather` puts the ranks' pieces back
in sequence order (tests, the single-process comparison). :func:`causal_pairs` counts the
(query, key) pairs a rank computes, the load the zig-zag balances.
"""
from __future__ import annotations

from typing import List

import torch


def check(seq_len: int, cp: int) -> int:
    """The chunk length c = T / (2cp); refuses a sequence that does not cut into 2·cp equal chunks."""
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp={cp!r} must be a positive integer")
    if seq_len % (2 * cp):
        raise ValueError(f"context parallelism: seq_len={seq_len} must be a multiple of 2·cp = {2 * cp} (the zig-zag "
                         f"layout gives each rank two chunks of seq_len / (2·cp) tokens)")
    return seq_len // (2 * cp)


def chunks_of(rank: int, cp: int) -> List[int]:
    """The two chunk indices rank ``rank`` holds, early one first."""
    return [rank, 2 * cp - 1 - rank]


def positions(rank: int, cp: int, seq_len: int, device=None) -> torch.Tensor:
    """Global positions of the tokens rank ``rank`` holds, in its local order."""
    c = check(seq_len, cp)
    return torch.cat([torch.arange(i * c, (i + 1) * c, device=device) for i in chunks_of(rank, cp)])


def split(whole: torch.Tensor, rank: int, cp: int, dim: int = 1) -> torch.Tensor:
    """This rank's tokens of a whole-sequence tensor (sequence along ``dim``)."""
    c = check(whole.shape[dim], cp)
    return torch.cat([whole.narrow(dim, i * c, c) for i in chunks_of(rank, cp)], dim=dim)


def gather(parts: List[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The whole sequence from every rank's tokens (``parts[r]`` rank r's), in position order."""
    cp = len(parts)
    c = parts[0].shape[dim] // 2
    chunks = [None] * (2 * cp)
    for r, part in enumerate(parts):
        for k, i in enumerate(chunks_of(r, cp)):
            chunks[i] = part.narrow(dim, k * c, c)
    return torch.cat(chunks, dim=dim)


def causal_pairs(rank: int, cp: int, seq_len: int, zigzag: bool = True) -> int:
    """(query, key) pairs rank ``rank`` computes under the causal mask: Σ over its queries of (position + 1);
    ``zigzag=False``: the contiguous layout's, whose last rank carries the most."""
    if zigzag:
        return int((positions(rank, cp, seq_len) + 1).sum())
    n = seq_len // cp
    return sum(t + 1 for t in range(rank * n, (rank + 1) * n))
