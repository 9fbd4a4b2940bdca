"""Tensor parallelism (Megatron-LM, arXiv 1909.08053 §3) and sequence parallelism (Korthikanti et al., 2205.05198).

Lifecycle: :func:`check_plan` refuses a plan the model or degree can't take, before any
process starts; on every rank of the ``tp`` group :func:`apply_plan` swaps the planned
modules for column-/row-/vocabulary-parallel ones cut from the unsharded weights
(:mod:`.layers`), which talk through the conjugate operators f, g and ḡ (:mod:`.mappings`);
the loss of vocabulary-sharded logits is :func:`vocab_parallel_cross_entropy`; after
backward, sequence parallelism sums the gradients of the replicated parameters that saw
sequence shards (:func:`allreduce_sequence_parallel_gradients`); :func:`full_parameters`
rebuilds the whole model's tensors for parity checks. In your own loop,
:func:`parallelize_module` takes torch's convention (a plan of module names, torch's styles too).
"""
from .cross_entropy import vocab_parallel_cross_entropy
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .mappings import (copy_to_tensor_parallel_region, gather_from_sequence_parallel_region,
                       gather_from_tensor_parallel_region, reduce_from_tensor_parallel_region,
                       reduce_scatter_to_sequence_parallel_region, scatter_to_sequence_parallel_region)
from .plan import STYLES, Plan, apply_plan, check_plan, plan_layout, plan_loss, tiny_gpt_plan
from .parallelize import parallelize_module
from .attention import TensorParallelMultiheadAttention
from .accounting import communicated_widths, parameter_counts
from .sharding import (Shard, allreduce_sequence_parallel_gradients, full_gradients, full_parameters,
                       parameter_layout, register_sequence_parallel_gradient_hooks, sequence_parallel_parameters)

# the paper's names for the conjugate operators
f = copy_to_tensor_parallel_region
g = reduce_from_tensor_parallel_region
g_sp = gather_from_sequence_parallel_region
g_bar = reduce_scatter_to_sequence_parallel_region

__all__ = ["Plan", "STYLES", "apply_plan", "check_plan", "plan_layout", "plan_loss", "tiny_gpt_plan",
           "parallelize_module", "TensorParallelMultiheadAttention",
           "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "vocab_parallel_cross_entropy",
           "Shard", "communicated_widths", "parameter_layout", "parameter_counts", "full_parameters", "full_gradients",
           "sequence_parallel_parameters", "allreduce_sequence_parallel_gradients",
           "register_sequence_parallel_gradient_hooks",
           "copy_to_tensor_parallel_region", "reduce_from_tensor_parallel_region",
           "gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region",
           "scatter_to_sequence_parallel_region", "gather_from_tensor_parallel_region", "f", "g", "g_sp", "g_bar"]
