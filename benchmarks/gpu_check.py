"""The one script a GPU session runs: does everything zerokit measures on the CPU hold on CUDA and NCCL?

    python benchmarks/gpu_check.py                 # on a CUDA machine (target: under 8 minutes on one GPU)
    python benchmarks/gpu_check.py --dry           # every check on the CPU, gloo, small sizes: ~35 s on 2 cores (CI)
    python benchmarks/gpu_check.py --json out.json --only zero3    # the JSON elsewhere; only matching checks

Each check is one row of the table printed last and one object of the JSON file (``--json``,
default ``gpu_check.json`` here: name, status ``ok``/``FAIL``/``skip``/``n/a``, detail, seconds and
the measured numbers as fields; rewritten after every row, so a session cut short keeps what
ran). A failing check prints its error in its row and the script exits 1; a check that cannot
run here is ``skip`` with the reason. Each row prints its seconds: the first GPU run says where
the 8 minutes go (its estimate: ~40 one-rank launches of a few seconds each, the 1 B model's two runs).

On one GPU (one rank on the CPU with ``--dry``):

* **ws=1 fp32 / bf16-mixed**: every registered strategy and peer that runs on one rank trains the
  tiny GPT with AdamW (with ``--dry``, one per family: ``DRY_SWEEP``); |Δparam| against the single-process reference (run on the ranks' kind of
  device: the first GPU here, the CPU with ``--dry``), within the bound derived at :func:`adamw_tolerance`. A strategy that refuses one rank or a
  precision (a ValueError naming why) is listed as refused, not failed;
* **offload zero2 optimizer / zero3 params**: every device↔host copy's host buffer is pinned on
  CUDA (``n/a`` on the CPU), and the copies' bytes per step equal ``theory_transfer_bytes_per_step``;
* **activation checkpointing**: ``every`` against ``none`` on a ~1 B-parameter GPT in bf16 (tiny with
  ``--dry``): activations at the peak, step time, MFU;
* **memory ledger vs allocator**: a report, not pass/fail: the ledger's peak, torch's
  ``max_memory_allocated``, ``memory_allocated`` at the ledger's peak sample, the largest gap and
  where, next to ``zerokit.theory.step_transients`` (``n/a`` without CUDA).

On 2 GPUs (2 gloo ranks with ``--dry``; ``skip`` with fewer GPUs), each with ``heartbeat_s`` so a
deadlock fails in a minute instead of hanging: context parallelism at cp=2 (ring attention's
``batch_isend_irecv`` and Ulysses' all-to-all on NCCL) and expert parallelism at dp=2×ep=2 (the uneven
all-to-all of dispatch and combine), and on 4 GPUs cp=2×tp=2 and dp=2×ep=2×tp=2 (experts split by tp),
each with its bytes per axis equal to the theory; ddp (overlap on/off, ``algorithm="ring"``), zero1,
zero2, zero2 ``overlap_comm``, zero3, zero3 ``prefetch``, offload on 2 ranks, zero3
``offload="params"`` with ``param_persistence_threshold``, tp=2 with sequence parallelism, the four
pipeline schedules at pp=2 (one micro-batch's boundary activation ≥ 16 MiB on the GPU), dp×tp×pp
(8 GPUs; 8 gloo ranks with ``--dry``), a checkpoint saved under zero2 dp=2 and resumed under tp=2,
and the own-loop wrappers under ``torchrun --nproc-per-node 2``. Each reports parity (SGD, bound
at :func:`sgd_tolerance`), seconds blocked in collectives (> 0 asserted), the median step time
and, on a GPU of known peak, MFU.

Nothing here has run on a GPU yet (benchmarks/RESULTS.md records no GPU run): the CUDA paths —
NCCL, pinned offload buffers and the side stream, CUDA-event timing, the allocator fields — meet
a GPU for the first time in this script.
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import torch

import zerokit
from zerokit.job import make_job
from zerokit.report import param_difference
from zerokit.strategies import REGISTRY, load_all

DRY = True          # set by main()
GPUS = 0
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


def size(name: str) -> dict:
    return SIZES[name][0 if DRY else 1]


def work(name: str):
    return zerokit.tiny_gpt(**size(name))


def backend() -> dict:
    return {"backend": "gloo"} if DRY else {}


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
    Otherwise (on a GPU, whose kernels need not round as the CPU's do, or bf16): the gradients round differently, and
    AdamW's m/√v turns a gradient that is rounding noise (the attention key bias's: exactly zero in
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
    the movement Σ lr·g, on GPU ranks against a reference on a GPU or on the CPU alike; RHO = 1e-3 leaves 16× margin. A
    missing 1/N, a dropped or stale reduction or a misplaced shard is O(1) of the movement.
    """
    return RHO * movement


_REFS: dict = {}


def reference(name: str, precision: str, optimizer: str, lr: float, steps: int = STEPS) -> dict:
    """The single-process reference (zerokit.train's "single": on the first GPU when the ranks run on NCCL, else on
    the CPU), once per workload and recipe."""
    key = (name, precision, optimizer, lr, steps)
    if key not in _REFS:
        rank = zerokit.train(work(name), "single", world_size=1, steps=steps, precision=precision,
                             optimizer=optimizer, lr=lr, reference=False).results[0].ranks[0]
        start = {k: v.detach().float() for k, v in work(name).build_model().named_parameters()}
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


def train(name: str, strategy: str, world: int, precision: str = "fp32", optimizer: str = "sgd", **kw):
    """zerokit.train without its own reference; parity against the cached one. Returns (result, fields)."""
    lr = SGD_LR if optimizer == "sgd" else LR
    result = zerokit.train(work(name), strategy, world_size=world, steps=STEPS, precision=precision,
                           optimizer=optimizer, lr=lr, reference=False, timeout_s=240, **backend(),
                           **(HEARTBEAT if world > 1 else {}), **kw).results[0]
    ref = reference(name, precision, optimizer, lr)
    diff = param_difference(result.ranks[0].params, ref["params"])["max_abs"]
    tol = sgd_tolerance(ref["movement"]) if optimizer == "sgd" else \
        adamw_tolerance(precision, ref["pmax"], same_kernels=DRY and world == 1)
    blocked = max(sum(row["blocked_s"] for row in r.comm_summary) for r in result.ranks)
    fields = {"max_abs_param_diff": diff, "tolerance": tol, "blocked_s": blocked,
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
    """The reason a strategy refused this run (a ValueError raised in the rank), else None."""
    lines = [line for line in str(exc).splitlines() if line.startswith("ValueError: ")]
    return lines[-1][len("ValueError: "):] if lines else None


def mib(x) -> str:
    return "—" if x is None else f"{x / 2 ** 20:,.4g} MiB"


# --- one GPU (one rank) ---------------------------------------------------------------------
#: with --dry the one-rank sweeps take one strategy per family (the CPU suite trains every strategy against the
#: reference at 1 to 4 ranks already): the script's path is the same, in a fifth of the time CI would spend
DRY_SWEEP = ("ddp", "zero1", "zero2", "zero3", "pp", "fully-shard", "torch-ddp", "torch-zero1", "fsdp2-zero3")


def one_rank(precision: str):
    load_all()
    ran, refused, failed, fields = {}, {}, {}, {}
    for strategy in REGISTRY:
        if strategy == "single" or (DRY and strategy not in DRY_SWEEP):  # "single" is the reference itself
            continue
        try:
            _, fields[strategy] = train("gpt", strategy, 1, precision, optimizer="adamw")
            ran[strategy] = fields[strategy]["max_abs_param_diff"]
        except Exception as e:  # noqa: BLE001 - one strategy's failure is not the others'
            if isinstance(e, zerokit.RankFailed) and refusal(e) is not None:
                refused[strategy] = refusal(e)
            else:
                traceback.print_exc()
                failed[strategy] = f"{type(e).__name__}: {[x for x in str(e).splitlines() if x.strip()][-1][:200]}"
    parts = [f"FAILED {k}: {v}" for k, v in failed.items()]
    if ran:
        worst = max(ran, key=ran.get)
        parts.append(f"{len(ran)} ran, largest |Δp| {ran[worst]:.1e} ({worst}) ≤ {fields[worst]['tolerance']:.1e}")
    parts += [f"refused {k}: {v.replace(f'strategy {k!r} ', '')[:70]}" for k, v in refused.items()]
    status = "FAIL" if failed or not ran else "ok"
    return status, "; ".join(parts), {"strategies": fields, "refused": refused, "failed": failed}


def _pinned_run_rank(ctx, job):
    """run_rank with every device↔host copy's host buffer checked for pinning (on CUDA)."""
    import zerokit.offload.host_optimizer  # noqa: F401 - the modules that bind transfers.copy
    import zerokit.offload.param_offload  # noqa: F401
    from zerokit.offload import transfers
    from zerokit.train import run_rank

    real, seen = transfers.copy, []

    def copy(dst, src, direction, tag="", stream=None, **kw):
        host = dst if direction == "d2h" else src
        seen.append((tag, bool(host.is_pinned()) if ctx.device.type == "cuda" else None, stream is not None))
        return real(dst, src, direction, tag, stream, **kw)

    bound = [m for n, m in list(sys.modules.items()) if n.startswith("zerokit") and getattr(m, "copy", None) is real]
    for m in bound:
        m.copy = copy
    try:
        return run_rank(ctx, job), seen
    finally:
        for m in bound:
            m.copy = real


def offload(strategy: str, mode: str):
    job = make_job(work("gpt"), strategy, 1, STEPS, "bf16-mixed", "adamw", LR, 1, {"offload": mode})
    (rank, seen), = zerokit.launch(_pinned_run_rank, 1, job, timeout_s=240, **backend())
    ref = reference("gpt", "bf16-mixed", "adamw", LR)
    diff = param_difference(rank.params, ref["params"])["max_abs"]
    tol = adamw_tolerance("bf16-mixed", ref["pmax"], False)
    measured, theory = rank.transfer_bytes_per_step, rank.theory_transfer_bytes_per_step
    fields = {"transfer_bytes_per_step": measured, "theory_transfer_bytes_per_step": theory, "copies": len(seen),
              "unpinned": [t for t, pinned, _ in seen if pinned is False], "max_abs_param_diff": diff,
              "side_stream_copies": sum(on_side for *_, on_side in seen), "tolerance": tol}
    errors = [f"|Δp| {diff:.1e} > {tol:.1e}"] if diff > tol else []
    if theory is None or any(abs(measured[d] - theory[d]) > 0.5 for d in ("d2h", "h2d")):
        errors.append(f"bytes per step {measured} ≠ theory {theory}")
    if fields["unpinned"]:
        errors.append(f"{len(fields['unpinned'])} of {len(seen)} copies from unpinned host memory: "
                      f"{sorted(set(fields['unpinned']))[:3]}")
    if not seen:
        errors.append("no device↔host copy was made")
    if errors:
        raise AssertionError("; ".join(errors))
    pinned = ("pinning n/a (CPU)" if DRY else
              f"all {len(seen)} copies pinned, {fields['side_stream_copies']} on a side stream")
    return "ok", (f"d2h {mib(measured['d2h'])}, h2d {mib(measured['h2d'])} per step = theory; {pinned}; "
                  f"|Δp| {diff:.1e} ≤ {tol:.1e}"), fields


def checkpointing():
    out = {}
    for policy in ("none", "every"):
        result = zerokit.train(work("big"), "ddp", world_size=1, steps=STEPS, reference=False, checkpointing=policy,
                               precision="bf16-mixed", timeout_s=400, **backend()).results[0]
        rank = result.ranks[0]
        out[policy] = {"activations_at_peak": rank.peak_by_category["activations"], "peak_bytes": rank.peak_bytes,
                       "step_time_s_median": result.step_time_s_median, "mfu": mfu(result, "big"),
                       "recomputed_forwards": rank.recomputed_forwards, "param_count": result.param_count}
    none, every, act = out["none"], out["every"], "activations_at_peak"
    if not every["recomputed_forwards"] or every["activations_at_peak"] >= none["activations_at_peak"]:
        raise AssertionError(f"'every' recomputed {every['recomputed_forwards']} forwards and kept {mib(every[act])} "
                             f"of activations against {mib(none[act])}")
    m = "" if every["mfu"] is None else f"; MFU {100 * none['mfu']:.1f}% → {100 * every['mfu']:.1f}%"
    return "ok", (f"Ψ {none['param_count']:,} bf16: activations at peak {mib(none['activations_at_peak'])} "
                  f"→ {mib(every['activations_at_peak'])}, step {1e3 * none['step_time_s_median']:.0f} → "
                  f"{1e3 * every['step_time_s_median']:.0f} ms{m}"), out


def transients(name: str, precision: str, psi: int):
    """zerokit.theory.step_transients for this workload, its arguments filled by name (or why not)."""
    s = size(name)
    hopper = not DRY and torch.cuda.get_device_capability(0)[0] == 9
    known = dict(s=s["seq_len"], b=s["batch_size"], h=s["d_model"], a=s["n_head"], v=s["vocab"], psi=psi,
                 stepped_numel=psi, layers=s["n_layer"], precision=precision, micro_batches=1, hopper=hopper, **s)
    try:
        fn = zerokit.theory.step_transients
        return fn(**{k: known[k] for k in inspect.signature(fn).parameters if k in known})
    except (AttributeError, TypeError) as e:
        return f"{type(e).__name__}: {e}"


def memory():
    result = zerokit.train(work("memory"), "zero2", world_size=1, steps=STEPS, precision="bf16-mixed",
                           reference=False, timeout_s=300, **backend()).results[0]
    rank = result.ranks[0]
    names = ("peak_bytes", "cuda_peak_bytes", "allocator_at_peak", "allocator_gap_max", "allocator_gap_where")
    fields = {k: getattr(rank, k, None) for k in names}
    fields.update(peak_where=rank.peak_where, step_transients=transients("memory", "bf16-mixed", result.param_count))
    detail = (f"ledger peak {mib(rank.peak_bytes)} at {rank.peak_where!r}; torch max allocated "
              f"{mib(fields['cuda_peak_bytes'])}; allocated at the ledger's peak {mib(fields['allocator_at_peak'])}; "
              f"largest gap {mib(fields['allocator_gap_max'])} at {fields['allocator_gap_where']!r}; "
              f"theory transients {fields['step_transients']}")
    return ("n/a" if fields["cuda_peak_bytes"] is None else "ok"), detail, fields


# --- two or more GPUs (gloo ranks with --dry) ------------------------------------------------
def needs(n: int):
    if not DRY and GPUS < n:
        raise Skip(f"needs {n} GPUs, this machine has {GPUS}")


class Skip(Exception):
    pass


def multi(strategy: str, world: int = 2, name: str = "gpt", **kw):
    def check():
        needs(world)
        result, fields = train(name, strategy, world, **kw)
        if fields["blocked_s"] <= 0:
            raise AssertionError("no time blocked in any collective: the blocked-time measurement is broken")
        extra = ""
        if "cp" in kw.get("parallel", {}) or "ep" in kw.get("parallel", {}):  # NCCL's send/recv and all-to-all
            for rank in result.ranks:
                measured = {a: row["ring_cost_bytes"] for a, row in rank.comm_bytes_by_axis.items()}
                formula = rank.theory_comm_bytes_by_axis
                if set(measured) != set(formula) or any(abs(measured[a] - formula[a]) > 0.5 for a in formula):
                    raise AssertionError(f"rank {rank.rank}: bytes per axis {measured} != theory {formula}")
            fields["bytes_by_axis"] = measured
            extra = "; bytes per axis = theory (" + ", ".join(f"{a} {mib(v)}" for a, v in sorted(measured.items())) + ")"
        if name == "pipe":  # fp32 activations of one micro-batch on this rank's share of the batch
            s, dp = size("pipe"), kw["parallel"].get("dp", 1)
            fields["boundary_bytes"] = s["batch_size"] // dp // kw["micro_batches"] * s["seq_len"] * s["d_model"] * 4
            extra = f"; boundary activation {mib(fields['boundary_bytes'])} per micro-batch"
        return "ok", summary(fields) + extra, fields
    return check


def pipeline(schedule: str):
    return multi("pp", name="pipe", parallel={"pp": 2}, micro_batches=MICRO, schedule=schedule,
                 chunks=2 if schedule == "interleaved" else 1)


def checkpoint_round_trip():
    """zero2 on dp=2 saves after steps 2 and 4; ddp on tp=2 resumes from step 2. The losses before the
    checkpoint are the saved ones (equal); after it, the same computation in another summation order."""
    needs(2)
    w, steps = work("gpt"), 2 * 2
    with tempfile.TemporaryDirectory() as root:
        a = zerokit.train(w, "zero2", world_size=2, steps=steps, reference=False, save_dir=f"{root}/a", save_every=2,
                          **backend(), **HEARTBEAT).results[0]
        b = zerokit.train(w, "ddp", world_size=2, steps=steps, reference=False, parallel={"tp": 2},
                          resume_from=f"{root}/a/step-000002", **backend(), **HEARTBEAT).results[0]
    rel = max(abs(x - y) / abs(x) for x, y in zip(a.losses, b.losses))
    fields = {"losses_saved_run": a.losses, "losses_resumed_run": b.losses, "max_rel_loss_diff": rel}
    if b.losses[:2] != a.losses[:2] or rel > RHO:
        raise AssertionError(f"losses {a.losses} (zero2 dp=2) vs {b.losses} (resumed on tp=2)")
    return "ok", f"zero2 dp=2 → step 2 → ddp tp=2: losses match, largest relative difference {rel:.1e} ≤ {RHO}", fields


OWN_LOOP = r'''
import datetime, json, os, sys, torch, torch.distributed as dist
import zerokit                                    # before the group: see tests/test_own_loop.py
backend, size, steps, lr = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if backend == "nccl":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))  # a hung collective: an error
work, keep, out = zerokit.tiny_gpt(**size), [], {}
for kind in ("DistributedDataParallel", "stage 1", "stage 2", "stage 3"):
    model, reference = work.build_model().to(device), work.build_model().to(device)
    start = [p.detach().clone() for p in reference.parameters()]
    with torch.no_grad():                         # ranks start different: the wrapper broadcasts rank 0's
        for p in model.parameters():
            p.add_(0.01 * rank)
    if kind == "DistributedDataParallel":
        wrapped = zerokit.DistributedDataParallel(model)
        opt = torch.optim.SGD(wrapped.parameters(), lr=lr)
        forward, backward, step, gathered = wrapped, (lambda loss: loss.backward()), opt.step, None
    else:
        wrapped, _, _, _ = zerokit.initialize(model=model, config={
            "optimizer": {"type": "SGD", "params": {"lr": lr}}, "zero_optimization": {"stage": int(kind[-1])},
            "gradient_clipping": 0})                 # the single-process copy does not clip (DeepSpeed's default: 1)
        forward, backward, step = wrapped, wrapped.backward, wrapped.step
        gathered = wrapped.gathered if kind == "stage 3" else None
    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr)
    for s in range(steps):
        x, y = (t.to(device) for t in work.batch(s))
        per = x.shape[0] // world
        if kind == "DistributedDataParallel":
            opt.zero_grad()
        backward(work.loss(forward(x[rank * per:(rank + 1) * per]), y[rank * per:(rank + 1) * per]))
        step()
        ref_opt.zero_grad()
        work.loss(reference(x), y).backward()
        ref_opt.step()
    ctx = gathered() if gathered else torch.autograd.grad_mode.no_grad()
    with ctx:
        diff = max(float((p.detach().float() - q.detach().float()).abs().max())
                   for p, q in zip(model.parameters(), reference.parameters()))
    movement = max(float((q.detach() - p0).abs().max()) for q, p0 in zip(reference.parameters(), start))
    out[kind] = {"max_abs_param_diff": diff, "movement": movement}
    keep.append((model, wrapped))                 # alive until the group is gone (tests/test_own_loop.py)
if rank == 0:
    print("OWN_LOOP " + json.dumps(out), flush=True)
dist.barrier()
dist.destroy_process_group()
'''


def own_loop():
    needs(2)
    with tempfile.TemporaryDirectory() as root, socket.socket() as s:
        script = os.path.join(root, "own_loop.py")
        with open(script, "w") as f:
            f.write(OWN_LOOP)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                                "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")}
        env["OMP_NUM_THREADS"] = "1"
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               "--master-addr", "127.0.0.1", "--master-port", str(port), script,
                               "gloo" if DRY else "nccl", json.dumps(size("gpt")), str(STEPS), str(SGD_LR)],
                              env=env, capture_output=True, text=True, timeout=240)
    lines = [line for line in done.stdout.splitlines() if line.startswith("OWN_LOOP ")]
    if done.returncode or not lines:
        raise AssertionError(f"torchrun exited {done.returncode}: {(done.stderr or done.stdout)[-600:]}")
    out = json.loads(lines[-1][len("OWN_LOOP "):])
    bad = {k: v for k, v in out.items() if v["max_abs_param_diff"] > sgd_tolerance(v["movement"])}
    if bad:
        raise AssertionError(f"differs from the single-process copy beyond {RHO} × its movement: {bad}")
    diffs = "; ".join(f"{k} |Δp| {v['max_abs_param_diff']:.1e}" for k, v in out.items())
    return "ok", f"torchrun, 2 ranks, vs a single-process copy (≤ {RHO} × movement): {diffs}", out


CHECKS = [
    ("ws=1 fp32", lambda: one_rank("fp32")),
    ("ws=1 bf16-mixed", lambda: one_rank("bf16-mixed")),
    ("offload zero2 optimizer", lambda: offload("zero2", "optimizer")),
    ("offload zero3 params", lambda: offload("zero3", "params")),
    ("activation checkpointing", checkpointing),
    ("memory ledger vs allocator", memory),
    ("ddp overlap", multi("ddp", overlap=True)),
    ("ddp no overlap", multi("ddp", overlap=False)),
    ("ddp ring", multi("ddp", algorithm="ring")),
    ("zero1", multi("zero1")),
    ("zero2", multi("zero2", overlap_comm=False)),
    ("zero2 overlap_comm", multi("zero2", overlap_comm=True)),
    ("zero3", multi("zero3", prefetch=False)),
    ("zero3 prefetch", multi("zero3", prefetch=True)),
    ("zero2 offload ws=2", multi("zero2", offload="optimizer")),
    # persistence: parameters under 1,024 elements (LayerNorms, most biases) stay gathered; the matrices do not
    ("zero3 offload params persistence", multi("zero3", offload="params", param_persistence_threshold=1024)),
    ("tp=2 sequence parallel", multi("tp", parallel={"tp": 2}, sequence_parallel=True)),
    *[(f"pp=2 {s}", pipeline(s)) for s in ("gpipe", "1f1b", "interleaved", "zb-h1")],
    ("dp×tp×pp 2×2×2", multi("zero1", 8, "pipe", parallel={"dp": 2, "tp": 2, "pp": 2}, micro_batches=2)),
    ("cp=2 ring attention", multi("ddp", parallel={"cp": 2}, cp_attention="ring")),
    ("cp=2 Ulysses", multi("ddp", parallel={"cp": 2}, cp_attention="ulysses")),
    ("dp×ep 2×2 mixture of experts", multi("ddp", 2, "moe", parallel={"dp": 2, "ep": 2})),
    ("cp×tp 2×2 ring attention", multi("ddp", 4, parallel={"cp": 2, "tp": 2}, cp_attention="ring")),
    ("dp×ep×tp 2×2×2 experts split by tp", multi("ddp", 4, "moe", parallel={"dp": 2, "ep": 2, "tp": 2})),
    ("checkpoint round trip", checkpoint_round_trip),
    ("own loop under torchrun", own_loop),
]
MULTI_RANK = [name for name, _ in CHECKS[6:]]


def run(name: str, fn) -> dict:
    t0 = time.perf_counter()
    try:
        status, detail, fields = fn()
    except Skip as e:
        status, detail, fields = "skip", str(e), {}
    except Exception as e:  # noqa: BLE001 - every failure becomes its row
        traceback.print_exc()
        lines = [line for line in str(e).splitlines() if line.strip()]
        status, detail, fields = "FAIL", f"{type(e).__name__}: {(lines or [''])[-1][:300]}", {}
    row = {"name": name, "status": status, "detail": detail, "seconds": round(time.perf_counter() - t0, 1), **fields}
    print(f"[{status}] {name} ({row['seconds']} s): {detail}", flush=True)
    return row


def main(argv=None) -> int:
    global DRY, GPUS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="every check on the CPU, gloo, small sizes (CI)")
    parser.add_argument("--json", default="gpu_check.json", help="where the rows go (default: ./gpu_check.json)")
    parser.add_argument("--only", default="", help="run only the checks whose name contains this")
    args = parser.parse_args(argv)
    DRY, GPUS = args.dry, torch.cuda.device_count()
    if not DRY and GPUS == 0:
        print("gpu_check: no CUDA device here; run with --dry for the CPU path", file=sys.stderr)
        return 2
    started, rows = time.perf_counter(), []
    device = "CPU (--dry)" if DRY else f"{GPUS} × {torch.cuda.get_device_name(0)}"
    for name, fn in [(name, fn) for name, fn in CHECKS if args.only in name]:
        rows.append(run(name, fn))
        seconds = time.perf_counter() - started
        with open(args.json, "w") as f:  # after every row: a session cut short keeps the rows it has
            json.dump({"device": device, "torch": torch.__version__, "dry": DRY, "seconds": round(seconds, 1),
                       "checks": rows}, f, indent=2, default=str)
    if not rows:
        print(f"gpu_check: no check's name contains {args.only!r}", file=sys.stderr)
        return 2
    print(f"\ngpu_check on {device}, torch {torch.__version__}, {seconds:.0f} s; rows in {args.json}")
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['status']:<4}  {r['seconds']:>6.1f} s  {r['detail']}")
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
