"""The pipeline's options (``schedule``, ``chunks``, ``partition``) and their checks, before any process starts.

The options themselves are data in :mod:`zerokit.strategies.pipeline_options` (the ``dp``
axis's strategies take them too); here they are checked against each other, the schedule and
the model. ``micro_batches`` (the training loop's) is the pipeline's m.
"""
from __future__ import annotations

from ..strategies.pipeline_options import (PIPELINE_OPTIONS, REFUSED, SCHEDULES,  # noqa: F401 - read from here too
                                          pipelined)
from .partition import block_counts, pieces_of
from .schedules import schedule as build_schedule


def check_pipeline(options: dict, micro_batches: int, pp: int, strategy: str, model=None,
                   pipeline_only: bool = False) -> None:
    """The options against each other and against ``model`` (its blocks), before any process starts."""
    name, chunks = options.get("schedule", "1f1b"), options.get("chunks", 1)
    if chunks > 1 and name != "interleaved":
        raise ValueError(f"chunks={chunks}: only schedule='interleaved' runs more than one chunk per rank "
                         f"(schedule={name!r})")
    if pp == 1 and not pipeline_only and any(k in options and options[k] != PIPELINE_OPTIONS[k].default
                                            for k in PIPELINE_OPTIONS):
        raise ValueError(f"strategy {strategy!r}: the options schedule, chunks and partition need pipeline "
                         f"parallelism: a pp degree above 1 in parallel")
    build_schedule(name, pp, micro_batches, chunks)  # raises on an impossible (p, m, v)
    if model is not None:
        block_counts(pieces_of(model), pp, chunks, options.get("partition", "blocks"))


