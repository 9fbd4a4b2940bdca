# %% [markdown]
# # 00 · Set-up and first ranks
#
# **The question.** The seed (the interview article the course answers,
# [docs/seed.md](../docs/seed.md)) opens with *"What is the difference between data
# parallelism and model parallelism?"* (“数据并行与模型并行的区别是什么？”). Before either can
# be answered we need the three words every answer uses: a **rank**, a **process group** and a
# **collective**. What are they, and what happens to the whole job when one rank fails?
#
# **What you will see.** A function defined in this notebook runs on 4 processes at once;
# the ranks add up a tensor together with one all-reduce; the communication ledger measures
# the tensor's bytes and prices them with the ring formula, and zerokit's own ring, built on
# send/recv, counts the bytes each rank really sends; then one rank raises, and the launcher
# tells us which one, while no process is left behind.
#
# Everything runs on a laptop CPU: each rank is a process, and they talk through **gloo**
# over the loopback interface. On a machine with a GPU per rank, the same cells run on
# **NCCL** unchanged.
#
# **Time:** about 15 min to read and run (the run itself: about 5 s on a 2-core laptop) ·
# **Needs:** Python and `make lab` (the repository's README), nothing else ·
# **After it you can answer:** *What are a rank, a process group and a collective?* · *How
# many bytes does each rank send to all-reduce a tensor on a ring?* · *One rank dies: what
# do the others do, on gloo and on NCCL?*

# %%
%matplotlib inline
import multiprocessing
import re

import matplotlib
import torch

import zerokit
from zerokit import course, theory

matplotlib.rcParams["figure.dpi"] = course.DPI
print(course.machine_summary(world_sizes=(1, 2, 4)))

# %% [markdown]
# `machine_summary` says which backend `zerokit.launch` will pick for each world size on
# this machine: NCCL when every rank can have its own GPU, gloo on CPU ranks otherwise.
# With a single GPU, one-rank cells could use it and every multi-rank cell of the course
# runs on CPU ranks — the numbers (bytes, memory) are the same; only times differ.
#
# **With GPUs** (one per rank) every lesson runs on them, unchanged: each rank is a process
# on its own GPU (`ctx.device` is `cuda:r`), the collectives are NCCL's. What you will see
# differently:
#
# - **bytes are the same, times are not**: when every rank has its own GPU and link, the
#   balance of communication and compute is not the one of processes sharing this laptop's
#   cores, so every sentence about speed in the course reads the run it sits under, not a
#   figure typed in advance;
# - **a GPU call returns once its work is queued**: zerokit times collectives and spans with
#   CUDA events on the stream, not with the host's clock (`zerokit.runtime.clock`);
# - **memory is cross-checked by torch's allocator**: lesson 02 puts the ledger next to
#   `torch.cuda.max_memory_allocated` and names the gap;
# - **an emulated link is refused on NCCL** (it would slow the CPU thread, not the GPU
#   stream), and the failure labs of lesson 14 run on CPU ranks on any machine (on NCCL a
#   rank that dies leaves the others hanging: "When a rank fails" below).
#
# ## A rank
#
# A **rank** is one process of the job, numbered `0 … world_size − 1`. `zerokit.launch(fn, N)`
# starts N of them, joins them into a **process group** (the set of ranks that can talk to
# each other, here the whole world), calls `fn(ctx)` on each — `ctx` tells the rank who it
# is — and returns what every rank returned, in rank order. Whatever a rank prints appears
# here prefixed with its rank.

# %%
def hello(ctx):
    print(f"rank {ctx.rank} of {ctx.world_size}: backend {ctx.backend}, device {ctx.device}")
    return ctx.rank ** 2


results = zerokit.launch(hello, 4)
results

# %% [checks]
assert results == [rank ** 2 for rank in range(4)]

# %% [markdown]
# **Check yourself.** Each rank squared its own rank: what list comes back? Predict it, then run the cell: it prints its
# verdict, and stops with an `AssertionError` if the run disagrees.

# %%
expected = [rank ** 2 for rank in range(4)]
print(f"the ranks returned {results}: each its own rank squared — {'yes' if results == expected else 'no'}")
assert results == expected

# %% [markdown]
# The ranks printed in whatever order they reached `print`: they run at the same time,
# each in its own process, with nothing shared. That is the point — and it is why they
# need collectives to agree on anything.
#
# ## A collective
#
# A **collective** is an operation that *every* rank of a group calls; it completes only
# when all of them have. **All-reduce** is the one data parallelism lives on: every rank
# brings a tensor, every rank leaves with the sum. `zerokit.comm.all_reduce` is
# `torch.distributed.all_reduce` plus a **ledger** entry: the op, the **payload** (the bytes
# of the tensor, measured) and its **ring cost** — what a rank sends for that payload under
# the ring algorithm, a *formula* applied to the measured payload. The backend (gloo here)
# does not say what it really put on the wire. `zerokit.ring.ring_all_reduce` is the same
# sum run by zerokit's own ring on send/recv (lesson 01 takes it apart); it counts every
# byte it hands to send, so its ledger entry also has **sent** bytes, *measured*. (What the
# ledger can and cannot say about gloo's own algorithms: lesson 01, [Why gloo's times are not
# a ring's](01_collectives.ipynb#Why-gloo's-times-are-not-a-ring's).)
#
# **Predict before you run.** 4 ranks all-reduce a 4 KiB tensor (4,096 B) on the ring. How
# many bytes does *each rank* send: 4,096 (the tensor once), 12,288 (a copy to each of the 3
# others), or something else?
#
# <details><summary>Answer</summary>
#
# 6,144 B, the "sent B (measured)" column of zerokit's ring below: `2(N−1)/N·S` = 2·3/4·4,096.
# The ring cuts the tensor into 4 chunks and every rank passes 3 chunks on in the
# reduce-scatter and 3 in the all-gather — 6 chunks of 1 KiB.
#
# </details>

# %%
def sum_of_ranks(ctx, numel, algorithm="torch"):
    x = torch.full((numel,), float(ctx.rank), device=ctx.device)  # ctx.device: a GPU under NCCL
    if algorithm == "ring":
        zerokit.ring.ring_all_reduce(x)  # zerokit's ring on send/recv: counts the bytes it sends
    else:
        zerokit.comm.all_reduce(x)  # the backend's all-reduce; every rank calls it, every rank gets the sum
    record = zerokit.comm.ledger().records[-1]
    return {"rank": ctx.rank, "algorithm": algorithm, "x[0] after": x[0].item(),
            "payload B (measured)": record.payload_bytes,
            "ring cost B (formula)": record.ring_cost_bytes,
            "sent B (measured)": record.sent_bytes}


world = 4
rows = zerokit.launch(sum_of_ranks, world, 1024) + zerokit.launch(sum_of_ranks, world, 1024, "ring")
course.table(rows)

# %% [markdown]
# Every rank holds `0 + 1 + 2 + 3` afterwards, either way. The payload is the 4 KiB tensor;
# its **ring cost** is `2(N−1)/N` of it, 6144 B — the ring formula applied to the measured
# payload, not `N − 1` copies of it as sending the tensor to everyone would cost. For gloo's
# all-reduce the "sent" cell is empty (—): nothing in zerokit counted gloo's wire. zerokit's
# ring *measured* 6144 B sent by every rank — the formula holds when a ring really runs.

# %% [checks]
for row in rows:
    assert row["x[0] after"] == sum(range(world))
    assert row["payload B (measured)"] == 4 * 1024
    assert row["ring cost B (formula)"] == theory.ring_bytes_sent("all_reduce", 4 * 1024, world)
    if row["algorithm"] == "ring":  # measured on the wire, equal to the formula
        assert row["sent B (measured)"] == row["ring cost B (formula)"]
    else:  # the backend ran it: no wire count
        assert row["sent B (measured)"] is None

# %% [markdown]
# Does that hold for any number of ranks? Run zerokit's ring all-reduce on 2 to 6 ranks and
# put the bytes each rank really sent next to the formula (6 KiB: whole chunks on 2, 3, 4
# and 6 ranks; the ring pads a tensor that does not divide, and counts the padding too):

# %%
payload = 6 * 1024
by_world = {n: zerokit.launch(sum_of_ranks, n, payload // 4, "ring") for n in (2, 3, 4, 6)}
course.volume_figure(
    {"ring all-reduce": {"N": list(by_world),
                         "sent": [rows[0]["sent B (measured)"] for rows in by_world.values()],
                         "theory_N": list(range(2, 9)),
                         "theory": [theory.ring_bytes_sent("all_reduce", payload, n) for n in range(2, 9)]}},
    ylabel="bytes sent per rank", reference=(2 * payload, "2S"),
    title="ring all-reduce of S = 6 KiB: bytes sent per rank")

# %% [checks]
for n, rows_n in by_world.items():
    for row in rows_n:
        assert row["x[0] after"] == sum(range(n))
        assert row["sent B (measured)"] == theory.ring_bytes_sent("all_reduce", payload, n)

# %% [markdown]
# ## When a rank fails
#
# A collective waits for every rank. So if, after a first step that all three ranks complete,
# rank 1 raises before it reaches the next all-reduce, ranks 0 and 2 are left waiting for a
# peer that will never come. What happens next depends on the backend:
#
# - **gloo** (here): its peers talk over TCP sockets, and when rank 1's process exits the
#   kernel closes its sockets; ranks 0 and 2, blocked in the all-reduce, see the connection
#   close and raise ("Connection closed by peer") within moments;
# - **NCCL** (GPUs): the all-reduce is a kernel queued on each survivor's GPU, waiting for
#   data that never comes, and nothing closes: the survivors **hang** in the collective
#   (their host threads block at the next synchronisation). What ends it is the process
#   group's **watchdog**, a thread in each rank that compares every queued collective with
#   the group's `timeout` (`init_process_group(timeout=…)`, 10 minutes by default for NCCL);
#   `TORCH_NCCL_ASYNC_ERROR_HANDLING` (`NCCL_ASYNC_ERROR_HANDLING` in older torch) says what it
#   then does — tear the process down, abort the communicator, or nothing, and the job hangs
#   for good. A network transport may notice the lost peer sooner and report `ncclRemoteError`,
#   through the same watchdog. Lesson 14 runs the classic failures and reads them.
#
# Which failure matters? The **first** one. **zerokit's choice**, on either backend: the
# parent process watches every rank; `zerokit.launch` collects each rank's error with a
# timestamp, gives the others 1 s to report theirs, then stops and reaps every rank — it does
# not wait for a watchdog — and raises `zerokit.RankFailed` for the rank that failed first,
# with *its* traceback. (It also sets the group's `timeout` from `timeout_s`, and
# `heartbeat_s` stops a stalled job sooner: lesson 14.) torchrun's agent likewise stops a
# node's other workers when one fails; ranks on other nodes are left to their watchdog.

# %%
def fails_on_rank_1(ctx):
    x = torch.ones(4, device=ctx.device)
    zerokit.comm.all_reduce(x)  # a first step that every rank completes
    if ctx.rank == 1:
        raise ValueError("rank 1 found a bad batch")
    zerokit.comm.all_reduce(x)  # ranks 0 and 2 wait here for rank 1
    return x.sum().item()


try:
    zerokit.launch(fails_on_rank_1, 3, timeout_s=60)
except zerokit.RankFailed as error:
    failure = error

print(f"first rank to fail: {failure.rank} (exit code {failure.exitcode})")
print("its error:", failure.traceback.strip().splitlines()[-1])
print("ranks that failed after it, because a peer vanished:", [rank for rank, _ in failure.others])
for rank, summary in failure.others:  # what each survivor's gloo said (addresses left out)
    print(f"  rank {rank}:", re.sub(r"\s*\[[^\]]*\](:\d+)?", "", summary).split(". ")[0].strip()[:100])
print("processes still running:", multiprocessing.active_children())

# %% [checks]
assert failure.rank == 1
assert "rank 1 found a bad batch" in failure.traceback
assert {rank for rank, _ in failure.others} <= {0, 2}  # blamed after rank 1, if they failed before being stopped
assert multiprocessing.active_children() == []

# %% [markdown]
# A rank that never fails but never arrives either — it skipped a collective, or waits on
# a different one — is a **hang**, the other classic failure: `launch(..., timeout_s=…)`
# then raises `zerokit.RankTimeout`, naming the ranks still running and the last collective
# each entered.

# %% [markdown]
# ## Try it
#
# The same ring, on as many ranks as you like: choose a collective, a world size and a
# payload. The panel runs it (on send/recv, lesson 01 explains the rounds) and shows what
# each rank sent, counted as it was sent, next to the ring formula. More ranks, more rounds
# — but never more than twice the payload per rank.

# %%
course.CollectivePanel(ops=("all_reduce",), world_sizes=(2, 3, 4, 6, 8), payload_kib=(4, 64, 1024))

# %% [markdown]
# ## Summary
#
# - A **rank** is one process; `zerokit.launch(fn, N)` runs `fn(ctx)` on N of them, from a
#   notebook cell, and returns their results by rank.
# - A **process group** is the set of ranks that talk; a **collective** is called by all of
#   them and completes only when all have called it.
# - All-reduce leaves the sum on every rank; under the ring each rank sends `2(N−1)/N` of
#   the tensor, measured on zerokit's ring above next to `theory.ring_bytes_sent`. For the
#   backend's own all-reduce the ledger measures the payload and applies that formula to it
#   (the *ring cost*); it cannot see gloo's wire.
# - One failing rank takes the others down: on gloo its peers fail when its sockets close; on
#   NCCL they hang in the collective until the watchdog's timeout. zerokit's launcher stops
#   every rank after the first failure and blames that one.
#
# ## Interview questions
#
# 1. *With 4 ranks, how many bytes does each rank send to all-reduce a 4 KiB tensor with the
#    ring algorithm?*
#
#    <details><summary>Answer</summary>
#
#    2·3/4·4096 = 6144 B: the table above.
#
#    </details>
#
# 2. *One rank of a data-parallel job raises in step 1000. What do the other ranks see, and how
#    do you find the culprit?*
#
#    <details><summary>Answer</summary>
#
#    They block in the next collective. On gloo they then fail with "Connection closed by
#    peer" as the dead rank's sockets close (the `RankFailed` cell: ranks 0 and 2 fail after
#    rank 1). On NCCL they hang in that collective — a kernel waiting on the GPU — until the
#    process group's watchdog sees the `timeout` pass (10 minutes by default) and, as
#    `TORCH_NCCL_ASYNC_ERROR_HANDLING` says, tears the process down; a launcher may kill them
#    sooner (zerokit's stops every rank 1 s after the first failure; torchrun stops the
#    node's other workers). The culprit is the earliest failure, not the first rank `join()`
#    happens to report, nor the survivors' timeouts: look for the first traceback (zerokit
#    blames it for you), or NCCL's flight recorder on GPUs (lesson 14).
#
#    </details>
#
# 3. *What must every rank do identically for a collective to complete?*
#
#    <details><summary>Answer</summary>
#
#    Call the same collective, in the same order, with tensors of the same size; otherwise it
#    hangs.
#
#    </details>

# %% [markdown]
# **Exercise:** none of its own — [exercises/01_ring_allreduce.ipynb](../exercises/01_ring_allreduce.ipynb),
# after lesson 01, writes the ring all-reduce this lesson ran, graded by
# `zerokit grade exercises/01_ring_allreduce.ipynb` ·
# **Next:** [lesson 01 — collectives: all-reduce = reduce-scatter + all-gather](01_collectives.ipynb)
