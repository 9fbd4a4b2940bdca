"""``hsdp`` / ``hsdp-zero2``: hybrid sharding — ZeRO inside a shard group, replicas across the groups.

FSDP2's ``fully_shard`` on a 2-D mesh (replicate, shard), torchtitan's ``dp_replicate × dp_shard``,
DeepSpeed's MiCS (Zhang et al., arXiv 2205.00119 §3): the N data-parallel ranks are cut into
r = N/s groups of s consecutive ranks (:meth:`zerokit.runtime.mesh.Mesh.carve`; by default s is
one node, :func:`zerokit.runtime.nodes.ranks_per_node`). Inside a group it is ZeRO over s ranks;
every group holds the same shards, so rank j of each group holds shard j. The ledger names the
two groups' traffic ``dp_shard`` and ``dp_replicate``.

``hsdp`` is ZeRO-3 inside the group (:class:`~.stage3.ZeroStage3`, same options); ``hsdp-zero2`` is
ZeRO-2 (:class:`~.stage2.ZeroStage2`: the parameters whole on every rank, gathered over s after the
step). Two strategies rather than a ``stage`` option, as ``zero2`` and ``zero3`` are two. One step:

1. **forward / backward** (``hsdp``): each unit is all-gathered over its shard group before its
   forward and again before its backward, freed after each, as in ``zero3``;
2. **after a unit's backward**: its gradients, divided by N (not s: the all-reduce below sums the
   replicas), are reduce-scattered inside the shard group — each rank holds its shard of the sum
   over its s ranks;
3. **across the replicas**: the r ranks holding shard j all-reduce it, which completes the sum over all
   N ranks: the same shard ZeRO-3 over N would hold, by another route. By default in the backward of the
   step's last micro-batch, each unit's all-reduce launched as its reduce-scatter lands and in flight while
   the rest of backward computes (FSDP2's); ``replicate_all_reduce="step"`` runs it at the step instead,
   ``all_reduce_every_micro_batch=True`` in every micro-batch's backward (:mod:`.hsdp_replicas`);
4. **step**: each rank steps its 1/s shard (``hsdp-zero2`` then all-gathers the parameters over s).

``hsdp`` takes FSDP2's defaults where they differ from ``zero3``'s DeepSpeed ones (:mod:`.fsdp2_lifecycle`): a
unit's gradients held by autograd until the unit is complete, one reduce-scatter in flight
(``reduce_bucket_size=1``), one unit prefetched in backward and none in forward
(``prefetch_bucket_size=None``), the gradient shards allocated per step (``contiguous_gradients=False``).
``hsdp-zero2`` (no FSDP2 counterpart: FSDP2's ZeRO-2 is ``reshard_after_forward=False``) keeps ``zero2``'s.

Memory and traffic: ZeRO's formulas with s for N plus the replicas' all-reduce of a shard,
:func:`zerokit.theory.hsdp_model_state_bytes` and :func:`zerokit.theory.hsdp_collective_bytes` (padding:
each unit to a multiple of s, as the flat buffers here are). s = N is ``zero3`` (``zero2``); s = 1 is
DDP's all-reduce. A clipped gradient's norm sums its squares over the shard group only (the replicas
hold the same shards). What hsdp leaves out, refused before any process starts: offload, the persistence
threshold, ``reduce_scatter=False`` (its formulas have no term for them), tensor/context/expert
parallelism, and ``zerokit.checkpoint`` (which lays shards out over dp).
"""
from __future__ import annotations

from .. import theory
from ..optim import GradientClipping
from ..runtime.nodes import ranks_per_node
from ..strategies.base import Option, boolean, register
from .experts import ShardGroup
from .fsdp2_lifecycle import ONE_IN_FLIGHT, FSDP2Lifecycle
from .hsdp_replicas import REPLICA_OPTIONS, ReplicaAllReduce
from .sharded import positive_elements
from .stage2 import ZeroStage2
from .stage3 import ZeroStage3


def _group_size(value) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)


HSDP_OPTIONS = {
    "shard_group_size": Option(None, _group_size,
                               "None (one node: torchrun's LOCAL_WORLD_SIZE or the launcher's emulated node size, "
                               "all the ranks without either; at most dp) or a whole number of ranks dividing dp: "
                               "the ranks one parameter is sharded over"),
    **REPLICA_OPTIONS,
    "offload": Option("none", lambda v: v == "none", "'none': hsdp keeps its shards on the device (its formulas "
                                                     "have no host term)"),
}


def shard_group_size(requested, dp: int) -> int:
    """The shard group s for ``dp`` ranks: ``requested``, or one node (clipped to dp); it must divide dp."""
    s = min(ranks_per_node(dp), dp) if requested is None else requested
    if not _group_size(s) or dp % s:
        raise ValueError(f"shard_group_size={requested!r} does not divide the {dp} data-parallel ranks; allowed: "
                         f"a divisor of {dp} ({', '.join(str(d) for d in range(1, dp + 1) if dp % d == 0)}) or "
                         f"None (one node)")
    return s


def check_shard_group_option(options: dict, shape: dict) -> None:
    """Before any process starts: an explicit ``shard_group_size`` against the layout's dp."""
    if options.get("shard_group_size") is not None:
        shard_group_size(options["shard_group_size"], shape["dp"])


class HybridSharding(ReplicaAllReduce):
    """What ``hsdp`` and ``hsdp-zero2`` add to ZeRO-3 / ZeRO-2: the shard and replicate groups, the all-reduce
    across replicas (:class:`~.hsdp_replicas.ReplicaAllReduce`), and their formulas. A mixin: ZeRO's ``__init__``
    asks :meth:`make_shard_groups`."""

    axes = ("dp",)
    #: zerokit.checkpoint lays shards out over dp; hsdp's are over the shard group, held by every replica
    checkpoint_refusal = ("zerokit.checkpoint does not save hsdp's shards yet (they are sharded over the shard "
                          "group, not dp); save the whole weights instead (Report.ranks[0].params, "
                          "strategy.full_parameters()) or checkpoint with zero3")

    check_layout = staticmethod(check_shard_group_option)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start_replicas()

    def make_shard_groups(self):
        mesh, dp = self.ctx.mesh, self.world
        s = self.shard_group_size = shard_group_size(self.opts["shard_group_size"], dp)
        self.replicas = dp // s
        shard, replicate = mesh.carve(s, "dp", ("dp_shard", "dp_replicate"))
        if dp == 1:
            self.replicate_group = ShardGroup("dp_replicate", None, 1, 0)
            return ShardGroup("dp_shard", None, 1, 0), None
        self.replicate_group = ShardGroup("dp_replicate", replicate, self.replicas, mesh.coord("dp_replicate"))
        return ShardGroup("dp_shard", shard, s, mesh.coord("dp_shard")), None

    def stepped_sharded(self) -> list:
        """A shard of a group of one rank is the whole unit, held alike by every rank."""
        return [self.shard_group_size > 1] * len(self.units)

    def clip_gradients(self, max_norm: float) -> None:
        """The norm's squares summed over the shard group: the replicas hold the same shards."""
        self.optimizer.clipping = GradientClipping(max_norm, self.stepped_sharded(), self.dense_group.group)

    # -- the formulas ----------------------------------------------------------------------
    def theory_model_states(self, psi):
        return theory.hsdp_model_state_bytes(psi, self.world, self.shard_group_size, self.config.precision,
                                             self.config.optimizer.name, units=self.flat_units(),
                                             optimizer_tensors=self.optimizer_tensors(),
                                             frozen_numel=self.frozen_numel(), stage=self.stage)

    def theory_comm_bytes_by_axis(self) -> dict:
        """Formula: bytes per step on ``dp_shard`` (gathers, reduce-scatters) and ``dp_replicate`` (all-reduces)."""
        by = theory.hsdp_collective_bytes(
            None, self.world, self.shard_group_size, theory.param_bytes_per_element(self.config.precision),
            self.config.micro_batches, units=self.flat_units(),
            all_reduce_every_micro_batch=self.opts["all_reduce_every_micro_batch"], stage=self.stage,
            reshard_after_forward=self.opts.get("reshard_after_forward", True))
        return {"dp_shard": sum(by["shard"].values()), "dp_replicate": sum(by["replicate"].values())}

    def theory_comm_bytes(self, psi):
        return sum(self.theory_comm_bytes_by_axis().values())


def _prefetch_elements(value) -> bool:
    return value is None or positive_elements(value)


@register
class HSDP(HybridSharding, FSDP2Lifecycle, ZeroStage3):
    """ZeRO-3 inside each shard group (a node), the gradient shards all-reduced across the groups; FSDP2's
    defaults (:mod:`.fsdp2_lifecycle`)."""

    name = "hsdp"
    options = {**ZeroStage3.options, **HSDP_OPTIONS,
               "param_persistence_threshold": Option(0, lambda v: v == 0 and not isinstance(v, bool),
                                                     "0: hsdp shards every trainable parameter (its formulas have "
                                                     "no term for parameters kept whole)"),
               "contiguous_gradients": Option(False, boolean, "False (FSDP2's: each unit's gradient shard allocated "
                                                              "at the step's first reduce-scatter, freed by zero_grad) "
                                                              "or True (all of them in one flat buffer, kept)"),
               "reduce_bucket_size": Option(ONE_IN_FLIGHT, positive_elements,
                                            "a positive whole number of elements: the most gradient elements whose "
                                            "reduce-scatter is in flight (1, the default: each waits for the one "
                                            "before it, FSDP2's reduce_scatter_max_input_buffers=1)"),
               "prefetch_bucket_size": Option(None, _prefetch_elements,
                                              "None (FSDP2's: the next unit prefetched as a unit's backward begins, "
                                              "none in forward) or a positive whole number of elements (DeepSpeed's: "
                                              "the units ahead within it, in both passes)")}

    def gradient_shards(self):
        return self.grad_shards


@register
class HSDPZero2(HybridSharding, ZeroStage2):
    """ZeRO-2 inside each shard group: parameters whole, gradients and optimizer states sharded over s."""

    name = "hsdp-zero2"
    options = {**ZeroStage2.options, **HSDP_OPTIONS,
               "reduce_scatter": Option(True, lambda v: v is True, "True: hsdp-zero2 reduce-scatters inside the "
                                                                   "shard group (its formulas count that)")}

    def gradient_shards(self):
        return self.shards
