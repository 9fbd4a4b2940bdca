"""ZeRO-3 units: which parameters are gathered and freed together, and the state each unit is in.

**Forming units** (FSDP's wrapping, DeepSpeed's module hooks). A unit is a module whose
forward hooks gather and free a flat buffer of parameters. ``unit_size="block"`` (the
default) makes every repeated block — each child of an ``nn.ModuleList`` or
``nn.Sequential`` whose children are all of one class, like a transformer's layers — a
unit, as FSDP2 and DeepSpeed users configure it; the root module takes everything else
(embeddings, final norm, head). A number of elements instead walks the module tree
bottom-up: a module takes its own parameters and those its children left over, and
becomes a unit once they reach ``unit_size`` elements (0: every module with parameters
of its own); the root takes the rest. A model without repeated blocks falls back to
``unit_size=0``.

**Shared parameters** (tied weights: GPT-2's token embedding is its output head) are
placed in the unit of the *lowest common ancestor* of every module that holds them, so
the unit stays gathered across all their uses: a tied embedding and head both live
under the root, so the shared tensor joins the root's unit, gathered for the root's
whole forward. Placing it in the embedding's unit would free it before the head runs.

**States** (FSDP's ``TrainingState``, per unit): ``SHARDED`` (only this rank's shard
exists; the full buffer has 0 bytes) → ``GATHERING`` (an all-gather into the
re-allocated buffer is in flight) → ``GATHERED`` (the parameters can be read) →
``SHARDED`` again when freed. Every transition goes through :class:`Unit`'s methods;
nothing else reads or writes the state.
"""
from __future__ import annotations

import enum
from typing import Dict, List, NamedTuple, Optional

import torch
import torch.nn as nn

from ..runtime import comm
from ..strategies.base import Option
from ..strategies.blocks import in_backward, repeated_blocks  # noqa: F401 - also read from here
from .flat_buffer import FlatUnit
from .sharded import ELEMENTS, positive_elements

BLOCK = "block"


def non_negative_elements(value) -> bool:
    return value == 0 and not isinstance(value, bool) or positive_elements(value)


def unit_size_allowed(value) -> bool:
    """``unit_size``: the string "block", or 0, or a positive whole number of elements, or a frozenset of module
    names (``zerokit.fully_shard``'s marked modules; the root is always a unit)."""
    if isinstance(value, frozenset):
        return all(isinstance(name, str) for name in value)
    return value == BLOCK if isinstance(value, str) else non_negative_elements(value)


UNIT_SIZE_OPTION = Option(BLOCK, unit_size_allowed,
                          f"'block' (each repeated block — a transformer layer — is a unit, the root takes the rest), "
                          f"0 (every module with parameters of its own is a unit) or {ELEMENTS}: modules are grouped "
                          f"with their parent until their parameters reach this many")


class UnitSpec(NamedTuple):
    module: nn.Module
    label: str
    params: list


def _holders(model: nn.Module) -> Dict[nn.Parameter, List[str]]:
    """Every parameter → the qualified names of the modules that hold it directly."""
    holders: Dict[nn.Parameter, List[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for p in module._parameters.values():
            if p is not None:
                holders.setdefault(p, []).append(name)
    return holders


def _common_ancestor(names: List[str]) -> str:
    parts = [n.split(".") if n else [] for n in names]
    prefix = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        prefix.append(level[0])
    return ".".join(prefix)


#: modules that read their submodules' parameters without calling the submodules (``nn.MultiheadAttention`` passes
#: ``out_proj.weight`` to a functional kernel): a unit hooked on such a child would never be gathered, so the
#: children's parameters belong to the parent's unit
READS_CHILDREN_PARAMETERS = (nn.MultiheadAttention,)


def form_units(model: nn.Module, unit_size, skip: set) -> List[UnitSpec]:
    """(module, label, parameters) per unit, children before parents, shared parameters at their common ancestor.

    Parameters in ``skip`` (persistent ones) take no part.
    """
    blocks = repeated_blocks(model) if unit_size == BLOCK else set()
    if unit_size == BLOCK and not blocks:
        unit_size = 0
    at: Dict[str, list] = {}
    for p, names in _holders(model).items():
        if p not in skip:
            at.setdefault(_common_ancestor(names), []).append(p)
    units: List[UnitSpec] = []

    def is_unit(label: str, pending: list, is_root: bool) -> bool:
        if not pending:
            return False
        if is_root:
            return True
        if isinstance(unit_size, frozenset):  # the modules fully_shard was called on
            return label in unit_size
        if unit_size == BLOCK:
            return label in blocks
        return sum(p.numel() for p in pending) >= unit_size

    def visit(module: nn.Module, label: str, is_root: bool) -> list:
        pending = list(at.get(label, []))
        for name, child in module.named_children():
            child_label = f"{label}.{name}" if label else name
            if isinstance(module, READS_CHILDREN_PARAMETERS):  # never a unit of its own: its forward never runs
                pending += [p for where, ps in at.items() if where == child_label or where.startswith(child_label + ".")
                            for p in ps]
            else:
                pending += visit(child, child_label, False)
        if is_unit(label, pending, is_root):
            units.append(UnitSpec(module, label or type(module).__name__, pending))
            return []
        return pending

    visit(model, "", True)
    return units


class State(enum.Enum):
    SHARDED = "sharded"
    GATHERING = "gathering"
    GATHERED = "gathered"


class Unit:
    """One unit's flat buffer, its shard, and its state; ``gather``/``wait``/``free`` are the only transitions."""

    def __init__(self, spec: UnitSpec, flat: FlatUnit):
        self.module, self.label, self.flat = spec.module, spec.label, flat
        self.index = flat.index
        #: this rank's parameter shard: the only copy of the unit that lives between steps, in the parameters' own
        #: dtype (fp32 under a 16-bit compute dtype: each gather casts it, FSDP2's mixed precision)
        self.shard = flat.shard(flat.data).clone() if flat.rest_shard is None else flat.rest_shard
        flat.rest_shard = None
        self._source: Optional[torch.Tensor] = None  # the cast shard an all-gather in flight reads
        self.state = State.GATHERED  # the flat buffer starts full; the strategy frees it at once
        self._work: Optional[comm.Work] = None
        #: gradient bookkeeping of one backward, reset by the reducer's end-of-backward
        self.bucket: Optional[torch.Tensor] = None
        self.arrived: set = set()
        self.backward_started = False
        self.reduced = False

    def gather(self, gather_fn) -> None:
        """SHARDED → GATHERING: re-allocate the buffer and launch the all-gather of every rank's shard."""
        if self.state is not State.SHARDED:
            return
        self.flat.materialize()
        self._source = self.shard if self.shard.dtype == self.flat.dtype else self.shard.to(self.flat.dtype)
        self._work = gather_fn(self.flat.data, self._source, f"params {self.label}")
        self.state = State.GATHERING
        if self._work is None:  # the ring runs synchronously: already complete
            self.state = State.GATHERED
            self._source = None

    def wait(self) -> None:
        """GATHERING → GATHERED: block until the all-gather has landed."""
        if self.state is State.GATHERING:
            self._work.wait()
            self._work = None
            self.state = State.GATHERED
        self._source = None

    def free(self) -> None:
        """→ SHARDED: the full buffer's storage goes back to 0 bytes (a gather in flight is finished first)."""
        self.wait()
        self.flat.free()
        self.state = State.SHARDED

    @property
    def in_flight_numel(self) -> int:
        """Elements this unit holds beyond its shard: its full buffer while gathering or gathered."""
        return 0 if self.state is State.SHARDED else self.flat.padded_numel

    def reset_backward(self) -> None:
        self.arrived.clear()
        self.backward_started = False
        self.reduced = False
