"""The runs a finished ``zerokit tour`` keeps, so ``make test`` reads them back instead of running them again.

Lifecycle: ``zerokit tour`` ends with :func:`keep_results`, which pickles its ``[(row, result), …]``
(a :class:`~zerokit.tour.TourRun`, with every line the tour printed) under :func:`code_key` — a digest of zerokit's sources, torch's version, whether DeepSpeed is
installed, the world sizes and the steps — in ``.zerokit/tour-results.pkl``; tests/app/test_tour.py
calls :func:`kept_results`, which returns them only for exactly that key (None otherwise: the
test runs the tour itself).
"""
from __future__ import annotations

from pathlib import Path

from .tour import _have

#: where a finished tour keeps its results, keyed by the code that made them (tests/app/test_tour.py reads them back)
RESULTS_FILE = Path(__file__).resolve().parents[1] / ".zerokit" / "tour-results.pkl"


def code_key(world_sizes, steps: int) -> str:
    """A digest of everything that decides the tour's results: zerokit's source files, torch's version, whether
    DeepSpeed is installed, the world sizes and the steps."""
    import hashlib

    import torch

    digest = hashlib.sha256(f"{torch.__version__} {_have('deepspeed-zero1')} {list(world_sizes)} {steps}".encode())
    for path in sorted(Path(__file__).resolve().parent.rglob("*.py")):
        digest.update(path.as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def keep_results(results: list, world_sizes, steps: int) -> None:
    """Write the results under :func:`code_key`, so a test of this same code reads the runs instead of redoing them."""
    import pickle

    try:
        RESULTS_FILE.parent.mkdir(exist_ok=True)
        RESULTS_FILE.write_bytes(pickle.dumps({"key": code_key(world_sizes, steps), "results": results}))
    except (OSError, pickle.PicklingError):  # a read-only checkout: nothing is kept, nothing breaks
        pass


def kept_results(world_sizes, steps: int):
    """The results a tour of exactly this code kept (None when there are none, or the code has changed since)."""
    import pickle

    try:
        kept = pickle.loads(RESULTS_FILE.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None
    return kept["results"] if kept.get("key") == code_key(world_sizes, steps) else None
