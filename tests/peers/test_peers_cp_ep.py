"""The context- and expert-parallel peers on 2 ranks against one process, each on zerokit's tiny GPT with the same
data, one launch each: torch's ring attention below ``context_parallel`` (``torch-ring``, cp=2; the public API does not
run on the CPU, README, peers), DeepSpeed's Ulysses ``DistributedAttention`` (``deepspeed-ulysses``, cp=2) and
DeepSpeed's MoE layer (``deepspeed-moe``, dp=2×ep=2)."""
import pytest

import zerokit
from zerokit.peers.deepspeed_ulysses import deepspeed_available

needs_deepspeed = pytest.mark.skipif(not deepspeed_available(), reason="deepspeed is not installed")


def _cp_gpt():
    return zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=4, tie_weights=True)


def _check_cp(report, peer):
    result = report[peer]
    assert result.param_diff["max_abs"] <= 1e-5, result.param_diff  # fp32: the same sums in another order
    assert result.losses == pytest.approx(report["single"].losses, abs=1e-5)
    for rank in result.ranks:
        measured = {axis: row["ring_cost_bytes"] for axis, row in rank.comm_bytes_by_axis.items()}
        # the peer's exchanges on cp = the formula of its algorithm; ddp's buckets on dp × cp
        assert measured == pytest.approx(rank.theory_comm_bytes_by_axis, abs=0.5), (measured,
                                                                                     rank.theory_comm_bytes_by_axis)
        assert set(measured) == {"cp", "dp_cp"}


def test_torch_ring_attention_trains_like_one_process_and_sends_the_ring_bytes():
    from zerokit.cli import compare

    report = compare(_cp_gpt(), 2, ["single", "torch-ring"], steps=2, optimizer="sgd", lr=0.1, parallel={"cp": 2},
                     options_for=lambda name: {} if name == "single" else {"cp_attention": "ring"})
    _check_cp(report, "torch-ring")


@needs_deepspeed
def test_deepspeed_ulysses_trains_like_one_process_and_sends_the_ulysses_bytes():
    from zerokit.cli import compare

    report = compare(_cp_gpt(), 2, ["single", "deepspeed-ulysses"], steps=2, optimizer="sgd", lr=0.1,
                     parallel={"cp": 2},
                     options_for=lambda name: {} if name == "single" else {"cp_attention": "ulysses"})
    _check_cp(report, "deepspeed-ulysses")  # DeepSpeed's 4 all-to-alls per layer each way = Ulysses' formula


@needs_deepspeed
def test_deepspeed_moe_trains_like_one_process_on_the_ep_ranks():
    from zerokit.cli import compare

    gpt = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=4, n_experts=4, top_k=1)
    report = compare(gpt, 2, ["single", "deepspeed-moe"], steps=2, optimizer="sgd", lr=0.1,
                     parallel={"dp": 2, "ep": 2})
    result = report["deepspeed-moe"]
    assert result.param_diff["max_abs"] <= 1e-5, result.param_diff
    assert result.losses == pytest.approx(report["single"].losses, abs=1e-5)
    model = gpt.build_model()
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    dense = sum(p.numel() for p in model.parameters()) - experts
    for rank in result.ranks:
        assert rank.model_state_bytes["params"] == 4 * (dense + experts // 2)  # the dense weights, half the experts
        measured = {axis: row["ring_cost_bytes"] for axis, row in rank.comm_bytes_by_axis.items()}
        assert set(measured) == {"dp", "ep"}
        assert measured["dp"] == pytest.approx(rank.theory_comm_bytes_by_axis["dp"], abs=0.5)
        # ep: DeepSpeed's padded [E, C, d] all-to-alls; the formula on those rows also counts zerokit's expert ids
        # and count exchange, which DeepSpeed does not send
        assert 0 < measured["ep"] <= rank.theory_comm_bytes_by_axis["ep"]

