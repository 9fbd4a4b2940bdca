"""What ZeRO-1 and ZeRO-2 share: :class:`ShardedDataParallel` (flat units of whole parameters, each rank's shards,
the step on them and the all-gather after it), the options both take and the flat collectives.

``zero1`` (:mod:`.stage1`), ``zero2-naive`` (:mod:`.stage2_naive`) and ``zero2`` (:mod:`.stage2`) build on it; they
differ in where the gradients live and when they are reduce-scattered.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from .. import theory
from ..strategies.pipeline_options import REFUSED
from ..runtime import comm
from ..offload.zero_hooks import Offload, offload_option
from ..strategies.base import Option, Strategy, boolean
from ..data_parallel.base import ALGORITHMS, check_replicas_match, one_of
from ..runtime.ring import ring_all_reduce, ring_reduce_scatter
from .flat_buffer import (FlatUnit, all_gather_unit, assign_units, check_elements, check_trainable,
                          check_world_size)
from .experts import (check_expert_options, check_expert_replicas, group_of, is_expert, reduce_local,
                      shard_groups, unit_params)

#: DeepSpeed's defaults for its bucket sizes, in elements (FACTS §7)
DEFAULT_REDUCE_BUCKET = 500_000_000
DEFAULT_ALLGATHER_BUCKET = 500_000_000


def positive_elements(value) -> bool:
    try:
        check_elements("size", value)
    except ValueError:
        return False
    return True


def stage_option(stage: int) -> Option:
    """``stage``: only here so that a DeepSpeed config naming another stage fails loudly."""
    return Option(stage, lambda v: v == stage and not isinstance(v, bool),
                  f"this strategy is ZeRO stage {stage}; a DeepSpeed config for another stage needs that stage's "
                  f"strategy (zero1, zero2 or zero3)")


ELEMENTS = "a positive whole number of elements (DeepSpeed counts bucket sizes in elements, not bytes)"

SHARED_OPTIONS = {
    "reduce_bucket_size": Option(DEFAULT_REDUCE_BUCKET, positive_elements,
                                 f"{ELEMENTS}: the most elements in one unit (one reduce-scatter)"),
    "allgather_bucket_size": Option(DEFAULT_ALLGATHER_BUCKET, positive_elements,
                                    f"{ELEMENTS}: the most elements one parameter all-gather moves"),
    "overlap_comm": Option(True, boolean, "True (reduce each unit asynchronously during backward as it fills) or "
                                          "False (after it, synchronously)"),
    "reduce_scatter": Option(True, boolean, "True (reduce-scatter gradients) or False (all-reduce them and keep "
                                            "the own shard: DeepSpeed's reduce_scatter=false)"),
}

#: ``algorithm``: the backend's collectives, or zerokit's ring on send/recv (which counts the bytes it sends)
ALGORITHM_OPTION = Option("torch", one_of(*ALGORITHMS),
                          "'torch' (the backend's collectives) or 'ring' (zerokit's ring on send/recv: the ledger "
                          "counts the bytes really sent; synchronous, so nothing overlaps)")
SHARED_OPTIONS["algorithm"] = ALGORITHM_OPTION
#: ``offload``: 'none' or 'optimizer' (zerokit.offload)
SHARED_OPTIONS["offload"] = offload_option(1)


def reduce_scatter_flat(out: torch.Tensor, flat: torch.Tensor, group, algorithm: str, async_op: bool, tag: str):
    """Sum ``flat`` over the ranks and leave this rank's chunk in ``out``: the backend's or zerokit's ring."""
    if algorithm == "ring":
        ring_reduce_scatter(out, flat, group=group, tag=tag)
        return None
    return comm.reduce_scatter(out, flat, group=group, async_op=async_op, tag=tag)


def all_reduce_flat(flat: torch.Tensor, group, algorithm: str, async_op: bool, tag: str):
    if algorithm == "ring":
        ring_all_reduce(flat, group=group, tag=tag)
        return None
    return comm.all_reduce(flat, group=group, async_op=async_op, tag=tag)


class ShardedDataParallel(Strategy):
    """Flat units of whole parameters on every rank; each rank steps its shards and all-gathers the rest.

    With expert parallelism (``ep`` > 1) the experts' parameters get units of their own, sharded over the ranks
    that hold the same experts (``edp``), the dense ones over dp (:mod:`.experts`).
    """

    #: data parallelism over the tensor-parallel shards when the mesh has tp > 1 (2-D parallelism)
    axes = ("dp", "cp", "tp")
    name = "zero-base"
    stage = 1
    pipeline_refusal = REFUSED

    def __init__(self, model, ctx, config, **options):
        super().__init__(model, ctx, config, **options)
        params = check_trainable(model, self.name)
        check_expert_options(self)
        #: the groups units are sharded over: dense ones over dp, the experts' over edp (None without experts)
        self.dense_group, self.expert_group = self.make_shard_groups()
        key = is_expert if self.expert_group is not None else None
        for group, kind in ((self.dense_group, False), (self.expert_group, True)):
            if group is not None:
                check_world_size(sum(p.numel() for p in params if is_expert(p) == kind), group.world)
        check_replicas_match(model, self.group, ctx.device)
        check_expert_replicas(self, model, ctx.device)
        names = {p: n for n, p in model.named_parameters()}
        self.params = params
        self.units: List[FlatUnit] = []
        for index, members in enumerate(assign_units(params, self.unit_numel(), key)):
            members = [params[i] for i in members]
            expert = key is not None and is_expert(members[0])
            group = self.expert_group if expert else self.dense_group
            self.units.append(FlatUnit(members, group.world, group.rank, index, [names[p] for p in members],
                                       expert=expert))
        self.unit_of = {p: unit for unit in self.units for p in unit.params}
        self.param_shards = [unit.shard(unit.data) for unit in self.units]
        self.offload = Offload(self, self.opts.get("offload", "none"))  # zerokit.offload: the optimizer on the host
        self.optimizer = self.offload.optimizer(self.param_shards, [unit.shard_layout() for unit in self.units])
        self.allgather_numel = check_elements("allgather_bucket_size",
                                              self.opts.get("allgather_bucket_size", DEFAULT_ALLGATHER_BUCKET))

    def make_shard_groups(self):
        """(dense group, expert group or None): the groups the units are sharded over (``hsdp-zero2``: a node's)."""
        return shard_groups(self)

    def unit_numel(self) -> int:
        return check_elements("reduce_bucket_size", self.opts["reduce_bucket_size"])

    def unit_group(self, unit: FlatUnit):
        """The :class:`~.experts.ShardGroup` ``unit`` is sharded over: dp, or edp for an expert unit."""
        return group_of(self.dense_group, self.expert_group, unit)

    # -- the reduction ---------------------------------------------------------------
    def reduce_unit(self, unit: FlatUnit, flat: torch.Tensor, out: torch.Tensor,
                    async_op: bool) -> Optional[comm.Work]:
        """Average ``flat`` (this unit's gradients) over the ranks into ``out`` (this rank's shard).

        Divides by N first (PREMUL_SUM fails on gloo), then sums over the unit's group (dp; an expert
        unit's over edp, still divided by N = dp). With ``reduce_scatter=False`` the whole buffer is
        all-reduced and the caller keeps the own slice (``out`` must then be that slice of ``flat``).
        """
        flat.div_(self.world)
        group = self.unit_group(unit)
        algorithm, tag = self.opts.get("algorithm", "torch"), f"grads unit {unit.index}"
        if group.world == 1:  # ep = dp: the ranks holding these experts are this one alone
            return reduce_local(out, flat)
        if self.opts.get("reduce_scatter", True):
            return reduce_scatter_flat(out, flat, group.group, algorithm, async_op, tag)
        return all_reduce_flat(flat, group.group, algorithm, async_op, tag)

    def grad_shards(self) -> List[torch.Tensor]:
        raise NotImplementedError

    # -- the loop --------------------------------------------------------------------
    def step(self):
        self.optimizer.step(self.grad_shards())
        self.gather_parameters()

    def gather_parameters(self) -> None:
        """All-gather every unit's updated shards into its full buffer (in place), asynchronously unit by unit."""
        works = []
        for unit, shard in zip(self.units, self.param_shards):
            group = self.unit_group(unit)
            if group.world == 1:  # the shard is the whole unit, updated in place
                continue
            work = all_gather_unit(unit, shard, self.allgather_numel, group=group.group,
                                   tag=f"params unit {unit.index}", async_op=True,
                                   algorithm=self.opts.get("algorithm", "torch"))
            if work is not None:
                works.append(work)
        for work in works:
            work.wait()

    # -- measurement -----------------------------------------------------------------
    def track_memory(self, ledger):
        super().track_memory(ledger)
        self.offload.track_optimizer(ledger, self.optimizer)

    def flat_units(self):
        return [unit.numel for unit in self.units]

    def stepped_sharded(self) -> list:
        return [True] * len(self.units)  # every stepped tensor is this rank's shard of a unit

    def optimizer_tensors(self):
        return self.optimizer.step_scalars

    def theory_model_states(self, psi):
        if self.expert_group is None:
            return super().theory_model_states(psi)
        return theory.expert_zero_model_state_bytes(
            self.stage, unit_params(self.units, False), self.world, unit_params(self.units, True),
            self.expert_group.world, self.config.precision, self.config.optimizer.name,
            optimizer_tensors=self.optimizer_tensors(), frozen_numel=self.frozen_numel())

    def _group_comm_bytes(self, units, n: int):
        b = theory.param_bytes_per_element(self.config.precision)
        if self.opts.get("reduce_scatter", True):
            return theory.comm_bytes_per_step(self.stage, sum(units), n, b, self.config.micro_batches, units=units)
        # all-reduce instead of reduce-scatter: ZeRO-1 once per step, ZeRO-2 every micro-batch
        reductions = self.config.micro_batches if self.stage == 2 else 1
        padded = theory.padded_numel(units, n) * b
        return (reductions * theory.ring_bytes_sent("all_reduce", padded, n)
                + theory.ring_bytes_sent("all_gather", padded, n))

    def theory_comm_bytes(self, psi):
        """Formula: bytes per step on dp (with expert parallelism: the dense units' alone)."""
        return self._group_comm_bytes(unit_params(self.units, False), self.world)

    def theory_expert_comm_bytes(self):
        """Formula: bytes per step on edp, the expert units' (0 without expert parallelism)."""
        if self.expert_group is None:
            return 0
        return self._group_comm_bytes(unit_params(self.units, True), self.expert_group.world)
