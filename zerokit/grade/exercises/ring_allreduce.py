"""Exercise 01: the ring all-reduce from send/recv (Patarasuk & Yuan; ZeRO §7).

Interface: ``ring_all_reduce(tensor, group=None)`` sums ``tensor`` over the ranks in
place, using only point-to-point calls. Graded on 2 ranks (a 3×4 tensor) and on 3 ranks
(10 elements, which 3 does not divide): the sum on every rank, no collective used, the
bytes each rank sends against :func:`zerokit.theory.ring_bytes_sent` and the rounds
against :func:`zerokit.theory.ring_steps`.
"""
from __future__ import annotations

import torch

from ... import theory
from ..core import Check, Exercise, Fail, Scenario

NAME = "ring_all_reduce"


def _run(shape):
    def fn(ctx, ns, probe):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(10 + ctx.rank))
        t = x.clone()
        with probe.phase("ring"):
            ns[NAME](t)
        return {"input": x, "output": t, "calls": probe.calls()}
    return fn


def _chunks_correct(out: torch.Tensor, expected: torch.Tensor, n: int) -> list:
    """Which of the n chunks of the flattened, padded tensor hold the full sum."""
    shard = -(-expected.numel() // n)
    a = torch.zeros(n * shard)
    b = torch.zeros(n * shard)
    a[:out.numel()], b[:expected.numel()] = out.reshape(-1), expected.reshape(-1)
    return [bool(torch.allclose(a[k * shard:(k + 1) * shard], b[k * shard:(k + 1) * shard], atol=1e-5))
            for k in range(n)]


def _judge_sum(results, ns):
    n = len(results)
    expected = sum(r["input"] for r in results)
    for rank, r in enumerate(results):
        out = r["output"]
        if out.shape != expected.shape:
            raise Fail(f"rank {rank}'s tensor changed shape to {tuple(out.shape)}: sum into the tensor you were "
                       f"given, in place (tensor.copy_(...) at the end)", tuple(expected.shape), tuple(out.shape),
                       rank)
        diff = float((out - expected).abs().max())
        if diff <= 1e-5:
            continue
        if torch.equal(out, r["input"]):
            raise Fail(f"rank {rank}'s tensor is unchanged: nothing was summed into it (the result must be written "
                       f"back into `tensor`, in place)", rank=rank)
        if torch.allclose(out, expected / n, atol=1e-5):
            raise Fail(f"every element is the mean, not the sum (max |Δ| = {diff:.3g}): all-reduce sums; "
                       f"averaging is DDP's business", rank=rank)
        good = _chunks_correct(out, expected, n)
        if sum(good) == 1:
            k = good.index(True)
            raise Fail(f"on rank {rank} only chunk {k} of {n} holds the full sum: the reduce-scatter half worked, "
                       f"the all-gather half — n−1 more rounds that pass each finished chunk around the ring — is "
                       f"missing", f"all {n} chunks summed", f"chunk {k} only", rank,
                       hint="after the reduce-scatter rank r owns one finished chunk; in all-gather round k it "
                            "sends the finished chunk it holds and overwrites the one it receives")
        worst = int((out - expected).abs().reshape(-1).argmax())
        raise Fail(f"rank {rank}'s element {worst} is {float(out.reshape(-1)[worst]):.6g}, the sum over the ranks "
                   f"is {float(expected.reshape(-1)[worst]):.6g} (max |Δ| = {diff:.3g}; chunks holding the full "
                   f"sum: {[k for k, g in enumerate(good) if g]})", 0.0, diff, rank)
    return f"every rank holds the sum of the {n} inputs (shape {tuple(expected.shape)}); max |Δ| ≤ 1e-5"


def _judge_send_recv_only(results, ns):
    for rank, r in enumerate(results):
        other = sorted({c["op"] for c in r["calls"]} - {"send", "recv"})
        if other:
            raise Fail(f"rank {rank} called the collective {', '.join(other)}: the exercise is to build the "
                       f"all-reduce from point-to-point send/recv (isend/irecv)", "send/recv only",
                       ", ".join(other), rank)
    return "only send/recv (isend/irecv) were called"


def _sent(r) -> int:
    return sum(c["nbytes"] for c in r["calls"] if c["op"] == "send")


def _judge_bytes(results, ns):
    n = len(results)
    size = results[0]["input"].numel() * results[0]["input"].element_size()
    padded = theory.padded_numel([results[0]["input"].numel()], n) * results[0]["input"].element_size()
    low, high = theory.ring_bytes_sent("all_reduce", size, n), theory.ring_bytes_sent("all_reduce", padded, n)
    sent = [_sent(r) for r in results]
    for rank, s in enumerate(sent):
        if low <= s <= high:
            continue
        if s == (n - 1) * size:
            why = (f"that is (N−1)·S: the whole tensor to each of the other {n - 1} ranks. The ring sends one "
                   f"chunk of S/N per round, 2(N−1) rounds")
        elif s > high and max(sent) > 1.5 * min(sent):
            why = (f"the ranks send unequal amounts ({sent}): one rank gathers and sends back (a star); in the "
                   f"ring every rank sends the same")
        elif s == 0:
            why = "this rank sent nothing"
        else:
            why = "the ring sends one chunk of ⌈S/N⌉ elements per round, 2(N−1) rounds"
        raise Fail(f"rank {rank} sent {s:,} B for an all-reduce of S = {size:,} B on N = {n} ranks; {why}",
                   f"2(N−1)/N·S = {low:g} to {high:g} B (with padding)", f"{s:,} B", rank)
    return (f"each rank sent {sent[0]:,} B = 2(N−1)/N·S on N = {n} "
            f"(theory.ring_bytes_sent: {low:g} B, {high:g} B padded)")


def _judge_rounds(results, ns):
    n = len(results)
    expected = theory.ring_steps("all_reduce", n)
    for rank, r in enumerate(results):
        sends = sum(1 for c in r["calls"] if c["op"] == "send")
        if sends != expected:
            raise Fail(f"rank {rank} sent {sends} messages on N = {n} ranks: the ring runs N−1 rounds of "
                       f"reduce-scatter and N−1 of all-gather, one send and one receive each", expected, sends, rank)
    return f"{expected} rounds = 2(N−1) on N = {n}, one send each"


CONCEPT_SUM = ("the ring all-reduce is a reduce-scatter (N−1 rounds: add the chunk received from the left) followed "
               "by an all-gather (N−1 rounds: pass the finished chunks on)")
EXERCISE = Exercise(
    key="01_ring_allreduce",
    title="Ring all-reduce from send/recv",
    minutes=40,
    needs=(NAME,),
    scenarios={"two": Scenario("two", 2, _run((3, 4))), "three": Scenario("three", 3, _run((10,)))},
    checks=[
        Check("sum-2-ranks", 2, "two", _judge_sum, CONCEPT_SUM),
        Check("sum-3-ranks-uneven", 2, "three", _judge_sum,
              "pad a flat copy to a multiple of N so that it splits into N equal chunks, then copy the first "
              "numel elements back"),
        Check("send-recv-only", 1, "three", _judge_send_recv_only,
              "torch.distributed.isend / irecv move one tensor between two ranks; the collectives are built "
              "from them"),
        Check("bytes-per-rank", 3, "three", _judge_bytes,
              "a rank sends one chunk (S/N bytes) per round: 2(N−1)/N·S in all, the same on every rank and "
              "almost independent of N (zerokit.theory.ring_bytes_sent)"),
        Check("rounds", 2, "three", _judge_rounds, "2(N−1) rounds: zerokit.theory.ring_steps('all_reduce', N)"),
    ],
    hints=[
        "A ring all-reduce is a reduce-scatter followed by an all-gather, each N − 1 rounds in which every rank passes "
        "one chunk to its right-hand neighbour and takes one from its left: each rank sends 2(N − 1)/N of the tensor "
        "in all, however many ranks there are.",
        "Work on a flat copy of the tensor padded with zeros to a multiple of N, viewed as N equal chunks. Rank r only "
        "talks to its neighbours: it sends to rank (r + 1) mod N and receives from rank (r − 1) mod N.",
        "Reduce-scatter: in round k, from 0 to N − 2, rank r sends chunk (r − k − 1) mod N and adds what it receives "
        "into chunk (r − k − 2) mod N; after N − 1 rounds rank r holds the full sum of its own chunk r. All-gather: in "
        "round k rank r sends its finished chunk (r − k) mod N and receives chunk (r − k − 1) mod N straight into "
        "place.",
        "A blocking send waits for its receive: if every rank sends first, or every rank receives first, nobody moves. "
        "Even ranks send then receive, odd ranks receive then send, and no cycle of waits forms. Posting every receive "
        "first with irecv happens to work on gloo, but hangs on NCCL, where a receive waits on its peer's stream.",
        "The code:\n"
        "def round_trip(outgoing, into):  # even ranks send first\n"
        "    if rank % 2 == 0:\n"
        "        dist.send(outgoing, dst=right, group=group)\n"
        "        dist.recv(into, src=left, group=group)\n"
        "    else:\n"
        "        dist.recv(into, src=left, group=group)\n"
        "        dist.send(outgoing, dst=right, group=group)\n"
        "shard = -(-tensor.numel() // n)\n"
        "flat = torch.zeros(n * shard, dtype=tensor.dtype)\n"
        "flat[:tensor.numel()] = tensor.reshape(-1)\n"
        "chunks, incoming = flat.view(n, shard), torch.empty(shard, dtype=tensor.dtype)\n"
        "for k in range(n - 1):  # reduce-scatter\n"
        "    round_trip(chunks[(rank - k - 1) % n], incoming)\n"
        "    chunks[(rank - k - 2) % n] += incoming\n"
        "for k in range(n - 1):  # all-gather\n"
        "    round_trip(chunks[(rank - k) % n], chunks[(rank - k - 1) % n])\n"
        "tensor.copy_(flat[:tensor.numel()].view_as(tensor))",
    ],
)
