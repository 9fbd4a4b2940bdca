"""What a tensor-parallel layout costs, read from the model: elements per rank, and the widths its operators move.

:func:`parameter_counts` sums the sharded and the replicated parameters (the model-state
side of Megatron-LM §3); :func:`communicated_widths` walks the tensor-parallel layers
(:mod:`.layers`) and mixture-of-experts layers for the activation widths behind every f and
g, which :func:`zerokit.theory.tp_comm_bytes_per_step` turns into bytes.
"""
from __future__ import annotations

from typing import Dict

import torch.nn as nn

from ..strategies.blocks import moe_layers
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .mappings import group_size
from .plan import plan_layout
from .sharding import parameter_layout, sequence_parallel_parameters


def parameter_counts(model: nn.Module, tp: int, plan=None) -> Dict[str, int]:
    """Model-state elements per rank: ``sharded`` (the sharded parameters' whole sizes), ``replicated``,
    and ``per_rank`` = sharded/t + replicated. With ``plan``, ``model`` is the unsharded model and the
    layout is the one :func:`~zerokit.tensor_parallel.plan.apply_plan` would give it; without, ``model``
    is already tensor-parallel."""
    if plan is not None:
        layout = plan_layout(model, plan)
        whole = {name: p.numel() for name, p in model.named_parameters()}
    else:
        layout = parameter_layout(model)
        whole = {name: p.numel() * (tp if layout[name] is not None else 1) for name, p in model.named_parameters()}
    sharded = sum(whole[name] for name, shard in layout.items() if shard is not None)
    replicated = sum(whole[name] for name, shard in layout.items() if shard is None)
    if sharded % tp:
        raise ValueError(f"parameter_counts: {sharded} sharded elements are not divisible by tp={tp}")
    return {"sharded": sharded, "replicated": replicated, "per_rank": sharded // tp + replicated}


def communicated_widths(model: nn.Module) -> Dict[str, int]:
    """Per token of a micro-batch, the activation widths the model's tensor-parallel operators move over ``tp``.

    ``reduced``: the widths behind every conjugate pair — f at each column-parallel layer's
    input (an all-reduce in backward), g at each row-parallel layer's output and at the
    vocabulary-parallel embedding's output (an all-reduce in forward); under sequence
    parallelism each is an all-gather + reduce-scatter pair of the same bytes.
    ``gathered``: the output widths of column-parallel layers that gather their output whole, and
    the input widths that sequence parallelism all-gathers a second time in backward
    (``keep_input_sharded``).
    ``sequence_parallel_numel``: elements of the replicated parameters whose gradients are summed
    over ``tp`` (sequence parallelism; a tensor-parallel expert's output bias). ``fp32_per_token``: fp32
    values per token all-reduced once (a tensor-parallel MoE layer's k gates, in backward).
    :func:`zerokit.theory.tp_comm_bytes_per_step` turns these into bytes.
    """
    reduced = gathered = fp32_per_token = 0
    for layer in moe_layers(model):  # tensor-parallel experts: one f and one g per token, and the k gates' f
        if layer.tp_group is not None:
            reduced += 2 * layer.router.in_features
            fp32_per_token += layer.top_k
    for module in model.modules():
        if isinstance(module, ColumnParallelLinear):
            reduced += module.in_features
            if module.gather_output:
                gathered += module.out_features * group_size(module.group)
            if module.sequence_parallel and module.keep_input_sharded:
                gathered += module.in_features
        elif isinstance(module, RowParallelLinear):
            reduced += module.out_features
        elif isinstance(module, VocabParallelEmbedding):
            reduced += module.embedding_dim
    sp = sum(p.numel() for p in sequence_parallel_parameters(model).values())
    return {"reduced": reduced, "gathered": gathered, "sequence_parallel_numel": sp,
            "fp32_per_token": fp32_per_token}
