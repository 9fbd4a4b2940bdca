"""Single-process training: the reference every strategy is compared against."""
from __future__ import annotations

from ..optim import MasterOptimizer
from .base import Strategy, register


@register
class Single(Strategy):
    """The whole model, the whole global batch, one process, no communication."""

    name = "single"
    stage = 0
    data_parallel = False

    def __init__(self, model, ctx, config, **options):
        super().__init__(model, ctx, config, **options)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = MasterOptimizer(self.params, config.optimizer)

    def step(self):
        self.optimizer.step([p.grad for p in self.params])

    def track_memory(self, ledger):
        super().track_memory(ledger)
        ledger.track_optimizer(self.optimizer.optimizer)

    def optimizer_tensors(self):
        return self.optimizer.step_scalars

    def theory_comm_bytes(self, psi):
        return 0
