"""Gradient buckets: which parameters share a flat buffer, and the buffers themselves.

torch's DDP reducer does not all-reduce parameter by parameter: it packs gradients into
*buckets* of about ``bucket_cap_mb`` and reduces one bucket per call, so a model of
hundreds of tensors costs a handful of calls. Buckets are filled in *reverse*
registration order, because backward produces the last layer's gradients first; the
first bucket may get its own, smaller, limit (``first_bucket_mb``) so that the first
all-reduce starts early. A bucket closes as soon as it reaches its limit, so it can
exceed the limit by one tensor, exactly as ``torch.distributed._compute_bucket_assignment_by_size``
does. Bucket size changes the number of calls, never the bytes (FACTS §2).

Used by ``ddp-bucketed`` (gradients copied in and out), ``ddp`` (gradients *are* views
into the bucket, torch's ``gradient_as_bucket_view``) and reusable by ZeRO-2.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch

MIB = 2 ** 20


def bucket_bytes(mb: float) -> int:
    """MiB (as torch's ``bucket_cap_mb`` counts them) to bytes; ``inf``: one bucket for everything."""
    return sys.maxsize if math.isinf(mb) else int(mb * MIB)


def assign_buckets(params: Sequence[torch.Tensor], bucket_mb: float,
                   first_bucket_mb: Optional[float] = None) -> List[List[int]]:
    """Indices into ``params``, bucket by bucket, in reverse registration order.

    Each bucket takes tensors until its bytes reach the limit: ``first_bucket_mb`` for
    the first bucket (default: ``bucket_mb``), ``bucket_mb`` for the rest. Tensors of
    different dtypes or devices never share a bucket (a flat buffer has one of each).
    """
    limits = [bucket_bytes(first_bucket_mb if first_bucket_mb is not None else bucket_mb), bucket_bytes(bucket_mb)]
    buckets: List[List[int]] = []
    open_buckets: dict = {}  # (dtype, device) -> [indices, bytes]
    for i in reversed(range(len(params))):
        p = params[i]
        key = (p.dtype, p.device, getattr(p, "_zerokit_expert", False))  # experts reduce over their own group
        indices, size = open_buckets.get(key, ([], 0))
        indices.append(i)
        size += p.numel() * p.element_size()
        limit = limits[0] if not buckets else limits[1]
        if size >= limit:
            buckets.append(indices)
            open_buckets.pop(key, None)
        else:
            open_buckets[key] = (indices, size)
    buckets.extend(indices for indices, _ in open_buckets.values())
    return buckets


@dataclass
class Bucket:
    """One flat buffer and the parameters whose gradients live in it, in order."""

    index: int
    params: List[torch.nn.Parameter]
    buffer: torch.Tensor
    #: the slice of ``buffer`` that holds each parameter's gradient, shaped like it
    views: List[torch.Tensor] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


class GradBuckets:
    """Flat gradient buffers for ``params``, laid out by :func:`assign_buckets`.

    ``copy_in`` / ``copy_out`` move gradients between ``p.grad`` and the buckets
    (the ``ddp-bucketed`` way); ``attach_view`` makes ``p.grad`` a view into its bucket
    instead, so the gradient is copied at most once per step and autograd accumulates
    straight into the flat buffer that is reduced (torch's ``gradient_as_bucket_view=True``;
    the ``ddp`` way).
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], bucket_mb: float,
                 first_bucket_mb: Optional[float] = None):
        self.params = list(params)
        self.bucket_mb = bucket_mb
        self.first_bucket_mb = first_bucket_mb
        self.buckets: List[Bucket] = []
        #: parameter -> (bucket index, position in the bucket)
        self.where: dict = {}
        for b, indices in enumerate(assign_buckets(self.params, bucket_mb, first_bucket_mb)):
            members = [self.params[i] for i in indices]
            numel = sum(p.numel() for p in members)
            buffer = torch.zeros(numel, dtype=members[0].dtype, device=members[0].device)
            bucket = Bucket(b, members, buffer)
            offset = 0
            for j, p in enumerate(members):
                bucket.views.append(buffer[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
                self.where[p] = (b, j)
            self.buckets.append(bucket)

    def __len__(self) -> int:
        return len(self.buckets)

    def __iter__(self):
        return iter(self.buckets)

    @property
    def sizes(self) -> List[int]:
        """Elements per bucket, in reduction order."""
        return [b.buffer.numel() for b in self.buckets]

    def buffers(self) -> List[torch.Tensor]:
        return [b.buffer for b in self.buckets]

    @torch.no_grad()
    def copy_in(self, bucket: Bucket) -> None:
        """Copy each parameter's ``.grad`` into the bucket (zeros for a parameter without one)."""
        for p, view in zip(bucket.params, bucket.views):
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad)

    @torch.no_grad()
    def copy_out(self, bucket: Bucket) -> None:
        """Copy the (reduced) bucket back into each parameter's ``.grad``."""
        for p, view in zip(bucket.params, bucket.views):
            if p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)

    def view_of(self, p: torch.nn.Parameter) -> torch.Tensor:
        b, j = self.where[p]
        return self.buckets[b].views[j]

    @torch.no_grad()
    def attach_view(self, p: torch.nn.Parameter) -> None:
        """Make ``p.grad`` the view of its bucket slot, keeping what ``p.grad`` held (None: zeros)."""
        view = self.view_of(p)
        grad = p.grad
        if grad is None:
            view.zero_()
        elif grad.data_ptr() != view.data_ptr():
            view.copy_(grad)  # someone replaced p.grad (model.zero_grad(), say): bring it home
        else:
            return
        p.grad = view

    def attach_views(self) -> None:
        """Make every ``p.grad`` a view into its bucket."""
        for p in self.params:
            self.attach_view(p)

    @torch.no_grad()
    def zero_(self) -> None:
        for bucket in self.buckets:
            bucket.buffer.zero_()
