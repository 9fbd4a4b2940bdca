"""Pipeline parallelism through ``zerokit.train``: parity with the single-process reference under every
schedule, point-to-point traffic measured = formula, stashed activations against the schedule's peak in
flight, the dp × tp × pp grid, and bad input refused before any process starts."""
import pytest
import torch

import zerokit
from zerokit import theory
from zerokit.pipeline_parallel.partition import block_counts, pieces_of, split
from zerokit.train import make_job


def gpt(n_layer=4, **kw):
    return zerokit.tiny_gpt(vocab=64, seq_len=8, d_model=16, n_layer=n_layer, n_head=2, batch_size=8, **kw)


def train_pp(workload, p, m, schedule, chunks=1, strategy="pp", parallel=None, steps=3, partition=None, **kw):
    options = {"schedule": schedule}
    if chunks > 1:
        options["chunks"] = chunks
    if partition is not None:
        options["partition"] = partition
    return zerokit.train(workload, strategy, world_size=p if parallel is None else
                         parallel.get("pp", 1) * parallel.get("dp", 1) * parallel.get("tp", 1),
                         steps=steps, optimizer="sgd", lr=0.1, micro_batches=m, parallel=parallel,
                         **options, **kw)


@pytest.mark.parametrize("p,schedule,chunks", [(2, "gpipe", 1), (2, "1f1b", 1), (2, "interleaved", 2),
                                               (2, "zb-h1", 1), (4, "1f1b", 1), (4, "gpipe", 1),
                                               (4, "zb-h1", 1), (4, "interleaved", 2)])
def test_pipeline_matches_single_process(p, schedule, chunks):
    workload = gpt(n_layer=8 if chunks * p > 4 else 4, tie_weights=True)
    report = train_pp(workload, p, 4, schedule, chunks)
    result = report.results[0]
    assert result.max_abs_param_diff is not None and result.max_abs_param_diff <= 1e-6, result.max_abs_param_diff
    assert [r.coords["pp"] for r in result.ranks] == list(range(p))
    ref = report.reference.losses
    assert all(abs(a - b) <= 1e-5 for a, b in zip(result.ranks[0].losses, ref))


@pytest.mark.parametrize("n_layer,partition,counts", [(3, "blocks", [2, 1]), (5, {"first": 2}, [2, 3]),
                                                      (5, [3, 2], [3, 2])])
def test_uneven_stages_match_single_process(n_layer, partition, counts):
    """Stages of unequal depth (3 blocks on pp=2; 5 as Megatron's first-stage count or every stage's): the same
    training as one process, and each boundary's bytes as the formula (the activations' shape does not change)."""
    workload = gpt(n_layer=n_layer, tie_weights=True)
    model = workload.build_model()
    assert block_counts(pieces_of(model), 2, 1, partition) == counts
    held = [len([n for n in stage.piece_names if n.startswith("blocks.")]) for r in range(2)
            for stage in split(model, 2, 1, r, partition).values()]
    assert held == counts
    m = 4
    report = train_pp(workload, 2, m, "1f1b", partition=partition)
    result = report.results[0]
    assert result.max_abs_param_diff is not None and result.max_abs_param_diff <= 1e-6, result.max_abs_param_diff
    assert all(abs(a - b) <= 1e-5 for a, b in zip(result.ranks[0].losses, report.reference.losses))
    tied = 64 * 16 * 4  # the embedding's gradient, summed between the first and last stage
    for rank in result.ranks:
        assert rank.comm_bytes_by_axis["pp"]["ring_cost_bytes"] == theory.pipeline_p2p_bytes(8, 8 // m, 16, m, 4) \
            + tied


def test_pipeline_traffic_is_point_to_point_and_matches_the_formula():
    m, p = 4, 4
    workload = gpt(n_layer=4)
    report = train_pp(workload, p, m, "1f1b", steps=2)
    b_micro = 8 // m
    per_boundary = theory.pipeline_p2p_bytes(8, b_micro, 16, m, element_bytes=4)
    for rank in report.results[0].ranks:
        axis = rank.comm_bytes_by_axis
        assert set(axis) == {"pp"}
        ops = {row["op"] for row in rank.comm_summary if row["axis"] == "pp"}
        assert ops <= {"send", "recv"}
        i = rank.coords["pp"]
        boundaries = (i < p - 1) + (i > 0)
        assert axis["pp"]["ring_cost_bytes"] == boundaries * per_boundary  # bytes this rank sends per step
        assert rank.theory_comm_bytes_by_axis["pp"] == boundaries * per_boundary
        assert axis["pp"]["calls"] == 2 * boundaries * m  # a send and a receive per micro-batch each way


def test_tied_embedding_gradient_is_summed_between_first_and_last_stage():
    report = train_pp(gpt(tie_weights=True), 2, 2, "1f1b")
    rank = report.results[0].ranks[0]
    assert report.results[0].max_abs_param_diff <= 1e-6
    tied = 64 * 16 * 4  # vocab × d_model fp32: an all-reduce between two ranks sends it once
    assert rank.theory_comm_bytes_by_axis["pp"] == theory.pipeline_p2p_bytes(8, 4, 16, 2, 4) + tied


def test_stashed_activations_follow_the_schedules_peak_in_flight():
    p, m = 4, 8
    workload = gpt(n_layer=4)
    gpipe = train_pp(workload, p, m, "gpipe", steps=1).results[0].ranks
    one_f_one_b = train_pp(workload, p, m, "1f1b", steps=1).results[0].ranks
    for g, f in zip(gpipe, one_f_one_b):
        i = g.coords["pp"]
        per_micro = g.peak_by_category["activations"] / theory.peak_stashed_microbatches("gpipe", p, m, i)
        expected = theory.peak_stashed_microbatches("1f1b", p, m, i) * per_micro
        assert f.peak_by_category["activations"] == pytest.approx(expected, rel=1e-9), i


def test_measured_timeline_runs_the_schedules_actions_in_order():
    report = train_pp(gpt(), 2, 4, "zb-h1", steps=1)
    sched = zerokit.schedule("zb-h1", 2, 4)
    for rank in report.results[0].ranks:
        done = [a for a, _, _ in rank.pipeline_spans]
        assert done == [str(a) for a in sched.actions[rank.coords["pp"]]]
        starts = [s for _, s, _ in rank.pipeline_spans]
        assert starts == sorted(starts)
    ranks = sorted(report.results[0].ranks, key=lambda r: r.coords["pp"])
    timeline = zerokit.pipeline_parallel.measured(sched, [r.pipeline_spans for r in ranks])
    assert timeline.peak_in_flight == zerokit.simulate(sched).peak_in_flight  # same actions, same stash
    assert 0 < timeline.bubble_fraction < 1 and timeline.makespan > 0
    assert [a for a, _, _ in timeline.spans[0]] == sched.compute(0)


@pytest.mark.parametrize("strategy", ["ddp", "zero1"])
def test_grid_dp_tp_pp(strategy):
    workload = gpt(n_layer=4, tie_weights=True)
    report = train_pp(workload, 2, 2, "1f1b", strategy=strategy, parallel={"dp": 2, "tp": 2, "pp": 2}, steps=2)
    result = report.results[0]
    assert result.max_abs_param_diff <= 1e-6
    coords = {tuple(r.coords[a] for a in ("pp", "dp", "tp")) for r in result.ranks}
    assert len(coords) == 8
    for rank in result.ranks:
        assert {"dp", "tp", "pp"} <= set(rank.comm_bytes_by_axis)
        for axis in ("pp",):
            assert rank.comm_bytes_by_axis[axis]["ring_cost_bytes"] == pytest.approx(
                rank.theory_comm_bytes_by_axis[axis])


def test_partition_by_blocks_params_and_counts():
    model = gpt(n_layer=6, tie_weights=True).build_model()
    pieces = pieces_of(model)
    assert block_counts(pieces, 3, 1, "blocks") == [2, 2, 2]
    assert block_counts(pieces, 4, 1, "blocks") == [2, 2, 1, 1]
    assert block_counts(pieces, 3, 1, [1, 2, 3]) == [1, 2, 3]
    assert block_counts(pieces, 4, 1, {"first": 1, "last": 1}) == [1, 2, 2, 1]  # Megatron's first/last counts
    assert block_counts(pieces, 3, 1, {"last": 2}) == [2, 2, 2] and block_counts(pieces, 2, 1, {"first": 1}) == [1, 5]
    for bad, match in (({"first": 1}, r"the other 5 of the 6 blocks must split evenly over the 2 other stage"),
                       ({"middle": 2}, r"keys 'first' and/or 'last'"), ({"first": 0}, r"partition\['first'\]=0"),
                       ({"first": 3, "last": 3}, r"the other 0 of the 6 blocks")):
        with pytest.raises(ValueError, match=match):
            block_counts(pieces, 3, 1, bad)
    with pytest.raises(ValueError, match=r"without interleaving \(chunks=2\)"):
        block_counts(pieces, 3, 2, {"first": 2})
    assert sum(block_counts(pieces, 3, 1, "params")) == 6
    stages = split(model, 2, 1, 0)
    assert stages[0].piece_names == ["embed", "blocks.0", "blocks.1", "blocks.2"]
    assert split(model, 2, 1, 1)[1].piece_names[-1] == "head"
    assert sorted(split(model, 2, 3, 1)) == [1, 3, 5]  # interleaved: rank 1 holds stages 1, 3, 5


@pytest.mark.parametrize("kwargs,match", [
    (dict(strategy="pp", world_size=8), "only 4 blocks"),
    (dict(strategy="pp", world_size=2, micro_batches=3), "not divisible"),
    (dict(strategy="pp", world_size=2, options={"schedule": "interleaved", "chunks": 3}), "chunks"),
    (dict(strategy="pp", world_size=2, options={"schedule": "dualpipe"}), "gpipe, 1f1b, interleaved, zb-h1"),
    (dict(strategy="ddp", world_size=4, parallel={"dp": 2, "pp": 3}), "multiply"),
    (dict(strategy="zero2", world_size=4, parallel={"dp": 2, "pp": 2}), "incompatible with pipeline"),
    (dict(strategy="zero3", world_size=4, parallel={"dp": 2, "pp": 2}), "incompatible with pipeline"),
    (dict(strategy="ddp", world_size=2, options={"schedule": "gpipe"}), "pp degree above 1"),
    (dict(strategy="pp", world_size=2, options={"schedule": "1f1b", "chunks": 2}), "only schedule='interleaved'"),
    (dict(strategy="pp", world_size=2, options={"partition": [1, 2]}), "block counts"),
])
def test_bad_pipeline_input_is_refused_before_any_process_starts(kwargs, match):
    args = dict(workload=gpt(n_layer=4), strategy="pp", world_size=2, steps=1, precision="fp32", optimizer="sgd",
                lr=0.1, micro_batches=2, options={})
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        make_job(**args)


def test_bf16_pipeline_runs_close_to_reference():
    report = zerokit.train(gpt(), "pp", world_size=2, steps=2, precision="bf16-mixed", optimizer="sgd", lr=0.1,
                           micro_batches=2, schedule="1f1b")
    assert report.results[0].param_diff["max_rel"] <= 2e-2
    assert torch.isfinite(torch.tensor(report.results[0].ranks[0].losses)).all()


def test_torch_pipelining_peers_match_in_the_same_run():
    from zerokit.cli import compare

    names = ["pp", "torch-pp-gpipe", "torch-pp-1f1b", "torch-pp-interleaved"]
    report = compare(gpt(tie_weights=True), 2, names, steps=4, optimizer="sgd", lr=0.1, micro_batches=4)
    ours = report["pp"]
    for name in names:
        result = report[name]
        assert result.max_abs_param_diff <= 1e-6, name
        assert all(abs(a - b) <= 1e-5 for a, b in zip(result.losses, ours.losses)), name
        for rank in result.ranks:
            row, theory_pp = rank.comm_bytes_by_axis["pp"], rank.theory_comm_bytes_by_axis["pp"]
            # torch exchanges shape metadata in its first step on top of the activations and gradients
            assert theory_pp <= row["ring_cost_bytes"] <= 1.02 * theory_pp, (name, row, theory_pp)
