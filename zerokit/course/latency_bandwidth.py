"""Lesson 01's α-β model: time the ring all-reduce, fit latency per round and bandwidth, draw both.

:func:`time_ring_all_reduce` runs real jobs: :func:`zerokit.ring.ring_all_reduce` of fp32
tensors on each world size through :func:`zerokit.launch`, the fastest of a few calls per
payload, the bytes the ring handed to send read from the communication ledger
(``sent_bytes``: measured, since zerokit's ring ran the collective).
:func:`fit_latency_bandwidth` fits t = rounds·α + bytes/β to those points, with rounds and
bytes from the ring formulas of :mod:`zerokit.theory`; :func:`modelled_seconds` splits one
call's time into the two terms and :func:`latency_bandwidth_figure` draws the measurements
against the fit. :func:`all_reduce_scaling_figure` extrapolates a link's α and β — the fit's,
or the numbers a reader types for a GPU link — to many ranks, ring against tree
(:func:`zerokit.theory.communication.all_reduce_seconds`): a formula, drawn as one.
"""
from __future__ import annotations

import math
import time
from typing import Iterable, Sequence

from .. import theory
from ..runtime import comm
from ..runtime.launch import launch
from ..runtime.ring import ring_all_reduce
from ..theory.communication import all_reduce_seconds
from .figures import legend_outside, new_figure, plain_log_ticks, TITLE_SIZE


def _time_ring_all_reduce(ctx, payload_bytes: Sequence[int], repeats: int) -> list:
    """On each rank: the fastest of ``repeats`` ring all-reduces per payload, and the bytes it sent (measured)."""
    import torch
    import torch.distributed as dist

    out = []
    for size in payload_bytes:
        x = torch.ones(size // 4, device=ctx.device)
        ring_all_reduce(x)  # warm-up: the first call of a size allocates
        best = math.inf
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            ring_all_reduce(x)
            if x.is_cuda:
                torch.cuda.synchronize(x.device)
            best = min(best, time.perf_counter() - start)
        record = comm.ledger().records[-1]
        out.append({"payload_bytes": record.payload_bytes, "sent_bytes": record.sent_bytes, "seconds": best})
    return out


def time_ring_all_reduce(world_sizes: Sequence[int], payload_bytes: Sequence[int], repeats: int = 3) -> list:
    """Time :func:`zerokit.ring.ring_all_reduce` of fp32 tensors on each world size, through zerokit.launch.

    Returns one point per (world size, payload): ``op``, ``n``, ``payload_bytes``
    (measured), ``sent_bytes``, the bytes the ring really handed to send (measured, rank 0's
    ledger), and ``seconds``, the slowest rank's fastest call.
    """
    points = []
    for n in world_sizes:
        per_rank = launch(_time_ring_all_reduce, n, list(payload_bytes), repeats)
        for i, point in enumerate(per_rank[0]):
            points.append({"op": "all_reduce", "n": n, "payload_bytes": point["payload_bytes"],
                           "sent_bytes": point["sent_bytes"],
                           "seconds": max(rank[i]["seconds"] for rank in per_rank)})
    return points


def fit_latency_bandwidth(points: Iterable[dict]) -> dict:
    """Least-squares fit of t = rounds·α + bytes/β to measured collectives.

    Each point has ``op``, ``n``, ``payload_bytes`` and ``seconds``; rounds and bytes per
    rank come from the ring formulas :func:`zerokit.theory.ring_steps` and
    :func:`~zerokit.theory.ring_bytes_sent` (equal to the measured ``sent_bytes`` of
    :func:`time_ring_all_reduce` when the payload divides into whole chunks).
    Residuals are relative, so the small calls that fix α count as much as the large
    ones that fix β. Returns ``{"alpha_s": latency per round, "beta_Bps": bandwidth}``.
    """
    import numpy as np

    points = list(points)
    a = np.array([[theory.ring_steps(p["op"], p["n"]), theory.ring_bytes_sent(p["op"], p["payload_bytes"], p["n"])]
                  for p in points], dtype=float)
    t = np.array([p["seconds"] for p in points], dtype=float)
    # relative residuals: small calls (latency) and large ones (bandwidth) weigh alike
    (alpha, inv_beta), *_ = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)
    return {"alpha_s": float(alpha), "beta_Bps": float(1 / inv_beta) if inv_beta > 0 else math.inf}


def modelled_seconds(fit: dict, op: str, payload_bytes: int, n: int) -> dict:
    """The α-β model's time for one collective, split into its latency and bandwidth terms."""
    latency = theory.ring_steps(op, n) * fit["alpha_s"]
    bandwidth = theory.ring_bytes_sent(op, payload_bytes, n) / fit["beta_Bps"]
    return {"latency_s": latency, "bandwidth_s": bandwidth, "total_s": latency + bandwidth,
            "latency_share": latency / (latency + bandwidth)}


def latency_bandwidth_figure(points: Sequence[dict], fit: dict):
    """Measured seconds against payload size per world size, with the α-β fit as lines (log-log)."""
    fig, ax = new_figure(7.5, 3.4)
    by_n: dict = {}
    for p in points:
        by_n.setdefault(p["n"], []).append(p)
    for i, (n, pts) in enumerate(sorted(by_n.items())):
        pts = sorted(pts, key=lambda p: p["payload_bytes"])
        sizes = [p["payload_bytes"] for p in pts]
        model = [modelled_seconds(fit, p["op"], p["payload_bytes"], n)["total_s"] for p in pts]
        ax.plot(sizes, [1e3 * p["seconds"] for p in pts], "o", color=f"C{i}", label=f"N={n} measured")
        ax.plot(sizes, [1e3 * m for m in model], color=f"C{i}", lw=1, label=f"N={n} α-β fit")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    ax.set_xlabel("all-reduce payload S (bytes)")
    ax.set_ylabel("ms per call")
    ax.set_title(f"fit: α = {1e6 * fit['alpha_s']:.0f} µs per round, β = {fit['beta_Bps'] / 2**20:.0f} MiB/s",
                 fontsize=TITLE_SIZE)
    legend_outside(ax)
    fig.tight_layout()
    return fig


def all_reduce_scaling_figure(link: dict, payload_bytes: Sequence[int], world_sizes: Sequence[int], title: str = ""):
    """The α-β time of one all-reduce against the world size, ring (solid) and tree (dashed), per payload.

    ``link = {"alpha_s": seconds per hop, "beta_Bps": bytes per second}`` — the fit of
    :func:`fit_latency_bandwidth`, or a link's datasheet numbers; nothing is measured here.
    """
    alpha, beta = link.get("alpha_s"), link.get("beta_Bps")
    if not isinstance(alpha, (int, float)) or not isinstance(beta, (int, float)) or alpha < 0 or beta <= 0:
        raise ValueError(f"link={link!r} needs alpha_s >= 0 (seconds per hop) and beta_Bps > 0 (bytes per second)")
    fig, ax = new_figure(8.5, 3.6)
    ns = sorted(world_sizes)
    for i, size in enumerate(payload_bytes):
        for algorithm, style in (("ring", "-"), ("tree", "--")):
            ms = [1e3 * all_reduce_seconds(size, n, alpha, beta, algorithm)["total_s"] for n in ns]
            ax.plot(ns, ms, style, color=f"C{i}", lw=1.8, label=f"S = {_size_text(size)}, {algorithm}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ns)
    plain_log_ticks(ax.xaxis)
    plain_log_ticks(ax.yaxis)
    ax.set_xlabel("world size N")
    ax.set_ylabel("ms per all-reduce (α-β model)")
    ax.set_title(title or f"α = {1e6 * alpha:g} µs per hop, β = {beta / 1e9:g} GB/s: ring vs tree")
    legend_outside(ax)
    fig.tight_layout()
    return fig


def _size_text(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"
