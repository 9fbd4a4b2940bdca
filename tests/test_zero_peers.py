"""The sharded peers side by side with zerokit's stages: torch ZeroRedundancyOptimizer, FSDP2, DeepSpeed.

Same workload, same reference, same ledgers; the losses match across all of them.
DeepSpeed's peers need ``pip install deepspeed`` (the ``peers`` extra) and are skipped
without it.
"""
import pytest

import zerokit
from zerokit.cli import compare
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
