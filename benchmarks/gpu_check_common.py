"""What every row of ``gpu_check.py`` shares: the run's mode, the sizes, the parity bounds, the reference.

The mode is set once by ``gpu_check.main`` (:func:`configure`) and read by the rows through this module:
``DRY`` (gloo ranks on the CPU, small sizes), ``GPUS`` (CUDA devices visible) and ``TORCHRUN`` (the world size
torchrun started this process in, or None for a plain script).
"""
from __future__ import annotations

import inspect
import math
import os
import re

import torch

import zerokit
from zerokit.job import make_job
from zerokit.report import param_difference
from zerokit.runtime.torchrun import under_torchrun
from zerokit.train import run_reference

DRY = True          # set by configure()
GPUS = 0
TORCHRUN = None     # torchrun's WORLD_SIZE when this process is one of its workers
STEPS, LR, SGD_LR = 3, 1e-3, 0.1
HEARTBEAT = {"heartbeat_s": 60.0} if "heartbeat_s" in inspect.signature(zerokit.train).parameters else {}

# (--dry, GPU) sizes. pipe on the GPU: one micro-batch (2048 / 4 micro-batches = 512 sequences) × 128 × 64 fp32 =
# 16 MiB at the stage boundary, with a small d_model so the single-process reference stays cheap.
SIZES = {
    "gpt": (dict(vocab=128, seq_len=32, d_model=64, n_layer=2, n_head=4, batch_size=4),
            dict(vocab=4096, seq_len=256, d_model=256, n_layer=4, n_head=4, batch_size=8)),
    "pipe": (dict(vocab=64, seq_len=16, d_model=32, n_layer=4, n_head=2, batch_size=8),
             dict(vocab=256, seq_len=128, d_model=64, n_layer=4, n_head=4, batch_size=2048)),
    "big": (dict(vocab=128, seq_len=64, d_model=64, n_layer=4, n_head=4, batch_size=4),
            dict(vocab=32000, seq_len=1024, d_model=2048, n_layer=20, n_head=16, batch_size=4)),
    "memory": (dict(vocab=128, seq_len=32, d_model=64, n_layer=2, n_head=4, batch_size=4),
               dict(vocab=32000, seq_len=512, d_model=1024, n_layer=8, n_head=16, batch_size=8)),
    # expert parallelism: the gpt with a mixture of 4 experts, top-2, in every block
    "moe": (dict(vocab=128, seq_len=32, d_model=64, n_layer=2, n_head=4, batch_size=4, n_experts=4, top_k=2),
            dict(vocab=4096, seq_len=256, d_model=256, n_layer=4, n_head=4, batch_size=8, n_experts=4, top_k=2)),
}
MICRO = 4  # the pipelines' micro-batches
#: dense bf16 peak FLOP/s by device name (first match)
PEAK_FLOPS = (("H100 PCIe", 756e12), ("H200", 989e12), ("H100", 989e12), ("A100", 312e12))


def configure(dry: bool) -> None:
    global DRY, GPUS, TORCHRUN
    DRY, GPUS = dry, torch.cuda.device_count()
    TORCHRUN = int(os.environ["WORLD_SIZE"]) if under_torchrun() else None


def rank0() -> bool:
    return TORCHRUN is None or int(os.environ["RANK"]) == 0


def device() -> torch.device:
    """This process's device: the CPU with --dry, else its GPU (LOCAL_RANK's under torchrun, the first otherwise)."""
    return torch.device("cpu") if DRY else torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))


def size(name: str, **override) -> dict:
    return {**SIZES[name][0 if DRY else 1], **override}


def work(name: str, **override):
    return zerokit.tiny_gpt(**size(name, **override))


def backend() -> dict:
    return {"backend": "gloo"} if DRY else {}


class Skip(Exception):
    """A row that cannot run here; its message says why."""


def needs(world: int) -> None:
    """Skip a row of ``world`` ranks that this process cannot run: under torchrun only rows of torchrun's world
    size run (the ranks exist already); a plain script needs a GPU per rank (gloo ranks with --dry)."""
    if TORCHRUN is not None and world != TORCHRUN:
        raise Skip(f"a {world}-rank row; this torchrun started {TORCHRUN} (torchrun --nproc_per_node={world} runs it"
                   + (", a plain script too)" if world == 1 else ")"))
    if TORCHRUN is None and not DRY and GPUS < world:
        raise Skip(f"needs {world} GPUs, this machine has {GPUS}")


# --- parity bounds ------------------------------------------------------------------------
ULP_AT_ONE = {"fp32": 2.0 ** -23, "bf16-mixed": 2.0 ** -7}
#: AdamW's largest step per element in units of lr: (1 − β1)/√(1 − β2) (Kingma & Ba §2.1, 1 − β1 > √(1 − β2))
ADAM_STEP = (1 - 0.9) / math.sqrt(1 - 0.999)
#: SGD runs: allowed |Δp| as a fraction of the reference's largest movement |p_ref − p_0| (see sgd_tolerance)
RHO = 1e-3


def ulp(x: float, precision: str) -> float:
    return ULP_AT_ONE[precision] * 2.0 ** math.floor(math.log2(x)) if x > 0 else 0.0


def adamw_tolerance(precision: str, pmax: float, same_kernels: bool) -> float:
    """|Δparam| allowed between a one-rank run and the reference after STEPS AdamW steps of LR.

    fp32 with the same kernels (``--dry``: rank and reference on one CPU, one thread, one batch): the
    strategy's own arithmetic at one rank (flattening, copies, a sum over one rank, /1) is exact, so
    only the update's last rounding can differ: p − u rounds to half an ulp of |p| on each side, and
    u's ~8 roundings move it by ≤ 8·2⁻²⁴·ADAM_STEP·lr ≪ ulp(|p|): 2 ulps of max|p| per step; we allow 4.
    Otherwise (on a GPU, whose kernels need not round as the CPU's do, or bf16): the gradients round differently,
    and AdamW's m/√v turns a gradient that is rounding noise (the attention key bias's: exactly zero in
    exact arithmetic) into up to a full step, so the only bound from arithmetic is AdamW's largest
    step, taken by both sides in opposite directions: 2·ADAM_STEP·lr·STEPS (weight decay contracts a
    difference, never grows it); bf16-mixed compares the bf16 copies, which round the fp32 masters:
    plus one bf16 ulp of max|p|. Loose (6.3·lr·steps): it catches divergence, not a stale gradient.
    """
    if precision == "fp32" and same_kernels:
        return 4 * STEPS * ulp(pmax, "fp32")
    return 2 * ADAM_STEP * LR * STEPS + (ulp(pmax, "bf16-mixed") if precision == "bf16-mixed" else 0.0)


def sgd_tolerance(movement: float) -> float:
    """|Δparam| allowed between a multi-rank fp32 SGD run and the reference: RHO × the reference's movement.

    SGD's update is linear in the gradient, so two runs that differ only in summation order (the batch
    split over ranks, partial sums over tp, another reduction tree) differ by the rounding of the
    gradients they applied: relative K·u with K ≈ 10³ roundings on the longest chain from a parameter
    to the loss and back (2⁻²⁴·10³ ≈ 6e-5; fp32 matmuls, no TF32: torch's default, zerokit sets none) of
    the movement Σ lr·g, on GPU ranks against a reference on a GPU or on the CPU alike; RHO = 1e-3 leaves 16×
    margin. A missing 1/N, a dropped or stale reduction or a misplaced shard is O(1) of the movement.
    """
    return RHO * movement


_REFS: dict = {}


def reference(name: str, precision: str, optimizer: str, lr: float, steps: int = STEPS, **override) -> dict:
    """The single-process reference on this process's device (:func:`device`), once per workload and recipe."""
    key = (name, precision, optimizer, lr, steps, tuple(sorted(override.items())))
    if key not in _REFS:
        job = make_job(work(name, **override), "single", 1, steps, precision, optimizer, lr, 1, {})
        rank = run_reference(job, device())
        start = {k: v.detach().float() for k, v in work(name, **override).build_model().named_parameters()}
        _REFS[key] = {"params": rank.params, "losses": rank.losses,
                      "pmax": max(float(v.abs().max()) for v in rank.params.values()),
                      "movement": max(float((rank.params[k] - start[k]).abs().max()) for k in start)}
    return _REFS[key]


def mfu(result, name: str) -> float | None:
    if DRY:
        return None
    peak = next((flops for key, flops in PEAK_FLOPS if key in torch.cuda.get_device_name(0)), None)
    s = size(name)
    tokens = s["batch_size"] * s["seq_len"] / result.world_size / result.step_time_s_median
    return None if peak is None else zerokit.theory.model_flops_utilization(result.param_count, tokens, peak)


def train(name: str, strategy: str, world: int, precision: str = "fp32", optimizer: str = "sgd",
          override: dict | None = None, **kw):
    """zerokit.train without its own reference; parity against the cached one. Returns (result, fields)."""
    lr, override = (SGD_LR if optimizer == "sgd" else LR), override or {}
    result = zerokit.train(work(name, **override), strategy, world_size=world, steps=STEPS, precision=precision,
                           optimizer=optimizer, lr=lr, reference=False, timeout_s=240, **backend(),
                           **(HEARTBEAT if world > 1 else {}), **kw).results[0]
    ref = reference(name, precision, optimizer, lr, **override)
    diff = param_difference(result.ranks[0].params, ref["params"])["max_abs"]
    tol = sgd_tolerance(ref["movement"]) if optimizer == "sgd" else \
        adamw_tolerance(precision, ref["pmax"], same_kernels=DRY and world == 1)
    blocked = max(sum(row["blocked_s"] for row in r.comm_summary) for r in result.ranks)
    fields = {"world_size": world, "max_abs_param_diff": diff, "tolerance": tol, "blocked_s": blocked,
              "step_time_s_median": result.step_time_s_median, "mfu": mfu(result, name),
              "param_count": result.param_count, "losses": result.losses}
    if diff > tol:
        raise AssertionError(f"{strategy}: |Δparam| {diff:.2e} > {tol:.2e} against the reference")
    return result, fields


def summary(f: dict) -> str:
    m = "MFU n/a (CPU)" if DRY else ("MFU n/a (unknown peak)" if f["mfu"] is None else f"MFU {100 * f['mfu']:.2f}%")
    return (f"|Δp| {f['max_abs_param_diff']:.1e} ≤ {f['tolerance']:.1e}; blocked {1e3 * f['blocked_s']:.1f} ms; "
            f"step {1e3 * f['step_time_s_median']:.1f} ms; {m}")


def refusal(exc: Exception) -> str | None:
    """The reason a strategy refused this run, else None: a ValueError raised here (by ``make_job`` before any rank
    starts, or in this process as one of torchrun's ranks), or a rank's (:class:`zerokit.RankFailed`) whose last
    exception — the one the rank died of, after any it was raised from — is a ValueError."""
    if isinstance(exc, ValueError):
        return str(exc).strip() or None
    if not isinstance(exc, zerokit.RankFailed):
        return None
    # a traceback's exception lines start at column 0, "Name: message" or "Name" (its frames are indented); a
    # message's own later lines may look alike: then the last is not the ValueError's, and the row FAILs
    raised = [line for line in exc.traceback.splitlines() if re.match(r"[A-Za-z_][\w.]*(: |$)", line)]
    last = raised[-1] if raised else ""
    return (last[len("ValueError: "):].strip() or None) if last.startswith("ValueError: ") else None


def mib(x) -> str:
    return "—" if x is None else f"{x / 2 ** 20:,.4g} MiB"
