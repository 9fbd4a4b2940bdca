"""Context parallelism: the sequence cut over the ``cp`` ranks, attention by a ring or by an all-to-all.

- :mod:`.layout`: which tokens each rank holds (zig-zag chunks, for a balanced causal mask);
- :mod:`.ring_attention`: key/value blocks around the ring, online softmax (Liu et al.);
- :mod:`.ulysses`: all-to-all from sequence-sharded to head-sharded and back (DeepSpeed-Ulysses);
- :mod:`.apply`: a model set up for it (positions, attention cores), inside ``zerokit.train``.

Everything else in a transformer block works token by token, so it runs on the local
tokens unchanged; only attention needs the other ranks' keys.
"""
from __future__ import annotations

from . import layout
from .apply import ATTENTION, apply_context_parallel, check_attention
from .ring_attention import ring_attention
from .ulysses import ulysses_attention

__all__ = ["layout", "ring_attention", "ulysses_attention", "ATTENTION", "apply_context_parallel", "check_attention"]
