"""The communication ledger records what each collective moves, by the ring's rules."""
import pytest
import torch
import torch.distributed as dist

import zerokit
from zerokit import comm, theory


def _collectives(ctx):
    n, r = ctx.world_size, ctx.rank
    comm.ledger().reset()
    with comm.phase("backward"):
        t = torch.full((6 * n,), float(r + 1))
        comm.all_reduce(t)
        out = torch.empty(6)
        comm.reduce_scatter(out, torch.arange(6.0 * n) * (r + 1))
        gathered = torch.empty(6 * n)
        work = comm.all_gather(gathered, torch.full((6,), float(r)), async_op=True)
        work.wait()
    with comm.phase("step"):
        b = torch.full((5,), float(r), dtype=torch.bfloat16)
        comm.broadcast(b, src=0)
    records = comm.ledger().to_list()
    return {"sum": t.tolist(), "rs": out.tolist(), "ag": gathered.tolist(), "bc": b.float().tolist(),
            "records": records, "summary": comm.ledger().summary()}


@pytest.mark.parametrize("n", [2, 3])
def test_values_and_bytes(n):
    results = zerokit.launch(_collectives, n)
    total = sum(range(1, n + 1))
    for rank, res in enumerate(results):
        assert res["sum"] == [float(total)] * (6 * n)
        assert res["rs"] == [float(x * total) for x in range(6 * rank, 6 * rank + 6)]
        assert res["ag"] == [float(i // 6) for i in range(6 * n)]
        assert res["bc"] == [0.0] * 5
        ops = [(r["op"], r["phase"], r["numel"], r["dtype"], r["payload_bytes"], r["ring_cost_bytes"])
               for r in res["records"]]
        s = 6 * n * 4
        assert ops == [
            ("all_reduce", "backward", 6 * n, "float32", s, theory.ring_bytes_sent("all_reduce", s, n)),
            ("reduce_scatter", "backward", 6 * n, "float32", s, (n - 1) * s // n),
            ("all_gather", "backward", 6 * n, "float32", s, (n - 1) * s // n),
            ("broadcast", "step", 5, "bfloat16", 10, 0 if rank == n - 1 else 10),
        ]
        assert res["records"][0]["ring_cost_bytes"] == 2 * (n - 1) * s // n
        assert all(r["sent_bytes"] is None for r in res["records"])  # the backend ran them: no wire count
        assert all(r["axis"] == "dp" for r in res["records"])  # the default mesh: every rank on dp
        assert all(r["t_end"] is not None and r["blocked_s"] >= 0 for r in res["records"])
        assert res["records"][2]["async_op"] is True


def _uneven(ctx):
    comm.reduce_scatter(torch.empty(2), torch.zeros(5))


def test_uneven_reduce_scatter_is_refused_with_the_sizes():
    with pytest.raises(zerokit.RankFailed, match="pad flat buffers to a multiple of the world size"):
        zerokit.launch(_uneven, 2)


def test_unknown_phase():
    with pytest.raises(ValueError, match="phase='optimizer'"):
        with comm.phase("optimizer"):
            pass
