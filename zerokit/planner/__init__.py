"""The planner: what a real model needs per GPU on a real cluster, and what it sends per step.

    import zerokit
    p = zerokit.plan(preset="llama-7b", gpus=8, strategy="zero3", micro_batch_size=1)
    print(p.table())            # every term with its formula and assumption, the traffic, the advisor
    p.to_dict()["per_gpu"]      # what ``zerokit plan --json`` prints under per_gpu

One concern per module: :mod:`.models` (presets, shapes, bare counts), :mod:`.cluster`
(GPUs, memory, links), :mod:`.layout` (strategy, offload, dp/cp/ep/tp/pp, micro-batches,
checkpointing, precision, DeepSpeed configs), :mod:`.conventions` (the ZeRO paper's
counting and DeepSpeed's estimators'), :mod:`.memory` (bytes per GPU), :mod:`.traffic`
(bytes and estimated seconds per step, the bubble), :mod:`.step_time` (the step's
estimated time: compute, exposed traffic, bubble, MFU), :mod:`.plan` (``plan()``),
:mod:`.advisor` (layouts ranked) and :mod:`.render` (the text). Every formula is
:mod:`zerokit.theory`'s; the planner only composes them.
"""
from .advisor import Advice, advise
from .cluster import Cluster
from .conventions import CONVENTIONS, DEEPSPEED, DIFFERENCE, PAPER
from .layout import Layout, STRATEGIES
from .models import MOE_PRESETS, PRESETS, ModelSpec, from_params, preset, tiny_gpt_spec, transformer
from .plan import Plan, build, plan

__all__ = ["plan", "Plan", "build", "advise", "Advice", "Cluster", "Layout", "STRATEGIES", "ModelSpec", "PRESETS",
           "MOE_PRESETS",
           "preset", "from_params", "transformer", "tiny_gpt_spec", "CONVENTIONS", "PAPER", "DEEPSPEED",
           "DIFFERENCE"]
