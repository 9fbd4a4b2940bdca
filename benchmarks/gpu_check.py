"""The one script a GPU session runs: does everything zerokit measures on the CPU hold on CUDA and NCCL?

    python benchmarks/gpu_check.py                    # a plain script: every row this machine's GPUs allow
    torchrun --nproc_per_node=N benchmarks/gpu_check.py   # the rows of N ranks, in torchrun's N processes
    python benchmarks/gpu_check.py --dry              # every row on the CPU, gloo ranks, small sizes (CI)
    python benchmarks/gpu_check.py --json out.json --only zero3,memory   # the JSON elsewhere; matching rows

Two machines (node 0 reachable at 10.0.0.1, 8 GPUs each; the same command on both, ``--node_rank`` apart; the
rows of 16 ranks run — every data-parallel row across both nodes — and node 0's rank 0 writes the JSON)::

    torchrun --nnodes=2 --nproc_per_node=8 --node_rank=0 --master_addr=10.0.0.1 --master_port=29500 \\
        benchmarks/gpu_check.py --json two_nodes.json
    torchrun --nnodes=2 --nproc_per_node=8 --node_rank=1 --master_addr=10.0.0.1 --master_port=29500 \\
        benchmarks/gpu_check.py

Time: on one H200 (torch 2.11) the plain script's one-rank rows take about 11 minutes — each row a fresh NCCL
process of ~12 s; the fp32 sweep's 17 strategies 200 s, the bf16 sweep about as long, the 1 B model's two runs
110 s, the other rows 20 s each — and the multi-rank rows skip at once. ``--only`` picks rows by name.

Exit codes: **0** every row ran ok (or ``n/a``/``skip``) and NCCL was exercised (a row of ≥ 2 ranks ran on it),
or ``--dry`` ran; **1** a row FAILed; **2** nothing could run (no CUDA device without ``--dry``, no row matched
``--only``, torchrun started more ranks per node than there are GPUs); **3** no row failed but NCCL was *not*
exercised (one GPU, or every multi-rank row skipped): not a pass.

Each row is one line of the table printed last and one object of the JSON file (``--json``, default
``gpu_check.json`` here: name, status ``ok``/``FAIL``/``skip``/``n/a``, detail, seconds and the measured numbers
as fields; rewritten after every row, so a session cut short keeps what ran). A failing row prints its error in
its line; a row that cannot run here is ``skip`` with the reason (a missing package: ``skipped: deepspeed is not
installed``); a row that cannot run on this world is ``n/a`` with the reason — its strategy refused the run
(``refused on 2 ranks: …``: the torch ring-attention peer on CUDA), its groups do not divide the world (hsdp, hpZ,
FSDP2-HSDP on torchrun's 3 ranks), qgZ on one node. A plain script runs every row; under torchrun (its agent's
variables set: ``under_torchrun``) the ranks exist already, so the rows of torchrun's world size run in its
processes — a data-parallel row at that world, a row of another layout ``skip`` (run torchrun again with its
``--nproc_per_node``) — and the own-loop rows run in those processes too: no torchrun is started inside torchrun.

One rank (a plain script on the first GPU, or ``torchrun --nproc_per_node=1``; the CPU with ``--dry``): every
strategy and peer at one rank in fp32 and bf16-mixed against the single-process reference
(:mod:`gpu_check_one`; with ``--dry`` one per family), offload's pinned copies and bytes, activation
checkpointing, the memory ledger against ``torch.cuda.max_memory_allocated`` (FAIL beyond the margin derived at
``gpu_check_one.memory_margin``), resume from a checkpoint with fused AdamW, the mixture of experts' forward
and backward, and an own loop under ``torchrun --nproc-per-node 1`` timed by ``zerokit.measure`` with CUDA events.

Above one rank (:mod:`gpu_check_multi`): ddp, ZeRO-1/2/3 and their options, offload, hsdp, ZeRO++'s hpZ, and
its qwZ and qgZ (:mod:`gpu_check_zeropp`: int8 weight codes through the all-gathers, int4 / int8 gradient codes
through qgZ's two all-to-all hops, on 4 ranks as 2 nodes of 2), tp with sequence parallelism, the four pipeline
schedules, dp×tp×pp, cp (ring, Ulysses), dp×cp under ZeRO-3, Ulysses×tp, cp×tp, ep under ddp and ZeRO-1/2/3,
ep×tp; every peer (torch DDP, ZeroRedundancyOptimizer, FSDP2 — with CPUOffloadPolicy too —, DeepSpeed — with
ZeRO-Offload and hpZ too —, torch TP, torch pipelining, torch ring attention, DeepSpeed Ulysses and MoE);
``zerokit.fully_shard``; data parallelism on every rank of the node with zerokit.train's own reference; a
checkpoint saved under zero2 dp=2 and resumed under tp=2; and the own-loop wrappers on 2 ranks. Each reports
parity (SGD, bound at ``gpu_check_common.sgd_tolerance``; the quantized rows' bounds in :mod:`gpu_check_zeropp`),
seconds blocked in collectives (> 0 asserted), the median step time and, on a GPU of known peak, MFU; the cp, ep
and quantized rows their bytes per axis against the theory.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the rows' modules, beside this file

import gpu_check_common as c  # noqa: E402
from gpu_check_multi import checkpoint_round_trip, multi, pipeline  # noqa: E402
from gpu_check_one import checkpointing, experts, memory, offload, one_rank, resume  # noqa: E402
from gpu_check_own_loop import own_loop  # noqa: E402
from gpu_check_zeropp import quantized  # noqa: E402

PASS, FAILED, CANNOT_RUN, NO_NCCL = 0, 1, 2, 3
EP = {"dp": 2, "ep": 2}

ONE_RANK = [  # the quick ones first: a session cut short keeps them
    ("memory ledger vs allocator", memory),
    ("resume ddp, fused AdamW", lambda: resume("ddp")),
    ("resume zero2, fused AdamW", lambda: resume("zero2")),
    ("mixture of experts ws=1", experts),
    ("own loop, torchrun 1 rank, zerokit.measure", lambda: own_loop(1)),
    ("offload zero2 optimizer", lambda: offload("zero2", "optimizer")),
    ("offload zero3 params", lambda: offload("zero3", "params")),
    ("ws=1 fp32", lambda: one_rank("fp32")),
    ("ws=1 bf16-mixed", lambda: one_rank("bf16-mixed")),
    ("activation checkpointing", checkpointing),
]
MULTI_RANK = [
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
    ("zerokit.fully_shard", multi("fully-shard")),
    # two groups of 2: on one node of 4 GPUs its "nodes" are pairs of GPUs (the bytes per axis are the same)
    ("hsdp 2×2", multi("hsdp", 4, shard_group_size=2)),
    ("ZeRO++ hpZ 2 of 4", multi("zeropp", 4, zero_hpz_partition_size=2)),  # exact: qwZ and qgZ quantize
    # qwZ's int8 codes through the all-gathers, qgZ's int4 / int8 through its two all-to-all hops (2 nodes of 2)
    ("ZeRO++ qwZ int8 weights", quantized(weights=True)),
    *[(f"ZeRO++ qgZ int{b} gradients", quantized(gradients=True, bits=b)) for b in (4, 8)],
    ("dp on every rank of the node", multi("ddp", "node", reference=True)),
    ("tp=2 sequence parallel", multi("tp", parallel={"tp": 2}, sequence_parallel=True)),
    *[(f"pp=2 {s}", pipeline(s)) for s in ("gpipe", "1f1b", "interleaved", "zb-h1")],
    ("dp×tp×pp 2×2×2", multi("zero1", 8, "pipe", parallel={"dp": 2, "tp": 2, "pp": 2}, micro_batches=2)),
    ("cp=2 ring attention", multi("ddp", parallel={"cp": 2}, cp_attention="ring")),
    ("cp=2 Ulysses", multi("ddp", parallel={"cp": 2}, cp_attention="ulysses")),
    ("dp×cp 2×2 zero3", multi("zero3", 4, parallel={"dp": 2, "cp": 2}, cp_attention="ring")),
    ("Ulysses×tp 2×2", multi("ddp", 4, parallel={"cp": 2, "tp": 2}, cp_attention="ulysses")),
    ("cp×tp 2×2 ring attention", multi("ddp", 4, parallel={"cp": 2, "tp": 2}, cp_attention="ring")),
    ("dp×ep 2×2 mixture of experts", multi("ddp", 2, "moe", parallel=EP)),
    *[(f"ep zero{k}", multi(f"zero{k}", 2, "moe", parallel=EP)) for k in (1, 2, 3)],
    ("dp×ep×tp 2×2×2 experts split by tp", multi("ddp", 4, "moe", parallel={"dp": 2, "ep": 2, "tp": 2})),
    ("checkpoint round trip", checkpoint_round_trip),
    ("own loop under torchrun", lambda: own_loop(2)),
    # the peers: torch's and DeepSpeed's implementations in the same ledgers
    ("peer torch DDP", multi("torch-ddp")),
    ("peer torch ZeroRedundancyOptimizer", multi("torch-zero1")),
    ("peer FSDP2 zero2", multi("fsdp2-zero2")),
    ("peer FSDP2 zero3", multi("fsdp2-zero3")),
    ("peer FSDP2 zero3 offload", multi("fsdp2-zero3-offload")),  # CPUOffloadPolicy: shards and step on the host
    ("peer FSDP2 HSDP 2×2", multi("fsdp2-hsdp", 4, shard_group_size=2)),
    *[(f"peer DeepSpeed zero{k}", multi(f"deepspeed-zero{k}")) for k in (1, 2, 3)],
    ("peer DeepSpeed zero2 offload", multi("deepspeed-zero2-offload")),  # ZeRO-Offload: the step on the host
    ("peer DeepSpeed ZeRO++ hpZ 2 of 4", multi("deepspeed-zeropp", 4, zero_hpz_partition_size=2)),
    ("peer torch TP", multi("torch-tp", parallel={"tp": 2})),
    *[(f"peer torch pipelining {s}", pipeline(None, f"torch-pp-{s}")) for s in ("gpipe", "1f1b", "interleaved")],
    ("peer torch ring attention", multi("torch-ring", parallel={"cp": 2}, cp_attention="ring")),
    ("peer DeepSpeed Ulysses", multi("deepspeed-ulysses", parallel={"cp": 2}, cp_attention="ulysses")),
    ("peer DeepSpeed MoE", multi("deepspeed-moe", 2, "moe", parallel=EP, sizes={"top_k": 1})),
]
CHECKS = ONE_RANK + MULTI_RANK


def run(name: str, fn, say) -> dict:
    t0 = time.perf_counter()
    try:
        status, detail, fields = fn()
    except c.Skip as e:
        status, detail, fields = "skip", str(e), {}
    except Exception as e:  # noqa: BLE001 - every failure becomes its row
        traceback.print_exc()
        lines = [line for line in str(e).splitlines() if line.strip()]
        status, detail, fields = "FAIL", f"{type(e).__name__}: {(lines or [''])[-1][:300]}", {}
    row = {"name": name, "status": status, "detail": detail, "seconds": round(time.perf_counter() - t0, 1), **fields}
    say(f"[{status}] {name} ({row['seconds']} s): {detail}")
    return row


def verdict(rows: list, dry: bool) -> int:
    """The exit code (see the module docstring) of a run's rows."""
    if any(r["status"] == "FAIL" for r in rows):
        return FAILED
    multi_names = {name for name, _ in MULTI_RANK}
    nccl = any(r["name"] in multi_names and r["status"] == "ok" for r in rows)
    return PASS if dry or nccl else NO_NCCL


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="every row on the CPU, gloo, small sizes (CI)")
    parser.add_argument("--json", default="gpu_check.json", help="where the rows go (default: ./gpu_check.json)")
    parser.add_argument("--only", default="", help="run only the rows whose name contains this (or one of these, "
                                                   "comma-separated)")
    args = parser.parse_args(argv)
    c.configure(args.dry)
    say = (lambda text: print(text, flush=True)) if c.rank0() else (lambda text: None)
    if not c.DRY and c.GPUS == 0:
        print("gpu_check: no CUDA device here; run with --dry for the CPU path", file=sys.stderr)
        return CANNOT_RUN
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if c.TORCHRUN is not None and not c.DRY and local > c.GPUS:
        print(f"gpu_check: torchrun started {local} ranks on this node, which has {c.GPUS} GPUs", file=sys.stderr)
        return CANNOT_RUN
    started, rows = time.perf_counter(), []
    where = "CPU (--dry)" if c.DRY else f"{c.GPUS} × {torch.cuda.get_device_name(0)}"
    mode = "a plain script" if c.TORCHRUN is None else f"torchrun, {c.TORCHRUN} ranks"
    wanted = [w for w in args.only.split(",")] or [""]
    for name, fn in [(name, fn) for name, fn in CHECKS if any(w in name for w in wanted)]:
        rows.append(run(name, fn, say))
        seconds = time.perf_counter() - started
        if c.rank0():  # after every row: a session cut short keeps the rows it has
            with open(args.json, "w") as f:
                json.dump({"device": where, "mode": mode, "torch": torch.__version__, "dry": c.DRY,
                           "seconds": round(seconds, 1), "checks": rows}, f, indent=2, default=str)
    if not rows:
        print(f"gpu_check: no row's name contains {args.only!r}", file=sys.stderr)
        return CANNOT_RUN
    code = verdict(rows, c.DRY)
    say(f"\ngpu_check on {where} ({mode}), torch {torch.__version__}, {seconds:.0f} s; rows in {args.json}")
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        say(f"{r['name']:<{width}}  {r['status']:<4}  {r['seconds']:>6.1f} s  {r['detail']}")
    if code == NO_NCCL:
        say("\n" + "!" * 78 + "\n!! NCCL WAS NOT EXERCISED: no row of two or more ranks ran here "
            f"({c.GPUS} GPU(s)).\n!! The one-rank CUDA rows above passed; the collectives, p2p and all-to-alls on "
            "NCCL\n!! still need a machine with ≥ 2 GPUs. Exit code 3: not a pass.\n" + "!" * 78)
    return code


if __name__ == "__main__":
    sys.exit(main())
