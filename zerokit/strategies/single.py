"""Single-process training: the reference every strategy is compared against."""
from __future__ import annotations

from .base import Replicated, register


@register
class Single(Replicated):
    """The whole model, the whole global batch, one process, no communication."""

    name = "single"
    stage = 0
    data_parallel = False

    def theory_comm_bytes(self, psi):
        return 0
