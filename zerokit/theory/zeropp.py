"""ZeRO++ (Wang et al., arXiv 2306.10209): the block quantizer's error bound and bytes.

**Block quantization** (§3.1; zerokit's codec is :mod:`zerokit.zero.quantize`): a block of
elements with largest magnitude ``absmax`` is sent as ``bits``-bit symmetric codes with one
scale ``Δ = absmax/qmax``, qmax = 2^(bits−1) − 1. In exact arithmetic every element comes
back within half a step: |x − Δ·round(x/Δ)| ≤ Δ/2 (no clamping happens: |x/Δ| ≤ qmax).
In float32 the quotient and the product each round once more (relative 2^-24), and the
result's conversion to a 16-bit dtype adds half that dtype's ulp of the value.
"""
from __future__ import annotations

import math

QUANTIZATION_BITS = (4, 8)
SCALE_BYTES = 4  # one float32 scale per block


def _check_bits(bits) -> int:
    if isinstance(bits, bool) or bits not in QUANTIZATION_BITS:
        raise ValueError(f"bits={bits!r}; allowed: 4, 8")
    return bits


def _check_positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a whole number >= 1")
    return value


def quantization_levels(bits: int) -> int:
    """qmax = 2^(bits−1) − 1: 127 for int8, 7 for int4 (the symmetric grid −qmax..qmax)."""
    return 2 ** (_check_bits(bits) - 1) - 1


def block_quantization_scale(absmax: float, bits: int = 8) -> float:
    """The step Δ of a block whose largest magnitude is ``absmax``: absmax/qmax (1 for an all-zero block)."""
    if absmax < 0 or math.isnan(absmax):
        raise ValueError(f"absmax={absmax!r} must be >= 0")
    return absmax / quantization_levels(bits) if absmax > 0 else 1.0


def block_quantization_error_bound(scale: float) -> float:
    """The largest |x − dequantize(quantize(x))| of one element in a block of step ``scale``: scale/2.

    Exact arithmetic; an all-zero block (scale 1 by convention) comes back exactly.
    """
    if scale <= 0 or math.isnan(scale):
        raise ValueError(f"scale={scale!r} must be > 0")
    return scale / 2


def block_quantization_relative_bound(bits: int = 8) -> float:
    """The error bound relative to the block's absmax: 1/(2·qmax) — 1/254 for int8, 1/14 for int4."""
    return 1 / (2 * quantization_levels(bits))


def quantized_bytes(numel: int, block_size: int, bits: int = 8) -> int:
    """Bytes of ``numel`` elements block-quantized: ⌈numel·bits/8⌉ codes + 4·⌈numel/block_size⌉ scales."""
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel={numel!r} must be a whole number >= 0")
    _check_positive("block_size", block_size)
    _check_bits(bits)
    return -(-numel * bits // 8) + SCALE_BYTES * -(-numel // block_size)
