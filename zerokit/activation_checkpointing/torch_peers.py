"""The peers: torch's own activation checkpointing on each block, as policies ``torch-every`` and ``torch-selective``.

Lifecycle: :class:`~zerokit.activation_checkpointing.policies.Checkpointing` gives each repeated block
the forward :func:`torch_forward` builds: with grad enabled it runs the block's own forward
under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` (passed explicitly:
torch 2.13 still only warns when it is left out); under ``no_grad`` it just runs it. torch
recomputes the block in backward from the saved-tensor hooks it installs, with the RNG state
restored, and by default stops the recompute as soon as the tensors backward needs are back.
The recompute calls the block's forward directly, not through ``nn.Module.__call__``: module
hooks do not fire again (ZeRO-3 gathers the block's unit through the hook on its output's
gradient, before that).

``torch-selective`` adds torch's selective activation checkpointing:
``context_fn=partial(create_selective_checkpoint_contexts, TORCH_SAVED_OPS)`` marks the
matrix multiplications ``MUST_SAVE`` — their outputs are kept — and everything else
(LayerNorm, GELU, dropout, the attention kernel, …) ``PREFER_RECOMPUTE``. That is the
"keep the matmul outputs, recompute the cheap element-wise ops" reading of selective
recompute; zerokit's ``selective`` recomputes only the attention core.

``recomputed_forwards`` counts each recompute that starts (an early-stopped one included).

Neither peer's kept tensors are visible to a :class:`~zerokit.runtime.memory.MemoryLedger`:
torch holds the block's inputs in its own frame and its innermost saved-tensor hooks hide
the rest, so compare peers by live tensors (:class:`zerokit.activation_checkpointing.measure.LiveTensors`).
"""
from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts, noop_context_fn

from ..strategies.blocks import in_backward

aten = torch.ops.aten
#: the operators whose outputs torch-selective keeps
TORCH_SAVED_OPS = [aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default]


def torch_forward(counter, name: str, orig, selective: bool):
    """A block forward running ``orig`` under torch's non-reentrant checkpoint (selective: matmuls kept)."""
    context_fn = functools.partial(create_selective_checkpoint_contexts, TORCH_SAVED_OPS) if selective \
        else noop_context_fn

    def counted(*args, **kwargs):
        if in_backward():
            counter.recomputed_forwards += 1
        return orig(*args, **kwargs)

    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            return orig(*args, **kwargs)
        return checkpoint(counted, *args, use_reentrant=False, preserve_rng_state=True, context_fn=context_fn,
                          **kwargs)

    forward.__name__ = f"torch_checkpointed_{name}"
    return forward
