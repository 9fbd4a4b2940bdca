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


def test_hpz_under_accumulation_gathers_over_dp_once_per_step_by_hand():
    """Ψ = 1,024, N = 4 on 2 nodes of 2, s = 2, b = 2: C = 256, a secondary shard of 512. DeepSpeed's secondary
    copy: the step's first forward gathers over dp (3·256·2 = 1,536 B); the other 2A − 1 gathers over hpz
    (1·512·2 = 1,024 B each); the gradients A reduce-scatters over dp."""
    for a in (1, 2, 4):
        by = theory.zeropp_collective_bytes([1024], 4, 2, ranks_per_node=2, hpz_partition_size=2, micro_batches=a)
        assert by == {"dp": {"all_gather": 1536, "reduce_scatter": a * 1536}, "hpz": {"all_gather": (2 * a - 1) * 1024}}
        leaving = theory.zeropp_bytes_leaving_a_node([1024], 4, 2, ranks_per_node=2, hpz_partition_size=2,
                                                     micro_batches=a)
        # a ring over 4 ranks on 2 nodes leaves each node with one rank's bytes; the hpz group stays inside
        assert leaving == {"forward_all_gather": 1536, "backward_all_gather": 0, "gradient_reduce_scatter": a * 1536}
    # s = 4 spans the nodes: the later gathers leave too, by phase (A = 2: one forward, two backward over hpz)
    leaving = theory.zeropp_bytes_leaving_a_node([1024], 4, 2, ranks_per_node=2, hpz_partition_size=4,
                                                 micro_batches=2)
    assert leaving == {"forward_all_gather": 1536 + 1536, "backward_all_gather": 2 * 1536,
                       "gradient_reduce_scatter": 2 * 1536}
    # without hpZ both gathers run over dp for every micro-batch, as before
    assert theory.zeropp_collective_bytes([1024], 4, 2, ranks_per_node=2, micro_batches=2)["dp"]["all_gather"] == \
        2 * 2 * 1536


@pytest.mark.parametrize("a", [1, 2, 4])
def test_the_planners_hpz_formula_is_zeropps_hpz(a):
    """theory.hierarchical's hpZ (the planner's, lesson 17's hpZ row) and theory.zeropp's count the same gathers
    (units that N divides: the planner pads the secondary shard to s, zerokit's flat unit to N)."""
    units, n, g = [1024, 336, 4096], 16, 4
    by = theory.hpz_collective_bytes(0, n, g, 2, a, units)
    zpp = theory.zeropp_collective_bytes(units, n, 2, ranks_per_node=g, hpz_partition_size=g, micro_batches=a)
    assert by["global"] == zpp["dp"] and by["secondary"] == zpp["hpz"]
    assert theory.hierarchical_link_bytes("hpz", 0, n, g, 2, a, units=units)["leaving_node"] == \
        sum(theory.zeropp_bytes_leaving_a_node(units, n, 2, ranks_per_node=g, hpz_partition_size=g,
                                               micro_batches=a).values())


def test_the_7b_lesson_column_with_four_micro_batches():
    """Lesson 17's 7 B model, bf16, 4 nodes of 8, qwZ + hpZ (8) + qgZ, A = 4: C = 7e9/32 = 218,750,000. Leaving a
    node: the step's one forward gather, 31·(C + 4·⌈C/256⌉) = 31·222,167,972; the gradients, 8 ranks × A × 3 peers
    × (C/2 + 4·⌈C/256⌉) = 96·112,792,972 — 17.7 GB, 1.27M (M = 14 GB): (0.5 + 0.25·A)M less (n−1)/n, not 4 × 0.75M."""
    leaving = theory.zeropp_bytes_leaving_a_node([7_000_000_000], 32, 2, ranks_per_node=8, hpz_partition_size=8,
                                                 quantized_weights=True, quantized_gradients=True, micro_batches=4)
    assert leaving == {"forward_all_gather": 31 * 222_167_972, "backward_all_gather": 0,
                       "gradient_reduce_scatter": 96 * 112_792_972}
    assert sum(leaving.values()) / 14e9 == pytest.approx(1.265, abs=1e-3)


def test_qgz_runs_only_across_nodes_and_for_the_units_it_reduces():
    """On one node DeepSpeed reduce-scatters: zero_quantized_gradients gives ZeRO-3's bytes. Across nodes a unit
    flagged False (1-D or indivisible gradients only) is reduce-scattered, the others take the two hops."""
    assert not theory.zeropp.qgz_runs(4, 4) and theory.zeropp.qgz_runs(4, 2) and theory.zeropp.qgz_runs(3, 1)
    one_node = theory.zeropp_collective_bytes([1024, 64], 2, 2, ranks_per_node=2, quantized_gradients=True)
    assert one_node == theory.zeropp_collective_bytes([1024, 64], 2, 2, ranks_per_node=2)
    assert one_node == {"dp": {"all_gather": 2 * (512 + 32) * 2, "reduce_scatter": (512 + 32) * 2}}
    by = theory.zeropp_collective_bytes([1024, 64], 4, 2, ranks_per_node=2, quantized_gradients=True,
                                        qgz_units=[True, False])
    assert by["dp"]["reduce_scatter"] == 3 * 16 * 2  # the second unit: C = 16, exact
    assert by["node"] == {"all_to_all": 256 + 8} and by["inter_node"] == {"all_to_all": 128 + 4}  # the first unit
    leaving = theory.zeropp_bytes_leaving_a_node([1024, 64], 4, 2, ranks_per_node=2, quantized_gradients=True,
                                                 qgz_units=[True, False])
    assert leaving["gradient_reduce_scatter"] == 2 * (128 + 4) + 3 * 16 * 2
    with pytest.raises(ValueError, match="qgz_units"):
        theory.zeropp_collective_bytes([1024, 64], 4, 2, ranks_per_node=2, quantized_gradients=True,
                                       qgz_units=[True])


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
