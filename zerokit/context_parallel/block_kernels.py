"""One block of ring attention: a block of queries over one block of keys and values, with its log-sum-exp.

Ring attention (:mod:`.ring_attention`) computes, at each ring step, this rank's queries (or the
part of them that sees any of the visiting keys) against the visiting key/value block (or the
part of it any of those queries sees), and merges the result by log-sum-exp. What it needs of a
block, forward: the normalised output o_b and the log-sum-exp ℓ_b of each query's scores;
backward, given the *merged* output O and log-sum-exp ℓ of the whole call: the block's share of
dQ and its dK, dV (P = exp(S − ℓ) is then the block's columns of the whole softmax, so the
shares add up). Two kernels compute it, one interface:

- :data:`EXPLICIT` — the math lesson 15 and exercise 15 teach, in fp32 whatever the input's
  dtype: S = q·kᵀ·scale, masked; ℓ_b = logsumexp(S), o_b = exp(S − ℓ_b)·v; backward
  P = exp(S − ℓ), dV = Pᵀ·dO, dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O)), dQ = dS·K·scale,
  dK = dSᵀ·Q·scale. The whole score matrix of the block is materialised.
- :class:`Fused` — torch's scaled-dot-product kernels that return the log-sum-exp, the ones
  torch's own ring attention (``torch.distributed.tensor.experimental``'s ``context_parallel``)
  calls per block: on the CPU ``aten._scaled_dot_product_flash_attention_for_cpu`` and its
  ``_backward``; on CUDA ``aten._scaled_dot_product_flash_attention`` (fp16/bf16 on the GPUs
  FlashAttention-2 runs on) or else ``aten._scaled_dot_product_efficient_attention`` (fp32 too),
  each with its backward. Tiled, never materialising the scores; in the input's dtype with fp32
  accumulation and an fp32 log-sum-exp; the output in the input's dtype (the CPU kernel's laid out
  tokens-first, ``[b, len, h, d]`` in memory, as one process's SDPA returns it).

Masks a block takes: ``None`` (every key visible to every query), :data:`CAUSAL` (a square block
whose query and key positions are the same: key j visible to query i iff j ≤ i, the kernels'
``is_causal``) or a boolean matrix, True where hidden — the last only :data:`EXPLICIT` computes.

:func:`choose` picks the kernel for a call's inputs (``kernel="auto"``): :class:`Fused` where torch
has a fused kernel for them (CPU: where ``torch._fused_sdp_choice`` picks flash; CUDA: where
``torch.backends.cuda.can_use_flash_attention`` or ``can_use_efficient_attention`` accepts them),
:data:`EXPLICIT` otherwise (another device, q, k, v of different dtypes, a dtype or head size the
kernels refuse). zerokit's choices: torch's ring takes whichever kernel SDPA dispatched to, cuDNN's
included, and refuses the others; zerokit takes flash, else memory-efficient, else the explicit
math. No dropout inside attention (the ring has none to give).
"""
from __future__ import annotations

from typing import Optional

import torch

#: the mask of a square block whose queries and keys have the same positions: key j visible to query i iff j ≤ i
CAUSAL = "causal"


def _dense_mask(mask, q_len: int, k_len: int, device) -> Optional[torch.Tensor]:
    if mask is None or isinstance(mask, torch.Tensor):
        return mask
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).triu_(1)


class Explicit:
    """The block's scores materialised and masked, softmax and its gradient written out, in fp32."""

    name = "explicit"

    def supports(self, mask) -> bool:
        return True

    def forward(self, q, k, v, scale: float, mask):
        """(o_b fp32, ℓ_b fp32, state for backward) of queries ``q`` over keys ``k``, values ``v``
        (``[b, h, len, d]``)."""
        s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
        dense = _dense_mask(mask, q.shape[-2], k.shape[-2], q.device)
        if dense is not None:
            s = s.masked_fill(dense, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.masked_fill(torch.isinf(lse), 0.0)[..., None])  # a row with no visible key: −∞ − 0
        return torch.matmul(p, v.float()), lse, None

    def backward(self, dout, q, k, v, out, lse, scale: float, mask, state):
        """(dq, dk, dv), fp32: the block's share of dQ and its dK, dV, given the merged output ``out`` and
        log-sum-exp ``lse`` of these queries over every block."""
        qf, kf, vf, dout = q.float(), k.float(), v.float(), dout.float()
        s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
        dense = _dense_mask(mask, q.shape[-2], k.shape[-2], q.device)
        if dense is not None:
            s = s.masked_fill(dense, float("-inf"))
        p = torch.exp(s - lse[..., None])
        delta = (dout * out.float()).sum(-1, keepdim=True)
        ds = p * (torch.matmul(dout, vf.transpose(-1, -2)) - delta)
        return (torch.matmul(ds, kf) * scale, torch.matmul(ds.transpose(-1, -2), qf) * scale,
                torch.matmul(p.transpose(-1, -2), dout))


def fused_op(q, k, v) -> Optional[str]:
    """The fused kernel torch has for these inputs on their device ("cpu-flash", "flash", "efficient"), or None."""
    if q.dtype != k.dtype or k.dtype != v.dtype or q.device != k.device or k.device != v.device:
        return None
    if q.device.type == "cpu":
        from torch.nn.attention import SDPBackend
        return "cpu-flash" if torch._fused_sdp_choice(q, k, v, None, 0.0, True) == int(SDPBackend.FLASH_ATTENTION) \
            else None
    if q.device.type == "cuda":
        params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, True, False)
        if torch.backends.cuda.can_use_flash_attention(params):
            return "flash"
        if torch.backends.cuda.can_use_efficient_attention(params):
            return "efficient"
    return None


class Fused:
    """torch's fused attention kernel ``op`` (:func:`fused_op`), in the dtype of the queries."""

    name = "fused"

    def __init__(self, op: str):
        self.op = op

    def supports(self, mask) -> bool:
        return not isinstance(mask, torch.Tensor)

    def forward(self, q, k, v, scale: float, mask):
        """(o_b in q's dtype, ℓ_b fp32, state for backward)."""
        causal, aten = mask is CAUSAL, torch.ops.aten
        k, v = k.to(q.dtype), v.to(q.dtype)
        if self.op == "cpu-flash":
            out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
            return out, lse.float(), None
        if self.op == "flash":
            out, lse, cum_q, cum_k, _, _, seed, offset, _ = aten._scaled_dot_product_flash_attention(
                q, k, v, 0.0, causal, False, scale=scale)
            return out, lse, (cum_q, cum_k, seed, offset)
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal,
                                                                              scale=scale)
        return out, lse[..., :q.shape[-2]], (seed, offset)  # the kernel pads ℓ's rows to a multiple of 32

    def backward(self, dout, q, k, v, out, lse, scale: float, mask, state):
        """(dq, dk, dv) in q's dtype; ``state``: what :meth:`forward` returned for a block of this call (dropout's
        random state, unused at dropout 0)."""
        causal, aten, dtype = mask is CAUSAL, torch.ops.aten, q.dtype
        dout, k, v, out, lse = dout.to(dtype), k.to(dtype), v.to(dtype), out.to(dtype), lse.contiguous()
        if self.op == "cpu-flash":
            return aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal,
                                                                             scale=scale)
        if self.op == "flash":
            cum_q, cum_k, seed, offset = state
            return aten._scaled_dot_product_flash_attention_backward(dout, q, k, v, out, lse, cum_q, cum_k,
                                                                     q.shape[-2], k.shape[-2], 0.0, causal, seed,
                                                                     offset, scale=scale)
        seed, offset = state
        padded = torch.nn.functional.pad(lse, (0, -q.shape[-2] % 32))  # the row layout its forward gave
        return aten._scaled_dot_product_efficient_attention_backward(dout, q, k, v, None, out, padded, seed, offset,
                                                                     0.0, [True, True, True, False], causal,
                                                                     scale=scale)[:3]


EXPLICIT = Explicit()

#: what ``kernel=`` may name: "auto" (fused where torch has a kernel for the inputs, else explicit), "fused" (refused
#: where it has none), "explicit"
KERNELS = ("auto", "fused", "explicit")


def choose(kernel: str, q, k, v):
    """The block kernel for a call's local ``q``, ``k``, ``v`` under the setting ``kernel`` (:data:`KERNELS`)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r}; allowed: {', '.join(map(repr, KERNELS))}")
    op = None if kernel == "explicit" else fused_op(q, k, v)
    if op is None and kernel == "fused":
        raise ValueError(f"kernel='fused': torch has no fused attention kernel returning the log-sum-exp for "
                         f"{q.dtype} q, {k.dtype} k, {v.dtype} v of head size {q.shape[-1]} on {q.device} "
                         f"(use kernel='explicit' or 'auto')")
    return EXPLICIT if op is None else Fused(op)
