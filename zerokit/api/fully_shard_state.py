"""Whole state dicts of a ``zerokit.fully_shard`` model, read and loaded under torch's ``StateDictOptions``.

::

    full = model.full_state_dict()                                  # every rank: the whole dict
    full = model.full_state_dict(StateDictOptions(full_state_dict=True, cpu_offload=True))  # rank 0; {} elsewhere
    model.load_full_state_dict(full, StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))

The options mean what they mean to torch's ``get_model_state_dict`` / ``set_model_state_dict``
(``torch.distributed.checkpoint.state_dict``) on an FSDP2 model. Lifecycle of one call (a collective):

1. **the options** (:func:`state_options`): ``None`` is ``StateDictOptions(full_state_dict=True)``; a field torch
   accepts but zerokit cannot honour (``full_state_dict=False``: torch's sharded DTensor dict — zerokit's shards
   are flat 1-D slices; a custom ``dsd_fqn_modifiers``) is refused by name with what to do instead.
2. **gather** (:func:`gathered`): every unit of the root and of the blocks sharded before it is all-gathered
   into a full flat buffer in the shards' own dtype (fp32 under a 16-bit ``mp_policy``) and each registration
   swapped to its whole parameter, a view into it.
3. **read** (:func:`get_full`): the module's ``state_dict()`` (tied names, persistent buffers), detached copies.
   As torch: on every rank by default, on the parameters' device; ``cpu_offload=True`` moves them to the CPU
   and, the dict being full, gives it to rank 0 only — the other ranks get ``{}``.
   ``ignore_frozen_params=True`` drops every name of a frozen parameter.
   Outside these calls ``model.state_dict()`` and ``load_state_dict()`` are refused (:func:`refuse_shards`):
   they would be flat 1-D shards, which torch's ``get_model_state_dict`` and DCP would take for whole tensors.
4. **load** (:func:`load_full`): each rank's own full dict, or rank 0's under ``broadcast_from_rank0=True`` (the
   others may pass ``{}``), copied in by the module's own ``load_state_dict(strict=options.strict)`` — torch's
   errors and its ``(missing_keys, unexpected_keys)`` — then each rank's slice written back into its shards and
   the 16-bit copies of whole parameters refreshed.

"Rank 0" is the first rank of the data-parallel group (rank 0 itself without a mesh).
"""
from __future__ import annotations

import contextlib
import dataclasses
from contextlib import contextmanager
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from ..runtime import comm
from ..zero.flat_buffer import all_gather_flat

#: StateDictOptions fields that change nothing for a model's whole state dict (``strict``: loading only, as torch;
#: the others: submodules or optimizers, which these calls do not take)
_NO_EFFECT = ("keep_submodule_prefixes", "strict", "flatten_optimizer_state_dict")
_UNDERSTOOD = ("full_state_dict", "cpu_offload", "ignore_frozen_params", "broadcast_from_rank0", "dsd_fqn_modifiers",
               *_NO_EFFECT)


def state_options(options, who: str):
    """torch's ``StateDictOptions`` checked (``None``: ``full_state_dict=True``, the rest torch's defaults)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if options is None:
        return StateDictOptions(full_state_dict=True)
    if not isinstance(options, StateDictOptions):
        raise TypeError(f"{who}(options=…) takes torch.distributed.checkpoint.state_dict.StateDictOptions or None, "
                        f"got a {type(options).__name__}")
    fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    unknown = sorted(set(fields) - set(_UNDERSTOOD))
    default = StateDictOptions()
    changed = [name for name in unknown if fields[name] != getattr(default, name)]
    if changed:
        raise ValueError(f"{who}: StateDictOptions({', '.join(f'{n}={fields[n]!r}' for n in changed)}) is not "
                         f"implemented; leave {'them' if len(changed) > 1 else 'it'} at torch's default")
    if not options.full_state_dict:
        raise ValueError(f"{who}: StateDictOptions(full_state_dict=False) is torch's sharded dict (DTensors); "
                         f"zerokit's shards are flat 1-D slices, not DTensors, so it is not offered: pass "
                         f"StateDictOptions(full_state_dict=True) (add cpu_offload=True for rank 0 only, on the CPU)")
    if options.dsd_fqn_modifiers != default.dsd_fqn_modifiers:
        raise ValueError(f"{who}: StateDictOptions(dsd_fqn_modifiers={options.dsd_fqn_modifiers!r}) is not "
                         f"implemented; leave it at {default.dsd_fqn_modifiers!r} and rename the dict's keys yourself")
    return options


def first_rank(face) -> Tuple[bool, object, int]:
    """(is this rank the data-parallel group's first, that group, its first rank's global rank)."""
    mesh = face.ctx.mesh
    src = mesh.ranks("dp")[0]
    return face.ctx.rank == src, mesh.group("dp"), src


@contextmanager
def gathered(face):
    """Every unit of ``face`` and of its blocks gathered into a full flat buffer (the shards' dtype), every
    registration the whole parameter; yields [(unit, full buffer)]; the shard parameters back on exit."""
    fulls: List[tuple] = []
    with contextlib.ExitStack() as stack:
        for each in [*face.inner, face]:
            s = each.strategy
            for unit in s.units:
                full = torch.empty(unit.flat.padded_numel, dtype=unit.shard.dtype, device=unit.flat.device)
                all_gather_flat(full, unit.shard, s.group, "torch", False, f"whole {unit.label}")
                fulls.append((unit, full))
                # one Parameter per tensor: a tied one stays one (named_parameters lists it once)
                whole = {id(p): nn.Parameter(view, requires_grad=p.requires_grad)
                         for p, view in zip(unit.flat.params, unit.flat.views(full))}
                for module, name, p, _ in each.swaps.get(unit.index, []):
                    module._parameters[name] = whole[id(p)]
            stack.callback(lambda each=each: [each._sharded(unit) for unit in each.swaps])
            each.is_whole = True  # module.state_dict() / load_state_dict() allowed (:func:`refuse_shards`)
            stack.callback(setattr, each, "is_whole", False)
        yield fulls


def refuse_shards(face, call: str) -> None:
    """``model.state_dict()`` / ``load_state_dict()`` outside a whole-model gather would read or write this rank's
    flat 1-D shards under the whole tensors' names — what torch's ``get_model_state_dict`` and DCP would then take
    for whole tensors, silently: refused, with the calls that mean what FSDP2's do."""
    if not getattr(face, "is_whole", False):
        raise RuntimeError(f"zerokit.fully_shard: model.{call}() would hold this rank's flat 1-D shards, not "
                           f"FSDP2's DTensors (torch's get_model_state_dict, set_model_state_dict and DCP would take "
                           f"them for whole tensors); call model.full_state_dict(options) / "
                           f"model.load_full_state_dict(state_dict, options) with torch's StateDictOptions instead")


def get_full(face, options=None, who: str = "model.full_state_dict") -> Dict[str, torch.Tensor]:
    """The module's whole ``state_dict()`` under ``options`` (see the module docstring, step 3); a collective."""
    options = state_options(options, who)
    with comm.phase("setup"), torch.no_grad(), gathered(face):  # every rank takes part in every gather
        state = face.root.state_dict()
        if options.ignore_frozen_params:
            for name, p in face.root.named_parameters(remove_duplicate=False):
                if not p.requires_grad:
                    state.pop(name, None)
        if options.cpu_offload:
            first, _, _ = first_rank(face)
            return {n: t.detach().cpu().clone() for n, t in state.items()} if first else {}
        return {n: t.detach().clone() for n, t in state.items()}


def _from_first(face, state_dict) -> Dict[str, torch.Tensor]:
    """Rank 0's dict on every rank: its names first, checked on rank 0 against the model (every rank's is alike),
    then each tensor the model also has, shaped and typed as the model's; names the model lacks get an empty
    placeholder (they are unexpected keys all the same).

    What only rank 0 can find wrong (its ``state_dict`` is not a dict, an entry the model has is not a tensor or
    has another shape, it cannot be converted to the model's device and dtype) travels with the header: every rank
    raises the same exception, with the same message — had rank 0 raised alone, the others would wait for its
    broadcast until the collectives' timeout."""
    first, group, src = first_rank(face)
    own = face.root.state_dict()
    mine: Dict[str, torch.Tensor] = {}
    header, cause = [None], None
    if first:
        try:
            mine = _converted(state_dict, own)
            header[0] = (list(state_dict), None)
        except Exception as e:  # noqa: BLE001 - whatever it is, every rank raises it
            header[0] = (None, (type(e), f"model.load_full_state_dict (broadcast_from_rank0=True): rank 0's "
                                         f"state_dict {e}"))
            mine, cause = {}, e
    dist.broadcast_object_list(header, src=src, group=group)
    names, error = header[0]
    if error is not None:
        cls, message = error
        try:
            raised = cls(message)
        except Exception:  # noqa: BLE001 - an exception class whose constructor takes more than a message
            raised = RuntimeError(message)
        raise raised from cause  # rank 0: from what it found; elsewhere from nothing
    out = {}
    for name in names:
        if name not in own:
            out[name] = torch.empty(0)  # host: a placeholder for a name this model lacks (strict load reports it)
            continue
        t = mine[name] if first else torch.empty_like(own[name])
        comm.broadcast(t, src, group, tag=f"load {name}")
        out[name] = t
    return out


def _converted(state_dict, own: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Rank 0's entries the model has, on the model's device and in its dtype; raises what is wrong with them."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"is a {type(state_dict).__name__}, not the whole dict (the other ranks may pass {{}})")
    out = {}
    for name, t in state_dict.items():
        if name not in own:
            continue
        if not torch.is_tensor(t):
            raise TypeError(f"holds {name!r} as a {type(t).__name__}, not a tensor")
        if tuple(t.shape) != tuple(own[name].shape):
            raise RuntimeError(f"holds {name!r} of shape {tuple(t.shape)}, the model {tuple(own[name].shape)}")
        out[name] = t.to(own[name].device, own[name].dtype).clone()
    return out


def load_full(face, state_dict, options=None, who: str = "model.load_full_state_dict"):
    """Load a whole state dict into the shards (see the module docstring, step 4); a collective. Returns torch's
    ``(missing_keys, unexpected_keys)``."""
    options = state_options(options, who)
    for each in [*face.inner, face]:
        each.strategy._free_all()  # no gathered copy outlives the load
    with comm.phase("setup"), torch.no_grad(), gathered(face) as fulls:
        if options.broadcast_from_rank0:
            state_dict = _from_first(face, state_dict)
        elif not isinstance(state_dict, dict):
            raise TypeError(f"{who}(state_dict=…) takes the whole dict on every rank (or rank 0's with "
                            f"StateDictOptions(broadcast_from_rank0=True)), got a {type(state_dict).__name__}")
        result = face.root.load_state_dict(state_dict, strict=options.strict)
        for unit, full in fulls:  # each rank keeps its slice
            unit.shard.copy_(unit.flat.shard(full))
    for each in [*face.inner, face]:
        each.strategy.refresh_persistent()
        for _, _, rest, during in each.root_swaps:  # the 16-bit copies a forward swaps in, from what was loaded
            if during is not rest:
                during.data.copy_(rest.data)
    return result
