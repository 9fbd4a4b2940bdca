"""The device mesh: group membership for dp × tp × pp shapes, degrees checked before any process, traffic per axis;
and the three traffic quantities of ZeRO on zerokit's ring."""
from fractions import Fraction

import pytest
import torch.distributed as dist

import zerokit
from zerokit.cli import compare
from zerokit.runtime.mesh import AXES, axis_ranks, coords_of, parse_parallel

SHAPES = [{"pp": 1, "dp": 8, "tp": 1}, {"pp": 2, "dp": 2, "tp": 2}, {"pp": 4, "dp": 1, "tp": 2},
          {"pp": 1, "dp": 4, "tp": 2}, {"pp": 2, "dp": 4, "tp": 1}, {"pp": 1, "dp": 2, "cp": 2, "tp": 2},
          {"pp": 2, "dp": 1, "cp": 4, "tp": 1}]


def test_the_layout_puts_tp_innermost():
    shape = {"pp": 2, "dp": 2, "tp": 2}
    assert [coords_of(r, shape) for r in (0, 1, 2, 5)] == [
        {"pp": 0, "dp": 0, "tp": 0}, {"pp": 0, "dp": 0, "tp": 1}, {"pp": 0, "dp": 1, "tp": 0},
        {"pp": 1, "dp": 0, "tp": 1}]
    assert axis_ranks(5, shape, "tp") == [4, 5]
    assert axis_ranks(5, shape, "dp") == [5, 7]
    assert axis_ranks(5, shape, "pp") == [1, 5]
    # cp between dp and tp; dp_cp the flattened data-parallel group with context parallel, dp outermost
    shape = {"pp": 1, "dp": 2, "cp": 2, "tp": 2}
    assert coords_of(7, shape) == {"pp": 0, "dp": 1, "cp": 1, "tp": 1}
    assert axis_ranks(7, shape, "cp") == [5, 7] and axis_ranks(7, shape, "dp") == [3, 7]
    assert axis_ranks(7, shape, "dp_cp") == [1, 3, 5, 7]


def _groups(ctx, shapes):
    out = []
    for shape in shapes:
        ctx.set_mesh(shape)
        mesh = ctx.mesh
        members = {}
        for axis in AXES:
            group = mesh.group(axis)
            members[axis] = (list(range(ctx.world_size)) if group is None else dist.get_process_group_ranks(group))
        flat = mesh.group("dp_cp")
        members["dp_cp"] = list(range(ctx.world_size)) if flat is None else dist.get_process_group_ranks(flat)
        out.append({"coords": mesh.coords, "members": members, "expected": {a: mesh.ranks(a) for a in AXES},
                    "dp_cp": members["dp_cp"],
                    "axis_of": {a: mesh.axis_of(mesh.group(a)) for a in AXES if mesh.size(a) > 1}})
    return out


def test_group_membership_on_eight_ranks():
    results = zerokit.launch(_groups, 8, SHAPES)
    for rank, per_shape in enumerate(results):
        for shape, got in zip(SHAPES, per_shape):
            assert got["coords"] == coords_of(rank, shape)
            for axis in AXES:
                assert got["members"][axis] == axis_ranks(rank, shape, axis), (shape, axis)
                assert len(got["members"][axis]) == shape.get(axis, 1)
            assert got["axis_of"] == {a: a for a in AXES if shape.get(a, 1) > 1}
            assert got["dp_cp"] == axis_ranks(rank, shape, "dp_cp")
    # every axis partitions the world: its groups are disjoint and cover every rank
    for i, shape in enumerate(SHAPES):
        for axis in AXES:
            groups = {tuple(results[r][i]["members"][axis]) for r in range(8)}
            assert sorted(r for g in groups for r in g) == list(range(8))
            assert len(groups) == 8 // shape.get(axis, 1)


def test_degrees_are_checked_before_any_process_starts():
    assert parse_parallel(None, 4) == {"pp": 1, "dp": 4, "tp": 1}
    assert parse_parallel({"tp": 2}, 8) == {"pp": 1, "dp": 4, "tp": 2}
    assert parse_parallel({"cp": 2}, 8) == {"pp": 1, "dp": 4, "cp": 2, "tp": 1}
    for bad, match in [({"dp": 3}, "multiply"), ({"xp": 2}, "unknown axis"), ({"ep": 3}, "must divide dp=4"), ({"dp": 0}, "positive"),
                       ("dp=2", "dict"), ({"tp": 3}, "does not divide")]:
        with pytest.raises(ValueError, match=match):
            parse_parallel(bad, 4)
    work = zerokit.mlp((13, 37, 29, 7), batch_size=12)
    with pytest.raises(ValueError, match="tensor parallelism, which strategy 'torch-ddp' does not implement"):
        zerokit.train(work, "torch-ddp", world_size=4, parallel={"dp": 2, "tp": 2})
    with pytest.raises(ValueError, match="has no tensor-parallel plan"):
        zerokit.train(work, "ddp", world_size=4, parallel={"dp": 2, "tp": 2})
    with pytest.raises(ValueError, match="pipeline parallelism"):
        zerokit.train(work, "zero3", world_size=2, parallel={"dp": 1, "pp": 2})


def test_reports_carry_coordinates_and_traffic_per_axis():
    work = zerokit.mlp((13, 37, 29, 7), batch_size=12)
    report = zerokit.train(work, "zero2", world_size=3, steps=2, parallel={"dp": 3, "tp": 1, "pp": 1})
    result = report.result
    assert result.parallel == {"pp": 1, "dp": 3, "tp": 1}
    for i, rank in enumerate(result.ranks):
        assert rank.coords == {"pp": 0, "dp": i, "tp": 0}
        assert set(rank.comm_bytes_by_axis) == {"dp"}
        dp = rank.comm_bytes_by_axis["dp"]
        assert dp["ring_cost_bytes"] == rank.comm_ring_cost_bytes_per_step
        assert dp["payload_bytes"] == rank.comm_payload_bytes_per_step
        assert dp["sent_bytes"] is None  # gloo ran the collectives: nothing counted on the wire
    row = report.to_json()["strategies"][0]["per_rank"][1]
    assert row["coords"]["dp"] == 1 and "dp" in row["comm_bytes_by_axis"]


@pytest.mark.parametrize("n", [3, 4])
def test_on_the_ring_payload_cost_and_sent_bytes_agree_with_the_formula(n):
    work = zerokit.mlp((13, 37, 29, 7), batch_size=12)  # Ψ = 1,830: units padded to a multiple of N
    stages = ["zero1", "zero2", "zero3"]
    report = compare(work, n, ["single", *stages], steps=2, options_for=lambda name: {
        "algorithm": "ring", **({"reduce_bucket_size": 600} if name in ("zero1", "zero2") else {})}
        if name != "single" else {}, optimizer="sgd", lr=0.1)
    for name in stages:
        result = report[name]
        assert result.param_diff["max_abs"] <= 1e-6, name
        for rank in result.ranks:
            # measured on the wire == the ring formula on the measured payloads == the theory on Ψ
            assert rank.comm_sent_bytes_per_step == rank.comm_ring_cost_bytes_per_step \
                == rank.theory_comm_bytes_per_step, name
            for row in rank.comm_summary:
                assert row["algorithm"] == "ring" and row["note"] == ""
                if row["op"] == "reduce_scatter":  # a reduce-scatter really sends (N−1)/N of its buffer
                    assert Fraction(row["sent_bytes"]) == Fraction(n - 1, n) * row["payload_bytes"]
    torch_run = zerokit.train(work, "zero2", world_size=n, steps=1)
    notes = {row["note"] for row in torch_run.result.ranks[0].comm_summary if row["op"] == "reduce_scatter"}
    assert notes == {"gloo runs reduce-scatter as an all-reduce + slice: it sends an all-reduce's bytes"}
    assert "all-reduce + slice" in torch_run.table()
