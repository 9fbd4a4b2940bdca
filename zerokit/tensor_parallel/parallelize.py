"""``zerokit.parallelize_module``: torch's ``parallelize_module`` convention on zerokit's tensor-parallel layers.

::

    zerokit.parallelize_module(model, tp_mesh, {"attn": "attention", "mlp.fc1": ColwiseParallel(),
                                                "mlp.fc2": RowwiseParallel()})

in your own loop, on every rank of the tensor-parallel group. Lifecycle:

1. **the plan**: module name (or fnmatch pattern) → a style — one of :data:`.plan.STYLES`,
   or torch's own ``ColwiseParallel()`` / ``RowwiseParallel()`` / ``SequenceParallel()``
   with their default layouts, which mean the same here (``RowwiseParallel`` on an
   ``nn.Embedding``: the vocabulary-parallel embedding, as in torch). A torch style with
   other layouts is refused, naming the setting, not half-applied;
2. **the group**: torch's 1-D ``DeviceMesh``, a process group, or None — the ``tp`` axis of
   this rank's mesh when it has one, else every rank;
3. **rank 0's model** is broadcast over the group (torch's ``distribute_tensor`` scatters from
   rank 0 too), then :func:`.plan.check_plan` and :func:`.plan.apply_plan` swap the named
   modules in place. Returns the module.
"""
from __future__ import annotations

from typing import Union

import torch.distributed as dist
import torch.nn as nn

from ..runtime.wrapping import broadcast_from_first, rank_context
from .mappings import group_size
from .plan import Plan, apply_plan, check_plan

#: torch's ParallelStyle classes zerokit takes, by class name, and their default layouts (torch 2.13)
TORCH_STYLES = {"ColwiseParallel": "colwise", "RowwiseParallel": "rowwise", "SequenceParallel": "sequence_parallel"}


def parallelize_module(module: nn.Module, device_mesh=None, parallelize_plan: Union[dict, Plan, None] = None,
                       sequence_parallel: bool = False) -> nn.Module:
    """Tensor-parallelize ``module`` in place by ``parallelize_plan`` (see the module docstring)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"zerokit.parallelize_module(module=…) needs an nn.Module, got {type(module).__name__}")
    ctx = rank_context("zerokit.parallelize_module")
    group = _group(device_mesh, ctx)
    if isinstance(parallelize_plan, Plan):
        plan = parallelize_plan
    elif isinstance(parallelize_plan, dict) and parallelize_plan:
        plan = Plan({name: _style(module, name, style) for name, style in parallelize_plan.items()},
                    sequence_parallel=sequence_parallel)
    else:
        raise ValueError("zerokit.parallelize_module(parallelize_plan=…) needs a dict {module name: style} (or a "
                         "zerokit.tensor_parallel.Plan)")
    check_plan(module, plan, group_size(group))

    src = ctx.mesh.ranks("tp")[0] if device_mesh is None and ctx.mesh.size("tp") > 1 else _first_rank(group)
    broadcast_from_first(module, ctx, (group, src))
    return apply_plan(module, plan, group)


def _group(device_mesh, ctx):
    if device_mesh is None:
        return ctx.mesh.group("tp") if ctx.mesh.size("tp") > 1 else None
    get_group = getattr(device_mesh, "get_group", None)
    if get_group is not None:  # torch's DeviceMesh
        if device_mesh.ndim != 1:
            raise ValueError(f"zerokit.parallelize_module(device_mesh=…): a {device_mesh.ndim}-D mesh; pass its "
                             f"tensor-parallel dimension, mesh['tp'], as torch's parallelize_module takes")
        return get_group()
    return device_mesh  # a process group


def _first_rank(group) -> int:
    return 0 if group is None else dist.get_process_group_ranks(group)[0]


def _style(model: nn.Module, name: str, style) -> str:
    if isinstance(style, str):
        return style
    kind = type(style).__name__
    if kind not in TORCH_STYLES:
        raise ValueError(f"parallelize_plan[{name!r}]: {kind} is not taken; allowed: a zerokit style string or "
                         f"torch's {', '.join(TORCH_STYLES)} with their default layouts")
    defaults = type(style)()
    changed = [k for k, v in vars(style).items() if not k.startswith("_") and repr(v) != repr(vars(defaults).get(k))]
    if changed:
        raise ValueError(f"parallelize_plan[{name!r}]: {kind} with {', '.join(changed)} set is not implemented; "
                         f"zerokit takes torch's styles with their default layouts only")
    mapped = TORCH_STYLES[kind]
    matched = [m for n, m in model.named_modules() if n == name]
    if kind == "RowwiseParallel" and matched and isinstance(matched[0], nn.Embedding):
        return "vocab_embedding"  # torch's RowwiseParallel on an embedding shards the vocabulary
    return mapped
