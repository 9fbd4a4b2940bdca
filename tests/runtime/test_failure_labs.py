"""Failure labs (issue 16): the diagnoses lesson 14 reads — check_replicas, where every rank was when a launch
failed (a rank that returned while a peer waited), and course.FailurePanel running a lab from its dropdown."""
import contextlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zerokit
from zerokit import comm, course
from zerokit.runtime.replicas import ReplicasDiverged, check_replicas

torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # the forked ranks inherit the optimizer's imports


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))


def _replicas(ctx, seeds):
    model = _model(seeds[ctx.rank])
    try:
        check_replicas(model, step=7)
    except ReplicasDiverged as e:
        return e.rank, e.parameter, str(e)
    return None


def test_check_replicas_passes_equal_models_and_names_the_rank_and_parameter_that_differ():
    assert zerokit.launch(_replicas, 3, (0, 0, 0), timeout_s=30) == [None, None, None]
    results = zerokit.launch(_replicas, 3, (0, 0, 5), timeout_s=30)
    assert all(r is not None and r[:2] == (2, "0.weight") for r in results), results
    assert "at step 7" in results[0][2] and "ranks differing from rank 0: [2]" in results[0][2]
    with pytest.raises(TypeError, match="needs an nn.Module"):
        check_replicas("model")


def _forgets_no_sync(ctx):
    model = zerokit.DistributedDataParallel(_model(0))
    for m in range(4):
        last = m % 2 == 1
        with contextlib.nullcontext() if last or ctx.rank == 1 else model.no_sync():
            F.mse_loss(model(torch.ones(2, 3)), torch.zeros(2, 2)).backward()


def test_a_rank_that_returned_while_a_peer_waited_is_called_out():
    with pytest.raises(zerokit.RankFailed) as info:
        zerokit.launch(_forgets_no_sync, 2, timeout_s=20)
    e = info.value
    assert e.rank == 1, str(e)
    assert "rank 0 is finished (fn returned after" in e.where, e.where
    assert "rank 1 is waiting for async all_reduce" in e.where and "of backward" in e.where, e.where
    assert "did not call the same collectives" in e.where and e.where in str(e)


def _crash(ctx):
    comm.all_reduce(torch.ones(2))
    if ctx.rank == 1:
        raise SystemExit(3)
    comm.all_reduce(torch.ones(2))


def test_the_failure_panel_runs_the_chosen_lab_and_shows_its_diagnosis():
    pytest.importorskip("ipywidgets")
    panel = course.FailurePanel({"fine": (lambda ctx: ctx.rank, {}), "crash": (_crash, {"timeout_s": 20})}, run=False)
    assert panel.runs == 0 and panel.choice.options == ("fine", "crash")
    panel.choice.value = "crash"
    panel.run_button.click()
    d = panel.last
    assert panel.runs == 1 and panel.last_error is None
    assert d.error == "RankFailed" and d.ranks == (1,) and d.cause == "SystemExit", d
    assert "RankFailed" in panel.status.value and "rank(s) [1]" in panel.status.value
    assert "rank 0 is in all_reduce #2 of setup" in d.where and d.where in panel.details.value
    assert d.per_rank() == {0: d.per_rank()[0], 1: d.per_rank()[1]} and d.per_rank()[0].startswith("in all_reduce")
    picture = panel.image.value
    assert picture and "image/png" in panel._repr_mimebundle_()
    panel.choice.value = "fine"
    fine = panel.run()
    assert fine.error == "", (fine.error, fine.ranks, fine.cause, fine.summary, fine.where, fine.message)
    assert panel.runs == 2 and panel.image.value != picture
    assert "FailurePanel" in repr(panel)
    with pytest.raises(ValueError, match="at least one lab"):
        course.FailurePanel({})


def test_scrub_takes_out_ports_paths_and_addresses():
    text = "Read error [127.0.0.1]:4242 in /work/main/zerokit/x.py at 0x7f8ca0605da0"
    assert course.failure_panel.scrub(text) == "Read error [loopback] in …/x.py at 0x…"
