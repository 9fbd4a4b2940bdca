"""``ddp-naive``: data parallelism in its plainest form, and what every DDP variant shares.

Every rank holds the whole model and trains on its share of the global batch. After
backward each rank's gradients are averaged over the N ranks — here one all-reduce
per parameter tensor — so every rank takes the same optimizer step and the replicas
stay identical (ZeRO §2.1, "data parallelism"). A rank sends 2(N−1)/N·Ψb bytes per
step under the ring algorithm, whatever the number of calls (FACTS §2).

Averaging divides each gradient by N *before* the sum, as torch's DDP does.

What the variants share lives in :class:`DataParallel` (:mod:`.base`; registered here as ``ddp-naive``):

- the start check: every rank's parameters are checksummed (float64) and all-gathered
  in phase "setup"; ranks whose models differ fail with a clear ``ValueError``;
- ``no_sync``: gradient accumulation over micro-batches without communication, so a
  step reduces once however many micro-batches it has;
- unused parameters: a parameter that requires grad but got no gradient in a step is an
  error naming it (default), or, with ``find_unused_parameters=True``, its gradient
  counts as zeros and is reduced like any other, so every rank issues the same
  collectives and none waits for a peer that never comes. A parameter that *no* rank
  used is then stepped with a zero gradient (Adam's moments from earlier steps still
  move it); torch DDP all-reduces a usage bitmap to leave such a parameter alone, and
  the single-process reference skips it. Parameters with
  ``requires_grad=False`` take no part: they are never reduced nor stepped (they are
  still checksummed at start, so they must agree);
- ``algorithm="ring"``: the all-reduce runs on :func:`zerokit.ring.ring_all_reduce`
  (reduce-scatter + all-gather on send/recv, 2(N−1) rounds) instead of the backend's.
"""
from __future__ import annotations

from ..strategies.base import register
from .base import DataParallel

register(DataParallel)
