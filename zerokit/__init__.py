"""zerokit: learn distributed training by running it.

Data parallelism, ZeRO stages 1-3 and their peers on torch.distributed, each step
measured by a memory ledger and a communication ledger and held against the
formulas of :mod:`zerokit.theory` and a single-process reference.

Imports flow one way, down the floors: ``runtime`` and ``theory``; what every parallelism
shares (``strategies``, ``optim``, ``report``, ``plot``); the parallelisms, one package per
paper; the models (``workloads``); the interfaces (``api``, ``peers``, ``train``); the
applications (``course``, ``grade``, ``planner``, ``bench``, ``tour``, ``cli``), which load
when used. ``tests/test_layers.py`` holds the table and checks it.
"""
from . import theory
from .runtime import comm, ring, timeline
from .runtime.context import RankContext, current
from .runtime.launch import RankFailed, RankTimeout, launch
from .runtime.memory import MemoryLedger
from .api import DistributedDataParallel, Engine, ShardedOptimizer, fully_shard, initialize, measure, pipeline
from .pipeline_parallel import schedule, simulate
from .report import Report
from .train import train
from .workloads import Workload, mlp, tiny_gpt
from . import checkpoint  # zerokit.checkpoint.save / load / export_full_state_dict
from .runtime import link as links  # zerokit.links.LINKS: the emulated links by name
from .runtime.link import Link, TieredLink
from .runtime.replicas import ReplicasDiverged, check_replicas
from .activation_checkpointing import apply_checkpointing, remove_checkpointing  # activation checkpointing on any model
from .tensor_parallel import parallelize_module  # tensor parallelism on any model, torch's convention

__all__ = ["launch", "ring", "timeline", "RankFailed", "RankTimeout", "RankContext", "current", "comm", "theory",
           "MemoryLedger", "Workload", "tiny_gpt", "mlp", "train", "Report", "plan", "schedule", "simulate",
           "DistributedDataParallel", "ShardedOptimizer", "Engine", "initialize", "measure", "fully_shard", "grade",
           "checkpoint", "Link", "TieredLink", "links", "check_replicas", "ReplicasDiverged", "apply_checkpointing",
           "remove_checkpointing", "parallelize_module", "pipeline"]
__version__ = "0.1.0"

#: names whose packages load on first use, so ``import zerokit`` stays light: the planner, the grader
#: (``zerokit.grade(notebook)`` grades an exercise); ``zerokit.course`` and ``zerokit.bench`` are imported by name
_LOADED_WHEN_USED = {"plan": ("zerokit.planner", "plan"), "grade": ("zerokit.grade", None)}


def __getattr__(name: str):
    if name not in _LOADED_WHEN_USED:
        raise AttributeError(f"module 'zerokit' has no attribute {name!r}")
    import importlib

    module, attribute = _LOADED_WHEN_USED[name]
    value = importlib.import_module(module)
    return value if attribute is None else getattr(value, attribute)
