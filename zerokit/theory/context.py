"""Context parallelism's bytes on the ``cp`` axis, per attention call (ring attention and Ulysses).

``block_bytes`` is one rank's key tensor, ``[batch, heads, seq_len / cp, head dim]`` × element
size (its queries and values are the same size). Ring attention sends each block to the next
rank: forward (cp − 1) transfers of K and V; backward (cp − 1) transfers of K, V, dK, dV and
one more of dK, dV, which brings each block's gradients home. Ulysses runs all-to-alls, each
sending (cp − 1)/cp of one such tensor: q, k, v and the output in forward, their gradients in
backward. (Derivations: :mod:`zerokit.context_parallel.ring_attention`, :mod:`~.ulysses`.)
"""
from __future__ import annotations

from fractions import Fraction


def _check(cp: int, block_bytes: int) -> None:
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp={cp!r} must be a positive integer")
    if block_bytes < 0:
        raise ValueError(f"block_bytes={block_bytes!r} must be >= 0")


def ring_attention_bytes(cp: int, block_bytes: int) -> dict:
    """Bytes one rank sends per ring-attention call: ``{"forward": …, "backward": …}``."""
    _check(cp, block_bytes)
    if cp == 1:
        return {"forward": 0, "backward": 0}
    return {"forward": 2 * (cp - 1) * block_bytes, "backward": 4 * (cp - 1) * block_bytes + 2 * block_bytes}


def ulysses_bytes(cp: int, block_bytes: int) -> dict:
    """Bytes one rank sends per Ulysses call: four all-to-alls each way, (cp − 1)/cp of a block each."""
    _check(cp, block_bytes)
    each = Fraction(cp - 1, cp) * block_bytes
    total = 4 * each
    return {"forward": int(total), "backward": int(total)}
