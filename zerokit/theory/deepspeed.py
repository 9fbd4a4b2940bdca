"""DeepSpeed's estimators, as its code computes them (18 B per parameter, 4 × the largest layer at
ZeRO-3, host × 1.5, GiB), beside the paper's convention."""
from __future__ import annotations

from .model_states import ModelStates


def deepspeed_estimator_bytes_per_param() -> int:
    """DeepSpeed's estimator counts fp32 gradients: 2 + 4 + 12 = 18 bytes per parameter."""
    return 18


def deepspeed_zero2_estimate(psi: int, gpus_per_node: int = 1, nodes: int = 1, cpu_offload: bool = False,
                             buffer_factor: float = 1.5) -> tuple:
    """DeepSpeed's ``estimate_zero2_model_states_mem_needs`` as its code computes it: (host bytes, GPU bytes).

    GPU 2Ψ + 18Ψ/N (18 = 16-bit and fp32 grads, fp32 params, m, v) or 2Ψ with the
    optimizer offloaded; host 4Ψ per GPU of the node, or max(4N, 16)·Ψ offloaded, × the
    buffer factor 1.5 (FACTS §10).
    """
    total = nodes * gpus_per_node
    if cpu_offload:
        return int(psi * max(4 * total, 16) * buffer_factor), int(2 * psi)
    return int(psi * 4 * gpus_per_node * buffer_factor), int(2 * psi + int(18 * psi / total))


def deepspeed_zero3_estimate(psi: int, largest_layer: int, gpus_per_node: int = 1, nodes: int = 1,
                             cpu_offload: bool = False, cpu_offload_params: bool = False, zero_init: bool = True,
                             buffer_factor: float = 1.5) -> tuple:
    """DeepSpeed's ``estimate_zero3_model_states_mem_needs`` as its code computes it: (host, GPU, largest-layer bytes).

    GPU 4·L + 18Ψ/N, with L the largest module's parameter count; 4·L + 2Ψ/N with the
    optimizer offloaded; 4·L with the parameters offloaded too. Host memory per node
    carries the 1.5 buffer factor (FACTS §10).
    """
    total = nodes * gpus_per_node
    per_node = 1 / nodes
    largest = 4 * largest_layer
    if cpu_offload:
        if cpu_offload_params:
            gpu = largest
            cpu = psi * (18 * per_node if zero_init else max(4 * gpus_per_node, 18 * per_node)) * buffer_factor
        else:
            gpu = largest + int(2 * psi / total)
            cpu = psi * (16 * per_node if zero_init else max(4 * gpus_per_node, 16 * per_node)) * buffer_factor
    else:
        gpu = largest + int(18 * psi / total)
        cpu = (largest_layer if zero_init else psi) * 4 * gpus_per_node * buffer_factor
    return int(cpu), int(gpu), largest


def deepspeed_model_state_bytes(stage: int, psi: int, n: int, largest_layer: int = 0,
                                offload: str = "none") -> ModelStates:
    """Per-GPU model states in DeepSpeed's estimators' convention, split by category; totals equal theirs.

    Stage 2: params 2Ψ, grads 6Ψ/N (16-bit + fp32), optimizer 12Ψ/N (fp32 params, m, v):
    2Ψ + 18Ψ/N. Stage 3: the same 18Ψ/N sharded (its estimator names no separate 16-bit
    parameter shard) + 4 × the largest layer, counted as params. DeepSpeed has no stage 0
    or 1 estimator: zerokit extends its convention, stage 0 = 2Ψ + 2Ψ + 4Ψ + 12Ψ = 20Ψ,
    stage 1 = 2Ψ + 2Ψ + 16Ψ/N (full 16-bit grads, the fp32 gradient partition sharded).
    ``offload``: "optimizer" leaves the GPU 2Ψ (stages 1-2) or 4L + 2Ψ/N (stage 3);
    "params" (stage 3) leaves 4L.
    """
    if offload not in ("none", "optimizer", "params"):
        raise ValueError(f"offload={offload!r}; allowed: none, optimizer, params")
    if stage == 0:
        if offload != "none":
            raise ValueError("DeepSpeed offloads the optimizer for ZeRO stages 1-3 only")
        return ModelStates(2 * psi, 6 * psi, 12 * psi)
    if stage in (1, 2):
        if offload == "params":
            raise ValueError("DeepSpeed offloads parameters with ZeRO stage 3 only")
        if offload == "optimizer":
            return ModelStates(2 * psi, 0, 0)
        if stage == 1:
            return ModelStates(2 * psi, 2 * psi + int(4 * psi / n), int(16 * psi / n) - int(4 * psi / n))
        grads = int(6 * psi / n)
        return ModelStates(2 * psi, grads, int(18 * psi / n) - grads)
    if stage == 3:
        gathered = 4 * largest_layer
        if offload == "params":
            return ModelStates(gathered, 0, 0)
        if offload == "optimizer":
            return ModelStates(gathered + int(2 * psi / n), 0, 0)
        grads = int(6 * psi / n)
        return ModelStates(gathered, grads, int(18 * psi / n) - grads)
    raise ValueError(f"stage={stage!r} is not a ZeRO stage; allowed: 0, 1, 2, 3")
