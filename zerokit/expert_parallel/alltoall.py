"""The uneven all-to-all that moves tokens to their experts and back, differentiable.

A router sends a different number of tokens to each expert, so each rank sends each peer
a different number of rows. :func:`counts_exchange` all-to-alls the counts (one integer per
peer, kept on the device), then :func:`exchange` the rows, given both split sizes on the
host; its gradient is the same exchange run backwards — the receive counts become the send
counts — so autograd carries each token's gradient back to the rank it came from. The ledger records each exchange's payload (its input) and the bytes that
leave the rank (the rows sent to other ranks).
"""
from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist

from ..runtime import comm


def counts_exchange(send_counts: torch.Tensor, group) -> torch.Tensor:
    """How many rows each peer will send this rank (int64, on the device), given how many this rank sends each
    peer (``send_counts``, int64 on the device): the counts stay on the device, so the caller reads them on the
    host once, with its own (:meth:`~.moe.MoEMLP._experts`: one sync for both split sizes)."""
    n = dist.get_world_size(group)
    theirs = torch.empty(n, dtype=torch.int64, device=send_counts.device)
    comm.all_to_all_single(theirs, send_counts.contiguous(), group=group, tag="moe counts")
    return theirs


def _rows(x: torch.Tensor, send: List[int], recv: List[int], group, tag: str) -> torch.Tensor:
    out = x.new_empty((sum(recv), *x.shape[1:]))
    comm.all_to_all_single(out, x.contiguous(), group=group, tag=tag, output_split_sizes=recv, input_split_sizes=send)
    return out


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send, recv, group, tag):
        ctx.send, ctx.recv, ctx.group, ctx.tag = send, recv, group, tag
        return _rows(x, send, recv, group, tag)

    @staticmethod
    def backward(ctx, grad):
        return _rows(grad.contiguous(), ctx.recv, ctx.send, ctx.group, f"{ctx.tag} grad"), None, None, None, None


def exchange(x: torch.Tensor, send_counts: List[int], recv_counts: List[int], group, tag: str) -> torch.Tensor:
    """Rows of ``x`` (grouped by destination, ``send_counts[j]`` for peer j) to their peers; returns the rows this
    rank receives, grouped by source (``recv_counts``)."""
    return _Exchange.apply(x, list(send_counts), list(recv_counts), group, tag)
