"""A tensor-parallel plan: module-name patterns → styles, as torch's ``parallelize_module`` takes.

Lifecycle: :func:`check_plan` runs on the unsharded model *before any process
starts* and refuses, with the argument and what is allowed, a pattern that names no
module, a module of the wrong type for its style, sizes the degree does not divide
(features, heads, vocabulary) and, under sequence parallelism, a sequence length the
degree does not divide. On each rank :func:`apply_plan` then replaces the matched
modules in place with their tensor-parallel versions (:mod:`.layers`), cutting this
rank's slice out of the unsharded weights, so a parameter shared by two modules (a
tied embedding and head) stays one shared, sharded parameter. The styles:

- ``colwise`` / ``rowwise``: Megatron's column- and row-parallel linear (§3);
- ``colwise_qkv``: a packed q/k/v projection, column-parallel by whole heads;
- ``vocab_embedding``: vocabulary-parallel embedding;
- ``vocab_head``: a column-parallel output head; its logits stay split by vocabulary
  when ``loss="vocab_parallel"`` (then use :func:`plan_loss`), else are gathered;
- ``sequence_parallel``: a module on the residual stream (LayerNorm, dropout) that runs
  on sequence shards under sequence parallelism; its parameters' gradients are summed
  over ``tp`` after backward (:func:`.sharding.allreduce_sequence_parallel_gradients`);
- ``sequence_slice``: a module whose output holds the whole sequence on dimension −2
  (position embeddings): under sequence parallelism it is cut to this rank's slice;
- ``attention``: an ``nn.MultiheadAttention``, by whole heads (:mod:`.attention`);
- ``experts``: a mixture-of-experts layer (:class:`zerokit.expert_parallel.MoEMLP`): every expert
  column then row inside, the reductions once per layer (its ``split_experts``).

The last two do nothing without sequence parallelism.
"""
from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import torch.nn as nn

from .attention import TensorParallelMultiheadAttention
from .cross_entropy import vocab_parallel_cross_entropy
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .mappings import group_rank, group_size
from .sharding import Shard, mark_sequence_parallel

STYLES = ("colwise", "rowwise", "colwise_qkv", "vocab_embedding", "vocab_head", "sequence_parallel",
          "sequence_slice", "attention", "experts")
_LINEAR = ("colwise", "rowwise", "colwise_qkv", "vocab_head")
LOSSES = (None, "vocab_parallel")
HEAD_ATTRIBUTES = ("n_head", "num_heads", "n_heads")


@dataclass
class Plan:
    """``styles``: fnmatch pattern over module names → style. ``sequence_parallel``: shard the
    regions between tensor-parallel layers along the sequence. ``loss``: "vocab_parallel" when the
    model's output is vocabulary-sharded logits. ``keep_input_sharded``: under sequence parallelism,
    column-parallel layers keep only their input's sequence shard for backward and all-gather it again."""

    styles: Dict[str, str] = field(default_factory=dict)
    sequence_parallel: bool = False
    loss: Optional[str] = None
    keep_input_sharded: bool = False


#: how tensor parallelism splits each expert of a mixture of experts (style ``experts``;
#: :meth:`zerokit.expert_parallel.MoEMLP.split_experts` applies it): parameter → the dimension cut over tp (``fc`` by
#: output columns, ``proj`` by input rows); the rest stay whole
EXPERT_TP_LAYOUT = {"fc.weight": 0, "fc.bias": 0, "proj.weight": 1}


def tiny_gpt_plan(sequence_parallel: bool = False, keep_input_sharded: bool = False, experts: bool = False) -> Plan:
    """The plan of :class:`zerokit.workloads.TinyGPT`: attention by heads, the MLP column then row,
    embedding and head by vocabulary (tied or not), LayerNorms and positions sequence-parallel.

    ``experts``: the MLPs are mixtures of experts; each expert is split as the dense MLP is (Megatron's
    expert tensor parallelism equal to tp), the router stays whole on every tp rank, so every tp rank routes
    the same tokens the same way (style ``experts``; :func:`check_plan` refuses it under sequence parallelism)."""
    mlp = {"blocks.*.mlp": "experts"} if experts else {"blocks.*.mlp.fc": "colwise", "blocks.*.mlp.proj": "rowwise"}
    return Plan({"tok": "vocab_embedding", "pos": "sequence_slice",
                 "blocks.*.ln1": "sequence_parallel", "blocks.*.attn.qkv": "colwise_qkv",
                 "blocks.*.attn.proj": "rowwise", "blocks.*.ln2": "sequence_parallel",
                 **mlp, "ln_f": "sequence_parallel", "head": "vocab_head"},
                sequence_parallel=sequence_parallel, loss="vocab_parallel", keep_input_sharded=keep_input_sharded)


def _check_fields(plan: Plan) -> None:
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a zerokit.tensor_parallel.Plan, got {type(plan).__name__}")
    if not isinstance(plan.styles, dict) or not plan.styles:
        raise ValueError(f"plan.styles={plan.styles!r} must be a non-empty dict of module-name pattern → style")
    for pattern, style in plan.styles.items():
        if style not in STYLES:
            raise ValueError(f"plan: style {style!r} for {pattern!r} is unknown; allowed: {', '.join(STYLES)}")
    for flag in ("sequence_parallel", "keep_input_sharded"):
        if not isinstance(getattr(plan, flag), bool):
            raise ValueError(f"plan.{flag}={getattr(plan, flag)!r} must be True or False")
    if plan.loss not in LOSSES:
        raise ValueError(f"plan.loss={plan.loss!r}; allowed: None, 'vocab_parallel'")
    if plan.loss == "vocab_parallel" and "vocab_head" not in plan.styles.values():
        raise ValueError("plan.loss='vocab_parallel' needs a module with style 'vocab_head' (the output head)")


def match(model: nn.Module, plan: Plan) -> Dict[str, Tuple[str, str]]:
    """``{module name: (pattern, style)}`` for every module a pattern names, in the model's order."""
    _check_fields(plan)
    names = [name for name, _ in model.named_modules() if name]
    found: Dict[str, Tuple[str, str]] = {}
    for pattern, style in plan.styles.items():
        hits = fnmatch.filter(names, pattern)
        if not hits:
            some = ", ".join(names[:12]) + (", …" if len(names) > 12 else "")
            raise ValueError(f"plan: pattern {pattern!r} ({style}) matches no module of {type(model).__name__}; "
                             f"its modules are: {some}")
        for name in hits:
            if name in found and found[name][1] != style:
                raise ValueError(f"plan: module {name!r} is matched by {found[name][0]!r} ({found[name][1]}) and by "
                                 f"{pattern!r} ({style}); give each module one style")
            found.setdefault(name, (pattern, style))
    return {name: found[name] for name in names if name in found}


def _placements(module: nn.Module, style: Optional[str], expert_layer: Optional[str] = None
                ) -> Dict[str, Optional[Shard]]:
    """How a style lays out the module's own parameters: a :class:`Shard`, or None (replicated);
    ``expert_layer``: the module is an expert's ``fc`` or ``proj`` inside an ``experts`` module."""
    if expert_layer is not None:
        dims = {name: EXPERT_TP_LAYOUT.get(f"{expert_layer}.{name}")
                for name, _ in module.named_parameters(recurse=False)}
        return {name: None if dim is None else Shard(dim) for name, dim in dims.items()}
    shard = {"colwise": Shard(0), "vocab_head": Shard(0), "colwise_qkv": Shard(0, 3), "vocab_embedding": Shard(0),
             "rowwise": Shard(1), "attention": Shard(0, 3)}.get(style)
    out = {name: shard for name, _ in module.named_parameters(recurse=False)}
    if style == "rowwise" and "bias" in out:
        out["bias"] = None  # added once, after the reduction
    return out


def _heads(model: nn.Module, name: str) -> Optional[int]:
    parent = model.get_submodule(name.rpartition(".")[0])
    for attr in HEAD_ATTRIBUTES:
        if isinstance(getattr(parent, attr, None), int):
            return getattr(parent, attr)
    return None


def _check_sizes(model: nn.Module, name: str, module: nn.Module, style: str, tp: int) -> None:
    def need(value: int, what: str) -> None:
        if value % tp:
            raise ValueError(f"plan: {name} ({style}) has {what}={value}, which tp={tp} does not divide; "
                             f"choose tp among the divisors of {value}")

    if style in ("colwise", "vocab_head"):
        need(module.out_features, "out_features")
    elif style == "rowwise":
        need(module.in_features, "in_features")
    elif style == "colwise_qkv":
        if module.out_features % 3:
            raise ValueError(f"plan: {name} (colwise_qkv) has out_features={module.out_features}, not q, k and v "
                             f"of equal width (a multiple of 3)")
        heads = _heads(model, name)
        if heads is None:
            need(module.out_features // 3, "width of each of q, k, v")
        else:
            need(heads, "heads")
    elif style == "vocab_embedding":
        need(module.num_embeddings, "num_embeddings (vocabulary)")
    elif style == "attention":
        need(module.num_heads, "num_heads")
    elif style == "experts":
        need(next(iter(module.experts.values())).fc.out_features, "expert hidden width (fc.out_features)")


def check_plan(model: nn.Module, plan: Plan, tp: int, seq_len: Optional[int] = None) -> Dict[str, Tuple[str, str]]:
    """Refuse, before any process starts, a plan that cannot run on ``model`` at degree ``tp``;
    returns the matched modules (:func:`match`)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp={tp!r} must be a positive integer")
    matched = match(model, plan)
    want = {"vocab_embedding": nn.Embedding, "attention": nn.MultiheadAttention, **{s: nn.Linear for s in _LINEAR}}
    for name, (pattern, style) in matched.items():
        module = model.get_submodule(name)
        if style == "experts" and plan.sequence_parallel:  # zerokit's choice; Megatron all-gathers the tokens first
            raise ValueError(f"plan: {name} (experts): sequence_parallel=True with a mixture of experts is not "
                             f"implemented: each tp rank's router needs every token of its micro-batch; use "
                             f"sequence_parallel=False")
        if style == "experts" and not getattr(type(module), "mixture_of_experts", False):
            raise ValueError(f"plan: {name} (matched by {pattern!r}) is a {type(module).__name__}; style {style!r} "
                             f"needs an nn.MoEMLP")
        if style in want and not isinstance(module, want[style]):
            raise ValueError(f"plan: {name} (matched by {pattern!r}) is a {type(module).__name__}; style {style!r} "
                             f"needs an nn.{want[style].__name__}")
        _check_sizes(model, name, module, style, tp)
    if plan.sequence_parallel and seq_len is not None and seq_len % tp:
        raise ValueError(f"plan: sequence_parallel=True shards the sequence over tp={tp}, but seq_len={seq_len} "
                         f"is not divisible by {tp}; use a multiple of {tp} or sequence_parallel=False")
    owners: Dict[int, Tuple[str, Optional[Shard]]] = {}
    for mname, module in model.named_modules(remove_duplicate=False):
        style = matched.get(mname, (None, None))[1]
        for pname, shard in _placements(module, style, _inside_experts(matched, mname)).items():
            p = module._parameters[pname]
            where = f"{mname}.{pname}" if mname else pname
            first = owners.setdefault(id(p), (where, shard))
            if first[1] != shard:
                raise ValueError(f"plan: {first[0]} and {where} are one shared parameter, laid out as {first[1]} and "
                                 f"{shard} (None: whole); shared parameters need the same layout (a tied embedding "
                                 f"and head: 'vocab_embedding' and 'vocab_head')")
    return matched


def plan_layout(model: nn.Module, plan: Plan) -> Dict[str, Optional[Shard]]:
    """For the *unsharded* model: ``{parameter name: Shard or None}`` as :func:`apply_plan` will lay it out."""
    matched = match(model, plan)
    out = {}
    for name, _ in model.named_parameters():
        mname, _, pname = name.rpartition(".")
        module = model.get_submodule(mname)
        out[name] = _placements(module, matched.get(mname, (None, None))[1], _inside_experts(matched, mname))[pname]
    return out


def _inside_experts(matched: Dict[str, Tuple[str, str]], mname: str) -> Optional[str]:
    """``fc`` / ``proj`` when module ``mname`` is one of an ``experts`` module's experts' layers, else None."""
    parent, _, layer = mname.rpartition(".")
    owner = parent.rpartition(".experts.")[0]
    return layer if owner and matched.get(owner, (None, None))[1] == "experts" else None


def _slice_sequence_hook(group, name: str):
    def hook(module, args, output):
        n, dim = group_size(group), output.dim() - 2
        if output.shape[dim] % n:
            raise ValueError(f"{name} (sequence_slice): sequence length {output.shape[dim]} is not divisible by "
                             f"tp={n}; sequence parallelism needs a multiple of {n}")
        size = output.shape[dim] // n
        return output.narrow(dim, group_rank(group) * size, size)
    return hook


def apply_plan(model: nn.Module, plan: Plan, group=None) -> nn.Module:
    """Replace the modules ``plan`` names with their tensor-parallel versions over ``group``
    (None: the default group), in place; returns ``model``."""
    tp = group_size(group)
    matched = check_plan(model, plan, tp)
    sp, memo = plan.sequence_parallel, {}
    for name, (_, style) in matched.items():
        module = model.get_submodule(name)
        if style in ("colwise", "colwise_qkv", "vocab_head"):
            new = ColumnParallelLinear.from_linear(
                module, group, sequence_parallel=sp, blocks=3 if style == "colwise_qkv" else 1,
                gather_output=style == "vocab_head" and plan.loss != "vocab_parallel",
                keep_input_sharded=plan.keep_input_sharded, memo=memo, tag=name)
        elif style == "rowwise":
            new = RowParallelLinear.from_linear(module, group, sequence_parallel=sp, memo=memo, tag=name)
        elif style == "vocab_embedding":
            new = VocabParallelEmbedding.from_embedding(module, group, sequence_parallel=sp, memo=memo, tag=name)
        elif style == "attention":
            if sp:
                raise ValueError(f"plan: {name} (attention) under sequence_parallel=True is not implemented")
            new = TensorParallelMultiheadAttention(module, group, memo=memo, tag=name)
        elif style == "experts":  # check_plan refused it under sequence parallelism
            module.split_experts(group, memo, tag=name)
            continue
        else:
            if sp:
                for p in module.parameters():
                    mark_sequence_parallel(p)
                if style == "sequence_slice":
                    module.register_forward_hook(_slice_sequence_hook(group, name))
            continue
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, new)
    return model


def plan_loss(plan: Plan, group=None) -> Optional[Callable]:
    """``loss(outputs, targets)`` for a model whose logits the plan leaves vocabulary-sharded
    (:func:`.cross_entropy.vocab_parallel_cross_entropy`); None when the outputs are whole."""
    if plan.loss != "vocab_parallel":
        return None
    return functools.partial(vocab_parallel_cross_entropy, group=group)
