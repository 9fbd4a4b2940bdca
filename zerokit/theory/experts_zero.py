"""ZeRO with expert parallelism: model states and traffic when expert and dense parameters are sharded over their
own groups (DeepSpeed-MoE, arXiv 2201.05596 §4; Megatron's expert data parallelism).

With ep carved from N = dp ranks, a rank holds the dense parameters (Ψ_d) and E/ep of every MoE layer's
experts (Ψ_e/ep). ZeRO shards the dense units over the N ranks of dp and the expert units over the
N_e = N/ep ranks that hold the same experts (edp), each unit padded to a multiple of its group's size.
Per rank, stage by stage, each kind is counted as :func:`~.model_states.model_state_bytes` counts it
on its own group — e.g. ZeRO-3 with AdamW in fp32: 16·(Ψ_d/N + (Ψ_e/ep)/N_e) = 16·(Ψ_d + Ψ_e)/N, every
element of the model held once over dp. Traffic: each kind's collectives on its group,
:func:`~.communication.comm_bytes_per_step` with n = N for dp and n = N_e for edp (zero when N_e = 1).
"""
from __future__ import annotations

from typing import Sequence

from .communication import comm_bytes_per_step
from .model_states import ModelStates, model_state_bytes


def expert_zero_model_state_bytes(stage: int, dense_units: Sequence[int], n: int, expert_units: Sequence[int],
                                  n_experts: int, precision: str = "fp32", optimizer: str = "adamw",
                                  optimizer_tensors: int = 0, persistent_numel: int = 0,
                                  frozen_numel: int = 0) -> ModelStates:
    """Model-state bytes per rank for ZeRO stage 1–3 with expert parallelism.

    ``dense_units``: sizes of the dense flat units, sharded over ``n`` (dp) ranks; ``expert_units``: sizes of
    this rank's expert units, sharded over ``n_experts`` (edp = dp/ep) ranks. ``optimizer_tensors`` (Adam's step
    scalars, one per stepped tensor), ``persistent_numel`` (stage-3 dense parameters held whole) and
    ``frozen_numel`` are counted once, with the dense part.
    """
    dense_units, expert_units = list(dense_units), list(expert_units)
    dense = model_state_bytes(stage, sum(dense_units) + persistent_numel, n, precision, optimizer, units=dense_units,
                              optimizer_tensors=optimizer_tensors, persistent_numel=persistent_numel,
                              frozen_numel=frozen_numel)
    experts = model_state_bytes(stage, sum(expert_units), n_experts, precision, optimizer, units=expert_units)
    return ModelStates(dense.params + experts.params, dense.grads + experts.grads,
                       dense.optimizer + experts.optimizer, dense.step_scalars)


def expert_zero_comm_bytes(stage: int, dense_units: Sequence[int], n: int, expert_units: Sequence[int],
                           n_experts: int, bytes_per_element: int, micro_batches: int = 1, persistent_numel: int = 0,
                           reshard_after_forward: bool = True) -> dict:
    """Bytes one rank sends per step for ZeRO stage 1–3 with expert parallelism, by axis: ``{"dp": …, "edp": …}``
    — the dense units' collectives over ``n`` ranks, the expert units' over ``n_experts`` (the MoE all-to-alls on
    ep are :func:`~.experts.moe_alltoall_bytes`)."""
    dense_units, expert_units = list(dense_units), list(expert_units)
    dense = comm_bytes_per_step(stage, sum(dense_units) + persistent_numel, n, bytes_per_element, micro_batches,
                                units=dense_units, persistent_numel=persistent_numel,
                                reshard_after_forward=reshard_after_forward)
    experts = comm_bytes_per_step(stage, sum(expert_units), n_experts, bytes_per_element, micro_batches,
                                  units=expert_units, reshard_after_forward=reshard_after_forward)
    return {"dp": dense, "edp": experts}
