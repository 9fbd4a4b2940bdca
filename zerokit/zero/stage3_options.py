"""``zero3``'s options: each one's default, check and what it allows (DeepSpeed's ``stage3_*`` names in brackets).

:class:`~.stage3.ZeroStage3` declares them as its ``options``; ``zerokit.zero.config`` maps a
DeepSpeed config onto them, and the DeepSpeed peer reads the defaults it shares.
"""
from __future__ import annotations

from ..offload.zero_hooks import offload_option
from ..strategies.base import Option, boolean
from .sharded import ALGORITHM_OPTION, DEFAULT_REDUCE_BUCKET, ELEMENTS, positive_elements, stage_option
from .units import UNIT_SIZE_OPTION, non_negative_elements

#: DeepSpeed's stage3_prefetch_bucket_size default in code (FACTS §7)
DEFAULT_PREFETCH_BUCKET = 50_000_000

STAGE3_OPTIONS = {
    "stage": stage_option(3),
    "unit_size": UNIT_SIZE_OPTION,
    "prefetch": Option(True, boolean, "True (gather the next units while this one computes, from the second "
                                      "step on) or False"),
    "prefetch_bucket_size": Option(DEFAULT_PREFETCH_BUCKET, positive_elements,
                                   f"{ELEMENTS}: the most elements in flight ahead of the current unit "
                                   f"(stage3_prefetch_bucket_size)"),
    "reshard_after_forward": Option(True, boolean, "True (free each unit after its forward, gather it again for "
                                                   "backward: 3Ψ traffic) or False (keep it until its backward: "
                                                   "2Ψ traffic, ZeRO-2-like memory)"),
    "param_persistence_threshold": Option(0, non_negative_elements,
                                          f"0 or {ELEMENTS}: parameters smaller than this stay gathered "
                                          f"(stage3_param_persistence_threshold)"),
    "reduce_bucket_size": Option(DEFAULT_REDUCE_BUCKET, positive_elements,
                                 f"{ELEMENTS}: the most gradient elements whose reduce-scatter is in flight"),
    "overlap_comm": Option(True, boolean, "True (asynchronous reduce-scatters during backward) or False "
                                          "(each waited for at once)"),
    "contiguous_gradients": Option(True, boolean, "True (all gradient shards in one flat buffer) or False "
                                                  "(one shard tensor per unit)"),
    "algorithm": ALGORITHM_OPTION,
    "offload": offload_option(3),
}
