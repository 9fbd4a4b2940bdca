"""``zerokit.fully_shard``: FSDP2's ``fully_shard`` convention over zerokit's ``zero3``, with your own optimizer.

::

    for block in model.blocks:
        zerokit.fully_shard(block)              # each block a unit
    zerokit.fully_shard(model)                  # the root last: the rest (embeddings, head) its own unit
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)   # any torch optimizer, param groups by name too
    for x, y in batches:
        loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()

The mechanism is ``zero3``'s (:mod:`zerokit.zero.stage3`): the same flat units, unit state
machine, hooks, reduce-scatter and ledgers. What this file adds is FSDP2's face. Lifecycle:

1. **each call** shards its module at once, as FSDP2 does: a ``zero3`` instance whose one
   unit is the module's parameters that no earlier call (on a block inside it) took —
   rank 0's values broadcast first. Call it on the blocks, then on the root, which takes
   the rest (embeddings, head). **The root rule**, FSDP2's: a call that finds no trainable
   parameter left (the root of a ``Sequential`` whose blocks took them all, or a ``ReLU``)
   is accepted and shards nothing (:class:`_NoUnits`); the root still owns its forward hooks
   (``mp_policy``'s input and output casts) and the whole-model entry points below, over its
   blocks. Each module gets FSDP2's mixin (here :class:`FullyShardedModule`).
2. **the parameters you see** (``model.parameters()``, ``named_parameters()``, what your
   optimizer steps): for every trainable parameter, a 1-D ``nn.Parameter`` that *is* this
   rank's slice of it in the unit's flat shard (a view, sharing its storage; empty where the
   rank owns none of it) — FSDP2's sharded parameters, flat. Frozen parameters and
   buffers stay whole on every rank (zerokit's ``zero3`` holds frozen ones whole: a choice;
   FSDP2 shards them too).
3. **forward**: before a unit's module runs, ``zero3`` gathers the unit and the module's
   registrations are swapped to the whole parameters; after it, back to the shards.
4. **backward** (your ``loss.backward()``): ``zero3`` reduce-scatters each unit's gradient
   into its gradient shard (the mean over the ranks); at its end every shard parameter's
   ``.grad`` is its slice of that shard, and nothing else holds the shard: your
   ``optimizer.zero_grad()`` (gradients to None) frees it, as FSDP2's does. Your
   ``optimizer.step()`` updates the shards in place; the next forward gathers them and, its
   gradients gone, starts a new accumulation; without ``zero_grad`` gradients accumulate, as
   torch's do.
5. **``model.full_state_dict(options)``** / **``model.load_full_state_dict(sd, options)``**
   (collectives, :mod:`.fully_shard_state`): torch's ``get_model_state_dict`` /
   ``set_model_state_dict`` with ``StateDictOptions(full_state_dict=True, …)`` — the whole
   ``state_dict()`` on every rank by default; ``cpu_offload=True``: rank 0 only, ``{}`` elsewhere.
   ``model.state_dict()`` itself (what torch's functions and DCP read) would be flat shards: refused.

``mp_policy`` (FSDP2's ``MixedPrecisionPolicy``: ``param_dtype``, ``reduce_dtype``,
``output_dtype``, ``cast_forward_inputs``): each gather casts the fp32 shard to ``param_dtype``
(bf16 or fp16) and forward and backward compute in it; the gradients are reduce-scattered in
``reduce_dtype`` (default ``param_dtype``) and land, as fp32, on the fp32 shard parameters your
optimizer steps: fp32 master weights and fp32 gradients at rest, 16-bit only while a unit is
gathered, as FSDP2 does. Frozen parameters and whole (persistent) ones get a ``param_dtype``
copy for the forward, swapped in around the sharded module's forward; buffers are not cast
(FSDP2 does not cast them either). fp16 without loss scaling can underflow: scale the loss
yourself (torch's ``ShardedGradScaler``), as with FSDP2.

``param_persistence_threshold`` (DeepSpeed's, a ``zero3`` option): parameters with fewer
elements stay whole on every rank — your optimizer steps them whole, their gradients
all-reduced. An offload policy is refused, not dropped. :class:`FullyShard` (``"fully-shard"``) is
the same face inside ``zerokit.train`` (:mod:`.fully_shard_strategy`), for the tour and ``zerokit bench zero``.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from ..parallelize import parallelize
from ..runtime.wrapping import broadcast_from_first, rank_context, wrapper_kind
from ..strategies.base import TrainConfig
from ..zero.stage3 import ZeroStage3
from .fully_shard_precision import cast_floats, read_policy
from .fully_shard_state import first_rank, gathered, get_full, load_full, refuse_shards


class FullyShardedModule:
    """The mixin ``fully_shard`` gives every module it shards (as FSDP2's ``FSDPModule``)."""

    def full_state_dict(self, options=None, *, rank0_only: Optional[bool] = None) -> Dict[str, torch.Tensor]:
        """The unwrapped model's ``state_dict()``, whole — on every rank by default, as torch's
        ``get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))``; ``options``: torch's
        ``StateDictOptions`` (``cpu_offload=True``: on the CPU, rank 0 only, ``{}`` elsewhere), see
        :mod:`.fully_shard_state`; ``rank0_only=True`` (FSDP1's ``FullStateDictConfig`` spelling): rank 0 only,
        ``{}`` elsewhere. A collective."""
        state = get_full(self._zerokit_face, options)
        if rank0_only:
            return state if first_rank(self._zerokit_face)[0] else {}
        return state

    def load_full_state_dict(self, state_dict, options=None):
        """Load a whole ``state_dict()`` into the shards, as torch's ``set_model_state_dict(model, state_dict,
        options=StateDictOptions(full_state_dict=True, …))``: each rank's own dict, or rank 0's under
        ``broadcast_from_rank0=True``; returns ``(missing_keys, unexpected_keys)``. A collective."""
        return load_full(self._zerokit_face, state_dict, options)

    def state_dict(self, *args, **kwargs):
        """Within :meth:`full_state_dict` only (the whole parameters); elsewhere refused, saying what to call."""
        refuse_shards(self._zerokit_face, "state_dict")
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        """Within :meth:`load_full_state_dict` only; elsewhere refused, saying what to call."""
        refuse_shards(self._zerokit_face, "load_state_dict")
        return super().load_state_dict(*args, **kwargs)

    def reshard(self) -> None:
        """Free every gathered unit, the blocks' too (after a forward without backward, under ``torch.no_grad()``)."""
        face = self._zerokit_face
        for each in [*face.inner, face]:
            each.strategy._free_all()


def fully_shard(module: nn.Module, *, reshard_after_forward: bool = True, mp_policy=None, offload_policy=None,
                **zero3_options) -> nn.Module:
    """Shard ``module`` FSDP2's way (see the module docstring); returns ``module``, changed in place."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"zerokit.fully_shard(module=…) needs an nn.Module, got {type(module).__name__}")
    precision = read_policy(mp_policy)
    if offload_policy is not None and type(offload_policy).__name__ != "OffloadPolicy":
        raise ValueError("zerokit.fully_shard(offload_policy=…) is not implemented yet; use zerokit.initialize with "
                         "\"offload_param\": {\"device\": \"cpu\"}")
    if not isinstance(reshard_after_forward, bool):
        raise ValueError(f"reshard_after_forward={reshard_after_forward!r} must be True or False (an int, FSDP2's "
                         f"reshard to a smaller world, is not implemented)")
    kind = wrapper_kind(module)
    if kind and not isinstance(module, FullyShardedModule):
        raise ValueError(f"zerokit.fully_shard: the module is already wrapped by {kind}; pass the original module")
    if getattr(module, "_zerokit_face", None) is not None:
        raise ValueError("zerokit.fully_shard: this module is sharded already; call fully_shard once per module")
    ctx = rank_context("zerokit.fully_shard")
    inner = [m._zerokit_face for m in module.modules() if getattr(m, "_zerokit_face", None) is not None]
    face = _Face(module, ctx, inner, precision, dict(reshard_after_forward=reshard_after_forward, **zero3_options))
    module.__dict__["_zerokit_face"] = face
    module.__class__ = type(f"FullyShard{type(module).__name__}", (FullyShardedModule, type(module)), {})
    return module


class _Face:
    """The shard parameters of a root built on ``zero3`` and the swaps around each unit's forward."""

    def __init__(self, root: nn.Module, ctx, inner: list, precision: dict, options: dict):
        #: the faces of the blocks sharded by earlier calls: theirs are not this one's
        self.inner = inner
        managed = {id(face) for other in inner for face, *_ in other.faces} | {
            id(p) for other in inner for p in other.persistent}  # a block's whole (persistent) ones are its own too
        own = [p for p in root.parameters() if id(p) not in managed]
        if any(p.dtype != torch.float32 for p in own):
            raise ValueError("zerokit.fully_shard: the model's parameters must be fp32 (fp32 only for now)")
        broadcast_from_first(root, ctx, skip=frozenset(managed))  # rank 0's values of what this call shards
        # one unit: this module's parameters the blocks left; its gradient shard allocated per backward and held by the
        # shard parameters' .grad alone, so that zero_grad(set_to_none=True) frees it, as FSDP2's does
        options = dict({"contiguous_gradients": False}, **options, unit_size=frozenset())
        self.precision = precision
        dtype = precision["param_dtype"]
        if not any(p.requires_grad for p in own):  # the root over blocks that took them all, or a ReLU: hooks only
            self.strategy = _NoUnits(ctx)
        else:
            self.strategy = parallelize(root, ctx, strategy=ZeroStage3, config=TrainConfig("fp32"), options=dict(
                exclude=frozenset(managed), param_dtype=dtype, reduce_dtype=precision["reduce_dtype"],
                **options)).strategy
        self.root, self.ctx = root, ctx
        s = self.strategy
        #: per unit: (module, name, whole parameter, shard parameter) of every registration of its parameters
        self.swaps: Dict[int, List[Tuple[nn.Module, str, nn.Parameter, nn.Parameter]]] = {}
        self.faces: List[Tuple[nn.Parameter, int, int, int]] = []  # (shard parameter, unit, lo, hi)
        face_of: Dict[int, nn.Parameter] = {}
        for unit in s.units:
            flat = unit.flat
            for p, offset in zip(flat.params, flat.offsets):
                lo, hi = max(offset, flat.lo), min(offset + p.numel(), flat.hi)
                lo, hi = (lo - flat.lo, hi - flat.lo) if lo < hi else (0, 0)
                face = nn.Parameter(unit.shard[lo:hi], requires_grad=True)
                face_of[id(p)] = face
                self.faces.append((face, unit.index, lo, hi))
        #: parameters under ``param_persistence_threshold``: whole on every rank, stepped whole by your optimizer
        #: (under a 16-bit compute dtype, fp32 ones over zero3's persistent master; the model's are their cast)
        self.persistent = list(s.persistent.params) if s.persistent is not None else []
        if dtype is not None and s.persistent is not None:
            self.persistent = [nn.Parameter(view) for view in s.persistent.views(s.persistent_master)]
        #: (module, name, at rest, during the forward) of the whole parameters a 16-bit forward needs a copy of:
        #: persistent ones and frozen ones of this call's modules (not a block's, whose call swaps its own)
        self.root_swaps: List[Tuple[nn.Module, str, nn.Parameter, nn.Parameter]] = []
        cast = {id(p): face for p, face in zip(s.persistent.params, self.persistent)} if dtype is not None and \
            s.persistent is not None else {}
        blocks = {id(m) for other in inner for m in other.root.modules()}
        unit_of = {id(p): unit.index for unit in s.units for p in unit.flat.params}
        for module in root.modules():
            for name, p in list(module._parameters.items()):
                if p is not None and id(p) in face_of:
                    pair = (module, name, p, face_of[id(p)])
                    self.swaps.setdefault(unit_of[id(p)], []).append(pair)
                    module._parameters[name] = face_of[id(p)]
                elif p is not None and id(p) in cast:
                    self.root_swaps.append((module, name, cast[id(p)], p))
                    module._parameters[name] = cast[id(p)]
                elif p is not None and dtype is not None and not p.requires_grad and id(module) not in blocks:
                    copy = cast.setdefault(id(p), nn.Parameter(p.detach().to(dtype), requires_grad=False))
                    self.root_swaps.append((module, name, p, copy))
        for unit in s.units:  # after zero3's own hooks: zero3 gathers first, then the module sees whole parameters
            s._hooks.append(unit.module.register_forward_pre_hook(
                lambda m, args, i=unit.index: self._whole(i)))
            s._hooks.append(unit.module.register_forward_hook(
                lambda m, args, out, i=unit.index: self._sharded(i)))
        s._hooks.append(root.register_forward_pre_hook(self._enter, with_kwargs=True))
        s._hooks.append(root.register_forward_hook(self._leave))
        if s.units or s.persistent is not None:
            self._close = s.reducer.after_finish
            s.reducer.after_finish = self._after_backward

    # -- forward ---------------------------------------------------------------------
    def _enter(self, module, args, kwargs):
        """The sharded module's forward begins: 16-bit copies in, inputs cast; a new pass (:meth:`_new_pass`)."""
        dtype = self.precision["param_dtype"]
        if dtype is not None:
            self.strategy.refresh_persistent()
            for module_, name, _, during in self.root_swaps:
                module_._parameters[name] = during
        self._new_pass()
        if dtype is not None and self.precision["cast_forward_inputs"]:
            return cast_floats((args, kwargs), dtype)
        return None

    def _leave(self, module, args, output):
        for module_, name, rest, _ in self.root_swaps:
            module_._parameters[name] = rest
        if self.precision["output_dtype"] is not None:
            return cast_floats(output, self.precision["output_dtype"])
        return None

    def _whole(self, unit: int) -> None:
        for module, name, whole, _ in self.swaps.get(unit, []):
            module._parameters[name] = whole

    def _sharded(self, unit: int) -> None:
        for module, name, _, face in self.swaps.get(unit, []):
            module._parameters[name] = face

    def _new_pass(self) -> None:
        """The module's forward: gradients set to None since the last backward (the user's zero_grad) start a new
        accumulation in zero3's shards; gradients still there are accumulated into (zero3 gets their shard back)."""
        if not torch.is_grad_enabled():
            return
        s = self.strategy
        if all(face.grad is None for face, *_ in self.faces) and all(p.grad is None for p in self.persistent):
            s.zero_grad()
            return
        for face, unit, _, _ in self.faces:
            if face.grad is not None and s.grad_shards[unit] is None:
                s.grad_shards[unit] = face.grad._base if face.grad._base is not None else face.grad
        held = next((p.grad for p in self.persistent if p.grad is not None), None)
        if held is not None and s.persistent_grad is None:  # the persistent gradients' flat buffer, back to zero3
            s.persistent_grad = held._base
            for p in self.persistent:
                p.grad = None

    # -- backward --------------------------------------------------------------------
    def _after_backward(self) -> None:
        self._close()
        shards = self.strategy.grad_shards
        for face, unit, lo, hi in self.faces:
            face.grad = shards[unit][lo:hi] if shards[unit] is not None else None
        if self.strategy.shard_buffer is None:  # the shard parameters' .grad hold the shards now, zero3 does not
            self.strategy.grad_shards = [None] * len(shards)
        s = self.strategy
        if s.persistent is not None and s.persistent_grad is not None:  # the persistent ones: whole, all-reduced
            for p, view in zip(self.persistent, s.persistent.views(s.persistent_grad)):
                p.grad = view
            s.persistent_grad = None

    # -- whole parameters ------------------------------------------------------------
    def whole(self):
        """Every registration the whole parameter, gathered from the shards in their own dtype (fp32 under a 16-bit
        compute dtype) — the blocks' too; a collective, for reading (a state dict), not for a forward."""
        return gathered(self)


class _NoUnits:
    """The root's ``zero3`` when the blocks sharded before it took every trainable parameter (FSDP2's usual root
    call over a ``Sequential``): nothing to gather or reduce; the root keeps its forward hooks (the input and output
    casts of ``mp_policy``, the 16-bit copies of its frozen parameters) and its state-dict entry points."""

    units: list = []
    persistent = None

    def __init__(self, ctx):
        self.group = ctx.mesh.group("dp")
        self._hooks: list = []
        self.grad_shards: list = []
        self.shard_buffer = None

    def _free_all(self) -> None:
        pass

    def refresh_persistent(self) -> None:
        pass

    def zero_grad(self) -> None:
        pass

    def track_memory(self, ledger) -> None:
        pass
