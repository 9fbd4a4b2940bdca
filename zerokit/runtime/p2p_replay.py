"""Replay point-to-point traffic as NCCL orders it, to find a deadlock on the CPU before a GPU does.

Lifecycle: a rank's point-to-point calls are recorded in the order they were posted —
:func:`recording` wraps ``dist.isend`` / ``dist.irecv`` / ``dist.batch_isend_irecv`` inside
one rank and yields the list it fills — then :func:`replay` plays every rank's list under
NCCL's rules and raises :class:`P2PDeadlock` if the traffic cannot finish.

The rules (NCCL, as torch's ProcessGroupNCCL uses it): a pair of ranks shares one
communicator and one stream, so each rank's operations with one peer run in the order it
posted them, sends and receives alike, and one of them finishes only together with its
match on the peer (a send with a receive, same bytes) — gloo instead matches sends and
receives independently, which is why an order that works on the CPU can hang a GPU. Calls
grouped by ``batch_isend_irecv`` (``ncclGroupStart/End``) are one unit per peer: its operations
run together, each matched on its own, and the next unit starts when all of them are done. At n = 2 a ring
round that posts ``irecv`` then ``isend`` separately on both ranks is the textbook cycle:
each rank's receive waits for a send queued behind the other's receive.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List, Tuple

import torch.distributed as dist

#: one posted operation: ("send" | "recv", peer's global rank, bytes)
Op = Tuple[str, int, int]


class P2PDeadlock(RuntimeError):
    """The recorded traffic cannot finish under one-stream-per-pair ordering."""


@contextlib.contextmanager
def recording():
    """Inside one rank: record every isend / irecv / batch_isend_irecv posted, as a list of calls (each a list
    of :data:`Op`); the real calls still run."""
    posted: List[List[Op]] = []
    real_isend, real_irecv, real_batch = dist.isend, dist.irecv, dist.batch_isend_irecv

    def op(kind, tensor, peer):
        return (kind, int(peer), tensor.numel() * tensor.element_size())

    def isend(tensor, dst=None, group=None, tag=0, **kw):
        posted.append([op("send", tensor, dst)])
        return real_isend(tensor, dst=dst, group=group, tag=tag, **kw)

    def irecv(tensor, src=None, group=None, tag=0, **kw):
        posted.append([op("recv", tensor, src)])
        return real_irecv(tensor, src=src, group=group, tag=tag, **kw)

    def batch_isend_irecv(p2p_op_list):
        posted.append([op("send" if p.op.__name__ == "isend" else "recv", p.tensor, p.peer) for p in p2p_op_list])
        return real_batch(p2p_op_list)

    dist.isend, dist.irecv, dist.batch_isend_irecv = isend, irecv, batch_isend_irecv
    try:
        yield posted
    finally:
        dist.isend, dist.irecv, dist.batch_isend_irecv = real_isend, real_irecv, real_batch


def replay(posted: Dict[int, List[List[Op]]]) -> int:
    """Play ``posted[rank]`` (that rank's calls in posting order) for every rank; return the number of operations
    that completed, or raise :class:`P2PDeadlock` naming what each stuck pair waits on."""
    # per (me, peer): my units with that peer, in posting order; a unit is the ops of one call to that peer,
    # each op as [kind, bytes, matched]
    queues: Dict[Tuple[int, int], List[List[list]]] = {}
    for rank, calls in posted.items():
        for call in calls:
            by_peer: Dict[int, List[list]] = {}
            for kind, peer, nbytes in call:
                by_peer.setdefault(peer, []).append([kind, nbytes, False])
            for peer, ops in by_peer.items():
                queues.setdefault((rank, peer), []).append(ops)
    completed = 0
    progress = True
    while progress:
        progress = False
        for (me, peer), mine in queues.items():
            theirs = queues.get((peer, me), [])
            if not (mine and theirs):
                continue
            # only the head unit of each side is running on the pair's stream; within it, a send meets the
            # peer's next receive (per direction, in posting order), of the same bytes
            send = next((op for op in mine[0] if op[0] == "send" and not op[2]), None)
            recv = next((op for op in theirs[0] if op[0] == "recv" and not op[2]), None)
            if send is not None and recv is not None:
                if send[1] != recv[1]:
                    raise P2PDeadlock(f"rank {me} sends {send[1]} B to rank {peer}, which receives {recv[1]} B: "
                                      f"the sizes of matching point-to-point calls differ")
                send[2] = recv[2] = True
                completed += 2
                progress = True
            for queue in (mine, theirs):
                if queue and all(op[2] for op in queue[0]):
                    queue.pop(0)
    stuck = {pair: q[0] for pair, q in queues.items() if q}
    if stuck:
        lines = [f"rank {me} waits on {_describe(unit)} with rank {peer}" for (me, peer), unit in sorted(stuck.items())]
        raise P2PDeadlock("point-to-point traffic deadlocks under one stream per pair (NCCL): " + "; ".join(lines))
    return completed


def _describe(unit: List[list]) -> str:
    return " + ".join(f"{kind} of {nbytes} B" for kind, nbytes, matched in unit if not matched)
