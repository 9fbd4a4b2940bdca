"""zerokit in your own training loop: torch-style wrappers, a DeepSpeed-style ``initialize``, and ``measure``.

Each is a thin face over the strategies ``zerokit.train`` runs (one mechanism, one code
path): :class:`DistributedDataParallel` (torch's DDP interface, zerokit's ``ddp``),
:class:`ShardedOptimizer` (torch's ZeroRedundancyOptimizer interface, zerokit's ``zero1``),
:func:`fully_shard` (FSDP2's convention over ``zero3``, your own optimizer), :func:`initialize` and its
:class:`Engine` (DeepSpeed's verbs over ``ddp`` or ZeRO 1–3,
the engine ``zerokit.train`` itself drives), and :func:`measure` (the ledgers around a block).
"""
from .ddp import DistributedDataParallel
from .engine import Engine
from .fully_shard import fully_shard
from .initialize import initialize
from .measure import Measurement, measure
from .pipeline import PipelineSchedule, pipeline
from .sharded_optimizer import ShardedOptimizer

__all__ = ["DistributedDataParallel", "ShardedOptimizer", "Engine", "fully_shard", "initialize", "measure", "Measurement",
           "pipeline", "PipelineSchedule"]
