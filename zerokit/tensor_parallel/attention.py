"""Tensor-parallel ``nn.MultiheadAttention``: whole heads per rank (Megatron §3, the attention block).

torch's ``nn.MultiheadAttention`` packs q, k and v into one ``in_proj_weight`` and calls a
functional kernel that derives the head width from the whole embedding, so it cannot run on
a slice of its heads. The plan style ``"attention"`` replaces it, in place, with
:class:`TensorParallelMultiheadAttention`. Lifecycle of one forward, on each of the t ranks:

1. the packed q/k/v projection is a :class:`~.layers.ColumnParallelLinear` cut block by
   block (``Shard(0, 3)``): this rank's H/t heads of q, of k and of v (``f`` before it:
   identity forward, all-reduce of the input's gradient backward);
2. attention over those heads only (``scaled_dot_product_attention``), with the module's
   ``attn_mask``, ``key_padding_mask``, ``is_causal`` and dropout;
3. ``out_proj`` is a :class:`~.layers.RowParallelLinear` (``g`` after it: the partial
   products all-reduced, the bias added once).

``need_weights=True`` (the module's default) also returns the attention weights averaged
over the heads, as torch's does: each rank sums its heads' and the sum is all-reduced
over ``tp``. Self-attention only (``query``, ``key`` and ``value`` one tensor, as in a
language model); ``bias_k``/``bias_v``/``add_zero_attn`` and 3-D masks are refused.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import mappings
from .layers import ColumnParallelLinear, RowParallelLinear
from .mappings import group_size


class TensorParallelMultiheadAttention(nn.Module):
    """``nn.MultiheadAttention`` over this rank's heads (see the module docstring)."""

    def __init__(self, mha: nn.MultiheadAttention, group=None, memo: Optional[dict] = None, tag: str = "attention"):
        super().__init__()
        tp = group_size(group)
        if mha.bias_k is not None or mha.add_zero_attn or not mha._qkv_same_embed_dim:
            raise ValueError(f"{tag} (attention): tensor parallelism of nn.MultiheadAttention with bias_k/bias_v, "
                             f"add_zero_attn or kdim/vdim other than embed_dim is not implemented")
        if mha.num_heads % tp:
            raise ValueError(f"{tag} (attention): num_heads={mha.num_heads}, which tp={tp} does not divide")
        packed = nn.Linear(mha.embed_dim, 3 * mha.embed_dim, bias=mha.in_proj_bias is not None)
        packed.weight, packed.bias = mha.in_proj_weight, mha.in_proj_bias
        self.qkv = ColumnParallelLinear.from_linear(packed, group, blocks=3, memo=memo, tag=f"{tag}.qkv")
        self.out_proj = RowParallelLinear.from_linear(mha.out_proj, group, memo=memo, tag=f"{tag}.out_proj")
        self.group, self.tag = group, tag
        self.embed_dim, self.num_heads, self.local_heads = mha.embed_dim, mha.num_heads, mha.num_heads // tp
        self.head_dim, self.dropout, self.batch_first = mha.head_dim, mha.dropout, mha.batch_first

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True, attn_mask=None,
                average_attn_weights: bool = True, is_causal: bool = False):
        if not (query is key and key is value):
            raise ValueError(f"{self.tag}: tensor-parallel nn.MultiheadAttention runs self-attention only "
                             f"(query, key and value one tensor)")
        if need_weights and not average_attn_weights:
            raise ValueError(f"{self.tag}: average_attn_weights=False (per-head weights) is not implemented under "
                             f"tensor parallelism; pass need_weights=False or average the heads")
        x = query if self.batch_first else query.transpose(0, 1)  # (N, L, E)
        n, length, _ = x.shape
        q, k, v = self.qkv(x).view(n, length, 3, self.local_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        mask = _additive_mask(attn_mask, key_padding_mask, length, q.dtype, is_causal)
        dropout = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                             is_causal=is_causal and mask is None)
        out = self.out_proj(out.transpose(1, 2).reshape(n, length, self.local_heads * self.head_dim))
        out = out if self.batch_first else out.transpose(0, 1)
        if not need_weights:
            return out, None
        scores = q @ k.transpose(-2, -1) / self.head_dim ** 0.5
        if mask is not None:
            scores = scores + mask
        elif is_causal:
            scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1),
                                        float("-inf"))
        weights = mappings.reduce_from_tensor_parallel_region(scores.softmax(-1).sum(1), self.group,
                                                              f"{self.tag}:weights") / self.num_heads
        return out, weights


def _additive_mask(attn_mask, key_padding_mask, length: int, dtype, is_causal: bool):
    """torch's masks (bool: True = masked out; float: added) as one float mask broadcast over (N, heads, L, S)."""
    mask = None
    if attn_mask is not None:
        if attn_mask.dim() != 2:
            raise ValueError("tensor-parallel nn.MultiheadAttention takes a 2-D attn_mask (L, S) only")
        mask = torch.zeros_like(attn_mask, dtype=dtype).masked_fill(attn_mask, float("-inf")) \
            if attn_mask.dtype == torch.bool else attn_mask.to(dtype)
    if key_padding_mask is not None:
        pad = torch.zeros_like(key_padding_mask, dtype=dtype).masked_fill(key_padding_mask, float("-inf")) \
            if key_padding_mask.dtype == torch.bool else key_padding_mask.to(dtype)
        pad = pad[:, None, None, :]
        mask = pad if mask is None else mask + pad
    if mask is not None and is_causal:
        causal = torch.ones(length, length, dtype=torch.bool, device=mask.device).triu(1)
        mask = mask.masked_fill(causal, float("-inf"))
    return mask
