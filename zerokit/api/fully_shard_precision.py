"""``mp_policy``: FSDP2's ``MixedPrecisionPolicy`` read and checked for ``zerokit.fully_shard``, and its casts.

Lifecycle: :func:`read_policy` runs first in every ``fully_shard`` call, before any rank is asked for, so a
policy zerokit can't honour is refused before any work; the face (:mod:`.fully_shard`) then casts each
gather to ``param_dtype`` (through ``zero3``), and, around the sharded module's forward, its floating-point
inputs to ``param_dtype`` and outputs to ``output_dtype`` (:func:`cast_floats`).
"""
from __future__ import annotations

import torch

_SIXTEEN_BIT = (torch.bfloat16, torch.float16)


def read_policy(mp_policy) -> dict:
    """FSDP2's ``MixedPrecisionPolicy`` (or any object with its four fields) read and checked."""
    fields = dict(param_dtype=None, reduce_dtype=None, output_dtype=None, cast_forward_inputs=True)
    if mp_policy is None:
        return fields
    unknown = [f for f in fields if not hasattr(mp_policy, f)]
    if unknown:
        raise TypeError(f"zerokit.fully_shard(mp_policy=…) needs torch.distributed.fsdp.MixedPrecisionPolicy (fields "
                        f"{', '.join(fields)}); got a {type(mp_policy).__name__} without {', '.join(unknown)}")
    fields = {f: getattr(mp_policy, f) for f in fields}
    for name in ("param_dtype", "reduce_dtype", "output_dtype"):
        if fields[name] not in (None, torch.float32, *_SIXTEEN_BIT):
            raise ValueError(f"zerokit.fully_shard: mp_policy.{name}={fields[name]} is not allowed; give None, "
                             f"torch.float32, torch.bfloat16 or torch.float16")
    if fields["param_dtype"] == torch.float32:
        fields["param_dtype"] = None  # the parameters' own dtype: no cast
    if fields["reduce_dtype"] is not None and fields["param_dtype"] is None and fields["reduce_dtype"] != torch.float32:
        raise ValueError(f"zerokit.fully_shard: mp_policy.reduce_dtype={fields['reduce_dtype']} with an fp32 compute "
                         f"dtype is not implemented (gradients reduced in 16 bits from fp32 ones); set param_dtype too")
    if fields["reduce_dtype"] == torch.float32 and fields["param_dtype"] is None:
        fields["reduce_dtype"] = None
    return fields


def cast_floats(tree, dtype: torch.dtype):
    """Every floating-point tensor of a (nested) structure cast to ``dtype`` (FSDP2's input and output casts)."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.to(dtype) if torch.is_tensor(t) and t.is_floating_point() else t, tree)
