"""Bytes per step on each mesh axis of one rank, by formula: the column the report sets next to the ledger's.

Lifecycle: after a run, ``zerokit.train`` reads what the run used into
plain numbers — the data-parallel strategy's own formula, the tensor-parallel plan's
communicated widths, the rows each MoE layer's router sent away and received (measured:
the router decides where each row goes), the context-parallel attention's and the
pipeline's bytes — and :func:`by_axis` here turns them into ``{axis: bytes per step}``:

- ``dp`` (``dp_cp`` when the sequence is cut over cp): the strategy's formula as given;
- ``tp``: :func:`tp_axis_bytes`, the ring formula for the plan's collectives
  (:func:`~.parallelism.tp_comm_bytes_per_step`), the vocabulary-parallel loss's three
  reductions only where the loss is computed;
- ``ep``: :func:`ep_axis_bytes`, each MoE layer's all-to-alls on its measured split
  (:func:`~.experts.moe_alltoall_bytes`), per step;
- ``edp``, ``cp``, ``pp``: as given (their formulas live beside their terms in this package).

An axis the run did not use is absent.
"""
from __future__ import annotations

from typing import Iterable, Optional, Tuple

from .experts import moe_alltoall_bytes
from .parallelism import tp_comm_bytes_per_step

#: the vocabulary-parallel cross-entropy's reductions per micro-batch (max, sum of exps, target logit)
VOCAB_PARALLEL_LOSS_REDUCTIONS = 3


def tp_axis_bytes(tokens: int, widths: dict, tp: int, element_bytes: int, micro_batches: int,
                  vocab_parallel_loss: bool) -> float:
    """``tp``'s bytes per step: the plan's ``widths`` (``reduced``, ``gathered``, ``fp32_per_token``,
    ``sequence_parallel_numel``, per token of a micro-batch of ``tokens`` = b·s) on the ring, and the
    vocabulary-parallel loss's reductions when this rank computes it."""
    loss = VOCAB_PARALLEL_LOSS_REDUCTIONS if vocab_parallel_loss else 0
    return tp_comm_bytes_per_step(tokens, widths["reduced"], tp, element_bytes, micro_batches, widths["gathered"],
                                  loss + widths["fp32_per_token"], widths["sequence_parallel_numel"])


def ep_axis_bytes(exchanges: Iterable[Tuple[int, int, int, int]], element_bytes: int, ep: int, steps: int) -> float:
    """``ep``'s bytes per step: for each MoE layer (rows sent away, rows received, its width d, its calls) over
    ``steps`` steps, :func:`~.experts.moe_alltoall_bytes`."""
    return sum(moe_alltoall_bytes(sent, received, width, element_bytes, ep, calls=calls)
               for sent, received, width, calls in exchanges) / steps


def by_axis(dp_axis: str, dp: float, *, ep: Optional[float] = None, edp: Optional[float] = None,
            cp: Optional[float] = None, tp: Optional[float] = None, pp: Optional[float] = None) -> dict:
    """``{axis: bytes per step}``: the data-parallel strategy's bytes on ``dp_axis`` and every other axis given."""
    out = {dp_axis: dp}
    out.update({axis: value for axis, value in (("ep", ep), ("edp", edp), ("cp", cp), ("tp", tp), ("pp", pp))
                if value is not None})
    return out
