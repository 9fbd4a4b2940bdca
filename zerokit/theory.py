"""The formulas zerokit is held against, in one place.

Every comparison in the library, the CLI and the notebooks takes its expected value
from here; nothing else re-types a formula. Sources: ZeRO (Rajbhandari et al.,
arXiv 1910.02054 §3.1, §5, §7), GPipe (1811.06965), Megatron-LM (1909.08053 §3,
2104.04473 §2.2), Korthikanti et al. (2205.05198 §4), Chen et al. (1604.06174),
ZeRO-Offload (2101.06840).

Notation: psi = parameter count, n = data-parallel degree, b = bytes per element.
Flat buffers are padded to a multiple of n, so a rank's shard of a unit of ``u``
elements is ``ceil(u / n)`` elements; pass the unit sizes to get exact figures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Sequence

PRECISIONS = ("fp32", "bf16-mixed")
OPTIMIZERS = ("adamw", "sgd")
STAGES = (0, 1, 2, 3)

#: torch's Adam/AdamW keeps one fp32 scalar ``step`` tensor per parameter tensor.
ADAM_STEP_SCALAR_BYTES = 4


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not supported; allowed: {', '.join(PRECISIONS)}")
    return precision


def check_optimizer(optimizer: str) -> str:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} is not supported; allowed: {', '.join(OPTIMIZERS)}")
    return optimizer


def param_bytes_per_element(precision: str) -> int:
    """Bytes of one parameter (and one gradient) element: 4 in fp32, 2 in bf16 mixed precision."""
    return 4 if check_precision(precision) == "fp32" else 2


def optimizer_bytes_per_element(precision: str, optimizer: str) -> int:
    """K of the ZeRO paper: optimizer-state bytes per parameter.

    Adam in mixed precision keeps an fp32 master copy plus m and v (K = 12); in plain
    fp32 the parameters are their own master, so K = 8 (m and v). Plain SGD (no
    momentum) keeps nothing in fp32 and only the fp32 master in mixed precision.
    """
    check_precision(precision)
    check_optimizer(optimizer)
    master = 4 if precision == "bf16-mixed" else 0
    moments = 8 if optimizer == "adamw" else 0
    return master + moments


def shard_numel(units: Iterable[int], n: int) -> int:
    """Elements a rank owns when each unit is a flat buffer padded to a multiple of n."""
    return sum(-(-int(u) // n) for u in units)


def padded_numel(units: Iterable[int], n: int) -> int:
    """Elements of the padded flat buffers holding ``units`` (n times the shard)."""
    return n * shard_numel(units, n)


@dataclass(frozen=True)
class ModelStates:
    """Bytes of model states on one rank, by category (ZeRO §3.1)."""

    params: int
    grads: int
    optimizer: int
    #: the part of ``optimizer`` that is Adam's per-tensor ``step`` scalars
    step_scalars: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def as_dict(self) -> dict:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "step_scalars": self.step_scalars, "total": self.total}


def model_state_bytes(stage: int, psi: int, n: int, precision: str = "fp32",
                      optimizer: str = "adamw", units: Sequence[int] | None = None,
                      optimizer_tensors: int = 0, persistent_numel: int = 0) -> ModelStates:
    """Model-state bytes per rank for ZeRO stage 0 (DDP) to 3 (ZeRO paper §5.1, Figure 1).

    stage 0: every rank holds params, grads and optimizer states for all psi elements.
    stage 1: optimizer states sharded; stage 2: + gradients; stage 3: + parameters.
    ``units`` are the sizes of the flat buffers the strategy shards (default: one
    buffer of psi elements); stages 1-3 pad each to a multiple of n. ``optimizer_tensors``
    is the number of tensors the optimizer steps (one Adam ``step`` scalar each).
    ``persistent_numel`` counts stage-3 parameters kept gathered (persistence threshold):
    they are held whole, with their gradients and optimizer states, outside the shards.
    """
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r} is not a ZeRO stage; allowed: 0, 1, 2, 3")
    if n < 1:
        raise ValueError(f"n={n!r}: the data-parallel degree must be >= 1")
    pb = param_bytes_per_element(precision)
    k = optimizer_bytes_per_element(precision, optimizer)
    steps = ADAM_STEP_SCALAR_BYTES * optimizer_tensors if optimizer == "adamw" else 0
    if stage == 0:
        return ModelStates(pb * psi, pb * psi, k * psi + steps, steps)
    units = [psi - persistent_numel] if units is None else list(units)
    shard = shard_numel(units, n)
    full = n * shard
    persistent = persistent_numel
    if stage == 1:
        return ModelStates(pb * full, pb * full, k * shard + steps, steps)
    if stage == 2:
        return ModelStates(pb * full, pb * shard, k * shard + steps, steps)
    return ModelStates(pb * (shard + persistent), pb * (shard + persistent),
                       k * (shard + persistent) + steps, steps)


def paper_model_state_bytes(stage: int, psi: int, n: int, k: int = 12) -> float:
    """The paper's own per-rank formula with 2-byte params and grads: (2 + 2 + K)·psi sharded by stage."""
    if stage == 0:
        return (2 + 2 + k) * psi
    if stage == 1:
        return 4 * psi + k * psi / n
    if stage == 2:
        return 2 * psi + (2 + k) * psi / n
    if stage == 3:
        return (2 + 2 + k) * psi / n
    raise ValueError(f"stage={stage!r} is not a ZeRO stage; allowed: 0, 1, 2, 3")


def zero1_saving_fraction(n: int, precision: str = "bf16-mixed") -> float:
    """Fraction of DDP's model-state memory that ZeRO-1 saves: 0.75·(1−1/n) mixed, 0.5·(1−1/n) fp32."""
    share = 12 / 16 if check_precision(precision) == "bf16-mixed" else 8 / 16
    return share * (1 - 1 / n)


def deepspeed_estimator_bytes_per_param() -> int:
    """DeepSpeed's estimator counts fp32 gradients: 2 + 4 + 12 = 18 bytes per parameter."""
    return 18


# --- communication (ZeRO §7; ring algorithms) -------------------------------------------

RING_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv")


def _exact(x: Fraction):
    return int(x) if x.denominator == 1 else float(x)


def ring_bytes_sent(op: str, payload_bytes: int, n: int, rank: int = 0, src: int = 0):
    """Bytes one rank sends for a collective under the ring algorithm.

    ``payload_bytes`` is the full tensor: the input of a reduce-scatter, the output of an
    all-gather. All-reduce = reduce-scatter + all-gather: 2(n−1)/n·S; each half (n−1)/n·S.
    A broadcast is a pipelined chain from ``src``: every rank but the last forwards S.
    """
    if n <= 1:
        return 0
    s = Fraction(int(payload_bytes))
    if op == "all_reduce":
        return _exact(2 * (n - 1) * s / n)
    if op in ("reduce_scatter", "all_gather"):
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


# --- pipeline parallelism (GPipe §2; Megatron 2104.04473 §2.2) -------------------------

def pipeline_makespan(p: int, m: int, t_f: float = 1.0, t_b: float = 1.0) -> float:
    """(m + p − 1)(t_f + t_b) for p equal stages and m micro-batches."""
    return (m + p - 1) * (t_f + t_b)


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Share of wall time the pipeline idles: (p − 1)/(v·m + p − 1)."""
    return (p - 1) / (v * m + p - 1)


def bubble_over_ideal(p: int, m: int, v: int = 1) -> float:
    """Bubble time over ideal compute time: (p − 1)/(v·m)."""
    return (p - 1) / (v * m)


def peak_stashed_microbatches(schedule: str, p: int, m: int, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` (0-indexed) holds at peak: GPipe m, 1F1B min(p − i, m)."""
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p - stage, m)
    raise ValueError(f"schedule={schedule!r}; allowed: gpipe, 1f1b")


# --- tensor parallelism (Megatron 1909.08053 §3) ---------------------------------------

def tp_elements_sent_per_layer(b: int, s: int, h: int, t: int) -> float:
    """Elements a device sends per transformer layer per micro-batch: 4 all-reduces of b·s·h, 8·b·s·h·(t−1)/t."""
    return 8 * b * s * h * (t - 1) / t


# --- activations and checkpointing ------------------------------------------------------

def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1) -> float:
    """Korthikanti et al. §4, 16-bit with dropout: s·b·h·(10 + 24/t + 5·a·s/(h·t)); t = 1 gives 34 + 5as/h."""
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def checkpointed_blocks(n: int, k: int) -> float:
    """Chen et al.: n blocks in k segments store about k + n/k block activations."""
    return k + n / k


def optimal_checkpoint_segments(n: int) -> int:
    """k = √n minimises k + n/k (at 2√n)."""
    return max(1, round(math.sqrt(n)))


# --- offload (ZeRO-Offload 2101.06840) --------------------------------------------------

def offload_traffic_bytes(psi: int, bytes_per_element: int = 2) -> int:
    """Device↔host bytes per step: gradients out and parameters back, 2·psi·b."""
    return 2 * psi * bytes_per_element
