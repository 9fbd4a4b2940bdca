"""``gpu_check.py``'s own-loop rows: zerokit's wrappers in a user's own loop, in a process group the user made.

Each rank trains ``zerokit.DistributedDataParallel`` and ``zerokit.initialize`` at ZeRO stages 1, 2 and 3 with
SGD on its share of the batch, next to a single-process copy on the whole batch, and measures its last step with
``zerokit.measure``: on CUDA that block must be timed with CUDA events (the device clock) and its memory ledger
must read the allocator. A plain script runs this file under ``torchrun --nproc-per-node N`` (a bare torchrun:
no zerokit.launch); a gpu_check that torchrun started runs :func:`own_loop_rank` in its own process instead —
never a torchrun inside a torchrun.
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist

import zerokit  # before the group: see tests/api/test_own_loop.py
from zerokit.runtime import clock

KINDS = ("DistributedDataParallel", "stage 1", "stage 2", "stage 3")


def own_loop_rank(backend: str, size: dict, steps: int, lr: float) -> dict:
    """This rank's |Δparam| against a single-process copy and what ``zerokit.measure`` read, per wrapper."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    made = not dist.is_initialized()
    if made:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))  # a hung collective: an error
    work, keep, out = zerokit.tiny_gpt(**size), [], {}
    for kind in KINDS:
        model, reference = work.build_model().to(device), work.build_model().to(device)
        start = [p.detach().clone() for p in reference.parameters()]
        with torch.no_grad():                         # ranks start different: the wrapper broadcasts rank 0's
            for p in model.parameters():
                p.add_(0.01 * rank)
        if kind == "DistributedDataParallel":
            wrapped = zerokit.DistributedDataParallel(model)
            opt = torch.optim.SGD(wrapped.parameters(), lr=lr)
            forward, backward, step, gathered, measured = wrapped, (lambda loss: loss.backward()), opt.step, None, \
                (wrapped, opt)
        else:
            wrapped, _, _, _ = zerokit.initialize(model=model, config={
                "optimizer": {"type": "SGD", "params": {"lr": lr}}, "zero_optimization": {"stage": int(kind[-1])},
                "gradient_clipping": 0})             # the single-process copy does not clip (DeepSpeed's default: 1)
            forward, backward, step, measured = wrapped, wrapped.backward, wrapped.step, (wrapped,)
            gathered = wrapped.gathered if kind == "stage 3" else None
        ref_opt = torch.optim.SGD(reference.parameters(), lr=lr)
        for s in range(steps):
            x, y = (t.to(device) for t in work.batch(s))
            per = x.shape[0] // world
            with zerokit.measure(*measured) if s == steps - 1 else _nothing() as m:
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
        out[kind] = {"max_abs_param_diff": diff, "movement": movement, "measure_seconds": m.seconds,
                     "measure_peak_bytes": m.peak.get("total"), "device_clock": clock.on_device(),
                     "measure_allocator_at_peak": m.ledger.allocator_at_peak}
        keep.append((model, wrapped))                 # alive until the group is gone (tests/api/test_own_loop.py)
    dist.barrier()
    if made:
        dist.destroy_process_group()
    return out


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def check(out: dict, cuda: bool, rho: float) -> list:
    """What is wrong with one rank's :func:`own_loop_rank` (empty: nothing)."""
    errors = []
    for kind, v in out.items():
        if v["max_abs_param_diff"] > rho * v["movement"]:
            errors.append(f"{kind}: |Δp| {v['max_abs_param_diff']:.1e} > {rho} × movement {v['movement']:.1e}")
        if not v["measure_seconds"] > 0 or not v["measure_peak_bytes"]:
            errors.append(f"{kind}: zerokit.measure read {v['measure_seconds']} s, {v['measure_peak_bytes']} B")
        if cuda and not v["device_clock"]:
            errors.append(f"{kind}: zerokit.measure timed CUDA work with the host's clock, not CUDA events")
        if cuda and v["measure_allocator_at_peak"] is None:
            errors.append(f"{kind}: zerokit.measure's ledger did not read the CUDA allocator")
    return errors


def own_loop(world: int):
    import gpu_check_common as c

    c.needs(world)
    backend = "gloo" if c.DRY else "nccl"
    args = (backend, c.size("gpt"), c.STEPS, c.SGD_LR)
    if c.TORCHRUN is not None:  # the ranks exist: this process is one of them
        out, how = own_loop_rank(*args), f"in torchrun's {world} ranks"
    else:
        out, how = _under_torchrun(world, args), f"torchrun --nproc-per-node {world}"
    errors = check(out, not c.DRY, c.RHO)
    if errors:
        raise AssertionError("; ".join(errors))
    clock_used = "CUDA events" if not c.DRY else "host clock (CPU)"
    diffs = "; ".join(f"{k} |Δp| {v['max_abs_param_diff']:.1e}, measured {1e3 * v['measure_seconds']:.1f} ms"
                      for k, v in out.items())
    return "ok", f"{how}, {backend}, zerokit.measure on {clock_used}, vs a single-process copy: {diffs}", out


def _under_torchrun(world: int, args) -> dict:
    with tempfile.TemporaryDirectory() as root, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                                "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")}
        env["OMP_NUM_THREADS"] = "1"
        backend, size, steps, lr = args
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
                               "--master-addr", "127.0.0.1", "--master-port", str(port), __file__,
                               backend, json.dumps(size), str(steps), str(lr)],
                              env=env, capture_output=True, text=True, timeout=240, cwd=root)
    lines = [line for line in done.stdout.splitlines() if line.startswith("OWN_LOOP ")]
    if done.returncode or not lines:
        raise AssertionError(f"torchrun exited {done.returncode}: {(done.stderr or done.stdout)[-600:]}")
    return json.loads(lines[-1][len("OWN_LOOP "):])


if __name__ == "__main__":  # a torchrun worker
    result = own_loop_rank(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    if int(os.environ["RANK"]) == 0:
        print("OWN_LOOP " + json.dumps(result), flush=True)
