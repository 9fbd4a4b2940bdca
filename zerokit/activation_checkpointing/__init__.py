"""Activation checkpointing: drop a block's activations in forward, recompute them in backward.

:func:`apply_checkpointing` installs a policy (``none``, ``every``, ``every_k``, ``sqrt``,
``selective``, and the peers ``torch-every`` / ``torch-selective``) on a model's repeated
blocks in place; ``zerokit.train(..., checkpointing=…, checkpoint_every=…)`` does it on every
rank before the strategy is built. :mod:`.function` is the recompute mechanism,
:mod:`.policies` the policies, :mod:`.torch_peers` torch's own, :mod:`.measure` the bytes
each keeps (the formulas are :func:`zerokit.theory.checkpointed_activation_bytes` and
Chen et al.'s :func:`zerokit.theory.checkpointed_blocks`).
"""
from .function import Counter, Frame, checkpoint
from .policies import (POLICIES, Checkpointing, apply_checkpointing, block_groups, check_for_model, check_policy,
                       checkpointing_of, remove_checkpointing, segment_layers)

__all__ = ["POLICIES", "Checkpointing", "Counter", "Frame", "apply_checkpointing", "block_groups",
           "check_for_model", "check_policy", "checkpoint", "checkpointing_of", "remove_checkpointing",
           "segment_layers"]
