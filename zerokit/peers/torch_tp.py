"""``torch-tp``: torch's own tensor parallelism (``parallelize_module``) as a zerokit strategy.

Lifecycle:

1. **setup**: every rank builds the whole model from the same seed. Each attention's
   packed ``qkv`` Linear(d, 3d) is split into three Linears ``q``, ``k``, ``v`` holding
   exactly its rows (a peer-local attention with the same math: causal
   ``scaled_dot_product_attention``, heads = local width // head_dim). torch's
   ``ColwiseParallel`` splits a weight's rows contiguously, so on the packed matrix a
   rank would get all of q and half of k. Then ``parallelize_module`` on the mesh's
   ``tp`` axis (``ctx.mesh.device_mesh["tp"]``) applies the plan of :func:`tp_plan`:

   - ``ColwiseParallel`` on ``attn.q/k/v`` and ``mlp.fc`` (Megatron's column-parallel
     layers: heads and FFN columns split), ``RowwiseParallel`` on ``attn.proj`` and
     ``mlp.proj`` (row-parallel: g, an all-reduce of b·s·h in forward);
   - ``PrepareModuleInput`` on ``attn`` and ``mlp`` marks their input Replicate once, so
     the three q/k/v gradients are summed locally and all-reduced once in backward
     (Megatron's f). Without it each column-parallel Linear all-reduces its own input
     gradient: three all-reduces for q, k and v where Megatron has one;
   - ``RowwiseParallel`` on ``tok``: torch shards an ``nn.Embedding``'s rows (the
     vocabulary); a rank looks up the tokens it owns, zeros elsewhere, and an all-reduce
     sums them;
   - ``ColwiseParallel(output_layouts=Replicate())`` on ``head``: vocabulary-parallel
     logits, then an **all-gather of the logits whole** (b·s·vocab), so the workload's
     plain cross-entropy runs unchanged. The vocabulary-parallel loss that never
     gathers them is zerokit's own TP's job (torch's ``loss_parallel`` needs the loss
     computed inside its context, which zerokit's loop computes outside the strategy);
   - ``pos`` and the LayerNorms stay plain tensors, replicated (without sequence parallelism).

   Every rank already holds the whole tensor, so each cuts its shard locally
   (``src_data_rank=None``): setup moves nothing.

   With ``sequence_parallel=True`` (Korthikanti et al. 2205.05198) the LayerNorms run
   under ``SequenceParallel`` on sequence shards, the embedding's and the row-parallel
   layers' outputs are reduce-scattered along the sequence (``Shard(1)``), attention,
   MLP and head inputs are all-gathered (``PrepareModuleInput`` Shard(1) → Replicate),
   and the position embedding looks up only this rank's positions. The gradients of
   the parameters used on sequence shards (LayerNorms, ``pos``) are then partial sums:
   they are all-reduced over ``tp`` before the step (phase "step"), as Megatron does;

2. **forward / backward**: DTensor runs the collectives. They are *functional
   collectives* (``torch.ops._c10d_functional.*``), not ``torch.distributed.all_reduce``,
   so :mod:`.recording`'s wrappers never see them. A ``TorchDispatchMode``
   (:class:`LedgeredFunctionalCollectives`, the mechanism of torch's ``CommDebugMode``)
   sees every functional collective op with its tensors and records it through
   :func:`zerokit.runtime.comm.new_record`: op, payload (the all-reduce's tensor, the
   all-gather's output, the reduce-scatter's input), axis ``tp``. The ops are async:
   the seconds a rank blocks are read on their ``wait_tensor`` when it runs inside the
   mode (a wait outside it, e.g. on the logits the loss reads, is not timed);
3. **step**: each gradient is brought to its parameter's layout (torch computes the token
   embedding's gradient whole, Replicate, on every rank — vocab × h, which the memory
   ledger shows above the formula — and it is sliced here; under sequence parallelism the
   partial LayerNorm gradients are all-reduced here), then zerokit's ``MasterOptimizer``
   steps the local shards (``DTensor.to_local()``, which share the DTensors' storage) in
   place. fp32 only: bf16-mixed is refused.

Autograd saves DTensors for backward, which have no storage of their own; the memory
ledger counts their local shards (:func:`zerokit.runtime.memory.local_tensor`).

``tie_weights=True`` works: the token embedding and the head both shard the vocabulary
rows (``Shard(0)``), so after ``parallelize_module`` the head is tied again to the
embedding's DTensor and both uses accumulate into one sharded gradient.

Theory: zerokit's theory module has no tensor-parallel model-state formula yet.
``theory_model_states`` applies the stage-0 formula to the local shard sizes this rank
holds (sharded weights /t plus the replicated rest), exact for what a rank stores;
``theory_comm_bytes`` counts this plan's collectives under the ring formula (Megatron's
four all-reduces per layer from ``theory.tp_elements_sent_per_layer``, plus the
embedding's, the head's and the logits' gather), computed here.
"""
from __future__ import annotations


import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist

from .. import theory
from ..optim import MasterOptimizer
from ..runtime import comm
from ..strategies.base import Option, boolean, register
from .recording import LedgeredFunctionalCollectives, Peer, fp32_only


# --- the model: packed qkv split into q, k, v ---------------------------------------------------

class SplitAttention(nn.Module):
    """Causal self-attention with separate q, k, v Linears (same math as the workload's packed one).

    The number of heads is read from the width ``q`` produces, so the module runs whole or
    with its heads split across ranks (column-parallel q, k, v: local width = d/t).
    """

    def __init__(self, attn: nn.Module):
        super().__init__()
        d = attn.proj.in_features
        self.head_dim = d // attn.n_head
        bias = attn.qkv.bias is not None
        self.q, self.k, self.v = (nn.Linear(d, d, bias=bias) for _ in range(3))
        with torch.no_grad():
            for i, lin in enumerate((self.q, self.k, self.v)):
                lin.to(attn.qkv.weight.device, attn.qkv.weight.dtype)
                lin.weight.copy_(attn.qkv.weight[i * d:(i + 1) * d])
                if bias:
                    lin.bias.copy_(attn.qkv.bias[i * d:(i + 1) * d])
        self.proj = attn.proj

    def forward(self, x):
        b, s = x.shape[0], x.shape[1]
        q, k, v = self.q(x), self.k(x), self.v(x)
        width = q.shape[-1]  # d/t under tensor parallelism
        heads = width // self.head_dim
        q, k, v = (t.view(b, s, heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, width))


def split_qkv(model: nn.Module) -> dict:
    """Replace every module with a packed ``qkv`` and a ``proj`` by :class:`SplitAttention`, in place.

    Returns ``{qkv's parameter name prefix: the new attention's name}`` to reassemble ``qkv``.
    """
    targets = [(name, m) for name, m in model.named_modules()
               if isinstance(getattr(m, "qkv", None), nn.Linear) and isinstance(getattr(m, "proj", None), nn.Linear)
               and hasattr(m, "n_head")]
    if not targets:
        raise ValueError("strategy 'torch-tp' needs zerokit's tiny GPT (attention modules with a packed qkv "
                         "Linear, a proj Linear and n_head); this model has none")
    moved = {}
    for name, attn in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, SplitAttention(attn))
        moved[f"{name}.qkv"] = name
    return moved


def tp_plan(model: nn.Module, sequence_parallel: bool) -> dict:
    """torch's parallelize plan for zerokit's tiny GPT (after :func:`split_qkv`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    between = Shard(1) if sequence_parallel else Replicate()  # what flows between the blocks
    plan = {
        "tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
        "head": ColwiseParallel(input_layouts=between, output_layouts=Replicate()),
    }
    if sequence_parallel:
        plan["ln_f"] = SequenceParallel()
    for i in range(len(model.blocks)):
        p = f"blocks.{i}"
        for sub in ("attn", "mlp"):
            plan[f"{p}.{sub}"] = PrepareModuleInput(input_layouts=(between,), desired_input_layouts=(Replicate(),),
                                                    use_local_output=False)
        for lin in ("attn.q", "attn.k", "attn.v", "mlp.fc"):
            plan[f"{p}.{lin}"] = ColwiseParallel()
        for lin in ("attn.proj", "mlp.proj"):
            plan[f"{p}.{lin}"] = RowwiseParallel(output_layouts=between)
        if sequence_parallel:
            plan[f"{p}.ln1"] = SequenceParallel(use_local_output=True)
            plan[f"{p}.ln2"] = SequenceParallel(use_local_output=True)
    return plan


# --- the strategy ---------------------------------------------------------------------------------

def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


@register
class TorchTP(Peer):
    """torch's ``parallelize_module`` (Colwise/RowwiseParallel, optionally SequenceParallel) on the ``tp`` axis."""

    name = "torch-tp"
    stage = 0
    axes = ("tp",)
    own_tensor_parallel = True
    peer = True
    options = {"sequence_parallel": Option(False, boolean, "True or False")}

    def __init__(self, model, ctx, config, **options):
        from torch.distributed.tensor.parallel import parallelize_module

        super().__init__(model, ctx, config, **options)
        fp32_only(self.name, config)
        self.sp = self.opts["sequence_parallel"]
        mesh = ctx.mesh
        self.t = mesh.size("tp")
        if self.t < 2 or mesh.device_mesh is None:
            raise ValueError(f"strategy 'torch-tp' needs a tensor-parallel degree of at least 2, got tp={self.t}; "
                             f"use parallel={{'tp': N}}")
        #: the original model's parameter names, in order (qkv included), for full_parameters
        self.names = [n for n, _ in model.named_parameters()]
        tied = getattr(model, "head", None) is not None and getattr(model, "tok", None) is not None \
            and model.head.weight is model.tok.weight
        self._check_sizes(model)
        self.moved = split_qkv(model)
        tp_mesh = mesh.device_mesh["tp"]
        self.tp_mesh = tp_mesh
        if self.sp:
            self._shard_positions(model)
        with comm.phase("setup"), self._recording():
            parallelize_module(model, tp_mesh, tp_plan(model, self.sp), src_data_rank=None)
            if tied:  # both shard the vocabulary rows (Shard(0)): one DTensor serves both modules
                model.head.weight = model.tok.weight
        self.params = [p for p in model.parameters() if p.requires_grad]
        #: plain parameters used on sequence shards only (the position embedding): their gradients are partial sums
        self.sequence_partial = [model.pos.weight] if self.sp else []
        self.locals = [_local(p).detach() for p in self.params]
        self.optimizer = MasterOptimizer(self.locals, config.optimizer)

    def _check_sizes(self, model):
        t = self.t
        blocks = getattr(model, "blocks", None)
        if blocks is None or not hasattr(model, "tok") or not hasattr(model, "head"):
            raise ValueError("strategy 'torch-tp' needs zerokit's tiny GPT (tok, pos, blocks, ln_f, head)")
        n_head = blocks[0].attn.n_head
        d = model.tok.embedding_dim
        for what, value in (("n_head", n_head), ("d_model", d), ("vocab", model.tok.num_embeddings),
                            ("FFN width", blocks[0].mlp.fc.out_features)):
            if value % t:
                raise ValueError(f"strategy 'torch-tp': {what}={value} is not divisible by the tensor-parallel "
                                 f"degree tp={t}; choose a degree that divides it")
        if self.sp and model.pos.num_embeddings % t:
            raise ValueError(f"strategy 'torch-tp': sequence_parallel=True needs the sequence length "
                             f"({model.pos.num_embeddings}) divisible by tp={t}")

    def _shard_positions(self, model):
        """Under sequence parallelism each rank adds the position embeddings of its own sequence shard."""
        t, r = self.t, self.ctx.mesh.coord("tp")

        def mine(module, args):
            return (args[0].chunk(t)[r],)

        model.pos.register_forward_pre_hook(mine)

    def _recording(self):
        return LedgeredFunctionalCollectives(self.ctx.mesh, "tp", self.name)

    # -- training ---------------------------------------------------------------------
    def run_forward(self, inputs):
        self._micro_shape = tuple(inputs.shape[:2])  # (b, s) of a micro-batch, for the traffic formula
        with self._recording():
            return self.model(inputs)

    def run_backward(self, loss):
        with self._recording():
            loss.backward()

    def run_step(self):
        grads = []
        with self._recording():
            for p in self.params:
                g = p.grad
                if g is not None and hasattr(g, "placements") and tuple(g.placements) != tuple(p.placements):
                    # to the parameter's layout: Partial -> Replicate is an all-reduce over tp, Partial -> Shard a
                    # reduce-scatter, Replicate -> Shard a local slice (the embedding's gradient comes out whole)
                    g = g.redistribute(p.device_mesh, p.placements)
                grads.append(None if g is None else _local(g))
        for p in self.sequence_partial:
            if p.grad is not None:  # a torch.distributed call: Peer.step's recording wrapper puts it in the ledger
                dist.all_reduce(p.grad, group=self.ctx.mesh.group("tp"))
        self.optimizer.step(grads)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    # -- measurement ------------------------------------------------------------------
    def track_memory(self, ledger):
        ledger.track("params", lambda: [_local(p) for p in self.model.parameters()])
        ledger.track("grads", lambda: [_local(p.grad) for p in self.model.parameters() if p.grad is not None])
        ledger.track("buffers", lambda: list(self.model.buffers()))
        ledger.track_optimizer(self.optimizer.optimizer)

    def full_parameters(self):
        """Every parameter whole under the original model's names (q, k, v concatenated back into ``qkv``)."""
        named = dict(self.model.named_parameters())
        for n, p in list(named.items()):
            named[n] = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float().cpu()
        out = {}
        for name in self.names:
            prefix, _, kind = name.rpartition(".")
            if prefix in self.moved:
                attn = self.moved[prefix]
                out[name] = torch.cat([named[f"{attn}.{x}.{kind}"] for x in ("q", "k", "v")]).clone()
            else:
                out[name] = named[name].clone()
        return out

    def optimizer_tensors(self):
        return self.optimizer.step_scalars

    def local_numel(self) -> int:
        """Elements of model parameters this rank stores: sharded weights /t plus the replicated rest."""
        return sum(_local(p).numel() for p in self.model.parameters())

    def theory_model_states(self, psi):
        """The stage-0 formula on this rank's local shard sizes (no tensor-parallel formula in theory yet)."""
        return theory.model_state_bytes(0, self.local_numel(), 1, self.config.precision, self.config.optimizer.name,
                                        optimizer_tensors=self.optimizer_tensors())

    def theory_comm_bytes(self, psi):
        """Bytes a rank sends per step under the ring formula, for the collectives this plan issues.

        Per micro-batch of b sequences of s tokens (h = d_model, V = vocab, L layers, t = tp):
        Megatron's 4 all-reduces of b·s·h per layer (``theory.tp_elements_sent_per_layer``:
        8·b·s·h·(t−1)/t elements), 2 more all-reduces of b·s·h (the vocabulary-parallel
        embedding's sum in forward, the head's input gradient in backward), and the all-gather
        of the logits, (t−1)/t·b·s·V. Sequence parallelism moves the same bytes as all-gathers
        and reduce-scatters, plus one all-reduce per step of the gradients of the parameters used
        on sequence shards (LayerNorms, the position embedding). Not in the theory module yet
        (it has no tensor-parallel formula beyond the per-layer count): computed here.
        """
        if not hasattr(self, "_micro_shape"):
            return 0
        b, s = self._micro_shape
        h, vocab, layers, t = self.model.tok.embedding_dim, self.model.tok.num_embeddings, len(self.model.blocks), self.t
        per_micro = (layers * theory.tp_elements_sent_per_layer(b, s, h, t)
                     + 2 * theory.ring_bytes_sent("all_reduce", b * s * h, t)
                     + theory.ring_bytes_sent("all_gather", b * s * vocab, t))
        elements = self.config.micro_batches * per_micro
        if self.sp:
            shared = sum(p.numel() for m in self.model.modules() if isinstance(m, nn.LayerNorm)
                         for p in m.parameters()) + self.model.pos.weight.numel()
            elements += theory.ring_bytes_sent("all_reduce", shared, t)
        return elements * theory.param_bytes_per_element(self.config.precision)
