"""Training strategies, one mechanism per module; ``get(name)`` finds one by name."""
from __future__ import annotations

from .base import Option, Strategy, TrainConfig  # noqa: F401 - the package's API
from .registry import MODULES, REGISTRY, get, load_all, names, register  # noqa: F401

