"""Backward split in two, as zero-bubble pipelines need it (Qi et al., arXiv 2401.10241).

A stage's backward does two jobs: the gradient of its *input* (which the previous stage
is waiting for) and the gradients of its *weights* (which nobody needs until the
optimizer step). ``I`` does the first now; ``W`` does the second later, in what would
otherwise be the bubble.

Lifecycle, per (stage, micro-batch):

1. forward: :class:`WeightOutputs` keeps the output of every module that owns
   parameters (a Linear, a LayerNorm, an Embedding): the tensor its weight gradient is
   computed from.
2. ``I`` (:func:`input_backward`): one ``torch.autograd.grad`` from the stage's output
   (or loss) to its input *and* those module outputs, the graph retained. Autograd runs
   only the nodes on the way to what was asked for, and a node such as ``addmm`` skips
   the weight half of its work when the weight's gradient is not requested.
3. ``W`` (:func:`weight_backward`): for each kept module output, ``torch.autograd.backward``
   from it with its gradient, restricted (``inputs=``) to that module's own parameters,
   which runs just the local weight-gradient nodes; the references are then dropped, so
   the graph and its saved activations are freed.

A parameter that no module owns directly (used in a parent's forward) falls back to a
backward from the stage output restricted to it, which re-walks the graph: correct,
but it costs a second backward. torch's pipelining splits the same way, at the
"weight nodes" of the graph.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn


class WeightOutputs:
    """Forward hooks that keep, per micro-batch, each parameter-owning module's output."""

    def __init__(self, stage: nn.Module):
        self.owners: List[Tuple[nn.Module, List[nn.Parameter]]] = []
        owned = set()
        for module in stage.modules():
            params = [p for p in module.parameters(recurse=False) if p.requires_grad]
            if params:
                self.owners.append((module, params))
                owned.update(id(p) for p in params)
        #: trainable parameters used outside any owner's own forward: the slow fallback in W
        self.orphans = [p for p in stage.parameters() if p.requires_grad and id(p) not in owned]
        self._current: Optional[list] = None
        self._hooks = [module.register_forward_hook(self._keep) for module, _ in self.owners]

    def _keep(self, module, inputs, output) -> None:
        if self._current is not None and torch.is_tensor(output) and output.requires_grad:
            self._current.append((output, [p for m, ps in self.owners if m is module for p in ps]))

    def capture(self) -> list:
        """Start a micro-batch's forward: its (output, parameters) pairs are appended to the list returned."""
        self._current = []
        return self._current

    def stop(self) -> None:
        self._current = None

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()


def input_backward(root: torch.Tensor, grad: Optional[torch.Tensor], stage_input: Optional[torch.Tensor],
                   kept: list) -> Dict[str, object]:
    """``I``: the input's gradient now; the gradients of the kept module outputs saved for ``W``."""
    wants_input = stage_input is not None and stage_input.requires_grad
    targets = ([stage_input] if wants_input else []) + [out for out, _ in kept]
    grads = torch.autograd.grad(root, targets, grad_outputs=grad, retain_graph=True, allow_unused=True) \
        if targets else []
    input_grad = grads[0] if wants_input else None
    outputs = grads[1:] if wants_input else grads
    return {"input_grad": input_grad, "pending": [(out, g, params) for (out, params), g in zip(kept, outputs)
                                                 if g is not None]}


def weight_backward(pending: list, root: torch.Tensor, grad: Optional[torch.Tensor],
                    orphans: List[nn.Parameter]) -> None:
    """``W``: every weight gradient, accumulated into ``.grad`` as a full backward would."""
    for out, g, params in pending:
        torch.autograd.backward(out, g, inputs=params, retain_graph=True)
    if orphans:
        torch.autograd.backward(root, grad, inputs=list(orphans), retain_graph=True)
