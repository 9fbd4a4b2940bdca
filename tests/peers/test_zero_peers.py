"""The sharded peers side by side with zerokit's stages: torch ZeroRedundancyOptimizer, FSDP2, DeepSpeed.

Same workload, same reference, same ledgers; the losses match across all of them.
DeepSpeed's peers need ``pip install deepspeed`` (the ``peers`` extra) and are skipped
without it. Every peer also trains a GPT whose token embedding is its output head.
"""
import pytest

import zerokit
from zerokit import theory
from zerokit.cli import compare
from zerokit.job import make_job
from zerokit.train import run_job
from zerokit.zero.units import form_units
from zerokit.report import param_difference
from zerokit.peers.deepspeed import deepspeed_available

TORCH_PEERS = ["torch-zero1", "fsdp2-zero2", "fsdp2-zero3"]
DEEPSPEED_PEERS = ["deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3"]
needs_deepspeed = pytest.mark.skipif(not deepspeed_available(),
                                     reason="deepspeed is not installed (pip install -e '.[peers]')")


def odd_mlp():
    return zerokit.mlp((13, 37, 29, 7), batch_size=12, seed=3)


def _check_side_by_side(report, peers):
    ours = report["zero1"]
    for name in ["zero1", "zero2", "zero3", *peers]:
        result = report[name]
        assert result.param_diff["max_abs"] <= 1e-6, name
        assert result.losses == pytest.approx(report["single"].losses, abs=1e-6), name
        assert param_difference(result.ranks[0].params, ours.ranks[0].params)["max_abs"] <= 1e-6, name
        assert result.ranks[0].comm_ring_cost_bytes_per_step > 0, name  # the peer's traffic is in the ledger


def test_torch_peers_side_by_side():
    report = compare(odd_mlp(), 3, ["single", "zero1", "zero2", "zero3", *TORCH_PEERS], steps=10,
                     keep_records=True)
    _check_side_by_side(report, TORCH_PEERS)
    ops = lambda name: {(r["phase"], r["op"]) for r in report[name].ranks[0].comm_records if r["phase"] != "setup"}
    assert ops("torch-zero1") == {("backward", "all_reduce"), ("step", "broadcast")}
    assert ops("fsdp2-zero3") >= {("forward", "all_gather"), ("backward", "all_gather"), ("backward", "reduce_scatter")}
    assert ("backward", "all_gather") not in ops("fsdp2-zero2")  # kept gathered from forward to backward
    # FSDP2 reshards after forward: 1.5 × the traffic of keeping the parameters gathered
    ratio = report["fsdp2-zero3"].ranks[0].comm_ring_cost_bytes_per_step / report["fsdp2-zero2"].ranks[0].comm_ring_cost_bytes_per_step
    assert ratio == pytest.approx(1.5)


@needs_deepspeed
def test_deepspeed_peers_side_by_side():
    report = compare(odd_mlp(), 2, ["single", "zero1", "zero2", "zero3", *DEEPSPEED_PEERS], steps=10)
    _check_side_by_side(report, DEEPSPEED_PEERS)


def test_torch_zero1_refuses_bf16_mixed():
    with pytest.raises(zerokit.RankFailed, match="runs in fp32 only"):
        zerokit.train(odd_mlp(), "torch-zero1", world_size=2, steps=1, precision="bf16-mixed", reference=False)


# --- tied weights: GPT-2's token embedding is its output head --------------------------------------

def tied_gpt():
    return zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=12, tie_weights=True)


ALL_PEERS = ["torch-ddp", *TORCH_PEERS, *(DEEPSPEED_PEERS if deepspeed_available() else [])]


@pytest.mark.parametrize("n", [2, 3])
def test_peers_train_tied_gpt(n):
    """Every peer trains the tied-weight GPT as one process does (FSDP2: the tied embedding and head end up
    in the root's fully_shard group). SGD, because AdamW's normalisation amplifies the summation order of the
    gradients to ~1e-6 on GPTs; lr 0.1 moves the parameters by ~0.1, so a missing share of the tied gradient
    would show far above the tolerance."""
    report = compare(tied_gpt(), n, ["single", *ALL_PEERS], steps=3, optimizer="sgd", lr=0.1)
    for name in ALL_PEERS:
        result = report[name]
        assert result.param_diff["max_abs"] <= 1e-5, (name, result.param_diff)
        assert result.losses == pytest.approx(report["single"].losses, abs=1e-5), name


def test_fsdp2_unit_sizes_on_tied_gpt():
    """unit_size 0 (every module a group) and a size that makes the ModuleList a unit (one fully_shard group
    over its children) train the tied model too."""
    sizes = {"fsdp2-zero2": 0, "fsdp2-zero3": 5000}
    report = compare(tied_gpt(), 2, ["single", *sizes], steps=3, optimizer="sgd", lr=0.1,
                     options_for=lambda name: {"unit_size": sizes[name]} if name in sizes else {})
    for name in sizes:
        assert report[name].param_diff["max_abs"] <= 1e-5, (name, report[name].param_diff)


@pytest.mark.parametrize("value", ["blocks", -1, 1.5, True, None])
def test_fsdp2_unit_size_is_checked(value):
    with pytest.raises(ValueError, match=r"option unit_size=.*'block'.*0.*whole number of elements"):
        zerokit.strategies.get("fsdp2-zero3").resolve_options({"unit_size": value})


def test_fsdp2_unit_size_default_is_block():
    from zerokit.zero.units import BLOCK

    assert zerokit.strategies.get("fsdp2-zero2").resolve_options({})["unit_size"] == BLOCK
    assert zerokit.strategies.get("fsdp2-zero3").resolve_options({"unit_size": 4096.0})["unit_size"] == 4096.0


# --- FSDP2's memory, as its ledger reads it ----------------------------------------------------------

def deep_gpt():
    """Four blocks, every dimension even: at 2 ranks neither FSDP2 (per parameter) nor hsdp (per unit) pads."""
    return zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=4, n_head=2, batch_size=8)


@pytest.fixture(scope="module")
def fsdp2_and_hsdp():
    """fsdp2-zero3 and hsdp with one shard group of 2 (zero3's mechanism with FSDP2's lifecycle), 3 SGD steps."""
    return {name: run_job(make_job(deep_gpt(), name, 2, 3, "fp32", "sgd", 0.1, 1, options), 2)
            for name, options in (("fsdp2-zero3", {}), ("hsdp", {"shard_group_size": 2}))}


def test_fsdp2_is_measured_in_backward_with_what_it_holds_there(fsdp2_and_hsdp):
    """FSDP2's ledger is sampled in backward on its unsharded parameters and reads FSDP2's own buffers: the unit
    prefetched in backward (its all-gather output) and the reduce-scatter input in flight. Each category's peak
    is then hsdp's, which holds the same by construction (zerokit/zero/fsdp2_lifecycle.py) and is measured by
    other code: the parameters = the shards, the root, the block computing and the one prefetched; but for the
    buffers, where FSDP2 keeps a block's all-gather output in forward until the next block's copy-out (its
    copy-out overlap) and hsdp gathers into the block's own buffer."""
    units = [sum(p.numel() for p in spec.params) for spec in form_units(deep_gpt().build_model(), "block", set())]
    block = 4 * max(units[:-1])
    for theirs, ours in zip(fsdp2_and_hsdp["fsdp2-zero3"].ranks, fsdp2_and_hsdp["hsdp"].ranks):
        assert theirs.peak_by_category["params"] == theory.hsdp_peak_param_bytes(units, 2, 4), theirs.rank
        for category in ("params", "grads", "activations"):
            assert theirs.peak_by_category[category] == ours.peak_by_category[category], (category, theirs.rank)
        assert (theirs.peak_by_category["buffers"], ours.peak_by_category["buffers"]) == (block, 0)
