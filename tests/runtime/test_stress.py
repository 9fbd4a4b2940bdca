"""Stress (issue 16): 100 consecutive launches in one process — 90 fork, 10 spawn, interleaved — leak nothing.

After one warm-up launch of each kind (first imports; spawn's multiprocessing resource tracker, a
process that lives as long as this one), the test counts what this process holds: child processes
(psutil, recursive), open file descriptors (psutil num_fds), listening and open inet sockets, threads,
and the entries of /dev/shm. Then 100 launches of 2 ranks, each an all-reduce whose result is checked,
every tenth with spawn; then the counts again: equal, and no child left. Ten of the fork launches
fail on purpose (a rank raises), so the failure path is stressed too. The figures are printed
(pytest -s shows them).

It stays slow (20–40 s, most of it the ten spawn launches) on purpose: a leak that happens on every launch
would show after one, but the ones worth a stress run are intermittent — a pipe or a thread left behind when
a rank's exit races the parent's reader — and only many launches of both kinds, failing ones among them,
give such a race the chance to show.
"""
import os
import sys
import time

import psutil
import pytest
import torch

import zerokit
from zerokit import comm

pytestmark = pytest.mark.serial  # wall-clock bounds (or machine-wide counts): run alone, see pyproject.toml

LAUNCHES, SPAWN_EVERY, FAIL_EVERY = 100, 10, 10


def _sum_of_ranks(ctx, fail=False):
    t = torch.tensor([float(ctx.rank)])
    comm.all_reduce(t)
    if fail and ctx.rank == 1:
        raise RuntimeError("failing on purpose")
    return float(t)


def _counts():
    me = psutil.Process()
    inet = me.net_connections(kind="inet")
    shm = sorted(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else []
    return {"children": len(me.children(recursive=True)), "fds": me.num_fds(),
            "listening sockets": sum(1 for c in inet if c.status == psutil.CONN_LISTEN),
            "inet sockets": len(inet), "threads": me.num_threads(), "/dev/shm entries": len(shm)}, set(shm)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork, num_fds and /dev/shm: Linux")
def test_a_hundred_launches_leak_no_process_fd_socket_thread_or_shared_memory():
    for method in ("fork", "spawn"):  # warm up: imports, and spawn's resource tracker (it stays, by design)
        assert zerokit.launch(_sum_of_ranks, 2, start_method=method, timeout_s=60) == [1.0, 1.0]
    before, shm_before = _counts()
    start = time.perf_counter()
    spawned = failed = 0
    for i in range(LAUNCHES):
        method = "spawn" if i % SPAWN_EVERY == SPAWN_EVERY - 1 else "fork"
        fail = method == "fork" and i % FAIL_EVERY == 0
        if fail:
            with pytest.raises(zerokit.RankFailed, match="failing on purpose"):
                zerokit.launch(_sum_of_ranks, 2, fail=True, start_method=method, timeout_s=60)
            failed += 1
        else:
            assert zerokit.launch(_sum_of_ranks, 2, start_method=method, timeout_s=60) == [1.0, 1.0]
        spawned += method == "spawn"
    took = time.perf_counter() - start
    after, shm_after = _counts()
    print(f"\n{LAUNCHES} launches ({LAUNCHES - spawned} fork, {spawned} spawn, {failed} failing on purpose) in "
          f"{took:.1f} s")
    for key in before:
        print(f"  {key}: before {before[key]}, after {after[key]}")
    assert after == before, {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert shm_after == shm_before, (shm_before ^ shm_after)
    assert spawned == LAUNCHES // SPAWN_EVERY and failed == LAUNCHES // FAIL_EVERY
