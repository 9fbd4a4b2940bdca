"""A training step's time from its FLOPs and its traffic: compute, the pipeline bubble, exposed communication, MFU.

The estimate is built in four steps, each a function here:

1. FLOPs. :func:`model_flops_per_token` is what the model needs, 6Ψ + 12·L·s·d (Kaplan et al.
   2001.08361 §2.1 for 6Ψ; the attention term as PaLM counts it, Chowdhery et al. 2204.02311
   App. B, and as Narayanan et al. 2104.04473 §5.1 do: 72·B·s·l·h²·(1 + s/6h + V/12lh) per step is
   6Ψ + 12·l·s·h per token with Ψ = 12·l·h² + V·h). :func:`hardware_flops_per_token` adds what
   recomputation runs again: a full forward of the layers (2Ψ_layers + 4·L·s·d; Megatron's
   96·B·s·l·h²·(1 + s/6h + V/16lh)), or only the attention core (selective, Korthikanti et al.
   2205.05198 §5: 4·L·s·d).
2. Compute time: the hardware FLOPs at a stated fraction of the GPU's peak
   (:func:`compute_seconds`, :data:`DEFAULT_COMPUTE_FRACTION`).
3. Communication: each axis's α-β seconds (:func:`~zerokit.theory.link_seconds`) with an overlap
   rule (:data:`OVERLAPS`): tensor, context, expert and pipeline traffic sits between dependent
   operations and is exposed; data-parallel traffic, under ``overlap="dp"``, hides behind the
   backward passes that run while it is in flight (:func:`dp_overlap_window`), and what does not
   fit in that window is exposed (:func:`exposed_seconds`).
4. The step (:func:`step_seconds`): the pipelined work (compute plus the exposed traffic inside each
   micro-batch) stretched by the bubble (p − 1)/(v·m) (:func:`~zerokit.theory.bubble_over_ideal`,
   GPipe; Megatron 2104.04473 §2.2), plus the exposed data-parallel traffic after it. MFU is the
   model FLOPs over step time × GPUs × peak (:func:`flops_utilization`; PaLM App. B); with the
   hardware FLOPs the same ratio is the HFU.
"""
from __future__ import annotations

import math

#: dense 16-bit tensor-core peak per GPU, FLOP/s (NVIDIA's data sheets: A100 SXM 312 TFLOP/s BF16, H100 and H200
#: SXM 989 TFLOP/s BF16 without sparsity, V100 SXM2 125 TFLOP/s FP16)
GPU_PEAK_FLOPS = {"a100": 312e12, "h100": 989e12, "h200": 989e12, "v100": 125e12}

#: share of peak the GPU reaches while it computes (matmuls and the memory-bound operations between them).
#: 0.57 is Megatron-LM's on A100 in 2021-22, fitted once (the smallest largest error) to the 26 rows of
#: Narayanan et al. 2021's Tables 1 and 2 and Korthikanti et al. 2022's Table 5: every row then lies within
#: 18 % (tests/planner/test_step_time.py). It is not a prediction: small matrices reach less (the 1.7 B and
#: 22 B rows), large ones more (the 530 B and 1 T rows); a new stack, or an H100's higher peak, less again
DEFAULT_COMPUTE_FRACTION = 0.57

#: ``none``: every axis's traffic is exposed; ``dp``: data-parallel traffic hides behind the backward
OVERLAPS = ("none", "dp")
RECOMPUTE = ("none", "selective", "full")


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive number")
    return float(value)


def _at_least_zero(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={value!r} must be a number >= 0")
    return float(value)


def check_compute_fraction(fraction) -> float:
    """The share of peak while computing: a number in (0, 1]."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"compute_fraction={fraction!r} must be a share of the GPU's peak, in (0, 1] (e.g. 0.57)")
    return float(fraction)


def check_overlap(overlap: str) -> str:
    if overlap not in OVERLAPS:
        raise ValueError(f"overlap={overlap!r}; allowed: none (every axis exposed), dp (data-parallel traffic "
                         f"hidden behind the backward)")
    return overlap


def gpu_peak_flops(gpu) -> float:
    """A GPU's dense 16-bit peak in FLOP/s: a name of :data:`GPU_PEAK_FLOPS` or a number of FLOP/s."""
    if isinstance(gpu, str):
        key = gpu.strip().lower()
        if key in GPU_PEAK_FLOPS:
            return GPU_PEAK_FLOPS[key]
        raise ValueError(f"gpu_peak={gpu!r}; allowed: {', '.join(GPU_PEAK_FLOPS)} or FLOP/s (e.g. 312e12)")
    return _positive("gpu_peak", gpu)


def attention_flops_per_token(layers: int, seq_len: int, attention_width: int) -> float:
    """12·L·s·d: a token's query against s keys (2·s·d) and its sum over s values (2·s·d), forward, and twice that
    backward, in each of L attention layers; d = heads × head size. Counted over the whole s × s square, as PaLM
    (12·L·H·Q·T) and Megatron (72·B·s·l·h²·s/6h) count it, not halved for a causal mask."""
    return 12.0 * layers * seq_len * attention_width


def model_flops_per_token(psi: float, layers: int = 0, seq_len: int = 0, attention_width: int = 0) -> float:
    """6Ψ + 12·L·s·d: every weight multiplied once forward (2Ψ) and twice backward (4Ψ), plus attention
    (:func:`attention_flops_per_token`). Ψ counts the weights that multiply: not a lookup table."""
    _positive("psi", psi)
    return 6.0 * psi + attention_flops_per_token(layers, seq_len, attention_width)


def hardware_flops_per_token(psi: float, layers: int = 0, seq_len: int = 0, attention_width: int = 0,
                             recompute: str = "none", layer_psi: float | None = None) -> float:
    """The model FLOPs plus what recomputation runs again, per token.

    ``full``: the layers' forward again, 2·Ψ_layers + 4·L·s·d (``layer_psi``: the weights inside the
    layers, default Ψ), so 8Ψ-style instead of 6Ψ — Megatron's 96·B·s·l·h²·(1 + s/6h + V/16lh);
    ``selective``: only the attention core again, 4·L·s·d (Korthikanti et al. 2022 §5); ``none``: the
    model FLOPs.
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r}; allowed: {', '.join(RECOMPUTE)}")
    model = model_flops_per_token(psi, layers, seq_len, attention_width)
    attention_forward = attention_flops_per_token(layers, seq_len, attention_width) / 3
    if recompute == "full":
        return model + 2.0 * (psi if layer_psi is None else layer_psi) + attention_forward
    if recompute == "selective":
        return model + attention_forward
    return model


def compute_seconds(flops: float, peak_flops: float, compute_fraction: float = DEFAULT_COMPUTE_FRACTION) -> float:
    """flops / (fraction × peak): one GPU's share of the step's FLOPs at the stated share of its peak."""
    return _at_least_zero("flops", flops) / (_positive("peak_flops", peak_flops) * check_compute_fraction(
        compute_fraction))


def dp_overlap_window(backward_seconds: float, forward_seconds: float, micro_batches: int, stage: int) -> float:
    """Seconds of compute that data-parallel traffic can hide behind in one step.

    DDP and ZeRO-1 reduce once, during the last micro-batch's backward (``no_sync`` before it):
    backward/m. ZeRO-2 reduce-scatters during every micro-batch's backward: the whole backward.
    ZeRO-3 (and HSDP, hpZ) also gathers ahead of every forward and backward (prefetch): all of
    the compute. Anything longer than the window is exposed (:func:`exposed_seconds`). ZeRO-1's
    all-gather of the updated parameters, which runs after the optimizer step, is counted in the
    same window: optimistic unless the next forward's first layers hide it (Megatron's
    ``overlap_param_gather``).
    """
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches!r} must be a positive whole number")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage={stage!r}; allowed: 0 (DDP), 1, 2, 3")
    backward, forward = _at_least_zero("backward_seconds", backward_seconds), _at_least_zero("forward_seconds",
                                                                                              forward_seconds)
    return {0: backward / micro_batches, 1: backward / micro_batches, 2: backward, 3: backward + forward}[stage]


def exposed_seconds(comm_seconds: float, window_seconds: float = 0.0) -> float:
    """max(0, comm − window): the part of a transfer that the compute running beside it does not hide."""
    return max(0.0, _at_least_zero("comm_seconds", comm_seconds) - _at_least_zero("window_seconds", window_seconds))


def step_seconds(pipelined_seconds: float, bubble_over_ideal: float = 0.0, after_seconds: float = 0.0) -> float:
    """pipelined × (1 + bubble) + after: the work every micro-batch waits for (compute and the traffic on its
    critical path) stretched by the pipeline's idle share over ideal, (p − 1)/(v·m), then what runs once after
    the last backward (the exposed data-parallel traffic)."""
    return (_at_least_zero("pipelined_seconds", pipelined_seconds) * (1 + _at_least_zero("bubble_over_ideal",
                                                                                         bubble_over_ideal))
            + _at_least_zero("after_seconds", after_seconds))


def flops_utilization(flops_per_step: float, step_seconds_: float, gpus: int, peak_flops: float) -> float:
    """FLOPs per step / (step seconds × GPUs × peak): MFU with the model FLOPs (PaLM App. B), HFU with the
    hardware FLOPs (recomputation counted)."""
    return _at_least_zero("flops_per_step", flops_per_step) / (
        _positive("step_seconds", step_seconds_) * _positive("gpus", gpus) * _positive("peak_flops", peak_flops))
