"""Pipeline parallelism inside ``zerokit.train``: the ``pp`` strategy and the pipeline driver.

With ``parallel={"pp": p, …}`` (or strategy ``pp``, every rank on ``pp``) the training
loop hands each step's micro-batches to :class:`Pipeline` instead of running forward
and backward itself. Lifecycle on every rank:

1. ``Pipeline(job, ctx, model, loss_fn)``: builds the schedule from the job's options
   (``schedule``, ``chunks``, ``partition``; m = ``micro_batches``), keeps this rank's
   stages of the (already tensor-parallel) model and drops the rest; ``module`` is what
   the data-parallel strategy then wraps (``ddp``, ``zero1``, or ``pp``'s replicated
   one when dp = 1). Parameters tied across stages (GPT-2's embedding and head) get a
   process group of the ranks that hold them (Megatron's embedding group).
2. ``step(strategy, micro)``: the executor runs the schedule with every backward under
   the strategy's ``no_sync``; then the tied gradients are summed between their stages
   and ``strategy.finish_gradient_synchronization()`` reduces the accumulated gradients
   over ``dp`` once (one reduction per step, as without a pipeline). The step's loss
   comes from the last stage.
3. ``full_parameters``: every stage's parameters under the whole model's names, gathered
   on the first pipeline rank.

ZeRO-2 and ZeRO-3 are refused with a pipeline, as DeepSpeed refuses them: their
gradients would be reduce-scattered after every micro-batch's backward.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import theory
from ..runtime import comm
from ..strategies.base import Replicated, register
from .executor import Executor
from .partition import canonical_names, split, tied_parameters
from .options import PIPELINE_OPTIONS
from .schedules import schedule as build_schedule

@register
class PipelineParallel(Replicated):
    """Pure pipeline parallelism: every rank a stage, no data parallelism (``parallel`` defaults to pp = world)."""

    name = "pp"
    stage = 0
    axes = ("pp", "tp")
    data_parallel = False
    #: every rank on pp unless ``parallel`` says otherwise
    pipeline_only = True
    options = dict(PIPELINE_OPTIONS)

    def theory_comm_bytes(self, psi):
        return 0  # nothing on dp; the pp traffic is the executor's, accounted per axis

    def finish_gradient_synchronization(self):
        """No data parallelism: nothing to reduce."""


class Pipeline:
    """This rank's part of the pipeline, and how to run one step of it."""

    def __init__(self, options: dict, micro_batches: int, ctx, model: nn.Module, loss_fn, memory=None):
        mesh = ctx.mesh
        p, chunks = mesh.size("pp"), options.get("chunks", 1)
        partition = options.get("partition", "blocks")
        self.schedule = build_schedule(options.get("schedule", "1f1b"), p, micro_batches, chunks)
        self.pp_rank, self.group = mesh.coord("pp"), mesh.group("pp")
        self.names = canonical_names(model)
        self.stages = split(model, p, chunks, self.pp_rank, partition)
        self.module = nn.ModuleList(self.stages[s] for s in sorted(self.stages))
        self._tied = self._tied_groups(model, mesh, p, chunks, partition)
        self.executor = Executor(self.schedule, self.stages, self.pp_rank, mesh.ranks("pp"), self.group, loss_fn,
                                 ctx.device, memory)
        self.ctx = ctx

    def _tied_groups(self, model, mesh, p, chunks, partition) -> list:
        """[(parameter, group, holders)] for parameters held by more than one pipeline rank."""
        tied = tied_parameters(model, p, chunks, partition)
        if not tied:
            return []
        by_name = {name: param for name, param in model.named_parameters()}
        out = []
        for name, holders in sorted(tied.items()):
            mine = None
            # every rank creates every group, in the same order (torch's rule for new_group)
            for dp_i in range(mesh.size("dp")):
                for tp_i in range(mesh.size("tp")):
                    ranks = [(h * mesh.size("dp") + dp_i) * mesh.size("tp") + tp_i for h in holders]
                    group = dist.new_group(ranks)
                    if (dp_i, tp_i) == (mesh.coord("dp"), mesh.coord("tp")):
                        mine = group
            if self.pp_rank in holders:
                mesh.add_group(mine, "pp")
                out.append((by_name[name], mine, holders))
        return out

    def infer_shapes(self, micro: List[tuple]) -> None:
        self.executor.infer_shapes(micro[0][0])

    def run_schedule(self, micro: List[tuple]) -> Optional[float]:
        """The schedule's actions on this rank (zerokit's executor); the loss where the last stage is."""
        return self.executor.step(micro)

    def step(self, strategy, micro: List[tuple]) -> float:
        with strategy.no_sync():
            loss = self.run_schedule(micro)
        with comm.phase("backward"):
            for param, group, _ in self._tied:
                if param.grad is not None:
                    comm.all_reduce(param.grad, group=group, tag="tied gradient")
            strategy.finish_gradient_synchronization()
        return self._share_loss(loss)

    def _share_loss(self, loss: Optional[float]) -> float:
        """The last stage's loss on every pipeline rank (reported, not trained on: phase setup)."""
        if self.schedule.ranks == 1:
            return float(loss)
        value = torch.tensor([loss if loss is not None else 0.0], dtype=torch.float64, device=self.ctx.device)
        with comm.phase("setup"):
            comm.broadcast(value, self.ctx.mesh.ranks("pp")[-1], self.group, tag="loss report")
        return float(value)

    def spans(self) -> list:
        return [(str(a), start, end) for a, start, end in self.executor.timed_spans()]

    def full_parameters(self, local: Optional[Dict[str, torch.Tensor]], module_names: Dict[int, str]) -> Optional[dict]:
        """Every stage's parameters under the whole model's names, on pipeline rank 0 (``local``: this rank's
        stages' parameters by their names in :attr:`module`, None where the strategy keeps them elsewhere)."""
        mine = {self.names[pid]: local[name] for pid, name in module_names.items()
                if local is not None and pid in self.names}
        if self.schedule.ranks == 1:
            return mine
        gathered = [None] * self.schedule.ranks if self.pp_rank == 0 else None
        dist.gather_object(mine, gathered, dst=self.ctx.mesh.ranks("pp")[0], group=self.group)
        if self.pp_rank != 0:
            return None
        out: dict = {}
        for part in gathered:
            for name, t in part.items():
                out.setdefault(name, t)
        return {name: out[name] for name in sorted(out, key=list(self.names.values()).index)}

    def theory_pp_bytes(self, element_bytes: int) -> float:
        """What this rank sends on ``pp`` per step: :func:`zerokit.theory.pipeline_send_bytes` for each remote
        boundary of its stages, plus the tied gradients' all-reduce."""
        last, total, m = self.schedule.stages - 1, 0.0, self.schedule.micro_batches
        shapes = self.executor.shapes
        for s in self.stages:
            if s < last and self.schedule.rank_of(s + 1) != self.pp_rank:  # activations forward
                total += theory.pipeline_send_bytes(torch.Size(shapes[s][0]).numel(), m, element_bytes)
            if s > 0 and self.schedule.rank_of(s - 1) != self.pp_rank:  # their gradients backward
                total += theory.pipeline_send_bytes(torch.Size(shapes[s - 1][0]).numel(), m, element_bytes)
        for param, _, holders in self._tied:
            total += theory.ring_bytes_sent("all_reduce", param.numel() * param.element_size(), len(holders))
        return total
