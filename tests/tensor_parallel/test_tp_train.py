"""Tensor parallelism through ``zerokit.train``: alone (``tp``), and under ddp / ZeRO on ``dp`` (2-D).

Parity with the single-process reference after 10 SGD steps (a wrong shard or a missing
gradient share would move parameters by ~lr = 0.1; AdamW would turn summation-order noise
into ~lr steps, FACTS §10), model states and traffic per axis equal to zerokit.theory, and
torch's own tensor parallelism side by side.
"""
import pytest

import zerokit
from zerokit import theory
from zerokit.cli import compare
from zerokit.tensor_parallel import parameter_counts, tiny_gpt_plan

SGD = dict(optimizer="sgd", lr=0.1)


def gpt(**kw):
    args = dict(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=4, batch_size=8)
    return zerokit.tiny_gpt(**{**args, **kw})


def check_ledgers(result):
    for rank in result.ranks:
        assert rank.model_state_bytes == {k: rank.theory_model_states[k] for k in ("params", "grads", "optimizer")}
        for axis, theory_bytes in rank.theory_comm_bytes_by_axis.items():
            measured = rank.comm_bytes_by_axis.get(axis, {"ring_cost_bytes": 0})["ring_cost_bytes"]
            assert measured == pytest.approx(theory_bytes, rel=1e-12, abs=1e-6), (result.strategy, axis)


@pytest.mark.parametrize("t,sp", [(2, False), (2, True), (4, False), (4, True)])
def test_pure_tensor_parallelism_matches_the_reference(t, sp):
    report = compare(gpt(tie_weights=sp), t, ["single", "tp"], steps=10, parallel={"dp": 1, "tp": t},
                     sequence_parallel=sp, **SGD)
    result = report["tp"]
    assert result.param_diff["max_abs"] <= 1e-6
    assert [r.coords["tp"] for r in result.ranks] == list(range(t))
    check_ledgers(result)
    rank = result.ranks[0]
    assert set(rank.comm_bytes_by_axis) == {"tp"}
    # Megatron §3: per layer per micro-batch 8·b·s·h·(t−1)/t elements, plus the embedding's and head's pair and
    # the vocabulary-parallel loss's three all-reduces of b·s values
    b, s, h, layers = 8, 16, 32, 2
    megatron = theory.tp_elements_sent_per_layer(b, s, h, t) * 4 * layers
    assert rank.theory_comm_bytes_by_axis["tp"] >= megatron
    ops = {row["op"] for row in rank.comm_summary if row["axis"] == "tp" and row["phase"] != "step"}
    assert ops == ({"all_gather", "reduce_scatter", "all_reduce"} if sp else {"all_reduce"})


@pytest.mark.parametrize("sp", [False, True])
def test_two_dimensional_dp_by_tp_under_ddp_and_zero(sp):
    names = ["ddp", "zero1", "zero2", "zero3"]
    report = compare(gpt(), 4, ["single", *names], steps=10, parallel={"dp": 2, "tp": 2}, sequence_parallel=sp,
                     **SGD)
    model = gpt().build_model()
    counts = parameter_counts(model, 2, tiny_gpt_plan(sp))
    for name in names:
        result = report[name]
        assert result.param_diff["max_abs"] <= 1e-6, name
        assert [(r.coords["dp"], r.coords["tp"]) for r in result.ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        check_ledgers(result)
        for rank in result.ranks:
            assert set(rank.comm_bytes_by_axis) == {"dp", "tp"}
    # dp carries the data-parallel formula on the tensor-parallel shard (sharded/t + replicated), not on Ψ
    ddp = report["ddp"].ranks[0]
    assert counts["per_rank"] < sum(p.numel() for p in model.parameters())
    assert ddp.theory_comm_bytes_by_axis["dp"] == theory.comm_bytes_per_step(0, counts["per_rank"], 2, 4)
    assert ddp.comm_bytes_by_axis["dp"]["ring_cost_bytes"] == ddp.theory_comm_bytes_by_axis["dp"]

def test_model_states_are_the_shard_over_t_plus_the_replicated_rest():
    work = gpt()
    t = 4
    report = zerokit.train(work, "tp", world_size=t, steps=1, parallel={"dp": 1, "tp": t})
    counts = parameter_counts(work.build_model(), t, tiny_gpt_plan())
    assert counts["sharded"] % t == 0 and counts["replicated"] > 0
    for rank in report.result.ranks:
        expected = theory.tp_model_state_bytes(counts["sharded"], counts["replicated"], t, "fp32", "adamw",
                                               optimizer_tensors=len(list(work.build_model().parameters())))
        assert rank.model_state_bytes == {"params": expected.params, "grads": expected.grads,
                                          "optimizer": expected.optimizer}


def test_bf16_mixed_tensor_parallelism_lands_within_bf16_rounding():
    report = compare(gpt(), 2, ["single", "tp"], steps=3, parallel={"dp": 1, "tp": 2}, precision="bf16-mixed",
                     **SGD)
    assert report["tp"].param_diff["max_rel"] <= 1e-2
    check_ledgers(report["tp"])


def test_torch_tensor_parallelism_side_by_side():
    report = compare(gpt(), 2, ["single", "tp", "torch-tp"], steps=3, parallel={"dp": 1, "tp": 2}, **SGD)
    for name in ("tp", "torch-tp"):
        assert report[name].param_diff["max_abs"] <= 1e-6, name
    ours, torch_tp = report["tp"].ranks[0], report["torch-tp"].ranks[0]
    # torch's head gathers the logits whole (b·s·V); zerokit's vocabulary-parallel loss never does
    assert ours.comm_bytes_by_axis["tp"]["payload_bytes"] < torch_tp.comm_bytes_by_axis["tp"]["payload_bytes"]


@pytest.mark.parametrize("kw,parallel,sp,match", [
    (dict(d_model=30, n_head=3), {"tp": 2}, False, "heads=3, which tp=2 does not divide"),
    (dict(d_model=30, n_head=2), {"tp": 4}, False, "does not divide"),
    (dict(n_head=2), {"tp": 4}, False, "head"),
    (dict(vocab=66), {"tp": 4}, False, "does not divide"),
    (dict(seq_len=15), {"tp": 2}, True, "seq"),
    (dict(), {"tp": 1, "dp": 2}, True, "sequence_parallel=True needs tensor parallelism"),
])
def test_bad_tensor_parallel_input_fails_before_any_process(kw, parallel, sp, match):
    with pytest.raises(ValueError, match=match):
        zerokit.train(gpt(**kw), "tp" if parallel.get("dp", 1) == 1 else "ddp", world_size=2 if sp and
                      parallel.get("tp", 1) == 1 else max(parallel.values()), parallel=parallel, sequence_parallel=sp)


def frozen_position_gpt():
    """A tied GPT whose position embedding is frozen, with every size divisible by an odd degree (3)."""
    base = gpt(vocab=66, d_model=24, n_head=3, tie_weights=True)

    def model():
        m = base.model_fn()
        m.pos.weight.requires_grad_(False)
        return m

    return zerokit.Workload("tied-gpt-frozen-positions", model, base.batch_fn, base.loss_fn,
                            tensor_parallel_plan=base.tensor_parallel_plan)


def test_odd_degree_with_tied_weights_and_a_frozen_parameter():
    work = frozen_position_gpt()
    report = compare(work, 3, ["single", "tp", "torch-tp"], steps=5, parallel={"dp": 1, "tp": 3}, **SGD)
    frozen = work.build_model().pos.weight
    for name in ("tp", "torch-tp"):
        result = report[name]
        assert result.param_diff["max_abs"] <= 1e-6, name
        assert [r.coords["tp"] for r in result.ranks] == [0, 1, 2]
        assert (result.ranks[0].params["pos.weight"] == frozen).all(), name  # never stepped
    check_ledgers(report["tp"])
