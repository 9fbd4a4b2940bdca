"""``gpu_check.py``'s one-rank rows: each runs one rank on the GPU (the CPU with --dry), no NCCL peer."""
from __future__ import annotations

import importlib.util
import sys
import tempfile
import traceback

import torch

import zerokit
from zerokit.job import make_job
from zerokit.report import param_difference
from zerokit.strategies import REGISTRY, load_all

import gpu_check_common as c

#: with --dry the one-rank sweeps take one strategy per family (the CPU suite trains every strategy against the
#: reference at 1 to 4 ranks already): the script's path is the same, in a fifth of the time CI would spend
DRY_SWEEP = ("ddp", "zero1", "zero2", "zero3", "pp", "fully-shard", "torch-ddp", "torch-zero1", "fsdp2-zero3")
#: peers registered only when their package imports: missing, their rows say so (skipped), never fail
OPTIONAL = {"deepspeed": ("deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3", "deepspeed-zero2-offload",
                          "deepspeed-zeropp", "deepspeed-ulysses", "deepspeed-moe")}


def missing(strategy: str) -> str | None:
    """Why ``strategy`` cannot run here (its package is not installed), else None."""
    load_all()
    for package, names in OPTIONAL.items():
        if strategy in names and importlib.util.find_spec(package) is None:
            return f"{package} is not installed"
    return None if strategy in REGISTRY else f"no strategy {strategy!r} is registered"


def one_rank(precision: str):
    c.needs(1)
    load_all()
    ran, refused, failed, fields = {}, {}, {}, {}
    for strategy in REGISTRY:
        if strategy == "single" or (c.DRY and strategy not in DRY_SWEEP):  # "single" is the reference itself
            continue
        try:
            _, fields[strategy] = c.train("gpt", strategy, 1, precision, optimizer="adamw")
            ran[strategy] = fields[strategy]["max_abs_param_diff"]
        except Exception as e:  # noqa: BLE001 - one strategy's failure is not the others'
            if isinstance(e, zerokit.RankFailed) and c.refusal(e) is not None:
                refused[strategy] = c.refusal(e)
            else:
                traceback.print_exc()
                failed[strategy] = f"{type(e).__name__}: {[x for x in str(e).splitlines() if x.strip()][-1][:200]}"
    skipped = {p: f"skipped: {p} is not installed" for p in OPTIONAL if importlib.util.find_spec(p) is None}
    parts = [f"FAILED {k}: {v}" for k, v in failed.items()]
    if ran:
        worst = max(ran, key=ran.get)
        parts.append(f"{len(ran)} ran, largest |Δp| {ran[worst]:.1e} ({worst}) ≤ {fields[worst]['tolerance']:.1e}")
    parts += [f"refused {k}: {v.replace(f'strategy {k!r} ', '')[:70]}" for k, v in refused.items()]
    parts += [f"{p}'s peers {v}" for p, v in skipped.items()]
    status = "FAIL" if failed or not ran else "ok"
    return status, "; ".join(parts), {"strategies": fields, "refused": refused, "failed": failed, "skipped": skipped}


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
    c.needs(1)
    job = make_job(c.work("gpt"), strategy, 1, c.STEPS, "bf16-mixed", "adamw", c.LR, 1, {"offload": mode})
    (rank, seen), = zerokit.launch(_pinned_run_rank, 1, job, timeout_s=240, **c.backend())
    ref = c.reference("gpt", "bf16-mixed", "adamw", c.LR)
    diff = param_difference(rank.params, ref["params"])["max_abs"]
    tol = c.adamw_tolerance("bf16-mixed", ref["pmax"], False)
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
    pinned = ("pinning n/a (CPU)" if c.DRY else
              f"all {len(seen)} copies pinned, {fields['side_stream_copies']} on a side stream")
    return "ok", (f"d2h {c.mib(measured['d2h'])}, h2d {c.mib(measured['h2d'])} per step = theory; {pinned}; "
                  f"|Δp| {diff:.1e} ≤ {tol:.1e}"), fields


def checkpointing():
    c.needs(1)
    out = {}
    for policy in ("none", "every"):
        result = zerokit.train(c.work("big"), "ddp", world_size=1, steps=c.STEPS, reference=False,
                               checkpointing=policy, precision="bf16-mixed", timeout_s=400, **c.backend()).results[0]
        rank = result.ranks[0]
        out[policy] = {"activations_at_peak": rank.peak_by_category["activations"], "peak_bytes": rank.peak_bytes,
                       "step_time_s_median": result.step_time_s_median, "mfu": c.mfu(result, "big"),
                       "recomputed_forwards": rank.recomputed_forwards, "param_count": result.param_count}
    none, every, act = out["none"], out["every"], "activations_at_peak"
    if not every["recomputed_forwards"] or every["activations_at_peak"] >= none["activations_at_peak"]:
        raise AssertionError(f"'every' recomputed {every['recomputed_forwards']} forwards and kept "
                             f"{c.mib(every[act])} of activations against {c.mib(none[act])}")
    m = "" if every["mfu"] is None else f"; MFU {100 * none['mfu']:.1f}% → {100 * every['mfu']:.1f}%"
    return "ok", (f"Ψ {none['param_count']:,} bf16: activations at peak {c.mib(none['activations_at_peak'])} "
                  f"→ {c.mib(every['activations_at_peak'])}, step {1e3 * none['step_time_s_median']:.0f} → "
                  f"{1e3 * every['step_time_s_median']:.0f} ms{m}"), out


def resume(strategy: str):
    """``strategy`` at one rank saves after steps 2 and 4 with AdamW (torch's fused kernel on CUDA, zerokit.optim);
    a second run resumes from step 2. Adam's ``step`` tensors come back from the checkpoint and must land where
    the fused kernel wants them (the master's device): the resumed steps equal the saved run's."""
    c.needs(1)
    w, steps = c.work("gpt"), 4
    with tempfile.TemporaryDirectory() as root:
        a = zerokit.train(w, strategy, world_size=1, steps=steps, optimizer="adamw", lr=c.LR, reference=False,
                          save_dir=f"{root}/a", save_every=2, timeout_s=240, **c.backend()).results[0]
        b = zerokit.train(w, strategy, world_size=1, steps=steps, optimizer="adamw", lr=c.LR, reference=False,
                          resume_from=f"{root}/a/step-000002", timeout_s=240, **c.backend()).results[0]
    diff = param_difference(b.ranks[0].params, a.ranks[0].params)["max_abs"]
    pmax = max(float(v.abs().max()) for v in a.ranks[0].params.values())
    tol = c.adamw_tolerance("fp32", pmax, same_kernels=c.DRY)
    rel = max(abs(x - y) / abs(x) for x, y in zip(a.losses, b.losses))
    fields = {"losses_saved_run": a.losses, "losses_resumed_run": b.losses, "max_rel_loss_diff": rel,
              "max_abs_param_diff": diff, "tolerance": tol}
    if b.losses[:2] != a.losses[:2] or rel > c.RHO or diff > tol:
        raise AssertionError(f"losses {a.losses} (saved run) vs {b.losses} (resumed); |Δp| {diff:.1e} vs {tol:.1e}")
    kernel = "torch's CPU AdamW" if c.DRY else "fused AdamW on CUDA"
    return "ok", (f"{kernel}: step 2 → resumed, losses match (relative {rel:.1e} ≤ {c.RHO}), "
                  f"|Δp| {diff:.1e} ≤ {tol:.1e}"), fields


def experts():
    """The mixture-of-experts GPT at one rank: its router, top-k dispatch and combine on the GPU, against the
    reference (the rows at ep=2 send the tokens between ranks)."""
    c.needs(1)
    _, fields = c.train("moe", "ddp", 1, "fp32", optimizer="adamw")
    return "ok", f"{c.size('moe')['n_experts']} experts, top-{c.size('moe')['top_k']}: {c.summary(fields)}", fields


# --- the memory ledger against the caching allocator -------------------------------------------
#: the caching allocator rounds every block up to a multiple of 512 bytes (c10/cuda/CUDACachingAllocator.cpp,
#: kMinBlockSize); a tensor of n bytes holds ≤ n + 511
ROUNDING = 512
#: live tensors per parameter at most: the bf16 weight, its gradient, the fp32 master and its gradient cast,
#: Adam's two moments and step, a flat buffer's view; and saved activations per block, at most
TENSORS_PER_PARAM, SAVED_PER_BLOCK = 8, 32


def memory_margin(s: dict, precision: str, psi: int, param_tensors: int, hopper: bool) -> dict:
    """The largest gap allowed between ``torch.cuda.max_memory_allocated`` and the ledger's peak (bytes, by part).

    ``max_memory_allocated`` − the ledger's peak ≤ what the allocator holds and the ledger does not name at the
    allocator's peak (the ledger then holds at most its peak). That is, at most:

    - cuBLAS's workspace, on the one stream that runs the matmuls (theory.step_transients);
    - the allocator's rounding: every block a multiple of 512 bytes, ≤ 511 bytes per live tensor;
    - the larger of two moments that never overlap: the loss's backward — the logits in the parameters' dtype
      (B·T·V·b: held by the loop, saved by no autograd node), and the gradients of log-softmax's output and of
      its input, in fp32 because the loss upcasts the logits (2 · 4·B·T·V) — and the optimizer's step, which
      casts each 16-bit gradient to fp32 for its master (4·Ψ in bf16-mixed, 0 in fp32);
    - one op's backward elsewhere alive at the same moment, at most the MLP hidden's gradient (B·T·4d, twice:
      GELU's input and output) or the attention scores' (B·a·T², twice).

    Measured on an H200 (torch 2.11, the GPU "memory" GPT: B 8, T 512, V 32000, d 1024, bf16-mixed zero2): the
    gap was 1,315 MiB against this margin's 1,411 MiB — the logits' 1,250 MiB, cuBLAS's 32 MiB, 33 MiB of other
    small tensors. A ledger missing the bf16 gradients (318 MiB) or the fp32 master (636 MiB) exceeds it.
    """
    t = zerokit.theory.step_transients(batch_size=s["batch_size"], seq_len=s["seq_len"], vocab=s["vocab"],
                                       stepped_numel=psi, precision=precision, hopper=hopper)
    b = 2 if precision == "bf16-mixed" else 4
    btv = s["batch_size"] * s["seq_len"] * s["vocab"]
    loss, step = btv * b + 2 * 4 * btv, t["fp32 copies of 16-bit gradients"]
    tensors = TENSORS_PER_PARAM * param_tensors + SAVED_PER_BLOCK * s["n_layer"]
    return {"cuBLAS workspace": t["cuBLAS workspace"],
            f"rounding (512 B × {tensors} tensors)": ROUNDING * tensors,
            ("the loss's backward (logits + 2 fp32 gradients)" if loss >= step
             else "the step's fp32 copies of 16-bit gradients"): max(loss, step),
            "one op's backward": 2 * b * max(s["batch_size"] * s["seq_len"] * 4 * s["d_model"],
                                             s["batch_size"] * s["n_head"] * s["seq_len"] ** 2)}


def memory_verdict(ledger_peak: int, cuda_peak: int | None, at_peak: int | None, margin: int) -> str | None:
    """Why the ledger and the allocator disagree beyond the margin, else None (also None without CUDA)."""
    if cuda_peak is None:
        return None
    if at_peak is not None and at_peak < ledger_peak:
        return (f"the ledger's peak {c.mib(ledger_peak)} exceeds what the allocator held at that sample "
                f"({c.mib(at_peak)}): the ledger counts bytes twice or off the device")
    if cuda_peak - ledger_peak > margin:
        return (f"torch's peak {c.mib(cuda_peak)} − the ledger's {c.mib(ledger_peak)} = "
                f"{c.mib(cuda_peak - ledger_peak)} > the margin {c.mib(margin)}: the ledger misses memory")
    return None


def memory():
    c.needs(1)
    precision = "bf16-mixed"
    result = zerokit.train(c.work("memory"), "zero2", world_size=1, steps=c.STEPS, precision=precision,
                           reference=False, timeout_s=300, **c.backend()).results[0]
    rank = result.ranks[0]
    names = ("peak_bytes", "cuda_peak_bytes", "allocator_at_peak", "allocator_gap_max", "allocator_gap_where")
    fields = {k: getattr(rank, k, None) for k in names}
    hopper = not c.DRY and torch.cuda.get_device_capability(0)[0] == 9
    tensors = len(list(c.work("memory").build_model().parameters()))
    parts = memory_margin(c.size("memory"), precision, result.param_count, tensors, hopper)
    margin = sum(parts.values())
    fields.update(peak_where=rank.peak_where, margin_bytes=margin, margin_parts=parts)
    gap = None if fields["cuda_peak_bytes"] is None else fields["cuda_peak_bytes"] - rank.peak_bytes
    fields["gap_bytes"] = gap
    detail = (f"ledger peak {c.mib(rank.peak_bytes)} at {rank.peak_where!r}; torch max allocated "
              f"{c.mib(fields['cuda_peak_bytes'])} (gap {c.mib(gap)} ≤ margin {c.mib(margin)}: "
              + ", ".join(f"{k} {c.mib(v)}" for k, v in parts.items()) + "); allocated at the ledger's peak "
              f"{c.mib(fields['allocator_at_peak'])}; largest sampled gap {c.mib(fields['allocator_gap_max'])} "
              f"at {fields['allocator_gap_where']!r}")
    why = memory_verdict(rank.peak_bytes, fields["cuda_peak_bytes"], fields["allocator_at_peak"], margin)
    if why:
        raise AssertionError(why + " — " + detail)
    return ("n/a" if fields["cuda_peak_bytes"] is None else "ok"), detail, fields

