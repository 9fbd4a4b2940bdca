"""``fsdp2-zero2`` / ``fsdp2-zero3`` / ``fsdp2-hsdp``: torch's FSDP2 (``fully_shard``) in zerokit's ledgers.

Lifecycle:

1. **setup**: the model is cut into the same units zerokit's ``zero3`` forms
   (:func:`zerokit.zero.units.form_units`, option ``unit_size``: ``"block"`` by default —
   each repeated transformer block is a unit, the root takes the rest — or a number of
   elements). A shared parameter (tied embedding and head) belongs to the unit of the
   lowest common ancestor of the modules that hold it, so both of its uses end up in
   one ``fully_shard`` group. ``fully_shard`` is applied to each unit's module, children
   before parents (a ModuleList unit, which has no forward to hook, as the list of its
   children that hold the unit's parameters: one group), then to the root; every
   parameter becomes a DTensor holding this rank's shard (dim 0, padded to a multiple of N);
2. **forward**: each group's pre-forward hook all-gathers its parameters; after its
   forward it frees them (``reshard_after_forward=True``, ``fsdp2-zero3``) or keeps them
   until its backward (``False``, ``fsdp2-zero2``);
3. **backward**: a group is gathered again if it was freed, then its gradients are
   reduce-scattered into the gradient shards (``p.grad`` is a sharded DTensor);
4. **step**: a plain torch optimizer steps the local shards.

``fsdp2-zero3-offload`` adds ``CPUOffloadPolicy(pin_memory=…)`` — pinned on a GPU, as zerokit's
offload pins its host buffers there (pinned memory needs CUDA, so not on the CPU): the sharded parameters,
their gradients and the optimizer states (so the step) live on the host, each group's
shards are copied to the device before its all-gather and the gradient shards back after
the reduce-scatter. On a CPU-only machine the device *is* the host: FSDP2's copies are
``.to("cpu")`` of CPU tensors, which copy nothing, so this peer shows the parity and the
host/device split of the ledger, not transfers (it has no transfer formula: None).

``fsdp2-hsdp`` is FSDP2's hybrid sharding, the peer of zerokit's ``hsdp``: ``fully_shard`` on a 2-D mesh
``init_device_mesh(…, (r, s), mesh_dim_names=("dp_replicate", "dp_shard"))`` (it runs on gloo): each group is
gathered and reduce-scattered over s, then the gradient shards are all-reduced over the r replicas. With
``all_reduce_every_micro_batch=False`` (as ``hsdp``'s default) the micro-batches before the last run under
``set_requires_all_reduce(False)``: still reduce-scattered, all-reduced once, at the last; with ``True``
(FSDP2's own default) every micro-batch is. The mesh's two groups are named ``dp_shard`` and ``dp_replicate``
in the ledger.

Note what FSDP2 calls ZeRO-2: parameters are still sharded between steps; only between
forward and backward do they stay gathered (2Ψ traffic, not 3Ψ). The traffic is counted
by :mod:`.recording`; memory is read from FSDP2's own parameter groups (:meth:`FSDP2.track_memory`): the
shards, each gathered group's unsharded parameters and gradients, the all-gather output of the unit
prefetched in backward, the reduce-scatter inputs in flight, and the optimizer's states. The ledger
samples backward on the unsharded parameters, which autograd hands the gradients
(:meth:`zerokit.runtime.memory.MemoryLedger.instrument`).
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch
import torch.nn as nn

from .. import theory
from ..runtime import comm
from ..strategies.base import register
from ..zero.hsdp import HSDP_OPTIONS, check_shard_group_option, shard_group_size
from ..zero.stage3 import UNIT_SIZE_OPTION
from ..zero.units import BLOCK, form_units
from .recording import Peer, ledgered_torch_collectives


def _shard_target(unit):
    """What ``fully_shard`` is applied to for one unit: its module, or — for a ModuleList/ModuleDict, which
    has no forward for FSDP2's hooks — the list of its children that hold the unit's parameters (one group)."""
    module = unit.module
    if isinstance(module, (nn.ModuleList, nn.ModuleDict)) and type(module).forward is nn.Module.forward:
        mine = {id(p) for p in unit.params}
        return [child for child in module.children() if any(id(p) in mine for p in child.parameters())]
    return module


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class FSDP2(Peer):
    """fully_shard on zerokit's units, then on the root; ``reshard_after_forward`` set by the subclass."""

    reshard_after_forward = True
    #: CPUOffloadPolicy: shards, gradients and optimizer states on the host (pinned on a GPU)
    cpu_offload = False
    options = {"unit_size": UNIT_SIZE_OPTION}

    def __init__(self, model, ctx, config, **options):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        super().__init__(model, ctx, config, **options)
        unit_size = self.opts["unit_size"]
        unit_size = unit_size if unit_size == BLOCK else int(unit_size)
        # The workloads split a Linear's output into views (q, k, v) and never write into them
        # in place, which is the case this warning is about; silence it so each rank's output stays readable.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        mesh = self.device_mesh(init_device_mesh)
        policy = MixedPrecisionPolicy()
        if config.precision == "bf16-mixed":
            model.float()  # bf16 values, exactly: FSDP2 keeps the fp32 shards and computes in bf16
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        pin = ctx.device.type == "cuda"  # as zerokit's offload: pinned host buffers wherever a GPU copies them
        offload = CPUOffloadPolicy(pin_memory=pin) if self.cpu_offload else OffloadPolicy()
        with comm.phase("setup"), ledgered_torch_collectives(self.name):
            for unit in form_units(model, unit_size, set()):  # children before parents
                if unit.module is not model:
                    fully_shard(_shard_target(unit), mesh=mesh, reshard_after_forward=self.reshard_after_forward,
                                mp_policy=policy, offload_policy=offload)
            fully_shard(model, mesh=mesh, reshard_after_forward=self.reshard_after_forward, mp_policy=policy,
                        offload_policy=offload)
        self.params = list(model.parameters())
        self.optimizer = config.optimizer.build(self.params)

    def device_mesh(self, init_device_mesh):
        """The mesh ``fully_shard`` shards over: every rank on one dimension."""
        return init_device_mesh(self.ctx.device.type, (self.ctx.world_size,))

    @contextmanager
    def no_sync(self):
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    def run_step(self):
        self.optimizer.step()

    def zero_grad(self):
        self.optimizer.zero_grad(set_to_none=True)

    def track_memory(self, ledger):
        """FSDP2's own tensors, read from its parameter groups (``torch.distributed.fsdp._fully_shard``):

        - ``params``: the shards (the sharded DTensors' local tensors; the host's under CPUOffloadPolicy), each
          gathered group's unsharded parameters (``FSDPParam.all_gather_outputs``, resized to 0 bytes when the
          group reshards), a group's all-gather output not yet copied out (``_all_gather_result``: the unit
          prefetched in backward, gathered ahead of its ``pre_backward``) and a shard kept after forward for a
          smaller world (``reshard_after_forward=<int>``);
        - ``grads``: the sharded gradients, the unsharded ones autograd has produced (``_unsharded_param.grad``,
          an accumulated one in the reduce dtype), the reduce-scatter inputs FSDP2 keeps until the next
          group's ``post_backward`` (``reduce_scatter_states``, one in flight by default), HSDP's all-reduce
          buffer and its partial reduce output (micro-batches reduce-scattered, not yet all-reduced);
        - ``buffers``: the model's buffers and the all-gather output FSDP2 keeps in forward after its copy-out
          (``all_gather_state``, freed at the next group's copy-out: on a GPU the next gather overlaps it);
        - ``optimizer``: the optimizer's states.

        Each is read at each sample as a storage, so a freed one costs nothing and one seen twice counts once."""
        where = "host_" if self.cpu_offload else ""  # with CPUOffloadPolicy the shards rest on the host
        ledger.track(f"{where}params", lambda: [_local(p) for p in self.params])
        ledger.track("params", lambda: [t for fp in self._fsdp_params() for t in fp.all_gather_outputs])
        ledger.track("params", lambda: [g._all_gather_result.all_gather_output for g in self._param_groups()
                                        if g._all_gather_result is not None])
        ledger.track("params", lambda: [t for fp in self._fsdp_params()  # resharded to a smaller world after forward
                                        if (t := getattr(fp, "_sharded_post_forward_param_data", None)) is not None])
        ledger.track(f"{where}grads", lambda: [_local(p.grad) for p in self.params if p.grad is not None])

        def unsharded_grads():
            for fp in self._fsdp_params():
                unsharded = getattr(fp, "_unsharded_param", None)
                if unsharded is not None and unsharded.grad is not None:
                    yield _local(unsharded.grad)
                if getattr(fp, "unsharded_accumulated_grad", None) is not None:
                    yield _local(fp.unsharded_accumulated_grad)

        def reductions():
            for ctx in self._comm_contexts():
                yield from (state.reduce_scatter_input for state in ctx.reduce_scatter_states)
            for g in self._param_groups():
                if g._all_reduce_state is not None:
                    yield g._all_reduce_state.all_reduce_input
                if g._partial_reduce_output is not None:
                    yield g._partial_reduce_output

        ledger.track("grads", unsharded_grads)
        ledger.track("grads", reductions)
        ledger.track("buffers", lambda: list(self.model.buffers()))
        ledger.track("buffers", lambda: [ctx.all_gather_state.all_gather_result.all_gather_output
                                         for ctx in self._comm_contexts() if ctx.all_gather_state is not None])

        def states():
            for state in self.optimizer.state.values():
                for v in state.values():
                    if torch.is_tensor(v):
                        yield _local(v)

        ledger.track(f"{where}optimizer", states)

    def _param_groups(self) -> list:
        """FSDP2's parameter groups, one per ``fully_shard`` call that took parameters."""
        from torch.distributed.fsdp import FSDPModule

        out, seen = [], set()
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                group = module._get_fsdp_state()._fsdp_param_group
                if group is not None and id(group) not in seen:
                    seen.add(id(group))
                    out.append(group)
        return out

    def _fsdp_params(self) -> list:
        return [fp for group in self._param_groups() for fp in group.fsdp_params]

    def _comm_contexts(self) -> list:
        """The groups' communication state (shared by every group of the root after FSDP2's lazy init)."""
        out = {}
        for group in self._param_groups():
            out.setdefault(id(group.comm_ctx), group.comm_ctx)
        return list(out.values())

    def full_parameters(self):
        out = {}
        for n, p in self.model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            out[n] = full.detach().float().cpu().clone()
        return out

    def optimizer_tensors(self):
        return len(self.params) if self.config.optimizer.name == "adamw" else 0

    def theory_model_states(self, psi):
        # FSDP2 pads each parameter's first dimension to a multiple of N, not a flat buffer
        states = theory.model_state_bytes(3, psi, self.ctx.world_size, "fp32", self.config.optimizer.name,
                                          optimizer_tensors=self.optimizer_tensors())
        return theory.SplitStates(0, 0, 0, host=states) if self.cpu_offload else states

    def theory_comm_bytes(self, psi):
        b = theory.param_bytes_per_element(self.config.precision)
        return theory.comm_bytes_per_step(3, psi, self.ctx.world_size, b, self.config.micro_batches,
                                          reshard_after_forward=self.reshard_after_forward)


@register
class FSDP2Zero2(FSDP2):
    """fully_shard(reshard_after_forward=False): gathered from forward to backward, sharded at rest."""

    name = "fsdp2-zero2"
    stage = 2
    reshard_after_forward = False


@register
class FSDP2Zero3(FSDP2):
    """fully_shard(reshard_after_forward=True): FSDP2's default, ZeRO-3."""

    name = "fsdp2-zero3"
    stage = 3
    reshard_after_forward = True


@register
class FSDP2Zero3Offload(FSDP2Zero3):
    """fully_shard(offload_policy=CPUOffloadPolicy(pin_memory=<on a GPU>)): ZeRO-3 with the shards and the step on the
    host; the peer of ``zero3`` with ``offload="params"``."""

    name = "fsdp2-zero3-offload"
    cpu_offload = True


@register
class FSDP2HSDP(FSDP2Zero3):
    """fully_shard on a 2-D mesh (replicate, shard): FSDP2's HSDP, the peer of ``hsdp``."""

    name = "fsdp2-hsdp"
    axes = ("dp",)
    options = {"unit_size": UNIT_SIZE_OPTION, "shard_group_size": HSDP_OPTIONS["shard_group_size"],
               "all_reduce_every_micro_batch": HSDP_OPTIONS["all_reduce_every_micro_batch"]}
    check_layout = staticmethod(check_shard_group_option)

    def device_mesh(self, init_device_mesh):
        n = self.ctx.world_size
        self.shard_group_size = shard_group_size(self.opts["shard_group_size"], n)
        mesh = init_device_mesh(self.ctx.device.type, (n // self.shard_group_size, self.shard_group_size),
                                mesh_dim_names=("dp_replicate", "dp_shard"))
        for axis in ("dp_shard", "dp_replicate"):
            self.ctx.mesh.add_group(mesh.get_group(axis), axis)
        return mesh

    @contextmanager
    def no_sync(self):
        """Reduce-scatter every micro-batch; all-reduce the replicas at the last only, unless every one asks."""
        if self.opts["all_reduce_every_micro_batch"]:
            yield
            return
        self.model.set_requires_all_reduce(False)
        try:
            yield
        finally:
            self.model.set_requires_all_reduce(True)

    def _padded_units(self, trainable: bool):
        """FSDP2 pads each parameter's first dimension to a multiple of s (no flat buffer); it shards the frozen
        parameters too (gathered, never reduced)."""
        s = self.shard_group_size
        return [-(-p.shape[0] // s) * s * (p.numel() // max(p.shape[0], 1)) if p.dim() else s
                for p in self.params if p.requires_grad == trainable]

    def theory_model_states(self, psi):
        states = theory.hsdp_model_state_bytes(psi, self.ctx.world_size, self.shard_group_size, "fp32",
                                               self.config.optimizer.name, units=self._padded_units(True),
                                               optimizer_tensors=self.optimizer_tensors())
        frozen = theory.param_bytes_per_element("fp32") * theory.shard_numel(self._padded_units(False),
                                                                              self.shard_group_size)
        return theory.ModelStates(states.params + frozen, states.grads, states.optimizer, states.step_scalars)

    def theory_comm_bytes_by_axis(self) -> dict:
        def formula(trainable):
            return theory.hsdp_collective_bytes(
                None, self.ctx.world_size, self.shard_group_size, theory.param_bytes_per_element(self.config.precision),
                self.config.micro_batches, units=self._padded_units(trainable) or [0],
                all_reduce_every_micro_batch=self.opts["all_reduce_every_micro_batch"])

        by, frozen = formula(True), formula(False)
        return {"dp_shard": sum(by["shard"].values()) + frozen["shard"].get("all_gather", 0),
                "dp_replicate": sum(by["replicate"].values())}

    def theory_comm_bytes(self, psi):
        return sum(self.theory_comm_bytes_by_axis().values())
