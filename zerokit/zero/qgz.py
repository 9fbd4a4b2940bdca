"""qgZ (ZeRO++, arXiv 2306.10209 §3.3): gradients reduced by a quantized two-hop all-to-all, not a reduce-scatter.

Lifecycle of one unit's gradient bucket (N = nodes × g ranks, g per node; rank r = k·g + j is local
rank j of node k and owns chunk r of C = P/N elements):

1. **slice reordering**: the bucket, viewed as [nodes, g, C] chunks, is transposed to g pieces, piece j
   holding chunk j of every node (nodes·C elements): what local rank j reduces for the node;
2. **hop 1, inside the node** (g > 1): each piece quantized (``bits``: 4 by default, the paper's int4;
   block-wise, scales in float32), one ``all_to_all_single`` over the node's group; local rank j
   dequantizes the g pieces it received and sums them in float32: its node's partial sum for owners
   (k', j), k' = 0 … nodes−1;
3. **hop 2, across nodes** (nodes > 1): the partial sum requantized in ``nodes`` slices of C, one
   all-to-all over the ranks with the same local index (one per node); the owner dequantizes and sums
   the ``nodes`` slices: its chunk of the gradient summed over all N ranks.

**When qgZ runs** (DeepSpeed 0.19.8's ``__avg_scatter_grads`` and ``all_to_all_quant_reduce``): only when
the N ranks span nodes (:func:`zerokit.theory.zeropp.qgz_runs`; on one node every gradient is
reduce-scattered exactly, as ZeRO-3), and per gradient only for a tensor of two or more dimensions whose
numel divides by 2N (:func:`deepspeed_quantizes`: its swizzle kernel's shapes); a 1-D gradient or another
size falls back to the plain reduce-scatter. zerokit reduces a unit's flat bucket in one collective, not
one tensor at a time, so it decides per unit (:func:`qgz_reduces_unit`): qgZ when DeepSpeed would quantize
at least one of the unit's gradients, the reduce-scatter when it would quantize none. zerokit's choice,
from its flat unit: the 1-D gradients that share a unit with a quantized one (a block's biases and norms)
are quantized with it, where DeepSpeed reduces them exactly.

A hop over a group of one rank is skipped (no quantization). The result is within
:func:`zerokit.theory.zeropp.qgz_error_bound` of the exact sum. Synchronous: each hop needs the last
one's sum. DeepSpeed's ``all_to_all_quant_reduce`` runs the same two hops with CUDA kernels
(``swizzle_quant``, ``quantized_reduction``); torch's gloo runs ``all_to_all_single`` on the CPU.
"""
from __future__ import annotations

import math

import torch

from ..runtime import comm
from .quantize import ErrorTally, decode, encode


def deepspeed_quantizes(shape, world: int) -> bool:
    """DeepSpeed's test for one gradient of ``shape`` on ``world`` ranks: two or more dimensions and a numel
    divisible by 2N (a 1-D tensor, or another size, is reduce-scattered instead)."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world={world!r} must be a whole number >= 1")
    return len(shape) >= 2 and math.prod(shape) % (2 * world) == 0


def qgz_reduces_unit(params, world: int) -> bool:
    """Whether qgZ reduces the gradient bucket of a unit holding ``params``: DeepSpeed would quantize at least
    one of their gradients (:func:`deepspeed_quantizes`)."""
    return any(deepspeed_quantizes(tuple(p.shape), world) for p in params)


def _exchange(pieces: torch.Tensor, group, block_size: int, bits: int, tag: str, tally,
              grid: str = "symmetric") -> torch.Tensor:
    """Quantize each row of ``pieces`` on ``grid``, all-to-all them over ``group`` (row i to member i), and
    return the float32 sum of the dequantized rows received."""
    rows, numel = pieces.shape
    messages = torch.stack([encode(row, block_size, bits, grid) for row in pieces])
    if tally is not None:
        codes = messages.shape[1] - 4 * -(-numel // block_size)
        for row, message in zip(pieces, messages):
            scales = message[codes:].clone().view(torch.float32)
            tally.add(row, decode(message, block_size, numel, bits), scales, block_size)
    received = torch.empty_like(messages)
    comm.all_to_all_single(received, messages, group=group, tag=tag)
    total = torch.zeros(numel, dtype=torch.float32, device=pieces.device)
    for message in received:
        total += decode(message, block_size, numel, bits)
    return total


@torch.no_grad()
def quantized_reduce_scatter(out: torch.Tensor, bucket: torch.Tensor, intra_group, inter_group, ranks_per_node: int,
                             block_size: int, bits: int, tag: str, tally: ErrorTally = None,
                             grid: str = "symmetric") -> None:
    """Sum ``bucket`` (N·C elements) over the N ranks, this rank's chunk of C into ``out``, by qgZ's two hops
    (codes on ``grid``; ``tally``, None: nothing measured)."""
    g, c = ranks_per_node, out.numel()
    nodes = bucket.numel() // (g * c)
    if nodes * g * c != bucket.numel():
        raise ValueError(f"qgZ: a bucket of {bucket.numel()} elements is not nodes × g × C = ? × {g} × {c}")
    pieces = bucket.view(nodes, g, c).transpose(0, 1).reshape(g, nodes * c)  # piece j: chunk j of every node
    if g > 1:
        partial = _exchange(pieces, intra_group, block_size, bits, f"{tag} intra-node", tally, grid)
    else:
        partial = pieces[0].float()
    if nodes > 1:
        partial = _exchange(partial.view(nodes, c), inter_group, block_size, bits, f"{tag} inter-node", tally,
                            grid)
    out.copy_(partial)
