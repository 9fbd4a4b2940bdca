"""What a rank's tensors are in the whole, unsharded model: global names, full shapes, tensor-parallel cuts.

Under tensor parallelism a rank holds a slice of some parameters (marked with their
:class:`~zerokit.tensor_parallel.Shard`: the dimension cut over ``tp`` and the number of
packed blocks, q/k/v), under the unsharded model's names. Under pipeline parallelism a
rank holds its stages only, and the module it trains (a list of stages) names them
differently from the whole model. A checkpoint speaks in the whole model's terms, so
any layout can read it. Lifecycle:

1. :class:`Naming` is taken from the whole model *before* a pipeline splits it (after the
   tensor-parallel plan; :mod:`.training` does so for ``zerokit.train`` and attaches it
   as ``strategy.checkpoint_naming``); without one, :func:`naming_of` names the
   strategy's own model, which is the whole model when ``pp`` is 1. It maps every tensor
   (by identity: stages, ZeRO's flat buffers and wrappers keep the parameter objects) to
   its global name, records each parameter's full shape, shard spec and trainability,
   and the tied aliases (``head.weight`` → ``tok.weight``: one tensor, two names).
2. On save, the saved layout's segments carry global names and local (sliced) shapes.
3. On load, :func:`localize` cuts the whole state (:func:`~.reshard.full_state`) into
   this rank's slices under its own module's names: what :func:`~.layout.apply_full` fills.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ..tensor_parallel.sharding import Shard, shard_tensor
from .layout import FullState


def spec_of(param) -> Optional[dict]:
    """The parameter's tensor-parallel cut as JSON ({"dim", "blocks"}), None when it is replicated."""
    shard = getattr(param, "tp_shard", None)
    return None if shard is None else {"dim": shard.dim, "blocks": shard.blocks}


def full_shape(local_shape, spec: Optional[dict], tp: int) -> list:
    shape = list(local_shape)
    if spec is not None:
        shape[spec["dim"]] *= tp
    return shape


def persistent_buffers(model):
    """(name, buffer) of the buffers ``model.state_dict()`` holds: not the non-persistent ones (a causal mask a module
    rebuilds), which a strict ``load_state_dict`` would call unexpected."""
    for prefix, module in model.named_modules():
        for name, b in module._buffers.items():
            if b is not None and name not in module._non_persistent_buffers_set:
                yield (f"{prefix}.{name}" if prefix else name), b


def tied_names(model) -> Dict[str, str]:
    """{alias: name} of parameters shared by several modules (``named_parameters`` lists each once)."""
    canonical = {p: n for n, p in model.named_parameters()}
    return {n: canonical[p] for n, p in model.named_parameters(remove_duplicate=False) if canonical[p] != n}


class Naming:
    """The whole model's names (see the module docstring); ``tp`` is the degree ``model``'s slices are cut at."""

    def __init__(self, model: torch.nn.Module, tp: int = 1):
        self.ids: Dict[int, str] = {}
        self.params: Dict[str, dict] = {}
        for name, p in model.named_parameters():
            self.ids[id(p)] = name
            spec = spec_of(p)
            self.params[name] = {"shape": full_shape(p.shape, spec, tp), "shard": spec,
                                 "trainable": bool(p.requires_grad)}
        for name, b in model.named_buffers():
            self.ids.setdefault(id(b), name)
        self.tied = tied_names(model)

    def name(self, tensor, local: str) -> str:
        return self.ids.get(id(tensor), local)


def naming_of(strategy) -> Naming:
    naming = getattr(strategy, "checkpoint_naming", None)
    if naming is not None:
        return naming
    mesh = strategy.ctx.mesh
    if mesh.size("pp") > 1:
        raise ValueError("zerokit.checkpoint: with pp above 1 the strategy trains a list of pipeline stages whose "
                         "parameter names are not the model's; checkpoint through zerokit.train(save_dir=…), or "
                         "set strategy.checkpoint_naming = zerokit.checkpoint.Naming(whole_model, tp) before the split")
    return Naming(strategy.model, mesh.size("tp"))


def _cut(value: torch.Tensor, spec: Optional[dict], rank: int, tp: int) -> torch.Tensor:
    if spec is None or tp == 1:
        return value

    return shard_tensor(value, Shard(spec["dim"], spec["blocks"]), rank, tp, "checkpoint")


@torch.no_grad()
def localize(full: FullState, strategy, naming: Naming) -> FullState:
    """This rank's slice of every tensor it holds, under its module's names, from the whole state ``full``."""
    mesh = strategy.ctx.mesh
    tp, j = mesh.size("tp"), mesh.coord("tp")
    out = FullState()
    for local, p in strategy.model.named_parameters():
        name = naming.name(p, local)
        spec = spec_of(p)
        if not p.requires_grad:
            out.frozen[local] = _cut(full.frozen[name], spec, j, tp)
            continue
        shape = full.shapes[name]
        numel = full.params[name].numel()
        value = _cut(full.params[name].view(shape), spec, j, tp)
        out.params[local] = value.reshape(-1)
        out.shapes[local] = list(value.shape)
        out.states[local] = {k: (_cut(s.view(shape), spec, j, tp).reshape(-1) if s.dim() > 0 and s.numel() == numel
                                 else s) for k, s in full.states.get(name, {}).items()}
    for local, b in strategy.model.named_buffers():
        name = naming.name(b, local)
        if name in full.buffers:
            out.buffers[local] = full.buffers[name]
    return out
