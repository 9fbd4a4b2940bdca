"""Sharded peers: torch's ZeroRedundancyOptimizer and FSDP2, and DeepSpeed's ZeRO, in the same ledgers.

- ``torch-zero1``: ``ZeroRedundancyOptimizer`` (optimizer-state sharding) on top of torch
  DDP, whose gradient all-reduce goes through the ledger by a comm hook (as ``torch-ddp``).
  After its step each rank broadcasts the parameters it updated.
- ``fsdp2-zero2`` / ``fsdp2-zero3``: ``fully_shard`` on the same units zerokit's
  ``zero3`` forms, then on the root, with ``reshard_after_forward`` False / True. Note
  what FSDP2 calls ZeRO-2: parameters are still sharded between steps; only between
  forward and backward do they stay gathered (2Ψ traffic, not 3Ψ).
- ``deepspeed-zero1/2/3``: ``deepspeed.initialize`` with a client torch optimizer and
  ``"gradient_clipping": 0`` (FACTS §9), ``DS_ACCELERATOR=cpu`` off CUDA; only registered
  when ``deepspeed`` is importable.

**How their traffic is counted.** FSDP2 and DeepSpeed have no comm hook, so while a
peer runs its forward, backward and step, the ``torch.distributed`` collectives
(``all_reduce``, ``broadcast``, ``all_gather_single`` / ``all_gather_into_tensor``,
``reduce_scatter_single`` / ``reduce_scatter_tensor``, the list forms) are replaced by
wrappers that record each call in the ledger with the same ring formula zerokit's own
collectives use, then call the original. Their async work is not timed (no blocked
seconds): their exposed communication is not visible to the ledger.
**Their memory** is read from what they expose: the module's parameters (local shards
of FSDP2's DTensors; DeepSpeed's ``ds_tensor`` partitions in stage 3), ``p.grad``, and
the torch optimizer's parameters and states (DeepSpeed's fp32 partitions live there).
Gradient buffers a library keeps privately are not seen.
"""
from __future__ import annotations

import importlib.util
import os
import threading
import time
import warnings
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel

from .. import theory
from ..runtime import comm
from ..strategies.base import Option, Strategy, boolean, register
from .torch_ddp import _ledgered_allreduce_hook
from ..zero.stage1 import DEFAULT_ALLGATHER_BUCKET, DEFAULT_REDUCE_BUCKET, ELEMENTS, positive_elements, stage_option
from ..zero.stage3 import DEFAULT_PREFETCH_BUCKET, form_units, non_negative_elements

# --- counting a library's collectives -----------------------------------------------------------

_inside = threading.local()


def _payload(op: str, args, kwargs):
    """(tensor, payload bytes) of a torch.distributed call, by zerokit's convention."""
    def arg(i, name):
        return args[i] if len(args) > i else kwargs[name]

    if op in ("all_reduce", "broadcast"):
        t = arg(0, "tensor")
        return t, t.numel() * t.element_size()
    if op == "all_gather_single":
        t = arg(0, "output_tensor")
        return t, t.numel() * t.element_size()
    if op == "reduce_scatter_single":
        t = arg(1, "input")
        return t, t.numel() * t.element_size()
    if op == "all_gather":
        ts = arg(0, "tensor_list")
        return ts[0], sum(t.numel() * t.element_size() for t in ts)
    if op == "reduce_scatter":
        ts = arg(1, "input_list")
        return ts[0], sum(t.numel() * t.element_size() for t in ts)
    raise ValueError(op)


_RECORDED_AS = {"all_reduce": "all_reduce", "broadcast": "broadcast", "all_gather_single": "all_gather",
                "reduce_scatter_single": "reduce_scatter", "all_gather": "all_gather",
                "reduce_scatter": "reduce_scatter"}


def _recording(op: str, original, tag: str):
    def wrapper(*args, **kwargs):
        if getattr(_inside, "active", False):
            return original(*args, **kwargs)
        tensor, nbytes = _payload(op, args, kwargs)
        group = kwargs.get("group", args[2] if op == "broadcast" and len(args) > 2 else None)
        if op in ("all_reduce",) and len(args) > 2:
            group = args[2]
        async_op = kwargs.get("async_op", False)
        extra = {}
        if op == "broadcast":
            src = args[1] if len(args) > 1 else kwargs.get("src", kwargs.get("group_src", 0))
            extra = {"rank": dist.get_rank(group), "src": dist.get_group_rank(group, src) if group else src}
        record = comm._start(_RECORDED_AS[op], tensor, nbytes, group, async_op, tag=f"{tag} {op}", **extra)
        _inside.active = True
        try:
            work = original(*args, **kwargs)
        finally:
            _inside.active = False
        if not async_op:
            record.t_end = time.perf_counter()
            record.blocked_s = record.t_end - record.t_launch
        return work

    return wrapper


@contextmanager
def ledgered_torch_collectives(tag: str):
    """Route a library's torch.distributed collectives through the ledger while the block runs."""
    saved = []
    for op in _RECORDED_AS:
        for module in (dist, c10d):
            original = getattr(module, op, None)
            if original is None:
                continue
            saved.append((module, op, original))
            setattr(module, op, _recording(op, original, tag))
    try:
        yield
    finally:
        for module, op, original in saved:
            setattr(module, op, original)


class _Peer(Strategy):
    """A library's strategy whose collectives are counted by :func:`ledgered_torch_collectives`."""

    peer = True

    def forward(self, inputs):
        with ledgered_torch_collectives(self.name):
            return self.run_forward(inputs)

    def backward(self, loss):
        with ledgered_torch_collectives(self.name):
            self.run_backward(loss)

    def step(self):
        with ledgered_torch_collectives(self.name):
            self.run_step()

    def run_forward(self, inputs):
        return self.model(inputs)

    def run_backward(self, loss):
        loss.backward()


def _fp32_only(name: str, config) -> None:
    if config.precision != "fp32":
        raise ValueError(f"strategy {name!r} runs in fp32 only: it steps the model's own parameters, with no fp32 "
                         f"master copy to make bf16-mixed comparable; use precision='fp32'")


# --- torch: ZeroRedundancyOptimizer ----------------------------------------------------------------

@register
class TorchZero1(_Peer):
    """torch DDP (ledgered comm hook) + ZeroRedundancyOptimizer: ZeRO-1 as torch ships it."""

    name = "torch-zero1"
    stage = 1
    options = {"bucket_mb": Option(25.0, lambda x: isinstance(x, (int, float)) and x > 0,
                                   "a positive number of MiB (DDP's bucket_cap_mb)")}

    def __init__(self, model, ctx, config, **options):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        super().__init__(model, ctx, config, **options)
        _fp32_only(self.name, config)
        self.ddp = DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                                           bucket_cap_mb=self.opts["bucket_mb"], gradient_as_bucket_view=True)
        self.ddp.register_comm_hook(None, _ledgered_allreduce_hook)
        spec = config.optimizer
        if spec.name == "adamw":
            kwargs = dict(optimizer_class=torch.optim.AdamW, lr=spec.lr, betas=spec.betas, eps=spec.eps,
                          weight_decay=spec.weight_decay, foreach=False)
        else:
            kwargs = dict(optimizer_class=torch.optim.SGD, lr=spec.lr, momentum=spec.momentum,
                          weight_decay=spec.weight_decay, foreach=False)
        self.optimizer = ZeroRedundancyOptimizer(list(model.parameters()), **kwargs)

    def run_forward(self, inputs):
        return self.ddp(inputs)

    @contextmanager
    def no_sync(self):
        with self.ddp.no_sync():
            yield

    def run_step(self):
        self.optimizer.step()

    def track_memory(self, ledger):
        super().track_memory(ledger)
        ledger.track_optimizer(self.optimizer.optim)

    def optimizer_tensors(self):
        local = self.optimizer.optim
        return sum(len(g["params"]) for g in local.param_groups) if self.config.optimizer.name == "adamw" else 0

    def theory_model_states(self, psi):
        # ZeroRedundancyOptimizer shards whole tensors, not a flat buffer: Ψ/N only on average
        return theory.model_state_bytes(1, psi, self.ctx.world_size, self.config.precision,
                                        self.config.optimizer.name, units=[psi],
                                        optimizer_tensors=self.optimizer_tensors())

    def theory_comm_bytes(self, psi):
        """The theory shown is DDP's all-reduce, 2(N−1)/N·Ψb; the owners' broadcasts of updated tensors come on top."""
        b = theory.param_bytes_per_element(self.config.precision)
        return theory.comm_bytes_per_step(0, psi, self.ctx.world_size, b)


# --- torch: FSDP2 ----------------------------------------------------------------------------

def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class _FSDP2(_Peer):
    reshard_after_forward = True
    options = {"unit_size": Option(0, non_negative_elements, f"0 or {ELEMENTS}: as zero3's unit_size (the same "
                                                            f"modules get fully_shard)")}

    def __init__(self, model, ctx, config, **options):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        super().__init__(model, ctx, config, **options)
        # The workloads split a Linear's output into views (q, k, v) and never write into them
        # in place, which is the case this warning is about; silence it so each rank's output stays readable.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        policy = MixedPrecisionPolicy()
        if config.precision == "bf16-mixed":
            model.float()  # bf16 values, exactly: FSDP2 keeps the fp32 shards and computes in bf16
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        with comm.phase("setup"), ledgered_torch_collectives(self.name):
            for module, _, _ in form_units(model, int(self.opts["unit_size"]), set()):
                if module is not model:
                    fully_shard(module, mesh=mesh, reshard_after_forward=self.reshard_after_forward,
                                mp_policy=policy)
            fully_shard(model, mesh=mesh, reshard_after_forward=self.reshard_after_forward, mp_policy=policy)
        self.params = list(model.parameters())
        self.optimizer = config.optimizer.build(self.params)

    @contextmanager
    def no_sync(self):
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    def run_step(self):
        self.optimizer.step()

    def zero_grad(self):
        self.optimizer.zero_grad(set_to_none=True)

    def track_memory(self, ledger):
        ledger.track("params", lambda: [_local(p) for p in self.model.parameters()])
        ledger.track("grads", lambda: [_local(p.grad) for p in self.model.parameters() if p.grad is not None])
        ledger.track("buffers", lambda: list(self.model.buffers()))

        def states():
            for state in self.optimizer.state.values():
                for v in state.values():
                    if torch.is_tensor(v):
                        yield _local(v)

        ledger.track("optimizer", states)

    def full_parameters(self):
        out = {}
        for n, p in self.model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            out[n] = full.detach().float().cpu().clone()
        return out

    def optimizer_tensors(self):
        return len(self.params) if self.config.optimizer.name == "adamw" else 0

    def theory_model_states(self, psi):
        # FSDP2 pads each parameter's first dimension to a multiple of N, not a flat buffer
        return theory.model_state_bytes(3, psi, self.ctx.world_size, "fp32", self.config.optimizer.name,
                                        optimizer_tensors=self.optimizer_tensors())

    def theory_comm_bytes(self, psi):
        b = theory.param_bytes_per_element(self.config.precision)
        return theory.comm_bytes_per_step(3, psi, self.ctx.world_size, b, self.config.micro_batches,
                                          reshard_after_forward=self.reshard_after_forward)


@register
class FSDP2Zero2(_FSDP2):
    """fully_shard(reshard_after_forward=False): gathered from forward to backward, sharded at rest."""

    name = "fsdp2-zero2"
    stage = 2
    reshard_after_forward = False


@register
class FSDP2Zero3(_FSDP2):
    """fully_shard(reshard_after_forward=True): FSDP2's default, ZeRO-3."""

    name = "fsdp2-zero3"
    stage = 3
    reshard_after_forward = True


# --- DeepSpeed -------------------------------------------------------------------------------

def deepspeed_available() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def _deepspeed_options(stage: int) -> dict:
    options = {
        "stage": stage_option(stage),
        "reduce_bucket_size": Option(DEFAULT_REDUCE_BUCKET, positive_elements, ELEMENTS),
        "overlap_comm": Option(True, boolean, "True or False"),
        "contiguous_gradients": Option(True, boolean, "True or False"),
    }
    if stage < 3:
        options["allgather_bucket_size"] = Option(DEFAULT_ALLGATHER_BUCKET, positive_elements, ELEMENTS)
        options["reduce_scatter"] = Option(True, boolean, "True or False")
    else:
        options["prefetch"] = Option(True, boolean, "True or False (stage3_prefetch_bucket_size 0)")
        options["prefetch_bucket_size"] = Option(DEFAULT_PREFETCH_BUCKET, positive_elements, ELEMENTS)
        options["param_persistence_threshold"] = Option(0, non_negative_elements,
                                                        f"0 or {ELEMENTS} (zerokit's default 0, not DeepSpeed's 1e5)")
    return options


class _DeepSpeed(_Peer):
    """deepspeed.initialize with a client torch optimizer; the loop's micro-batches are DeepSpeed's."""

    def __init__(self, model, ctx, config, **options):
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if ctx.device.type == "cuda" else "cpu")
        # DeepSpeed reads these from the environment of a process its own launcher (or torchrun) started
        for key, value in (("RANK", ctx.rank), ("WORLD_SIZE", ctx.world_size),
                           ("LOCAL_RANK", ctx.device.index if ctx.device.type == "cuda" else ctx.rank)):
            os.environ.setdefault(key, str(value))
        import deepspeed
        from ..zero.config import to_deepspeed

        super().__init__(model, ctx, config, **options)
        self.params = list(model.parameters())
        optimizer = config.optimizer.build(self.params)
        # DeepSpeed preallocates its buckets at their full size (5e8 elements = 2 GB of fp32 by default): no bucket
        # can hold more than the model, so the sizes are capped at Ψ
        psi = sum(p.numel() for p in self.params)
        capped = {k: (min(int(v), psi) if k.endswith("bucket_size") else v) for k, v in self.opts.items()}
        zero = to_deepspeed(self.stage, {k: v for k, v in capped.items() if k != "stage"})
        warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use .*_single", category=FutureWarning)
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,  # only its bookkeeping: zerokit feeds the batches
            "gradient_accumulation_steps": config.micro_batches,
            "gradient_clipping": 0,
            "zero_optimization": zero,
            "bf16": {"enabled": config.precision == "bf16-mixed"},
            "steps_per_print": 10 ** 9,
            "wall_clock_breakdown": False,
        }
        with comm.phase("setup"), ledgered_torch_collectives(self.name):
            deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)
            self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                                     config=ds_config)

    def run_forward(self, inputs):
        return self.engine(inputs)

    def run_backward(self, loss):
        self.engine.set_gradient_accumulation_boundary(self._sync)
        self.engine.backward(loss, scale_wrt_gas=False)  # zerokit's loop already divides by the micro-batches

    def run_step(self):
        self.engine.step()

    def zero_grad(self):
        pass  # the engine zeroes its gradients in step()

    def track_memory(self, ledger):
        def params():
            for p in self.params:
                yield p
                if hasattr(p, "ds_tensor"):
                    yield p.ds_tensor

        ledger.track("params", params)
        ledger.track("grads", lambda: [p.grad for p in self.params if p.grad is not None])
        ledger.track_optimizer(self.optimizer.optimizer if hasattr(self.optimizer, "optimizer") else self.optimizer)

    def full_parameters(self):
        if self.stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(self.params):
                return {n: p.detach().float().cpu().clone() for n, p in self.model.named_parameters()}
        return super().full_parameters()

    def theory_model_states(self, psi):
        return theory.model_state_bytes(self.stage, psi, self.ctx.world_size, self.config.precision,
                                        self.config.optimizer.name)

    def theory_comm_bytes(self, psi):
        b = theory.param_bytes_per_element(self.config.precision)
        return theory.comm_bytes_per_step(self.stage, psi, self.ctx.world_size, b, self.config.micro_batches)


if deepspeed_available():
    for _stage in (1, 2, 3):
        register(type(f"DeepSpeedZero{_stage}", (_DeepSpeed,), {
            "__doc__": f"DeepSpeed ZeRO stage {_stage} (deepspeed.initialize, client torch optimizer).",
            "name": f"deepspeed-zero{_stage}", "stage": _stage, "options": _deepspeed_options(_stage)}))
