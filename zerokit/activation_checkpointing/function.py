"""zerokit's recompute mechanism: a checkpointed call keeps its inputs and the RNG state, nothing else.

The lifecycle of one checkpointed call (a block, a segment of blocks, an attention core), as
in torch's non-reentrant ``torch.utils.checkpoint`` and Chen et al. (arXiv 1604.06174):

1. **open** (:class:`Frame`): before the call runs, the frame keeps its tensor inputs
   (detached; the call's *boundary*) and the RNG state — CPU, and each CUDA device an input
   lives on — and pushes saved-tensor hooks.
2. **forward**: the call runs as usual, with grad enabled, building the autograd graph that
   backward will use; every tensor autograd wants to save for backward goes to the frame's
   ``pack`` hook, which records its shape and dtype and *drops* it (the graph holds a slot
   number). The activations die as soon as nothing else uses them. A call for which autograd
   saved nothing (neither its inputs nor its parameters need a gradient) is refused:
   checkpointing it has no effect.
3. **close**: the hooks are popped; the frame lives on in the graph's slots.
4. **recompute** (backward, the first ``unpack`` of a slot): with the RNG state restored in a
   forked RNG (so dropout draws the same masks and the training stream is not advanced), with
   grad enabled, the call runs again on its kept inputs and every tensor it saves is recorded
   in order; each must match its slot's shape and dtype. ``recomputes`` counts the forward
   calls re-run.
5. **backward**: each ``unpack`` hands out its recorded tensor once and forgets it. Gradients
   flow through the *original* graph, so every parameter's gradient is accumulated once per
   backward and every hook on it — DDP's and ZeRO's post-accumulate-grad hooks, tensor
   parallelism's gradient hooks — fires once, as without checkpointing. (A reentrant
   function, which back-propagates through the recomputed graph in a nested backward, would
   fire a parameter's tensor hooks twice and run the nested part in another graph task.)
   A slot unpacked again (``retain_graph=True``) recomputes again.

Accounting: the kept inputs and the recomputed tensors are handed to whatever saved-tensor
hooks were active outside the frame (a :class:`~zerokit.runtime.memory.MemoryLedger`
watching activations counts them; dropped tensors it never sees). The recompute runs the
call through ``nn.Module.__call__``, so module hooks fire again inside backward: ZeRO-3's
pre-forward hook gathers a freed unit for it.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, List, Optional

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten


def outer_hooks():
    """The (pack, unpack) saved-tensor hooks active now, or None (torch's private accessor; None if absent)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top(False) if top is not None else None


class _Kept:
    """One tensor a frame holds: packed by the outer hooks (so whoever watches outside counts it), or as is."""

    __slots__ = ("packed", "unpack")

    def __init__(self, t: torch.Tensor, hooks):
        if hooks is None:
            self.packed, self.unpack = t, None
        else:
            self.packed, self.unpack = hooks[0](t), hooks[1]

    def get(self) -> torch.Tensor:
        return self.packed if self.unpack is None else self.unpack(self.packed)


class RNGState:
    """The CPU generator's state and that of every CUDA device the inputs live on."""

    def __init__(self, tensors: List[torch.Tensor]):
        self.cuda_devices = sorted({t.device.index or 0 for t in tensors if t.is_cuda})
        self.cpu = torch.get_rng_state()
        self.cuda = [torch.cuda.get_rng_state(d) for d in self.cuda_devices]

    @contextmanager
    def restored(self):
        """Run with the captured state in a forked RNG: the caller's streams continue untouched afterwards."""
        with torch.random.fork_rng(devices=self.cuda_devices):
            torch.set_rng_state(self.cpu)
            for device, state in zip(self.cuda_devices, self.cuda):
                torch.cuda.set_rng_state(state, device)
            yield


class _Slot:
    """What the graph holds instead of a dropped tensor."""

    __slots__ = ("frame", "index")

    def __init__(self, frame: "Frame", index: int):
        self.frame, self.index = frame, index


def _never_unpacked(_):
    raise RuntimeError("a tensor saved while recomputing a checkpointed call was unpacked; the recomputed graph "
                       "is only read for its saved tensors")


class Frame:
    """One checkpointed call: its kept inputs, RNG state and the slots of the tensors it dropped.

    ``run(*args, **kwargs)`` recomputes the call; ``label`` names it in errors; ``forwards``
    is how many forward calls one recompute re-runs (the blocks of a segment), added to
    ``counter.recomputed_forwards`` at each recompute.
    """

    def __init__(self, run: Callable, args: tuple, kwargs: dict, label: str, counter, forwards: int = 1):
        self.run, self.label, self.counter, self.forwards = run, label, counter, forwards
        flat, self._spec = tree_flatten((args, kwargs))
        hooks = outer_hooks()
        tensors = [t for t in flat if torch.is_tensor(t)]
        self._inputs = [(_Kept(t.detach(), hooks), t.requires_grad) if torch.is_tensor(t) else (t, None)
                        for t in flat]
        #: for each input, the position of its first occurrence: one tensor passed twice (self-attention's
        #: query, key and value) is one tensor again in the recompute, where a callee may test ``q is k``
        first: dict = {}
        self._same_as = [first.setdefault(id(t), i) if torch.is_tensor(t) else i for i, t in enumerate(flat)]
        self.rng = RNGState(tensors)
        self._autocast = {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")}
        self._meta: List[tuple] = []
        self._recomputed: dict = {}
        self._hooks: Optional[torch.autograd.graph.saved_tensors_hooks] = None

    # -- forward ------------------------------------------------------------------------
    def open(self) -> None:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()

    def close(self, check: bool = True) -> None:
        """Pop the hooks; ``check``: refuse a call for which autograd saved nothing."""
        if self._hooks is None:
            return
        self._hooks.__exit__(None, None, None)
        self._hooks = None
        if check and not self._meta and torch.is_grad_enabled():
            raise ValueError(f"checkpointing {self.label} has no effect: autograd saved nothing for its backward "
                             f"because neither its inputs nor its parameters require a gradient; leave it out "
                             f"of the checkpointing policy (or make something in it trainable)")

    @property
    def saved(self) -> int:
        """How many tensors autograd asked to save during the forward (all dropped)."""
        return len(self._meta)

    def _pack(self, t: torch.Tensor) -> _Slot:
        self._meta.append((tuple(t.shape), t.dtype))
        return _Slot(self, len(self._meta) - 1)

    # -- backward -----------------------------------------------------------------------
    def _unpack(self, slot: _Slot) -> torch.Tensor:
        if slot.index not in self._recomputed:
            self._recompute()
        t = self._recomputed.pop(slot.index).get()
        if (tuple(t.shape), t.dtype) != self._meta[slot.index]:
            raise RuntimeError(f"checkpointing {self.label}: the recompute saved a different tensor at position "
                               f"{slot.index} ({tuple(t.shape)}, {t.dtype}) than the forward "
                               f"{self._meta[slot.index]}; the call must do the same work when run again")
        return t

    def _recompute(self) -> None:
        flat = []
        for i, (value, requires_grad) in enumerate(self._inputs):
            if self._same_as[i] != i:
                flat.append(flat[self._same_as[i]])
            elif requires_grad is None:
                flat.append(value)
            else:
                flat.append(value.get().detach().requires_grad_(requires_grad))
        args, kwargs = tree_unflatten(flat, self._spec)
        hooks = outer_hooks()  # the watcher active now, in backward (if any)
        recorded: List[_Kept] = []

        def pack(t):
            # detached: a tensor with a grad_fn would keep the recomputed graph (whose saved variables hold
            # this hook, and so ``recorded``) alive in a cycle through C++ that Python's collector can't see
            recorded.append(_Kept(t.detach() if t.requires_grad else t, hooks))

        with self.rng.restored(), _autocast(self._autocast), torch.enable_grad(), \
                torch.autograd.graph.saved_tensors_hooks(pack, _never_unpacked):
            self.run(*args, **kwargs)
        if len(recorded) != len(self._meta):
            raise RuntimeError(f"checkpointing {self.label}: the recompute saved {len(recorded)} tensors, the "
                               f"forward {len(self._meta)}; the call must do the same work when run again")
        self._recomputed = dict(enumerate(recorded))
        self.counter.recomputed_forwards += self.forwards


@contextmanager
def _autocast(states: dict):
    """Recompute under the autocast settings the forward ran with."""
    with torch.autocast("cpu", enabled=states["cpu"][0], dtype=states["cpu"][1]):
        if torch.cuda.is_available():
            with torch.autocast("cuda", enabled=states["cuda"][0], dtype=states["cuda"][1]):
                yield
        else:
            yield


class Counter:
    """Recomputed forward calls, readable by a test or a rank's result."""

    def __init__(self):
        self.recomputed_forwards = 0


def checkpoint(function: Callable, *args, label: Optional[str] = None, counter: Optional[Counter] = None,
               **kwargs):
    """Run ``function(*args, **kwargs)`` keeping only its inputs and RNG state; recompute it in backward.

    Under ``torch.no_grad()`` it just runs ``function``. Raises ValueError if autograd saved
    nothing for the call (nothing in it needs a gradient: checkpointing would have no effect).
    """
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)
    frame = Frame(function, args, kwargs, label or getattr(function, "__name__", repr(function)),
                  counter if counter is not None else Counter())
    frame.open()
    try:
        out = function(*args, **kwargs)
    except BaseException:
        frame.close(check=False)
        raise
    frame.close()
    return out
