"""``zeropp``: ZeRO++ (Wang et al., arXiv 2306.10209) — ZeRO-3 with its three communication cuts.

ZeRO-3's lifecycle (:mod:`.stage3`) unchanged, three of its collectives replaced, each by an option
named as DeepSpeed names it:

- ``zero_quantized_weights`` (**qwZ**, §3.1, :mod:`.qwz`): every all-gather of weights over the N
  data-parallel ranks sends int8 blocks of ``quantization_block_size`` elements and dequantizes them on
  arrival (forward, and backward when hpZ is off, as DeepSpeed does). Forward and backward compute with
  ŵ, |ŵ − w| ≤ scale/2; the shards the optimizer steps stay exact.
- ``zero_hpz_partition_size`` (**hpZ**, §3.2, :mod:`.hpz`): s > 1 keeps a secondary copy of every unit
  sharded over groups of s consecutive ranks (one node when s = the ranks per node, DeepSpeed's
  setting), filled by the step's first gather over N; every later gather of the step (backward, and
  the further micro-batches' forwards under gradient accumulation) reads it inside the group, in the
  compute dtype, as DeepSpeed does. 1 = off.
- ``zero_quantized_gradients`` (**qgZ**, §3.3, :mod:`.qgz`): each unit's gradient reduce-scatter
  becomes the two-hop quantized all-to-all (``gradient_bits``: 4, the paper's, or 8), inside the node
  then across nodes. The node is :attr:`zerokit.runtime.mesh.Mesh.ranks_per_node` (torchrun's
  ``LOCAL_WORLD_SIZE``, or the launcher's emulated node size; one node when neither is set). As
  DeepSpeed, only when the ranks span nodes, and only for the units whose gradients DeepSpeed's kernels
  take (:func:`.qgz.qgz_reduces_unit`); the other reduce-scatters run exactly, each with a note on the
  ledger saying why (the result's notes).

All three off is ZeRO-3 bit for bit. The ledger names the groups: ``dp`` (all N ranks), ``hpz`` (the
secondary partition), ``node`` and ``inter_node`` (qgZ's hops, :meth:`~zerokit.runtime.mesh.Mesh.node_groups`);
the formulas they are held against per axis, and the paper's 3M → 0.75M cross-node accounting:
:mod:`zerokit.theory.zeropp`; the ledger read into the paper's terms, and the memory ledger's secondary
copy: :mod:`.zeropp_accounting`; the loss curves and measured errors: :mod:`.zeropp_error`. Not combined
here with offload, the ring algorithm, ``reshard_after_forward=False``, persistent parameters or
tp/cp/ep. Whole parameters (``full_parameters``, checkpoints) are always gathered exactly.

The codec (:mod:`.quantize`): blocks of ``quantization_block_size`` elements, one float32 scale each,
codes on ``quantization_grid`` — ``"symmetric"`` (zerokit's choice, the default: codes ±(2^(b−1) − 1),
every element within scale/2) or ``"deepspeed"`` (DeepSpeed's kernels: scale absmax/2^(b−1), codes
−2^(b−1) … 2^(b−1) − 1, +absmax clipped one step; the same bytes). ``measure_quantization_error=True``
(zerokit's measurement; off by default, as DeepSpeed measures nothing) hands every round trip to
:attr:`weight_error` / :attr:`gradient_error`, which keep their totals on the device until taken.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext

from ..runtime import comm
from ..strategies.base import Option, boolean, register
from ..theory.zeropp import qgz_runs
from .hpz import SecondaryPartition
from .qgz import qgz_reduces_unit, quantized_reduce_scatter
from .quantize import GRIDS, ErrorTally, check_block_size
from .qwz import ThenWork, quantized_all_gather
from .stage3 import ZeroStage3
from .stage3_options import STAGE3_OPTIONS
from .zeropp_accounting import ZeroPlusPlusAccounting

#: zerokit's default block: 256 elements, one float32 scale each (over the codes' bytes: 4/256 = 1.6 % at
#: int8, 4/128 = 3.1 % at int4). DeepSpeed's
#: qwZ picks a group count per tensor instead (groups of at most ~8,000 elements, :mod:`.quantize`).
DEFAULT_BLOCK_SIZE = 256


def _block_size_ok(value) -> bool:
    try:
        check_block_size(value)
    except ValueError:
        return False
    return True


def _only(value, why: str) -> Option:
    return Option(value, lambda v, value=value: v == value and type(v) is type(value), why)


ZEROPP_OPTIONS = {
    **STAGE3_OPTIONS,
    "zero_quantized_weights": Option(False, boolean, "True (qwZ: weights all-gathered as int8 blocks) or False"),
    "zero_hpz_partition_size": Option(1, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                                      "1 (hpZ off) or the ranks of the secondary partition (a whole number "
                                      "dividing dp; DeepSpeed's setting: the GPUs per node)"),
    "zero_quantized_gradients": Option(False, boolean, "True (qgZ: gradients reduced by a quantized 2-hop "
                                                       "all-to-all) or False"),
    "quantization_block_size": Option(DEFAULT_BLOCK_SIZE, _block_size_ok,
                                      "a whole number >= 1: elements per quantization block (one float32 scale each)"),
    "gradient_bits": Option(4, lambda v: v in (4, 8) and not isinstance(v, bool), "4 (the paper's int4) or 8"),
    "quantization_grid": Option("symmetric", lambda v: isinstance(v, str) and v in GRIDS,
                                "'symmetric' (zerokit's: codes ±(2^(b−1) − 1), within scale/2) or 'deepspeed' "
                                "(DeepSpeed's kernels: scale absmax/2^(b−1), codes −2^(b−1) … 2^(b−1) − 1)"),
    "measure_quantization_error": Option(False, boolean, "False (nothing measured, as DeepSpeed) or True (each "
                                                         "rank tallies its round trips' error on the device)"),
    "algorithm": _only("torch", "'torch': zeropp runs the backend's collectives (zerokit's ring is not combined)"),
    "offload": _only("none", "'none': zeropp is not combined with zerokit.offload"),
    "reshard_after_forward": _only(True, "True: hpZ and qwZ replace the backward gather, which needs it"),
    "param_persistence_threshold": _only(0, "0: every parameter is sharded (persistent parameters are not "
                                            "combined with ZeRO++ here)"),
}


@register
class ZeroPlusPlus(ZeroPlusPlusAccounting, ZeroStage3):
    """ZeRO-3 with quantized weight gathers (qwZ), a node-local secondary copy (hpZ), quantized gradients (qgZ)."""

    name = "zeropp"
    axes = ("dp",)
    options = ZEROPP_OPTIONS

    @staticmethod
    def check_layout(options: dict, shape: dict) -> None:
        """Before any process starts: the hpZ partition divides dp."""
        s, dp = options.get("zero_hpz_partition_size", 1), shape["dp"]
        if dp % s:
            raise ValueError(f"strategy 'zeropp': zero_hpz_partition_size={s} must divide the {dp} data-parallel "
                             f"ranks (1, or a divisor of dp: DeepSpeed's setting is the GPUs per node)")

    def __init__(self, model, ctx, config, **options):
        super().__init__(model, ctx, config, **options)
        o = self.opts
        self.block_size = o["quantization_block_size"]
        self.hpz_size = o["zero_hpz_partition_size"]
        if self.world % self.hpz_size:
            raise ValueError(f"strategy 'zeropp': zero_hpz_partition_size={self.hpz_size} must divide the "
                             f"{self.world} data-parallel ranks")
        self.ranks_per_node = ctx.mesh.ranks_per_node  # dp is the world: zeropp runs on dp alone
        self.grid = o["quantization_grid"]
        #: measured round-trip errors of this rank's quantized weights and gradient pieces, since last taken
        #: (handed round trips only under measure_quantization_error=True)
        self.weight_error, self.gradient_error = ErrorTally(self.grid), ErrorTally(self.grid)
        self._measure = o["measure_quantization_error"]
        self._exact = False  # True while gathering whole parameters: no quantization, no secondary copy
        self.secondary = None
        if self.hpz_size > 1:
            group, _ = ctx.mesh.carve(self.hpz_size, "dp", names=("hpz", "hpz_replicate"))
            self.secondary = SecondaryPartition([u.flat for u in self.units], group, self.hpz_size,
                                                self.rank % self.hpz_size)
        #: qgZ runs (asked for, and the ranks span nodes), and for which units (the others: the reduce-scatter)
        self.qgz_runs = o["zero_quantized_gradients"] and qgz_runs(self.world, self.ranks_per_node)
        self.qgz_units = [qgz_reduces_unit(u.flat.params, self.world) for u in self.units]
        self.intra_node = self.inter_node = None
        if self.qgz_runs:
            self.intra_node, self.inter_node = ctx.mesh.node_groups()

    # -- gathering -------------------------------------------------------------------
    def _gather(self, unit) -> None:
        group = self.unit_group(unit)
        if group.world == 1 or self._exact:
            return super()._gather(unit)
        if self.secondary is not None and self.secondary.fresh[unit.index]:  # any gather after the step's first
            unit.gather(lambda out, shard, tag: self.secondary.gather(unit.index, out, tag))
            return
        quantize = self.opts["zero_quantized_weights"]
        keep = self.secondary is not None
        if not (quantize or keep):
            return super()._gather(unit)

        def gather(out, shard, tag):
            if quantize:
                work = quantized_all_gather(out, shard, group.group, group.world, group.rank, self.block_size, tag,
                                            self.weight_error if self._measure else None, self.grid)
            else:
                work = comm.all_gather(out, shard, group=group.group, async_op=True, tag=tag)
            return ThenWork(work, lambda: self.secondary.keep(unit.index, out)) if keep else work

        unit.gather(gather)

    @contextmanager
    def gathered(self):
        """Every unit gathered exactly (no quantization, no secondary copy), freed again on exit."""
        previous, self._exact = self._exact, True
        try:
            with super().gathered():
                yield
        finally:
            self._exact = previous

    # -- gradients -------------------------------------------------------------------
    def _reduce_scatter(self, unit, out, bucket, overlap):
        if not (self.qgz_runs and self.qgz_units[unit.index]) or self.unit_group(unit).world == 1:
            why = self._qgz_fallback_note(unit)
            with comm.note(why) if why else nullcontext():
                return super()._reduce_scatter(unit, out, bucket, overlap)
        quantized_reduce_scatter(out, bucket, self.intra_node, self.inter_node, self.ranks_per_node, self.block_size,
                                 self.opts["gradient_bits"], f"grads {unit.label}",
                                 self.gradient_error if self._measure else None, self.grid)
        return None

    def _qgz_fallback_note(self, unit) -> str:
        """Why qgZ, asked for, left this unit's gradient to the exact reduce-scatter ("" when not asked for)."""
        if not self.opts["zero_quantized_gradients"] or self.unit_group(unit).world == 1:
            return ""
        if not self.qgz_runs:
            return (f"qgZ did not run: the {self.world} ranks are one node (ranks_per_node={self.ranks_per_node}); "
                    f"as DeepSpeed, qgZ runs only when the ranks span nodes: gradients reduce-scattered exactly")
        return (f"qgZ fell back to the exact reduce-scatter for the units whose gradients are all 1-D or of sizes "
                f"not divisible by 2N = {2 * self.world}, as DeepSpeed does per gradient")

    def step(self):
        super().step()
        if self.secondary is not None:
            self.secondary.expire()
