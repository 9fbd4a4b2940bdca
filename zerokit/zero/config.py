"""DeepSpeed-style configuration: a ``zero_optimization`` section mapped onto zerokit's options.

``from_deepspeed(config)`` reads a DeepSpeed config (a dict, or the path of a JSON
file) and returns the options of zerokit's ``zero1`` / ``zero2`` / ``zero3``. Every key
is either mapped, or checked and found consistent with what zerokit does, or refused
with a message saying why: nothing is silently ignored. Sizes are in *elements*, as
DeepSpeed means them (``5e8`` is accepted for 500,000,000), never bytes (FACTS §7).

| DeepSpeed key (``zero_optimization``) | zerokit option | stages |
|---|---|---|
| ``stage`` | ``stage`` (must be the strategy's own) | 0–3 |
| ``reduce_bucket_size`` | ``reduce_bucket_size`` (1–2: unit size; 3: gradients in flight) | 1–3 |
| ``allgather_bucket_size`` | ``allgather_bucket_size`` (stage 3: ignored with a warning, as DeepSpeed ignores it) | 1–2 |
| ``overlap_comm`` | ``overlap_comm`` | 1–3 |
| ``contiguous_gradients`` | ``contiguous_gradients`` | 1–3 |
| ``reduce_scatter`` | ``reduce_scatter`` (stage 3: must be true) | 1–3 |
| ``allgather_partitions`` | must be true (zerokit gathers with all-gather) | 1–3 |
| ``stage3_prefetch_bucket_size`` | ``prefetch_bucket_size``; 0 turns ``prefetch`` off | 3 |
| ``stage3_param_persistence_threshold`` | ``param_persistence_threshold`` | 3 |
| ``offload_optimizer``, ``offload_param`` | ``{"device": "cpu"}``: ``offload="optimizer"`` / ``"params"`` (:mod:`zerokit.offload`); ``offload_param`` needs stage 3 | 1–3 / 3 |
| ``zero_quantized_weights``, ``zero_hpz_partition_size``, ``zero_quantized_gradients`` | the same names, options of ``zeropp`` (ZeRO++, :mod:`.zeropp`); :func:`strategy_of` picks ``zeropp`` when one is given | 3 |

At the top level only ``zero_optimization`` and ``"gradient_clipping": 0`` (zerokit never
clips; DeepSpeed clips at 1.0 unless told 0) are read; precision, optimizer and batch
are ``zerokit compare`` flags. ``to_deepspeed`` goes the other way, for the DeepSpeed peers.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Dict, Union

from .flat_buffer import check_elements

#: DeepSpeed key -> zerokit option name, for keys that map one to one
MAPPED = {
    "stage": "stage",
    "reduce_bucket_size": "reduce_bucket_size",
    "allgather_bucket_size": "allgather_bucket_size",
    "overlap_comm": "overlap_comm",
    "contiguous_gradients": "contiguous_gradients",
    "reduce_scatter": "reduce_scatter",
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "zero_quantized_weights": "zero_quantized_weights",
    "zero_hpz_partition_size": "zero_hpz_partition_size",
    "zero_quantized_gradients": "zero_quantized_gradients",
}
#: ZeRO++'s keys (arXiv 2306.10209): options of the ``zeropp`` strategy, stage 3 only
ZEROPP_KEYS = ("zero_quantized_weights", "zero_hpz_partition_size", "zero_quantized_gradients")
#: keys only some stages read; naming one for another stage is a contradiction
STAGES_OF = {
    "allgather_bucket_size": (1, 2),
    "stage3_prefetch_bucket_size": (3,),
    "stage3_param_persistence_threshold": (3,),
    "offload_param": (3,),
    **{key: (3,) for key in ZEROPP_KEYS},
}
SIZES = ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
         "stage3_param_persistence_threshold")
BOOLEANS = ("overlap_comm", "contiguous_gradients", "reduce_scatter", "allgather_partitions", "zero_quantized_weights",
            "zero_quantized_gradients")
#: DeepSpeed keys zerokit knows but does not implement
NOT_IMPLEMENTED = {
    "stage3_max_live_parameters": "zerokit bounds gathered parameters with prefetch_bucket_size only",
    "stage3_max_reuse_distance": "zerokit frees every unit after its forward (or backward) and never reuses it",
    "stage3_gather_16bit_weights_on_model_save": "use zerokit.zero.state_dict.full_state_dict",
    "sub_group_size": "zerokit steps each unit's shard as one tensor",
    "round_robin_gradients": "zerokit's shards are contiguous, never round-robin",
    "elastic_checkpoint": "zerokit has no checkpoint format of its own",
    "ignore_unused_parameters": "zerokit's ZeRO strategies always reduce zeros for unused parameters",
    "zero_quantized_nontrainable_weights": "zerokit holds frozen parameters whole on every rank: none is gathered",
}
OFFLOAD = ("offload_optimizer", "offload_param")
TOP_LEVEL = ("zero_optimization", "gradient_clipping")
TOP_LEVEL_FLAGS = {
    "bf16": "--precision bf16-mixed", "fp16": "--precision (zerokit has no fp16 loss scaling)",
    "optimizer": "--optimizer and --lr", "train_batch_size": "the workload's batch size",
    "train_micro_batch_size_per_gpu": "the workload's batch size and --micro-batches",
    "gradient_accumulation_steps": "--micro-batches",
}


def load_deepspeed_config(source: Union[str, Path, dict]) -> dict:
    """A DeepSpeed config as a dict, from a dict or a JSON file; a clear error for a missing or malformed file."""
    if isinstance(source, dict):
        return source
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"DeepSpeed config {str(path)!r}: no such file")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"DeepSpeed config {str(path)!r} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"DeepSpeed config {str(path)!r}: expected a JSON object, got {type(config).__name__}")
    return config


def from_deepspeed(source: Union[str, Path, dict]) -> Dict[str, Any]:
    """zerokit options from a DeepSpeed config dict or JSON file; raises ValueError on anything it can't honour."""
    config = load_deepspeed_config(source)
    for key in config:
        if key in TOP_LEVEL:
            continue
        if key in TOP_LEVEL_FLAGS:
            raise ValueError(f"DeepSpeed config key {key!r}: zerokit reads only zero_optimization (and "
                             f"gradient_clipping: 0) from a config; set this with {TOP_LEVEL_FLAGS[key]}")
        raise ValueError(f"DeepSpeed config key {key!r} is unknown to zerokit; allowed at the top level: "
                         f"{', '.join(TOP_LEVEL)}")
    clipping = config.get("gradient_clipping", 0)
    if clipping != 0:
        raise ValueError(f"gradient_clipping={clipping!r}: zerokit.train never clips gradients; set it to 0 (DeepSpeed "
                         f"clips at 1.0 by default, which would change the results; zerokit.initialize clips as "
                         f"DeepSpeed does)")
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        raise ValueError("DeepSpeed config: 'zero_optimization' must be an object with at least 'stage'")
    if "stage" not in zero:
        raise ValueError("zero_optimization: 'stage' is required (0, 1, 2 or 3)")
    stage = zero["stage"]
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_optimization.stage={stage!r} is not a ZeRO stage; allowed: 0, 1, 2, 3")
    known = set(MAPPED) | {"allgather_partitions"} | set(OFFLOAD) | set(NOT_IMPLEMENTED)
    options: Dict[str, Any] = {}
    for key, value in zero.items():
        if key not in known:
            raise ValueError(f"zero_optimization.{key} is unknown to zerokit; allowed: {', '.join(sorted(known - set(NOT_IMPLEMENTED)))}")
        if key in NOT_IMPLEMENTED:
            raise ValueError(f"zero_optimization.{key} is not implemented by zerokit ({NOT_IMPLEMENTED[key]}); "
                             f"remove it")
        if key == "allgather_bucket_size" and stage == 3:
            warnings.warn("zero_optimization.allgather_bucket_size applies to stages 1 and 2; DeepSpeed accepts it "
                          "at stage 3 and ignores it (stage 3 gathers by stage3_prefetch_bucket_size), and so does "
                          "zerokit", stacklevel=2)
            check_elements(f"zero_optimization.{key}", value)
            continue
        if key in STAGES_OF and stage not in STAGES_OF[key]:
            stages = " or ".join(map(str, STAGES_OF[key]))
            raise ValueError(f"zero_optimization.{key} contradicts stage {stage}: it applies to stage {stages} only")
        if key in OFFLOAD:
            device = value.get("device") if isinstance(value, dict) else None
            extra = sorted(set(value) - {"device", "pin_memory"}) if isinstance(value, dict) else []
            if device not in ("none", "cpu", None) or not isinstance(value, dict) or extra:
                raise ValueError(f"zero_optimization.{key}={value!r}: zerokit offloads to the CPU only; use "
                                 f"{{\"device\": \"cpu\"}} (optional \"pin_memory\") or {{\"device\": \"none\"}}")
            if device == "cpu":  # zerokit.offload: 'params' moves the optimizer to the host too
                options["offload"] = "params" if key == "offload_param" or options.get("offload") == "params" \
                    else "optimizer"
            continue
        if key in BOOLEANS and not isinstance(value, bool):
            raise ValueError(f"zero_optimization.{key}={value!r} must be true or false")
        if key == "zero_hpz_partition_size" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"zero_optimization.{key}={value!r} must be a whole number >= 1 (1: hpZ off)")
        if key in SIZES:
            if key == "stage3_prefetch_bucket_size" or key == "stage3_param_persistence_threshold":
                if value == 0 and not isinstance(value, bool):
                    value = 0
                else:
                    value = check_elements(f"zero_optimization.{key}", value)
            else:
                value = check_elements(f"zero_optimization.{key}", value)
        if key == "allgather_partitions":
            if not value:
                raise ValueError("zero_optimization.allgather_partitions=false (a broadcast per rank) is not "
                                 "implemented: zerokit gathers updated parameters with all-gather")
            continue
        if key == "reduce_scatter" and stage == 3:
            if not value:
                raise ValueError("zero_optimization.reduce_scatter=false contradicts stage 3, which always "
                                 "reduce-scatters gradients to their owners")
            continue
        if key == "stage3_prefetch_bucket_size":
            options["prefetch"] = value > 0
            if value == 0:
                continue
        options[MAPPED[key]] = value
    return options


def strategy_of(stage: int, options: Dict[str, Any]) -> str:
    """The strategy a DeepSpeed config's stage and mapped options name: ``zeropp`` when a ZeRO++ key is given."""
    if any(key in options for key in ZEROPP_KEYS):
        return "zeropp"
    return {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[stage]


def to_deepspeed(stage: int, options: Dict[str, Any]) -> Dict[str, Any]:
    """A DeepSpeed ``zero_optimization`` section for ``stage`` carrying zerokit ``options`` (the peers use it)."""
    inverse = {v: k for k, v in MAPPED.items()}
    zero: Dict[str, Any] = {"stage": stage}
    for name, value in options.items():
        if name == "prefetch":
            if not value:
                zero["stage3_prefetch_bucket_size"] = 0
            continue
        if name == "stage" or name not in inverse:
            continue
        key = inverse[name]
        if key in STAGES_OF and stage not in STAGES_OF[key]:
            continue
        if key == "stage3_prefetch_bucket_size" and zero.get(key) == 0:
            continue
        zero[key] = value
    return zero
