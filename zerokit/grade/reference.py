"""The single-process references the graders compare with, and the comparisons themselves.

Lifecycle: a scenario builds its model with :func:`mlp` (or :func:`tied_lm`) from a fixed
seed on every rank, trains on its share of :func:`batch`; the judge, in the grader's
process, builds the same model, trains it on the whole batch in one process
(:func:`train_single`) and compares tensors by name (:func:`worst`), reporting the
largest difference, the tensor and the rank — the tensor placed in the grader's model, which
the learner never saw (:func:`describe_model`, :func:`describe_parameter`). Exact parity is not possible across ranks:
the gradients are summed in another order, so the tolerances below are fp32's.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

#: largest absolute difference accepted after a few steps (fp32, the ranks sum in another order)
PARAM_ATOL = 1e-5
GRAD_ATOL = 1e-6


def mlp(sizes: Sequence[int] = (8, 16, 16, 16, 4), seed: int = 0) -> nn.Sequential:
    """Linear layers with tanh between them, initialised from ``seed`` (the same on every rank): an
    ``nn.Sequential`` whose parameters are named by position — ``0.weight``, ``0.bias``, … ``6.bias``."""
    torch.manual_seed(seed)
    layers: List[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


class TiedLM(nn.Module):
    """A tiny language model whose output head *is* its token embedding (GPT-2's tied weights)."""

    def __init__(self, vocab: int = 16, d: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.mix = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.mix(self.embed(tokens))))


def tied_lm(seed: int = 0) -> TiedLM:
    torch.manual_seed(seed)
    return TiedLM()


def batch(step: int, rows: int = 12, d_in: int = 8, d_out: int = 4, seed: int = 100) -> Tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: inputs and regression targets, the same on every rank."""
    g = torch.Generator().manual_seed(seed + step)
    return torch.randn(rows, d_in, generator=g), torch.randn(rows, d_out, generator=g)


def token_batch(step: int, rows: int = 12, vocab: int = 16, seed: int = 200) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + step)
    return torch.randint(0, vocab, (rows,), generator=g), torch.randint(0, vocab, (rows,), generator=g)


def mse(out, target):
    return F.mse_loss(out, target)


def cross_entropy(out, target):
    return F.cross_entropy(out, target)


def local_rows(rows: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous 1/N of a batch of ``rows`` (rows divisible by N)."""
    per = rows // world_size
    return slice(rank * per, (rank + 1) * per)


def named_params(model: nn.Module) -> Dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def named_grads(model: nn.Module) -> Dict[str, Optional[torch.Tensor]]:
    return {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}


def train_single(make_model: Callable[[], nn.Module], steps: int, make_optimizer: Callable, get_batch: Callable,
                 loss_fn: Callable = mse) -> dict:
    """One process, the whole batch: ``{"grads": [per step {name: grad}], "params": {name: tensor}}``."""
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    grads = []
    for step in range(steps):
        x, y = get_batch(step)
        loss_fn(model(x), y).backward()
        grads.append(named_grads(model))
        optimizer.step()
        optimizer.zero_grad()
    return {"grads": grads, "params": named_params(model), "model": model}


# --- the grader's model, in the learner's words -----------------------------------------------------------------

def _layer(module: nn.Module) -> str:
    if isinstance(module, nn.Linear):
        return f"Linear({module.in_features}, {module.out_features})"
    if isinstance(module, nn.Embedding):
        return f"Embedding({module.num_embeddings}, {module.embedding_dim})"
    return type(module).__name__


def describe_model(model: nn.Module, what: str = "the grader's model") -> str:
    """``what`` and its layers by the names its parameters carry: ``"the grader's MLP: 0 Linear(8, 16) → 1 Tanh
    → … → 6 Linear(16, 4)"`` — so that a parameter called ``6.bias`` is a layer the learner can picture."""
    layers = " → ".join(f"{name} {_layer(child)}" for name, child in model.named_children())
    return f"{what}: {layers}" if layers else what


_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def describe_parameter(model: nn.Module, name: str) -> str:
    """``"6.bias"`` → ``"6.bias, the bias of the last Linear (Linear(16, 4)), shape (4,)"``: which layer of the
    grader's model a parameter belongs to, and its shape. A name the model does not hold is returned as it is."""
    params = dict(model.named_parameters())
    if name not in params:
        return name
    path, _, attr = name.rpartition(".")
    module = model.get_submodule(path) if path else model
    same = [m for m in model.modules() if type(m) is type(module)]
    k = next(i for i, m in enumerate(same) if m is module)
    place = ("the only" if len(same) == 1 else "the last" if k == len(same) - 1
             else f"the {_ORDINALS[k]}" if k < len(_ORDINALS) else f"number {k + 1} of the")
    return f"{name}, the {attr} of {place} {type(module).__name__} ({_layer(module)}), shape {tuple(params[name].shape)}"


def flat(tensors: Dict[str, torch.Tensor]) -> torch.Tensor:
    """The tensors in order, flattened and concatenated (a flat buffer's layout without padding)."""
    return torch.cat([t.reshape(-1) for t in tensors.values()])


def worst(measured: Dict[str, torch.Tensor], reference: Dict[str, torch.Tensor]) -> Tuple[float, str]:
    """The largest absolute difference between same-named tensors, and the name where it is."""
    diff, where = 0.0, ""
    for name, ref in reference.items():
        got = measured.get(name)
        if got is None:
            return float("inf"), name
        if got.shape != ref.shape:
            return float("inf"), f"{name} (shape {tuple(got.shape)}, expected {tuple(ref.shape)})"
        d = float((got.float() - ref.float()).abs().max()) if ref.numel() else 0.0
        if d > diff or d != d:
            diff, where = d, name
    return diff, where


def ratio(measured: torch.Tensor, reference: torch.Tensor) -> Optional[float]:
    """measured / reference when one is a multiple of the other (to 1e-4), else None."""
    scale = float(reference.abs().max())
    if scale == 0:
        return None
    k = float((measured * reference).sum() / (reference * reference).sum())
    return k if float((measured - k * reference).abs().max()) <= 1e-4 * scale * max(1.0, abs(k)) else None


def describe_multiple(k: Optional[float], n: int) -> str:
    """What a gradient that is k times the reference says about the reduction."""
    if k is None:
        return ""
    if abs(k - n) < 1e-3:
        return f"it is {n}× the reference (N = {n}): the gradients were summed over the ranks but not divided by N"
    if abs(k - 1 / n) < 1e-3:
        return f"it is 1/{n} of the reference: divided by N without summing over the ranks, or divided twice"
    if abs(k - 1) < 1e-3:
        return "it equals the reference"
    return f"it is {k:.3g}× the reference"
