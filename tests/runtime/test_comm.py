"""The communication ledger records what each collective moves, by the ring's rules."""
import contextlib

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


class _OneWork:
    """What NCCL returns for a batch_isend_irecv: one work that completes every operation of the batch."""

    def __init__(self, works):
        self.works = works

    def wait(self):
        for work in self.works:
            work.wait()
        return True

    def is_completed(self):
        return all(work.is_completed() for work in self.works)


@contextlib.contextmanager
def coalesced():
    """Inside one rank: dist.batch_isend_irecv returns one work per batch, as it does on NCCL."""
    real = dist.batch_isend_irecv
    dist.batch_isend_irecv = lambda ops: [_OneWork(real(ops))]
    try:
        yield
    finally:
        dist.batch_isend_irecv = real


def _exchange(ctx):
    comm.ledger().reset()
    peer = 1 - ctx.rank
    incoming = torch.empty(3)
    with coalesced(), comm.phase("forward"):
        works = comm.batch_isend_irecv([("send", torch.full((3,), float(ctx.rank)), peer, "x"),
                                        ("recv", incoming, peer, "x")])
        works[1].wait()  # the receive alone is waited for: the one work covers the send too
        ended = [r["t_end"] is not None for r in comm.ledger().to_list()]
        works[0].wait()
        alone = comm.irecv(torch.empty(1), peer) if ctx.rank else comm.isend(torch.zeros(1), peer)
        alone.wait()
    return {"works": len(works), "ended": ended, "got": incoming.tolist(), "records": comm.ledger().to_list()}


def test_one_work_for_a_whole_batch_covers_every_operation_and_ends_every_record():
    for rank, res in enumerate(zerokit.launch(_exchange, 2)):
        assert res["works"] == 2 and res["got"] == [float(1 - rank)] * 3
        assert res["ended"] == [True, True]
        assert [(r["op"], r["payload_bytes"]) for r in res["records"]] == [
            ("send", 12), ("recv", 12), ("recv" if rank else "send", 4)]
        assert all(r["t_end"] is not None and r["blocked_s"] >= 0 for r in res["records"])


def _interleaved(ctx, job, batch):
    from zerokit.train import run_rank

    with coalesced() if batch == "one work" else contextlib.nullcontext():
        result = run_rank(ctx, job)
    return result.losses, comm.ledger().summary()


def test_the_interleaved_pipeline_runs_when_a_batch_returns_one_work():
    from zerokit.job import make_job

    model = zerokit.tiny_gpt(vocab=32, seq_len=8, d_model=16, n_layer=4, n_head=2, batch_size=8)
    job = make_job(model, "pp", 2, 2, "fp32", "sgd", 0.1, 4, {"schedule": "interleaved", "chunks": 2})
    per_op = zerokit.launch(_interleaved, 2, job, "one per op")
    one = zerokit.launch(_interleaved, 2, job, "one work")
    assert [r[0] for r in one] == [r[0] for r in per_op]
    assert any(row["axis"] == "pp" and row["op"] == "recv" and row["calls"] for row in one[0][1])
    strip = ("blocked_s", "emulated_s")
    assert [[{k: v for k, v in row.items() if k not in strip} for row in r[1]] for r in one] == \
        [[{k: v for k, v in row.items() if k not in strip} for row in r[1]] for r in per_op]
