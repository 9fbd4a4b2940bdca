"""Traffic per rank under the ring algorithms (ZeRO §7): per collective, per ZeRO stage and step, and
the time a link takes."""
from __future__ import annotations

from fractions import Fraction
from typing import Sequence

from .model_states import padded_numel


RING_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "all_to_all")


def _exact(x: Fraction):
    return int(x) if x.denominator == 1 else float(x)


def ring_bytes_sent(op: str, payload_bytes: int, n: int, rank: int = 0, src: int = 0):
    """Bytes one rank sends for a collective under the ring algorithm.

    ``payload_bytes`` is the full tensor: the input of a reduce-scatter, the output of an
    all-gather. All-reduce = reduce-scatter + all-gather: 2(n−1)/n·S; each half (n−1)/n·S.
    A broadcast is a pipelined chain from ``src``: every rank but the last forwards S. An all-to-all
    (``payload_bytes`` its input) sends every other rank 1/n of it: (n−1)/n·S, no ring needed.
    """
    if n <= 1:
        return 0
    s = Fraction(int(payload_bytes))
    if op == "all_reduce":
        return _exact(2 * (n - 1) * s / n)
    if op in ("reduce_scatter", "all_gather"):
        return _exact((n - 1) * s / n)
    if op == "all_to_all":  # each rank keeps its own 1/n of the input and sends every other rank its 1/n
        return _exact((n - 1) * s / n)
    if op == "broadcast":
        last = (src - 1) % n
        return 0 if rank == last else int(s)
    if op == "send":
        return int(s)
    if op == "recv":
        return 0
    raise ValueError(f"op={op!r} has no ring formula; allowed: {', '.join(RING_OPS)}")


def ring_steps(op: str, n: int) -> int:
    """Send/recv rounds of the ring: n−1 for each half, 2(n−1) for all-reduce."""
    if op == "all_reduce":
        return 2 * (n - 1)
    if op in ("reduce_scatter", "all_gather"):
        return n - 1
    raise ValueError(f"op={op!r}: allowed all_reduce, reduce_scatter, all_gather")


def comm_bytes_per_step(stage: int, psi: int, n: int, bytes_per_element: int,
                        micro_batches: int = 1, units: Sequence[int] | None = None,
                        persistent_numel: int = 0, reshard_after_forward: bool = True):
    """Bytes a rank sends per optimizer step (ZeRO §7.2).

    DDP = ZeRO-1 = ZeRO-2 = 2(n−1)/n·psi·b; ZeRO-3 = 3(n−1)/n·psi·b (params gathered in
    forward and again in backward, grads reduce-scattered). With A micro-batches DDP
    (no_sync) and ZeRO-1 reduce once; ZeRO-2 and ZeRO-3 reduce-scatter every micro-batch,
    and ZeRO-3 gathers twice per micro-batch. Stages 1-3 move the padded buffers.
    Stage-3 persistent parameters are all-reduced like DDP's, once per micro-batch.
    Stage 3 with ``reshard_after_forward=False`` keeps each unit gathered from its
    forward to its backward: one gather per micro-batch, 2(n−1)/n·psi·b (ZeRO-2's traffic).
    """
    if n <= 1:
        return 0
    a = micro_batches
    b = bytes_per_element
    if stage == 0:
        return _exact(Fraction(2 * (n - 1) * psi * b, n))
    units = [psi - persistent_numel] if units is None else list(units)
    full = padded_numel(units, n)
    half = Fraction((n - 1) * full * b, n)
    if stage == 1:
        return _exact(2 * half)
    if stage == 2:
        return _exact(a * half + half)
    if stage == 3:
        persistent = Fraction(2 * (n - 1) * persistent_numel * b, n)
        gathers = 2 if reshard_after_forward else 1
        return _exact(a * ((gathers + 1) * half + persistent))
    raise ValueError(f"stage={stage!r} is not a ZeRO stage; allowed: 0, 1, 2, 3")


def zero_collective_bytes(stage: int, psi: int, n: int, bytes_per_element: int, micro_batches: int = 1,
                          units: Sequence[int] | None = None) -> dict:
    """:func:`comm_bytes_per_step` by collective: ``{"all_reduce" | "reduce_scatter" | "all_gather": bytes}``.

    DDP one all-reduce per step; ZeRO-1 a reduce-scatter and an all-gather; ZeRO-2 a
    reduce-scatter per micro-batch and one all-gather; ZeRO-3 two all-gathers and a
    reduce-scatter per micro-batch (ZeRO §7.2). The values sum to :func:`comm_bytes_per_step`.
    """
    if n <= 1:
        return {}
    a, b = micro_batches, bytes_per_element
    if stage == 0:
        return {"all_reduce": comm_bytes_per_step(0, psi, n, b)}
    units = [psi] if units is None else list(units)
    half = _exact(Fraction((n - 1) * padded_numel(units, n) * b, n))
    if stage == 1:
        return {"reduce_scatter": half, "all_gather": half}
    if stage == 2:
        return {"reduce_scatter": a * half, "all_gather": half}
    if stage == 3:
        return {"all_gather": 2 * a * half, "reduce_scatter": a * half}
    raise ValueError(f"stage={stage!r} is not a ZeRO stage; allowed: 0, 1, 2, 3")


def link_seconds(nbytes: float, messages: float, bandwidth: float, latency: float) -> float:
    """The α-β estimate of a transfer: messages·α + bytes/β (bandwidth in bytes per second)."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth={bandwidth!r} must be > 0 bytes per second")
    return messages * latency + nbytes / bandwidth


ALL_REDUCE_ALGORITHMS = ("ring", "tree")


def all_reduce_rounds(n: int, algorithm: str = "ring") -> int:
    """Latency-paying hops of one all-reduce: the ring's 2(n−1) rounds, or a tree's 2⌈log₂ n⌉ (up, then down)."""
    if n <= 1:
        return 0
    if algorithm == "ring":
        return ring_steps("all_reduce", n)
    if algorithm == "tree":
        return 2 * (n - 1).bit_length()
    raise ValueError(f"algorithm={algorithm!r}; allowed: {', '.join(ALL_REDUCE_ALGORITHMS)}")


def all_reduce_seconds(payload_bytes: float, n: int, alpha: float, beta: float, algorithm: str = "ring") -> dict:
    """The α-β time of one all-reduce of S bytes on n ranks, split into its latency and bandwidth terms.

    ``ring``: 2(n−1)·α + 2(n−1)/n·S/β — bandwidth-optimal, but the latency term grows
    linearly with n. ``tree``: NCCL's pipelined double binary tree (NCCL 2.4; Sanders et
    al. 2009): 2⌈log₂ n⌉·α + 2·S/β — the payload reduced up a tree and broadcast down,
    pipelined in chunks and split over two trees so each rank moves about S each way; the
    latency term grows with log n. Crossover: the tree wins when S < n·β·α·(n − 1 − ⌈log₂ n⌉),
    the ring when larger (the bandwidth terms differ by n/(n−1)). ``alpha`` in seconds per
    hop, ``beta`` in bytes per second. Returns ``latency_s``, ``bandwidth_s``, ``total_s``.
    """
    if beta <= 0 or alpha < 0:
        raise ValueError(f"alpha={alpha!r} must be >= 0 seconds and beta={beta!r} > 0 bytes per second")
    if n <= 1:
        return {"latency_s": 0.0, "bandwidth_s": 0.0, "total_s": 0.0}
    latency = all_reduce_rounds(n, algorithm) * alpha
    volume = ring_bytes_sent("all_reduce", payload_bytes, n) if algorithm == "ring" else 2 * payload_bytes
    return {"latency_s": latency, "bandwidth_s": volume / beta, "total_s": latency + volume / beta}
