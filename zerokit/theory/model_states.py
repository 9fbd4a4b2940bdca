"""Model states per rank: ZeRO's stages, the paper's convention, tensor-parallel shards (ZeRO §3.1, §5;
Megatron §3)."""
from __future__ import annotations

from dataclasses import dataclass
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
                      optimizer_tensors: int = 0, persistent_numel: int = 0, frozen_numel: int = 0) -> ModelStates:
    """Model-state bytes per rank for ZeRO stage 0 (DDP) to 3 (ZeRO paper §5.1, Figure 1).

    stage 0: every rank holds params, grads and optimizer states for all psi elements.
    stage 1: optimizer states sharded; stage 2: + gradients; stage 3: + parameters.
    ``units`` are the sizes of the flat buffers the strategy shards (default: one
    buffer of psi elements); stages 1-3 pad each to a multiple of n. ``optimizer_tensors``
    is the number of tensors the optimizer steps (one Adam ``step`` scalar each).
    ``persistent_numel`` counts stage-3 parameters kept gathered (persistence threshold):
    they are held whole, with their gradients and optimizer states, outside the shards.
    ``frozen_numel``: parameters with ``requires_grad=False`` — held whole on every rank (never
    sharded, not in ``units``), with no gradient and no optimizer state.
    """
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r} is not a ZeRO stage; allowed: 0, 1, 2, 3")
    if n < 1:
        raise ValueError(f"n={n!r}: the data-parallel degree must be >= 1")
    pb = param_bytes_per_element(precision)
    k = optimizer_bytes_per_element(precision, optimizer)
    steps = ADAM_STEP_SCALAR_BYTES * optimizer_tensors if optimizer == "adamw" else 0
    if stage == 0:
        trained = psi - frozen_numel
        return ModelStates(pb * psi, pb * trained, k * trained + steps, steps)
    units = [psi - persistent_numel] if units is None else list(units)
    shard = shard_numel(units, n)
    full = n * shard
    persistent = persistent_numel
    frozen = pb * frozen_numel
    if stage == 1:
        return ModelStates(pb * full + frozen, pb * full, k * shard + steps, steps)
    if stage == 2:
        return ModelStates(pb * full + frozen, pb * shard, k * shard + steps, steps)
    return ModelStates(pb * (shard + persistent) + frozen, pb * (shard + persistent),
                       k * (shard + persistent) + steps, steps)


def fully_shard_model_state_bytes(psi: int, n: int, precision: str = "fp32", optimizer: str = "adamw",
                                  units: Sequence[int] | None = None, optimizer_tensors: int = 0,
                                  frozen_numel: int = 0) -> ModelStates:
    """``fully_shard``'s model states at rest (FSDP2's mixed precision): the shards, their gradients and the optimizer
    states stay in fp32 at any compute dtype — the 16-bit copy of a unit lives only while it is gathered — so the
    count is stage 3's in fp32; under a 16-bit compute dtype each frozen parameter also keeps a 16-bit copy for the
    forward (zerokit holds frozen parameters whole, a choice; FSDP2 shards them)."""
    base = model_state_bytes(3, psi, n, "fp32", optimizer, units, optimizer_tensors, frozen_numel=frozen_numel)
    copies = param_bytes_per_element(precision) * frozen_numel if check_precision(precision) != "fp32" else 0
    return ModelStates(base.params + copies, base.grads, base.optimizer, base.step_scalars)


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


GIB = 2**30
GB = 10**9


def tp_model_state_bytes(sharded_numel: int, replicated_numel: int, t: int, precision: str = "bf16-mixed",
                         optimizer: str = "adamw", optimizer_tensors: int = 0) -> ModelStates:
    """Model states of one tensor-parallel rank (Megatron 1909.08053 §3), no data-parallel sharding.

    ``sharded_numel`` elements (the split weight matrices and their column-parallel biases)
    are divided over ``t`` ranks, ``ceil(sharded_numel / t)`` each; ``replicated_numel``
    (layer norms, row-parallel biases) are held whole by every rank. Each element costs
    what stage 0 of :func:`model_state_bytes` charges: params and grads ``b`` bytes, the
    optimizer K bytes (+ 4 per stepped tensor for Adam's ``step``).
    """
    if t < 1:
        raise ValueError(f"t={t!r}: the tensor-parallel degree must be >= 1")
    if sharded_numel < 0 or replicated_numel < 0:
        raise ValueError(f"sharded_numel={sharded_numel!r}, replicated_numel={replicated_numel!r} must be >= 0")
    per_rank = -(-int(sharded_numel) // t) + int(replicated_numel)
    return model_state_bytes(0, per_rank, 1, precision, optimizer, optimizer_tensors=optimizer_tensors)
