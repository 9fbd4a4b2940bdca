"""``zerokit.initialize`` on DeepSpeed's contract: model_parameters with a frozen one, each param group's
hyperparameters at every stage, a batch size that does not divide, DeepSpeed's scheduler block.

The model, the launches and the helpers: ``api_contracts.py`` (one launch per world size carries the checks
of every file here, ``conftest.py``)."""

import pytest
import torch
import torch.nn as nn

from api_contracts import DECAY, STEPS


def test_initialize_keeps_model_parameters_with_a_frozen_one_and_drives_a_scheduler(on_two_ranks):
    for r in on_two_ranks:
        assert max(r["engine diffs"]) < 1e-6, r["engine diffs"]
        assert r["engine lr"] == pytest.approx(0.1 * 0.5 ** STEPS)
    assert on_two_ranks[0]["strict reload"] < 1e-6  # tied names, persistent buffers only: strict=True loads it


def test_a_batch_size_that_does_not_divide_says_so_on_three_ranks(on_three_ranks):
    message = on_three_ranks[0]["batch message"]
    assert "train_batch_size=8 is not divisible by train_micro_batch_size_per_gpu (4) × data-parallel degree (3)" \
        in message and "(0)" not in message


@pytest.mark.parametrize("case", [f"stage {s}, optimizer=" for s in range(4)] + ["stage 3, model_parameters="])
def test_initialize_keeps_each_param_groups_hyperparameters(case, more_on_two_ranks):
    for rank in more_on_two_ranks:
        result = rank["groups"][case]
        # SGD with momentum, each group's own lr and weight decay, a scheduler decaying one group: the same sums in
        # another order (fp32), not a group's values dropped (that differs by lr·decay·|w| ≈ 1e-2 at once)
        assert max(result["diffs"]) <= 1e-6, result["diffs"]
        assert result["groups"] == [{"lr": 0.1, "weight_decay": 0.1, "momentum": 0.9},
                                    {"lr": 0.05 * 0.5 ** STEPS, "weight_decay": 0.0, "momentum": 0.9}]


def test_deepspeeds_scheduler_block_steps_with_the_engine_as_deepspeed_computes_it(more_on_two_ranks):
    decay = DECAY
    assert more_on_two_ranks[0]["WarmupLR"] == pytest.approx([0.0, 0.0, 0.025, 0.05, 0.075, 0.1, 0.1])
    assert more_on_two_ranks[0]["WarmupDecayLR"] == pytest.approx([0.0, 0.0, 0.025, 0.05, 0.075, 0.1, 0.05])
    deepspeed = pytest.importorskip("deepspeed.runtime.lr_schedules")  # DeepSpeed's own, on a plain optimizer
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.5)
    theirs = deepspeed.WarmupDecayLR(opt, **decay["params"])
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(6):
        theirs.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([0.0, 0.0, 0.025, 0.05, 0.075, 0.1, 0.05])
