"""Expert parallelism: a mixture-of-experts MLP whose experts are spread over the ``ep`` ranks.

- :mod:`.moe`: the MoE layer — router, top-k, capacity, load-balancing loss, dispatch and combine;
- :mod:`.alltoall`: the uneven, differentiable all-to-all that moves tokens to experts and back;
- :mod:`.apply`: a model set up for it inside ``zerokit.train`` (experts sharded, gathered for the comparison).

``ep`` is carved from the data-parallel ranks (it divides dp): the ep ranks of a group hold
different experts and exchange tokens; the dp / ep ranks with the same ep index hold the same
experts and average their gradients (``edp``), while the dense weights average over all of dp.
"""
from __future__ import annotations

from .apply import apply_expert_parallel, gather_experts, moe_layers
from .moe import MoEMLP

__all__ = ["MoEMLP", "apply_expert_parallel", "gather_experts", "moe_layers"]
