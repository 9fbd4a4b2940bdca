"""The pipeline's options (``schedule``, ``chunks``, ``partition``) and their checks, before any process starts.

Strategies that can run on a pipeline's ``dp`` axis (``ddp``, ``zero1``) and the pure
pipeline ``pp`` accept these options; ``micro_batches`` (the training loop's) is the
pipeline's m.
"""
from __future__ import annotations

from ..strategies.base import Option
from .schedules import schedule as build_schedule

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


def _partition_allowed(value) -> bool:
    return value in ("blocks", "params") or (isinstance(value, (list, tuple)) and len(value) > 0)


PIPELINE_OPTIONS = {
    "schedule": Option("1f1b", lambda v: v in SCHEDULES, f"one of {', '.join(SCHEDULES)}"),
    "chunks": Option(1, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                     "a positive integer: model chunks per pipeline rank (above 1 only with schedule='interleaved')"),
    "partition": Option("blocks", _partition_allowed,
                        "'blocks' (equal block counts), 'params' (balanced parameter counts) or a list of block "
                        "counts, one per stage"),
}

REFUSED = ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism (DeepSpeed refuses them too): each "
           "micro-batch's backward would reduce-scatter the gradients, m times per step; run zero1 or ddp on dp")


def pipelined(cls, ctx) -> bool:
    """Does this rank train through a pipeline (strategy ``pp``, or a ``pp`` degree above 1)?"""
    return getattr(cls, "pipeline_only", False) or ctx.mesh.size("pp") > 1


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
        from .partition import block_counts, pieces_of

        block_counts(pieces_of(model), pp, chunks, options.get("partition", "blocks"))


