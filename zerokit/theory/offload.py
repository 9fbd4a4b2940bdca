"""ZeRO-Offload (2101.06840): model states on the device and on the host, and the device↔host traffic."""
from __future__ import annotations

from .model_states import ModelStates, optimizer_bytes_per_element


def offload_traffic_bytes(psi: int, bytes_per_element: int = 2) -> int:
    """Device↔host bytes per step: gradients out and parameters back, 2·psi·b."""
    return 2 * psi * bytes_per_element


def offload_model_state_bytes(stage: int, psi: int, n: int, optimizer: str = "adamw",
                              offload_params: bool = False) -> tuple:
    """ZeRO-Offload (2101.06840 §4): (device, host) model states per GPU in bf16 mixed precision.

    16-bit parameters stay on the device (2Ψ; 2Ψ/N at stage 3; none with ``offload_params``,
    stage 3 only, where the 16-bit shard lives on the host). The fp32 master, m and v of
    the rank's shard (K·Ψ/N) and its 16-bit gradient shard (2Ψ/N) live on the host, where
    the step runs. Stage 1 keeps its full 16-bit gradients on the device until they are
    reduced; stages 2-3 stream them out through the buckets.
    """
    if stage not in (1, 2, 3):
        raise ValueError(f"stage={stage!r}: offloading the optimizer needs ZeRO stage 1, 2 or 3 (DeepSpeed's rule)")
    if offload_params and stage != 3:
        raise ValueError(f"stage={stage!r}: offloading parameters needs ZeRO stage 3")
    k = optimizer_bytes_per_element("bf16-mixed", optimizer)
    shard = -(-psi // n)
    device_params = 0 if offload_params else (2 * shard if stage == 3 else 2 * psi)
    device_grads = 2 * psi if stage == 1 else 0
    device = ModelStates(device_params, device_grads, 0)
    host = ModelStates(2 * shard if offload_params else 0, 2 * shard, k * shard)
    return device, host


def offload_traffic_bytes_accumulated(psi: int, bytes_per_element: int = 2, micro_batches: int = 1) -> int:
    """:func:`offload_traffic_bytes` with A micro-batches: each one's gradients go out (the host accumulates
    them), the updated parameters come back once: (A + 1)·psi·b; 2·psi·b for A = 1."""
    return (micro_batches + 1) * psi * bytes_per_element


def param_offload_traffic_bytes(shard_numel: int, bytes_per_element: int = 2, micro_batches: int = 1) -> int:
    """ZeRO-3 with offloaded parameters: each all-gather first brings the rank's 16-bit shard from the host,
    twice per micro-batch (forward and backward): 2·A·shard·b bytes host→device per step."""
    return 2 * micro_batches * shard_numel * bytes_per_element
