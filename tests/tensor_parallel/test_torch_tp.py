"""``torch-tp``: torch's parallelize_module (Colwise/RowwiseParallel, SequenceParallel) in zerokit's loop.

Parity with the single-process reference, each rank's place on the mesh, and DTensor's
functional collectives in the ledger on axis ``tp``, equal to the ring formula for the
plan's collectives. SGD with lr 0.1: a wrong shard or a missing gradient share would move
the parameters by ~0.1, far above the tolerance.
"""
from collections import Counter

import pytest

import zerokit

B, S, H, V, L = 8, 16, 32, 64, 2  # batch, sequence, d_model, vocab, layers


def gpt(tie_weights=False, n_head=4):
    return zerokit.tiny_gpt(vocab=V, seq_len=S, d_model=H, n_layer=L, n_head=n_head, batch_size=B,
                            tie_weights=tie_weights)


def train(t, steps=3, workload=None, **kw):
    return zerokit.train(workload or gpt(), "torch-tp", world_size=t, steps=steps, optimizer="sgd", lr=0.1,
                         parallel={"dp": 1, "tp": t}, **kw).result


def ops(rank):
    return Counter((r["phase"], r["op"], r["numel"]) for r in rank.comm_records if r["step"] == 0)


def _check(result, t):
    assert result.param_diff["max_abs"] <= 1e-5, result.param_diff
    assert [r.coords["tp"] for r in result.ranks] == list(range(t))
    for rank in result.ranks:
        assert rank.coords["dp"] == 0 and rank.coords["pp"] == 0
        tp = rank.comm_bytes_by_axis["tp"]
        assert tp["payload_bytes"] > 0
        assert set(rank.comm_bytes_by_axis) == {"tp"}
        assert rank.comm_ring_cost_bytes_per_step == pytest.approx(rank.theory_comm_bytes_per_step)


@pytest.mark.parametrize("t", [2, 4])
def test_torch_tp_matches_reference(t):
    result = train(t, keep_records=True)
    _check(result, t)
    bsh = B * S * H
    # per step: the embedding's all-reduce and 2 per layer in forward (Megatron's g), 2 per layer and the head's
    # input gradient in backward (f, once for q, k and v together), and the gathered logits
    assert ops(result.ranks[0]) == {("forward", "all_reduce", bsh): 1 + 2 * L, ("backward", "all_reduce", bsh): 2 * L + 1,
                                    ("forward", "all_gather", B * S * V): 1}
    # model states: the stage-0 formula on this rank's local shards, sharded weights /t plus the replicated rest
    states = result.ranks[0].model_state_bytes
    sharded = L * (3 * H * H + 3 * H + H * H + 4 * H * H + 4 * H + 4 * H * H) + 2 * V * H  # qkv, proj, fc, tok, head
    assert states["params"] == result.ranks[0].theory_model_states["params"] \
        == 4 * (result.param_count - sharded * (t - 1) // t)
    # torch computes the vocab-sharded embedding's gradient whole on every rank, sliced at the step
    assert states["grads"] - result.ranks[0].theory_model_states["grads"] == 4 * V * H * (t - 1) // t


def test_torch_tp_sequence_parallel_with_tied_weights():
    """SequenceParallel LayerNorms: the block boundaries' all-reduces become all-gathers + reduce-scatters of the
    same bytes, and the LayerNorms' and position embedding's partial gradients are all-reduced at the step. The
    token embedding stays tied to the head (both shard the vocabulary rows)."""
    t = 2
    result = train(t, workload=gpt(tie_weights=True), keep_records=True, sequence_parallel=True)
    _check(result, t)
    got = ops(result.ranks[0])
    bsh = B * S * H
    assert got[("forward", "reduce_scatter", bsh)] == got[("forward", "all_gather", bsh)] == 1 + 2 * L
    assert got[("backward", "reduce_scatter", bsh)] == got[("backward", "all_gather", bsh)] == 1 + 2 * L
    assert got[("step", "all_reduce", H)] == 2 * (2 * L + 1)  # LayerNorm weights and biases
    assert got[("step", "all_reduce", S * H)] == 1  # the position embedding
    assert not any(op == "all_reduce" and phase != "step" for phase, op, _ in got)
    assert result.ranks[0].peak_by_category["activations"] > 0


def test_torch_tp_refuses_bf16_mixed():
    with pytest.raises(zerokit.RankFailed, match="runs in fp32 only"):
        zerokit.train(gpt(), "torch-tp", world_size=2, steps=1, precision="bf16-mixed", reference=False,
                      parallel={"tp": 2})


def test_torch_tp_refuses_heads_not_divisible_by_the_degree():
    with pytest.raises(zerokit.RankFailed, match=r"n_head=2 is not divisible by the tensor-parallel degree tp=4"):
        zerokit.train(gpt(n_head=2), "torch-tp", world_size=4, steps=1, reference=False, parallel={"tp": 4})


def test_torch_tp_runs_on_tp_only():
    with pytest.raises(ValueError, match="dp=2"):
        zerokit.train(gpt(), "torch-tp", world_size=4, steps=1, reference=False, parallel={"dp": 2, "tp": 2})
