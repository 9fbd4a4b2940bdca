"""``zero1``: ZeRO stage 1, optimizer-state partitioning (P_os, arXiv 1910.02054 §5.1).

Every rank holds the whole model and its whole gradients, but optimizer states — and,
in bf16 mixed precision, the fp32 master weights — only for the shard it owns. One
step:

1. The parameters live in flat *units* of at most ``reduce_bucket_size`` elements
   (:mod:`.flat_buffer`), each padded to a multiple of N; rank r owns the r-th
   contiguous 1/N of every unit. The gradients are views into a gradient buffer of the
   same layout, so autograd accumulates straight into what is reduced.
2. Gradients are reduce-scattered (divided by N first, then summed), unit by unit: in
   the last micro-batch's backward as each unit fills (``overlap_comm``, launched
   asynchronously in unit order, waited for when backward ends), or all after backward.
   The reduced shard lands in place, on the rank's own slice of the gradient buffer.
3. Each rank steps its shard of every unit (``MasterOptimizer``, through fp32 masters
   in bf16-mixed) and the updated parameters are all-gathered, in chunks of at most
   ``allgather_bucket_size`` elements.

``algorithm="ring"`` runs every reduce-scatter and all-gather on zerokit's ring over
send/recv, so the ledger's ``sent_bytes`` shows a reduce-scatter really sending
(N−1)/N of the buffer (gloo's own reduce-scatter is an all-reduce underneath).

With expert parallelism (``ep`` > 1, :mod:`.experts`) the experts' parameters get units of their
own, sharded over the dp/ep ranks that hold the same experts (``edp``); their gradients are divided
by N = dp and reduce-scattered over edp, and their shards all-gathered there.

``offload="optimizer"`` (:mod:`zerokit.offload`): step 3 runs on the host — the reduced
gradient shards are copied out, the fp32 masters and states live there, the updated shards
come back before the all-gather.

Per rank: params 2Ψ and grads 2Ψ (bf16) or 4Ψ + 4Ψ (fp32), padded; optimizer K·Ψ/N
(FACTS §1). Traffic 2(N−1)/N·Ψb, the same as DDP (FACTS §2): a reduce-scatter and
an all-gather are an all-reduce cut in half. With accumulation the gradients
accumulate under ``no_sync`` and are reduced once per step.

:class:`ShardedDataParallel` (:mod:`.sharded`) holds what ZeRO-1 and ZeRO-2 share (units, parameter
shards, the step and the gather); ``zero2`` and ``zero2-naive`` build on it.
"""
from __future__ import annotations

import torch

from ..data_parallel.reducer import Reducer
from ..strategies.base import Option, register
from ..strategies.pipeline_options import PIPELINE_OPTIONS, REFUSED  # noqa: F401 - REFUSED: its old home
from .sharded import (ALGORITHM_OPTION, DEFAULT_ALLGATHER_BUCKET, DEFAULT_REDUCE_BUCKET, ELEMENTS,  # noqa: F401
                      SHARED_OPTIONS, ShardedDataParallel, all_reduce_flat, positive_elements, reduce_scatter_flat,
                      stage_option)


@register
class ZeroStage1(ShardedDataParallel):
    """ZeRO-1: full params and grads; optimizer states for the own shard; reduce-scatter, step, all-gather."""

    name = "zero1"
    stage = 1
    #: data parallelism over tensor-parallel shards and pipeline stages (DeepSpeed's pipeline + ZeRO-1)
    axes = ("dp", "cp", "ep", "tp", "pp")
    pipeline_refusal = ""
    options = {
        "stage": stage_option(1),
        **SHARED_OPTIONS,
        **PIPELINE_OPTIONS,
        "contiguous_gradients": Option(True, lambda v: v is True,
                                       "True only: ZeRO-1's gradients are always views into contiguous flat "
                                       "buffers (the unit layout), so autograd accumulates straight into them"),
    }

    def __init__(self, model, ctx, config, **options):
        super().__init__(model, ctx, config, **options)
        self.grad_buffers = [unit.new_flat() for unit in self.units]
        self.grad_views = {p: v for unit, flat in zip(self.units, self.grad_buffers)
                           for p, v in zip(unit.params, unit.views(flat))}
        self.attach_grads()
        self.reducer = Reducer([len(u.params) for u in self.units], self._launch, before_finish=self.attach_grads)
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_gradient_ready) for p in self.params]

    def attach_grads(self) -> None:
        """Make every ``p.grad`` its view into the unit's gradient buffer (bringing a replaced grad home)."""
        with torch.no_grad():
            for p, view in self.grad_views.items():
                if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                    if p.grad is None:
                        view.zero_()
                    else:
                        view.copy_(p.grad)
                    p.grad = view

    # -- during the last micro-batch's backward ------------------------------------------
    def _on_gradient_ready(self, p) -> None:
        if not self._sync:
            return
        if self.reducer.ready(self.unit_of[p].index, p) and self.opts["overlap_comm"]:
            self.reducer.launch_full()

    def _launch(self, index: int) -> None:
        unit, flat = self.units[index], self.grad_buffers[index]
        self.reducer.track(self.reduce_unit(unit, flat, unit.shard(flat), async_op=self.opts["overlap_comm"]))

    def backward(self, loss):
        self.reducer.backward(loss, sync=self._sync)

    def finish_gradient_synchronization(self):
        """Reduce-scatter every unit of the gradients accumulated under ``no_sync`` now."""
        self.reducer.finish()

    def zero_grad(self):
        for flat in self.grad_buffers:
            flat.zero_()
        self.attach_grads()

    def grad_shards(self):
        return [unit.shard(flat) for unit, flat in zip(self.units, self.grad_buffers)]
