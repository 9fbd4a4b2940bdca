"""The graded exercises, one module per mechanism, each defining ``EXERCISE`` (an :class:`~..core.Exercise`).

Lifecycle: :func:`get` imports an exercise's module the first time it is asked for, by its
number ("03") or its key ("03_bucketed_ddp"); the keys are the file names of
``solutions/`` and ``exercises/``.
"""
from __future__ import annotations

import importlib

#: key -> module, in course order
MODULES = {
    "01_ring_allreduce": "ring_allreduce",
    "02_naive_ddp": "naive_ddp",
    "03_bucketed_ddp": "bucketed_ddp",
    "04_zero1": "zero1",
    "05_zero2": "zero2",
    "06_zero3": "zero3",
    "07_megatron_mlp": "megatron_mlp",
    "08_one_f_one_b": "one_f_one_b",
    "09_predict": "predict",
    "10_sequence_parallel": "sequence_parallel",
    "11_cpu_offload": "cpu_offload",
    "12_checkpoint_policy": "checkpoint_policy",
    "13_zero3_prefetch": "zero3_prefetch",
    "14_interleaved_1f1b": "interleaved_1f1b",
    "15_ring_attention": "ring_attention",
    "16_moe_dispatch": "moe_dispatch",
    "17_quantized_allgather": "quantized_allgather",
}
KEYS = tuple(MODULES)


def get(key: str):
    """The :class:`~..core.Exercise` for ``key``: "01", "1" or "01_ring_allreduce"."""
    text = str(key).strip()
    if text.isdigit():
        text = f"{int(text):02d}"
    matches = [k for k in KEYS if k == text or k.startswith(text + "_") or k[:2] == text]
    if len(matches) != 1:
        raise ValueError(f"no exercise {key!r}; the exercises are {', '.join(KEYS)}")
    return importlib.import_module(f"{__name__}.{MODULES[matches[0]]}").EXERCISE
