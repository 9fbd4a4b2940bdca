"""ZeRO++ (arXiv 2306.10209): the block quantizer, then qwZ, hpZ and qgZ against exact ZeRO-3."""
import pytest
import torch

from zerokit.theory.zeropp import block_quantization_error_bound, quantized_bytes
from zerokit.zero.quantize import dequantize_blocks, quantize_blocks


# --- the block quantizer --------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("numel,block_size", [(1000, 64), (7, 3), (1, 5), (33, 33), (64, 16)])
def test_round_trip_is_within_half_a_scale_per_element(bits, numel, block_size):
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel + bits))
    x[:block_size] = 0 if numel > block_size else x[:block_size]  # a zero block where there are two blocks
    q, scales = quantize_blocks(x, block_size, bits)
    assert q.dtype == torch.int8 and q.numel() == (numel if bits == 8 else (numel + 1) // 2)
    assert scales.numel() == -(-numel // block_size)
    assert q.numel() * q.element_size() + scales.numel() * 4 == quantized_bytes(numel, block_size, bits)
    back = dequantize_blocks(q, scales, block_size, numel, bits)
    assert torch.isfinite(back).all()
    bound = torch.tensor([block_quantization_error_bound(float(s)) for s in scales]).repeat_interleave(block_size)
    err = (x - back).abs()
    assert (err <= bound[:numel] * (1 + 2 ** -20)).all()
    if numel > block_size:
        assert (back[:block_size] == 0).all() and scales[0] == 1  # the zero block: scale 1, exact zeros
    assert err.max() > 0 or numel == 1  # the codec is lossy: the check can fail


def test_int4_packs_two_codes_per_byte_low_nibble_first():
    x = torch.tensor([1.0, -7.0, 7.0, 0.0, -1.0])  # block of 5, absmax 7 → scale 1 → codes equal x
    q, scales = quantize_blocks(x, 5, bits=4)
    assert scales.tolist() == [1.0]
    assert q.view(torch.uint8).tolist() == [0x1 | (0x9 << 4), 0x7 | (0x0 << 4), 0xF]
    assert dequantize_blocks(q, scales, 5, 5, bits=4).tolist() == x.tolist()


def test_bf16_input_is_quantized_in_float32_and_returned_as_asked():
    x = torch.randn(50, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q, scales = quantize_blocks(x, 8)
    back = dequantize_blocks(q, scales, 8, 50, dtype=torch.bfloat16)
    assert back.dtype == torch.bfloat16 and scales.dtype == torch.float32
    bound = scales.repeat_interleave(8)[:50] / 2 + x.float().abs() * 2 ** -8  # + half a bf16 ulp of the value
    assert ((x.float() - back.float()).abs() <= bound).all()


@pytest.mark.parametrize("kwargs,name", [(dict(block_size=0), "block_size"), (dict(block_size=2.0), "block_size"),
                                         (dict(bits=3), "bits"), (dict(bits=True), "bits"),
                                         (dict(x=torch.arange(4)), "x")])
def test_bad_input_names_the_argument(kwargs, name):
    args = dict(x=torch.randn(4), block_size=2, bits=8) | kwargs
    with pytest.raises(ValueError, match=name):
        quantize_blocks(**args)
