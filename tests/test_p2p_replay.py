"""Point-to-point order under NCCL's rules, checked on the CPU: a pair of ranks shares one stream, so each
rank's operations with a peer run in posting order and a send finishes only with its matching receive
(zerokit.runtime.p2p_replay). Gloo matches sends and receives independently, so an order that deadlocks a GPU
runs here: the replay is the check that fails."""
import pytest
import torch

import zerokit
from zerokit.job import make_job
from zerokit.runtime import ring
from zerokit.runtime.p2p_replay import P2PDeadlock, recording, replay
from zerokit.train import run_rank


def test_the_replay_finds_the_textbook_cycles_and_passes_their_fixes():
    a, b = 1024, 1024
    # a ring round at n = 2 posted as irecv, then isend, on both ranks: each receive waits for a send queued behind
    with pytest.raises(P2PDeadlock, match="rank 0 waits on recv of 1024 B with rank 1"):
        replay({0: [[("recv", 1, a)], [("send", 1, a)]], 1: [[("recv", 0, a)], [("send", 0, a)]]})
    # 1F1B's SEND_F then RECV_B on stage 0 against SEND_B then RECV_F on stage 1, each posted alone
    with pytest.raises(P2PDeadlock):
        replay({0: [[("send", 1, a)], [("recv", 1, b)]], 1: [[("send", 0, b)], [("recv", 0, a)]]})
    # the same, each pair posted as one group (batch_isend_irecv)
    assert replay({0: [[("send", 1, a), ("recv", 1, b)]], 1: [[("send", 0, b), ("recv", 0, a)]]}) == 4
    # a group against single calls on the other side: the group's ops run together, each matched on its own
    assert replay({0: [[("send", 1, a), ("recv", 1, b)]], 1: [[("recv", 0, a)], [("send", 0, b)]]}) == 4
    with pytest.raises(P2PDeadlock, match="sizes of matching point-to-point calls differ"):
        replay({0: [[("send", 1, 8)]], 1: [[("recv", 0, 4)]]})


def _rings(ctx):
    out = {}
    for name, run in (("all_reduce", lambda x: ring.ring_all_reduce(x)),
                      ("reduce_scatter", lambda x: ring.ring_reduce_scatter(torch.empty(4), x)),
                      ("all_gather", lambda x: ring.ring_all_gather(torch.empty(4 * ctx.world_size), x[:4]))):
        with recording() as posted:
            run(torch.arange(4.0 * ctx.world_size) + ctx.rank)
        out[name] = posted
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_zerokits_ring_collectives_cannot_deadlock_on_nccl(n):
    per_rank = zerokit.launch(_rings, n)
    for name in ("all_reduce", "reduce_scatter", "all_gather"):
        posted = {r: calls[name] for r, calls in enumerate(per_rank)}
        assert all(len(call) == 2 for calls in posted.values() for call in calls), name  # send + recv, one group
        assert replay(posted) == 2 * sum(len(calls) for calls in posted.values()), name


def _pipeline(ctx, job):
    with recording() as posted:
        run_rank(ctx, job)
    return posted


WORK = dict(vocab=32, seq_len=8, d_model=16, n_layer=4, n_head=2, batch_size=8)


@pytest.mark.parametrize("schedule,stages", [
    ("gpipe", 2), ("1f1b", 2), ("zb-h1", 2), ("1f1b", 4), ("interleaved", 2), ("interleaved", 4)])
def test_the_pipeline_executors_point_to_point_order_cannot_deadlock_on_nccl(schedule, stages):
    chunks = 2 if schedule == "interleaved" else 1
    job = make_job(zerokit.tiny_gpt(**dict(WORK, n_layer=max(4, stages * chunks))), "pp", stages, 1, "fp32", "sgd",
                   0.1, 4, {"schedule": schedule, "chunks": chunks})
    posted = zerokit.launch(_pipeline, stages, job)
    assert replay(dict(enumerate(posted))) > 0


def _planned(sched):
    """Every rank's posted calls as the executor posts them from the plan (no processes)."""
    from zerokit.pipeline_parallel.p2p_plan import posting_plan, receiver_stage

    posted = {}
    for r in range(sched.ranks):
        calls = []
        for _, group in sorted(posting_plan(sched, r).items()):
            calls.append([(kind, sched.rank_of(receiver_stage(m) if kind == "send" else m[1]), 1) for kind, m in group])
        posted[r] = calls
    return posted


@pytest.mark.parametrize("name,chunks", [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 2),
                                         ("interleaved", 3)])
@pytest.mark.parametrize("p,m", [(2, 2), (2, 4), (3, 6), (4, 8), (4, 4), (8, 16)])
def test_the_posting_plan_of_every_schedule_cannot_deadlock_on_nccl(name, chunks, p, m):
    from zerokit.pipeline_parallel.schedules import schedule

    sched = schedule(name, p, m, chunks)
    messages = sum(1 for row in sched.actions for a in row if a.kind.startswith("SEND")
                   and sched.rank_of(a.stage) != sched.rank_of(a.stage + (1 if a.kind == "SEND_F" else -1)))
    assert replay(_planned(sched)) == 2 * messages
