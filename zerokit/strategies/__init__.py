"""Training strategies, one mechanism per module; ``get(name)`` finds one by name."""
from __future__ import annotations

import importlib

from .base import REGISTRY, Option, Strategy, TrainConfig, get, register  # noqa: F401 - the package's API

#: modules that register strategies, in the order a learner meets them
MODULES = ["single", "peers", "ddp_naive", "ddp_bucketed", "ddp_overlap",
           "zero1", "zero2_naive", "zero2", "zero3", "peers_sharded"]

_loaded = False


def load_all() -> None:
    global _loaded
    if _loaded:
        return
    for module in MODULES:
        name = f"{__name__}.{module}"
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # a module that exists but fails to import is a real error
                raise
    _loaded = True


def names() -> list:
    """Registered strategies in the order their modules are listed."""
    load_all()
    return list(REGISTRY)
