"""ZeRO++ (Wang et al., arXiv 2306.10209): the block quantizer's error bound and bytes.

**Block quantization** (§3.1; zerokit's codec is :mod:`zerokit.zero.quantize`): a block of
elements with largest magnitude ``absmax`` is sent as ``bits``-bit codes with one scale Δ, on
one of two grids (:data:`QUANTIZATION_GRIDS`):

- ``"symmetric"`` (zerokit's default): Δ = absmax/qmax, qmax = 2^(bits−1) − 1, codes −qmax … qmax.
  In exact arithmetic every element comes back within half a step: |x − Δ·round(x/Δ)| ≤ Δ/2
  (no clamping happens: |x/Δ| ≤ qmax);
- ``"deepspeed"`` (DeepSpeed's quantizer kernels): Δ = absmax/2^(bits−1), codes −2^(bits−1) …
  2^(bits−1) − 1. −absmax is the code −2^(bits−1) exactly; an element above
  (2^(bits−1) − ½)·Δ rounds to 2^(bits−1) and is clipped one code down, so it comes back within
  one whole step: +absmax itself is off by exactly Δ. Every other element is within Δ/2.

Relative to absmax the bound is 1/(2·qmax) on the symmetric grid (1/254 at int8, 1/14 at int4)
and 1/2^(bits−1) on DeepSpeed's (1/128, 1/8). In float32 the quotient (or multiplier) and the
product each round once more (relative 2^-24 each), and the result's conversion to a 16-bit
dtype adds half that dtype's ulp of the value.
"""
from __future__ import annotations

import math

from .hierarchical import ring_bytes_leaving_a_node

QUANTIZATION_BITS = (4, 8)
#: the codes' grids: zerokit's symmetric one (the default), DeepSpeed's kernels' (csrc/quantization)
QUANTIZATION_GRIDS = ("symmetric", "deepspeed")
SCALE_BYTES = 4  # one float32 scale per block


def _check_bits(bits) -> int:
    if isinstance(bits, bool) or bits not in QUANTIZATION_BITS:
        raise ValueError(f"bits={bits!r}; allowed: 4, 8")
    return bits


def _check_grid(grid) -> str:
    if grid not in QUANTIZATION_GRIDS:
        raise ValueError(f"grid={grid!r}; allowed: {', '.join(map(repr, QUANTIZATION_GRIDS))}")
    return grid


def _check_positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a whole number >= 1")
    return value


def quantization_levels(bits: int) -> int:
    """qmax = 2^(bits−1) − 1: 127 for int8, 7 for int4 (the symmetric grid −qmax..qmax)."""
    return 2 ** (_check_bits(bits) - 1) - 1


def _steps_to_absmax(bits: int, grid: str) -> int:
    """absmax/Δ: qmax on the symmetric grid, 2^(bits−1) on DeepSpeed's."""
    return quantization_levels(bits) if _check_grid(grid) == "symmetric" else 2 ** (bits - 1)


def block_quantization_scale(absmax: float, bits: int = 8, grid: str = "symmetric") -> float:
    """The step Δ of a block whose largest magnitude is ``absmax``: absmax/qmax on the symmetric grid,
    absmax/2^(bits−1) on DeepSpeed's (1 for an all-zero block on both)."""
    if absmax < 0 or math.isnan(absmax):
        raise ValueError(f"absmax={absmax!r} must be >= 0")
    steps = _steps_to_absmax(bits, grid)
    return absmax / steps if absmax > 0 else 1.0


def block_quantization_error_bound(scale: float, grid: str = "symmetric") -> float:
    """The largest |x − dequantize(quantize(x))| of one element in a block of step ``scale``: scale/2 on the
    symmetric grid; on DeepSpeed's one whole step, scale (the elements above (2^(bits−1) − ½)·scale, +absmax
    among them, are clipped one code down; every other element is within scale/2).

    Exact arithmetic; an all-zero block (scale 1 by convention) comes back exactly.
    """
    if scale <= 0 or math.isnan(scale):
        raise ValueError(f"scale={scale!r} must be > 0")
    return scale / 2 if _check_grid(grid) == "symmetric" else scale


def block_quantization_relative_bound(bits: int = 8, grid: str = "symmetric") -> float:
    """The error bound relative to the block's absmax: 1/(2·qmax) on the symmetric grid — 1/254 for int8,
    1/14 for int4; 1/2^(bits−1) on DeepSpeed's — 1/128, 1/8."""
    steps = _steps_to_absmax(bits, grid)
    return 1 / (2 * steps) if grid == "symmetric" else 1 / steps


def quantized_bytes(numel: int, block_size: int, bits: int = 8) -> int:
    """Bytes of ``numel`` elements block-quantized: ⌈numel·bits/8⌉ codes + 4·⌈numel/block_size⌉ scales."""
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel={numel!r} must be a whole number >= 0")
    _check_positive("block_size", block_size)
    _check_bits(bits)
    return -(-numel * bits // 8) + SCALE_BYTES * -(-numel // block_size)


# --- the three mechanisms' bytes per step ------------------------------------------------------------
#
# Notation as in :mod:`.hierarchical`: N data-parallel ranks, g ranks per node (N/g nodes), s the hpZ
# partition, b bytes per element of the weights and gradients, A micro-batches per step, B the
# quantization block. A unit of u elements is padded to P = N·⌈u/N⌉ (zerokit's flat buffer), a rank's
# shard is C = P/N. Q(k, bits) = quantized_bytes(k, B, bits): codes and float32 scales of k elements.
#
# Per unit, what one rank sends (a ring all-gather or reduce-scatter sends (n−1)/n of its payload, an
# all-to-all of equal chunks (n−1)/n of its input):
#
# - weight all-gathers over dp: (N−1)·C·b each; **qwZ**: (N−1)·Q(C, 8) — the int8 codes and the scales.
#   Without hpZ, two per micro-batch (forward and backward; both quantized under qwZ, as DeepSpeed does):
#   2A per step;
# - **hpZ** (s > 1), as DeepSpeed's ``ds_secondary_tensor``: the first gather of a step (micro-batch 1's
#   forward) runs over dp and fills the secondary copy; every later gather of the step — micro-batch 1's
#   backward, then forward and backward of micro-batches 2 … A — reads the copy over the hpZ group, in the
#   weights' dtype, (s−1)·(P/s)·b each (zerokit's choice and the paper's Fig. 5; DeepSpeed quantizes these
#   too under qwZ); the step changes the weights and the copy with them. Per step: 1 over dp, 2A − 1 over hpz;
# - gradients, once per micro-batch: a reduce-scatter over dp, (N−1)·C·b; **qgZ** (§3.3) when the world
#   spans nodes (N/g > 1; on one node DeepSpeed reduce-scatters): the 2-hop all-to-all, inside the node
#   (g > 1) (g−1)·Q((N/g)·C, bits), across nodes (N/g − 1)·Q(C, bits) — for the units qgZ reduces
#   (``qgz_units``; the others fall back to the reduce-scatter, as DeepSpeed's 1-D and indivisible
#   gradients do: :func:`zerokit.zero.qgz.qgz_reduces_unit`).
#
# The paper's accounting (§3.4) counts what leaves a node, in units of M = the model's 16-bit bytes, with
# (n−1)/n → 1 and the scales left out: forward gather M → 0.5M (int8), backward gather M → 0 (inside
# the node), gradients M → 0.25M (int4): 3M → 0.75M, per micro-batch. Over A micro-batches hpZ keeps
# every forward gather after the first inside the node too: (0.5 + 0.25A)M, not 0.75A·M.
# :func:`zeropp_bytes_leaving_a_node` is that quantity to the byte: the (n−1)/n factors, the padding and
# the scales' 4 bytes per block kept.

ZEROPP_AXES = ("dp", "hpz", "node", "inter_node")
PAPER_CROSS_NODE_VOLUME = {"forward_all_gather": (1, 0.5), "backward_all_gather": (1, 0),
                           "gradient_reduce_scatter": (1, 0.25)}


def _check_layout(n: int, ranks_per_node: int, hpz: int) -> None:
    for name, value in (("n", n), ("ranks_per_node", ranks_per_node), ("hpz_partition_size", hpz)):
        _check_positive(name, value)
    if n % ranks_per_node:
        raise ValueError(f"ranks_per_node={ranks_per_node} does not divide the {n} data-parallel ranks")
    if n % hpz:
        raise ValueError(f"hpz_partition_size={hpz} does not divide the {n} data-parallel ranks")


def hpz_secondary_numel(units: list, n: int, s: int) -> int:
    """Elements of hpZ's secondary copy on one rank: Σ P/s, a 1/s slice of each N-padded unit (0 when s = 1).

    The slice of the buffer the forward gather filled (zerokit's flat unit, and DeepSpeed's
    ``ds_secondary_tensor``): padded to N. :func:`~.hierarchical.hpz_secondary_bytes` pads each unit to s
    (the planner's count); the two agree when N divides every unit."""
    _check_layout(n, 1, s)
    return 0 if s == 1 else sum(n * -(-u // n) // s for u in units)


def qgz_runs(n: int, ranks_per_node: int) -> bool:
    """Whether qgZ reduces any gradient: only when the N ranks span nodes (N/g > 1), as DeepSpeed's
    ``__avg_scatter_grads`` decides; on one node every gradient is reduce-scattered, exactly."""
    _check_layout(n, ranks_per_node, 1)
    return n // ranks_per_node > 1


def _zeropp_phases(units: list, n: int, b: int, g: int, s: int, quantized_weights: bool, quantized_gradients: bool,
                   block_size: int, gradient_bits: int, a: int, qgz_units) -> dict:
    """Bytes one rank sends per step by ``(axis, op, phase)``: the terms of :func:`zeropp_collective_bytes`."""
    _check_layout(n, g, s)
    _check_bits(gradient_bits)
    _check_positive("block_size", block_size)
    _check_positive("micro_batches", a)
    if qgz_units is None:
        qgz_units = [True] * len(units)
    elif len(qgz_units) != len(units):
        raise ValueError(f"qgz_units has {len(qgz_units)} entries for {len(units)} units: one flag per unit")
    qgz = quantized_gradients and qgz_runs(n, g)
    out: dict = {}

    def add(axis, op, phase, value):
        if value:
            out[(axis, op, phase)] = out.get((axis, op, phase), 0) + value

    for u, reduced_by_qgz in zip(units, qgz_units):
        c = -(-u // n)
        gather = (n - 1) * (quantized_bytes(c, block_size, 8) if quantized_weights else c * b)
        if s > 1:
            secondary = (s - 1) * (n * c // s) * b
            add("dp", "all_gather", "forward", gather)
            add("hpz", "all_gather", "forward", (a - 1) * secondary)
            add("hpz", "all_gather", "backward", a * secondary)
        else:
            add("dp", "all_gather", "forward", a * gather)
            add("dp", "all_gather", "backward", a * gather)
        if qgz and reduced_by_qgz:
            nodes = n // g
            add("node", "all_to_all", "backward", a * (g - 1) * quantized_bytes(nodes * c, block_size, gradient_bits))
            add("inter_node", "all_to_all", "backward", a * (nodes - 1) * quantized_bytes(c, block_size, gradient_bits))
        else:
            add("dp", "reduce_scatter", "backward", a * (n - 1) * c * b)
    return out


def zeropp_collective_bytes(units: list, n: int, bytes_per_element: int, *, ranks_per_node: int = 1,
                            hpz_partition_size: int = 1, quantized_weights: bool = False,
                            quantized_gradients: bool = False, block_size: int = 256, gradient_bits: int = 4,
                            micro_batches: int = 1, qgz_units=None) -> dict:
    """Bytes one rank sends per step, by group and collective: ``{axis: {op: bytes}}``, axes of
    :data:`ZEROPP_AXES` (``dp`` the global ring, ``hpz`` the secondary partition, ``node`` /
    ``inter_node`` qgZ's two hops); an axis with nothing to send is absent. ``qgz_units``: one flag per
    unit, whether qgZ reduces its gradient (None: every unit); qgZ runs only when the ranks span nodes
    (:func:`qgz_runs`)."""
    out: dict = {}
    for (axis, op, _), value in _zeropp_phases(units, n, bytes_per_element, ranks_per_node, hpz_partition_size,
                                               quantized_weights, quantized_gradients, block_size, gradient_bits,
                                               micro_batches, qgz_units).items():
        out.setdefault(axis, {}).setdefault(op, 0)
        out[axis][op] += value
    return out


def zeropp_bytes_leaving_a_node(units: list, n: int, bytes_per_element: int, *, ranks_per_node: int,
                                hpz_partition_size: int = 1, quantized_weights: bool = False,
                                quantized_gradients: bool = False, block_size: int = 256, gradient_bits: int = 4,
                                micro_batches: int = 1, qgz_units=None) -> dict:
    """Bytes that leave one node per step, by term (the paper's accounting, to the byte).

    A ring over all N ranks leaves a node once per node, on an edge carrying one rank's bytes
    (:func:`~.hierarchical.ring_bytes_leaving_a_node`); the hpZ group and qgZ's first hop stay in the
    node when s ≤ g; qgZ's second hop sends all its bytes across, from each of the node's g ranks.
    ``{"forward_all_gather", "backward_all_gather", "gradient_reduce_scatter"}`` (0 on one node); a
    term holds its phase's gathers over dp and over the hpZ group (with A > 1, hpZ's forward gathers
    after the step's first are on the hpZ group).
    """
    g, s = ranks_per_node, hpz_partition_size
    phases = _zeropp_phases(units, n, bytes_per_element, g, s, quantized_weights, quantized_gradients, block_size,
                            gradient_bits, micro_batches, qgz_units)
    out = {}
    for term, phase in (("forward_all_gather", "forward"), ("backward_all_gather", "backward")):
        out[term] = ring_bytes_leaving_a_node(phases.get(("dp", "all_gather", phase), 0), n, 1, g) \
            + ring_bytes_leaving_a_node(phases.get(("hpz", "all_gather", phase), 0), s, 1, g)
    out["gradient_reduce_scatter"] = ring_bytes_leaving_a_node(phases.get(("dp", "reduce_scatter", "backward"), 0),
                                                               n, 1, g) \
        + g * phases.get(("inter_node", "all_to_all", "backward"), 0)
    return out


def paper_cross_node_volume(quantized_weights: bool, hpz: bool, quantized_gradients: bool) -> dict:
    """The paper's cross-node volume per step in units of M (§3.4): each term 1 for ZeRO-3, or 0.5 / 0 / 0.25."""
    on = {"forward_all_gather": quantized_weights, "backward_all_gather": hpz,
          "gradient_reduce_scatter": quantized_gradients}
    out = {term: PAPER_CROSS_NODE_VOLUME[term][bool(on[term])] for term in PAPER_CROSS_NODE_VOLUME}
    if quantized_weights and not hpz:
        out["backward_all_gather"] = 0.5  # the backward gather is quantized too
    return out


def qgz_error_bound(absmax: float, ranks_per_node: int, nodes: int, bits: int = 4, grid: str = "symmetric") -> float:
    """Largest error of one element of qgZ's reduced gradient when every rank's input has |x| ≤ ``absmax``.

    With r = :func:`block_quantization_relative_bound` (``bits``, ``grid``): hop 1 (g > 1): each of the g
    pieces comes back within r·absmax, so a node's partial sum p̂ is within e₁ = g·r·absmax of p and
    |p̂| ≤ g·absmax + e₁. Hop 2 (nodes > 1) requantizes p̂: within e₂ = r·(g·absmax + e₁). The owner sums
    ``nodes`` partials: nodes·(e₁ + e₂). A hop over one rank is skipped and adds no error. Exact
    arithmetic; float32 sums add a few ulps.
    """
    r = block_quantization_relative_bound(bits, grid)
    g = ranks_per_node
    e1 = g * absmax * r if g > 1 else 0.0
    e2 = (g * absmax + e1) * r if nodes > 1 else 0.0
    return nodes * (e1 + e2)
