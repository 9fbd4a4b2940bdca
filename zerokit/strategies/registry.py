"""The strategies by name: each mechanism's module registers its class; ``get(name)`` finds one.

Lifecycle: a strategy module calls :func:`register` on its class when it is imported;
:func:`get` and :func:`names` first import every module of :data:`MODULES` by name (once),
so a strategy is found whichever module defined it — a peer library's (``zerokit.peers``)
and the api's (``fully_shard``) too — without this package importing any of them: they
sit above it and import it.
"""
from __future__ import annotations

import importlib
from typing import Dict

#: modules that register strategies, in the order a learner meets them
MODULES = ["zerokit.strategies.single", "zerokit.peers.torch_ddp",
           "zerokit.data_parallel.naive", "zerokit.data_parallel.bucketed", "zerokit.data_parallel.overlap",
           "zerokit.zero.stage1", "zerokit.zero.stage2_naive", "zerokit.zero.stage2", "zerokit.zero.stage3",
           "zerokit.zero.zeropp", "zerokit.zero.hsdp",
           "zerokit.api.fully_shard_strategy",
           "zerokit.tensor_parallel.strategy",
           "zerokit.peers.torch_zero", "zerokit.peers.fsdp2", "zerokit.peers.deepspeed", "zerokit.peers.torch_tp",
           "zerokit.pipeline_parallel.strategy", "zerokit.peers.torch_pp",
           "zerokit.peers.torch_cp", "zerokit.peers.deepspeed_ulysses",
           "zerokit.peers.deepspeed_moe"]

_loaded = False


def load_all() -> None:
    global _loaded
    if _loaded:
        return
    for module in MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:  # a module that exists but fails to import is a real error
                raise
    _loaded = True


def names() -> list:
    """Registered strategies in the order their modules are listed."""
    load_all()
    return list(REGISTRY)


REGISTRY: Dict[str, type] = {}


def register(cls):
    REGISTRY[cls.name] = cls
    return cls


def get(name: str) -> type:
    load_all()
    if name not in REGISTRY:
        raise ValueError(f"strategy={name!r} is unknown; allowed: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]
