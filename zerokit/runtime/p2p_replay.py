"""Replay point-to-point traffic as NCCL orders it, to find a deadlock on the CPU before a GPU does.

Lifecycle: a rank's point-to-point calls are recorded in the order they were posted —
:func:`recording` wraps ``dist.send`` / ``dist.recv`` / ``dist.isend`` / ``dist.irecv`` /
``dist.batch_isend_irecv`` inside one rank and yields the list it fills, each operation
with the communicator NCCL posts it on — then :func:`replay` plays every rank's list under
NCCL's rules and raises :class:`P2PDeadlock` if the traffic cannot finish.

The rules (NCCL, as torch's ProcessGroupNCCL uses it):

1. **Communicators.** A lone ``send`` / ``recv`` / ``isend`` / ``irecv`` runs on a
   communicator of its two ranks alone (:data:`PAIR`); the operations of one
   ``batch_isend_irecv`` run on their group's communicator. A message finishes only when
   its sender and its receiver post it on the same communicator, so a lone ``isend``
   against a peer's batched ``irecv`` waits for ever: :class:`P2PCommunicatorMismatch`
   counts such messages (the k-th send from a to b is the message the k-th receive at b
   from a means to take).
2. **One stream per communicator.** Each rank's calls on one communicator run in the
   order it posted them (a pair communicator: its calls with that peer; a group's: its
   calls with every peer of the group), sends and receives alike; one call runs at a time,
   and the next starts when all of its operations are done. Within a call (one
   ``ncclGroupStart/End``) the operations run together, and each finishes only together
   with its match on the peer — a send with the peer's next receive from this rank in the
   call running on the peer's side, of the same bytes.

Gloo instead matches sends and receives independently, which is why an order that works
on the CPU can hang a GPU. At n = 2 a ring round that posts ``irecv`` then ``isend``
separately on both ranks is the textbook cycle: each rank's receive waits for a send
queued behind the other's receive.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List, Tuple

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

#: one posted operation: ("send" | "recv", peer's global rank, bytes, communicator)
Op = Tuple[str, int, int, str]
#: the communicator of a lone send / recv / isend / irecv: the two ranks' own
PAIR = "pair"


class P2PDeadlock(RuntimeError):
    """The recorded traffic cannot finish under NCCL's ordering."""


class P2PCommunicatorMismatch(P2PDeadlock):
    """Messages whose sender and receiver post them on different communicators (NCCL never matches them)."""

    def __init__(self, message: str, mismatched: int, messages: int):
        super().__init__(message)
        self.mismatched = mismatched
        self.messages = messages


def communicator_of(group) -> str:
    """The name of ``group``'s communicator as a batch on it is recorded (None: the default group's)."""
    group = group if group is not None else c10d._get_default_group()
    return f"group {group.group_name} {dist.get_process_group_ranks(group)}"


@contextlib.contextmanager
def recording():
    """Inside one rank: record every point-to-point call posted, as a list of calls (each a list of :data:`Op`);
    the real calls still run."""
    posted: List[List[Op]] = []
    real = {name: getattr(dist, name) for name in ("send", "recv", "isend", "irecv", "batch_isend_irecv")}

    def op(kind, tensor, peer, comm):
        return (kind, int(peer), tensor.numel() * tensor.element_size(), comm)

    def lone(name, kind, peer_key):
        def call(tensor, *args, **kw):
            peer = kw.get(peer_key, args[0] if args else None)
            if peer is None:  # given by its rank in the group
                peer = dist.get_global_rank(kw.get("group"), kw[f"group_{peer_key}"])
            posted.append([op(kind, tensor, peer, PAIR)])
            return real[name](tensor, *args, **kw)
        return call

    def batch_isend_irecv(p2p_op_list):
        comm = communicator_of(p2p_op_list[0].group)
        posted.append([op("send" if p.op is c10d.isend else "recv", p.tensor, p.peer, comm) for p in p2p_op_list])
        return real["batch_isend_irecv"](p2p_op_list)

    wrapped = {"send": lone("send", "send", "dst"), "recv": lone("recv", "recv", "src"),
               "isend": lone("isend", "send", "dst"), "irecv": lone("irecv", "recv", "src"),
               "batch_isend_irecv": batch_isend_irecv}
    for name, fn in wrapped.items():
        setattr(dist, name, fn)
    try:
        yield posted
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)


def check_communicators(posted: Dict[int, List[List[Op]]]) -> int:
    """Raise :class:`P2PCommunicatorMismatch` if a message's sender and receiver post it on different
    communicators; return the number of messages (sends)."""
    sends: Dict[Tuple[int, int], List[str]] = {}  # (sender, receiver) -> communicators, in posting order
    recvs: Dict[Tuple[int, int], List[str]] = {}
    for rank, calls in posted.items():
        for call in calls:
            for kind, peer, _, comm in call:
                key = (rank, peer) if kind == "send" else (peer, rank)
                (sends if kind == "send" else recvs).setdefault(key, []).append(comm)
    messages = sum(len(v) for v in sends.values())
    wrong = [(pair, k, s, r) for pair, comms in sorted(sends.items())
             for k, (s, r) in enumerate(zip(comms, recvs.get(pair, []))) if s != r]
    if wrong:
        (a, b), k, s, r = wrong[0]
        raise P2PCommunicatorMismatch(
            f"{len(wrong)} of {messages} messages are posted on different communicators by their sender and "
            f"receiver, and NCCL never matches them (a lone isend / irecv runs on the pair's own communicator, a "
            f"batch_isend_irecv on its group's): first, message {k} from rank {a} to rank {b} is sent on "
            f"{_name(s)} and received on {_name(r)}", len(wrong), messages)
    return messages


def _name(comm: str) -> str:
    return "the pair's communicator (a lone isend / irecv)" if comm == PAIR else f"{comm} (batch_isend_irecv)"


def replay(posted: Dict[int, List[List[Op]]]) -> int:
    """Play ``posted[rank]`` (that rank's calls in posting order) for every rank; return the number of operations
    that completed, or raise :class:`P2PDeadlock` naming what each stuck stream waits on."""
    check_communicators(posted)
    # per stream (rank, communicator): the rank's calls on it in posting order, each op as [kind, peer, bytes, matched]
    streams: Dict[Tuple[int, tuple], List[List[list]]] = {}
    for rank, calls in posted.items():
        for call in calls:
            units: Dict[tuple, List[list]] = {}  # a lone call has one op, so one unit; a batch's one communicator
            for kind, peer, nbytes, comm in call:
                units.setdefault(_stream_comm(rank, peer, comm), []).append([kind, peer, nbytes, False])
            for comm, ops in units.items():
                streams.setdefault((rank, comm), []).append(ops)
    completed = 0
    progress = True
    while progress:
        progress = False
        for (me, comm), mine in streams.items():
            if not mine:
                continue
            for send in [op for op in mine[0] if op[0] == "send" and not op[3]]:
                if send is not _first(mine[0], "send", send[1]):
                    continue  # within a call, sends to one peer match in posting order
                theirs = streams.get((send[1], comm), [])
                recv = _first(theirs[0], "recv", me) if theirs else None
                if recv is None:
                    continue
                if send[2] != recv[2]:
                    raise P2PDeadlock(f"rank {me} sends {send[2]} B to rank {send[1]}, which receives {recv[2]} B: "
                                      f"the sizes of matching point-to-point calls differ")
                send[3] = recv[3] = True
                completed += 2
                progress = True
        for queue in streams.values():
            while queue and all(op[3] for op in queue[0]):
                queue.pop(0)
    stuck = {stream: q[0] for stream, q in streams.items() if q}
    if stuck:
        lines = [f"rank {me} waits on {_describe(unit)} on {_comm_text(comm)}"
                 for (me, comm), unit in sorted(stuck.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))]
        raise P2PDeadlock("point-to-point traffic deadlocks under one stream per communicator (NCCL): "
                          + "; ".join(lines))
    return completed


def _stream_comm(rank: int, peer: int, comm: str) -> tuple:
    return (PAIR, min(rank, peer), max(rank, peer)) if comm == PAIR else (comm,)


def _first(unit: List[list], kind: str, peer: int):
    return next((op for op in unit if op[0] == kind and op[1] == peer and not op[3]), None)


def _comm_text(comm: tuple) -> str:
    return f"the pair communicator of ranks {comm[1]} and {comm[2]}" if comm[0] == PAIR else comm[0]


def _describe(unit: List[list]) -> str:
    return " + ".join(f"{kind} of {nbytes} B {'to' if kind == 'send' else 'from'} rank {peer}"
                      for kind, peer, nbytes, matched in unit if not matched)
