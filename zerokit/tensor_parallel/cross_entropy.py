"""Cross-entropy on vocabulary-parallel logits, never gathered whole (Megatron-LM §3).

A column-parallel output head leaves rank i with the logits of its vocabulary range
[i·V/t, (i+1)·V/t). The loss needs three numbers per token from the whole vocabulary,
and each is one all-reduce of b·s elements instead of an all-gather of b·s·V:

1. the maximum logit (all-reduce MAX), subtracted for a stable exponential;
2. the target's logit (all-reduce SUM: only the rank whose range holds the target adds it);
3. the sum of exponentials (all-reduce SUM).

loss = log Σ exp(z − max) − (z_target − max). Backward needs no communication: the
gradient of a rank's logits is its slice of softmax(z) minus one at the target,
scaled by the loss's gradient.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..runtime import comm
from .mappings import group_rank, group_size


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of vocabulary-sharded logits (Megatron's ``_VocabParallelCrossEntropy``)."""

    @staticmethod
    def forward(ctx, logits, targets, group, tag):
        v_local = logits.shape[-1]
        start = group_rank(group) * v_local
        distributed = group_size(group) > 1

        logits_max = logits.max(dim=-1).values
        if distributed:
            comm.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group, tag=f"{tag}:max")
        shifted = logits - logits_max.unsqueeze(-1)

        in_range = (targets >= start) & (targets < start + v_local)
        local_targets = (targets - start).masked_fill(~in_range, 0)
        target_logit = shifted.gather(-1, local_targets.unsqueeze(-1)).squeeze(-1).masked_fill(~in_range, 0.0)
        if distributed:
            comm.all_reduce(target_logit, group=group, tag=f"{tag}:target_logit")

        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        if distributed:
            comm.all_reduce(sum_exp, group=group, tag=f"{tag}:sum_exp")

        loss = sum_exp.log() - target_logit
        exp.div_(sum_exp.unsqueeze(-1))  # now this rank's slice of the softmax
        ctx.save_for_backward(exp, local_targets, in_range)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_targets, in_range = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, local_targets.unsqueeze(-1), -in_range.unsqueeze(-1).to(grad.dtype))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor, group=None,
                                 reduction: str = "mean", ignore_index: int = -100,
                                 tag: str = "vocab_parallel_cross_entropy") -> torch.Tensor:
    """``F.cross_entropy`` of the whole logits, from this rank's vocabulary slice ``local_logits``
    (…, V/t) and ``targets`` (…) of global token ids; computed in fp32. ``reduction`` is "mean"
    (over the tokens not equal to ``ignore_index``), "sum" or "none"."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction={reduction!r}; allowed: 'mean', 'sum', 'none'")
    if local_logits.shape[:-1] != targets.shape:
        raise ValueError(f"vocab_parallel_cross_entropy: logits of shape {tuple(local_logits.shape)} need targets "
                         f"of shape {tuple(local_logits.shape[:-1])}, got {tuple(targets.shape)}")
    keep = targets != ignore_index
    loss = VocabParallelCrossEntropy.apply(local_logits.float(), targets.masked_fill(~keep, -1), group, tag)
    loss = loss.masked_fill(~keep, 0.0)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / keep.sum()
