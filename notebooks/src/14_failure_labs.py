# %% [markdown]
# # 14 · Failure labs: six classic distributed bugs, run for real, and how to read the error
#
# **The question.** A distributed job that goes wrong rarely says so in one clear line. A
# collective called on only some ranks, an unused parameter, a reduce-scatter whose ranks
# disagree on the size, a rank that dies mid-step, ranks that quietly train different
# models, a forgotten `no_sync`: some hang, some abort in C++, some raise on the wrong rank,
# some raise nothing at all. When one happens to you, which rank is to blame, in which
# collective — op, phase, call number — and how do you get the job to *say* so instead of
# hanging for half an hour?
#
# **What you will see.** Each bug as a short function, launched on 2 ranks through
# `zerokit.launch` (gloo on the CPU on any machine, GPUs or not — these are gloo's failures; what
# NCCL does differently comes at the end — timeouts of seconds), the error zerokit raises caught and
# printed, then read: the rank, the op, its call number and phase, and where every other rank
# was. The debug switches that turn a hang into an immediate error (`heartbeat_s`,
# `check_collectives`, `check_replicas`), the communication a forgotten `no_sync` costs
# (measured by the ledger, against `theory.comm_bytes_per_step`), the seconds until each
# diagnosis, what NCCL does differently, and a panel that runs any of the six.
#
# **Time:** about 25 min to read and run (the run itself: about 25 s on a 2-core laptop) ·
# **Needs:** lesson 00 (ranks and collectives) and lesson 03 (DDP) · **After it you can
# answer:** *My job hangs at step 1200: how do I find the rank to blame?* · *Why does DDP
# need `find_unused_parameters`?* · *Is a forgotten `no_sync` a wrong result or a slow one?* ·
# *What does NCCL do differently from gloo when a peer dies?*

# %%
%matplotlib inline
import contextlib
import os
import signal

import matplotlib
import torch
import torch.nn as nn
import torch.nn.functional as F

import zerokit
from zerokit import comm, course, theory
from zerokit.runtime.replicas import check_replicas

matplotlib.rcParams["figure.dpi"] = course.DPI

# %% [markdown]
# ## The patient: a small model, a data-parallel loop
#
# Every lab trains the same 2-layer MLP on 2 ranks with zerokit's drop-in for torch's DDP
# (`zerokit.DistributedDataParallel`: broadcast at construction, bucketed all-reduce in
# backward) and a plain SGD. Each rank draws its own batch from its rank and the step.
# `run_lab` launches a lab, catches the error, and returns what it says; `reading()` prints
# it in four lines: the error and the rank it blames, the collective (op #call of phase), the
# cause, and where every rank was.

# %%
WORLD, STEPS = 2, 3


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)


def ddp_setup():
    model = zerokit.DistributedDataParallel(make_model())
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def healthy(ctx):
    model, opt = ddp_setup()
    for step in range(STEPS):
        x, y = batch(step, ctx.rank)
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return [float(p.detach().sum()) for p in model.parameters()]


replicas = zerokit.launch(healthy, WORLD, backend="gloo", timeout_s=20)
print("healthy run: both ranks end with the same parameters:", replicas[0] == replicas[1])

# %% [markdown]
# ## Lab 1 · A collective called on only some ranks
#
# The classic: rank 0 wants to print the mean loss, so *it* all-reduces the loss — and rank 1
# never does. Rank 0's extra `all_reduce` (1 number) then pairs with rank 1's next gradient
# all-reduce (a bucket of 212 numbers). On gloo the size mismatch aborts a process in C++
# (SIGABRT), so the job fails fast; what matters is reading *where*: every rank's status slot
# (which the launcher reads from shared memory) says which collective it was in.

# %%
def loss_logged_on_rank_0(ctx):
    model, opt = ddp_setup()
    for step in range(STEPS):
        x, y = batch(step, ctx.rank)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if ctx.rank == 0:                              # the bug: a collective under `if rank == 0`
            comm.all_reduce(loss.detach().clone())


some_ranks = course.run_lab("collective on some ranks", loss_logged_on_rank_0, WORLD, timeout_s=10, heartbeat_s=4)
print(some_ranks.reading())

# %% [markdown]
# **Reading it.** Look for the odd one out in *where the ranks were*: rank 0 is in
# `all_reduce #7 of setup` on **1** float32 (the loss, outside any training phase), rank 1 in
# `all_reduce #7 of backward` on a whole bucket. Same call number, different phase and size:
# rank 0 called a collective rank 1 did not. Whichever process gloo happened to abort, the
# call numbers and sizes point at the line. With `check_collectives=True` (or
# `ZEROKIT_DEBUG_COLLECTIVES=1`) every collective first all-gathers its (op, size, dtype) and
# the job stops *before* the mismatched call, naming both sides — lab 3 shows it.
#
# ## Lab 2 · An unused parameter under DDP
#
# A branch taken on some ranks only — an auxiliary head used when the batch asks for it, an
# expert nobody routed to. Rank 0 never uses `aux`, so its gradient never arrives: torch's DDP
# waits for it forever (its bucket never fills) unless `find_unused_parameters=True`. zerokit
# checks at the end of each backward.

# %%
class WithAux(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.aux = make_model(), nn.Linear(4, 4)

    def forward(self, x, use_aux):
        out = self.body(x)
        return self.aux(out) if use_aux else out


def unused_on_rank_0(ctx):
    torch.manual_seed(0)
    model = zerokit.DistributedDataParallel(WithAux())
    for step in range(STEPS):
        x, y = batch(step, ctx.rank)
        F.mse_loss(model(x, use_aux=ctx.rank == 1), y).backward()   # the bug: aux unused on rank 0


unused = course.run_lab("unused parameter", unused_on_rank_0, WORLD, timeout_s=10, heartbeat_s=4)
print(unused.reading())

# %% [markdown]
# **Reading it.** The blamed rank raised a `ValueError` naming the parameters (`'aux.weight'`,
# `'aux.bias'`) and the way out: `find_unused_parameters=True` (their gradients count as zeros,
# so every rank still reduces the same buckets), `requires_grad=False`, or removing them. Rank
# 1 — which did use `aux` — merely lost its peer; the launcher blames the rank whose failure is
# not a lost connection.
#
# ## Lab 3 · Mismatched shapes in a reduce-scatter
#
# ZeRO pads each flat buffer to a multiple of the world size, then reduce-scatters it. A rank
# that computes the padding from a *local* count (here rank 1 pads to 6 instead of 4) calls
# the same op on a different size. Without the check, gloo either aborts or — worse — reduces
# misaligned data; with `check_collectives=True` the ranks compare signatures first.

# %%
def uneven_reduce_scatter(ctx):
    comm.all_reduce(torch.ones(2))
    with comm.phase("backward"):
        n = 6 if ctx.rank == 1 else 4                  # the bug: padding computed from a local count
        comm.reduce_scatter(torch.zeros(n // 2), torch.ones(n))


shapes = course.run_lab("mismatched reduce-scatter", uneven_reduce_scatter, WORLD, timeout_s=10,
                        check_collectives=True)
print(shapes.reading())

# %% [markdown]
# **Reading it.** `CollectiveMismatch`: *rank 0 is in reduce_scatter of 4 float32 (#2 of
# backward); rank 1 is in reduce_scatter of 6 float32 (#2 of backward)* — both sides, their
# call number and phase, before any data moved. It is the same idea as torch's
# `TORCH_DISTRIBUTED_DEBUG=DETAIL`, which on gloo turns a mismatched all-reduce into "Detected
# mismatch between collectives" (torch's distributed docs, *Debugging*; checked on gloo with torch 2.13); the price is one small all-gather per collective,
# so it is a debug switch, not a default.
#
# ## Lab 4 · A rank that crashes mid-step
#
# The OOM killer, a segfault in a kernel, a pre-empted machine: rank 1 receives SIGKILL after
# its forward at step 1. It cannot raise, print or say goodbye.

# %%
def killed_mid_step(ctx):
    model, opt = ddp_setup()
    for step in range(STEPS):
        x, y = batch(step, ctx.rank)
        loss = F.mse_loss(model(x), y)
        if ctx.rank == 1 and step == 1:
            os.kill(os.getpid(), signal.SIGKILL)        # the crash
        loss.backward()
        opt.step()
        opt.zero_grad()


crash = course.run_lab("rank crashes mid-step", killed_mid_step, WORLD, timeout_s=10)
print(crash.reading())

# %% [markdown]
# **Reading it.** *rank 1 exited … (killed by SIGKILL)*, and where it was: it had last left
# `all_reduce #6 of backward` — step 0's gradient all-reduce — so the crash came between
# collectives, in step 1's forward, while rank 0 waits in `all_reduce #7`. Rank 0's own
# error is a lost connection ("Connection closed by peer"), a consequence; zerokit files it
# under *other ranks failed after it*. With gloo on one machine the survivors learn of the
# death at once (the socket closes); across machines a dead host may only show up as a
# timeout.
#
# ## Lab 5 · Ranks whose models differ
#
# A hand-rolled data parallelism: each rank builds its model — from a seed that happens to
# depend on the rank — and averages gradients with an all-reduce. Every collective matches,
# every step runs, nothing is raised: each rank trains its own model. `check_replicas(model)`
# (a collective: every rank calls it, e.g. every k steps) compares parameter checksums.

# %%
def seeded_by_rank(ctx):
    model = make_model(seed=ctx.rank)                  # the bug: no broadcast of rank 0's weights
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = batch(step, ctx.rank)
        F.mse_loss(model(x), y).backward()
        for p in model.parameters():
            comm.all_reduce(p.grad)
            p.grad.div_(ctx.world_size)
        opt.step()
        opt.zero_grad()
    check_replicas(model, step=STEPS)


diverged = course.run_lab("ranks whose models differ", seeded_by_rank, WORLD, timeout_s=10)
print(diverged.reading())

# %% [markdown]
# **Reading it.** `ReplicasDiverged`: rank 1's first parameter (`'0.weight'`) has another
# checksum than rank 0's, at step 3. Without the check the only symptom is a loss curve that
# is a little worse than it should be. `zerokit.DistributedDataParallel` broadcasts rank 0's
# parameters at construction (and the `ddp-naive` strategy checksums them at start), so this
# lab needs a loop that does neither; an optimizer step, a clip or an update taken on some
# ranks only diverges the same way, later — which is why the check takes a step number.
#
# ## Lab 6 · A forgotten `no_sync`
#
# Gradient accumulation over 2 micro-batches: the first backward should run under
# `model.no_sync()` (accumulate, communicate nothing), the second reduces. Rank 1's loop
# forgets it, so rank 1 all-reduces after *every* micro-batch and rank 0 after every second.
# The sizes match, so even `check_collectives` sees nothing wrong: rank 1's micro-batch-0
# all-reduce pairs with rank 0's micro-batch-1 one and averages the wrong gradients, until
# rank 0 finishes and rank 1 is left waiting.

# %%
def accumulate(ctx, forget_on=(1,), micro_batches=2, steps=STEPS):
    model, opt = ddp_setup()
    for step in range(steps):
        for m in range(micro_batches):
            last = m == micro_batches - 1
            sync = last or ctx.rank in forget_on      # the bug: these ranks never call no_sync
            with contextlib.nullcontext() if sync else model.no_sync():
                x, y = batch(micro_batches * step + m, ctx.rank)
                F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return comm.ledger().ring_cost_bytes(phase="backward", op="all_reduce") / steps


forgot = course.run_lab("forgotten no_sync", accumulate, WORLD, timeout_s=10)
print(forgot.reading())

# %% [markdown]
# **Reading it.** Rank 0 *finished (fn returned after 8 collectives)* while rank 1 was still
# *waiting for async all_reduce #9 of backward*: the ranks made different numbers of
# collectives. zerokit says so in words — a rank returned while another still waited in a
# collective — and blames rank 1, the one left over. Forgotten on **every** rank the job is
# correct but slow: each micro-batch all-reduces the whole gradient. The communication
# ledger counts it; the formula for DDP with `no_sync` is one all-reduce per step,
# `2(N − 1)/N · Ψ · b` (`theory.comm_bytes_per_step(0, Ψ, N, b)`):

# %%
psi = sum(p.numel() for p in make_model().parameters())
with_no_sync = zerokit.launch(accumulate, WORLD, forget_on=(), backend="gloo", timeout_s=20)[0]
forgotten_everywhere = zerokit.launch(accumulate, WORLD, forget_on=(0, 1), backend="gloo", timeout_s=20)[0]
formula = theory.comm_bytes_per_step(0, psi, WORLD, 4, micro_batches=2)
course.table([{"loop": "no_sync on the first micro-batch", "ring bytes per step (ledger)": with_no_sync,
               "theory (DDP, no_sync)": formula},
              {"loop": "no_sync forgotten on every rank", "ring bytes per step (ledger)": forgotten_everywhere,
               "theory (DDP, no_sync)": formula}])

# %% [markdown]
# ## How long until each diagnosis?
#
# **Predict before you run.** Every lab was given `timeout_s = 10`. How many of the six will
# take the whole 10 s before zerokit reports the error?
#
# <details><summary>Answer</summary>
#
# None of them, on gloo: the picture below draws every lab's measured time at its own scale,
# and its title sets the slowest against the timeout (the check cell under it holds that). gloo fails as soon as a peer's socket
# closes or the sizes disagree, zerokit's checks fail before the collective runs, and the
# heartbeat stops a stalled job after `heartbeat_s`. On NCCL a dead peer is another story (the
# section after next).
#
# </details>
#
# Measured from the launch to the error (noisy on a shared machine), against the timeout the
# labs were given. Nothing waited for the timeout (the check cell under the picture holds the
# slowest below it): gloo fails as soon as a peer's socket closes
# or sizes disagree, the checks fail before the collective, and the heartbeat (`heartbeat_s`)
# stops a stalled job as soon as no rank has entered or left a collective for that long.

# %%
LABS = [some_ranks, unused, shapes, crash, diverged, forgot]
longest = max(d.seconds for d in LABS)
fig, ax = course.new_figure(9, 3.4)
ax.barh([d.lab for d in LABS], [d.seconds for d in LABS], color="#4C72B0")
for d in LABS:  # each bar's time beside it, the axis at the bars' own scale
    ax.text(d.seconds, d.lab, f" {d.seconds:.2f} s", va="center")
ax.set_xlim(0, longest * 1.3)
ax.set_xlabel("measured seconds from launch to zerokit's error")
ax.set_title(f"the slowest lab failed after {longest:.2f} s: {longest / 10:.1%} of timeout_s = 10 s")
ax.invert_yaxis()
fig.tight_layout()
fig

# %% [markdown]
# ## Each lab's error names the right rank and collective
#
# The assertions read the diagnoses above: the blamed rank, the op, call number and phase they
# name, the exception inside the rank — and the ledger's bytes against the formula.

# %% [checks]
assert some_ranks.error == "RankFailed" and "rank 0" in some_ranks.where
assert "all_reduce #7 of setup (1 float32" in some_ranks.where, some_ranks.where
assert unused.ranks == (0,) and unused.cause == "ValueError" and "'aux.weight'" in unused.summary
assert shapes.cause == "CollectiveMismatch" and (shapes.op, shapes.call, shapes.phase) == ("reduce_scatter", 2, "backward")
assert "rank 1 is in reduce_scatter of 6 float32" in shapes.summary, shapes.summary
assert crash.ranks == (1,) and crash.cause == "exit" and "SIGKILL" in crash.summary
assert diverged.cause == "ReplicasDiverged" and "rank 1's parameter '0.weight'" in diverged.summary
assert forgot.ranks == (1,) and (forgot.op, forgot.phase) == ("all_reduce", "backward")
assert "rank 0 is finished" in forgot.where and "did not call the same collectives" in forgot.where
assert max(d.seconds for d in LABS) < 10, [round(d.seconds, 1) for d in LABS]
assert with_no_sync == formula and forgotten_everywhere == 2 * formula, (with_no_sync, forgotten_everywhere, formula)

# %% [markdown]
# **Check yourself.** Which collective does zerokit blame when the ranks' reduce-scatter sizes disagree? Predict it, then run the cell: it prints its
# verdict, and stops with an `AssertionError` if the run disagrees.

# %%
print(f"mismatched reduce-scatter: {shapes.cause} at {shapes.op} #{shapes.call} of {shapes.phase} — "
      f"{'the right collective' if (shapes.cause, shapes.op) == ('CollectiveMismatch', 'reduce_scatter') else 'another'}")
assert (shapes.cause, shapes.op) == ("CollectiveMismatch", "reduce_scatter")

# %% [markdown]
# ## On NCCL, the same bugs hang
#
# gloo on one machine fails fast because its peers talk over sockets that close when a
# process dies, and it checks sizes. **NCCL does neither**: a collective is a kernel queued on
# a GPU stream, and a rank whose peer never arrives — lab 1, lab 4 across hosts, lab 6 — just
# spins in that kernel. What ends it is the **watchdog**, a thread in each rank that checks the
# queued collectives against the process group's `timeout` (10 minutes by default for NCCL).
# `TORCH_NCCL_ASYNC_ERROR_HANDLING` says what it does then (older torch:
# `NCCL_ASYNC_ERROR_HANDLING`): 1 aborts the communicator and tears the process down (torchrun
# sets 1); 3, the default, tears it down without the abort; 2 only aborts; 0 does nothing, and
# the job hangs for good. Either way the launcher sees a crash *after the timeout*, not at once. Hence,
# on GPUs:
#
# - pass a short `timeout=` to `init_process_group` while debugging (zerokit sets it from
#   `timeout_s`), and use `heartbeat_s` to stop a stall before that;
# - `TORCH_NCCL_DUMP_ON_TIMEOUT=1` / the flight recorder (`TORCH_NCCL_TRACE_BUFFER_SIZE`)
#   record each rank's last collectives — the same *which op, which call number* as the
#   status slots here. On NCCL a call returns once its collective is queued, so zerokit's
#   report there names the collective each rank **last enqueued**, not one it is inside;
# - mismatches are not detected by NCCL at all: `TORCH_DISTRIBUTED_DEBUG=DETAIL` (or
#   `check_collectives`) is how to get lab 3's message instead of garbage or a hang.
#
# ## Try it
#
# Pick a bug and press **Run**: the lab runs again, for real, and the panel shows zerokit's
# diagnosis. Define your own lab — any `fn(ctx)` — and add it to the dict.

# %%
course.FailurePanel({
    "collective on some ranks": (loss_logged_on_rank_0, {"timeout_s": 10, "heartbeat_s": 4}),
    "unused parameter": (unused_on_rank_0, {"timeout_s": 10}),
    "mismatched reduce-scatter": (uneven_reduce_scatter, {"timeout_s": 10, "check_collectives": True}),
    "rank crashes mid-step": (killed_mid_step, {"timeout_s": 10}),
    "ranks whose models differ": (seeded_by_rank, {"timeout_s": 10}),
    "forgotten no_sync": (accumulate, {"timeout_s": 10}),
}, world_size=WORLD)

# %% [markdown]
# ## Summary
#
# - Read a distributed error by **rank, op, call number and phase**, and look for the odd
#   one out: the rank in another phase or size (lab 1), the rank that finished while another
#   waited (lab 6). zerokit's status slots give every rank's collective even when it died.
# - Blame the first rank whose failure is *not* a lost connection: the others are victims
#   (labs 2 and 4).
# - Some bugs raise nothing: ranks that train different models (lab 5, `check_replicas`), a
#   `no_sync` forgotten everywhere (2× the formula's bytes in the ledger at 2 micro-batches).
# - gloo fails fast on one machine; NCCL hangs until its watchdog and timeout. Debug with
#   short timeouts, `heartbeat_s`, and `check_collectives` / `TORCH_DISTRIBUTED_DEBUG=DETAIL`.
#
# ## Interview questions
#
# 1. *Your 64-GPU job hangs at step 1,200. How do you find the culprit?*
#
#    <details><summary>Answer</summary>
#
#    Find which collective each rank is in — py-spy or a stack dump on each rank, NCCL's flight
#    recorder, or status slots like zerokit's — and look for the odd one out: the rank in a
#    different op, call number or phase, or the rank not in a collective at all (crashed,
#    stuck in data loading). Then rerun with a short timeout and
#    `TORCH_DISTRIBUTED_DEBUG=DETAIL` to stop at the mismatched call (labs 1, 3, 6).
#
#    </details>
#
# 2. *Why does torch's DDP need `find_unused_parameters`, and what does it cost?*
#
#    <details><summary>Answer</summary>
#
#    DDP reduces a bucket when all its gradients have arrived; a parameter that gets no
#    gradient on a rank keeps its bucket from ever being reduced, and the peers wait in that
#    all-reduce. With the flag DDP walks the autograd graph after forward to mark unused
#    parameters ready (zeros), an extra traversal per step (lab 2).
#
#    </details>
#
# 3. *Gradient accumulation without `no_sync`: wrong results or just slow?*
#
#    <details><summary>Answer</summary>
#
#    Forgotten on every rank, just slow: averaging is linear, so the accumulated gradient is
#    the same, but each micro-batch all-reduces the whole gradient — A times the traffic
#    (the ledger against `theory.comm_bytes_per_step`). Forgotten on some ranks only, the
#    collectives pair up wrongly: wrong gradients and then a hang or a lost peer (lab 6).
#
#    </details>

# %% [markdown]
# **Exercise:** [exercises/09_predict.ipynb](../exercises/09_predict.ipynb) — predict what
# each run will measure before it runs, graded by `zerokit grade 09` · **Next:** [lesson 15 — context parallelism](15_context_parallel.ipynb); the [course map](README.md) has
# the whole path
