"""How far a parallel run's parameters may lie from one process's, by the arithmetic of the optimizer step.

A parallel run computes the same sums as one process in another order (a reduction over ranks, attention over
chunks of the sequence, a matmul split by columns): each gradient element differs from the single process's
by rounding. What that does to the parameters depends on the step:

- **SGD**, ``p ← p − lr·g``, is linear in ``g``: a rounding-level gradient difference ``δg`` moves ``p`` by
  ``lr·δg``, orders of magnitude below the rounding of ``p`` itself (``lr = 1e-3`` times a relative ``2⁻²⁴``
  of a gradient). What remains is the rounding of each step's subtraction: the two runs' results may round
  to neighbouring floats, one unit in the last place (ulp) apart, and the next step may add one more. After
  ``s`` steps: ``|Δp| ≤ 2·s·ulp(max |p|)`` (:func:`sgd_parity_bound`). A reduction left out or a gradient
  scaled wrong moves ``p`` by ``lr·|g|``, far above it.
- **Adam(W)**, ``p ← p − lr·m̂/(√v̂ + ε)``, divides by the gradient's own size: at step 1 the update is
  ``lr·g/(|g| + ε)``, whose slope ``lr·ε/(|g| + ε)²`` reaches ``lr/(4ε)`` at ``|g| = ε``. An element whose
  gradient lies within a few ε of zero (an expert that received few tokens; sums that cancel) turns a
  rounding-level ``δg`` into an update change of any size up to ``2·lr``. So no bound tighter than
  ``2·lr`` per step (:func:`adam_parity_ceiling`) follows from the arithmetic: parity under Adam is held on
  the losses (a mean over tokens, well conditioned), and the parameters' parity on an SGD run of the same
  layout. zerokit's choice; DeepSpeed's and torch's own parity tests compare losses, or use SGD, for the
  same reason.
"""
from __future__ import annotations

import math
from typing import Dict

import torch


def ulp(x: float, dtype: torch.dtype = torch.float32) -> float:
    """One unit in the last place of ``x`` in ``dtype`` (the gap to the next float of larger magnitude)."""
    if x == 0:
        return torch.finfo(dtype).tiny
    mantissa_bits = {torch.float32: 23, torch.float64: 52, torch.bfloat16: 7, torch.float16: 10}[dtype]
    return 2.0 ** (math.floor(math.log2(abs(x))) - mantissa_bits)


def sgd_parity_bound(reference: Dict[str, torch.Tensor], steps: int) -> float:
    """The largest parameter difference from one process that ``steps`` plain SGD steps of another reduction
    order allow: two ulps of the largest parameter per step (see the module docstring)."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be an integer >= 1")
    largest = max(float(t.detach().abs().max()) for t in reference.values() if t.numel())
    dtype = next(iter(reference.values())).dtype
    return 2 * steps * ulp(largest, dtype)


def adam_parity_ceiling(lr: float, steps: int) -> float:
    """The most Adam(W)'s normalised steps can differ by, whatever the gradients: ``2·lr`` per step."""
    return 2 * lr * steps
