"""Checkpointing policies: which calls of a model are recomputed, installed on its repeated blocks in place.

Lifecycle: :func:`apply_checkpointing` finds the model's repeated blocks (the children of a
``ModuleList``/``Sequential`` of one class, :func:`zerokit.strategies.blocks.repeated_blocks`), cuts
them into segments by the policy and gives every block an instance ``forward`` that runs the
class's own forward inside a :class:`~zerokit.activation_checkpointing.function.Frame`; the model's
modules, parameter names and state dict do not change, and hooks other code puts on a block
(ZeRO-3's gathers, the ledger's samples) still fire around it. The returned
:class:`Checkpointing` is the model's until :meth:`Checkpointing.remove` (or
:func:`remove_checkpointing`); applying a second policy before that is an error. A strategy
built afterwards sees the blocks as they are.

Policies:

- ``none``: nothing is recomputed (a no-op handle; nothing is installed).
- ``every``: each block keeps only its input (Korthikanti et al.'s "full" recompute).
- ``every_k``: segments of ``every`` consecutive blocks (1 ≤ ``every`` ≤ the block count)
  keep only the segment's input; backward recomputes the whole segment (Chen et al.
  1604.06174). The blocks must be chained — each called on the previous one's output, as
  a transformer's loop does; anything else is refused when it happens.
- ``sqrt``: ``every_k`` with ⌈n / round(√n)⌉ blocks per segment
  (:func:`zerokit.theory.optimal_checkpoint_segments`): about 2√n blocks' worth stored
  when a block's activations equal its input (Chen et al.).
- ``selective``: inside each block only the attention core — every
  ``scaled_dot_product_attention`` call, softmax(QKᵀ)V — is recomputed; the linear layers'
  outputs and everything else are kept (Korthikanti et al. 2205.05198 §5, the 5·a·s²·b term).
  ``nn.MultiheadAttention`` computes its core inside one torch function together with its
  four projections; zerokit recomputes that whole function (its projections too: a choice,
  since torch gives no smaller piece to cut). A block that calls no attention is refused.
- ``torch-every`` / ``torch-selective``: the peers, torch's own non-reentrant checkpoint per
  block (:mod:`.torch_peers`).

Segments never cross from one container to another. Under ``torch.no_grad()`` every block
just runs. ``recomputed_forwards`` counts the forward calls backward re-ran (blocks; attention
cores under ``selective``).
"""
from __future__ import annotations

import functools
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from .. import theory
from ..strategies.blocks import repeated_blocks
from .function import Counter, Frame, checkpoint
from .torch_peers import torch_forward

POLICIES = ("none", "every", "every_k", "sqrt", "selective", "torch-every", "torch-selective")
SEGMENTED = ("every", "every_k", "sqrt")
#: the name each segmented policy has in :func:`zerokit.theory.checkpointed_activation_bytes`
THEORY_NAME = {"none": "none", "every": "full", "every_k": "every-k", "sqrt": "sqrt"}
ATTRIBUTE = "_zerokit_checkpointing"
_SDPA = torch._C._nn.scaled_dot_product_attention


def check_policy(policy, every=None) -> None:
    """Check ``checkpointing`` and ``checkpoint_every`` without a model (ValueError)."""
    if policy not in POLICIES:
        raise ValueError(f"checkpointing={policy!r} is not a checkpointing policy; known: {', '.join(POLICIES)}")
    if policy != "every_k":
        if every is not None:
            raise ValueError(f"checkpoint_every={every!r} applies to checkpointing='every_k' only "
                             f"(got checkpointing={policy!r})")
        return
    if isinstance(every, bool) or not isinstance(every, int):
        raise ValueError(f"checkpointing='every_k' needs checkpoint_every=K, a positive whole number of blocks per "
                         f"segment; got checkpoint_every={every!r}")
    if every < 1:
        raise ValueError(f"checkpoint_every={every} must be at least 1 (blocks per checkpointed segment)")


def block_groups(model: nn.Module) -> List[List[str]]:
    """The repeated blocks' qualified names, grouped by their container, in the model's order."""
    names = repeated_blocks(model)
    groups: Dict[str, List[str]] = {}
    for name, _ in model.named_modules():
        if name in names:
            groups.setdefault(name.rpartition(".")[0], []).append(name)
    return list(groups.values())


def segment_layers(policy: str, n: int, every: Optional[int] = None) -> int:
    """Blocks per segment of ``n`` chained blocks under a segmented policy."""
    if policy == "sqrt":
        return -(-n // theory.optimal_checkpoint_segments(n))
    return every if policy == "every_k" else 1


def check_for_model(model: nn.Module, policy, every=None) -> List[List[str]]:
    """:func:`check_policy`, then the model: it has repeated blocks, and ``every`` fits them. Returns the groups."""
    check_policy(policy, every)
    groups = block_groups(model)
    if policy == "none":
        return groups
    if not groups:
        raise ValueError(f"checkpointing={policy!r}: {type(model).__name__} has no repeated blocks to checkpoint "
                         f"(children of an nn.ModuleList or nn.Sequential, all of one class, with parameters — "
                         f"a transformer's layers)")
    longest = max(len(g) for g in groups)
    if policy == "every_k" and every > longest:
        raise ValueError(f"checkpoint_every={every} is above the model's {longest} blocks; choose 1 to {longest}")
    return groups


#: nn.MultiheadAttention's whole computation, one function (its projections and its core together)
_MHA = torch.nn.functional.multi_head_attention_forward


class _AttentionCores(TorchFunctionMode):
    """Inside one block's forward: every scaled_dot_product_attention call runs checkpointed, and every
    ``nn.MultiheadAttention`` call (torch computes its core inside one function, with its projections: zerokit's
    choice is to recompute that whole function)."""

    def __init__(self, owner: "Checkpointing", label: str):
        super().__init__()
        self.owner, self.label, self.calls = owner, label, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not _SDPA and func is not _MHA:
            return func(*args, **kwargs)
        self.calls += 1
        what = "the attention core" if func is _SDPA else "the nn.MultiheadAttention"
        return checkpoint(func, *args, label=f"{what} of block {self.label!r}", counter=self.owner, **kwargs)


class _Open:
    """The segment whose forward is running: its frame, and where the chain stands."""

    __slots__ = ("frame", "segment", "next", "output")

    def __init__(self, frame: Frame, segment: tuple):
        self.frame, self.segment, self.next, self.output = frame, segment, 1, None


class Checkpointing(Counter):
    """A policy installed on a model's blocks; ``recomputed_forwards`` counts what backward re-ran."""

    def __init__(self, model: nn.Module, policy: str, every: Optional[int], groups: List[List[str]]):
        super().__init__()
        self.policy, self.every = policy, every
        modules = dict(model.named_modules())
        self.blocks: Dict[str, nn.Module] = {name: modules[name] for group in groups for name in group}
        #: the segments, each a tuple of block names (one block each unless segmented with more)
        self.segments: List[tuple] = []
        if policy in SEGMENTED:
            for group in groups:
                k = segment_layers(policy, len(group), every)
                self.segments += [tuple(group[i:i + k]) for i in range(0, len(group), k)]
        self.segment_layers = segment_layers(policy, max(map(len, groups)), every) if policy in SEGMENTED else None
        self._recomputing = 0
        self._open: Optional[_Open] = None
        self._model = model
        self._saved_forward: Dict[str, object] = {}
        if policy != "none":
            self._install()
            setattr(model, ATTRIBUTE, self)

    # -- installing ----------------------------------------------------------------------
    def _install(self) -> None:
        where = {name: (seg, i) for seg in self.segments for i, name in enumerate(seg)}
        for name, block in self.blocks.items():
            self._saved_forward[name] = block.__dict__.get("forward")
            orig = block.forward
            if self.policy in SEGMENTED:
                seg, pos = where[name]
                forward = functools.partial(self._segment_forward, seg, pos, orig)
            elif self.policy == "selective":
                forward = functools.partial(self._selective_forward, name, orig)
            else:
                forward = torch_forward(self, name, orig, selective=self.policy == "torch-selective")
            block.forward = forward

    def remove(self) -> None:
        """Give every block its own forward back; the model can take a policy again."""
        for name, block in self.blocks.items():
            previous = self._saved_forward.pop(name, None)
            if previous is None:
                block.__dict__.pop("forward", None)
            else:
                block.forward = previous
        if getattr(self._model, ATTRIBUTE, None) is self:
            delattr(self._model, ATTRIBUTE)

    # -- block and segment forwards ------------------------------------------------------
    def _abandon(self) -> None:
        """Drop a segment left open (its forward raised, or the chain broke): pop its hooks."""
        if self._open is not None:
            self._open.frame.close(check=False)
            self._open = None

    def _rerun(self, segment: tuple, *args, **kwargs):
        """The recompute: the segment's blocks through ``__call__`` (their hooks fire), each its own forward."""
        self._recomputing += 1
        try:
            x = self.blocks[segment[0]](*args, **kwargs)
            for name in segment[1:]:
                x = self.blocks[name](x)
            return x
        finally:
            self._recomputing -= 1

    def _segment_forward(self, segment: tuple, pos: int, orig, *args, **kwargs):
        if self._recomputing or not torch.is_grad_enabled():
            return orig(*args, **kwargs)
        name = segment[pos]
        label = f"block {name!r}" if len(segment) == 1 else f"segment {segment[0]!r}..{segment[-1]!r}"
        if pos == 0:
            self._abandon()
            frame = Frame(functools.partial(self._rerun, segment), args, kwargs, label, self, len(segment))
            frame.open()
            self._open = _Open(frame, segment)
        else:
            op = self._open
            if op is None or op.segment is not segment or op.next != pos or kwargs or len(args) != 1 \
                    or args[0] is not op.output:
                self._abandon()
                raise RuntimeError(f"checkpointing {self.policy!r}, {label}: block {name!r} was not called on the "
                                   f"output of block {segment[pos - 1]!r}; segments of several blocks need the "
                                   f"blocks chained (x = block(x)); use checkpointing='every' for this model")
        try:
            out = orig(*args, **kwargs)
        except BaseException:
            self._abandon()
            raise
        if pos == len(segment) - 1:
            op, self._open = self._open, None
            op.frame.close()
        else:
            self._open.output, self._open.next = out, pos + 1
        return out

    def _selective_forward(self, name: str, orig, *args, **kwargs):
        if not torch.is_grad_enabled():
            return orig(*args, **kwargs)
        mode = _AttentionCores(self, name)
        with mode:
            out = orig(*args, **kwargs)
        if not mode.calls:
            raise ValueError(f"checkpointing='selective': block {name!r} calls no scaled_dot_product_attention or "
                             f"nn.MultiheadAttention, so "
                             f"it has no attention core to recompute; use checkpointing='every' for this model")
        return out


def checkpointing_of(model: nn.Module) -> Optional[Checkpointing]:
    """The policy installed on ``model``, or None."""
    return getattr(model, ATTRIBUTE, None)


def apply_checkpointing(model: nn.Module, policy: str = "every", every: Optional[int] = None) -> Checkpointing:
    """Install ``policy`` on ``model``'s repeated blocks in place; returns the handle (``recomputed_forwards``)."""
    existing = checkpointing_of(model)
    if existing is not None:
        raise ValueError(f"checkpointing is already applied to this model (policy {existing.policy!r}); "
                         f"call remove_checkpointing(model) before applying {policy!r}")
    groups = check_for_model(model, policy, every)
    return Checkpointing(model, policy, every, groups)


def remove_checkpointing(model: nn.Module) -> None:
    """Undo :func:`apply_checkpointing` (nothing to do if no policy is installed)."""
    existing = checkpointing_of(model)
    if existing is not None:
        existing.remove()
