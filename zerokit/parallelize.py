"""``parallelize``: one model on one mesh, every parallelism applied by one function, in one fixed order.

The order is torchtitan's (``parallelize_llama``), and each step's place has a reason:

1. **tensor parallelism** (:mod:`zerokit.tensor_parallel`) first: the plan swaps modules for
   sharded ones, so every later step sees this rank's shards — a data-parallel strategy then
   reduces or shards the tp shards, not whole weights. The sequence-parallel gradient hooks go
   on now, before any strategy's hooks, so a LayerNorm's gradient is summed over tp before
   any data-parallel reduction reads it;
2. **expert parallelism** (:mod:`zerokit.expert_parallel`): this rank keeps its experts and
   drops the rest, before anything lays the parameters out;
3. **context parallelism** (:mod:`zerokit.context_parallel`): the attention cores and
   positions of this rank's zig-zag chunks; it changes the forward, not the parameters;
4. **activation checkpointing** (:mod:`zerokit.activation_checkpointing`): on the blocks as the steps
   above left them, so a recomputation replays their collectives too; before the pipeline
   splits the blocks among stages, and before the strategy, whose hooks then sit around the
   checkpointed blocks (torchtitan applies it before FSDP for the same reason);
5. **pipeline parallelism** (:mod:`zerokit.pipeline_parallel`): this rank keeps its stages;
   from here on the model is those stages;
6. **the data-parallel strategy** last (DDP, ZeRO-1/2/3, …): it wraps what this rank finally
   holds — the tp shards of its stages, its experts — and its hooks are the outermost.

``zerokit.train`` (:func:`zerokit.train.run_rank`) goes through every step its job asks for;
the own-loop APIs go through the one step each of them is (``zerokit.DistributedDataParallel``,
``zerokit.initialize``, ``zerokit.ShardedOptimizer`` and ``zerokit.fully_shard``: the strategy;
``zerokit.pipeline``: the pipeline). A step not asked for is skipped; the order never changes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch.nn as nn

from .activation_checkpointing import apply_checkpointing
from .context_parallel import apply_context_parallel
from .expert_parallel import apply_expert_parallel
from .pipeline_parallel.strategy import Pipeline
from .runtime import comm
from .strategies.base import TrainConfig
from .tensor_parallel import apply_plan, plan_loss, register_sequence_parallel_gradient_hooks

#: the steps, in the order :func:`parallelize` applies them
ORDER = ("tensor", "expert", "context", "checkpointing", "pipeline", "data_parallel")


@dataclass
class Parallelized:
    """What :func:`parallelize` made of a model on this rank."""

    #: what this rank trains: the model, or this rank's pipeline stages
    model: nn.Module
    #: the loss to use: the given one, or the vocabulary-parallel one when the tp plan leaves the logits sharded
    loss_fn: Optional[Callable] = None
    #: the tensor-parallel plan applied (None: none)
    plan: Any = None
    #: the activation-checkpointing handle (None: none); counts the recomputed forwards
    checkpointing: Any = None
    #: the pipeline driver of this rank's stages (None: no pipeline)
    pipeline: Any = None
    #: the data-parallel strategy wrapping :attr:`model` (None: none asked for)
    strategy: Any = None
    #: elements of the parameters this rank holds before the strategy lays them out (Ψ without tp, pp, ep)
    parameters_held: int = 0
    #: the steps applied, in order (a subsequence of :data:`ORDER`)
    applied: List[str] = field(default_factory=list)


def parallelize(model: nn.Module, ctx, *, plan=None, tensor_group=None, loss_fn: Optional[Callable] = None,
                expert_parallel: bool = False, seq_len: Optional[int] = None, cp_attention: str = "ring",
                checkpointing: str = "none", checkpoint_every: Optional[int] = None,
                pipeline: Optional[Dict[str, Any]] = None, pipeline_driver=Pipeline, micro_batches: int = 1,
                strategy=None, config: Optional[TrainConfig] = None, options: Optional[Dict[str, Any]] = None,
                before_pipeline: Optional[Callable[[nn.Module], None]] = None) -> Parallelized:
    """Apply to ``model`` (in place) the steps asked for, in the order of the module docstring.

    ``plan`` (a :class:`zerokit.tensor_parallel.Plan`) over ``tensor_group`` (None: the mesh's ``tp``);
    ``expert_parallel``: over the mesh's ``ep``; ``seq_len``: context parallelism over the mesh's ``cp`` for
    sequences of that length, with ``cp_attention``; ``checkpointing`` (a policy other than ``"none"``) with
    ``checkpoint_every``; ``pipeline`` (the options ``schedule``, ``chunks``, ``partition``) over the mesh's
    ``pp`` with ``micro_batches``, by ``pipeline_driver``; ``strategy`` (a strategy class) built on what this
    rank then holds with ``config`` and ``options``. ``before_pipeline(model)`` sees the whole model once the
    steps before the pipeline are applied (zerokit.train names its tensors there for sharded checkpoints).
    """
    done = Parallelized(model, loss_fn)
    if plan is not None:
        group = tensor_group if tensor_group is not None else ctx.mesh.group("tp")
        with comm.phase("setup"):
            apply_plan(model, plan, group)
            register_sequence_parallel_gradient_hooks(model, group)
            sharded_loss = plan_loss(plan, group)
        done.plan, done.loss_fn = plan, (sharded_loss if sharded_loss is not None else loss_fn)
        done.applied.append("tensor")
    if expert_parallel:
        apply_expert_parallel(model, ctx.mesh)
        done.applied.append("expert")
    if seq_len is not None:
        apply_context_parallel(model, ctx.mesh, seq_len, cp_attention)
        done.applied.append("context")
    if checkpointing != "none":
        done.checkpointing = apply_checkpointing(model, checkpointing, checkpoint_every)
        done.applied.append("checkpointing")
    if before_pipeline is not None:
        before_pipeline(model)
    if pipeline is not None:
        done.pipeline = pipeline_driver(pipeline, micro_batches, ctx, model, done.loss_fn)
        done.model = done.pipeline.module
        done.applied.append("pipeline")
    done.parameters_held = sum(p.numel() for p in done.model.parameters())
    if strategy is not None:
        done.strategy = strategy(done.model, ctx, config if config is not None else TrainConfig(), **(options or {}))
        done.applied.append("data_parallel")
    return done
