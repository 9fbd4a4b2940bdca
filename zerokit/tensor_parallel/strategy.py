"""``tp``: pure tensor parallelism — every rank on the mesh's ``tp`` axis, no data parallelism.

The training loop splits the model by the workload's plan before this strategy sees it
(:func:`zerokit.tensor_parallel.apply_plan`), so each rank holds its column/row/vocabulary
slice and the replicated rest (LayerNorms, row-parallel biases). Forward and backward
talk only through the plan's conjugate operators (Megatron's f and g, or the sequence-
parallel all-gather / reduce-scatter); every rank sees the whole batch, so there is
nothing to average: the step updates the local slice, and the replicated parameters
stay identical on every rank because their gradients are (summed over ``tp`` first when
they saw only a sequence shard). To add data parallelism, run ``ddp`` or ``zero1/2/3``
with ``parallel={"dp": …, "tp": …}`` instead.
"""
from __future__ import annotations

from ..strategies.base import Replicated, register


@register
class TensorParallel(Replicated):
    """Each rank steps its tensor-parallel shard; no collective outside the model's own f and g."""

    name = "tp"
    stage = 0
    axes = ("tp",)

    def theory_comm_bytes(self, psi):
        return 0  # on dp: nothing (the tp traffic is the plan's, accounted per axis)
