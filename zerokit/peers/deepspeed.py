"""``deepspeed-zero1/2/3``: DeepSpeed's ZeRO in zerokit's ledgers (registered only when ``deepspeed`` imports).

Lifecycle:

1. **setup**: ``DS_ACCELERATOR=cpu`` off CUDA, and ``RANK`` / ``WORLD_SIZE`` /
   ``LOCAL_RANK`` set as DeepSpeed's launcher would; zerokit's options become the
   ``zero_optimization`` section (:func:`zerokit.zero.config.to_deepspeed`, bucket sizes
   capped at Ψ since DeepSpeed preallocates them), with ``"gradient_clipping": 0``
   (FACTS §9) and the loop's micro-batches as ``gradient_accumulation_steps``;
   ``deepspeed.initialize`` wraps the model and a client torch optimizer, whose
   parameters become DeepSpeed's fp32 partitions (stage 3 also partitions the
   module's parameters, ``p.ds_tensor``);
2. **forward**: ``engine(inputs)`` (stage 3 gathers each module's parameters by hooks);
3. **backward**: ``engine.backward(loss, scale_wrt_gas=False)`` — zerokit's loop already
   divides by the micro-batches — with the accumulation boundary set from ``no_sync``;
   gradients are reduced (or reduce-scattered) in DeepSpeed's buckets;
4. **step**: ``engine.step()`` steps the partitions, all-gathers the updated parameters
   (stages 1/2) and zeroes the gradients.

The traffic is counted by :mod:`.recording`; memory is read from the module's parameters
(and ``ds_tensor`` partitions), ``p.grad`` and the torch optimizer's states. Gradient
buffers DeepSpeed keeps privately are not seen.

``deepspeed-zero2-offload``: ``"offload_optimizer": {"device": "cpu", "pin_memory": …}``
(ZeRO-Offload; pinned on a GPU, as zerokit's offload there; not on the CPU, where pinning needs CUDA), the peer of ``zero2`` with ``offload="optimizer"``. The client torch
optimizer steps the fp32 partitions on the host (``"zero_force_ds_cpu_optimizer": false``:
DeepSpeed would otherwise insist on its own DeepSpeedCPUAdam, a C++ op compiled on first
use); the optimizer's states are counted as host memory.

``deepspeed-zeropp``: stage 3 with ZeRO++'s keys, the peer of ``zeropp``. On the CPU only hpZ
(``zero_hpz_partition_size``) runs; qwZ and qgZ are refused before any process starts with
:data:`NO_CPU_QUANTIZER` (DeepSpeed's quantizer kernels are CUDA only).
"""
from __future__ import annotations

import importlib.util
import os
import warnings

import torch
import torch.distributed as dist

from .. import theory
from ..runtime import comm
from ..strategies.base import boolean, Option, register
from ..zero.config import to_deepspeed
from ..zero.sharded import DEFAULT_ALLGATHER_BUCKET, DEFAULT_REDUCE_BUCKET, ELEMENTS, positive_elements, stage_option
from ..zero.stage3 import DEFAULT_PREFETCH_BUCKET, non_negative_elements
from .recording import ledgered_torch_collectives, Peer


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


class DeepSpeedPeer(Peer):
    """deepspeed.initialize with a client torch optimizer; the loop's micro-batches are DeepSpeed's."""

    #: ZeRO-Offload: offload_optimizer to the CPU
    cpu_offload = False
    #: deepspeed.initialize imports DeepSpeed's Muon optimizer, whose module calls torch.compile at import: that
    #: pulls in torch's inductor stack, 1.7 s per rank per launch when each forked rank imports it again
    preload = ("torch._inductor.compile_fx", "torch._dynamo.backends.debugging")

    def __init__(self, model, ctx, config, **options):
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if ctx.device.type == "cuda" else "cpu")
        # DeepSpeed reads these from the environment of a process its own launcher (or torchrun) started
        for key, value in (("RANK", ctx.rank), ("WORLD_SIZE", ctx.world_size),
                           ("LOCAL_RANK", ctx.device.index if ctx.device.type == "cuda" else ctx.rank)):
            os.environ.setdefault(key, str(value))
        import deepspeed

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
            # DeepSpeed's list of "tested" ZeRO optimizers has Adam(W) but not torch.optim.SGD, which steps the flat
            # partitions elementwise like any other torch optimizer
            "zero_allow_untested_optimizer": config.optimizer.name != "adamw",
            "zero_optimization": zero,
            "bf16": {"enabled": config.precision == "bf16-mixed"},
            "steps_per_print": 10 ** 9,
            "wall_clock_breakdown": False,
        }
        if self.cpu_offload:  # ZeRO-Offload, with the client torch optimizer stepping on the host
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": ctx.device.type == "cuda"}
            ds_config["zero_force_ds_cpu_optimizer"] = False
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
                if getattr(p, "ds_secondary_tensor", None) is not None:  # hpZ's secondary partition
                    yield p.ds_secondary_tensor

        ledger.track("params", params)
        ledger.track("grads", lambda: [p.grad for p in self.params if p.grad is not None])
        optimizer = self.optimizer.optimizer if hasattr(self.optimizer, "optimizer") else self.optimizer
        ledger.track_optimizer(optimizer, host=self.cpu_offload)  # offload: the fp32 partitions live on the host

    def full_parameters(self):
        if self.stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(self.params):
                return {n: p.detach().float().cpu().clone() for n, p in self.model.named_parameters()}
        return super().full_parameters()

    def theory_model_states(self, psi):
        if self.cpu_offload:
            return theory.offload_states(self.stage, psi, self.ctx.world_size, self.config.optimizer.name,
                                         precision=self.config.precision)
        return theory.model_state_bytes(self.stage, psi, self.ctx.world_size, self.config.precision,
                                        self.config.optimizer.name)

    def theory_comm_bytes(self, psi):
        b = theory.param_bytes_per_element(self.config.precision)
        return theory.comm_bytes_per_step(self.stage, psi, self.ctx.world_size, b, self.config.micro_batches)


#: why DeepSpeed's qwZ and qgZ do not run here: both call its quantizer kernels, CUDA only
NO_CPU_QUANTIZER = ("DeepSpeed 0.19.8's qwZ (zero_quantized_weights) and qgZ (zero_quantized_gradients) call its "
                    "quantizer kernels (csrc/quantization through QuantizerBuilder), which are CUDA only: on the CPU "
                    "accelerator QuantizerBuilder().load() raises 'This op had not been implemented on CPU backend.' "
                    "Its hpZ (zero_hpz_partition_size) runs on the CPU; zerokit's zeropp runs all three")


def _zeropp_options() -> dict:
    options = _deepspeed_options(3)
    options["zero_quantized_weights"] = Option(False, boolean, "True (needs a GPU: DeepSpeed's CUDA quantizer) or "
                                                               "False")
    options["zero_hpz_partition_size"] = Option(1, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                                                "1 (off) or the ranks of the secondary partition, dividing dp")
    options["zero_quantized_gradients"] = Option(False, boolean, "True (needs a GPU: DeepSpeed's CUDA quantizer) or "
                                                                 "False")
    return options


class DeepSpeedZeroPlusPlus(DeepSpeedPeer):
    """DeepSpeed ZeRO++: stage 3 with ``zero_quantized_weights``, ``zero_hpz_partition_size``,
    ``zero_quantized_gradients`` (arXiv 2306.10209), the peer of zerokit's ``zeropp``."""

    name = "deepspeed-zeropp"
    stage = 3
    options = _zeropp_options()

    @classmethod
    def resolve_options(cls, options: dict) -> dict:
        resolved = super().resolve_options(options)
        quantized = resolved["zero_quantized_weights"] or resolved["zero_quantized_gradients"]
        if quantized and not torch.cuda.is_available():
            raise ValueError(f"strategy {cls.name!r}: {NO_CPU_QUANTIZER}")
        return resolved

    def _secondary(self) -> int:
        return self.opts["zero_hpz_partition_size"]

    def theory_model_states(self, psi):
        base = super().theory_model_states(psi)
        s = self._secondary()
        extra = theory.hpz_secondary_bytes(psi, s, self.config.precision) if s > 1 else 0
        return theory.ModelStates(base.params + extra, base.grads, base.optimizer, base.step_scalars)

    def theory_comm_bytes(self, psi):
        """Formula: zerokit's ZeRO++ bytes for one unit of Ψ (DeepSpeed pads and buckets its own way) on this
        run's nodes (qgZ's two hops, and whether it runs at all, depend on the ranks per node)."""
        by = theory.zeropp_collective_bytes(
            [psi], self.ctx.world_size, theory.param_bytes_per_element(self.config.precision),
            ranks_per_node=self.ctx.mesh.ranks_per_node,
            hpz_partition_size=self._secondary(), quantized_weights=self.opts["zero_quantized_weights"],
            quantized_gradients=self.opts["zero_quantized_gradients"], micro_batches=self.config.micro_batches)
        return sum(sum(ops.values()) for ops in by.values())


if deepspeed_available():
    for _stage in (1, 2, 3):
        register(type(f"DeepSpeedZero{_stage}", (DeepSpeedPeer,), {
            "__doc__": f"DeepSpeed ZeRO stage {_stage} (deepspeed.initialize, client torch optimizer).",
            "name": f"deepspeed-zero{_stage}", "stage": _stage, "options": _deepspeed_options(_stage)}))
    register(type("DeepSpeedZero2Offload", (DeepSpeedPeer,), {
        "__doc__": "DeepSpeed ZeRO stage 2 with offload_optimizer to the CPU (ZeRO-Offload).",
        "name": "deepspeed-zero2-offload", "stage": 2, "options": _deepspeed_options(2), "cpu_offload": True}))
    register(DeepSpeedZeroPlusPlus)
