"""``zerokit.pipeline``: a pipeline of your own model in your own loop, torch pipelining's convention.

::

    pipe = zerokit.pipeline(model, split_points=["blocks.2"], schedule="1f1b", micro_batches=4,
                            loss_fn=F.cross_entropy)
    opt = torch.optim.AdamW(pipe.parameters(), lr=1e-3)        # this rank's stages only
    for x, y in batches:                                        # every pipeline rank runs the loop
        losses = []
        pipe.step(x, target=y, losses=losses)                   # x used by the first stage, y by the last
        opt.step(); opt.zero_grad()

Lifecycle, on every rank of the job:

1. **the pieces**: zerokit reads the model as ordered pieces whose composition is its forward
   (:mod:`zerokit.pipeline_parallel.partition`): an ``nn.Sequential``'s children, or what its
   ``pipeline_pieces()`` returns (embeddings first, repeated blocks, norm and head last).
   torch's ``pipeline()`` traces any forward; zerokit does not, and refuses another model
   with what to give it instead;
2. **the split**: ``split_points`` names the pieces where a new stage begins (torch's
   ``SplitPoint.BEGINNING``), p·v − 1 of them; None: equal block counts. The ranks lie on
   the mesh's ``pp`` axis (every rank, when the mesh has none; ``ctx.set_mesh({"dp": …,
   "pp": …})`` first for pipelines side by side). Each rank keeps its stages and drops the
   rest: :attr:`module`, :meth:`parameters`. Over ``dp``: wrap :attr:`module` in
   ``zerokit.DistributedDataParallel`` (torch pipelining wraps each stage in DDP the same
   way; the schedule holds its reduction to the last micro-batch) or give
   :meth:`parameters` to ``zerokit.ShardedOptimizer`` (ZeRO-1, DeepSpeed's limit for
   pipelines); each pipeline then steps on its own slice of the batch;
3. **``step(x, target=…, losses=…)``**: the micro-batches are ``x`` and ``target`` split in
   ``micro_batches`` along dimension 0; zerokit's executor runs the schedule's actions on
   this rank (:mod:`zerokit.pipeline_parallel.executor`: its sends and receives posted by
   :mod:`.p2p_plan`), each micro-batch's loss divided by m, so the gradients that
   accumulate in this rank's parameters are those of the whole batch's mean loss. On the
   last stage ``losses`` receives each micro-batch's loss, as torch's ``losses=`` does;
   every rank gets the step's mean loss back. Your optimizer steps this rank's stages.
"""
from __future__ import annotations

from contextlib import ExitStack
from typing import Callable, List, Optional, Sequence

import torch
import torch.nn as nn

from ..parallelize import parallelize
from ..pipeline_parallel.partition import pieces_of
from ..runtime.wrapping import rank_context
from .sharded_optimizer import _in_torch_ddp


class _DataParallel:
    """The strategy slot of the pipeline driver: the ZeRO-1 strategies of ``zerokit.ShardedOptimizer`` groups over
    this rank's stages (none: no data-parallel reduction across pipelines), held to the last micro-batch together."""

    def __init__(self, strategies=()):
        self.strategies = list(strategies)

    def no_sync(self):
        stack = ExitStack()
        for strategy in self.strategies:
            stack.enter_context(strategy.no_sync())
        return stack

    def finish_gradient_synchronization(self) -> None:
        for strategy in self.strategies:
            strategy.finish_gradient_synchronization()


class PipelineSchedule:
    """This rank's stages of a pipelined model and the schedule that steps them (see the module docstring)."""

    def __init__(self, driver, micro_batches: int, loss_fn: Callable):
        self.driver, self.micro_batches, self.loss_fn = driver, micro_batches, loss_fn
        self.module: nn.Module = driver.module
        self._shapes_known = False

    def parameters(self):
        return self.module.parameters()

    def _data_parallel(self):
        """The dp wrapper of :attr:`module`, whose ``no_sync`` holds the reduction until the last micro-batch's
        backward and whose ``finish_gradient_synchronization`` then reduces: ``zerokit.DistributedDataParallel``
        — or the ZeRO-1 strategies of a ``zerokit.ShardedOptimizer`` over its parameters, held the same way."""
        wrapper = self.module.__dict__.get("_zerokit_dp")
        if wrapper is not None:
            return wrapper
        if getattr(self.module, "_zerokit_face", None) is not None:
            raise ValueError("pipeline step: zerokit.fully_shard on a pipeline's stages is not implemented (ZeRO-3 "
                             "gathers and reduces around every micro-batch; DeepSpeed pipelines allow ZeRO stage 0 or "
                             "1); wrap pipe.module in zerokit.DistributedDataParallel, or give pipe.parameters() to "
                             "zerokit.ShardedOptimizer")

        if not self._shapes_known and {id(p) for p in self.module.parameters()} & _in_torch_ddp():
            raise ValueError("pipeline step: torch's DistributedDataParallel around pipe.module is never called "
                             "(the schedule runs the stages itself), so it would not reduce; use "
                             "zerokit.DistributedDataParallel(pipe.module), whose hooks are on the parameters")
        strategies = {id(s): s for p in self.module.parameters() for s in [getattr(p, "_zerokit_zero1", None)] if s}
        return _DataParallel(strategies.values())

    def step(self, x: Optional[torch.Tensor] = None, target: Optional[torch.Tensor] = None,
             losses: Optional[list] = None) -> float:
        """One forward and backward of the whole batch through the pipeline (see the module docstring)."""
        ex = self.driver.executor
        first, last = 0 in ex.stages, ex.last_stage in ex.stages
        if first and x is None:
            raise ValueError("pipeline step(x=…): this rank holds the first stage and needs the inputs")
        if last and target is None:
            raise ValueError("pipeline step(target=…): this rank holds the last stage and needs the targets")
        m = self.micro_batches
        xs = list(x.tensor_split(m)) if first else [None] * m
        ys = list(target.tensor_split(m)) if last else [None] * m
        if first and any(len(c) != len(xs[0]) for c in xs):
            raise ValueError(f"pipeline step: the batch of {len(x)} does not split into {m} equal micro-batches")
        micro = list(zip(xs, ys))
        data_parallel = self._data_parallel()
        if not self._shapes_known:
            self.driver.infer_shapes(micro)
            self._shapes_known = True
        recorded: List[float] = []
        loss_fn = ex.loss_fn
        if last and losses is not None:
            def loss_fn(out, y):
                value = self.loss_fn(out, y)
                recorded.append(float(value.detach()))
                return value
        ex.loss_fn = loss_fn
        try:
            mean = self.driver.step(data_parallel, micro)
        finally:
            ex.loss_fn = self.loss_fn
        if losses is not None:
            losses.extend(recorded)
        return mean


def pipeline(model: nn.Module, split_points: Optional[Sequence[str]] = None, schedule: str = "1f1b",
             micro_batches: int = 4, loss_fn: Callable = None, chunks: int = 1) -> PipelineSchedule:
    """Split ``model`` into pipeline stages over the ``pp`` ranks and return the schedule that steps them."""
    ctx = rank_context("zerokit.pipeline")
    if not isinstance(model, nn.Module):
        raise TypeError(f"zerokit.pipeline(model=…) needs an nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise ValueError("zerokit.pipeline(loss_fn=…) is required: loss_fn(output, target), as torch's schedules "
                         "take it")
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches!r} must be a positive integer")
    if not isinstance(model, nn.Sequential) and not hasattr(model, "pipeline_pieces"):
        raise ValueError(f"zerokit.pipeline: a {type(model).__name__} cannot be read as pieces; give an nn.Sequential, "
                         f"or a model with pipeline_pieces() returning (first, blocks, last) lists of (name, module) "
                         f"(torch's pipeline() traces any forward; zerokit does not)")
    if ctx.mesh.size("pp") == 1:
        if ctx.mesh.size("dp") != ctx.world_size:
            raise ValueError("zerokit.pipeline: the mesh has no pp axis and is not all dp; lay it out with "
                             "ctx.set_mesh({'pp': …, …}) first")
        ctx.set_mesh({"pp": ctx.world_size})
    if ctx.mesh.size("tp") > 1:
        raise ValueError("zerokit.pipeline: a mesh with tp above 1 around your own pipeline is not implemented "
                         "yet; zerokit.train(parallel={'dp': …, 'tp': …, 'pp': …}) runs it")
    partition = "blocks"
    if split_points is not None:
        blocks = [name for name, _ in pieces_of(model).blocks]
        unknown = [s for s in split_points if s not in blocks]
        if unknown:
            raise ValueError(f"split_points {unknown} name no block; the blocks are {blocks}")
        starts = [0] + sorted(blocks.index(s) for s in split_points) + [len(blocks)]
        partition = [b - a for a, b in zip(starts, starts[1:])]
    driver = parallelize(model, ctx, pipeline={"schedule": schedule, "chunks": chunks, "partition": partition},
                         micro_batches=micro_batches, loss_fn=loss_fn).pipeline
    return PipelineSchedule(driver, micro_batches, loss_fn)
