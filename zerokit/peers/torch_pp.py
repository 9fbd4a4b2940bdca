"""Peers for pipeline parallelism: torch.distributed.pipelining's own schedules.

``torch-pp-gpipe``, ``torch-pp-1f1b`` and ``torch-pp-interleaved`` (two chunks per rank) run the same stages
zerokit's ``pp`` runs (the same :mod:`~zerokit.pipeline_parallel.partition`), every rank
on ``pp``. Lifecycle on each rank:

1. the model is split exactly as for ``pp`` (:class:`~zerokit.pipeline_parallel.strategy.Pipeline`,
   whose executor is simply not used); each local stage becomes a ``PipelineStage`` on the
   mesh's ``pp`` group, and the schedule gets the loss divided by m and
   ``scale_grads=False`` (torch divides gradients by m by default; zerokit's loss already
   does, FACTS §10);
2. per step, the micro-batches are put back into the rank's batch and handed to
   ``schedule.step`` (inputs on the first rank, targets on the last), inside the peer
   recording context, which counts torch's ``isend`` / ``irecv`` / ``batch_isend_irecv``
   as ``send`` / ``recv`` on ``pp``. torch's schedule runs forward and backward in one
   call, so all of its traffic is filed under phase ``forward``;
3. gradients of parameters tied across stages are summed between their stages (torch's
   pipelining leaves that to the user), then the optimizer steps each stage.

fp32 only. torch infers its shapes at the first step; zerokit's shape pass (setup) runs
too, for the traffic formula.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from ..pipeline_parallel.options import PIPELINE_OPTIONS
from ..pipeline_parallel.strategy import Pipeline, PipelineParallel
from ..runtime import comm
from ..strategies.base import register
from .recording import fp32_only, ledgered_torch_collectives

#: zerokit's name -> (torch's schedule class name, chunks per rank)
SCHEDULES = {"torch-pp-gpipe": ("ScheduleGPipe", 1), "torch-pp-1f1b": ("Schedule1F1B", 1),
             "torch-pp-interleaved": ("ScheduleInterleaved1F1B", 2)}


class TorchPipeline(Pipeline):
    """The same stages and names as zerokit's pipeline, run by a torch.distributed.pipelining schedule."""

    def __init__(self, options: dict, micro_batches: int, ctx, model, loss_fn, strategy_name: str):
        import torch.distributed.pipelining as pipelining

        class_name, chunks = SCHEDULES[strategy_name]
        ours = "interleaved" if chunks > 1 else ("gpipe" if class_name == "ScheduleGPipe" else "1f1b")
        super().__init__({**options, "schedule": ours, "chunks": chunks}, micro_batches, ctx, model, loss_fn)
        p, stage_ids = ctx.mesh.size("pp"), sorted(self.stages)
        m = micro_batches
        scaled = (lambda out, y: loss_fn(out, y) / m)
        stages = [pipelining.PipelineStage(self.stages[s], s, p * chunks, ctx.device, group=self.group)
                  for s in stage_ids]
        cls = getattr(pipelining, class_name)
        self.torch_schedule = (cls(stages[0], m, loss_fn=scaled, scale_grads=False) if chunks == 1 else
                               cls(stages, m, loss_fn=scaled, scale_grads=False))
        self.first, self.last = self.pp_rank == 0, self.pp_rank == p - 1
        self.name = strategy_name

    def run_schedule(self, micro) -> float:
        x = torch.cat([a for a, _ in micro])
        y = torch.cat([b for _, b in micro])
        losses: list = []
        args, kwargs = ((x,) if self.first else ()), ({"target": y, "losses": losses} if self.last else {})
        watch = self.executor.memory.watch_activations() if self.executor.memory is not None else nullcontext()
        with ledgered_torch_collectives(self.name), comm.phase("forward"), watch:
            self.torch_schedule.step(*args, **kwargs)
        return float(sum(loss.detach() for loss in losses)) if self.last else None

    def spans(self):
        return None


class TorchPipelinePeer(PipelineParallel):
    """One of torch's schedules, every rank on ``pp`` (see the module docstring)."""

    peer = True
    axes = ("pp",)
    options = {"partition": PIPELINE_OPTIONS["partition"]}

    def __init__(self, model, ctx, config, **options):
        fp32_only(self.name, config)
        super().__init__(model, ctx, config, **options)

    @classmethod
    def pipeline_driver(cls, options, micro_batches, ctx, model, loss_fn):
        return TorchPipeline(options, micro_batches, ctx, model, loss_fn, cls.name)


for _name in SCHEDULES:
    register(type(_name.replace("-", "_"), (TorchPipelinePeer,), {"name": _name}))
