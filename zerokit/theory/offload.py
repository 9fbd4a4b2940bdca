"""ZeRO-Offload (2101.06840): model states on the device and on the host, and the device↔host traffic.

Lifecycle of the bytes these formulas count, per rank and per step: the 16-bit
parameters stay on the device (stage 3: their shard; ``offload_params``: not even that,
the shard rests on the host and each gather fetches it); the gradient shard goes out
device→host (every micro-batch at stages 2-3, once at stage 1); the host keeps the fp32
master, Adam's m and v and steps there; the updated 16-bit shard comes back host→device
(with ``offload_params`` it stays on the host until the next gather fetches it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from .model_states import (ADAM_STEP_SCALAR_BYTES, ModelStates, check_optimizer, optimizer_bytes_per_element,
                           param_bytes_per_element, shard_numel)


def offload_traffic_bytes(psi: int, bytes_per_element: int = 2) -> int:
    """Device↔host bytes per step: gradients out and parameters back, 2·psi·b."""
    return 2 * psi * bytes_per_element


@dataclass(frozen=True)
class SplitStates(ModelStates):
    """Model states on the device (the inherited fields) and on the host (``host``), bytes per rank."""

    host: ModelStates = field(default_factory=lambda: ModelStates(0, 0, 0))

    def as_dict(self) -> dict:
        return {**super().as_dict(), "host": self.host.as_dict()}


def offload_model_state_bytes(stage: int, psi: int, n: int, optimizer: str = "adamw",
                              offload_params: bool = False, *, precision: str = "bf16-mixed",
                              units: Optional[Sequence[int]] = None, optimizer_tensors: int = 0,
                              persistent_numel: int = 0, frozen_numel: int = 0) -> tuple:
    """ZeRO-Offload (2101.06840 §4): (device, host) model states per rank.

    16-bit parameters stay on the device (2Ψ; 2Ψ/N at stage 3; none with ``offload_params``,
    stage 3 only, where the 16-bit shard lives on the host). The fp32 master, m and v of
    the rank's shard (K·Ψ/N) and its 16-bit gradient shard (2Ψ/N) live on the host, where
    the step runs. Stage 1 keeps its full 16-bit gradients on the device until they are
    reduced; stages 2-3 stream them out after each backward.

    Exact per-rank bytes: ``units`` (the flat buffers, each padded to a multiple of n;
    default one buffer of psi, and stages 1-2 then count psi unpadded), ``precision``
    (fp32: 4-byte params and grads, and the host still needs its own fp32 copy of a
    shard that lives on the device — K = 4 + 8 with Adam; a shard resting on the host in
    fp32 is its own master), ``optimizer_tensors`` (one 4-byte Adam ``step`` each, on the
    host) and ``persistent_numel`` (stage-3 parameters kept whole on the device: stepped
    on the host like the shards, copied back every step). ``frozen_numel``: parameters with
    ``requires_grad=False``, held whole on the device, with no gradient and no optimizer state.
    """
    if stage not in (1, 2, 3):
        raise ValueError(f"stage={stage!r}: offloading the optimizer needs ZeRO stage 1, 2 or 3 (DeepSpeed's rule)")
    if offload_params and stage != 3:
        raise ValueError(f"stage={stage!r}: offloading parameters needs ZeRO stage 3")
    check_optimizer(optimizer)
    pb = param_bytes_per_element(precision)
    moments = optimizer_bytes_per_element("fp32", optimizer)  # m and v: 8 with Adam, 0 with plain SGD
    if units is None:
        shard = -(-(psi - persistent_numel) // n)
        full = psi
    else:
        shard = shard_numel(units, n)
        full = n * shard
    stepped = shard + persistent_numel
    resident = shard if offload_params else 0
    masters = stepped - (resident if precision == "fp32" else 0)
    steps = ADAM_STEP_SCALAR_BYTES * optimizer_tensors if optimizer == "adamw" else 0
    if stage == 3:
        device_params = pb * (persistent_numel + shard - resident)
    else:
        device_params = pb * full
    device = ModelStates(device_params + pb * frozen_numel, pb * full if stage == 1 else 0, 0)
    host = ModelStates(pb * resident, pb * stepped, 4 * masters + moments * stepped + steps, steps)
    return device, host


def offload_states(stage: int, psi: int, n: int, optimizer: str = "adamw", offload_params: bool = False,
                   **exact) -> SplitStates:
    """:func:`offload_model_state_bytes` as one :class:`SplitStates` (the device's fields, ``host`` beside)."""
    device, host = offload_model_state_bytes(stage, psi, n, optimizer, offload_params, **exact)
    return SplitStates(device.params, device.grads, device.optimizer, device.step_scalars, host=host)


def offload_traffic_bytes_accumulated(psi: int, bytes_per_element: int = 2, micro_batches: int = 1) -> int:
    """:func:`offload_traffic_bytes` with A micro-batches: each one's gradients go out (the host accumulates
    them), the updated parameters come back once: (A + 1)·psi·b; 2·psi·b for A = 1."""
    return (micro_batches + 1) * psi * bytes_per_element


def param_offload_traffic_bytes(shard_numel: int, bytes_per_element: int = 2, micro_batches: int = 1,
                                gathers_per_micro_batch: int = 2) -> int:
    """ZeRO-3 with offloaded parameters: each all-gather first brings the rank's 16-bit shard from the host,
    twice per micro-batch (forward and backward; once with ``reshard_after_forward=False``):
    2·A·shard·b bytes host→device per step."""
    return gathers_per_micro_batch * micro_batches * shard_numel * bytes_per_element


def offload_transfer_bytes(stage: int, shard_numel: int, bytes_per_element: int = 2, micro_batches: int = 1,
                           offload_params: bool = False, persistent_numel: int = 0,
                           gathers_per_micro_batch: int = 2) -> dict:
    """Exact device→host (``d2h``) and host→device (``h2d``) bytes of one rank per step.

    ``shard_numel`` is the rank's padded shard of the flat units (Σ ceil(u/N)); ``persistent_numel``
    the stage-3 parameters kept whole. d2h: the gradient shard, once per step at stage 1 (it
    reduces once), every micro-batch at stages 2-3 (the host accumulates). h2d: the updated
    shard once per step; with ``offload_params`` only the persistent parameters come back at
    the step and every gather fetches the unit shards instead (:func:`param_offload_traffic_bytes`).
    With A = 1 and no parameter offload the two add up to :func:`offload_traffic_bytes`.
    """
    b, stepped = bytes_per_element, shard_numel + persistent_numel
    outs = 1 if stage == 1 else micro_batches
    if offload_params:
        h2d = persistent_numel * b + param_offload_traffic_bytes(shard_numel, b, micro_batches,
                                                                 gathers_per_micro_batch)
    else:
        h2d = stepped * b
    return {"d2h": outs * stepped * b, "h2d": h2d}
