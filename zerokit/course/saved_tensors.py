"""What autograd saves for backward, tensor by tensor, and which module saved it (lesson 02).

Lifecycle of one recording (:func:`saved_tensors`): the workload's model is built (cast to
bf16 for ``bf16-mixed``, as zerokit's mixed precision holds it), every module gets a
forward pre-hook and a forward hook that keep a stack of the modules running, and one
forward pass plus the workload's loss runs under ``torch.autograd.graph.saved_tensors_hooks``:
each tensor autograd saves is recorded once per storage (as the memory ledger counts
them), with the innermost module running when it was saved, its shape, dtype and bytes.
Parameters saved for backward (a linear layer's weight) are left out: they are counted
as parameters. Nothing goes backward; the hooks are removed at the end.

``attention="math"`` runs ``scaled_dot_product_attention`` on torch's unfused math path,
which materialises the softmax; ``"fused"`` (the default) lets torch pick its fused kernel,
which saves only a log-sum-exp per head and row. :func:`bytes_by_module` sums the records.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List

ATTENTION = ("fused", "math")


def saved_tensors(workload, precision: str = "bf16-mixed", attention: str = "fused", step: int = 0) -> List[dict]:
    """Every storage autograd saves in one forward + loss of ``workload``'s whole batch, one dict each (measured).

    Keys: ``module`` (innermost running module; "model" for the root, "loss" outside the model),
    ``shape``, ``dtype``, ``bytes`` (the storage's bytes).
    """
    import torch

    if attention not in ATTENTION:
        raise ValueError(f"attention={attention!r}; allowed: {', '.join(ATTENTION)}")
    if precision not in ("fp32", "bf16-mixed"):
        raise ValueError(f"precision={precision!r}; allowed: fp32, bf16-mixed")
    torch.manual_seed(0)
    model = workload.build_model()
    if precision == "bf16-mixed":
        model = model.to(torch.bfloat16)
    inputs, targets = workload.batch(step)
    stack: list = []
    names = {m: name or "model" for name, m in model.named_modules()}

    def enter(module, _inputs):
        stack.append(names[module])

    def leave(module, _inputs, _output):
        stack.pop()

    hooks = [h for m in names for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    records: Dict[int, dict] = {}

    def pack(t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in params and key not in records:
            records[key] = {"module": stack[-1] if stack else "loss", "shape": tuple(t.shape),
                            "dtype": str(t.dtype).replace("torch.", ""), "bytes": storage.nbytes()}
        return t

    if attention == "math":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        kernel = sdpa_kernel(SDPBackend.MATH)
    else:
        kernel = contextlib.nullcontext()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), kernel:
            loss = workload.loss(model(inputs), targets)
        del loss
    finally:
        for hook in hooks:
            hook.remove()
    return list(records.values())


def bytes_by_module(records: List[dict], prefix: str = "") -> Dict[str, int]:
    """Bytes per module of the records whose module starts with ``prefix``, in the order they were saved."""
    out: Dict[str, int] = {}
    for r in records:
        if r["module"].startswith(prefix):
            out[r["module"]] = out.get(r["module"], 0) + r["bytes"]
    return out
