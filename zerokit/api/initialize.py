"""``zerokit.initialize``: DeepSpeed's entry point, reading a DeepSpeed config, returning an engine.

``engine, optimizer, _, _ = zerokit.initialize(model=model, model_parameters=model.parameters(),
config=ds_config)`` — the seed's snippet with ``deepspeed`` replaced by ``zerokit``. Lifecycle:

1. the config (a dict or a JSON path) is read key by key: ``train_batch_size``,
   ``train_micro_batch_size_per_gpu`` and ``gradient_accumulation_steps`` (checked
   against each other and the data-parallel degree, as DeepSpeed does); ``optimizer``
   (``{"type": "AdamW"|"Adam"|"SGD", "params": {...}}``, or a torch optimizer passed as
   ``optimizer=`` — its class and every param group's hyperparameters are taken and rebuilt
   on the shards, because a ZeRO rank steps flat shards, not the model's parameters: each
   group's run of elements in a shard is stepped with its group's values,
   :func:`zerokit.optim.group_pieces`; ``model_parameters`` groups override the block's
   values, as DeepSpeed's do); ``bf16`` (the
   model is cast to bf16 and fp32 masters live in the optimizer); ``zero_optimization``
   (:mod:`zerokit.zero.config`: stage 0 is ``ddp``, 1–3 ``zero1``–``zero3``) and
   ``gradient_clipping`` — DeepSpeed's default, 1.0, when the key is absent; 0 turns it off
   (:class:`zerokit.optim.GradientClipping`). Any other key is refused by name; the seed's
   ``"pipeline"`` block is refused with what DeepSpeed's real API is;
2. ``model_parameters`` as DeepSpeed takes it: ``model.parameters()`` (frozen ones among
   them), or groups of them; a parameter of another model, or a trainable one left out, is
   refused; a module some data-parallel wrapper already holds is refused (its gradients
   would be reduced twice);
3. rank 0's parameters are broadcast (every rank starts equal), then the strategy is
   built on the model and wrapped in an :class:`~.engine.Engine`.

Returns ``(engine, engine.optimizer, None, lr_scheduler)`` like DeepSpeed (no dataloader;
the scheduler of the config's ``scheduler`` block, WarmupLR or WarmupDecayLR
(:mod:`.lr_schedules`), stepped by the engine after every optimizer step, or None);
``engine.optimizer`` is a ``torch.optim.Optimizer`` whose ``step`` is the
engine's, so torch's LR schedulers drive it (:mod:`.optimizer_face`).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..optim import OptimizerSpec
from ..parallelize import parallelize
from ..runtime.wrapping import broadcast_from_first, mark_wrapped, rank_context
from ..strategies import get as get_strategy, TrainConfig
from ..zero.config import from_deepspeed, load_deepspeed_config, strategy_of
from .engine import Engine
from .lr_schedules import scheduler_from_config

STRATEGY_OF_STAGE = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
#: DeepSpeed's gradient_clipping when the config has none (deepspeed/runtime/constants.py GRADIENT_CLIPPING_DEFAULT)
DEEPSPEED_GRADIENT_CLIPPING = 1.0
OPTIMIZERS = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
KNOWN = BATCH_KEYS + ("optimizer", "bf16", "fp16", "zero_optimization", "gradient_clipping", "scheduler")
PIPELINE = ("'pipeline' is not a DeepSpeed config key: DeepSpeed's pipeline parallelism is built in code, "
            "deepspeed.pipe.PipelineModule(layers=…, num_stages=2, partition_method='parameters') passed as the "
            "model, with the engine's train_batch(); in zerokit it is zerokit.train(…, parallel={'pp': 2}, "
            "schedule='1f1b', partition='params') — and DeepSpeed runs it with ZeRO stage 0 or 1 only")


def _positive(config: dict, key: str) -> Optional[int]:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"config {key}={value!r} must be a positive integer")
    return value


def batch_sizes(config: dict, world: int) -> tuple:
    """(micro-batch per rank, accumulation steps), checked as DeepSpeed checks them: train_batch_size =
    micro × accumulation × data-parallel degree."""
    total, micro, accumulation = (_positive(config, k) for k in BATCH_KEYS)
    if micro is None and total is not None:
        accumulation = accumulation or 1
        if total % (accumulation * world):
            raise ValueError(f"config train_batch_size={total} is not divisible by gradient_accumulation_steps "
                             f"({accumulation}) × data-parallel degree ({world})")
        micro = total // (accumulation * world)
    if accumulation is None and total is not None and micro is not None:
        if total % (micro * world):
            raise ValueError(f"config train_batch_size={total} is not divisible by train_micro_batch_size_per_gpu "
                             f"({micro}) × data-parallel degree ({world}) = {micro * world}: DeepSpeed derives "
                             f"gradient_accumulation_steps from it; give a train_batch_size that is a multiple of "
                             f"{micro * world}, or gradient_accumulation_steps")
        accumulation = total // (micro * world)
    accumulation = accumulation or 1
    if total is not None and micro is not None and total != micro * accumulation * world:
        raise ValueError(f"config train_batch_size={total} != train_micro_batch_size_per_gpu ({micro}) × "
                         f"gradient_accumulation_steps ({accumulation}) × data-parallel degree ({world}) = "
                         f"{micro * accumulation * world}")
    return micro, accumulation


def check_model_parameters(model: torch.nn.Module, model_parameters) -> None:
    """DeepSpeed's ``model_parameters``: what the optimizer steps — parameters or param groups, frozen ones among them
    as ``model.parameters()`` gives them (a frozen parameter has no gradient: nothing to step). Refused: a parameter
    that is not the model's, or a trainable one left out (zerokit steps every trainable parameter)."""
    given = []
    for item in model_parameters:
        given += list(item["params"]) if isinstance(item, dict) else [item]
    ids = {id(p) for p in given}
    owned = {id(p) for p in model.parameters()}
    if ids - owned:
        raise ValueError(f"zerokit.initialize(model_parameters=…): {len(ids - owned)} of them are not parameters of "
                         f"model; pass model.parameters() (or groups of them)")
    left_out = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in ids]
    if left_out:
        raise ValueError(f"zerokit.initialize(model_parameters=…) leaves out trainable parameters {left_out[:5]}: "
                         f"zerokit steps every trainable parameter; freeze one with requires_grad=False instead of "
                         f"leaving it out")


#: the hyperparameters an optimizer given to initialize is rebuilt with (the rest are torch's kernel switches)
HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay", "momentum", "nesterov", "dampening", "amsgrad", "maximize")


def _groups(param_groups, base: dict, strict: bool = True) -> tuple:
    """:attr:`~zerokit.optim.OptimizerSpec.groups` of param groups (dicts with ``params`` and their own values over
    ``base``), or () when there is one set of values for all: a ZeRO rank steps each group's elements of its flat
    shards with that group's values (:func:`zerokit.optim.group_pieces`)."""
    groups = []
    for group in param_groups:
        if not isinstance(group, dict):
            return ()  # plain parameters: one group, the base values
        own = {k: group[k] for k in HYPERPARAMETERS if k in group}
        unknown = sorted(set(group) - set(HYPERPARAMETERS) - {"params", "name"} - set(base))
        if strict and unknown:  # a torch optimizer's groups also carry its kernel switches (foreach, fused…)
            raise ValueError(f"a param group's keys {unknown} are not implemented; allowed: params and "
                             f"{', '.join(HYPERPARAMETERS)}")
        values = dict(base, **own)
        if "betas" in values:
            values["betas"] = tuple(values["betas"])
        groups.append((frozenset(id(p) for p in group["params"]), tuple(sorted(values.items()))))
    if len({values for _, values in groups}) <= 1:
        return ()
    return tuple(groups)


def optimizer_spec(config: dict, optimizer, model_parameters=None):
    import dataclasses

    if optimizer is not None and "optimizer" in config:
        raise ValueError("zerokit.initialize: give the optimizer either as optimizer=… or in the config's "
                         "'optimizer' block, not both (DeepSpeed refuses both too)")
    if isinstance(optimizer, torch.optim.Optimizer):
        groups = [{k: g[k] for k in HYPERPARAMETERS if k in g} for g in optimizer.param_groups]
        spec = OptimizerSpec.of_class(type(optimizer), **groups[0])
        return dataclasses.replace(spec, groups=_groups(optimizer.param_groups, {}, strict=False))
    if optimizer is not None:
        raise ValueError(f"zerokit.initialize(optimizer={type(optimizer).__name__}): pass a torch.optim.Optimizer "
                         f"instance, or an 'optimizer' block in the config")
    block = config.get("optimizer", {"type": "AdamW", "params": {}})
    if not isinstance(block, dict) or "type" not in block:
        raise ValueError("config 'optimizer' must be {\"type\": \"AdamW\" | \"Adam\" | \"SGD\", \"params\": {...}}")
    kind = str(block["type"]).lower()
    if kind not in OPTIMIZERS:
        raise ValueError(f"config optimizer.type={block['type']!r}; allowed: AdamW, Adam, SGD")
    params = dict(block.get("params", {}))
    if "betas" in params:
        params["betas"] = tuple(params["betas"])
    spec = OptimizerSpec.of_class(OPTIMIZERS[kind], **params)
    # DeepSpeed builds the config's optimizer on model_parameters: a group's own values override the block's
    groups = _groups(model_parameters, params) if model_parameters is not None else ()
    return dataclasses.replace(spec, groups=groups)


def initialize(model: torch.nn.Module = None, model_parameters=None, optimizer=None, config=None, **unused):
    """DeepSpeed's ``initialize`` (see the module docstring): ``(engine, optimizer, None, None)``."""
    if unused:
        raise ValueError(f"zerokit.initialize: arguments {sorted(unused)} are not supported; allowed: model, "
                         f"model_parameters, optimizer, config")
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"zerokit.initialize(model=…) needs an nn.Module, got {type(model).__name__}")
    if config is None:
        raise ValueError("zerokit.initialize(config=…) is required: a DeepSpeed config dict or JSON path")
    config = load_deepspeed_config(config)
    if "pipeline" in config:
        raise ValueError(PIPELINE)
    unknown = sorted(set(config) - set(KNOWN))
    if unknown:
        raise ValueError(f"config keys {unknown} are not implemented by zerokit; allowed: {', '.join(KNOWN)}")
    if config.get("fp16", {}).get("enabled", False):
        raise ValueError("config fp16.enabled=true: zerokit has no fp16 loss scaling; use \"bf16\": {\"enabled\": "
                         "true}")
    ctx = rank_context("zerokit.initialize")
    world = ctx.mesh.size("dp")
    _, accumulation = batch_sizes(config, world)
    if model_parameters is not None:
        model_parameters = list(model_parameters)  # a generator (model.parameters()) is read twice
    spec = optimizer_spec(config, optimizer, model_parameters)
    clipping = config.get("gradient_clipping", DEEPSPEED_GRADIENT_CLIPPING)
    if isinstance(clipping, bool) or not isinstance(clipping, (int, float)) or clipping < 0:
        raise ValueError(f"config gradient_clipping={clipping!r} must be a number >= 0 (0: no clipping)")
    zero = {"zero_optimization": config.get("zero_optimization", {"stage": 0}), "gradient_clipping": 0}
    options = from_deepspeed(zero)
    stage = zero["zero_optimization"]["stage"]
    if model_parameters is not None:
        check_model_parameters(model, model_parameters)
    precision = "bf16-mixed" if config.get("bf16", {}).get("enabled", False) else "fp32"
    mark_wrapped(model, "zerokit.initialize")
    if precision == "bf16-mixed":
        model.to(torch.bfloat16)
    broadcast_from_first(model, ctx)
    cls = get_strategy(strategy_of(stage, options))  # zero3, or zeropp with a ZeRO++ key
    if stage == 0:
        options = {}
    strategy = parallelize(model, ctx, strategy=cls, config=TrainConfig(precision, spec, accumulation),
                           options=options).strategy
    if clipping > 0:
        strategy.clip_gradients(clipping)
    engine = Engine(strategy, accumulation)

    engine.lr_scheduler = scheduler_from_config(config.get("scheduler"), engine.optimizer)
    return engine, engine.optimizer, None, engine.lr_scheduler
