"""``zerokit.pipeline``: your own model split into stages and stepped in your own loop, side by side under a DP
wrapper, and a model it cannot read as pieces refused.

The model, the launches and the helpers: ``api_contracts.py`` (one launch per world size carries the checks
of every file here, ``conftest.py``)."""

import pytest

import zerokit

from api_contracts import PIPELINES, _pipelines_side_by_side


@pytest.mark.parametrize("schedule,chunks,split_points", PIPELINES)
def test_pipeline_of_your_own_model_trains_like_one_process(schedule, chunks, split_points, more_on_two_ranks):
    ranks = [r["pipeline"][schedule] for r in more_on_two_ranks]
    for r in ranks:
        assert max(r["diffs"]) < 1e-6, r["diffs"]  # SGD: the same sums, micro-batch by micro-batch
        assert r["losses"] == pytest.approx(r["ref"], abs=1e-6)  # the step's mean loss, on every rank
    assert len(ranks[1]["micro"][0]) == 2 and not ranks[0]["micro"][0]  # losses=: the last stage's micro-batches


def test_pipelines_side_by_side_under_a_dp_wrapper_train_like_one_process():
    for rank in zerokit.launch(_pipelines_side_by_side, 4):
        for wrapper in ("ddp", "sharded optimizer"):
            assert max(rank[wrapper]) < 1e-6, (wrapper, rank[wrapper])  # SGD: the same sums in another order
        assert "DeepSpeed pipelines allow ZeRO stage 0 or 1" in rank["fully_shard"]
        assert "zerokit.DistributedDataParallel(pipe.module)" in rank["torch DDP"]  # torch's is never called


def test_pipeline_refuses_a_model_it_cannot_read_as_pieces(more_on_two_ranks):
    assert "pipeline_pieces()" in more_on_two_ranks[0]["not pieces"]
