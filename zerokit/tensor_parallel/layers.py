"""Column- and row-parallel linear layers and the vocabulary-parallel embedding (Megatron-LM §3).

A column-parallel layer splits A of Y = XA by columns: rank i computes Y_i = X A_i
from the whole input (``f`` before it), and its output stays split along the features.
A row-parallel layer splits the next matrix B by rows: rank i computes Y_i B_i from
its slice, and ``g`` sums the partial products; its bias is kept whole and added once,
after the reduction. An MLP is column then row (one ``f``, one ``g``); attention is the
packed q/k/v projection column-parallel by whole heads, then the output projection
row-parallel. The embedding splits the vocabulary's rows: each rank looks up the tokens
in its range, writes zeros for the others, and ``g`` sums.

Lifecycle: build each layer *from the unsharded module* (``from_linear`` /
``from_embedding``), which copies this rank's slice of its weights, so the sharded model
starts from exactly the unsharded model's initialisation; the unsharded module can then
be dropped. With ``sequence_parallel`` (Korthikanti §4.2.2) the input of a
column-parallel layer and the output of a row-parallel one are sharded along the
sequence: ``g`` (all-gather) and ``ḡ`` (reduce-scatter) replace ``f`` and ``g``.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import mappings
from .mappings import SEQUENCE_DIM, group_rank, group_size
from .sharding import Shard, mark_sequence_parallel, shard_parameter


class SequenceParallelColumnLinear(torch.autograd.Function):
    """Sequence-parallel ``g`` fused with a column-parallel matmul that keeps only the
    sequence shard of its input for backward and all-gathers it again there (as Megatron
    does), so the layer's saved input is 1/t of the sequence (Korthikanti §4.2.2, the
    activation memory of 34/t). Costs one more all-gather per layer in backward."""

    @staticmethod
    def forward(ctx, x_local, weight, bias, group, tag):
        ctx.group, ctx.tag, ctx.has_bias = group, tag, bias is not None
        ctx.save_for_backward(x_local, weight)
        return F.linear(mappings.all_gather_along(x_local, SEQUENCE_DIM, group, tag), weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x_local, weight = ctx.saved_tensors
        x_full = mappings.all_gather_along(x_local, SEQUENCE_DIM, ctx.group, ctx.tag + ":regather")
        grad_x = mappings.reduce_scatter_along(grad_out.matmul(weight), SEQUENCE_DIM, ctx.group, ctx.tag)
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        grad_w = g2.t().matmul(x_full.reshape(-1, x_full.shape[-1]))
        grad_b = g2.sum(0) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None, None


def _check_linear(linear, who: str) -> None:
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"{who}.from_linear: expected an nn.Linear, got {type(linear).__name__}")


class ColumnParallelLinear(nn.Module):
    """Y_i = X A_i: the weight's output rows split over ``tp``; the output stays split along
    the features unless ``gather_output``. ``blocks`` > 1 splits a packed projection (q, k, v)
    block by block, so each rank gets whole heads of every block."""

    def __init__(self, weight: nn.Parameter, bias: Optional[nn.Parameter], group=None,
                 sequence_parallel: bool = False, gather_output: bool = False, keep_input_sharded: bool = False,
                 tag: str = "column"):
        super().__init__()
        shard = getattr(weight, "tp_shard", None)
        if gather_output and shard is not None and shard.blocks > 1:
            raise ValueError(f"{tag}: gather_output=True would interleave the {shard.blocks} packed blocks; "
                             f"a packed (q/k/v) projection keeps its output split")
        self.weight = weight
        self.bias = bias
        self.group, self.tag = group, tag
        self.sequence_parallel, self.gather_output = sequence_parallel, gather_output
        self.keep_input_sharded = keep_input_sharded
        self.out_features, self.in_features = weight.shape

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, sequence_parallel: bool = False, gather_output: bool = False,
                    blocks: int = 1, keep_input_sharded: bool = False, memo: Optional[dict] = None,
                    tag: str = "column") -> "ColumnParallelLinear":
        """This rank's columns of ``linear`` (its output rows, block by block when ``blocks`` > 1)."""
        _check_linear(linear, cls.__name__)
        shard = Shard(0, blocks)
        weight = shard_parameter(linear.weight, shard, group, memo, f"{tag}.weight")
        bias = None if linear.bias is None else shard_parameter(linear.bias, shard, group, memo, f"{tag}.bias")
        return cls(weight, bias, group, sequence_parallel, gather_output, keep_input_sharded, tag)

    def forward(self, x):
        if self.sequence_parallel and self.keep_input_sharded and group_size(self.group) > 1:
            y = SequenceParallelColumnLinear.apply(x, self.weight, self.bias, self.group, f"{self.tag}:g")
        else:
            if self.sequence_parallel:
                x = mappings.gather_from_sequence_parallel_region(x, self.group, f"{self.tag}:g")
            else:
                x = mappings.copy_to_tensor_parallel_region(x, self.group, f"{self.tag}:f")
            y = F.linear(x, self.weight, self.bias)
        if self.gather_output:
            y = mappings.gather_from_tensor_parallel_region(y, self.group, f"{self.tag}:gather_output")
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} (of "
                f"{self.out_features * group_size(self.group)}), bias={self.bias is not None}, "
                f"sequence_parallel={self.sequence_parallel}, gather_output={self.gather_output}")


class RowParallelLinear(nn.Module):
    """Y = Σ_i X_i B_i: the weight's input columns split over ``tp``; the input is the
    column-parallel layer's split output, the partial products are summed by ``g`` (or
    reduce-scattered along the sequence by ``ḡ``), and the whole bias is added after."""

    def __init__(self, weight: nn.Parameter, bias: Optional[nn.Parameter], group=None,
                 sequence_parallel: bool = False, tag: str = "row"):
        super().__init__()
        self.weight, self.bias = weight, bias
        self.group, self.tag, self.sequence_parallel = group, tag, sequence_parallel
        self.out_features, self.in_features = weight.shape
        if sequence_parallel and bias is not None:
            mark_sequence_parallel(bias)  # added to a sequence shard: its gradient is partial

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, sequence_parallel: bool = False,
                    memo: Optional[dict] = None, tag: str = "row") -> "RowParallelLinear":
        """This rank's rows of ``linear`` (its input columns); the bias stays whole."""
        _check_linear(linear, cls.__name__)
        weight = shard_parameter(linear.weight, Shard(1), group, memo, f"{tag}.weight")
        bias = None
        if linear.bias is not None:
            bias = memo.get(id(linear.bias)) if memo is not None else None
            if bias is None:
                bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=linear.bias.requires_grad)
                if memo is not None:
                    memo[id(linear.bias)] = bias
        return cls(weight, bias, group, sequence_parallel, tag)

    def forward(self, x):
        y = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = mappings.reduce_scatter_to_sequence_parallel_region(y, self.group, f"{self.tag}:g_bar")
        else:
            y = mappings.reduce_from_tensor_parallel_region(y, self.group, f"{self.tag}:g")
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (of {self.in_features * group_size(self.group)}), "
                f"out_features={self.out_features}, bias={self.bias is not None}, "
                f"sequence_parallel={self.sequence_parallel}")


class VocabParallelEmbedding(nn.Module):
    """The embedding's rows split by vocabulary range: rank i holds tokens
    [i·V/t, (i+1)·V/t), looks up those, writes zeros for the rest, and ``g`` sums
    (with ``sequence_parallel``, ``ḡ`` sums and leaves the output sharded along the sequence)."""

    def __init__(self, weight: nn.Parameter, group=None, sequence_parallel: bool = False, tag: str = "embedding"):
        super().__init__()
        self.weight = weight
        self.group, self.tag, self.sequence_parallel = group, tag, sequence_parallel
        self.num_embeddings, self.embedding_dim = weight.shape
        self.vocab_start = group_rank(group) * self.num_embeddings

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, group=None, sequence_parallel: bool = False,
                       memo: Optional[dict] = None, tag: str = "embedding") -> "VocabParallelEmbedding":
        """This rank's vocabulary range of ``embedding``'s rows."""
        if not isinstance(embedding, nn.Embedding):
            raise TypeError(f"{cls.__name__}.from_embedding: expected an nn.Embedding, got {type(embedding).__name__}")
        extras = {k: getattr(embedding, k) for k in ("padding_idx", "max_norm", "sparse")
                  if getattr(embedding, k) not in (None, False)}
        if extras or embedding.scale_grad_by_freq:
            raise ValueError(f"{tag}: VocabParallelEmbedding supports a plain nn.Embedding only; this one sets "
                             f"{extras or {'scale_grad_by_freq': True}}")
        weight = shard_parameter(embedding.weight, Shard(0), group, memo, f"{tag}.weight")
        return cls(weight, group, sequence_parallel, tag)

    def forward(self, idx):
        outside = (idx < self.vocab_start) | (idx >= self.vocab_start + self.num_embeddings)
        local = (idx - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return mappings.reduce_scatter_to_sequence_parallel_region(out, self.group, f"{self.tag}:g_bar")
        return mappings.reduce_from_tensor_parallel_region(out, self.group, f"{self.tag}:g")

    def extra_repr(self) -> str:
        return (f"vocabulary [{self.vocab_start}, {self.vocab_start + self.num_embeddings}) of "
                f"{self.num_embeddings * group_size(self.group)}, embedding_dim={self.embedding_dim}, "
                f"sequence_parallel={self.sequence_parallel}")
