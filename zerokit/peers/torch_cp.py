"""``torch-ring``: context parallelism's ring attention by torch's own implementation, below ``context_parallel``.

torch's public API, ``torch.distributed.tensor.experimental.context_parallel``, does not run on
the CPU: it patches ``F.scaled_dot_product_attention`` to take DTensors sharded on the sequence,
and on the CPU SDPA dispatches to ``aten._scaled_dot_product_flash_attention_for_cpu``, for which
DTensor has no sharding strategy (``NotImplementedError: Operator
aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy
registered``); its handler maps only the CUDA kernels (flash, memory-efficient, cuDNN). What the
API dispatches to on a GPU — ``_templated_ring_attention`` and ``_templated_ring_attention_backward``
in ``torch.distributed.tensor.experimental._context_parallel._attention``, private — takes the
attention kernel as an argument, and runs with the CPU's flash kernel. This peer calls those two
functions: torch's ring, torch's load balancing, torch's online-softmax merge, the CPU kernel.
Private functions: a torch release may rename them (the peer then fails at setup, naming them).

The peer of ``ddp`` with ``parallel={"cp": N}, cp_attention="ring"``: the same data-parallel
reduction (zerokit's ``ddp`` over dp × cp), the same tokens per rank — torch's head-tail load
balancer gives rank r the chunks r and 2·cp − 1 − r, zerokit's zig-zag layout
(:mod:`zerokit.context_parallel.layout`) — and the attention of every layer run by torch's ring
instead of :func:`zerokit.context_parallel.ring_attention`. Lifecycle:

1. **setup**: the training loop has given each attention core zerokit's ring
   (``cp_attention="ring"`` is required, so that the loop's cp formula is the ring's); the peer
   replaces it with :class:`TorchRing` on the mesh's ``cp`` group and sets torch's options:
   load balancing on (causal), ``rotate_method`` (option: ``"alltoall"``, the ring, each step
   passing K and V to the next rank; or ``"allgather"``, torch's default, one all-gather of every
   rank's K and V);
2. **forward**: ``_templated_ring_attention`` — cp steps, each a CPU flash call on the local
   queries and the K/V block held, merged by log-sum-exp (skipping the half of a block the causal
   mask hides), the next block's exchange launched before the step's compute;
3. **backward**: ``_templated_ring_attention_backward`` — the blocks again, and dK, dV travelling
   with them (an all-to-all each step) until they reach their rank; zerokit's ``ddp`` then reduces
   the weights' gradients.

torch's exchanges are functional collectives (``permute_tensor``: an ``all_to_all_single`` whose
whole input goes to one peer; ``all_gather_into_tensor``). :class:`LedgeredRing` records them on
the ``cp`` axis: an all-to-all's ring cost is the rows that leave the rank (here all of them, as
zerokit's send), an all-gather's by the ring formula. Both rotations send the formula's bytes,
:func:`zerokit.theory.ring_attention_bytes` (forward 2(cp − 1) blocks, backward 4(cp − 1) + 2).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..context_parallel.apply import attention_modules
from ..context_parallel.ring_attention import ring_attention
from ..data_parallel.overlap import OverlappedDataParallel
from ..runtime import comm
from ..strategies.base import Option, register
from .recording import LedgeredFunctionalCollectives

_FUNCOL = torch.ops._c10d_functional
ROTATIONS = ("alltoall", "allgather")


def _private():
    """torch's ring-attention functions below ``context_parallel`` (private; named in the error if they move)."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention
        return _attention, _attention._templated_ring_attention, _attention._templated_ring_attention_backward
    except (ImportError, AttributeError) as e:
        raise RuntimeError(f"strategy 'torch-ring' calls torch's private _templated_ring_attention and "
                           f"_templated_ring_attention_backward (torch.distributed.tensor.experimental."
                           f"_context_parallel._attention); this torch ({torch.__version__}) has not them: {e}") from e


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, core):
        _, ring, _ = _private()
        q, k, v = (t.contiguous() for t in (q, k, v))
        with core.recording():
            out, lse = ring(core.group, 2, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, q, k, v,
                            is_causal=True)[:2]
        ctx.core = core
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        _, _, ring_backward = _private()
        q, k, v, out, lse = ctx.saved_tensors
        with ctx.core.recording():
            dq, dk, dv = ring_backward(ctx.core.group, 2,
                                       torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward,
                                       grad.contiguous(), "grad_out", q, k, v, out, lse, is_causal=True,
                                       dropout_p=0.0)[:3]
        return dq, dk, dv, None


class TorchRing:
    """What the attention core calls (``context(q, k, v)``, ``[b, h, s/cp, d]``): torch's ring on the cp group, its
    collectives recorded (the dispatch mode only around the ring's own calls, not the rest of the model)."""

    def __init__(self, mesh, tag: str):
        self.mesh, self.tag = mesh, tag
        group = mesh.group("cp")  # None where cp spans the world: torch's ring wants the group itself
        self.group = dist.group.WORLD if group is None else group

    def recording(self):
        return LedgeredRing(self.mesh, "cp", self.tag)

    def __call__(self, q, k, v):
        return _Ring.apply(q, k, v, self)


class LedgeredRing(LedgeredFunctionalCollectives):
    """:class:`.recording.LedgeredFunctionalCollectives` on ``cp``, also recording ``all_to_all_single`` (torch's
    ring passes blocks by ``permute_tensor``): ring cost = the rows that leave the rank."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.OpOverload) and func._overloadpacket is _FUNCOL.all_to_all_single \
                and not self._inside:
            tensor, out_splits, in_splits, group_name = args[:4]
            group = self._group(group_name)
            row = tensor[0].numel() * tensor.element_size() if tensor.dim() else tensor.element_size()
            record = comm.new_record("all_to_all", tensor, tensor.numel() * tensor.element_size(), group, True,
                                     tag=f"{self.tag} {func._overloadpacket._qualified_op_name}")
            me = self._ranks.index(dist.get_rank())
            record.ring_cost_bytes = (sum(in_splits) - in_splits[me]) * row
            return self.run_recorded(func, args, kwargs, record)
        return super().__torch_dispatch__(func, types, args, kwargs)


class TorchRingPeer(OverlappedDataParallel):
    """zerokit's ``ddp`` over dp × cp with torch's ring attention (``_templated_ring_attention``) in every layer."""

    name = "torch-ring"
    peer = True
    axes = ("dp", "cp")
    options = {**OverlappedDataParallel.options,
               "rotate_method": Option("alltoall", lambda x: x in ROTATIONS,
                                       "'alltoall' (the ring: each step K, V to the next rank) or 'allgather' "
                                       "(torch's default: one all-gather of every rank's K, V)")}

    def __init__(self, model, ctx, config, **options):
        mesh = ctx.mesh
        if mesh.size("cp") < 2:
            raise ValueError("strategy 'torch-ring' is context parallelism: use parallel={'cp': 2} (or more)")
        if ctx.device.type != "cpu":
            raise ValueError("strategy 'torch-ring' runs torch's ring with the CPU flash kernel; on a GPU use torch's "
                             "public context_parallel, which dispatches to the CUDA kernels")
        if config.precision != "fp32":
            raise ValueError("strategy 'torch-ring' runs in fp32 only (the CPU flash kernel's fp32 path)")
        cores = attention_modules(model)
        if any(getattr(m.context, "func", None) is not ring_attention for m in cores):
            raise ValueError("strategy 'torch-ring' runs ring attention: pass cp_attention='ring' (the training "
                             "loop's cp formula follows that option)")
        attention, _, _ = _private()
        ring_options = {k: v for k, v in options.items() if k == "rotate_method"}
        attention._cp_options.enable_load_balance = True  # head-tail chunks: zerokit's zig-zag layout
        attention.set_rotate_method(ring_options.get("rotate_method", "alltoall"))
        for m in cores:
            m.context = TorchRing(mesh, self.name)
        super().__init__(model, ctx, config, **options)


register(TorchRingPeer)
