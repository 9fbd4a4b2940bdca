"""Workloads: a model factory, a deterministic global batch per step, and a loss.

Every strategy and the single-process reference build the same model from the same
seed and read the same global batch at each step, so their parameters can be
compared after training. Each rank trains on its share of the global batch.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .expert_parallel.moe import Expert, MoEMLP
from .tensor_parallel import tiny_gpt_plan


@dataclass
class Workload:
    """What to train: ``model_fn() -> nn.Module``, ``batch_fn(step) -> (inputs, targets)`` for
    the *global* batch of that step, and ``loss_fn(outputs, targets) -> scalar`` (a mean)."""

    name: str
    model_fn: Callable[[], nn.Module]
    batch_fn: Callable[[int], Tuple[torch.Tensor, torch.Tensor]]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    seed: int = 0
    description: str = ""
    #: ``tensor_parallel_plan(sequence_parallel) -> zerokit.tensor_parallel.Plan``: how the model is split over
    #: the mesh's ``tp`` axis (None: the workload can't run with tp > 1)
    tensor_parallel_plan: Optional[Callable[[bool], Any]] = None

    def build_model(self) -> nn.Module:
        """The model, initialised from ``seed`` (the same on every rank)."""
        torch.manual_seed(self.seed)
        return self.model_fn()

    def batch(self, step: int):
        return self.batch_fn(step)

    @property
    def batch_size(self) -> int:
        return int(self.batch(0)[0].shape[0])

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(outputs, targets)

    def param_count(self) -> int:
        return sum(p.numel() for p in self.build_model().parameters())


def _generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


# --- tiny GPT ------------------------------------------------------------------------------

class CausalSelfAttention(nn.Module):
    #: context parallelism's attention over every cp rank's keys (:mod:`zerokit.context_parallel`); None: local
    context = None

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model={d_model} must be divisible by n_head={n_head}")
        self.n_head = n_head
        self.head_dim = d_model // n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        # sizes come from the qkv output, not from x: under tensor parallelism this rank holds
        # only its heads, and under sequence parallelism x is a slice of the sequence
        qkv = self.qkv(x)
        b, s = qkv.shape[:2]
        q, k, v = qkv.chunk(3, dim=-1)
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if self.context is not None:
            y = self.context(q, k, v)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


class MLPBlock(Expert):
    """The dense block's MLP (d → 4d → d, GELU): the same module a mixture of experts holds one of per expert."""


class Block(nn.Module):
    """A pre-norm block; ``dropout`` > 0 adds GPT-2's residual dropout after attention and after
    the MLP (at 0, the default, there is no dropout module and the block is unchanged)."""

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.0, moe: Optional[dict] = None):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.ln2 = nn.LayerNorm(d_model)
        if moe:  # a mixture of experts in place of the MLP (zerokit.expert_parallel)
            self.mlp = MoEMLP(d_model, **moe)
        else:
            self.mlp = MLPBlock(d_model)
        self.resid_dropout = nn.Dropout(dropout) if dropout else None

    def _dropout(self, y):
        return y if self.resid_dropout is None else self.resid_dropout(y)

    def forward(self, x):
        x = x + self._dropout(self.attn(self.ln1(x)))
        return x + self._dropout(self.mlp(self.ln2(x)))


class _Embeddings(nn.Module):
    """Token + position embeddings: the pipeline's first piece."""

    def __init__(self, tok: nn.Embedding, pos: nn.Embedding):
        super().__init__()
        self.tok, self.pos = tok, pos

    def forward(self, idx):
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class _Head(nn.Module):
    """Final LayerNorm + output head: the pipeline's last piece."""

    def __init__(self, ln_f: nn.LayerNorm, head: nn.Linear):
        super().__init__()
        self.ln_f, self.head = ln_f, head

    def forward(self, x):
        return self.head(self.ln_f(x))


class TinyGPT(nn.Module):
    """A GPT-2-shaped decoder: token + position embeddings, pre-norm blocks, a head.

    ``tie_weights=True`` shares one tensor between the token embedding and the output
    head, as GPT-2 does: the parameter appears in two modules, used at both ends of the
    model, and gets its gradient from both. ``dropout`` > 0: each block's residual
    dropout (:class:`Block`).
    """

    def __init__(self, vocab: int, seq_len: int, d_model: int, n_layer: int, n_head: int,
                 tie_weights: bool = False, dropout: float = 0.0, moe: Optional[dict] = None):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head, dropout, moe) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        if tie_weights:
            self.head.weight = self.tok.weight

    #: the global positions of this rank's tokens under context parallelism; None: 0 … T−1
    positions = None

    def forward(self, idx):
        pos = self.positions if self.positions is not None else torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def pipeline_pieces(self):
        """(first, blocks, last) for pipeline parallelism: embeddings, the blocks, final norm + head."""
        return ([("embed", _Embeddings(self.tok, self.pos))],
                [(f"blocks.{i}", block) for i, block in enumerate(self.blocks)],
                [("head", _Head(self.ln_f, self.head))])


def _tiny_gpt_tensor_parallel_plan(sequence_parallel: bool, experts: bool = False):

    return tiny_gpt_plan(sequence_parallel, experts=experts)


def _lm_loss(logits, targets):
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def tiny_gpt(vocab: int = 512, seq_len: int = 64, d_model: int = 128, n_layer: int = 4, n_head: int = 4,
             batch_size: int = 8, seed: int = 0, tie_weights: bool = False, dropout: float = 0.0,
             n_experts: int = 0, top_k: int = 1, capacity_factor: Optional[float] = None,
             aux_weight: float = 0.01) -> Workload:
    """A tiny GPT (about 1 M parameters by default) on random tokens with a learnable pattern;
    ``tie_weights=True`` shares the token embedding with the output head (GPT-2). ``dropout`` > 0
    adds GPT-2's residual dropout in every block (for measuring its activation memory: the
    masks are random, so a run no longer matches the single-process reference). ``n_experts`` > 0
    makes every MLP a mixture of that many experts, each token routed to ``top_k``
    (:class:`zerokit.expert_parallel.moe.MoEMLP`: ``capacity_factor`` None is dropless,
    ``aux_weight`` the load-balancing loss's)."""
    if isinstance(n_experts, bool) or not isinstance(n_experts, int) or n_experts < 0:
        raise ValueError(f"tiny_gpt: n_experts={n_experts!r} must be an integer >= 0 (0: a dense MLP)")
    moe = dict(n_experts=n_experts, top_k=top_k, capacity_factor=capacity_factor,
               aux_weight=aux_weight) if n_experts else None
    if not isinstance(tie_weights, bool):
        raise ValueError(f"tiny_gpt: tie_weights={tie_weights!r} must be True or False")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(f"tiny_gpt: dropout={dropout!r} must be a probability in [0, 1)")
    for name, value in dict(vocab=vocab, seq_len=seq_len, d_model=d_model, n_layer=n_layer,
                            n_head=n_head, batch_size=batch_size).items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"tiny_gpt: {name}={value!r} must be a positive integer")

    def batch(step):
        g = _generator(seed, step)
        start = torch.randint(0, vocab, (batch_size, 1), generator=g)
        stride = torch.randint(1, 8, (batch_size, 1), generator=g)
        tokens = (start + stride * torch.arange(seq_len + 1)) % vocab
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    return Workload(
        name=f"tiny-gpt-{n_layer}x{d_model}" + ("-tied" if tie_weights else "") + (f"-moe{n_experts}" if n_experts else ""),
        model_fn=lambda: TinyGPT(vocab, seq_len, d_model, n_layer, n_head, tie_weights, dropout, moe),
        batch_fn=batch, loss_fn=_lm_loss, seed=seed,
        tensor_parallel_plan=functools.partial(_tiny_gpt_tensor_parallel_plan, experts=bool(n_experts)),
        description=f"GPT: {n_layer} layers, d_model {d_model}, {n_head} heads, vocab {vocab}, "
                    f"sequence {seq_len}, global batch {batch_size}"
                    + (", embedding tied to the head" if tie_weights else "")
                    + (f", residual dropout {dropout}" if dropout else "")
                    + (f", {n_experts} experts top-{top_k}" if n_experts else ""))


# --- MLP -----------------------------------------------------------------------------------

def mlp(sizes: Sequence[int] = (32, 64, 64, 10), batch_size: int = 16, seed: int = 0) -> Workload:
    """An MLP classifier on Gaussian inputs; ``sizes`` are the layer widths, input first."""
    sizes = list(sizes)
    if len(sizes) < 2 or any(not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"mlp: sizes={sizes!r} must be at least two positive integers")

    def model():
        layers = []
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.Tanh())
        return nn.Sequential(*layers)

    def batch(step):
        g = _generator(seed, step)
        x = torch.randn(batch_size, sizes[0], generator=g)
        y = torch.randint(0, sizes[-1], (batch_size,), generator=g)
        return x, y

    return Workload(name="mlp-" + "-".join(map(str, sizes)), model_fn=model, batch_fn=batch,
                    loss_fn=lambda out, y: F.cross_entropy(out.float(), y), seed=seed,
                    description=f"MLP {sizes}, global batch {batch_size}")


BUILTIN = {"tiny-gpt": tiny_gpt, "mlp": mlp}
