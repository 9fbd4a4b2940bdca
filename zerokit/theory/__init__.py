"""The formulas zerokit is held against, in one package.

Every comparison in the library, the CLI and the notebooks takes its expected value
from here; nothing else re-types a formula. Sources: ZeRO (Rajbhandari et al.,
arXiv 1910.02054 §3.1, §5, §7), GPipe (1811.06965), Megatron-LM (1909.08053 §3,
2104.04473 §2.2), Korthikanti et al. (2205.05198 §4), Chen et al. (1604.06174),
ZeRO-Offload (2101.06840).

Notation: psi = parameter count, n = data-parallel degree, b = bytes per element.
Flat buffers are padded to a multiple of n, so a rank's shard of a unit of ``u``
elements is ``ceil(u / n)`` elements; pass the unit sizes to get exact figures.

The formulas live in one module per subject — ``model_states``, ``deepspeed``,
``communication``, ``parallelism``, ``activations``, ``transformer``, ``offload``,
``hierarchical`` (HSDP, ZeRO++ hpZ), ``zeropp`` (ZeRO++'s quantizer and volumes), ``parity`` (how close a
parallel run may lie to one process) — and
every name is available here: ``zerokit.theory.ring_bytes_sent`` as before.
"""
from __future__ import annotations

from .model_states import (  # noqa: F401
    PRECISIONS, OPTIMIZERS, STAGES, ADAM_STEP_SCALAR_BYTES, check_precision, check_optimizer,
    param_bytes_per_element, optimizer_bytes_per_element, shard_numel, padded_numel, ModelStates,
    model_state_bytes, fully_shard_model_state_bytes, paper_model_state_bytes, zero1_saving_fraction, GIB, GB,
    tp_model_state_bytes)
from .deepspeed import (  # noqa: F401
    deepspeed_estimator_bytes_per_param, deepspeed_zero2_estimate, deepspeed_zero3_estimate,
    deepspeed_model_state_bytes)
from .context import (  # noqa: F401
    ring_attention_bytes, ulysses_bytes, check_context_parallel, cp_attention_bytes, cp_attention_calls,
    moe_aux_cp_bytes, cp_layer_activation_bytes)
from .experts import (  # noqa: F401
    moe_alltoall_bytes, moe_dispatch_payload, moe_alltoall_bytes_uniform, moe_parameters, moe_extra_activation_bytes,
    moe_gates_tp_bytes)
from .experts_zero import expert_zero_model_state_bytes, expert_zero_comm_bytes  # noqa: F401
from .communication import (  # noqa: F401
    RING_OPS, ring_bytes_sent, ring_steps, comm_bytes_per_step, zero_collective_bytes, link_seconds,
    ALL_REDUCE_ALGORITHMS, all_reduce_rounds, all_reduce_seconds)
from .parallelism import (  # noqa: F401
    pipeline_makespan, bubble_fraction, zb_h1_bubble_fraction, bubble_over_ideal, peak_stashed_microbatches,
    tp_elements_sent_per_layer, tp_comm_bytes_per_step, tp_bytes_sent_per_step, tp_edge_bytes_per_step,
    sequence_parallel_grad_bytes, pipeline_p2p_bytes, pipeline_send_bytes)
from .activations import (  # noqa: F401
    activation_bytes_per_layer, checkpointed_blocks, optimal_checkpoint_segments,
    activation_bytes_per_layer_sequence_parallel, transformer_layer_activation_bytes,
    embedding_activation_bytes, output_activation_bytes, CHECKPOINTING, checkpointed_activation_bytes,
    CUBLAS_WORKSPACE_BYTES, CUBLAS_WORKSPACE_BYTES_HOPPER, step_transients)
from .transformer import (  # noqa: F401
    ParamTensor, MLPS, NORMS, POSITIONS, transformer_parameters, transformer_param_count, training_flops_per_token,
    model_flops_utilization)
from .offload import (  # noqa: F401
    offload_traffic_bytes, offload_model_state_bytes, offload_traffic_bytes_accumulated,
    param_offload_traffic_bytes, SplitStates, offload_states, offload_transfer_bytes)
from .hierarchical import (  # noqa: F401
    HIERARCHICAL, check_shard_group, hsdp_model_state_bytes, hpz_secondary_bytes, hpz_model_state_bytes,
    hsdp_collective_bytes, hsdp_peak_param_bytes, hpz_collective_bytes, group_spans_nodes, ring_bytes_leaving_a_node,
    hierarchical_link_bytes)
from .parity import ulp, sgd_parity_bound, adam_parity_ceiling  # noqa: F401
from .step_time import (  # noqa: F401
    GPU_PEAK_FLOPS, DEFAULT_COMPUTE_FRACTION, OVERLAPS, gpu_peak_flops, attention_flops_per_token,
    model_flops_per_token, hardware_flops_per_token, compute_seconds, dp_overlap_window, exposed_seconds,
    step_seconds, flops_utilization)
from .zeropp import (  # noqa: F401
    QUANTIZATION_BITS, ZEROPP_AXES, quantization_levels, block_quantization_scale, block_quantization_error_bound,
    block_quantization_relative_bound, quantized_bytes, hpz_secondary_numel, zeropp_collective_bytes,
    zeropp_bytes_leaving_a_node, paper_cross_node_volume, qgz_error_bound)
