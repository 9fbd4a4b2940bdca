"""Hang diagnosis (issue 16): RankTimeout says per rank the collective it is waiting in, grouped by call;
the heartbeat catches a stall before the timeout; debug mode fails fast on mismatched collectives."""
import pickle
import time

import pytest
import torch

from zerokit import RankFailed, RankTimeout, comm, launch
from zerokit.runtime import hang

pytestmark = pytest.mark.serial  # wall-clock bounds (or machine-wide counts): run alone, see pyproject.toml


def _only_rank_2_gathers(ctx):
    with comm.phase("backward"):
        for _ in range(3):
            comm.reduce_scatter(torch.zeros(1), torch.ones(ctx.world_size))
    if ctx.rank == 2:
        with comm.phase("forward"):
            comm.all_gather(torch.zeros(4 * ctx.world_size), torch.ones(4))  # the others never call it
    else:
        with comm.phase("backward"):
            comm.reduce_scatter(torch.zeros(2), torch.ones(2 * ctx.world_size))


def test_a_collective_on_some_ranks_names_ranks_and_ops_within_the_timeout(no_children_left):
    start = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        launch(_only_rank_2_gathers, 4, timeout_s=4)  # the ranks reach the hang in < 1 s
    took = time.monotonic() - start
    e = info.value
    assert took < 4 + 5, took
    assert e.ranks == [0, 1, 2, 3] and e.stalled_s is None
    message = str(e)
    assert "rank 2 is in all_gather #4 of forward (16 float32 on dp, step 0)" in message, message
    assert "ranks 0, 1, 3 are in reduce_scatter #4 of backward (8 float32 on dp, step 0)" in message, message
    assert message.index("rank 2 is") < message.index("ranks 0, 1, 3 are")  # the odd one out first
    assert e.last_collectives[2].startswith("all_gather #4 of forward")
    again = pickle.loads(pickle.dumps(e))
    assert (again.where, again.ranks, again.stalled_s) == (e.where, e.ranks, None)
    no_children_left()


def _stall_after_a_few(ctx):
    for _ in range(5):
        comm.all_reduce(torch.ones(3))
    if ctx.rank == 0:
        comm.all_reduce(torch.ones(3))  # rank 1 never joins it
    else:
        time.sleep(120)


def test_the_heartbeat_catches_a_stall_well_before_the_timeout(no_children_left):
    start = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        launch(_stall_after_a_few, 2, timeout_s=120, heartbeat_s=2)
    took = time.monotonic() - start
    e = info.value
    assert took < 20, took
    assert e.stalled_s is not None and 2 <= e.stalled_s < 5
    assert "stalled" in str(e) and "heartbeat_s" in str(e)
    assert "rank 0 is in all_reduce #6 of setup" in e.where
    assert "rank 1 is not in a collective (last left all_reduce #5 of setup" in e.where
    no_children_left()


def _steady(ctx):
    for _ in range(8):
        comm.all_reduce(torch.ones(2))
        time.sleep(0.2)
    return ctx.rank


def test_the_heartbeat_lets_a_run_that_progresses_finish():
    assert launch(_steady, 2, timeout_s=60, heartbeat_s=1.5) == [0, 1]


def _async_wait(ctx):
    work = comm.all_reduce(torch.ones(2), async_op=True)
    if ctx.rank == 0:
        work.wait()
        comm.broadcast(torch.ones(2), src=0)  # rank 1 never gets there
    else:
        work.wait()
        time.sleep(60)


def test_an_async_collective_is_left_once_waited_for():
    with pytest.raises(RankTimeout) as info:
        launch(_async_wait, 2, timeout_s=3)  # the ranks reach the hang in < 1 s
    where = info.value.where
    assert "rank 0 is in broadcast #2 of setup" in where, where
    assert "rank 1 is not in a collective (last left all_reduce #1 of setup" in where, where


def _mismatched_shapes(ctx):
    comm.all_reduce(torch.ones(2))
    with comm.phase("backward"):
        n = 6 if ctx.rank == 1 else 4
        comm.reduce_scatter(torch.zeros(n // 2), torch.ones(n))


def test_debug_mode_fails_fast_on_mismatched_shapes_naming_both_sides(no_children_left):
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        launch(_mismatched_shapes, 2, timeout_s=60, check_collectives=True)
    assert time.monotonic() - start < 20
    text = info.value.traceback
    assert "CollectiveMismatch" in text
    assert "rank 0 is in reduce_scatter of 4 float32 (#2 of backward)" in text, text
    assert "rank 1 is in reduce_scatter of 6 float32 (#2 of backward)" in text, text
    no_children_left()


def _mismatched_ops(ctx):
    if ctx.rank == 0:
        comm.all_reduce(torch.ones(3, dtype=torch.float64))
    else:
        comm.all_gather(torch.zeros(6), torch.ones(3))


def test_debug_mode_from_the_environment_names_op_and_dtype(monkeypatch):
    monkeypatch.setenv("ZEROKIT_DEBUG_COLLECTIVES", "1")
    with pytest.raises(RankFailed) as info:
        launch(_mismatched_ops, 2, timeout_s=60)
    text = info.value.traceback
    assert "rank 0 is in all_reduce of 3 float64" in text and "rank 1 is in all_gather of 6 float32" in text, text


def _matching(ctx):
    out = torch.zeros(4)
    comm.all_gather(out, torch.full((2,), float(ctx.rank)))
    return out.tolist()


def test_debug_mode_passes_matching_collectives_and_leaves_the_ledger_alone():
    def run(ctx):
        values = _matching(ctx)
        return values, [r.op for r in comm.ledger().records]
    results = launch(run, 2, timeout_s=60, check_collectives=True)
    assert results[0] == ([0.0, 0.0, 1.0, 1.0], ["all_gather"])


def test_summarise_groups_ranks_by_call():
    statuses = {r: hang.decode(hang.encode("in", 9, "reduce_scatter", "backward", "")) for r in (0, 1, 3)}
    statuses[2] = hang.decode(hang.encode("in", 14, "all_gather", "forward", ""))
    assert hang.summarise(statuses) == ("rank 2 is in all_gather #14 of forward; "
                                        "ranks 0, 1, 3 are in reduce_scatter #9 of backward")
    assert hang.decode("free text").where() == "free text"


def test_debug_mode_leaves_a_real_strategy_correct(monkeypatch):
    """ZeRO-3 (all-gathers and reduce-scatters in forward, backward and step) under the check: same losses."""
    import zerokit

    work = zerokit.mlp((4, 8, 2), batch_size=4)
    plain = zerokit.train(work, "zero3", world_size=2, steps=2, reference=False, timeout_s=120)
    monkeypatch.setenv("ZEROKIT_DEBUG_COLLECTIVES", "1")
    checked = zerokit.train(work, "zero3", world_size=2, steps=2, reference=False, timeout_s=120)
    assert checked.results[0].losses == plain.results[0].losses
