"""``gpu_check.py``'s rows above one rank: NCCL on GPUs (gloo ranks with --dry), each with ``heartbeat_s`` so a
deadlock fails in a minute instead of hanging.

A row's world is fixed by its layout (cp=2 × tp=2: 4 ranks). A data-parallel row (no ``parallel=``, or dp alone)
runs on every rank there is — the machine's GPUs for a plain script, torchrun's world under torchrun — its batch
grown to a multiple of the world where it has to be.

A row that cannot run on this world is ``n/a`` with the reason, not a FAIL: one whose strategy refuses the run
with a reason (a ValueError, :func:`gpu_check_common.refusal`) — the torch ring-attention peer on CUDA (it runs
torch's CPU flash kernel) — and one whose groups (hsdp's, FSDP2-HSDP's, hpZ's: :data:`GROUPS`) do not divide the
world (``torchrun --nproc_per_node=3``), said before it starts: zerokit's strategies refuse such a world, DeepSpeed's
hpZ asserts. With ``--dry`` no multi-rank row is n/a (the test holds each to ``ok``).
"""
from __future__ import annotations

import math
import tempfile

import zerokit
from zerokit.strategies import REGISTRY

import gpu_check_common as c
from gpu_check_one import missing

#: axes whose measured bytes are only bounded by the formula: DeepSpeed's MoE sends padded [E, C, d] rows, and
#: not zerokit's expert ids and counts, which the formula on those rows also counts (tests/peers/test_peers_cp_ep.py)
AT_MOST = {"deepspeed-moe": {"ep"}}
#: --dry's "every rank of the node": 4 gloo ranks (2 cores)
DRY_NODE = 4
#: options that carve dp into groups of that many ranks (hsdp's and FSDP2-HSDP's shard groups, hpZ's partition):
#: on a world they do not divide the row is n/a — torchrun's world decides a data-parallel row's
GROUPS = ("shard_group_size", "zero_hpz_partition_size")


def node_world() -> int:
    """Every rank this run has: torchrun's world, else the GPUs (DRY_NODE with --dry)."""
    return c.TORCHRUN if c.TORCHRUN is not None else (DRY_NODE if c.DRY else max(c.GPUS, 1))


def world_of(world, kw: dict) -> int:
    """A row's world: ``"node"`` or a pure data-parallel row under torchrun, every rank; else ``world``."""
    axes = {a for a, d in kw.get("parallel", {}).items() if d > 1}
    if world == "node" or (c.TORCHRUN is not None and axes <= {"dp"} and not kw.get("micro_batches")):
        return node_world()
    return world


def multi(strategy: str, world=2, name: str = "gpt", reference: bool = False, sizes: dict | None = None, **kw):
    """A row: ``strategy`` on ``world`` ranks (``"node"``: every rank) against the single-process reference;
    ``reference=True`` also lets zerokit.train run its own (on the ranks' kind of device) and compares it;
    ``sizes`` change the workload's (DeepSpeed's MoE compares top-1 routing only)."""
    def check():
        why = missing(strategy)
        if why:
            raise c.Skip(f"skipped: {why}")
        n, args = world_of(world, kw), dict(kw)
        if n < 2:  # every rank of a one-GPU node, or a torchrun of one: nothing crosses a link
            raise c.Skip(f"this run has one rank: a row of two or more ({'NCCL' if not c.DRY else 'gloo'})")
        if set(args.get("parallel", {"pp": 0})) <= {"dp"}:  # dp alone: as wide as the row's world
            args["parallel"] = {"dp": n}
        c.needs(n)
        group = next((kw[k] for k in GROUPS if k in kw), None)
        if group is not None and n % group:  # every strategy with such a group refuses it (DeepSpeed asserts)
            return "n/a", (f"groups of {group} ranks do not divide this run's {n} (torchrun --nproc_per_node=<a "
                           f"multiple of {group}> runs it)"), {"world_size": n}
        b = c.size(name)["batch_size"]
        override = {**(sizes or {}), **({} if b % n == 0 else {"batch_size": n * math.ceil(b / n)})}
        try:
            result, fields = c.train(name, strategy, n, override=override, **args)
        except Exception as e:  # noqa: BLE001 - a refusal with its reason is n/a; anything else is the row's FAIL
            why = c.refusal(e)
            if why is None:
                raise
            return "n/a", f"refused on {n} ranks: {why}", {"world_size": n, "refused": why}
        # torch's own collectives (DDP's C++ reducer, ZeroRedundancyOptimizer's, pipelining's p2p) are recorded
        # when issued, not waited on: blocked time is zerokit's own strategies' measurement
        if fields["blocked_s"] <= 0 and not REGISTRY[strategy].__module__.startswith("zerokit.peers"):
            raise AssertionError("no time blocked in any collective: the blocked-time measurement is broken")
        extra = f" on {n} ranks" if world == "node" or n != world else ""
        if "cp" in kw.get("parallel", {}) or "ep" in kw.get("parallel", {}):  # NCCL's send/recv and all-to-all
            for rank in result.ranks:
                measured = {a: row["ring_cost_bytes"] for a, row in rank.comm_bytes_by_axis.items()}
                formula = rank.theory_comm_bytes_by_axis
                bounded = AT_MOST.get(strategy, set())
                if set(measured) != set(formula) or any(
                        not 0 < measured[a] <= formula[a] if a in bounded else abs(measured[a] - formula[a]) > 0.5
                        for a in formula):
                    raise AssertionError(f"rank {rank.rank}: bytes per axis {measured} != theory {formula}")
            fields["bytes_by_axis"] = measured
            extra += ("; bytes per axis = theory" + (" (ep ≤)" if strategy in AT_MOST else "") + " ("
                      + ", ".join(f"{a} {c.mib(v)}" for a, v in sorted(measured.items())) + ")")
        if name == "pipe":  # fp32 activations of one micro-batch on this rank's share of the batch
            s, dp = c.size("pipe"), kw.get("parallel", {}).get("dp", 1)
            fields["boundary_bytes"] = s["batch_size"] // dp // kw["micro_batches"] * s["seq_len"] * s["d_model"] * 4
            extra += f"; boundary activation {c.mib(fields['boundary_bytes'])} per micro-batch"
        if reference:  # zerokit.train's own reference, where the library puts it (the ranks' kind of device)
            own = zerokit.train(c.work(name, **override), strategy, world_size=n, steps=c.STEPS, optimizer="sgd",
                                lr=c.SGD_LR, timeout_s=240, **c.backend(), **c.HEARTBEAT, **args).results[0]
            fields["own_reference_max_abs"] = own.max_abs_param_diff
            if not own.max_abs_param_diff <= fields["tolerance"]:
                raise AssertionError(f"zerokit.train's own reference: |Δp| {own.max_abs_param_diff:.1e} > "
                                     f"{fields['tolerance']:.1e}")
            extra += f"; zerokit.train's own reference |Δp| {own.max_abs_param_diff:.1e}"
        return "ok", c.summary(fields) + extra, fields
    return check


def pipeline(schedule: str, strategy: str = "pp"):
    options = {"schedule": schedule, "chunks": 2 if schedule == "interleaved" else 1} if strategy == "pp" else {}
    return multi(strategy, name="pipe", parallel={"pp": 2}, micro_batches=c.MICRO, **options)


def checkpoint_round_trip():
    """zero2 on dp=2 saves after steps 2 and 4; ddp on tp=2 resumes from step 2. The losses before the
    checkpoint are the saved ones (equal); after it, the same computation in another summation order."""
    c.needs(2)
    w, steps = c.work("gpt"), 2 * 2
    with tempfile.TemporaryDirectory() as root:
        a = zerokit.train(w, "zero2", world_size=2, steps=steps, reference=False, save_dir=f"{root}/a", save_every=2,
                          **c.backend(), **c.HEARTBEAT).results[0]
        b = zerokit.train(w, "ddp", world_size=2, steps=steps, reference=False, parallel={"tp": 2},
                          resume_from=f"{root}/a/step-000002", **c.backend(), **c.HEARTBEAT).results[0]
    rel = max(abs(x - y) / abs(x) for x, y in zip(a.losses, b.losses))
    fields = {"losses_saved_run": a.losses, "losses_resumed_run": b.losses, "max_rel_loss_diff": rel}
    if b.losses[:2] != a.losses[:2] or rel > c.RHO:
        raise AssertionError(f"losses {a.losses} (zero2 dp=2) vs {b.losses} (resumed on tp=2)")
    return "ok", f"zero2 dp=2 → step 2 → ddp tp=2: losses match, largest relative difference {rel:.1e} ≤ {c.RHO}", \
        fields
