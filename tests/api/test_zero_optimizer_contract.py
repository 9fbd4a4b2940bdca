"""``zerokit.ShardedOptimizer`` on torch's contract: frozen parameters, param groups, a scheduler, its state dict,
and under a DDP wrapper (zerokit's or torch's) stepping the wrapper's average without reducing again.

The model, the launches and the helpers: ``api_contracts.py`` (one launch per world size carries the checks
of every file here, ``conftest.py``)."""

import pytest

from api_contracts import STEPS


def test_sharded_optimizer_takes_frozen_parameters_groups_and_a_scheduler_like_torch(on_two_ranks):
    for r in on_two_ranks:
        assert r["is an Optimizer"] and r["frozen equal on every rank"]
        assert max(r["sharded diffs"]) < 1e-6, r["sharded diffs"]  # SGD: the same sums in another order
        assert r["lrs"] == [0.1 * 0.5 ** STEPS] * 2


def test_sharded_optimizer_state_dict_round_trips_and_checkpoint_save_says_how(on_two_ranks):
    assert on_two_ranks[0]["state round trip"]
    assert "consolidate_state_dict" in on_two_ranks[0]["checkpoint.save(sharded optimizer)"]


@pytest.mark.parametrize("wrapper", ["zerokit", "torch"])
def test_sharded_optimizer_under_ddp_steps_the_wrappers_average_without_reducing_again(on_two_ranks, wrapper):
    for r in on_two_ranks:
        diffs, ops = r[f"under {wrapper} DDP"]
        assert max(diffs) < 1e-6, diffs
        assert "reduce_scatter" not in ops and "all_gather" in ops, ops  # the wrapper's reduction, ZeRO-1's gather
