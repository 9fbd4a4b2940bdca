"""The parts of a model every parallelism looks for, found by structure, not by name.

:func:`repeated_blocks`: the children of a ``ModuleList``/``Sequential`` of one class — the
units ZeRO-3 and ``fully_shard`` gather one at a time, the segments activation checkpointing
recomputes. :func:`moe_layers`: the mixture-of-experts layers (a class that says
``mixture_of_experts = True``, :class:`zerokit.expert_parallel.MoEMLP`) that expert, tensor
and context parallelism each adjust. :func:`in_backward`: whether a block runs inside a backward
(a checkpointed block's recompute), which ZeRO-3's units and activation checkpointing both ask.
"""
from __future__ import annotations

from typing import Set

import torch
import torch.nn as nn


def repeated_blocks(model: nn.Module) -> Set[str]:
    """Qualified names of the children of every ModuleList/Sequential whose children share one class."""
    blocks = set()
    for name, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > 1:
            kinds = {type(child) for child in module}
            if len(kinds) == 1 and any(True for _ in module[0].parameters()):
                blocks.update(f"{name}.{i}" if name else str(i) for i in range(len(module)))
    return blocks


def in_backward() -> bool:
    """True while the autograd engine runs a backward on this thread (a checkpointed block's recompute)."""
    return torch._C._current_graph_task_id() != -1


def moe_layers(model: nn.Module) -> list:
    """The model's mixture-of-experts layers, in module order."""
    return [m for m in model.modules() if getattr(type(m), "mixture_of_experts", False)]
