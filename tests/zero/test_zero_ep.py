"""ZeRO composed with expert parallelism: dense parameters sharded over dp, the experts' over the ranks holding the same
experts (edp = dp/ep), each kind in flat units of its own. zero1, zero2 and zero3 on the tiny MoE GPT at dp=4×ep=2
(and zero3 at dp=2×ep=2, where edp has one rank) against one process; on every rank the memory ledger equals the
formula to the byte, and so do the bytes on each axis — the units' sizes taken from the model here, not from the
strategy.

Parity uses SGD (AdamW turns ~1e-10 summation noise into ~lr steps, FACTS §10)."""
import pytest

import zerokit
from zerokit import theory
from zerokit.cli import compare
from zerokit.zero.units import form_units

D, E, EP = 32, 4, 2
STATES = ("params", "grads", "optimizer")


def _moe_gpt():
    return zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=D, n_layer=2, n_head=2, batch_size=8, n_experts=E, top_k=2)


def _units(stage: int):
    """(dense unit sizes, one rank's expert unit sizes) as the strategies lay them out by default: one unit of each
    kind at stages 1–2 (reduce_bucket_size holds the model); a unit per block and the root's at stage 3, each block's
    experts in a unit of their own. A rank holds E/ep of every layer's experts."""
    model = _moe_gpt().build_model()
    expert = {p for n, p in model.named_parameters() if ".experts." in n}
    if stage < 3:
        groups = [list(model.parameters())]
    else:
        groups = [spec.params for spec in form_units(model, "block", set())]
    dense = [sum(p.numel() for p in ps if p not in expert) for ps in groups]
    experts = [sum(p.numel() for p in ps if p in expert) // EP for ps in groups]
    return [u for u in dense if u], [u for u in experts if u]


@pytest.mark.parametrize("dp, strategies", [(4, ["zero1", "zero2", "zero3"]), (2, ["zero3"])])
def test_zero_with_expert_parallelism_trains_like_one_process_with_its_memory_and_bytes_per_axis(dp, strategies):
    report = compare(_moe_gpt(), dp, ["single", *strategies], steps=3, optimizer="sgd", lr=0.1,
                     parallel={"dp": dp, "ep": EP})
    edp = dp // EP
    for name in strategies:
        result = report[name]
        stage = int(name[-1])
        assert result.param_diff["max_abs"] <= 1e-5, (name, result.param_diff)  # fp32: the same sums, reordered
        assert result.losses == pytest.approx(report["single"].losses, abs=1e-5), name
        dense, experts = _units(stage)
        states = theory.expert_zero_model_state_bytes(stage, dense, dp, experts, edp, "fp32", "sgd").as_dict()
        comm = theory.expert_zero_comm_bytes(stage, dense, dp, experts, edp, 4)
        for rank in result.ranks:
            # the ledger's bytes = the formula: dense units padded to dp and sharded over it, experts over edp
            assert rank.model_state_bytes == {k: states[k] for k in STATES}, (name, rank.rank)
            assert rank.model_state_bytes == {k: rank.theory_model_states[k] for k in STATES}, (name, rank.rank)
            measured = {axis: row["ring_cost_bytes"] for axis, row in rank.comm_bytes_by_axis.items()}
            assert measured == pytest.approx(rank.theory_comm_bytes_by_axis, abs=0.5), (name, rank.rank)
            assert rank.theory_comm_bytes_by_axis["dp"] == comm["dp"]
            # edp carries the expert units' collectives; with one rank per edp group nothing moves there
            assert set(measured) == ({"dp", "ep", "edp"} if edp > 1 else {"dp", "ep"}), name
            if edp > 1:
                assert rank.theory_comm_bytes_by_axis["edp"] == comm["edp"]
        if stage == 3:  # every element of the model once over dp: 4·(Ψ_d + Ψ_e)/dp, up to padding
            model = _moe_gpt().build_model()
            psi = sum(p.numel() for p in model.parameters())
            assert abs(states["params"] - 4 * psi / dp) <= 4 * len(dense + experts)


def test_what_zero_does_not_compose_with_experts_is_refused_clearly():
    with pytest.raises(ValueError, match="expert parallelism, which strategy 'zero2-naive' does not implement"):
        zerokit.train(_moe_gpt(), "zero2-naive", world_size=2, steps=1, parallel={"dp": 2, "ep": 2})
    with pytest.raises(zerokit.RankFailed, match="offload is not implemented with expert parallelism"):
        zerokit.train(_moe_gpt(), "zero2", world_size=2, steps=1, parallel={"dp": 2, "ep": 2}, offload="optimizer",
                      reference=False)
