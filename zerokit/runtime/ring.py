"""The ring collectives on point-to-point send/recv, so the rounds and the bytes are visible.

Ring all-reduce = ring reduce-scatter + ring all-gather (Patarasuk & Yuan 2009, the
bandwidth-optimal all-reduce; ZeRO §7). The tensor is cut into n chunks; in each of
n−1 rounds a rank sends one chunk to its right neighbour and receives one from its
left, so each half sends (n−1)/n of the bytes and the all-reduce 2(n−1) rounds and
2(n−1)/n of them (:func:`zerokit.theory.ring_bytes_sent`, :func:`~zerokit.theory.ring_steps`).

Which chunk moves when is data, :func:`ring_schedule`, and the functions here run
exactly that schedule. Each call adds one :class:`zerokit.comm.CommRecord`
(``algorithm="ring"``) to :func:`zerokit.comm.ledger`, whose ``sent_bytes`` are the
bytes it really handed to send — the one traffic quantity measured on the wire.
Only SUM is supported.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d  # P2POp accepts only these two functions

from .. import theory
from . import clock as device_clock, link
from .comm import CommRecord, new_record

RING_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")

#: ``on_step(round_index, send_chunk_index, recv_chunk_index, phase_name)``, called once per round
OnStep = Callable[[int, int, int, str], None]


class RingRound(NamedTuple):
    """One round of the ring for one rank: the chunk it sends right and the chunk it receives from the left."""

    round: int
    send_chunk: int
    recv_chunk: int


def ring_schedule(op: str, n: int, rank: int) -> list:
    """The rounds ``rank`` runs in a ring ``op`` over ``n`` ranks, as :class:`RingRound` tuples.

    Reduce-scatter, round k: send chunk (rank−k−1) mod n, receive chunk (rank−k−2) mod n
    and add it in; after n−1 rounds rank r holds the full sum of chunk r (torch's
    ownership). All-gather, round k: send chunk (rank−k) mod n, receive (rank−k−1) mod n.
    All-reduce is the reduce-scatter's rounds followed by the all-gather's, numbered on:
    rounds below n−1 reduce, the rest gather. Pure data; no process group needed.
    """
    if op not in RING_COLLECTIVES:
        raise ValueError(f"op={op!r} has no ring schedule; allowed: {', '.join(RING_COLLECTIVES)}")
    if n < 1:
        raise ValueError(f"n={n!r}: the ring needs at least one rank")
    if not 0 <= rank < n:
        raise ValueError(f"rank={rank!r} is outside a ring of n={n} ranks")
    half = theory.ring_steps("reduce_scatter", n)
    reduce = [RingRound(k, (rank - k - 1) % n, (rank - k - 2) % n) for k in range(half)]
    gather = [RingRound(k, (rank - k) % n, (rank - k - 1) % n) for k in range(half)]
    if op == "reduce_scatter":
        return reduce
    if op == "all_gather":
        return gather
    return reduce + [RingRound(half + k, s, r) for k, s, r in gather]


def ring_phase(op: str, n: int, round_index: int) -> str:
    """Which half of ``op`` a round belongs to: "reduce_scatter" or "all_gather"."""
    if op == "all_reduce":
        return "reduce_scatter" if round_index < theory.ring_steps("reduce_scatter", n) else "all_gather"
    if op in RING_COLLECTIVES:
        return op
    raise ValueError(f"op={op!r} has no ring schedule; allowed: {', '.join(RING_COLLECTIVES)}")


# --- the executor ------------------------------------------------------------------------

class _Ring:
    """This rank's place in the ring: group rank, size, and the global ranks of its neighbours."""

    def __init__(self, group):
        self.group = group
        if group is None and not dist.is_initialized():  # outside a launch: a world of one
            self.n, self.rank = 1, 0
        else:
            self.n = dist.get_world_size(group)
            self.rank = dist.get_rank(group)
        self.right = self._global((self.rank + 1) % self.n)
        self.left = self._global((self.rank - 1) % self.n)

    def _global(self, group_rank: int) -> int:
        return dist.get_global_rank(self.group, group_rank) if self.group is not None else group_rank


def _check_sum(op) -> None:
    if op != dist.ReduceOp.SUM:
        raise ValueError(f"op={op!r}: the ring collectives support only ReduceOp.SUM")



def _begin(op: str, tensor: torch.Tensor, numel: int, ring: _Ring, tag: str) -> CommRecord:
    return new_record(op, tensor, numel * tensor.element_size(), ring.group, False, tag, algorithm="ring")


def _end(record: CommRecord, bytes_sent: int) -> None:
    clock = link.clock()
    if clock is not None:  # under an emulated link the ring completes when the link has carried its bytes
        clock.book(record)
        clock.hold(record)
    record.sent_bytes = bytes_sent
    record.t_end = device_clock.mark()
    record.add_blocked(record.t_launch, record.t_end)


def _run_rounds(chunks: torch.Tensor, op: str, ring: _Ring, on_step: Optional[OnStep],
                rounds: list) -> int:
    """Run ``rounds`` on the rows of ``chunks`` (n × chunk, contiguous), in place; return bytes sent.

    A reduce round adds the received chunk into its row; a gather round receives into the row.
    The isend and irecv of a round are posted as one ``batch_isend_irecv`` and both waited, so no
    rank blocks on a send its neighbour has not yet matched, on gloo or NCCL.
    """
    sent = 0
    incoming = torch.empty_like(chunks[0])
    for step in rounds:
        phase_name = ring_phase(op, ring.n, step.round)
        if on_step is not None:
            on_step(step.round, step.send_chunk, step.recv_chunk, phase_name)
        reducing = phase_name == "reduce_scatter"
        target = incoming if reducing else chunks[step.recv_chunk]
        outgoing = chunks[step.send_chunk]
        # one group call, as torch's pipelining does: on NCCL a pair of ranks shares one stream, and at n = 2 a
        # separate irecv-then-isend on both ranks is a cycle (zerokit.runtime.p2p_replay finds it)
        works = dist.batch_isend_irecv([dist.P2POp(c10d.isend, outgoing, ring.right, group=ring.group),
                                        dist.P2POp(c10d.irecv, target, ring.left, group=ring.group)])
        for work in works:
            work.wait()
        sent += outgoing.numel() * outgoing.element_size()
        if reducing:
            chunks[step.recv_chunk].add_(incoming)
    return sent


@torch.no_grad()
def ring_reduce_scatter(output: torch.Tensor, input: torch.Tensor, group=None,
                        on_step: Optional[OnStep] = None, *, op=dist.ReduceOp.SUM, tag: str = "") -> None:
    """Sum ``input`` (n equal chunks) over the group and leave chunk ``rank`` in ``output``.

    Equals ``dist.reduce_scatter_single``; n−1 rounds, (n−1)/n of ``input``'s bytes sent.
    ``input`` is not modified: the partial sums accumulate in a work copy.
    """
    _check_sum(op)
    ring = _Ring(group)
    if input.numel() != ring.n * output.numel():
        raise ValueError(f"ring_reduce_scatter: input has {input.numel()} elements, expected output.numel() * "
                         f"group size = {output.numel()} * {ring.n}; pad input to a multiple of the group size")
    if input.dtype != output.dtype:
        raise ValueError(f"ring_reduce_scatter: input is {input.dtype} but output is {output.dtype}")
    record = _begin("reduce_scatter", input, input.numel(), ring, tag)
    chunks = input.detach().reshape(ring.n, output.numel()).clone()
    sent = 0
    if ring.n > 1 and output.numel() > 0:
        sent = _run_rounds(chunks, "reduce_scatter", ring, on_step,
                           ring_schedule("reduce_scatter", ring.n, ring.rank))
    output.copy_(chunks[ring.rank].view_as(output))
    _end(record, sent)


@torch.no_grad()
def ring_all_gather(output: torch.Tensor, input: torch.Tensor, group=None,
                    on_step: Optional[OnStep] = None, *, tag: str = "") -> None:
    """Gather every rank's ``input`` into ``output`` (n chunks, by group rank).

    Equals ``dist.all_gather_single``; n−1 rounds, (n−1)/n of ``output``'s bytes sent.
    """
    ring = _Ring(group)
    if output.numel() != ring.n * input.numel():
        raise ValueError(f"ring_all_gather: output has {output.numel()} elements, expected input.numel() * "
                         f"group size = {input.numel()} * {ring.n}")
    if input.dtype != output.dtype:
        raise ValueError(f"ring_all_gather: input is {input.dtype} but output is {output.dtype}")
    record = _begin("all_gather", output, output.numel(), ring, tag)
    direct = output.is_contiguous()
    flat = output.view(-1) if direct else torch.empty(output.numel(), dtype=output.dtype, device=output.device)
    chunks = flat.view(ring.n, input.numel())
    chunks[ring.rank].copy_(input.detach().reshape(-1))
    sent = 0
    if ring.n > 1 and input.numel() > 0:
        sent = _run_rounds(chunks, "all_gather", ring, on_step, ring_schedule("all_gather", ring.n, ring.rank))
    if not direct:
        output.copy_(flat.view_as(output))
    _end(record, sent)


@torch.no_grad()
def ring_all_reduce(tensor: torch.Tensor, group=None, on_step: Optional[OnStep] = None, *,
                    op=dist.ReduceOp.SUM, tag: str = "") -> None:
    """Sum ``tensor`` over the group in place: ring reduce-scatter, then ring all-gather.

    Any numel works: a flat copy is zero-padded to a multiple of n, and ``sent_bytes``
    counts the padding, 2(n−1)/n of the padded bytes. Equals ``dist.all_reduce`` up to
    fp32 rounding (the summation order differs).
    """
    _check_sum(op)
    ring = _Ring(group)
    record = _begin("all_reduce", tensor, tensor.numel(), ring, tag)
    shard = theory.shard_numel([tensor.numel()], ring.n)
    flat = torch.zeros(ring.n * shard, dtype=tensor.dtype, device=tensor.device)
    flat[:tensor.numel()].copy_(tensor.detach().reshape(-1))
    sent = 0
    if ring.n > 1 and shard > 0:
        sent = _run_rounds(flat.view(ring.n, shard), "all_reduce", ring, on_step,
                           ring_schedule("all_reduce", ring.n, ring.rank))
    tensor.copy_(flat[:tensor.numel()].view_as(tensor))
    _end(record, sent)
