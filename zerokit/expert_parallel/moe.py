"""A mixture-of-experts MLP (Shazeer et al.; GShard; Switch), its experts optionally spread over the ``ep`` ranks.

Each token's router scores the E experts; the token goes to its top-k, and its output is the
sum of those experts' outputs weighted by their router probabilities (the gates). Lifecycle of
one forward, per MoE layer:

1. **route**: router logits → softmax probabilities p (fp32) → top-k experts and gates per
   token. The load-balancing loss (Switch Transformer §2.2, GShard's per-group form) is
   E · Σ_e f_e · P_e per sequence — f_e the fraction of the sequence's routed slots that chose
   expert e, P_e its mean probability — averaged over the sequences; it reaches the
   gradients with ``aux_weight`` by :class:`AuxLoss` (Megatron's way: the output unchanged,
   the loss's gradient added in backward), so the training loop's loss needs no change.
2. **capacity**: with ``capacity_factor`` c, each expert takes at most ⌈c · T · k / E⌉ slots
   of a sequence of T tokens, first come first served; the rest are dropped (that expert
   contributes nothing to them) and counted in :attr:`dropped`. None (the default): dropless.
3. **dispatch** (with an ``ep`` group of n ranks, each holding E/n experts): the routed slots
   are sorted by expert, counts are exchanged and read on the host once (the one sync the
   uneven split sizes need), the token rows travel to their experts' ranks in one uneven
   all-to-all (:mod:`.alltoall`) with their expert ids (int32), each rank runs its experts on
   what arrived (one more sync: the size of each local expert's slice),
   and a second all-to-all brings the outputs back (**combine**), where they are weighted by
   the gates and summed per token. Without a group every expert is local.

Two compositions change a step: under **tensor parallelism** (:meth:`MoEMLP.split_experts`) every
expert is split column then row over tp and the layer reduces once — f on the tokens and the
gates, g on the combined output; under **context parallelism** each rank holds chunks of every
sequence, so step 1's per-sequence statistics are summed over the cp ranks.

:attr:`tokens_per_expert` counts the slots each expert received in the last forward
(measured). Expert parameters are marked ``_zerokit_expert``: a data-parallel strategy
reduces their gradients over the ranks holding the same experts (:mod:`.apply`).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..runtime import comm
from ..tensor_parallel.mappings import (copy_to_tensor_parallel_region, group_rank, group_size,
                                        reduce_from_tensor_parallel_region)
from ..tensor_parallel.plan import EXPERT_TP_LAYOUT
from ..tensor_parallel.sharding import Shard, mark_sequence_parallel, shard_parameter
from .alltoall import counts_exchange, exchange


#: the dtype the expert ids travel in (its size is :data:`zerokit.theory.experts.EXPERT_ID_BYTES`)
EXPERT_ID_DTYPE = torch.int32

class Expert(nn.Module):
    """One expert: the tiny GPT's MLP (d → 4d → d, GELU), the dense tiny GPT's MLPBlock is this same module."""

    def __init__(self, d_model: int):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class AuxLoss(torch.autograd.Function):
    """Returns ``output``; in backward adds ``weight`` · :attr:`scale` · d(aux) to the graph (the aux loss's own
    gradient). ``scale`` is what the training loop divides the loss by — 1/A over A accumulated micro-batches, set
    around each backward by :func:`backward_scale` (Megatron's ``MoEAuxLossAutoScaler.set_loss_scale``) — so the
    aux loss is averaged over the micro-batches as the loss is."""

    scale = 1.0

    @staticmethod
    def forward(ctx, output, aux, weight):
        ctx.weight = weight
        ctx.save_for_backward(aux)
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad):
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.weight * AuxLoss.scale), None


@contextmanager
def backward_scale(scale: float):
    """Inside: the load-balancing losses' gradients are scaled as the loss was (see :class:`AuxLoss`)."""
    previous, AuxLoss.scale = AuxLoss.scale, float(scale)
    try:
        yield
    finally:
        AuxLoss.scale = previous


class _SumOverGroup(torch.autograd.Function):
    """The sum over ``group`` in forward; in backward the sum of the gradients, since every rank's copy of the sum
    feeds its own loss and the strategy averages the gradients over the group."""

    @staticmethod
    def forward(ctx, x, group, tag):
        ctx.group, ctx.tag = group, tag
        out = x.contiguous().clone()
        comm.all_reduce(out, group=group, tag=tag)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.contiguous().clone()
        comm.all_reduce(out, group=ctx.group, tag=f"{ctx.tag} grad")
        return out, None, None


def _sequence_sums(counts: torch.Tensor, mass: torch.Tensor, group):
    """Per sequence over the cp ranks: the routed slots per expert (no gradient) and the router's probability mass."""
    counts = counts.clone()
    comm.all_reduce(counts, group=group, tag="moe aux counts")
    return counts, _SumOverGroup.apply(mass, group, "moe aux probabilities")


def _count(values: torch.Tensor, n: int) -> torch.Tensor:
    """How many of ``values`` equal each of 0 … n − 1, on their device, with no host sync (``torch.bincount`` on
    CUDA reads the maximum back to size its output)."""
    return torch.zeros(n, dtype=torch.int64, device=values.device).scatter_add_(0, values, torch.ones_like(values))


class MoEMLP(nn.Module):
    """E experts, top-k routing, optional capacity, load-balancing loss; see the module docstring."""

    mixture_of_experts = True  # what zerokit.strategies.blocks.moe_layers looks for

    def __init__(self, d_model: int, n_experts: int, top_k: int = 1, capacity_factor: Optional[float] = None,
                 aux_weight: float = 0.01):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k={top_k!r} must be between 1 and n_experts={n_experts}")
        if capacity_factor is not None and not capacity_factor > 0:
            raise ValueError(f"capacity_factor={capacity_factor!r} must be a positive number or None (dropless)")
        self.n_experts, self.top_k, self.capacity_factor, self.aux_weight = n_experts, top_k, capacity_factor, aux_weight
        self.router = nn.Linear(d_model, n_experts, bias=False)
        #: experts by their global index (as strings): all of them, or this ep rank's share after :meth:`shard`
        self.experts = nn.ModuleDict({str(e): Expert(d_model) for e in range(n_experts)})
        self.group = None
        #: measured in the last forward, kept on the device (read on the host by :attr:`tokens_per_expert` and
        #: :attr:`dropped`, after the step, not inside it): routed slots per expert (global index), dropped slots
        self._tokens_per_expert = torch.zeros(n_experts, dtype=torch.int64)  # host: until the first forward
        self._dropped = torch.zeros((), dtype=torch.int64)  # host: until the first forward
        self.aux = None
        #: measured over every training forward: rows sent to other ep ranks, rows received from them, forwards
        self.exchanged = [0, 0, 0]
        #: tensor parallelism inside the experts (:meth:`split_experts`): the tp group, and whether this rank adds
        #: the experts' output biases (tp rank 0 only: 1.0, else 0.0)
        self.tp_group, self._bias_share = None, 1.0
        #: context parallelism: the cp degree and group (None: every rank) whose ranks hold the other chunks of each
        #: sequence (set by :func:`zerokit.context_parallel.apply_context_parallel`); the load-balancing loss's f_e
        #: and P_e are per whole sequence, so they are summed over it
        self.cp, self.cp_group = 1, None

    @property
    def tokens_per_expert(self) -> torch.Tensor:
        """Routed slots per expert (global index) in the last forward, on the host (measured)."""
        return self._tokens_per_expert.cpu()

    @tokens_per_expert.setter
    def tokens_per_expert(self, value) -> None:  # a peer's layer in this one's place (zerokit.peers.deepspeed_moe)
        self._tokens_per_expert = torch.as_tensor(value)  # host: a peer's counts, read on the host

    @property
    def dropped(self) -> int:
        """Slots the capacity dropped in the last forward (measured)."""
        return int(self._dropped)

    @dropped.setter
    def dropped(self, value) -> None:
        self._dropped = torch.as_tensor(value)  # host: a peer's count, read on the host

    # -- expert parallelism ------------------------------------------------------------
    def shard(self, group) -> None:
        """Keep this rank's E/n experts of the ep ``group`` (None: every rank; the others live on its peers)."""
        group = dist.group.WORLD if group is None else group
        n, r = dist.get_world_size(group), dist.get_rank(group)
        if self.n_experts % n:
            raise ValueError(f"{self.n_experts} experts do not divide over ep = {n} ranks")
        per = self.n_experts // n
        for e in range(self.n_experts):
            if not r * per <= e < (r + 1) * per:
                del self.experts[str(e)]
        self.group = group
        for p in self.experts.parameters():
            p._zerokit_expert = True

    def split_experts(self, group, memo=None, tag: str = "experts") -> None:
        """Tensor parallelism inside every expert over the tp ``group`` (Megatron's expert tensor parallelism, equal
        to tp here): each rank keeps its columns of every expert's ``fc`` and the matching rows of its ``proj``,
        so an expert's output on a rank is a partial sum. The reductions are deferred to the layer, as Megatron
        defers them to its token dispatcher: one ``f`` on the tokens entering the experts (an all-reduce of their
        gradient in backward), one ``g`` on the combined output (an all-reduce in forward), one ``f`` on the gates
        (their gradient is partial too, k fp32 values per token) — instead of an f and a g per expert call. The
        ``proj`` biases are added once, on tp rank 0 (×0 elsewhere, so every rank has the gradient the hooks
        sum over tp). The router stays whole: every tp rank routes the same tokens the same way."""
        if group_size(group) == 1:
            return
        for e, expert in self.experts.items():
            for name, dim in EXPERT_TP_LAYOUT.items():
                layer, attr = name.split(".")
                module = getattr(expert, layer)
                setattr(module, attr, shard_parameter(getattr(module, attr), Shard(dim), group, memo,
                                                      f"{tag}.experts.{e}.{name}"))
            expert.fc.out_features = expert.proj.in_features = expert.fc.weight.shape[0]
            mark_sequence_parallel(expert.proj.bias)  # its gradient lives on tp rank 0 alone: summed over tp
        self.tp_group = dist.group.WORLD if group is None else group  # None: every rank (not "no tp")
        self._bias_share = 1.0 if group_rank(group) == 0 else 0.0

    def owner(self, expert: torch.Tensor) -> torch.Tensor:
        n = 1 if self.group is None else dist.get_world_size(self.group)
        return expert // (self.n_experts // n)

    # -- forward ----------------------------------------------------------------------------
    def forward(self, x):
        b, t, d = x.shape
        probs = torch.softmax(self.router(x).float(), dim=-1)                       # [b, t, E]
        gates, chosen = probs.topk(self.top_k, dim=-1)                                # [b, t, k]
        keep = self._capacity(chosen)                                                 # [b, t, k] bool
        onehot = F.one_hot(chosen, self.n_experts).float()                            # [b, t, k, E]
        counts, mass, whole = onehot.sum(dim=(1, 2)), probs.sum(dim=1), t             # [b, E] per sequence
        if self.cp > 1:  # each cp rank holds chunks of every sequence: the statistics are the sums over them
            (counts, mass), whole = _sequence_sums(counts, mass, self.cp_group), t * self.cp
        f = counts / (whole * self.top_k)
        aux = (self.n_experts * (f * mass / whole).sum(-1)).mean()
        self.aux = aux.detach()
        self._tokens_per_expert = (onehot * keep[..., None]).sum(dim=(0, 1, 2)).long().detach()
        self._dropped = (~keep).sum().detach()
        rows = x.reshape(b * t, d)
        if self.tp_group is not None:  # f on the experts' tokens and gates (see split_experts)
            rows = copy_to_tensor_parallel_region(rows, self.tp_group, "moe experts:f")
            gates = copy_to_tensor_parallel_region(gates, self.tp_group, "moe gates:f")
        slot_token = torch.arange(b * t, device=x.device).repeat_interleave(self.top_k)
        slot_expert, slot_gate = chosen.reshape(-1), gates.reshape(-1)
        if self.capacity_factor is not None:  # one nonzero (a host sync) for the three; dropless keeps every slot
            kept = keep.reshape(-1).nonzero()[:, 0]
            slot_token, slot_expert, slot_gate = slot_token[kept], slot_expert[kept], slot_gate[kept]
        out = self._experts(rows[slot_token], slot_expert) * slot_gate[:, None].to(x.dtype)
        y = torch.zeros_like(rows).index_add(0, slot_token, out)
        if self.tp_group is not None:  # g: the experts' partial sums, summed over tp once per layer
            y = reduce_from_tensor_parallel_region(y, self.tp_group, "moe experts:g")
        y = y.view(b, t, d)
        return AuxLoss.apply(y, aux, self.aux_weight) if self.training and torch.is_grad_enabled() else y

    def _capacity(self, chosen: torch.Tensor) -> torch.Tensor:
        """Which routed slots an expert takes: all (dropless), or the first ⌈c·T·k/E⌉ per expert per sequence."""
        if self.capacity_factor is None:
            return torch.ones_like(chosen, dtype=torch.bool)
        b, t, k = chosen.shape
        cap = math.ceil(self.capacity_factor * t * k / self.n_experts)
        onehot = F.one_hot(chosen.reshape(b, t * k), self.n_experts)                  # slots in token order
        position = (onehot.cumsum(dim=1) * onehot).sum(-1)                            # 1-based place in its expert
        return (position <= cap).view(b, t, k)

    def _experts(self, rows: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        """Each slot's row through its expert: locally, or dispatched to the expert's ep rank and combined back."""
        order = torch.argsort(expert, stable=True)
        rows, expert = rows[order], expert[order]
        if self.group is None:
            out = self._local(rows, expert)
        else:
            n = dist.get_world_size(self.group)
            sent = _count(self.owner(expert), n)
            split = torch.cat([sent, counts_exchange(sent, self.group)]).tolist()  # the host sync the sizes need
            send, recv = split[:n], split[n:]
            me = dist.get_rank(self.group)
            if torch.is_grad_enabled():
                self.exchanged[0] += sum(send) - send[me]
                self.exchanged[1] += sum(recv) - recv[me]
                self.exchanged[2] += 1
            arrived = exchange(rows, send, recv, self.group, "moe dispatch")
            # int32: exact for any expert count (bf16 holds integers exactly only up to 256)
            ids = exchange(expert.to(EXPERT_ID_DTYPE)[:, None], send, recv, self.group, "moe expert ids")[:, 0].long()
            local = torch.argsort(ids, stable=True)
            computed = torch.empty_like(arrived)
            computed = computed.index_copy(0, local, self._local(arrived[local], ids[local]))
            out = exchange(computed, recv, send, self.group, "moe combine")
        return torch.empty_like(out).index_copy(0, order, out)

    def _local(self, rows: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        """Rows sorted by expert, each through its (local) expert."""
        pieces = []
        counts = _count(expert, self.n_experts).tolist()  # the slices' sizes: one host sync
        start = 0
        for e, c in enumerate(counts):
            if str(e) in self.experts:  # every local expert runs, on no rows too: its gradients exist (zeros)
                pieces.append(self._expert(self.experts[str(e)], rows[start:start + c]))
            start += c
        return torch.cat(pieces) if pieces else rows[:0]

    def _expert(self, expert: Expert, rows: torch.Tensor) -> torch.Tensor:
        if self.tp_group is None:
            return expert(rows)
        partial = F.linear(F.gelu(expert.fc(rows)), expert.proj.weight)  # this rank's share of the sum
        return partial + expert.proj.bias * self._bias_share
