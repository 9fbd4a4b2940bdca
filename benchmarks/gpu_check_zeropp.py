"""``gpu_check.py``'s ZeRO++ quantized rows: qwZ's int8 codes through the all-gathers and qgZ's int4 / int8 codes
through its two all-to-all hops, on NCCL (gloo ranks with --dry).

Each row trains ``zeropp`` one SGD step on 4 ranks as 2 nodes of 2 (``ranks_per_node=2``: qgZ runs only where
the ranks span nodes, DeepSpeed's rule) — under torchrun on torchrun's world and its real nodes — and checks:

* **the bytes**: every rank's ledger per axis (``dp``, and for qgZ ``node`` and ``inter_node``) equals
  ``theory.zeropp_collective_bytes`` to the byte: the int8 / int4 codes and their fp32 scales went through;
* **qwZ's values, exactly**: the row's model has every weight on the int8 grid — each element ±127·2⁻¹², so
  every block's absmax is 127·2⁻¹², its scale absmax/127 = 2⁻¹² exactly and every code ±127 (a block of
  padding: zeros, scale 1) — and qwZ's gathers give the weights back bit for bit. The first step is then exact
  ZeRO-3's: its parameters within ``gpu_check_common.sgd_tolerance`` of the single-process reference on the same
  model. A code, a scale or a chunk misplaced on the way is O(1) of the movement;
* **qgZ's values**: forward and backward are exact, so after one step each parameter differs from the
  reference's by lr · (the reduced gradient's error) + the exact run's own rounding:
  ≤ lr · ``theory.qgz_error_bound(absmax, g, nodes, bits)`` + ``sgd_tolerance``, absmax the largest
  |local gradient / N| any rank reduces (computed here, on each rank's share of the batch).

One step: after it the weights leave the grid, and the gradients no longer match the reference's.
"""
from __future__ import annotations

import dataclasses
import functools
import os

import torch

import zerokit
from zerokit import theory
from zerokit.job import make_job
from zerokit.report import param_difference
from zerokit.train import run_reference

import gpu_check_common as c
from gpu_check_multi import node_world

#: 2 emulated nodes of 2 ranks (a plain script, --dry): qgZ's intra-node and inter-node hops both run
WORLD, RANKS_PER_NODE = 4, 2
GRID = "symmetric"  # zeropp's default quantization_grid
#: qwZ's row: every weight ±127·2⁻¹², on the int8 grid of step 2⁻¹² (the module docstring)
GRID_WEIGHT = 127 * 2.0 ** -12


def _layout() -> tuple:
    """(world, ranks_per_node to pass, g, nodes): emulated 2 × 2, or torchrun's world on its real nodes."""
    if c.TORCHRUN is not None:
        g = int(os.environ.get("LOCAL_WORLD_SIZE", c.TORCHRUN))
        return node_world(), None, g, node_world() // g
    return WORLD, RANKS_PER_NODE, RANKS_PER_NODE, WORLD // RANKS_PER_NODE


def _grid_model(model_fn):
    """``model_fn``'s model with every parameter element ±GRID_WEIGHT (signs from the seeded RNG: alike on every
    rank and in the reference)."""
    model = model_fn()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.where(torch.randn_like(p) >= 0, GRID_WEIGHT, -GRID_WEIGHT))
    return model


def grid_workload(override: dict):
    """The gpt workload with its weights on the int8 grid (the module docstring)."""
    work = c.work("gpt", **override)
    return dataclasses.replace(work, name=work.name + "-int8-grid",
                               model_fn=functools.partial(_grid_model, work.model_fn))


def _local_gradient_absmax(work, world: int) -> float:
    """The largest |local gradient / N| of any rank's share of step 0's batch, at the initial weights, on this
    process's device: what qgZ's first hop quantizes."""
    model = work.build_model().to(c.device())
    x, y = (t.to(c.device()) for t in work.batch(0))
    absmax, per = 0.0, x.shape[0] // world
    for r in range(world):
        model.zero_grad()
        work.loss(model(x[r * per:(r + 1) * per]), y[r * per:(r + 1) * per]).backward()
        absmax = max(absmax, max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None) / world)
    return absmax


def _reference(work) -> dict:
    """The single-process reference of one SGD step on ``work``: its parameters and their largest movement."""
    rank = run_reference(make_job(work, "single", 1, 1, "fp32", "sgd", c.SGD_LR, 1, {}), c.device())
    start = {k: v.detach().float() for k, v in work.build_model().named_parameters()}
    return {"params": rank.params, "movement": max(float((rank.params[k] - start[k].cpu()).abs().max())
                                                    for k in start)}


def quantized(weights: bool = False, gradients: bool = False, bits: int = 4):
    """A row: zeropp with qwZ (``weights``: the model on the int8 grid) and/or qgZ (``gradients``, int``bits``
    codes), one SGD step on 4 ranks as 2 nodes of 2 (torchrun: its world and nodes)."""
    def check():
        world, ranks_per_node, g, nodes = _layout()
        if world < 2:
            raise c.Skip("this run has one rank: a row of two or more")
        c.needs(world)
        if gradients and nodes < 2:
            return "n/a", (f"qgZ runs only where the ranks span nodes (DeepSpeed's rule): this torchrun's {world} "
                           f"ranks are one node"), {"world_size": world}
        b = c.size("gpt")["batch_size"]
        override = {} if b % world == 0 else {"batch_size": world * -(-b // world)}
        work = grid_workload(override) if weights else c.work("gpt", **override)
        options = {"zero_quantized_weights": weights, "zero_quantized_gradients": gradients, "gradient_bits": bits}
        result = zerokit.train(work, "zeropp", world_size=world, steps=1, optimizer="sgd", lr=c.SGD_LR,
                               reference=False, timeout_s=240, ranks_per_node=ranks_per_node, **c.backend(),
                               **c.HEARTBEAT, **options).results[0]
        errors, fields = [], {"world_size": world, "ranks_per_node": g, "nodes": nodes, "losses": result.losses}
        for rank in result.ranks:  # the codes' and scales' bytes, per axis, to the byte
            measured = {a: row["ring_cost_bytes"] for a, row in rank.comm_bytes_by_axis.items()}
            formula = rank.theory_comm_bytes_by_axis
            if set(measured) != set(formula) or any(abs(measured[a] - formula[a]) > 0.5 for a in formula):
                errors.append(f"rank {rank.rank}: bytes per axis {measured} != theory {formula}")
        fields["bytes_by_axis"] = measured
        if gradients and "inter_node" not in measured:
            errors.append(f"qgZ did not run: no inter-node hop in the ledger ({sorted(measured)})")
        ref = _reference(work)
        diff = param_difference(result.ranks[0].params, ref["params"])["max_abs"]
        tol, what = c.sgd_tolerance(ref["movement"]), ["exact weights on the int8 grid"] if weights else []
        if gradients:
            absmax = _local_gradient_absmax(work, world)
            tol += c.SGD_LR * theory.qgz_error_bound(absmax, g, nodes, bits, GRID) * (1 + 1e-3)
            fields["gradient_absmax"] = absmax
            what.append(f"lr · int{bits} qgZ bound")
        what = " + ".join(what)
        blocked = max(sum(row["blocked_s"] for row in r.comm_summary) for r in result.ranks)
        fields.update(max_abs_param_diff=diff, tolerance=tol, blocked_s=blocked)
        if blocked <= 0:
            errors.append("no time blocked in any collective: the blocked-time measurement is broken")
        if not diff <= tol:
            errors.append(f"|Δparam| {diff:.2e} > {tol:.2e} ({what}) against the reference")
        parts = [f"|Δp| {diff:.1e} ≤ {tol:.1e} ({what})"]
        if errors:
            raise AssertionError("; ".join(errors))
        how = f"{world} ranks as {nodes} node{'s' if nodes > 1 else ''} of {g}"
        return "ok", (f"{how}: bytes per axis = theory (" + ", ".join(f"{a} {c.mib(v)}" for a, v in
                                                                       sorted(measured.items())) + "); "
                      + "; ".join(parts)), fields
    return check
