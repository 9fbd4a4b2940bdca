"""Block quantization: the int8/int4 codec ZeRO++'s qwZ and qgZ send instead of 16/32-bit values.

Lifecycle: a sender calls :func:`quantize_blocks` on a flat tensor (its shard, or a slice of
gradient) and sends ``q`` and ``scales``; the receiver calls :func:`dequantize_blocks` with the
same ``block_size``, ``numel`` and ``bits`` and gets the values back within the grid's bound
(:func:`zerokit.theory.zeropp.block_quantization_error_bound`). A rank that measures its own round
trips hands them to an :class:`ErrorTally` (zerokit's measurement, off in ``zeropp`` unless asked).

zerokit's codec (Wang et al., arXiv 2306.10209 §3.1, "block-based quantization"):

- the flat input is cut into blocks of ``block_size`` consecutive elements; **the last block
  may be short** (``numel`` not a multiple of ``block_size``): it is quantized on its own
  elements only, with its own absmax and scale; nothing is padded into ``q``;
- per block, on one of two **grids** (``grid``, :data:`GRIDS`):

  - ``"symmetric"`` (the default, zerokit's choice): ``scale = absmax / (2^(bits−1) − 1)``
    (127 for int8, 7 for int4), ``q = clamp(round(x / scale), −qmax, qmax)``; the code
    −2^(bits−1) is never used, so the grid is symmetric around 0, ±absmax are on it and every
    element comes back within scale/2 (absmax/254 at int8, absmax/14 at int4);
  - ``"deepspeed"`` (DeepSpeed's kernels, ``csrc/includes/quantization_utils.h``,
    ``Params<Symmetric>``): the multiplier ``m = 2^(bits−1) / absmax``, ``q = clamp(round(x·m),
    −2^(bits−1), 2^(bits−1) − 1)``, ``scale = 1/m`` (≈ absmax/128 at int8, absmax/8 at int4);
    −absmax is the code −2^(bits−1) exactly, +absmax rounds to 2^(bits−1) and is clipped to
    2^(bits−1) − 1, one whole step low (the elements above (2^(bits−1) − ½)·scale come back
    within one step, the others within half a step);

  rounding half to even on both (torch's ``round``, CUDA's ``__float2int_rn``);
- an **all-zero block** gets ``scale = 1`` (its codes are all 0 and come back as exact zeros;
  no division by zero, no NaN) — DeepSpeed's kernels do the same;
- arithmetic in float32 whatever the input dtype (a bf16 shard is upcast first), scales
  stored as float32 (4 bytes per block); ``dequantize_blocks`` returns ``dtype``;
- storage int8: for ``bits=8`` one code per byte (``q.numel() == numel``); for ``bits=4`` two
  codes per byte, element 2i in the low nibble and 2i+1 in the high nibble, each a 4-bit
  two's-complement code; an odd ``numel`` leaves the last high nibble 0
  (``q.numel() == ⌈numel/2⌉``).

Bytes on the wire for ``numel`` elements, on either grid: ``⌈numel·bits/8⌉`` for the codes plus
``4·⌈numel/block_size⌉`` for the scales (:func:`zerokit.theory.zeropp.quantized_bytes`): 4 bytes
per block of 256 are 1.6 % over int8's codes (4/256), 3.1 % over int4's (4/128).

What DeepSpeed does (0.19.8; Python in ``runtime/zero/partition_parameters.py`` and
``runtime/comm/coalesced_collectives.py``, CUDA kernels in ``csrc/quantization``, built with
``--use_fast_math``): qwZ's ``CUDAQuantizer`` quantizes **the coalesced partitions of one fetch**
(the concatenation of the fetched parameters' shards, or of their secondary shards under hpZ)
in int8 on the grid above, cast to fp16 first, in ``groups`` equal groups: ``groups`` starts at
⌈numel/8000⌉ (``target_group_size = 8000``) and grows by one until 8·groups divides numel, so a
group holds at most 8,000 elements and numel must be a multiple of 8 (an assertion otherwise;
the doubling that follows never fires once groups ≥ numel/8000); the count is cached per numel.
It dequantizes to fp16, then casts to the parameter's dtype. qgZ's ``all_to_all_quant_reduce``
quantizes each gradient with ``swizzle_quant`` in int4 on the same grid in ``max(rows, cols,
world)`` groups for the hop inside the node, and that over the GPUs per node for the hop across
(``quantized_reduction`` dequantizes, sums in fp16 and requantizes); its ``PackedInt4`` puts
element 2i in a byte's high nibble and 2i+1 in its low one.

zerokit's choices, each against that: the **symmetric grid by default** (the same bytes, half
DeepSpeed's worst-case error: ±absmax both on the grid, every element within scale/2 — the
bound lesson 17 and its exercise teach), DeepSpeed's grid on ``grid="deepspeed"`` (``zeropp``'s
``quantization_grid``), where the codes and scales are DeepSpeed's formula's for the same groups
— its fast-math divisions may land an ulp from the exact quotients zerokit computes, and zerokit
quantizes the input's own float32 values, not an fp16 copy (which would overflow past 65,504
and lose bf16's small values); a **fixed block size** (``quantization_block_size``) rather than
an adaptive group count, so a formula gives the bytes exactly, with a short last block rather
than the divisibility requirement; the result in the compute dtype straight from float32; the
low nibble first.
"""
from __future__ import annotations

import torch
from torch import Tensor

BITS = (4, 8)
#: the codes' grids (:mod:`zerokit.theory.zeropp`'s ``QUANTIZATION_GRIDS``): zerokit's default, DeepSpeed's
GRIDS = ("symmetric", "deepspeed")
SCALE_DTYPE = torch.float32


def check_block_size(block_size) -> int:
    """``block_size`` checked: a whole number ≥ 1."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be a whole number >= 1")
    return block_size


def check_bits(bits) -> int:
    """``bits`` checked: 4 or 8."""
    if isinstance(bits, bool) or bits not in BITS:
        raise ValueError(f"bits={bits!r}; allowed: 4, 8")
    return bits


def check_grid(grid) -> str:
    """``grid`` checked: one of :data:`GRIDS`."""
    if not isinstance(grid, str) or grid not in GRIDS:
        raise ValueError(f"grid={grid!r}; allowed: {', '.join(map(repr, GRIDS))}")
    return grid


def qmax(bits: int) -> int:
    """The largest code of a symmetric ``bits``-bit quantizer: 2^(bits−1) − 1 (127, 7)."""
    return 2 ** (check_bits(bits) - 1) - 1


def code_range(bits: int, grid: str = "symmetric") -> tuple[int, int]:
    """The codes a grid uses: (−qmax, qmax) symmetric, (−2^(bits−1), 2^(bits−1) − 1) DeepSpeed's."""
    top = qmax(bits)
    return (-top, top) if check_grid(grid) == "symmetric" else (-top - 1, top)


def _block_view(x: Tensor, block_size: int) -> tuple[Tensor, int]:
    """``x`` (float32, flat) as rows of ``block_size``, the short last block padded with zeros (absmax unchanged)."""
    pad = (-x.numel()) % block_size
    if pad:
        x = torch.cat([x, x.new_zeros(pad)])
    return x.view(-1, block_size), pad


def _codes_and_scales(blocks: Tensor, bits: int, grid: str) -> tuple[Tensor, Tensor]:
    """Rows of float32 values → (float codes, float32 scales) on ``grid``; an all-zero row: codes 0, scale 1."""
    absmax = blocks.abs().amax(dim=1)
    low, high = code_range(bits, grid)
    if grid == "symmetric":
        scales = torch.where(absmax > 0, absmax / high, torch.ones_like(absmax))
        codes = torch.round(blocks / scales[:, None])
    else:  # DeepSpeed's Params<Symmetric>: a multiplier 2^(bits−1)/absmax, the scale stored as its reciprocal
        multiplier = torch.where(absmax > 0, (high + 1) / absmax, torch.ones_like(absmax))
        codes = torch.round(blocks * multiplier[:, None])
        scales = 1 / multiplier
    return codes.clamp_(low, high), scales.to(SCALE_DTYPE)


def block_scales(x: Tensor, block_size: int, bits: int = 8, grid: str = "symmetric") -> Tensor:
    """The per-block scales of a flat float tensor on ``grid`` (absmax/qmax symmetric, 1/(2^(bits−1)/absmax)
    DeepSpeed's), 1 for an all-zero block (float32)."""
    check_block_size(block_size)
    check_bits(bits)
    check_grid(grid)
    blocks, _ = _block_view(x.detach().reshape(-1).to(torch.float32), block_size)
    return _codes_and_scales(blocks, bits, grid)[1]


def _pack_int4(codes: Tensor) -> Tensor:
    """Codes in [−8, 7] (int16), two per byte: even index low nibble, odd index high nibble; int8 storage."""
    if codes.numel() % 2:
        codes = torch.cat([codes, codes.new_zeros(1)])
    nibbles = codes & 0xF                      # two's complement in 4 bits
    packed = nibbles[0::2] | (nibbles[1::2] << 4)
    return packed.to(torch.uint8).view(torch.int8)


def _unpack_int4(packed: Tensor, numel: int) -> Tensor:
    """The inverse of :func:`_pack_int4`: ``numel`` codes as int16, sign-extended from 4 bits."""
    byte = packed.view(torch.uint8).to(torch.int16)
    nibbles = torch.stack([byte & 0xF, byte >> 4], dim=1).reshape(-1)[:numel]
    return torch.where(nibbles >= 8, nibbles - 16, nibbles)


def quantize_blocks(x: Tensor, block_size: int, bits: int = 8, grid: str = "symmetric") -> tuple[Tensor, Tensor]:
    """Quantize a flat float tensor in blocks on ``grid``: ``(q, scales)``, q int8 (two int4 codes per byte for
    bits=4).

    ``x`` is read flat (``reshape(-1)``). ``scales`` has ⌈numel/block_size⌉ float32 entries.
    """
    check_block_size(block_size)
    check_bits(bits)
    check_grid(grid)
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor, got "
                         f"{x.dtype if isinstance(x, Tensor) else type(x).__name__}")
    flat = x.detach().reshape(-1).to(torch.float32)
    numel = flat.numel()
    blocks, _ = _block_view(flat, block_size)
    codes, scales = _codes_and_scales(blocks, bits, grid)
    codes = codes.reshape(-1)[:numel]
    if bits == 8:
        return codes.to(torch.int8), scales
    return _pack_int4(codes.to(torch.int16)), scales


def dequantize_blocks(q: Tensor, scales: Tensor, block_size: int, numel: int, bits: int = 8,
                      dtype: torch.dtype = torch.float32) -> Tensor:
    """The flat tensor of ``numel`` elements that ``(q, scales)`` encode, as ``dtype`` (code × its block's scale)."""
    check_block_size(block_size)
    check_bits(bits)
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel={numel!r} must be a whole number >= 0")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype={dtype!r} must be a floating-point torch dtype")
    expected_codes = numel if bits == 8 else (numel + 1) // 2
    blocks = -(-numel // block_size)
    if q.dtype != torch.int8 or q.numel() != expected_codes:
        raise ValueError(f"q must be int8 with {expected_codes} entries for numel={numel}, bits={bits}; "
                         f"got {q.dtype} with {q.numel()}")
    if scales.numel() != blocks:
        raise ValueError(f"scales must have {blocks} entries (numel={numel}, block_size={block_size}); "
                         f"got {scales.numel()}")
    codes = q.reshape(-1).to(torch.int16) if bits == 8 else _unpack_int4(q.reshape(-1), numel)
    values, pad = _block_view(codes.to(torch.float32), block_size)
    out = (values * scales.to(torch.float32)[:, None]).reshape(-1)
    return out[:numel].to(dtype)


def encode(x: Tensor, block_size: int, bits: int = 8, grid: str = "symmetric") -> Tensor:
    """One message for the wire: the codes, then the float32 scales' bytes, as one flat int8 tensor of
    ``quantized_bytes(numel, block_size, bits)`` bytes (one collective carries both). The receiver's
    :func:`decode` needs no ``grid``: a code times its scale on either."""
    q, scales = quantize_blocks(x, block_size, bits, grid)
    return torch.cat([q, scales.view(torch.int8)])


def decode(message: Tensor, block_size: int, numel: int, bits: int = 8, dtype: torch.dtype = torch.float32) -> Tensor:
    """The inverse of :func:`encode`: the ``numel`` values a message carries, as ``dtype``."""
    codes = numel if bits == 8 else (numel + 1) // 2
    scales = message[codes:].clone().view(SCALE_DTYPE)  # a copy: the scales may start at any byte
    return dequantize_blocks(message[:codes], scales, block_size, numel, bits, dtype)


class ErrorTally:
    """Measured round-trip error |x − deq(q(x))| of what a rank quantized, next to each block's bound
    (:func:`zerokit.theory.zeropp.block_quantization_error_bound` of its scale on ``grid``; 0 for an all-zero
    block, whose scale 1 is a convention and whose values come back exact).

    Lifecycle: ``add(x, back, scales, block_size)`` after each round trip (a qwZ gather, a qgZ hop's row)
    enqueues its work on ``x``'s device and **never reads a value back to the host**: the running maxima,
    the sum and the count stay in one float64 tensor there. :meth:`take` reads them once (one host sync),
    returns ``{"max_abs", "mean_abs", "max_bound", "over_bound", "elements"}`` and clears them; call it once
    per step. ``over_bound``: elements past their own block's bound, with float32's roundings (the
    quotient or multiplier, the scale and the product: 4 × 2^-24 of the value) and the result dtype's
    rounding allowed — 0 unless the codec is wrong.

    Memory: the element-wise work runs in a **workspace** of 3 float32 rows as long as the longest round
    trip added (rounded up to whole blocks), allocated once and kept, so the memory ledger sees it
    (:meth:`tensors`, tracked under ``buffers`` by ``zeropp``); per-block statistics (⌈n/block_size⌉
    elements) are the only transients. Off the hot path: ``zeropp`` hands round trips to its tallies only
    under ``measure_quantization_error=True`` (DeepSpeed measures nothing there)."""

    #: float32's roundings allowed per element, relative to |x|: the quotient (or DeepSpeed's multiplier and
    #: its reciprocal, the scale), the input times the multiplier, the code times the scale
    FLOAT32_ROUNDING = 4 * 2.0 ** -24

    def __init__(self, grid: str = "symmetric"):
        self.grid = check_grid(grid)
        self._workspace = None
        self.clear()

    def clear(self) -> None:
        """Forget the round trips added since the last :meth:`take` (the workspace stays)."""
        self._totals = None  # float64 on the device: max_abs, sum_abs, max_bound, over_bound
        self.elements = 0

    def tensors(self) -> list:
        """What the tally holds on its device: the workspace and the running totals (for the memory ledger)."""
        return [t for t in (self._workspace, self._totals) if t is not None]

    def _rows(self, padded: int, device) -> tuple[Tensor, Tensor, Tensor]:
        if self._workspace is None or self._workspace.shape[1] < padded or self._workspace.device != device:
            self._workspace = torch.empty(3, padded, dtype=torch.float32, device=device)
        return tuple(row[:padded] for row in self._workspace)

    @torch.no_grad()
    def add(self, x: Tensor, back: Tensor, scales: Tensor, block_size: int) -> None:
        """One round trip: ``x`` sent, ``back`` = its dequantized values, ``scales`` its blocks' scales."""
        n = x.numel()
        if n == 0:
            return
        blocks = -(-n // block_size)
        values, error, allowed = self._rows(blocks * block_size, x.device)
        values[:n].copy_(x.reshape(-1))
        values[n:].zero_()
        error[:n].copy_(values[:n]).sub_(back.reshape(-1))
        error[n:].zero_()
        error.abs_()
        by_block = values.view(blocks, block_size)
        absmax = torch.maximum(by_block.amax(dim=1), by_block.amin(dim=1).neg())
        step = scales.to(device=x.device, dtype=torch.float32)
        half = step / 2 if self.grid == "symmetric" else step  # the grid's bound, per block
        bound = torch.where(absmax > 0, half, torch.zeros_like(half))  # a zero block comes back exact
        allowed.view(blocks, block_size).copy_(bound[:, None].expand(blocks, block_size))
        allowed.mul_(1 + 2 ** -20)
        rounding = self.FLOAT32_ROUNDING + torch.finfo(back.dtype).eps  # the result's own rounding too
        allowed.add_(values.abs_(), alpha=rounding)
        largest, total = error.max(), error.sum()
        over = error.sub_(allowed).gt_(0).sum()
        step_totals = torch.stack([largest, total, bound.max(), over]).to(torch.float64)
        if self._totals is None:
            self._totals = step_totals
        else:
            self._totals[0::2] = torch.maximum(self._totals[0::2], step_totals[0::2])
            self._totals[1::2] += step_totals[1::2]
        self.elements += n

    def take(self) -> dict:
        """The totals since the last take, read from the device once; cleared after."""
        max_abs, sum_abs, max_bound, over = self._totals.tolist() if self._totals is not None else (0.0,) * 4
        out = {"max_abs": max_abs, "mean_abs": sum_abs / max(self.elements, 1), "max_bound": max_bound,
               "over_bound": int(over), "elements": self.elements}
        self.clear()
        return out
