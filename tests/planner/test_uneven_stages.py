"""Uneven pipeline stages in the planner: Llama 3 405B's 126 layers on pp = 16 as 7, 8 × 14, 7 (Dubey et al. 2024
§3.3.2), given as Megatron's first/last-stage counts or as every stage's count; each stage holds its own layers, the
fullest is reported, the busiest sets the step's pace, and what cannot be split is refused naming the argument."""
import json
import math

import pytest

from zerokit import plan
from zerokit.cli import main
from zerokit.planner import preset

LLAMA3_405B = dict(preset="llama3-405b", gpus=128, parallel="dp=1,tp=8,pp=16", micro_batches=16, strategy="zero1",
                   fused_attention=True)
COUNTS = (7,) + (8,) * 14 + (7,)


def per_layer_on_a_rank(model, t):
    """One layer's elements on one tensor-parallel rank, counted from the model's tensors: split ones ⌈numel/t⌉."""
    return sum(math.ceil(p.numel / t) if p.tp_sharded else p.numel for p in model.tensors if p.layer == 0)


def test_llama3_405b_on_pp16_with_the_first_and_last_stages_one_layer_short():
    with pytest.raises(ValueError, match=r"pp=16 does not divide the 126 layers; give uneven stages: "
                                         r"first_stage_layers/last_stage_layers"):
        plan(**LLAMA3_405B)
    p = plan(**LLAMA3_405B, first_stage_layers=7, last_stage_layers=7)
    assert p.layout.stage_layers == COUNTS and "layers per stage 7, 8 × 14, 7" in p.layout.describe()
    same = plan(**LLAMA3_405B, stage_layers=list(COUNTS))  # every stage's count: the same plan
    assert [s.total for s in same.stages] == [s.total for s in p.stages]
    model, t = preset("llama3-405b"), 8
    layer = per_layer_on_a_rank(model, t)
    psi = [s.psi_rank for s in p.stages]
    assert psi[1:-1] == [8 * layer] * 14  # a middle stage: its 8 layers
    embedding = math.ceil(model.vocab * model.hidden / t)
    assert psi[0] == 7 * layer + embedding  # the token embedding on the first stage
    assert psi[-1] == 7 * layer + model.hidden + embedding  # the final norm and the (untied) head on the last
    assert p.memory.stage in range(1, 15)  # a full middle stage is the fullest
    terms = {term.name for term in p.memory.terms if term.category == "activations"}
    assert "8 layers, checkpointing none" in terms
    tp_layers = next(x for x in p.transfers if x.axis == "tp" and "(layers)" in x.collective)
    assert "8 layers, t = 8" in tp_layers.formula and tp_layers.calls == 4 * 8 * 16
    # the busiest stage sets the pace: the even share stretched by 8 / (126 / 16)
    est = p.step_time
    even = est.hardware_flops_per_step / 128 / (est.peak_flops * est.compute_fraction)
    assert est.compute_seconds == pytest.approx(even * 8 * 16 / 126, rel=1e-12)
    assert "uneven stages (7, 8 × 14, 7 layers): the busiest sets the pace, × 1.016" in est.assumptions[-1]
    assert p.advise().fits or p.advise().does_not_fit  # the advisor ranks layouts on the same stages


def test_one_end_given_the_rest_even_and_even_stages_as_before():
    p = plan(preset="llama-7b", gpus=4, parallel="dp=1,pp=4", first_stage_layers=5)  # 5, then 27 over 3: 9 each
    assert p.layout.stage_layers == (5, 9, 9, 9)
    assert plan(preset="llama-7b", gpus=4, parallel="dp=1,pp=4", last_stage_layers=8).layout.stage_layers is None
    even = plan(preset="llama-7b", gpus=4, parallel="dp=1,pp=4")
    given = plan(preset="llama-7b", gpus=4, parallel="dp=1,pp=4", stage_layers=[8, 8, 8, 8])
    assert [s.total for s in given.stages] == [s.total for s in even.stages] and given.layout.stage_layers is None
    assert plan(preset="llama-7b", gpus=2, parallel="dp=1,pp=2", first_stage_layers=15,
                last_stage_layers=17).layout.stage_layers == (15, 17)


@pytest.mark.parametrize("kwargs,match", [
    (dict(stage_layers=[8, 8, 8]), r"stage_layers=\[8, 8, 8\]: give pp=4 positive layer counts, one per stage, "
                                   r"summing to the model's 32 layers"),
    (dict(stage_layers=[10, 10, 10, 1, 1]), r"give pp=4 positive layer counts"),
    (dict(stage_layers=[16, 16, 0, 0]), r"give pp=4 positive layer counts"),
    (dict(first_stage_layers=6), r"first_stage_layers=6: the other 26 of the 32 layers must split evenly over the "
                                 r"3 other stage\(s\)"),
    (dict(first_stage_layers=0), r"first_stage_layers=0 must be a positive whole number"),
    (dict(first_stage_layers=16, last_stage_layers=16), r"the other 0 of the 32 layers must split evenly over the "
                                                       r"2 other stage\(s\), at least one each"),
    (dict(stage_layers=[5, 9, 9, 9], first_stage_layers=5), r"stage_layers: give every stage's count, or "
                                                            r"first_stage_layers/last_stage_layers, not both"),
    (dict(stage_layers=[5, 9, 9, 9], virtual_stages=2), r"virtual_stages=2: the interleaved schedule is planned "
                                                        r"with even stages only"),
])
def test_stages_that_cannot_be_split_are_refused_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan(preset="llama-7b", gpus=4, parallel="dp=1,pp=4", **kwargs)


def test_a_bare_count_has_no_layers_to_split():
    with pytest.raises(ValueError, match="stage_layers: a bare parameter count has no layers to split"):
        plan(params=7e9, gpus=8, first_stage_layers=3)


def test_cli_takes_uneven_stages_both_ways(capsys):
    base = ["plan", "--preset", "llama3-405b", "--gpus", "128", "--parallel", "dp=1,tp=8,pp=16", "--micro-batches",
            "16", "--strategy", "zero1", "--fused-attention", "--no-advice", "--json"]
    assert main([*base, "--first-stage-layers", "7", "--last-stage-layers", "7"]) == 0
    megatron = json.loads(capsys.readouterr().out)
    assert main([*base, "--stage-layers", "7,8x14,7"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert megatron["layout"]["stage_layers"] == counts["layout"]["stage_layers"] == list(COUNTS)
    assert megatron["stages_total_bytes"] == counts["stages_total_bytes"]
    assert main([*base, "--stage-layers", "7,8x14,eight"]) == 2
    assert "--stage-layers '7,8x14,eight': 'eight' is not a layer count; expected counts per stage, NxK" \
           in capsys.readouterr().err
    assert main([*base, "--first-stage-layers", "6"]) == 0  # 120 over the 15 stages after it: 8 each
    assert json.loads(capsys.readouterr().out)["layout"]["stage_layers"] == [6] + [8] * 15
    assert main([*base, "--first-stage-layers", "5"]) == 2
    assert "--first-stage-layers/--last-stage-layers: first_stage_layers=5: the other 121 of the 126 layers" \
           in capsys.readouterr().err
    assert main([*base[:-1], "--stage-layers", "7,8x14,7"]) == 0
    assert "layers per stage 7, 8 × 14, 7" in " ".join(capsys.readouterr().out.split())
