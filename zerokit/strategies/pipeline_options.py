"""The pipeline's options (``schedule``, ``chunks``, ``partition``) as every strategy on a pipeline's ``dp`` axis takes them.

Strategies that can run on a pipeline's ``dp`` axis (``ddp``, ``zero1``) and the pure
pipeline ``pp`` accept these options; they are data here, below the parallelisms that share
them; :func:`zerokit.pipeline_parallel.options.check_pipeline` checks them against each other
and the model.
"""
from __future__ import annotations

from .base import Option

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


def _partition_allowed(value) -> bool:
    return value in ("blocks", "params") or (isinstance(value, (list, tuple, dict)) and len(value) > 0)


PIPELINE_OPTIONS = {
    "schedule": Option("1f1b", lambda v: v in SCHEDULES, f"one of {', '.join(SCHEDULES)}"),
    "chunks": Option(1, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                     "a positive integer: model chunks per pipeline rank (above 1 only with schedule='interleaved')"),
    "partition": Option("blocks", _partition_allowed,
                        "'blocks' (equal block counts), 'params' (balanced parameter counts), a list of block "
                        "counts, one per stage, or {'first': k, 'last': k} (Megatron's first/last stage counts)"),
}

REFUSED = ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism (DeepSpeed refuses them too): each "
           "micro-batch's backward would reduce-scatter the gradients, m times per step; run zero1 or ddp on dp")


def pipelined(cls, ctx) -> bool:
    """Does this rank train through a pipeline (strategy ``pp``, or a ``pp`` degree above 1)?"""
    return getattr(cls, "pipeline_only", False) or ctx.mesh.size("pp") > 1
