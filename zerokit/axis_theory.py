"""The theory's bytes per step on each mesh axis of one rank's run, next to which the ledger's are reported.

``by_axis`` is called once, after the steps, by :func:`zerokit.train.run_rank`: the
data-parallel strategy's formula on ``dp`` (``dp_cp`` when the sequence is cut over cp),
then, for each axis the run used, its own: the tensor-parallel plan's collectives on ``tp``
(:func:`zerokit.theory.tp_comm_bytes_per_step`), the pipeline's sends on ``pp``, ring
attention's or Ulysses' transfers on ``cp`` (:mod:`zerokit.context_parallel.apply`), the
experts' gradients on ``edp`` (the strategy's split) and the MoE all-to-alls on ``ep`` — the
last a formula on the split the router measured, since the router decides where each row goes.
"""
from __future__ import annotations

import torch

from . import theory
from .context_parallel.apply import theory_bytes
from .expert_parallel import moe_layers
from .tensor_parallel import communicated_widths


def tp_bytes(model, mesh, plan, tokens: int, element_bytes: int, micro_batches: int, computes_loss: bool) -> float:
    """The ring formula for the plan's collectives on ``tp``; the vocabulary-parallel loss's reductions only where
    the loss is computed (a pipeline's last stage), and a tensor-parallel MoE layer's gates (fp32, k per token).
    ``tokens``: a micro-batch's b·s."""
    widths = communicated_widths(model)
    loss = 3 if plan.loss == "vocab_parallel" and computes_loss else 0
    return theory.tp_comm_bytes_per_step(
        tokens, widths["reduced"], mesh.size("tp"), element_bytes, micro_batches, widths["gathered"],
        loss + widths["fp32_per_token"], widths["sequence_parallel_numel"])


def ep_bytes(model, mesh, element_bytes: int, steps: int) -> float:
    """The MoE layers' all-to-alls per step on ``ep``, on the rows each layer measured leaving and arriving."""
    return sum(theory.moe_alltoall_bytes(*m.exchanged[:2], m.router.in_features, element_bytes, mesh.size("ep"),
                                         calls=m.exchanged[2]) for m in moe_layers(model)) / steps


def by_axis(strategy, model, mesh, *, psi: int, dtype, micro_batch, micro_batches: int, steps: int,
            cp_attention: str, plan=None, pipeline=None) -> dict:
    """``{axis: bytes per step}`` by formula for this rank; ``micro_batch``: one micro-batch's (inputs, targets)
    on this rank; ``plan``: the tensor-parallel plan applied (None: none)."""
    b = torch.empty((), dtype=dtype).element_size()
    out = {"dp" if mesh.size("cp") == 1 else "dp_cp": strategy.theory_comm_bytes(psi)}
    if mesh.size("ep") > 1:
        out["ep"] = ep_bytes(model, mesh, b, steps)
        if mesh.size("edp") > 1:
            out["edp"] = strategy.theory_expert_comm_bytes()
    if mesh.size("cp") > 1:
        x = micro_batch[0]
        out["cp"] = theory_bytes(model, mesh.size("cp"), cp_attention, x.shape[0], x.shape[1], b, micro_batches)
    if plan is not None:
        last_stage = pipeline is None or mesh.coord("pp") == mesh.size("pp") - 1
        out["tp"] = tp_bytes(model, mesh, plan, micro_batch[1].numel(), b, micro_batches, last_stage)
    if pipeline is not None:
        out["pp"] = pipeline.theory_pp_bytes(b)
    return out
