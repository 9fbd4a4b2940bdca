"""Point-to-point order under NCCL's rules, checked on the CPU: a message finishes only when its sender and its
receiver post it on the same communicator (a lone isend / irecv: the pair's own; a batch_isend_irecv: the group's),
and each rank's calls on one communicator run in posting order, a send only with its matching receive
(zerokit.runtime.p2p_replay). Gloo matches sends and receives independently, so an order that hangs a GPU runs here:
the replay is the check that fails."""
import pytest
import torch

import zerokit
from zerokit.job import make_job
from zerokit.runtime import ring
from zerokit.runtime.p2p_replay import PAIR, P2PCommunicatorMismatch, P2PDeadlock, recording, replay
from zerokit.train import run_rank


def lone(kind, peer, nbytes):
    """An isend / irecv posted alone: the pair's communicator."""
    return [(kind, peer, nbytes, PAIR)]


def batch(*ops, comm="pp"):
    """One batch_isend_irecv on the group ``comm``."""
    return [(kind, peer, nbytes, comm) for kind, peer, nbytes in ops]


def test_the_replay_finds_the_textbook_cycles_and_passes_their_fixes():
    a, b = 1024, 1024
    # a ring round at n = 2 posted as irecv, then isend, on both ranks: each receive waits for a send queued behind
    with pytest.raises(P2PDeadlock, match="rank 0 waits on recv of 1024 B from rank 1"):
        replay({0: [lone("recv", 1, a), lone("send", 1, a)], 1: [lone("recv", 0, a), lone("send", 0, a)]})
    # 1F1B's SEND_F then RECV_B on stage 0 against SEND_B then RECV_F on stage 1, each posted alone
    with pytest.raises(P2PDeadlock):
        replay({0: [lone("send", 1, a), lone("recv", 1, b)], 1: [lone("send", 0, b), lone("recv", 0, a)]})
    # the same, each pair posted as one group (batch_isend_irecv)
    assert replay({0: [batch(("send", 1, a), ("recv", 1, b))], 1: [batch(("send", 0, b), ("recv", 0, a))]}) == 4
    # a group against batches of one on the other side: the group's ops run together, each matched on its own
    assert replay({0: [batch(("send", 1, a), ("recv", 1, b))],
                   1: [batch(("recv", 0, a)), batch(("send", 0, b))]}) == 4
    with pytest.raises(P2PDeadlock, match="sizes of matching point-to-point calls differ"):
        replay({0: [batch(("send", 1, 8))], 1: [batch(("recv", 0, 4))]})


def test_a_message_posted_on_two_communicators_never_finishes():
    a = 1024
    # a lone isend against the peer's batch_isend_irecv: the pair's communicator against the group's
    with pytest.raises(P2PCommunicatorMismatch, match="1 of 2 messages are posted on different communicators") as e:
        replay({0: [lone("send", 1, a), batch(("recv", 1, a))], 1: [batch(("recv", 0, a)), batch(("send", 0, a))]})
    assert (e.value.mismatched, e.value.messages) == (1, 2)
    # two groups are two communicators, even over the same ranks
    with pytest.raises(P2PCommunicatorMismatch):
        replay({0: [batch(("send", 1, a), comm="pp")], 1: [batch(("recv", 0, a), comm="dp")]})


def test_one_stream_per_communicator_serialises_a_ranks_calls_with_every_peer():
    a = 1024
    # three ranks each send to the next, then receive from the previous, as separate calls
    ring3 = {r: [("send", (r + 1) % 3, a), ("recv", (r - 1) % 3, a)] for r in range(3)}
    # on the pair communicators each pair has its own stream: the sends meet receives on other streams
    assert replay({r: [lone(*op) for op in ops] for r, ops in ring3.items()}) == 6
    # on the group's communicator every rank's send holds its receive behind it: a cycle through the three ranks
    with pytest.raises(P2PDeadlock, match="one stream per communicator"):
        replay({r: [batch(op) for op in ops] for r, ops in ring3.items()})
    # posted as one batch per rank, they run together
    assert replay({r: [batch(*ops)] for r, ops in ring3.items()}) == 6


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


def _pipeline_job(schedule, stages, chunks, micro=4):
    model = zerokit.tiny_gpt(**dict(WORK, n_layer=max(4, stages * chunks), batch_size=2 * micro))
    return make_job(model, "pp", stages, 1, "fp32", "sgd", 0.1, micro, {"schedule": schedule, "chunks": chunks})


@pytest.mark.parametrize("schedule,stages,chunks", [
    ("gpipe", 2, 1), ("1f1b", 2, 1), ("zb-h1", 2, 1), ("1f1b", 4, 1), ("interleaved", 2, 2), ("interleaved", 3, 2)])
def test_the_pipeline_executors_point_to_point_order_cannot_deadlock_on_nccl(schedule, stages, chunks):
    micro = 6 if stages == 3 else 4
    posted = dict(enumerate(zerokit.launch(_pipeline, stages, _pipeline_job(schedule, stages, chunks, micro))))
    # every call is a batch_isend_irecv on the pp group's communicator, the shapes' exchange and a lone op too
    assert all(op[3] != PAIR for calls in posted.values() for call in calls for op in call)
    assert replay(posted) > 0


def _planned(sched, lone_alone=False):
    """Every rank's posted calls as the executor posts them from the plan (no processes): each group one
    batch_isend_irecv on the pp group; ``lone_alone``: a group of one posted as a lone isend / irecv instead."""
    from zerokit.pipeline_parallel.p2p_plan import posting_plan, receiver_stage

    posted = {}
    for r in range(sched.ranks):
        calls = []
        for _, group in sorted(posting_plan(sched, r).items()):
            comm = PAIR if lone_alone and len(group) == 1 else "pp"
            calls.append([(kind, sched.rank_of(receiver_stage(m) if kind == "send" else m[1]), 1, comm)
                          for kind, m in group])
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


@pytest.mark.parametrize("name,chunks,p,m,mismatched,messages", [
    ("1f1b", 1, 2, 4, 6, 8), ("zb-h1", 1, 2, 4, 6, 8), ("interleaved", 2, 2, 4, 21, 24)])
def test_a_lone_isend_for_a_group_of_one_strands_most_messages(name, chunks, p, m, mismatched, messages):
    """Posting a group of one as a lone isend / irecv while the peer batches the same message: most messages of a
    step are on two communicators (the pipeline hang on NCCL); GPipe's groups are all of one, on both sides."""
    from zerokit.pipeline_parallel.schedules import schedule

    with pytest.raises(P2PCommunicatorMismatch) as e:
        replay(_planned(schedule(name, p, m, chunks), lone_alone=True))
    assert (e.value.mismatched, e.value.messages) == (mismatched, messages)
    assert replay(_planned(schedule("gpipe", p, m), lone_alone=True)) == 4 * m * (p - 1)  # GPipe: every message alone on both sides
