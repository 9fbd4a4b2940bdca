"""Hierarchical sharding: HSDP (shard inside a group, replicate across groups) and ZeRO++'s hpZ.

Notation: Ψ parameters, b bytes per 16-bit element, K optimizer bytes per parameter,
N data-parallel ranks, A micro-batches per optimizer step, g GPUs per node, and ``s`` the
**shard group**: the ranks one parameter is sharded over (HSDP) or the ranks the hpZ
secondary copy is sharded over. r = N/s replica groups. Padding as everywhere in
zerokit.theory: a flat unit of u elements is ⌈u/s⌉ elements per rank, ``P_s`` =
:func:`padded_numel` (units, s) the padded total.

**HSDP** (FSDP2's ``fully_shard(mesh=init_device_mesh(..., (r, s)))``, DeepSpeed's MiCS):
the N ranks form r groups of s (one node each when s = g). Inside a group it is ZeRO-3:
parameters, gradients and optimizer states sharded s ways; every replica group holds the
same shards.

- Memory: ZeRO-3's formula with s in place of N:
  (b + b + K)·P_s/s — 16Ψ/s with Adam in mixed precision (:func:`hsdp_model_state_bytes`).
- Traffic per rank per step: per micro-batch, an all-gather of the parameters in forward
  and again in backward and a reduce-scatter of the gradients, all inside the group:
  3A·(s−1)/s·P_s·b (ring formulas, ZeRO §7.2, with s ranks). Then rank j of every group
  holds the same shard j of the summed-over-its-group gradient; the r ranks holding shard j
  (one per group) all-reduce it: 2(r−1)/r·(P_s/s)·b. Once per step when the all-reduce waits
  for the last micro-batch (FSDP2's ``set_requires_all_reduce(False)`` on the others;
  zerokit's choice for the planner) — in that micro-batch's backward, unit by unit, or at the
  step: the same bytes either way — A times with ``all_reduce_every_micro_batch`` (FSDP2's
  default). The reduce-scatter then all-reduce is a sum over all N ranks, as ZeRO-3's
  reduce-scatter over N is: the same gradient shard, a different route.
  (:func:`hsdp_collective_bytes`.)
- Parameters held at once, under FSDP2's defaults (one unit prefetched in backward, none in
  forward): the shards b·P_s/s, the root unit (embeddings, head: gathered through both
  passes, the blocks run inside it), the block computing and the one gathered ahead of it —
  b·(P_s/s + ⌈u_root/s⌉·s + the two largest ⌈u/s⌉·s of the others)
  (:func:`hsdp_peak_param_bytes`).
- Over ZeRO-2 (``stage=2``): the parameters stay whole on every rank, gradients and optimizer
  states are sharded over s — ZeRO-2's memory with s for N — and the parameters are gathered
  once per step, after it: (s−1)/s·P_s·b; the reduce-scatter and the all-reduce as above.

**hpZ** (ZeRO++, Wang et al., arXiv 2306.10209 §3.2; DeepSpeed's ``zero_hpz_partition_size``):
ZeRO-3 over all N ranks plus a **secondary copy** of the 16-bit parameters sharded s ways.

- Memory: ZeRO-3's over N, plus the secondary shard b·P_s/s — (16/N + 2/s)·Ψ with Adam
  (:func:`hpz_model_state_bytes`; :func:`hpz_secondary_bytes` the extra term).
- Traffic: the step's first forward all-gather over N, (N−1)/N·P_N·b, fills the whole
  unit; each rank keeps the s-way slice of it as the secondary shard (no extra transfer).
  Every later gather of the step — the backward ones, and the forward ones of micro-batches
  2 … A — reads the secondary copy inside the group, (s−1)/s·P_s·b each, until the step
  changes the weights (DeepSpeed's ``ds_secondary_tensor``). The gradient reduce-scatter
  stays over N, (N−1)/N·P_N·b per micro-batch. So (A + 1)·(N−1)/N·P_N·b cross the group
  boundary and (2A − 1)·(s−1)/s·P_s·b stay inside it: ZeRO-3's backward gather moved into the
  node (ZeRO++'s 3M → 2M cross-node at A = 1; its qwZ and qgZ, and all three together: :mod:`.zeropp`).
  (:func:`hpz_collective_bytes`.)

**Which link.** A collective over a group of ``size`` ranks, each ``stride`` ranks apart
(ranks numbered node by node), stays in a node when size·stride ≤ g; otherwise its ring
crosses nodes. zerokit's planner runs such a ring at one GPU's inter-node link for all its
bytes (one rail: its stated assumption; NCCL spreads a ring's channels over a node's
NICs, which can make a flat ring spanning nodes up to g times quicker than that). What does
not depend on that assumption is how many bytes **leave a node** per step
(:func:`ring_bytes_leaving_a_node`): a ring's members in one node are consecutive in ring
order, so the ring leaves the node once, on an edge that carries one member's bytes S_rank;
a node holds g/k rings of the group (k = members per node), so g/k·S_rank leave it. A flat
ring over N (k = g): S_rank. HSDP's all-reduce among r ranks one per node (k = 1): g·S_rank.

Hand count, Ψ = 1,024 in one unit, b = 2, N = 4 in 2 nodes of g = s = 2, A = 1:
ZeRO-3: 3·(3/4)·1024·2 = 4,608 B per rank, all on rings that span nodes; leaving a node 4,608.
HSDP: inside the node 3·(1/2)·2048 = 3,072; across, the 512-element shard all-reduced over
r = 2: 2·(1/2)·1024 = 1,024 per rank; leaving a node 2·1,024 = 2,048.
hpZ: across 2·(3/4)·2048 = 3,072, inside (1/2)·2048 = 1,024; leaving a node 3,072.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Sequence

from .communication import comm_bytes_per_step
from .model_states import model_state_bytes, ModelStates, padded_numel, param_bytes_per_element, shard_numel

HIERARCHICAL = ("hsdp", "hpz")


def _exact(x: Fraction):
    return int(x) if x.denominator == 1 else float(x)


def check_shard_group(n: int, s: int) -> int:
    """The shard group size ``s`` checked against N data-parallel ranks: a whole number dividing N."""
    for name, value in (("n", n), ("shard_group", s)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive whole number")
    if n % s:
        raise ValueError(f"shard_group={s} does not divide the {n} data-parallel ranks: HSDP and hpZ need "
                         f"N = replicas × shard_group")
    return s


def hsdp_model_state_bytes(psi: int, n: int, s: int, precision: str = "bf16-mixed", optimizer: str = "adamw",
                           units: Sequence[int] | None = None, optimizer_tensors: int = 0, frozen_numel: int = 0,
                           stage: int = 3) -> ModelStates:
    """HSDP's model states per rank: ZeRO-3's with the shard group ``s`` in place of N, (2b + K)·P_s/s.

    ``stage=2`` (parameters whole on every rank, gradients and optimizer states sharded over s: ZeRO-2's with
    s for N); ``frozen_numel``: parameters held whole on every rank, never sharded (as in ZeRO's formula)."""
    check_shard_group(n, s)
    if stage not in (2, 3):
        raise ValueError(f"stage={stage!r}; allowed: 2, 3")
    return model_state_bytes(stage, psi, s, precision, optimizer, units=units, optimizer_tensors=optimizer_tensors,
                             frozen_numel=frozen_numel)


def hpz_secondary_bytes(psi: int, s: int, precision: str = "bf16-mixed", units: Sequence[int] | None = None) -> int:
    """hpZ's secondary copy of the 16-bit parameters, sharded over ``s`` ranks: b·P_s/s per rank."""
    units = [psi] if units is None else list(units)
    return param_bytes_per_element(precision) * shard_numel(units, s)


def hpz_model_state_bytes(psi: int, n: int, s: int, precision: str = "bf16-mixed", optimizer: str = "adamw",
                          units: Sequence[int] | None = None, optimizer_tensors: int = 0) -> ModelStates:
    """hpZ's model states per rank: ZeRO-3's over N plus the secondary parameter shard b·P_s/s (in ``params``)."""
    check_shard_group(n, s)
    base = model_state_bytes(3, psi, n, precision, optimizer, units=units, optimizer_tensors=optimizer_tensors)
    return ModelStates(base.params + hpz_secondary_bytes(psi, s, precision, units), base.grads, base.optimizer,
                       base.step_scalars)


def hsdp_collective_bytes(psi: int, n: int, s: int, bytes_per_element: int, micro_batches: int = 1,
                          units: Sequence[int] | None = None, all_reduce_every_micro_batch: bool = False,
                          stage: int = 3, reshard_after_forward: bool = True) -> dict:
    """Bytes one HSDP rank sends per step, by group and collective.

    ``{"shard": {"all_gather": G·(s−1)/s·P_s·b, "reduce_scatter": A·(s−1)/s·P_s·b},
    "replicate": {"all_reduce": R·2(r−1)/r·(P_s/s)·b}}`` with R = 1 (the all-reduce once per
    step) or A (``all_reduce_every_micro_batch``); a group of one rank sends nothing. G = 2A
    (ZeRO-3: a gather before forward and again before backward), A with
    ``reshard_after_forward=False`` (kept gathered from forward to backward), 1 at ``stage=2``
    (the parameters whole between steps: one gather after the step, as ZeRO-2 over s).
    """
    check_shard_group(n, s)
    if stage not in (2, 3):
        raise ValueError(f"stage={stage!r}; allowed: 2, 3")
    r, a, b = n // s, micro_batches, bytes_per_element
    units = [psi] if units is None else list(units)
    full = padded_numel(units, s)
    out = {"shard": {}, "replicate": {}}
    if s > 1:
        half = Fraction((s - 1) * full * b, s)
        gathers = 1 if stage == 2 else (2 * a if reshard_after_forward else a)
        out["shard"] = {"all_gather": _exact(gathers * half), "reduce_scatter": _exact(a * half)}
    if r > 1:
        times = a if all_reduce_every_micro_batch else 1
        out["replicate"] = {"all_reduce": _exact(times * Fraction(2 * (r - 1) * (full // s) * b, r))}
    return out


def hsdp_peak_param_bytes(units: Sequence[int], s: int, bytes_per_element: int, prefetch_units: int = 1) -> int:
    """The most parameter bytes one ``hsdp`` rank holds at once: b·(P_s/s + root + the 1 + ``prefetch_units``
    largest other units, each padded to a multiple of s).

    ``units``: the flat units in zerokit's order, children first, the root (the unit that encloses the
    others, as a transformer's embeddings and head do its blocks) last. Under FSDP2's defaults
    (``prefetch_units=1``): gathered whole are the root, the unit computing and the next one in backward
    order; the root alone with one block in forward. Every rank of the shard group holds as much.
    """
    if len(units) < 1:
        raise ValueError("units: at least the root unit")
    if isinstance(s, bool) or not isinstance(s, int) or s < 1:
        raise ValueError(f"s={s!r} must be a positive whole number")
    if isinstance(prefetch_units, bool) or not isinstance(prefetch_units, int) or prefetch_units < 0:
        raise ValueError(f"prefetch_units={prefetch_units!r} must be a whole number ≥ 0")
    padded = [-(-int(u) // s) * s for u in units]
    others = sorted(padded[:-1], reverse=True)[:1 + prefetch_units]
    return bytes_per_element * (shard_numel(units, s) + padded[-1] + sum(others))


def hpz_collective_bytes(psi: int, n: int, s: int, bytes_per_element: int, micro_batches: int = 1,
                         units: Sequence[int] | None = None) -> dict:
    """Bytes one hpZ rank sends per step, by group and collective.

    ``{"global": {"all_gather": (N−1)/N·P_N·b, "reduce_scatter": A·(N−1)/N·P_N·b},
    "secondary": {"all_gather": (2A − 1)·(s−1)/s·P_s·b}}``: the step's first forward gather and the
    gradient reduce-scatters over all N ranks, every later gather from the secondary copy over s.
    """
    check_shard_group(n, s)
    a, b = micro_batches, bytes_per_element
    units = [psi] if units is None else list(units)
    out = {"global": {}, "secondary": {}}
    if n > 1:
        half = Fraction((n - 1) * padded_numel(units, n) * b, n)
        out["global"] = {"all_gather": _exact(half), "reduce_scatter": _exact(a * half)}
    if s > 1:
        out["secondary"] = {"all_gather": _exact((2 * a - 1) * Fraction((s - 1) * padded_numel(units, s) * b, s))}
    return out


def group_spans_nodes(size: int, stride: int, gpus_per_node: int) -> bool:
    """Whether a group of ``size`` ranks ``stride`` apart (ranks numbered node by node) crosses a node boundary."""
    return size > 1 and size * stride > gpus_per_node


def ring_bytes_leaving_a_node(rank_bytes: float, size: int, stride: int, gpus_per_node: int) -> float:
    """Bytes that leave one node per step for a collective whose every rank sends ``rank_bytes`` on a ring.

    0 when the group stays in a node; else g/k·``rank_bytes``, k = the group's members in one
    node (min(size, max(1, g // stride))): each of the node's g/k rings leaves it once, on an
    edge carrying one member's bytes. Holds however the payload is split over channels.
    """
    if not group_spans_nodes(size, stride, gpus_per_node):
        return 0
    members = min(size, max(1, gpus_per_node // stride))
    return _exact(Fraction(rank_bytes) * gpus_per_node / members)


def hierarchical_link_bytes(strategy: str, psi: int, n: int, gpus_per_node: int, bytes_per_element: int,
                            micro_batches: int = 1, s: int | None = None, units: Sequence[int] | None = None,
                            all_reduce_every_micro_batch: bool = False) -> dict:
    """Per-step data-parallel bytes of one rank on a pure-dp layout, split by where they run.

    ``strategy``: ``ddp``, ``zero3``, ``hsdp`` or ``hpz`` (s defaults to min(N, g)). Returns
    ``{"intra_node": bytes a rank sends on rings that stay in its node, "inter_node": bytes a
    rank sends on rings that cross nodes, "leaving_node": bytes leaving each node}``.
    ``intra_node + inter_node`` is the rank's total (ZeRO §7.2's 2(N−1)/N·Ψb for DDP,
    3(N−1)/N·Ψb for ZeRO-3 at A = 1).
    """
    g, b, a = gpus_per_node, bytes_per_element, micro_batches
    s = min(n, g) if s is None else s
    groups = []  # (rank bytes, size, stride)
    if strategy == "ddp":
        groups.append((comm_bytes_per_step(0, psi, n, b), n, 1))
    elif strategy == "zero3":
        groups.append((comm_bytes_per_step(3, psi, n, b, a, units), n, 1))
    elif strategy == "hsdp":
        by = hsdp_collective_bytes(psi, n, s, b, a, units, all_reduce_every_micro_batch)
        groups += [(sum(by["shard"].values()), s, 1), (sum(by["replicate"].values()), n // s, s)]
    elif strategy == "hpz":
        by = hpz_collective_bytes(psi, n, s, b, a, units)
        groups += [(sum(by["global"].values()), n, 1), (sum(by["secondary"].values()), s, 1)]
    else:
        raise ValueError(f"strategy={strategy!r}; allowed: ddp, zero3, hsdp, hpz")
    out = {"intra_node": 0, "inter_node": 0, "leaving_node": 0}
    for nbytes, size, stride in groups:
        out["inter_node" if group_spans_nodes(size, stride, g) else "intra_node"] += nbytes
        out["leaving_node"] += ring_bytes_leaving_a_node(nbytes, size, stride, g)
    return out
