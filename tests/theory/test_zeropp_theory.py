"""ZeRO++'s formulas by hand: the quantizer's bound and bytes, the volumes per axis, the paper's 3M → 0.75M."""
import pytest

from zerokit import theory


def test_block_quantizer_bound_and_bytes_by_hand():
    assert theory.quantization_levels(8) == 127 and theory.quantization_levels(4) == 7
    assert theory.block_quantization_scale(1.27, 8) == pytest.approx(0.01)
    assert theory.block_quantization_scale(0.0) == 1.0  # an all-zero block
    assert theory.block_quantization_error_bound(0.01) == 0.005
    assert theory.block_quantization_relative_bound(4) == 1 / 14
    # 1,000 elements in blocks of 64: 16 blocks (the last one 40 long), 64 scale bytes
    assert theory.quantized_bytes(1000, 64, 8) == 1000 + 64
    assert theory.quantized_bytes(1001, 64, 4) == 501 + 64


def test_volumes_per_axis_by_hand():
    """Ψ = 1,024 in one unit, N = 4 on 2 nodes of 2, b = 2, blocks of 256: C = 256 per rank."""
    by = theory.zeropp_collective_bytes([1024], 4, 2, ranks_per_node=2, hpz_partition_size=2, quantized_weights=True,
                                        quantized_gradients=True, block_size=256, gradient_bits=4)
    assert by == {"dp": {"all_gather": 3 * (256 + 4)},        # forward only: 3 peers' int8 shards and scales
                  "hpz": {"all_gather": 1 * 512 * 2},         # backward from the secondary copy, 16-bit
                  "node": {"all_to_all": 1 * (256 + 8)},      # hop 1: 2 nodes' chunks (512 int4 = 256 B, 2 scales)
                  "inter_node": {"all_to_all": 1 * (128 + 4)}}  # hop 2: one chunk (256 int4, 1 scale)
    zero3 = theory.zeropp_collective_bytes([1024], 4, 2)
    assert sum(sum(ops.values()) for ops in zero3.values()) == theory.comm_bytes_per_step(3, 1024, 4, 2)
    assert theory.zeropp_collective_bytes([1024], 4, 2, micro_batches=3)["dp"]["all_gather"] == 3 * 2 * 3 * 512


def test_the_papers_cross_node_accounting_to_the_byte():
    kwargs = dict(ranks_per_node=2, block_size=256)
    zero3 = theory.zeropp_bytes_leaving_a_node([1024], 4, 2, **kwargs)
    assert sum(zero3.values()) == theory.hierarchical_link_bytes("zero3", 1024, 4, 2, 2)["leaving_node"] == 4608
    zeropp = theory.zeropp_bytes_leaving_a_node([1024], 4, 2, hpz_partition_size=2, quantized_weights=True,
                                                quantized_gradients=True, **kwargs)
    m = 1024 * 2  # M: the model's 16-bit bytes
    paper = theory.paper_cross_node_volume(True, True, True)
    assert paper == {"forward_all_gather": 0.5, "backward_all_gather": 0, "gradient_reduce_scatter": 0.25}
    assert sum(theory.paper_cross_node_volume(False, False, False).values()) == 3
    # the paper's terms times (n−1)/n, plus the scales it leaves out
    assert zeropp["forward_all_gather"] == 0.5 * m * 3 / 4 + 3 * 4
    assert zeropp["backward_all_gather"] == 0
    assert zeropp["gradient_reduce_scatter"] == 0.25 * m * 1 / 2 + 2 * 4  # 2 ranks each send one chunk's scale
    assert sum(zeropp.values()) / sum(zero3.values()) == pytest.approx((780 + 264) / 4608)


def test_hpz_secondary_and_qgz_bound_by_hand():
    assert theory.hpz_secondary_numel([10, 7], 4, 2) == 12 // 2 + 8 // 2  # N-padded units, halved
    assert theory.hpz_secondary_numel([10], 4, 1) == 0
    assert theory.qgz_error_bound(7.0, 1, 3, 4) == pytest.approx(3 * 7 / 14)  # one hop over 3 nodes
    assert theory.qgz_error_bound(7.0, 2, 1, 4) == pytest.approx(2 * 7 / 14)  # one hop inside a node
    e1 = 2 * 7 / 14
    assert theory.qgz_error_bound(7.0, 2, 2, 4) == pytest.approx(2 * (e1 + (14 + e1) / 14))


@pytest.mark.parametrize("call,name", [
    (lambda: theory.quantized_bytes(10, 0), "block_size"),
    (lambda: theory.quantized_bytes(10, 4, bits=2), "bits"),
    (lambda: theory.zeropp_collective_bytes([8], 4, 2, ranks_per_node=3), "ranks_per_node"),
    (lambda: theory.zeropp_collective_bytes([8], 4, 2, hpz_partition_size=3), "hpz_partition_size"),
    (lambda: theory.block_quantization_error_bound(0), "scale")])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()
