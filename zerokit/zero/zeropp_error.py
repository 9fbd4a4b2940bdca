"""ZeRO++'s effect on training, measured: exact ZeRO-3 and ``zeropp`` side by side in one launch.

Lifecycle of :func:`zeropp_loss_effect`: one launch of ``world_size`` ranks (``ranks_per_node`` of them
per emulated node, for qgZ's two hops); on every rank, ZeRO-3 trains the workload for ``steps`` steps
from its initial weights, then ZeRO++ trains the same model, same batches, same optimizer — the model
and the batches on the rank's device (``ctx.device``: a GPU where the launch picked NCCL). Each rank
returns its losses and, per ZeRO++ step, the round-trip error it measured on what it quantized (its own
weight shard at every qwZ gather; its gradient pieces at each qgZ hop) next to each block's bound
scale/2. The launching process averages the losses over ranks and takes the largest errors.

Measured, not a formula: how far the loss curve drifts depends on the model and the data. What is
proved is per gather and per hop (:mod:`zerokit.theory.zeropp`): a weight is off by at most half its
block's scale (one scale on DeepSpeed's grid, ``quantization_grid="deepspeed"``); ``over_bound`` counts
the elements that were not (0 unless the codec is wrong).
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from ..optim import OptimizerSpec
from ..runtime.launch import launch
from ..runtime.nodes import RANKS_PER_NODE_ENV
from ..strategies.base import TrainConfig
from ..strategies.registry import get


def _local(workload, step: int, ctx, dtype: torch.dtype):
    """This rank's slice of the step's batch, on the rank's device (floating inputs in the model's ``dtype``)."""
    x, y = workload.batch(step)
    per = x.shape[0] // ctx.world_size
    x, y = x[ctx.rank * per:(ctx.rank + 1) * per].to(ctx.device), y[ctx.rank * per:(ctx.rank + 1) * per].to(ctx.device)
    return (x.to(dtype) if x.is_floating_point() else x), y


def _train(ctx, workload, name: str, options: dict, steps: int, config: TrainConfig, tally: bool) -> dict:
    """One strategy's run on this rank: the model and every batch on ``ctx.device`` (the launch's backend is
    NCCL where GPUs are: a collective on a host tensor would fail there)."""
    dtype = torch.bfloat16 if config.precision == "bf16-mixed" else torch.float32
    strategy = get(name)(workload.build_model().to(ctx.device, dtype), ctx, config, **options)
    losses, weights, gradients = [], [], []
    for step in range(steps):
        strategy.zero_grad()
        x, y = _local(workload, step, ctx, dtype)
        loss = workload.loss(strategy.forward(x), y)
        strategy.backward(loss)
        strategy.step()
        losses.append(float(loss.detach()))
        if tally:
            weights.append(strategy.weight_error.take())
            gradients.append(strategy.gradient_error.take())
    return {"losses": losses, "weight_error": weights, "gradient_error": gradients}


def _both(ctx, workload, options: dict, steps: int, config: TrainConfig) -> dict:
    torch.set_num_threads(1)
    return {"zero3": _train(ctx, workload, "zero3", {}, steps, config, False),
            "zeropp": _train(ctx, workload, "zeropp", dict(options, measure_quantization_error=True), steps, config,
                             True)}


def _merge(tallies: list) -> dict:
    """One step's tallies from every rank: the largest errors and bounds, the mean over every element."""
    elements = sum(t["elements"] for t in tallies)
    return {"max_abs": max(t["max_abs"] for t in tallies),
            "mean_abs": sum(t["mean_abs"] * t["elements"] for t in tallies) / max(elements, 1),
            "max_bound": max(t["max_bound"] for t in tallies),
            "over_bound": sum(t["over_bound"] for t in tallies), "elements": elements}


def zeropp_loss_effect(workload, world_size: int = 2, steps: int = 200, options: dict | None = None,
                       optimizer: str = "adamw", lr: float = 1e-3, precision: str = "fp32",
                       ranks_per_node: int | None = None, timeout_s: float = 300.0) -> dict:
    """Train ``workload`` under ``zero3`` and under ``zeropp`` (with ``options``) for ``steps`` steps each.

    Returns ``{"steps", "losses": {"zero3": [...], "zeropp": [...]}`` (the mean over ranks of each step's
    loss), ``"loss_difference"`` (zeropp − zero3 per step), ``"weight_error"`` and ``"gradient_error"``
    (per zeropp step: ``max_abs``, ``mean_abs``, ``max_bound`` = the largest bound — scale/2 on the
    symmetric grid, scale on DeepSpeed's (``quantization_grid``) —, ``over_bound``, ``elements``)}``.
    ``options`` default: all three of qwZ, hpZ (one node) and qgZ on; the error tallies are switched on
    here (``measure_quantization_error=True``: read once per step, off the gathers' path).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a whole number >= 1")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be a whole number >= 1")
    node = ranks_per_node or world_size
    if options is None:
        options = dict(zero_quantized_weights=True, zero_hpz_partition_size=node, zero_quantized_gradients=True)
    get("zeropp").resolve_options(options)
    if workload.batch_size % world_size:
        raise ValueError(f"world_size={world_size} must divide the workload's batch of {workload.batch_size}")
    if precision not in ("fp32", "bf16-mixed"):
        raise ValueError(f"precision={precision!r}; allowed: fp32, bf16-mixed")
    config = TrainConfig(precision, OptimizerSpec(optimizer, lr=lr))
    with _emulated_nodes(ranks_per_node, world_size):
        ranks = launch(_both, world_size, workload, options, steps, config, timeout_s=timeout_s)
    losses = {name: [sum(r[name]["losses"][i] for r in ranks) / len(ranks) for i in range(steps)]
              for name in ("zero3", "zeropp")}
    return {"steps": list(range(steps)), "losses": losses,
            "loss_difference": [b - a for a, b in zip(losses["zero3"], losses["zeropp"])],
            "weight_error": [_merge([r["zeropp"]["weight_error"][i] for r in ranks]) for i in range(steps)],
            "gradient_error": [_merge([r["zeropp"]["gradient_error"][i] for r in ranks]) for i in range(steps)]}


@contextmanager
def _emulated_nodes(ranks_per_node, world_size: int):
    """Every rank of the launch on nodes of ``ranks_per_node`` ranks (the launcher's variable; None: as set)."""
    if ranks_per_node is None:
        yield
        return
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or ranks_per_node < 1 \
            or world_size % ranks_per_node:
        raise ValueError(f"ranks_per_node={ranks_per_node!r} must be a whole number dividing world_size={world_size}")
    previous = os.environ.get(RANKS_PER_NODE_ENV)
    os.environ[RANKS_PER_NODE_ENV] = str(ranks_per_node)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(RANKS_PER_NODE_ENV, None)
        else:
            os.environ[RANKS_PER_NODE_ENV] = previous

