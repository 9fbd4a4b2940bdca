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
   the rest (embeddings, head). Each module gets FSDP2's mixin (here
   :class:`FullyShardedModule`).
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
5. **``model.full_state_dict()``** (a collective): the unwrapped model's ``state_dict()``
   on rank 0, which ``load_state_dict(…, strict=True)`` takes.

``param_persistence_threshold`` (DeepSpeed's, a ``zero3`` option): parameters with fewer
elements stay whole on every rank — your optimizer steps them whole, their gradients
all-reduced. fp32 only for now: a ``mp_policy`` with a 16-bit compute dtype and an offload
policy are refused, not dropped. :class:`FullyShard` (``"fully-shard"``) is
the same face inside ``zerokit.train``, for the tour and ``zerokit bench zero``.
"""
from __future__ import annotations

import contextlib
from contextlib import contextmanager
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from ..runtime import comm
from ..strategies.base import Option, Strategy, boolean, register
from .ddp import broadcast_from_first
from .engine import rank_context, wrapper_kind


class FullyShardedModule:
    """The mixin ``fully_shard`` gives every module it shards (as FSDP2's ``FSDPModule``)."""

    def full_state_dict(self) -> Optional[Dict[str, torch.Tensor]]:
        """The unwrapped model's ``state_dict()``, whole, on rank 0 (None elsewhere); a collective."""
        return self._zerokit_face.full_state_dict()

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
    if mp_policy is not None and getattr(mp_policy, "param_dtype", None) not in (None, torch.float32):
        raise ValueError(f"zerokit.fully_shard(mp_policy=…): compute dtype {mp_policy.param_dtype} is not "
                         f"implemented yet (fp32 only); leave mp_policy out, or use zerokit.initialize with "
                         f"\"bf16\": {{\"enabled\": true}}")
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
    face = _Face(module, ctx, inner, dict(reshard_after_forward=reshard_after_forward, **zero3_options))
    module.__dict__["_zerokit_face"] = face
    module.__class__ = type(f"FullyShard{type(module).__name__}", (FullyShardedModule, type(module)), {})
    return module


class _Face:
    """The shard parameters of a root built on ``zero3`` and the swaps around each unit's forward."""

    def __init__(self, root: nn.Module, ctx, inner: list, options: dict):
        from ..strategies.base import TrainConfig
        from ..zero.stage3 import ZeroStage3

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
        self.strategy = ZeroStage3(root, ctx, TrainConfig("fp32"), exclude=frozenset(managed), **options)
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
        self.persistent = list(s.persistent.params) if s.persistent is not None else []
        unit_of = {id(p): unit.index for unit in s.units for p in unit.flat.params}
        for module in root.modules():
            for name, p in list(module._parameters.items()):
                if p is not None and id(p) in face_of:
                    pair = (module, name, p, face_of[id(p)])
                    self.swaps.setdefault(unit_of[id(p)], []).append(pair)
                    module._parameters[name] = face_of[id(p)]
        for unit in s.units:  # after zero3's own hooks: zero3 gathers first, then the module sees whole parameters
            s._hooks.append(unit.module.register_forward_pre_hook(
                lambda m, args, i=unit.index: self._whole(i)))
            s._hooks.append(unit.module.register_forward_hook(
                lambda m, args, out, i=unit.index: self._sharded(i)))
        s._hooks.append(root.register_forward_pre_hook(lambda m, args: self._new_pass()))
        self._close = s.reducer.after_finish
        s.reducer.after_finish = self._after_backward

    # -- forward ---------------------------------------------------------------------
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
            for p, view in zip(s.persistent.params, s.persistent.views(s.persistent_grad)):
                p.grad = view
            s.persistent_grad = None

    # -- whole parameters ------------------------------------------------------------
    @contextmanager
    def whole(self):
        """Every unit gathered — the blocks' too — and every registration the whole parameter (a collective)."""
        with contextlib.ExitStack() as stack:
            for face in [*self.inner, self]:
                stack.enter_context(face.strategy.gathered())
                for unit in face.swaps:
                    face._whole(unit)
                stack.callback(lambda face=face: [face._sharded(unit) for unit in face.swaps])
            yield

    def full_state_dict(self) -> Optional[Dict[str, torch.Tensor]]:
        with comm.phase("setup"), self.whole():
            state = {n: t.detach().cpu().clone() for n, t in self.root.state_dict().items()}
        return state if self.ctx.rank == 0 else None


# -- the same face inside zerokit.train: measured side by side with zero3 and FSDP2 -------------------------------


@register
class FullyShard(Strategy):
    """``fully_shard`` on every repeated block, then the root, and a torch optimizer over ``model.parameters()``:
    the own-loop face inside ``zerokit.train`` (its ledgers next to ``zero3``'s and FSDP2's)."""

    name = "fully-shard"
    stage = 3
    options = {"reshard_after_forward": Option(True, boolean, "True (FSDP2's default) or False")}

    def __init__(self, model, ctx, config, **options):
        from ..zero.units import repeated_blocks

        super().__init__(model, ctx, config, **options)
        if config.precision != "fp32":
            raise ValueError(f"strategy 'fully-shard': precision={config.precision!r} is not implemented yet "
                             f"(fp32 only); zero3 runs bf16-mixed")
        for name in sorted(repeated_blocks(model)):
            fully_shard(model.get_submodule(name), reshard_after_forward=self.opts["reshard_after_forward"])
        fully_shard(model, reshard_after_forward=self.opts["reshard_after_forward"])
        self.face = model._zerokit_face
        self.faces = [*self.face.inner, self.face]
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = config.optimizer.build(self.params)

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def gathered(self):
        return self.face.whole()

    def full_parameters(self):
        """Every parameter whole, as fp32 on the CPU, under the model's names (a collective)."""
        with self.face.whole():
            return {n: p.detach().float().cpu().clone() for n, p in self.model.named_parameters()}

    def track_memory(self, ledger) -> None:
        for face in self.faces:
            face.strategy.track_memory(ledger)
        ledger.track_optimizer(self.optimizer)

    def flat_units(self):
        return [u.flat.numel for face in self.faces for u in face.strategy.units]

    def optimizer_tensors(self) -> int:
        return len(self.params) if isinstance(self.optimizer, torch.optim.Adam | torch.optim.AdamW) else 0

    def theory_model_states(self, psi: int):
        from .. import theory

        return theory.model_state_bytes(3, psi, self.world, "fp32", self.config.optimizer.name,
                                        units=self.flat_units(), optimizer_tensors=self.optimizer_tensors(),
                                        frozen_numel=self.frozen_numel())

    def theory_comm_bytes(self, psi: int):
        from .. import theory

        return theory.comm_bytes_per_step(3, psi, self.world, 4, self.config.micro_batches, units=self.flat_units(),
                                          reshard_after_forward=self.opts["reshard_after_forward"])
