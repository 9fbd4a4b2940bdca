"""Expert parallelism on a model inside ``zerokit.train``; lifecycle on every rank:

1. before the strategy: :func:`apply_expert_parallel` keeps each MoE layer's E/ep experts of this
   rank's ``ep`` group (every rank built all E from one seed, so the kept ones equal the
   single-process model's) and marks their parameters ``_zerokit_expert``;
2. the strategy (``ddp``) reduces the dense gradients over dp and the experts' over ``edp``;
3. after training: :func:`gather_experts` adds the ep peers' experts to this rank's parameters,
   under the whole model's names, for the comparison with one process.
:func:`routing` reads what each layer measured in its last forward (slots per expert, dropped).
"""
from __future__ import annotations

from typing import Dict

import torch
import torch.distributed as dist
import torch.nn as nn

from ..strategies.blocks import moe_layers  # noqa: F401 - zerokit.expert_parallel.moe_layers


def check_model(model: nn.Module, ep: int) -> None:
    layers = moe_layers(model)
    if not layers:
        raise ValueError(f"parallel ep={ep}: the model has no mixture-of-experts layer to spread over ranks; build it "
                         f"with experts (zerokit.tiny_gpt(…, n_experts=E))")
    for m in layers:
        if m.n_experts % ep:
            raise ValueError(f"parallel ep={ep}: {m.n_experts} experts per layer do not divide over {ep} ranks")


def apply_expert_parallel(model: nn.Module, mesh) -> None:
    group = mesh.group("ep")
    for m in moe_layers(model):
        m.shard(group)


def gather_experts(params: Dict[str, torch.Tensor], model: nn.Module, mesh, order) -> Dict[str, torch.Tensor]:
    """``params`` (this rank's, whole) with every ep peer's experts added, in the order of ``order`` (names)."""
    experts = {n: t for n, t in params.items() if n in {name for name, p in model.named_parameters()
                                                         if getattr(p, "_zerokit_expert", False)}}
    gathered = [None] * mesh.size("ep")
    dist.all_gather_object(gathered, experts, group=mesh.group("ep"))
    merged = dict(params)
    for part in gathered:
        merged.update(part)
    return {name: merged[name] for name in order if name in merged}


def routing(model: nn.Module) -> dict:
    """Measured in the last forward, per MoE layer: slots each expert received, slots dropped, the aux loss."""
    return {"tokens_per_expert": [m.tokens_per_expert.tolist() for m in moe_layers(model)],
            "dropped": [m.dropped for m in moe_layers(model)],
            "aux": [None if m.aux is None else float(m.aux) for m in moe_layers(model)]}
