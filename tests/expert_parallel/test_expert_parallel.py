"""Expert parallelism: the MoE layer's routing, capacity and load-balancing loss in one process; its experts spread
over ep ranks (dispatch and combine by all-to-all) against the same layer whole; the tiny MoE GPT in zerokit.train
under ddp at dp=2×ep=2 and dp=4×ep=2, and with tensor-parallel experts at dp=2×ep=2×tp=2 under ddp and zero3, against
one process, every axis's bytes against its formula."""
import pytest
import torch

import zerokit
from zerokit import theory
from zerokit.expert_parallel import MoEMLP
from zerokit.runtime import comm

D, E = 8, 4


def test_routing_capacity_and_the_load_balancing_loss():
    torch.manual_seed(0)
    x = torch.randn(3, 10, D)
    dropless = MoEMLP(D, E, top_k=2)
    dropless(x)
    assert int(dropless.tokens_per_expert.sum()) == 3 * 10 * 2 and dropless.dropped == 0  # every slot served
    capped = MoEMLP(D, E, top_k=2, capacity_factor=0.5)
    capped.load_state_dict(dropless.state_dict())
    capped(x)
    cap = -(-int(0.5 * 10 * 2) // E)  # ⌈c·T·k/E⌉ slots per expert per sequence
    assert capped.dropped > 0 and int(capped.tokens_per_expert.sum()) + capped.dropped == 60
    assert int(capped.tokens_per_expert.max()) <= 3 * cap
    # Switch's loss is E·Σ f_e·P_e: 1 when routing is uniform; a router that sends everything to one expert with
    # probability ~1 scores ~E
    skewed = MoEMLP(D, E, top_k=1)
    with torch.no_grad():
        skewed.router.weight.zero_()
        skewed.router.weight[0].fill_(50.0)
    skewed(torch.ones(2, 5, D))
    assert float(skewed.aux) == pytest.approx(E, rel=1e-3)
    with pytest.raises(ValueError, match="top_k=5 must be between 1 and n_experts=4"):
        MoEMLP(D, E, top_k=5)


def _against_the_whole_layer(split, x):
    """The layer with ``split`` applied, and the same layer whole, each run forward and backward on ``x``; the
    ledger holds the split layer's collectives."""
    torch.manual_seed(0)
    whole = MoEMLP(D, E, top_k=2)
    torch.manual_seed(0)
    layer = MoEMLP(D, E, top_k=2)
    split(layer)
    ledger = comm.ledger()
    ledger.reset()
    ours = layer(x)
    ours.sum().backward()
    theirs = whole(x)
    theirs.sum().backward()
    return whole, layer, ours, theirs, ledger


def _sharded_layer(ctx):
    g = torch.Generator().manual_seed(1 + ctx.rank)  # each rank its own tokens
    whole, layer, ours, theirs, ledger = _against_the_whole_layer(lambda m: m.shard(None),
                                                                  torch.randn(2, 6, D, generator=g))
    dispatch = [r.payload_bytes for r in ledger.records if r.tag == "moe dispatch"]
    return {"out": float((ours - theirs).abs().max()), "router": float((layer.router.weight.grad
                                                                        - whole.router.weight.grad).abs().max()),
            "experts": sorted(layer.experts), "dispatch": dispatch}


def test_experts_on_two_ranks_compute_what_the_whole_layer_does():
    for rank, got in enumerate(zerokit.launch(_sharded_layer, 2)):
        assert got["experts"] == [str(e) for e in range(rank * 2, rank * 2 + 2)]  # E/ep experts each
        assert got["out"] < 1e-6 and got["router"] < 1e-6  # the same sums: its own experts' rows come back
        assert got["dispatch"] == [theory.moe_dispatch_payload(2 * 6, 2, D, 4)]  # T·k·d·b, dropless


def _moe_gpt():
    return zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=8, n_experts=4, top_k=2)


@pytest.mark.parametrize("parallel,micro_batches", [({"dp": 2, "ep": 2}, 2), ({"dp": 4, "ep": 2}, 1)])
def test_the_moe_gpt_under_expert_parallelism_trains_like_one_process(parallel, micro_batches):
    """With 2 accumulated micro-batches the load-balancing loss is averaged over them as the loss is."""
    from zerokit.cli import compare

    report = compare(_moe_gpt(), parallel["dp"], ["single", "ddp"], steps=3, optimizer="sgd", lr=0.1,
                     parallel=parallel, micro_batches=micro_batches)
    result = report["ddp"]
    assert result.param_diff["max_abs"] <= 1e-5, result.param_diff  # fp32: the same sums in another order
    assert result.losses == pytest.approx(report["single"].losses, abs=1e-5)
    model = _moe_gpt().build_model()
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    dense = sum(p.numel() for p in model.parameters()) - experts
    for rank in result.ranks:
        # each rank holds the dense weights and 1/ep of the experts (measured by the memory ledger)
        assert rank.model_state_bytes["params"] == 4 * (dense + experts // parallel["ep"])
        measured = {axis: row["ring_cost_bytes"] for axis, row in rank.comm_bytes_by_axis.items()}
        # dense gradients over dp, the experts' over edp (the ranks holding the same ones), tokens on ep
        assert measured == pytest.approx(rank.theory_comm_bytes_by_axis, abs=0.5)
        assert set(measured) == ({"dp", "ep", "edp"} if parallel["dp"] > parallel["ep"] else {"dp", "ep"})
        # the routing each rank measured in its last forward: its 8/dp/A sequences × 16 tokens × top-2 slots, dropless
        per_layer = rank.routing["tokens_per_expert"]
        rows = 8 // parallel["dp"] // micro_batches
        assert len(per_layer) == 2 and all(sum(layer) == rows * 16 * 2 for layer in per_layer)
        assert rank.routing["dropped"] == [0, 0] and rank.coords["ep"] == rank.rank % parallel["ep"]
    assert "by axis, ddp rank 0, B/step measured / theory: dp " in report.table()  # as `zerokit compare` prints


def _split_layer(ctx):
    x = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(1)).requires_grad_()  # shared by the tp ranks
    whole, layer, ours, theirs, ledger = _against_the_whole_layer(lambda m: m.split_experts(None), x)  # all on tp
    ring, calls = sum(r.ring_cost_bytes for r in ledger.records), len(ledger.records)
    from zerokit.tensor_parallel import allreduce_sequence_parallel_gradients, full_gradients

    summed = allreduce_sequence_parallel_gradients(layer)  # the output biases' gradients, on tp rank 0 until here
    whole_grads = full_gradients(layer)
    return {"out": float((ours - theirs).abs().max()), "summed": summed,
            "grads": max(float((whole_grads[n] - p.grad).abs().max()) for n, p in whole.named_parameters()),
            "fc": tuple(layer.experts["0"].fc.weight.shape), "ring": ring, "calls": calls}


def test_experts_split_over_tp_compute_what_the_whole_layer_does():
    """Each expert's fc by columns and proj by rows over tp = 2, the reductions once per layer: f on the tokens and
    on the gates, g on the output (not one pair per expert call)."""
    for got in zerokit.launch(_split_layer, 2):
        assert got["out"] < 1e-6 and got["grads"] < 1e-6 and got["fc"] == (4 * D // 2, D)
        assert got["summed"] == E * D  # every expert's output bias
        assert got["calls"] == 3  # f's backward on the tokens and on the gates, g's forward
        assert got["ring"] == theory.tp_comm_bytes_per_step(2 * 6, 2 * D, 2, 4, loss_reductions=2)


@pytest.mark.parametrize("parallel,strategies", [({"dp": 2, "ep": 2, "tp": 2}, ["ddp", "zero3"]),
                                                 ({"tp": 2}, ["ddp"])])
def test_experts_split_by_tensor_parallelism_train_like_one_process(parallel, strategies):
    """dp=2 × tp=2 with ep=2 carved from dp (4 ranks), and tp=2 alone: attention split by heads, each expert split
    as the dense MLP is (column then row), the router whole on every tp rank; under ddp and zero3."""
    from zerokit.cli import compare
    from zerokit.tensor_parallel import plan_layout, tiny_gpt_plan

    ep = parallel.get("ep", 1)
    world = parallel.get("dp", 1) * parallel["tp"]
    report = compare(_moe_gpt(), world, ["single", *strategies], steps=3, optimizer="sgd", lr=0.1, parallel=parallel)
    model = _moe_gpt().build_model()
    layout = plan_layout(model, tiny_gpt_plan(experts=True))
    # per rank: tp-sharded tensors ÷ tp, experts ÷ ep as well (an expert's output bias stays whole over tp)
    per_rank = sum(p.numel() // (2 if layout[n] is not None else 1) // (ep if ".experts." in n else 1)
                   for n, p in model.named_parameters())
    for name in strategies:
        result = report[name]
        assert result.param_diff["max_abs"] <= 1e-5, (name, result.param_diff)
        assert result.losses == pytest.approx(report["single"].losses, abs=1e-5)
        for rank in result.ranks:
            measured = {axis: row["ring_cost_bytes"] for axis, row in rank.comm_bytes_by_axis.items()}
            # tp: the plan's collectives on every token, the experts' f and g once per layer, the gates' f
            assert set(measured) == ({"dp", "ep", "tp"} if ep > 1 else {"dp", "tp"})
            assert measured == pytest.approx(rank.theory_comm_bytes_by_axis, abs=0.5)
            if name == "ddp":
                assert rank.model_state_bytes["params"] == 4 * per_rank
        # the two tp ranks of a dp rank route the same tokens the same way
        by_dp = {}
        for rank in result.ranks:
            by_dp.setdefault(rank.coords["dp"], []).append(rank.routing["tokens_per_expert"])
        assert all(a == b for a, b in by_dp.values())


def test_expert_parallel_settings_are_checked_before_any_process_starts():
    with pytest.raises(ValueError, match="ep=2 must divide dp=3"):
        zerokit.train(_moe_gpt(), "ddp", world_size=3, steps=1, parallel={"dp": 3, "ep": 2})
    with pytest.raises(ValueError, match="no mixture-of-experts layer"):
        zerokit.train(zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=8), "ddp",
                      world_size=2, steps=1, parallel={"dp": 2, "ep": 2})
    with pytest.raises(ValueError, match="sequence_parallel=True with a mixture of experts"):
        zerokit.train(_moe_gpt(), "ddp", world_size=4, steps=1, parallel={"dp": 2, "ep": 2, "tp": 2},
                      sequence_parallel=True)
    with pytest.raises(ValueError, match="composes with dp and tp only so far; use cp=1, pp=1"):
        zerokit.train(_moe_gpt(), "ddp", world_size=4, steps=1, parallel={"dp": 2, "ep": 2, "pp": 2})
    with pytest.raises(ValueError, match="expert parallelism, which strategy 'zero2-naive' does not implement"):
        zerokit.train(_moe_gpt(), "zero2-naive", world_size=2, steps=1, parallel={"dp": 2, "ep": 2})
