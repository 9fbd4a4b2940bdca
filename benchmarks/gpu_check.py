"""One CUDA GPU, one script: does everything zerokit measures on the CPU hold on a GPU?

    python benchmarks/gpu_check.py          # on a machine with a CUDA GPU (under 8 minutes)
    python benchmarks/gpu_check.py --dry    # the same code path on the CPU, small sizes (CI runs this)

Each check prints one row of the table printed last; a check that fails prints its error
in its row and the script exits 1. The checks:

1. **strategies at world size 1** on NCCL (gloo with ``--dry``): every zerokit strategy and
   peer that runs on one rank trains the tiny GPT; parity with the single-process reference.
   Multi-rank cells need a GPU per rank: with one GPU they are not run here (the CPU suite
   runs them on gloo ranks).
2. **memory ledger vs torch**: the ledger's peak bytes against ``torch.cuda.max_memory_allocated``
   (within 2 %, plus the allocator's rounding); on ``--dry`` there is no CUDA allocator to compare.
3. **offload bandwidth**: zerokit's device→host and host→device copies of a ZeRO-Offload step
   against a plain pinned copy of the same bytes.
4. **activation checkpointing**: a ~1 B-parameter GPT in bf16 (a tiny one with ``--dry``): peak
   memory and step time with ``every`` against ``none``.
5. **the own-loop wrappers** on a GPU model: ``zerokit.initialize`` at stages 0–3, losses against
   a plain copy.

Nothing here has run on a GPU yet: the machines this project was built on had none, so the
CUDA paths (NCCL at world size 1, pinned offload buffers and the side stream, CUDA-event
timing) are exercised for the first time by this script.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback

import torch

import zerokit

ROWS: list = []


def row(check: str, status: str, detail: str) -> None:
    ROWS.append((check, status, detail))
    print(f"[{status}] {check}: {detail}", flush=True)


def run(check: str, fn) -> None:
    try:
        status, detail = fn()
    except Exception as e:  # noqa: BLE001 - every failure becomes its row
        status, detail = "FAIL", f"{type(e).__name__}: {e}".splitlines()[0][:200]
        traceback.print_exc()
    row(check, status, detail)


def gpt(dry: bool):
    return zerokit.tiny_gpt(vocab=128, seq_len=32, d_model=64, n_layer=2, n_head=4, batch_size=4) if dry \
        else zerokit.tiny_gpt(vocab=4096, seq_len=256, d_model=512, n_layer=8, n_head=8, batch_size=8)


def strategies_at_one_rank(dry: bool):
    names = ["ddp", "zero1", "zero2", "zero3", "torch-ddp", "fsdp2-zero3"]
    out = []
    for name in names:
        report = zerokit.train(gpt(dry), name, world_size=1, steps=3, optimizer="sgd", lr=0.1)
        diff = report.results[0].max_abs_param_diff
        if diff is None or diff > 1e-4:
            raise AssertionError(f"{name}: |Δparam| {diff} vs the reference")
        out.append(f"{name} {diff:.1e}")
    return "ok", "; ".join(out)


def ledger_vs_torch(dry: bool):
    report = zerokit.train(gpt(dry), "zero2", world_size=1, steps=2, reference=False)
    rank = report.results[0].ranks[0]
    if rank.cuda_peak_bytes is None:
        return "n/a", f"no CUDA allocator (ledger peak {rank.peak_bytes:,} B measured from storages)"
    ratio = rank.peak_bytes / rank.cuda_peak_bytes
    status = "ok" if 0.98 <= ratio <= 1.02 else "FAIL"
    return status, f"ledger {rank.peak_bytes:,} B / torch {rank.cuda_peak_bytes:,} B = {ratio:.3f}"


def offload_bandwidth(dry: bool):
    report = zerokit.train(gpt(dry), "zero2", world_size=1, steps=3, reference=False, offload="optimizer",
                           precision="bf16-mixed", track_peak=False)
    rank = report.results[0].ranks[0]
    moved = int(sum((rank.transfer_bytes_per_step or {}).values()))
    device = torch.device("cuda" if torch.cuda.is_available() and not dry else "cpu")
    src = torch.empty(max(moved // 2, 1), dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src, device="cpu").pin_memory() if device.type == "cuda" else torch.empty_like(src)
    t0 = time.perf_counter()
    for _ in range(10):
        dst.copy_(src, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    plain = (time.perf_counter() - t0) / 10
    step = report.results[0].step_time_s_median
    return "ok", (f"offload moves {moved:,} B per step (measured); a plain {'pinned ' if device.type == 'cuda' else ''}"
                  f"copy of as many bytes one way takes {plain * 1e3:.3f} ms; the offloaded step {step * 1e3:.1f} ms")


def checkpointing(dry: bool):
    work = gpt(dry) if dry else zerokit.tiny_gpt(vocab=32000, seq_len=1024, d_model=2048, n_layer=20, n_head=16,
                                                  batch_size=4)
    out = {}
    for policy in ("none", "every"):
        report = zerokit.train(work, "ddp", world_size=1, steps=3, reference=False, checkpointing=policy,
                               precision="bf16-mixed" if not dry else "fp32")
        rank = report.results[0].ranks[0]
        out[policy] = (rank.peak_by_category["activations"], report.results[0].step_time_s_median)
    saved = out["every"][0] / max(out["none"][0], 1)
    slower = out["every"][1] / out["none"][1]
    return "ok", f"activations at peak ×{saved:.2f} with 'every', step time ×{slower:.2f}"


def _own_loop(ctx, stage):
    work = zerokit.tiny_gpt(vocab=128, seq_len=32, d_model=64, n_layer=2, n_head=4, batch_size=4)
    model, reference = work.build_model().to(ctx.device), work.build_model().to(ctx.device)
    engine, _, _, _ = zerokit.initialize(model=model, config={
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": stage}})
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    diffs = []
    for step in range(3):
        x, y = (t.to(ctx.device) for t in work.batch(step))
        loss = work.loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        ref_loss = work.loss(reference(x), y)
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        diffs.append(abs(float(loss.detach()) - float(ref_loss.detach())))
    return max(diffs)


def own_loop(dry: bool):
    out = []
    for stage in range(4):
        diff = zerokit.launch(_own_loop, 1, stage, backend="gloo" if dry else None)[0]
        if diff > 1e-4:
            raise AssertionError(f"stage {stage}: loss differs by {diff}")
        out.append(f"stage {stage} {diff:.1e}")
    return "ok", "; ".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="the same checks on the CPU with small sizes (CI)")
    args = parser.parse_args(argv)
    if not args.dry and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run with --dry for the CPU path", file=sys.stderr)
        return 2
    started = time.perf_counter()
    for name, fn in (("strategies at world size 1", strategies_at_one_rank), ("ledger vs torch", ledger_vs_torch),
                     ("offload copies", offload_bandwidth), ("activation checkpointing", checkpointing),
                     ("own-loop wrappers", own_loop)):
        run(name, lambda fn=fn: fn(args.dry))
    device = "CPU (--dry)" if args.dry else torch.cuda.get_device_name(0)
    print(f"\ngpu_check on {device}, torch {torch.__version__}, {time.perf_counter() - started:.0f} s")
    width = max(len(c) for c, _, _ in ROWS)
    for check, status, detail in ROWS:
        print(f"{check:<{width}}  {status:<4}  {detail}")
    return 1 if any(status == "FAIL" for _, status, _ in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())
