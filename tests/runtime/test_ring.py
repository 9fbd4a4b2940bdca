"""The ring collectives on send/recv match torch's, send what the ring formula says, and run their schedule."""
import pytest
import torch
import torch.distributed as dist

import zerokit
from zerokit import comm, theory
from zerokit.runtime.ring import (RING_COLLECTIVES, ring_all_gather, ring_all_reduce, ring_phase,
                          ring_reduce_scatter, ring_schedule)

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

#: all-reduce inputs are uniform in [-1, 1), so a sum of at most 4 lies in (-4, 4) and two
#: summation orders differ by at most 2·3 half-ulps of 4 (≈ 7e-7): within this tolerance
ALL_REDUCE_ATOL = 1e-6
CHUNK = 6                            # reduce-scatter output / all-gather input elements
ALL_REDUCE_SIZES = (1001, 1, 3)      # odd, and fewer elements than ranks (n = 2..4)


def _rank_data(rank: int, numel: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + rank)
    return torch.rand(numel, generator=generator) * 2 - 1


def _ring_vs_torch(ctx):
    n, r = ctx.world_size, ctx.rank
    book = comm.ledger()
    book.reset()
    comm.set_step(3)
    out = {"steps": [], "errors": []}
    with comm.phase("backward"):
        # integer-valued floats: every summation order gives the same sum
        rs_in = torch.arange(CHUNK * n, dtype=torch.float32) * (r + 1) + r
        rs_before = rs_in.clone()
        rs_ring, rs_torch = torch.empty(CHUNK), torch.empty(CHUNK)
        ring_reduce_scatter(rs_ring, rs_in)
        _reduce_scatter(rs_torch, rs_in.clone())
        out["rs_equal"] = torch.equal(rs_ring, rs_torch)
        out["rs_input_untouched"] = torch.equal(rs_in, rs_before)

        ag_in = _rank_data(r, CHUNK)
        ag_ring, ag_torch = torch.empty(CHUNK * n), torch.empty(CHUNK * n)
        ring_all_gather(ag_ring, ag_in)
        _all_gather(ag_torch, ag_in)
        out["ag_equal"] = torch.equal(ag_ring, ag_torch)

        out["ar_max_error"], out["ar_shape_kept"] = {}, {}
        for numel in ALL_REDUCE_SIZES:
            ring = _rank_data(r, numel)
            reference = ring.clone()
            ring_all_reduce(ring, on_step=lambda *call, numel=numel: out["steps"].append((numel, *call)))
            dist.all_reduce(reference)
            out["ar_max_error"][numel] = (ring - reference).abs().max().item()

        matrix = torch.arange(7 * 11, dtype=torch.int64).reshape(7, 11) * (r + 1)
        reference = matrix.clone()
        ring_all_reduce(matrix)
        dist.all_reduce(reference)
        out["ar_int_equal"] = torch.equal(matrix, reference)

    for call in (lambda: ring_reduce_scatter(torch.empty(2), torch.zeros(2 * n + 1)),
                 lambda: ring_all_gather(torch.empty(2 * n + 1), torch.zeros(2)),
                 lambda: ring_all_reduce(torch.zeros(4), op=dist.ReduceOp.MAX)):
        try:
            call()
        except ValueError as error:
            out["errors"].append(str(error))
    out["records"] = book.to_list()
    return out


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_matches_torch_and_the_ring_formula(n):
    results = zerokit.launch(_ring_vs_torch, n)
    s = CHUNK * n * 4
    for rank, res in enumerate(results):
        assert res["rs_equal"] and res["rs_input_untouched"]
        assert res["ag_equal"]
        assert res["ar_int_equal"]
        for numel, error in res["ar_max_error"].items():
            assert error <= ALL_REDUCE_ATOL, (numel, error)

        records = res["records"]
        assert [r["op"] for r in records] == (["reduce_scatter", "all_gather"]
                                             + ["all_reduce"] * (len(ALL_REDUCE_SIZES) + 1))
        assert all(r["algorithm"] == "ring" and r["phase"] == "backward" and r["step"] == 3
                   and r["group_size"] == n and r["t_end"] is not None and r["blocked_s"] >= 0
                   for r in records)
        rs, ag, *ars = records
        assert rs["sent_bytes"] == theory.ring_bytes_sent("reduce_scatter", s, n) == (n - 1) * s // n
        assert ag["sent_bytes"] == theory.ring_bytes_sent("all_gather", s, n) == (n - 1) * s // n
        for record, numel in zip(ars, ALL_REDUCE_SIZES):
            padded = theory.padded_numel([numel], n) * 4
            assert record["numel"] == numel and record["payload_bytes"] == numel * 4
            assert record["sent_bytes"] == theory.ring_bytes_sent("all_reduce", padded, n)
        assert ars[-1]["dtype"] == "int64"
        assert ars[-1]["sent_bytes"] == theory.ring_bytes_sent("all_reduce", theory.padded_numel([77], n) * 8, n)

        # the rounds reported are the schedule's, phase by phase
        for numel in ALL_REDUCE_SIZES:
            steps = [call[1:] for call in res["steps"] if call[0] == numel]
            assert len(steps) == theory.ring_steps("all_reduce", n)
            assert steps == [(*rnd, ring_phase("all_reduce", n, rnd.round))
                             for rnd in ring_schedule("all_reduce", n, rank)]

        assert len(res["errors"]) == 3
        assert "ring_reduce_scatter: input has" in res["errors"][0]
        assert "ring_all_gather: output has" in res["errors"][1]
        assert "only ReduceOp.SUM" in res["errors"][2]


def _ring_on_a_subgroup(ctx):
    # group ranks 0, 1, 2 are global ranks 3, 1, 2: the neighbours must be translated
    group = dist.new_group([3, 1, 2], sort_ranks=False)
    if ctx.rank == 0:
        return None
    comm.ledger().reset()
    g = dist.get_rank(group)
    tensor = _rank_data(ctx.rank, 10)
    reference = tensor.clone()
    ring_all_reduce(tensor, group=group)
    dist.all_reduce(reference, group=group)
    rs_in = torch.arange(12.0) * (ctx.rank + 1)
    rs_ring, rs_torch = torch.empty(4), torch.empty(4)
    ring_reduce_scatter(rs_ring, rs_in, group=group)
    _reduce_scatter(rs_torch, rs_in.clone(), group=group)
    ag_ring, ag_torch = torch.empty(12), torch.empty(12)
    ring_all_gather(ag_ring, rs_in[:4], group=group)
    _all_gather(ag_torch, rs_in[:4], group=group)
    return {"group_rank": g, "ar_error": (tensor - reference).abs().max().item(),
            "rs_equal": torch.equal(rs_ring, rs_torch), "ag_equal": torch.equal(ag_ring, ag_torch),
            "group_sizes": [r.group_size for r in comm.ledger().records]}


def test_ring_on_a_subgroup_uses_group_ranks():
    results = zerokit.launch(_ring_on_a_subgroup, 4)
    assert results[0] is None
    assert [res["group_rank"] for res in results[1:]] == [1, 2, 0]
    for res in results[1:]:
        assert res["ar_error"] <= ALL_REDUCE_ATOL
        assert res["rs_equal"] and res["ag_equal"]
        assert res["group_sizes"] == [3, 3, 3]


def test_world_of_one_copies_and_sends_nothing():
    assert not dist.is_initialized()
    book = comm.ledger()
    book.reset()
    try:
        data = torch.arange(5.0)
        out = torch.empty(5)
        ring_reduce_scatter(out, data)
        assert torch.equal(out, data)
        gathered = torch.empty(5)
        ring_all_gather(gathered, data)
        assert torch.equal(gathered, data)
        tensor = data.clone()
        ring_all_reduce(tensor, on_step=lambda *call: pytest.fail("a world of one has no rounds"))
        assert torch.equal(tensor, data)
        assert [(r.op, r.algorithm, r.sent_bytes, r.group_size) for r in book.records] == [
            ("reduce_scatter", "ring", 0, 1), ("all_gather", "ring", 0, 1), ("all_reduce", "ring", 0, 1)]
    finally:
        book.reset()


@pytest.mark.parametrize("n", range(2, 9))
def test_schedule_reduces_every_chunk_once_and_gathers_it_everywhere(n):
    schedules = {op: [ring_schedule(op, n, rank) for rank in range(n)] for op in RING_COLLECTIVES}
    half = theory.ring_steps("reduce_scatter", n)
    for op, per_rank in schedules.items():
        assert all(len(rounds) == theory.ring_steps(op, n) for rounds in per_rank)
        assert all([rnd.round for rnd in rounds] == list(range(theory.ring_steps(op, n))) for rounds in per_rank)
        for rank, rounds in enumerate(per_rank):
            right = per_rank[(rank + 1) % n]
            assert [rnd.send_chunk for rnd in rounds] == [rnd.recv_chunk for rnd in right]
    for rank in range(n):
        rs, ag = schedules["reduce_scatter"][rank], schedules["all_gather"][rank]
        assert schedules["all_reduce"][rank] == rs + [(half + k, s, r) for k, s, r in ag]

    # reduce-scatter: contributions[rank][chunk] = the ranks whose share of chunk it has summed
    contributions = [[{rank} for _ in range(n)] for rank in range(n)]
    for k in range(half):
        messages = [(rank, rounds[k]) for rank, rounds in enumerate(schedules["reduce_scatter"])]
        sent = [set(contributions[rank][rnd.send_chunk]) for rank, rnd in messages]
        for (rank, rnd), payload in zip(messages, sent):
            receiver = (rank + 1) % n
            recv_chunk = schedules["reduce_scatter"][receiver][k].recv_chunk
            assert not payload & contributions[receiver][recv_chunk], "a share is summed twice"
            contributions[receiver][recv_chunk] |= payload
    complete = [(rank, chunk) for rank in range(n) for chunk in range(n) if contributions[rank][chunk] == set(range(n))]
    assert complete == [(rank, rank) for rank in range(n)], "each chunk is fully reduced once, at its owner"

    # all-gather: each rank starts with its own chunk and receives every other one exactly once
    held = [{rank} for rank in range(n)]
    for k in range(half):
        for rank, rounds in enumerate(schedules["all_gather"]):
            assert rounds[k].send_chunk in held[rank]
        for rank, rounds in enumerate(schedules["all_gather"]):
            assert rounds[k].recv_chunk not in held[rank]
            held[rank].add(rounds[k].recv_chunk)
    assert held == [set(range(n))] * n


def test_bad_arguments_are_refused_clearly():
    with pytest.raises(ValueError, match="op='broadcast' has no ring schedule"):
        ring_schedule("broadcast", 4, 0)
    with pytest.raises(ValueError, match="rank=4 is outside a ring of n=4"):
        ring_schedule("all_reduce", 4, 4)
    with pytest.raises(ValueError, match="n=0"):
        ring_schedule("all_gather", 0, 0)
    assert ring_schedule("all_reduce", 1, 0) == []
    with pytest.raises(ValueError, match=r"input has 5 elements, expected output.numel\(\) \* group size = 2 \* 1"):
        ring_reduce_scatter(torch.empty(2), torch.zeros(5))
    with pytest.raises(ValueError, match="output has 5 elements"):
        ring_all_gather(torch.empty(5), torch.zeros(2))
    with pytest.raises(ValueError, match="input is torch.float64 but output is torch.float32"):
        ring_reduce_scatter(torch.empty(2), torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="only ReduceOp.SUM"):
        ring_all_reduce(torch.zeros(3), op=dist.ReduceOp.MAX)
    with pytest.raises(ValueError, match="only ReduceOp.SUM"):
        ring_reduce_scatter(torch.empty(3), torch.zeros(3), op=dist.ReduceOp.AVG)
