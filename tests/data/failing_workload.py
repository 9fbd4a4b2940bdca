"""A workload whose loss raises on rank 1 only, for the CLI's failing-rank test."""
import dataclasses

import zerokit


def _loss_failing_on_rank_1(outputs, targets):
    if zerokit.current().rank == 1:
        raise RuntimeError("the loss refuses to run on rank 1")
    return zerokit.mlp((13, 37, 29, 7), batch_size=12, seed=3).loss(outputs, targets)


def workload():
    base = zerokit.mlp((13, 37, 29, 7), batch_size=12, seed=3)
    return dataclasses.replace(base, name="failing-mlp", loss_fn=_loss_failing_on_rank_1)
