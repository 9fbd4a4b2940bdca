"""When each pipeline rank posts its sends and receives, so that NCCL's ordering cannot deadlock them.

The executor posts every send and receive as a ``batch_isend_irecv`` (a single operation
too, as torch's pipelining does): on NCCL a batch runs on its group's communicator and a
lone ``isend`` / ``irecv`` on a communicator of the two ranks alone, and a message posted
on one by its sender and on the other by its receiver never finishes. On the group's
communicator a rank's calls run on one stream, in the order it posted them, with every
peer: one call at a time, and a send finishes only with its matching receive. Two ranks
that each post a send to the other first wait on each other for ever — 1F1B's SEND_B
against its peer's SEND_F — and so do three that each send to the next first —
interleaved 1F1B's chunks around the ring at p ≥ 3 (:mod:`zerokit.runtime.p2p_replay`
finds such cycles on the CPU). torch's pipelining avoids them by posting, at each time
step, the sends and the receives the neighbours do at the same time as one
``batch_isend_irecv``. This plan does the same from the schedule alone, for every schedule:

1. **one order of messages** (:func:`message_order`): the schedule is played without
   processes, each rank running its actions until it reaches a receive whose message has
   not been sent yet, rank after rank. The order in which the messages are sent is causal
   (a message comes after everything its sender did before it) and each sender's own order;
2. **every rank posts its messages in that order** (:func:`posting_plan`), with all its
   peers at once: a SEND is posted together with the receives that come before it in the
   order and are not posted yet (one group); a RECV posts the receives up to its own.
   Receives posted early only hold a buffer; a send is never posted before the compute
   that produced it, because the order is causal.

With every rank posting in the same order, the earliest unfinished message is in the
running call of both its sender and its receiver, so it finishes, and so on to the last.
The executor (:mod:`.executor`) follows the plan; ``tests/runtime/test_p2p_replay.py`` replays
every schedule under NCCL's rules.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .actions import Action, Schedule

#: one message between stages: ("F" | "B", the stage that sends it, micro-batch)
Message = Tuple[str, int, int]


def message_of(a: Action) -> Optional[Message]:
    """The message a SEND or RECV action carries (None for compute)."""
    if a.kind == "SEND_F":
        return ("F", a.stage, a.micro)
    if a.kind == "RECV_F":
        return ("F", a.stage - 1, a.micro)
    if a.kind == "SEND_B":
        return ("B", a.stage, a.micro)
    if a.kind == "RECV_B":
        return ("B", a.stage + 1, a.micro)
    return None


def receiver_stage(message: Message) -> int:
    kind, stage, _ = message
    return stage + 1 if kind == "F" else stage - 1


def message_order(schedule: Schedule) -> List[Message]:
    """Every message of a step in one causal order (see the module docstring); raises if the schedule itself
    cannot finish (a receive no rank ever sends)."""
    actions = schedule.actions
    position = [0] * schedule.ranks
    sent: set = set()
    order: List[Message] = []
    while any(position[r] < len(actions[r]) for r in range(schedule.ranks)):
        moved = False
        for r in range(schedule.ranks):
            while position[r] < len(actions[r]):
                a = actions[r][position[r]]
                message = message_of(a)
                if a.kind.startswith("RECV") and message not in sent:
                    break
                if a.kind.startswith("SEND"):
                    sent.add(message)
                    order.append(message)
                position[r] += 1
                moved = True
        if not moved:
            stuck = {r: str(actions[r][position[r]]) for r in range(schedule.ranks) if position[r] < len(actions[r])}
            raise ValueError(f"schedule {schedule.name!r} cannot finish: each rank waits for a message no rank "
                             f"sends first ({stuck})")
    return order


def posting_plan(schedule: Schedule, rank: int) -> Dict[int, List[Tuple[str, Message]]]:
    """For each SEND/RECV action of ``rank`` (by its index in ``schedule.actions[rank]``), the operations to post
    there as one group, in order: ``("recv", message)``… then, for a SEND, ``("send", message)``. A RECV whose
    message was posted earlier has no entry."""
    mine: List[Message] = []  # this rank's messages with every peer, in the one order
    for message in message_order(schedule):
        sender, receiver = schedule.rank_of(message[1]), schedule.rank_of(receiver_stage(message))
        if rank in (sender, receiver) and sender != receiver:
            mine.append(message)
    index = {m: i for i, m in enumerate(mine)}
    posted = 0  # how many of them this rank has posted
    plan: Dict[int, List[Tuple[str, Message]]] = {}
    for i, a in enumerate(schedule.actions[rank]):
        message = message_of(a)
        if message is None or message not in index:
            continue
        at = index[message]
        if at < posted:
            continue  # a receive posted early, with an earlier send
        group = []
        for earlier in mine[posted:at]:
            if schedule.rank_of(earlier[1]) == rank:  # cannot happen for a causal order: say so if it does
                raise AssertionError(f"rank {rank}: {a} would post before its own earlier send {earlier}")
            group.append(("recv", earlier))
        group.append(("send" if a.kind.startswith("SEND") else "recv", message))
        posted = at + 1
        plan[i] = group
    return plan
