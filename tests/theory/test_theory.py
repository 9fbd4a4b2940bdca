"""The formulas of FACTS.md, checked on the figures the paper and FACTS quote."""
import math

import pytest

from zerokit import theory


def test_mixed_precision_model_states_match_the_paper():
    psi, n = 7_500_000_000, 64  # ZeRO Figure 1: 7.5B params, N = 64
    assert theory.paper_model_state_bytes(0, psi, n) == 16 * psi  # 120 GB
    # the paper prints GB rounded to one decimal: 31.4, 16.6, 1.9
    assert theory.paper_model_state_bytes(1, psi, n) == pytest.approx(31.4e9, abs=0.05e9)
    assert theory.paper_model_state_bytes(2, psi, n) == pytest.approx(16.6e9, abs=0.05e9)
    assert theory.paper_model_state_bytes(3, psi, n) == pytest.approx(1.9e9, abs=0.05e9)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_exact_model_states_with_padding(n):
    psi = 1001
    shard = math.ceil(psi / n)
    fp32 = {s: theory.model_state_bytes(s, psi, n, "fp32", "adamw") for s in theory.STAGES}
    assert fp32[0].total == 16 * psi
    assert fp32[1].total == 8 * n * shard + 8 * shard
    assert fp32[2].total == 4 * n * shard + 12 * shard
    assert fp32[3].total == 16 * shard
    mixed = {s: theory.model_state_bytes(s, psi, n, "bf16-mixed", "adamw") for s in theory.STAGES}
    assert mixed[0].total == 16 * psi
    assert mixed[1].as_dict() == {"params": 2 * n * shard, "grads": 2 * n * shard, "optimizer": 12 * shard,
                                  "step_scalars": 0, "total": 4 * n * shard + 12 * shard}
    assert mixed[3].total == 16 * shard


def test_step_scalars_are_counted_and_stated():
    states = theory.model_state_bytes(0, 100, 2, "fp32", "adamw", optimizer_tensors=3)
    assert states.step_scalars == 12 and states.optimizer == 8 * 100 + 12
    assert theory.model_state_bytes(0, 100, 2, "fp32", "sgd", optimizer_tensors=3).optimizer == 0


def test_per_unit_padding():
    assert theory.shard_numel([5, 7], 4) == 2 + 2
    assert theory.padded_numel([5, 7], 4) == 16


@pytest.mark.parametrize("n,expected", [(2, 0.375), (4, 0.5625), (8, 0.65625)])
def test_zero1_saving_is_not_a_fixed_third(n, expected):
    assert theory.zero1_saving_fraction(n) == pytest.approx(expected)
    assert theory.zero1_saving_fraction(n, "fp32") == pytest.approx(0.5 * (1 - 1 / n))


def test_ring_bytes():
    assert theory.ring_bytes_sent("all_reduce", 1200, 4) == 1800
    assert theory.ring_bytes_sent("reduce_scatter", 1200, 4) == 900
    assert theory.ring_bytes_sent("all_gather", 1200, 4) == 900
    assert theory.ring_bytes_sent("all_reduce", 1200, 1) == 0
    assert theory.ring_steps("all_reduce", 4) == 6
    assert [theory.ring_bytes_sent("broadcast", 10, 3, rank=r, src=0) for r in range(3)] == [10, 10, 0]
    with pytest.raises(ValueError, match="op='gather'"):
        theory.ring_bytes_sent("gather", 10, 2)


@pytest.mark.parametrize("n", [2, 3, 4, 8, 64])
def test_zero3_moves_one_and_a_half_times_ddp(n):
    psi = 12 * n  # divisible: no padding
    ddp = theory.comm_bytes_per_step(0, psi, n, 2)
    assert theory.comm_bytes_per_step(1, psi, n, 2) == ddp
    assert theory.comm_bytes_per_step(2, psi, n, 2) == ddp
    assert theory.comm_bytes_per_step(3, psi, n, 2) / ddp == 1.5


def test_accumulation_traffic():
    psi, n, a = 120, 4, 3
    half = (n - 1) * psi * 4 // n
    assert theory.comm_bytes_per_step(0, psi, n, 4, micro_batches=a) == 2 * half
    assert theory.comm_bytes_per_step(1, psi, n, 4, micro_batches=a) == 2 * half
    assert theory.comm_bytes_per_step(2, psi, n, 4, micro_batches=a) == a * half + half
    assert theory.comm_bytes_per_step(3, psi, n, 4, micro_batches=a) == 3 * a * half


def test_pipeline_and_activation_formulas():
    assert theory.bubble_fraction(4, 8) == pytest.approx(3 / 11)  # 27.3 %
    assert theory.bubble_over_ideal(4, 8) == pytest.approx(0.375)
    assert theory.peak_stashed_microbatches("1f1b", 4, 8, 0) == 4
    assert theory.peak_stashed_microbatches("gpipe", 4, 8, 3) == 8
    assert theory.activation_bytes_per_layer(2, 1, 4, 1) == 2 * 4 * (34 + 5 * 2 / 4)
    assert theory.checkpointed_blocks(16, 4) == 8 == 2 * math.sqrt(16)
    assert theory.tp_elements_sent_per_layer(1, 2, 4, 2) == 32


def test_bad_arguments_name_what_is_allowed():
    with pytest.raises(ValueError, match="stage=4.*0, 1, 2, 3"):
        theory.model_state_bytes(4, 10, 2)
    with pytest.raises(ValueError, match="precision='fp16'.*fp32, bf16-mixed"):
        theory.model_state_bytes(0, 10, 2, "fp16")
    with pytest.raises(ValueError, match="optimizer='lamb'"):
        theory.model_state_bytes(0, 10, 2, "fp32", "lamb")


def test_frozen_parameters_are_held_but_neither_graded_nor_stepped():
    states = theory.model_state_bytes(0, 100, 1, "fp32", "adamw", optimizer_tensors=2, frozen_numel=30)
    assert (states.params, states.grads, states.optimizer) == (400, 280, 8 * 70 + 8)
    # ZeRO holds a frozen parameter whole on every rank (not in the sharded units): params only
    states = theory.model_state_bytes(2, 100, 2, "fp32", "adamw", units=[70], frozen_numel=30)
    assert (states.params, states.grads, states.optimizer) == (4 * 70 + 4 * 30, 4 * 35, 8 * 35)
    states = theory.model_state_bytes(3, 100, 2, "fp32", "sgd", units=[70], frozen_numel=30)
    assert (states.params, states.grads) == (4 * 35 + 4 * 30, 4 * 35)


def test_model_flops_utilization_is_six_psi_per_token_over_the_peak():
    assert theory.training_flops_per_token(65e9) == 6 * 65e9
    # 1,000 tokens/s/GPU on a 1 B model on a 312 TFLOP/s A100: 6e12 / 312e12
    assert theory.model_flops_utilization(1e9, 1000, 312e12) == pytest.approx(6e12 / 312e12)
    with pytest.raises(ValueError, match="psi"):
        theory.training_flops_per_token(0)
    with pytest.raises(ValueError, match="peak_flops"):
        theory.model_flops_utilization(1e9, 1000, 0)
