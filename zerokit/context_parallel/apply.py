"""Context parallelism on a model: this rank's tokens, its positions, and attention over every rank's keys.

``apply_context_parallel(model, mesh, seq_len, attention)`` — lifecycle, on every rank, after
the model is built and before any strategy wraps it:

1. the rank's global positions (:func:`.layout.positions`, zig-zag chunks) are given to the
   model (``model.positions``: its position embedding reads them instead of 0…T−1);
2. every attention core (a module with ``context``, zerokit's ``CausalSelfAttention``) gets
   the cp attention — ring or Ulysses — with those positions and the cp group; everything
   else in the block (LayerNorm, MLP, residuals) works token by token, on the local tokens;
3. the training loop feeds each rank its chunks of every sequence (:func:`.layout.split`);
   the loss over its tokens is a mean over an equal share of them, so the mean over the
   dp × cp ranks is the whole batch's, and the weights' gradients are averaged over the
   flattened ``dp_cp`` group by the data-parallel strategy (Megatron's data-parallel group
   with context parallel).

:func:`theory_bytes` is the cp axis's bytes per step for a model so set up
(:func:`zerokit.theory.ring_attention_bytes` / ``ulysses_bytes`` per attention call).
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn as nn

from .. import theory
from ..strategies.blocks import moe_layers
from . import layout
from .ring_attention import ring_attention
from .ulysses import ulysses_attention

ATTENTION = {"ring": ring_attention, "ulysses": ulysses_attention}


def check_attention(attention) -> str:
    if attention not in ATTENTION:
        raise ValueError(f"cp_attention={attention!r}; allowed: {', '.join(map(repr, ATTENTION))}")
    return attention


def attention_modules(model: nn.Module) -> list:
    return [m for m in model.modules() if hasattr(m, "context") and hasattr(m, "head_dim")]


def check_model(model: nn.Module, seq_len: int, cp: int, attention: str, tp: int = 1) -> None:
    """Refuse, before any process starts, a model context parallelism cannot run on, naming what it needs;
    ``tp``: the tensor-parallel degree that first splits the heads (Ulysses splits each rank's share again)."""
    check_attention(attention)
    layout.check(seq_len, cp)
    cores = attention_modules(model)
    if not cores or not hasattr(model, "positions"):
        raise ValueError(f"context parallelism needs a model whose attention cores take it (zerokit's "
                         f"CausalSelfAttention: a `context` attribute) and whose position embedding reads "
                         f"`model.positions`; {type(model).__name__} has {len(cores)} such cores")
    if any(layer.capacity_factor is not None for layer in moe_layers(model)):
        raise ValueError(f"context parallelism with capacity_factor set: an expert's capacity is filled in the "
                         f"order of a whole sequence's tokens, which cp = {cp} ranks hold in chunks; zerokit runs "
                         f"cp with dropless experts only (capacity_factor=None)")
    if attention == "ulysses":
        heads = {m.n_head for m in cores}
        if any(h % (cp * tp) for h in heads):
            by = f"cp = {cp} ranks" + (f" after tp = {tp} took its share" if tp > 1 else "")
            raise ValueError(f"cp_attention='ulysses' splits the heads over {by}; the model has {sorted(heads)} heads "
                             f"per layer (use 'ring', or a cp{' × tp' if tp > 1 else ''} that divides them)")


def apply_context_parallel(model: nn.Module, mesh, seq_len: int, attention: str = "ring") -> None:
    cp, rank = mesh.size("cp"), mesh.coord("cp")
    check_model(model, seq_len, cp, attention, tp=mesh.size("tp"))
    device = next(model.parameters()).device
    positions = layout.positions(rank, cp, seq_len, device=device)
    every = torch.stack([layout.positions(r, cp, seq_len, device=device) for r in range(cp)])
    model.positions = positions
    core = partial(ATTENTION[attention], positions=positions, all_positions=every, group=mesh.group("cp"))
    for module in attention_modules(model):
        module.context = core
    for layer in moe_layers(model):  # the load-balancing loss's statistics are per whole sequence
        layer.cp, layer.cp_group = cp, mesh.group("cp")


def theory_bytes(model: nn.Module, cp: int, attention: str, rows: int, local_tokens: int, element_bytes: int,
                 micro_batches: int) -> int:
    """The cp axis's bytes one rank sends per step: every attention call, forward and backward, and every MoE layer's
    load-balancing statistics, per micro-batch of ``rows`` sequences holding ``local_tokens`` tokens each on this
    rank."""
    formula = theory.ring_attention_bytes if attention == "ring" else theory.ulysses_bytes
    total = sum(theory.moe_aux_cp_bytes(rows, layer.n_experts, cp) for layer in moe_layers(model))
    for m in attention_modules(model):  # this rank's heads: all, or its tensor-parallel share of the q/k/v columns
        heads = m.qkv.weight.shape[0] // (3 * m.head_dim)
        block = rows * heads * local_tokens * m.head_dim * element_bytes
        total += sum(formula(cp, block).values())
    return total * micro_batches
