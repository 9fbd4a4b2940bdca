"""The two ways of counting model states the planner offers, and how they differ.

``paper`` is the ZeRO paper's (arXiv 1910.02054 §3.1, §5): 16-bit params and grads and
K = 12 bytes of fp32 optimizer state per parameter, 16Ψ for DDP, sharded stage by stage
(:func:`zerokit.theory.model_state_bytes`, which also counts the padding of each flat
unit to a multiple of N and Adam's per-tensor ``step`` scalars when the tensors are
known), in decimal GB. ``deepspeed`` is what DeepSpeed's estimators compute
(:func:`zerokit.theory.deepspeed_model_state_bytes`): 18 bytes per sharded parameter
because its mixed-precision optimizer keeps an fp32 copy of the gradients, a 1.5 buffer
factor on host memory, 4 × the largest layer on top for ZeRO-3, in GiB.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Convention:
    name: str
    unit_bytes: int
    unit_name: str
    summary: str

    def value(self, nbytes: float) -> float:
        return nbytes / self.unit_bytes

    def text(self, nbytes: float) -> str:
        """Bytes in the convention's unit, three significant figures (1.88 GB, 31.4 GB, 120 GB)."""
        v = self.value(nbytes)
        if v == 0:
            return f"0 {self.unit_name}"
        return f"{v:.3g} {self.unit_name}" if abs(v) < 1000 else f"{v:,.0f} {self.unit_name}"


PAPER = Convention("paper", 10**9, "GB",
                   "ZeRO paper: 2Ψ params + 2Ψ grads + KΨ optimizer states (K = 12 with Adam), decimal GB")
DEEPSPEED = Convention("deepspeed", 2**30, "GiB",
                       "DeepSpeed's estimators: 2Ψ params + 18Ψ sharded (16-bit and fp32 grads, fp32 params, m, "
                       "v), + 4 × largest layer at ZeRO-3, host × 1.5, GiB")
CONVENTIONS = {c.name: c for c in (PAPER, DEEPSPEED)}

DIFFERENCE = (
    "paper vs deepspeed: the paper counts 2 + 2 + 12 = 16 bytes per parameter; DeepSpeed's estimators count "
    "2 (16-bit params) + 18 (16-bit and fp32 gradients, fp32 params, Adam's m and v), because its "
    "mixed-precision optimizer keeps an fp32 copy of the gradients; ZeRO-3 adds 4 × the largest layer for the "
    "parameters gathered around it; host memory is multiplied by a 1.5 buffer factor; figures are GiB (2^30), "
    "not GB (10^9). DeepSpeed has no ZeRO-1 or DDP estimator (zerokit extends its convention) and neither "
    "convention's model states include activations or buffers: the planner adds both, the same in each.")


def convention(name: str) -> Convention:
    if name not in CONVENTIONS:
        raise ValueError(f"convention={name!r}; allowed: {', '.join(CONVENTIONS)}")
    return CONVENTIONS[name]
