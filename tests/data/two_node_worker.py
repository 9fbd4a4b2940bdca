"""One torchrun worker of tests/runtime/test_two_nodes.py: two agents (two "nodes") of two workers each.

    python -m torch.distributed.run --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \
        --rdzv-endpoint 127.0.0.1:PORT tests/data/two_node_worker.py OUT MODE

writes what each rank saw to ``OUT/<what>-<rank>.json``. MODE:

- ``train``: on the first start the mesh's node facts, checked by collectives on the node groups
  and booked on a two-tier link (``facts-R``), and a run of ``STEPS`` steps with its
  single-process reference (``uninterrupted-R``); then the same run saving a checkpoint every
  ``SAVE_EVERY`` steps and resuming from the latest one if there is one (``resumed-R``). Once,
  rank ``KILLED_RANK`` SIGKILLs itself as step ``KILL_STEP`` begins: torchrun
  (``--max-restarts 1``) starts every worker again, and the second start resumes;
- ``lose-node``: a long run; each rank writes ``running-R`` (its GROUP_RANK and its agent's pid)
  once step 2 begins, and trains until the test kills an agent: the ranks left end with
  zerokit's NodeLost, printed by torchrun to stderr.
"""
import dataclasses
import faulthandler
import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import zerokit
from zerokit.checkpoint.files import CheckpointError
from zerokit.checkpoint.training import latest
from zerokit.runtime import comm

OUT, MODE = Path(sys.argv[1]), sys.argv[2]
faulthandler.register(signal.SIGUSR1, all_threads=True)  # a hang prints its stacks
RANK, RESTART = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
STEPS, SAVE_EVERY, KILL_STEP, KILLED_RANK = 6, 2, 3, 3
KILLED = OUT / "killed"  # rank KILLED_RANK killed itself once
phase = "setup"


def write(what: str, value) -> None:
    path = OUT / f"{what}-{RANK}.json"
    path.with_suffix(".tmp").write_text(json.dumps(value))
    path.with_suffix(".tmp").rename(path)  # whole, or not there


def batch(step):
    """The tiny GPT's batch, and the test's events at the start of a step of the distributed run."""
    if dist.is_initialized():
        if MODE == "lose-node" and step == 2 and not (OUT / f"running-{RANK}.json").exists():
            write("running", {"group_rank": int(os.environ["GROUP_RANK"]), "agent": os.getppid()})
        if phase == "checkpointed" and RANK == KILLED_RANK and step == KILL_STEP and not KILLED.exists():
            KILLED.touch()
            os.kill(os.getpid(), signal.SIGKILL)
    return base.batch(step)


base = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=8)
work = dataclasses.replace(base, batch_fn=batch)


def facts(ctx):
    """The mesh's node layout, each group checked by a sum over it, each sum booked on a two-tier link."""
    mesh = ctx.mesh
    intra, inter = mesh.node_groups()
    comm.set_link("nvlink/10gbe")
    sums = {}
    for axis, group in (("node", intra), ("inter_node", inter), ("dp", mesh.group("dp"))):
        t = torch.tensor([float(ctx.rank)])
        comm.all_reduce(t, group=group)
        sums[axis] = t.item()
    comm.set_link(None)
    records = [{k: r[k] for k in ("axis", "link", "emulated_s", "ring_cost_bytes", "group_size", "op")}
               for r in comm.ledger().to_list()[-3:]]
    return {"nodes": mesh.nodes, "node": mesh.node, "ranks_per_node": mesh.ranks_per_node,
            "node_ranks": mesh.ranks("node"), "inter_node_ranks": mesh.ranks("inter_node"),
            "spans": {axis: mesh.spans_nodes(axis) for axis in ("node", "inter_node", "dp")},
            "sums": sums, "records": records,
            "env": {k: int(os.environ[k]) for k in ("GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}}


def summary(report) -> dict:
    result = report.result
    return {"losses": result.losses, "rank_losses": [r.losses for r in result.ranks],
            "reference_losses": report.reference.losses if report.reference is not None else None,
            "param_diff": result.max_abs_param_diff, "restart": RESTART}


if MODE == "train":
    # not TORCHELASTIC_RESTART_COUNT: a node restarted because another failed keeps its count (torchrun counts
    # membership changes as no retry), so the count differs between nodes; what the first start wrote does not
    if not all((OUT / f"uninterrupted-{r}.json").exists() for r in range(4)):
        write("facts", zerokit.launch(facts, 4)[RANK])
        phase = "uninterrupted"
        write("uninterrupted", summary(zerokit.train(work, "zero3", world_size=4, steps=STEPS, track_peak=False,
                                                     timeout_s=60)))
    phase = "checkpointed"
    save = OUT / "checkpoints"
    try:  # the latest checkpoint, as a user's script resumes; none saved yet: from the beginning
        resume = str(latest(save)) if save.is_dir() else None
    except CheckpointError:
        resume = None
    write("resumed", dict(summary(zerokit.train(work, "zero3", world_size=4, steps=STEPS, track_peak=False,
                                                reference=False, save_dir=str(save), save_every=SAVE_EVERY,
                                                resume_from=resume, timeout_s=60)), resumed_from=resume))
elif MODE == "lose-node":
    phase = "long"
    zerokit.train(work, "zero3", world_size=4, steps=100_000, track_peak=False, reference=False, timeout_s=30)
else:
    raise SystemExit(f"unknown mode {MODE!r}")
