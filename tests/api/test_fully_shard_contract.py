"""``zerokit.fully_shard``: FSDP2's convention with your own optimizer, its mixed precision, and its
``MixedPrecisionPolicy`` read or refused before any work.

The model, the launches and the helpers: ``api_contracts.py`` (one launch per world size carries the checks
of every file here, ``conftest.py``)."""

import pytest
import torch
import torch.nn as nn

import zerokit

from api_contracts import ADAM_STEP, FULLY_SHARD, MIXED, STEPS


@pytest.mark.parametrize("case", list(FULLY_SHARD))
def test_fully_shard_trains_with_your_optimizer_like_one_process(case, on_three_ranks, more_on_two_ranks):
    n, optimizer = FULLY_SHARD[case][0], FULLY_SHARD[case][3]
    ranks = [r["fully_shard"][case] for r in (on_three_ranks if n == 3 else more_on_two_ranks)]
    diffs = ranks[0]["diffs"]
    # SGD: the same sums in another order; AdamW: its largest step, both ways, per step (Kingma & Ba)
    bound = 1e-6 if optimizer == "sgd" else 2 * ADAM_STEP * 1e-3 * STEPS
    assert max(diffs) <= bound, diffs
    whole = ranks[0]["whole"]
    if len(FULLY_SHARD[case]) == 5:  # without persistent parameters the shards partition the trainable ones
        assert sum(r["held"] for r in ranks) == whole
        assert all(r["held"] <= -(-whole // n) + 2 * n for r in ranks)  # about Ψ/N each (padding per unit)
    assert all(r["names"] for r in ranks)  # the parameters keep their names: groups by name work
    assert "full_state_dict()" in ranks[0]["checkpoint"]  # zerokit.checkpoint says what to save instead


@pytest.mark.parametrize("case", list(MIXED))
def test_fully_shard_mixed_precision_is_fsdp2s(case, on_three_ranks, more_on_two_ranks):
    n, dtype = MIXED[case][0], MIXED[case][3]
    ranks = [r["mixed"][case] for r in (on_three_ranks if n == 3 else more_on_two_ranks)]
    for r in ranks:  # 16-bit outputs; the parameters your optimizer steps and their gradients fp32
        assert r["zerokit"]["dtypes"] == r["torch"]["dtypes"] == sorted({str(dtype), "torch.float32 torch.float32"})
    ours, theirs = ranks[0]["zerokit"]["state"], ranks[0]["torch"]["state"]
    assert sorted(ours) == sorted(theirs) and all(ours[k].dtype == torch.float32 for k in ours)
    # the first step: both cast the same fp32 weights to 16 bits, so each rank's local gradients start equal; they
    # may then be summed in another order in 16 bits (a tied tensor's two uses, the ranks' contributions), and a
    # 16-bit sum rounds by up to one unit of its summands — which SGD's first step (lr·gradient) scales: per tensor,
    # within a few 16-bit units of its largest first update; plus a few fp32 units of the weight (the optimizer's
    # own rounding on another layout: FSDP2 shards rows, zerokit flat units)
    unit = torch.finfo(dtype).eps  # one 16-bit unit, relative
    start = ranks[0]["start"]
    assert all(sorted(r["start"]) == sorted(start) and all(torch.equal(r["start"][k], start[k]) for k in start)
               for r in ranks)
    for k in ours:
        largest = float((theirs[k].cpu() - start[k]).abs().max())
        assert ((ours[k] - theirs[k].cpu()).abs() <= 4 * unit * largest + 2 ** -20 * theirs[k].abs().cpu()).all(), k
    # later steps: masters a few fp32 units apart can round to neighbouring 16-bit weights; the losses, computed
    # from 16-bit logits, agree within one 16-bit unit of their size
    for r in ranks:
        assert all(abs(a - b) <= unit * abs(b) for a, b in zip(r["zerokit"]["losses"], r["torch"]["losses"])), r


def test_fully_shard_reads_fsdp2s_mixed_precision_policy_or_refuses_it_before_any_work():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    for policy, says in ((MixedPrecisionPolicy(param_dtype=torch.float64), "param_dtype=torch.float64"),
                         (MixedPrecisionPolicy(reduce_dtype=torch.bfloat16), "set param_dtype too"),
                         (object(), "MixedPrecisionPolicy")):
        with pytest.raises((ValueError, TypeError), match=says.replace("(", r"\(")):
            zerokit.fully_shard(nn.Linear(2, 2), mp_policy=policy)  # refused before it asks for a rank
