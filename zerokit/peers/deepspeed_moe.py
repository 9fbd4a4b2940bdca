"""``deepspeed-moe``: expert parallelism's MoE layer by DeepSpeed (``deepspeed.moe.layer.MoE``).

The peer of ``ddp`` with ``parallel={"dp": N, "ep": E}`` on zerokit's tiny MoE GPT: the same
gradient reductions (zerokit's ``ddp``: the dense gradients over dp, the experts' over the ranks
holding the same experts, ``edp``), the same parameters, and every MoE MLP's routing, dispatch and
combine run by DeepSpeed's ``MOELayer`` (``TopKGate`` + ``Experts`` + its all-to-alls) instead of
:class:`zerokit.expert_parallel.MoEMLP`'s. The pair differs only in the layer, so its step times
compare the two implementations. Registered only when ``deepspeed`` imports.

Lifecycle:

1. **setup**: ``deepspeed.init_distributed`` on zerokit's process group (as the ZeRO peers do). The
   training loop has kept this rank's E/ep experts of each layer
   (:func:`zerokit.expert_parallel.apply_expert_parallel`); for each layer the peer builds ``MoE(d, expert, E, ep_size=ep, k=1, drop_tokens=False,
   use_rts=False, min_capacity=0)`` and hands it zerokit's own modules: the router as the gate's
   ``wg`` and the local experts as ``deepspeed_experts`` (the parameters are shared, so the names,
   the ledgers and the comparison with one process are unchanged), on the mesh's ``ep`` group
   (``_set_ep_group``, not DeepSpeed's own group creation, so the ledger names the axis);
2. **forward**: each sequence goes through DeepSpeed's layer on its own — top-1 gate (softmax in
   fp32, argmax), ``drop_tokens=False``: the capacity C is the largest expert count over the ep
   ranks (an all-reduce MAX), tokens scattered into an ``[E, C, d]`` buffer padded with zero rows,
   one all-to-all to the experts' ranks, the local experts on ``[ep, C, d]`` each, one all-to-all
   back, combined by the gate probability. DeepSpeed's ``l_aux`` (E · Σ mean(gates) · mean(mask))
   is the Switch loss over the tokens of the call, so one call per sequence gives the per-sequence
   loss zerokit's layer and the reference average; it reaches the gradients the way zerokit's does
   (:class:`zerokit.expert_parallel.moe.AuxLoss` with the layer's ``aux_weight``);
3. **backward**: DeepSpeed's ``_AllToAll`` runs the same two all-to-alls backwards; zerokit's
   ``ddp`` buckets reduce the gradients.

Top-1 and dropless only: DeepSpeed's top-2 renormalizes the two gates and samples the second expert
(``top2_2nd_expert_sampling``), and its capacity keeps the top-C of a 0/1 mask (``torch.topk``, ties
in no set order) where zerokit keeps the first come; neither is the function zerokit's layer and
the one-process reference compute, so they are refused rather than compared.

Traffic: DeepSpeed's ``all_to_all_single`` calls are recorded on ``ep`` by
:func:`.deepspeed_ulysses.ledgered_all_to_all` (equal chunks: (ep − 1)/ep of the padded
``E · C · d`` buffer), its all-reduce MAX by :func:`.recording.ledgered_torch_collectives`. The
layer's ``exchanged`` counters are filled with the rows DeepSpeed moves, (E − E/ep) · C per call
each way, so the loop's ep formula (:func:`zerokit.theory.moe_alltoall_bytes`, written for
zerokit's uneven exchange) is read on DeepSpeed's padded rows; it also counts zerokit's expert-id
exchange (an int32 per row) and count exchange, which DeepSpeed does not make (the slot of a
row names its expert; the all-reduce MAX is its count exchange).
"""
from __future__ import annotations

import types

import torch
import torch.nn as nn

from ..data_parallel.overlap import OverlappedDataParallel
from ..expert_parallel import moe_layers
from ..expert_parallel.moe import AuxLoss, Expert
from ..strategies.base import register
from .deepspeed_ulysses import deepspeed_available, init_deepspeed, ledgered_all_to_all
from .recording import ledgered_torch_collectives


class _GateSpy(nn.Module):
    """DeepSpeed's gate, unchanged, remembering the capacity C of each call (the padded rows each all-to-all moves)."""

    def __init__(self, gate: nn.Module):
        super().__init__()
        self.gate = gate
        self.capacity = 0

    def forward(self, *args, **kwargs):
        out = self.gate(*args, **kwargs)
        self.capacity = int(out[1])
        return out


def _deepspeed_forward(self, x):
    """MoEMLP.forward replaced: each sequence through DeepSpeed's MOELayer; the per-sequence aux loss averaged."""
    layer, spy = self.__dict__["_deepspeed_layer"], self.__dict__["_deepspeed_gate"]
    ep = torch.distributed.get_world_size(self.group)
    outs, auxes, counts = [], [], torch.zeros(self.n_experts, dtype=torch.int64)  # host: a count the run reports
    for i in range(x.shape[0]):
        outs.append(layer(x[i:i + 1], None))  # (input, used_token), as MoE.forward calls it
        auxes.append(layer.l_aux)
        counts += layer.exp_counts.detach().cpu().long()
        if torch.is_grad_enabled():
            rows = (self.n_experts - self.n_experts // ep) * spy.capacity
            self.exchanged[0] += rows
            self.exchanged[1] += rows
            self.exchanged[2] += 1
    y = torch.cat(outs)
    aux = torch.stack(auxes).mean()
    self.aux, self.tokens_per_expert, self.dropped = aux.detach(), counts, 0
    return AuxLoss.apply(y, aux, self.aux_weight) if self.training and torch.is_grad_enabled() else y


class DeepSpeedMoE(OverlappedDataParallel):
    """zerokit's ``ddp`` (dense over dp, experts over edp) with DeepSpeed's ``MOELayer`` as every MoE MLP."""

    name = "deepspeed-moe"
    peer = True
    axes = ("dp", "ep")

    def __init__(self, model, ctx, config, **options):
        from deepspeed.moe.layer import MoE

        mesh = ctx.mesh
        ep = mesh.size("ep")
        layers = moe_layers(model)
        if ep < 2 or not layers:
            raise ValueError("strategy 'deepspeed-moe' is expert parallelism: use a tiny GPT with experts "
                             "(zerokit.tiny_gpt(…, n_experts=E)) and parallel={'dp': N, 'ep': 2} (or more)")
        for m in layers:
            if m.top_k != 1 or m.capacity_factor is not None:
                raise ValueError(f"strategy 'deepspeed-moe' compares top-1 dropless routing only (top_k=1, "
                                 f"capacity_factor=None); got top_k={m.top_k}, capacity_factor={m.capacity_factor}: "
                                 f"DeepSpeed's top-2 renormalizes the gates and samples the second expert, and its "
                                 f"capacity keeps the top-C of a 0/1 mask, not the first come")
        init_deepspeed(ctx)
        group = mesh.group("ep")
        for m in layers:
            d = m.router.in_features
            moe = MoE(d, Expert(d), num_experts=m.n_experts, ep_size=ep, k=1, capacity_factor=1.0,
                      drop_tokens=False, use_rts=False, min_capacity=0)
            layer = moe.deepspeed_moe
            layer.gate.wg = m.router  # zerokit's router (fp32, no bias) is DeepSpeed's gate weight
            layer.experts.deepspeed_experts = nn.ModuleList(m.experts[k] for k in sorted(m.experts, key=int))
            layer._set_ep_group(group)
            spy = _GateSpy(layer.gate)
            layer.gate = spy
            # kept out of the module tree: its parameters are zerokit's, already registered under their own names
            m.__dict__["_deepspeed_layer"], m.__dict__["_deepspeed_gate"] = layer, spy
            m.forward = types.MethodType(_deepspeed_forward, m)
        super().__init__(model, ctx, config, **options)

    def forward(self, *args, **kwargs):
        with ledgered_all_to_all(self.name), ledgered_torch_collectives(self.name):
            return super().forward(*args, **kwargs)

    def backward(self, loss):
        with ledgered_all_to_all(self.name):
            super().backward(loss)


if deepspeed_available():
    register(DeepSpeedMoE)
