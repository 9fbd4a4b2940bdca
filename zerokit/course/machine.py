"""What this machine gives a lesson: the backend and device :func:`zerokit.launch` picks per world size.

Lesson 00 prints it first, so a reader knows whether the ranks that follow are GPUs on
NCCL or CPU processes on gloo. It runs no job; it only asks torch how many GPUs it sees.
"""
from __future__ import annotations

from typing import Sequence


def machine_summary(world_sizes: Sequence[int] = (1, 2, 4)) -> str:
    """Which backend and device :func:`zerokit.launch` gives each world size on this machine."""
    import torch

    gpus = torch.cuda.device_count()
    lines = [f"torch {torch.__version__.split('+')[0]}; CUDA devices visible: {gpus}"]
    for n in world_sizes:
        where = "NCCL, one GPU per rank" if gpus >= n else "gloo, CPU ranks"
        lines.append(f"  world_size={n}: {where}")
    if gpus == 1:
        lines.append("  one GPU: single-rank cells run on it; every multi-rank cell uses CPU ranks (gloo)")
    return "\n".join(lines)
