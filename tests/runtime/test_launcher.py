"""launch: results by rank, forwarded output, first-failure blame, hangs, and no orphans ever."""
import multiprocessing as mp
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from zerokit.runtime.context import current, note_collective
from zerokit.runtime.launch import RankFailed, RankTimeout, launch, max_world_size
from zerokit.runtime.torchrun import TORCHRUN_VARIABLES

REPO = Path(__file__).resolve().parents[2]


# --- process bookkeeping --------------------------------------------------------------------

def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _descendants(pid: int) -> set:
    """Running descendants of ``pid`` (psutil if installed, else the ppid links in /proc).

    multiprocessing's resource tracker, which spawn starts once and which lives as long
    as this process, is not counted.
    """
    try:
        import psutil
    except ImportError:
        parents = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    pass
        found, frontier = set(), {pid}
        while frontier:
            frontier = {child for child, parent in parents.items() if parent in frontier} - found
            found |= frontier
    else:
        found = {p.pid for p in psutil.Process(pid).children(recursive=True)}
    return {p for p in found if _alive(p) and not _is_resource_tracker(p)}


def _is_resource_tracker(pid: int) -> bool:
    try:
        return b"multiprocessing.resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.fixture(autouse=True)
def no_orphans():
    """Every test, passing or failing, must leave no rank process behind."""
    yield
    assert mp.active_children() == []
    assert _descendants(os.getpid()) == set()


def _env_without_torchrun() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


# --- rank functions (module level; the test-local ones are in the tests) ----------------------

def _whoami(ctx):
    assert current() is ctx
    return ctx.rank, ctx.world_size, ctx.device.type, ctx.backend, ctx.torchrun


def _sum_of_ranks(ctx):
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    return t.item()


def _chatty(ctx):
    print(f"hello from rank {ctx.rank}")
    os.write(1, f"C-level line from rank {ctx.rank}\n".encode())
    for i in range(20):  # one long line written in pieces, racing the other ranks
        sys.stdout.write(f"piece{i}-")
        sys.stdout.flush()
        os.write(1, b"c-")
    os.write(1, b"end\n")
    print(f"to stderr from rank {ctx.rank}", file=sys.stderr)
    os.write(1, b"no newline at the end")


def _fail_while_peers_wait(ctx, culprit):
    if ctx.rank == culprit:
        time.sleep(0.2)
        raise ValueError("boom")
    dist.all_reduce(torch.ones(1))  # blocks until the culprit's exit breaks the connection
    return ctx.rank


def _exit_without_raising(ctx):
    if ctx.rank == 1:
        print("rank 1 about to leave")
        os.write(1, b"half a line")
        os._exit(3)
    dist.all_reduce(torch.ones(1))


def _hang(ctx):
    if ctx.rank == 1:
        time.sleep(3600)
    note_collective("all_reduce 1 float32 [test]")
    dist.all_reduce(torch.ones(1))


def _return_lock(ctx):
    return threading.Lock()


_WHERE = "import"  # the parent changes it: a forked rank sees the change, a spawned one re-imports


def _where(ctx):
    return _WHERE


def _loopback_only(ctx):
    import psutil
    dist.barrier()
    addresses = set()
    if ctx.rank == 0:
        for proc in psutil.Process(os.getppid()).children():
            addresses |= {c.laddr.ip for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    dist.barrier()
    return addresses


# --- tests ----------------------------------------------------------------------------------

def test_results_come_back_by_rank():
    assert launch(_whoami, 2) == [(r, 2, "cpu", "gloo", False) for r in range(2)]


def test_a_world_of_one_still_has_a_process_group():
    assert launch(_sum_of_ranks, 1) == [0.0]


def test_all_reduce_across_three_ranks():
    assert launch(_sum_of_ranks, 3) == [3.0, 3.0, 3.0]


def test_args_and_kwargs_reach_fn():
    def scaled(ctx, a, b=0):
        return a * ctx.rank + b
    assert launch(scaled, 2, 10, b=1) == [1, 11]


def test_output_is_forwarded_in_whole_prefixed_lines(capfd):
    launch(_chatty, 3)
    out, err = capfd.readouterr()
    lines = out.splitlines()
    assert all(re.fullmatch(r"\[r[0-2]\] .*", line) for line in lines), out
    long_line = "".join(f"piece{i}-c-" for i in range(20)) + "end"
    for r in range(3):
        for text in (f"hello from rank {r}", f"C-level line from rank {r}", long_line, "no newline at the end"):
            assert f"[r{r}] {text}" in lines
    assert sorted(err.splitlines()) == [f"[r{r}] to stderr from rank {r}" for r in range(3)]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_local_functions_and_classes_travel(start_method, capfd):
    offset = 100

    class Point:
        def __init__(self, x):
            self.x = x

    def make_point(ctx):
        print("made here")
        return Point(ctx.rank + offset)

    points = launch(make_point, 2, start_method=start_method)
    assert [p.x for p in points] == [100, 101]
    assert "[r1] made here" in capfd.readouterr().out.splitlines()


def test_fork_is_avoided_when_this_process_holds_a_process_group():
    global _WHERE
    assert launch(_where, 1) == ["import"]
    _WHERE = "parent memory"
    try:
        assert launch(_where, 1) == ["parent memory"]  # forked
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            assert launch(_where, 2) == ["import", "import"]  # spawned
            with pytest.raises(ValueError, match="start_method='fork' is unsafe here"):
                launch(_where, 2, start_method="fork")
        finally:
            dist.destroy_process_group()
    finally:
        _WHERE = "import"


def test_nccl_always_spawns_whatever_cuda_is_available_did():
    """torch.cuda.is_available() poisons fork without setting torch.cuda.is_initialized(), so the rule cannot hang
    on that flag: NCCL ranks are spawned, and fork with NCCL is refused before any process starts."""
    from zerokit.runtime.launch import _choose_start_method

    assert _choose_start_method(None, "nccl") == "spawn"
    assert _choose_start_method("spawn", "nccl") == "spawn"
    with pytest.raises(ValueError, match="start_method='fork' is unsafe here: NCCL ranks use CUDA"):
        _choose_start_method("fork", "nccl")
    assert _choose_start_method(None, "gloo") == "fork" and _choose_start_method(None) == "fork"


@pytest.mark.parametrize("culprit", [0, 1])
def test_the_rank_that_raised_is_blamed_not_the_ones_waiting_for_it(culprit):
    with pytest.raises(RankFailed) as info:
        launch(_fail_while_peers_wait, 3, culprit)
    e = info.value
    assert e.rank == culprit and e.exitcode == 1
    assert "ValueError: boom" in e.traceback and "_fail_while_peers_wait" in e.traceback
    assert f"rank {culprit} failed" in str(e) and "ValueError: boom" in str(e)
    assert all(r != culprit for r, _ in e.others)


def test_a_rank_that_exits_without_raising_is_named_with_its_exit_code(capfd):
    with pytest.raises(RankFailed) as info:
        launch(_exit_without_raising, 2)
    e = info.value
    assert (e.rank, e.exitcode) == (1, 3)
    assert e.traceback == "rank 1 exited with code 3 without raising"
    assert "rank 1" in str(e)
    out = capfd.readouterr().out.splitlines()
    assert "[r1] rank 1 about to leave" in out and "[r1] half a line" in out


def test_a_hang_raises_rank_timeout_with_the_last_collective(capfd):
    start = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        launch(_hang, 2, timeout_s=3)
    assert time.monotonic() - start < 30
    e = info.value
    assert isinstance(e, TimeoutError)
    assert e.ranks == [0, 1] and e.timeout_s == 3
    assert e.last_collectives == {0: "all_reduce 1 float32 [test]", 1: ""}
    assert "all_reduce 1 float32 [test]" in str(e) and "[0, 1]" in str(e)
    err = capfd.readouterr().err
    assert re.search(r"\[r1\] .*in _hang", err) and re.search(r"\[r0\] .*in all_reduce", err)  # stacks


def test_an_unpicklable_return_value_fails_its_rank():
    with pytest.raises(RankFailed, match="the return value of fn on rank [01] could not be pickled: "
                                         "TypeError: cannot pickle '_thread.lock' object"):
        launch(_return_lock, 2)


@pytest.mark.parametrize("call, error, words", [
    (lambda: launch(_whoami, 0), ValueError, "world_size=0"),
    (lambda: launch(_whoami, 10_000), ValueError, r"world_size=10000 .*allowed 1 to \d+"),
    (lambda: launch(_whoami, 2.0), ValueError, "world_size=2.0"),
    (lambda: launch(_whoami, True), ValueError, "world_size=True"),
    (lambda: launch("not a function", 2), TypeError, "fn must be callable"),
    (lambda: launch(_whoami, 2, backend="mpi"), ValueError, "backend='mpi'"),
    (lambda: launch(_whoami, 2, timeout_s=0), ValueError, "timeout_s=0"),
    (lambda: launch(_whoami, 2, threads_per_rank=0), ValueError, "threads_per_rank=0"),
    (lambda: launch(_whoami, 2, start_method="forkserver"), ValueError, "start_method='forkserver'"),
])
def test_bad_input_is_refused_before_any_process_starts(call, error, words, monkeypatch):
    def refuse(self):
        raise AssertionError("a process was started")

    monkeypatch.setattr(mp.process.BaseProcess, "start", refuse)
    with pytest.raises(error, match=words):
        call()


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="needs fewer than 2 GPUs")
def test_nccl_without_a_gpu_per_rank_is_refused():
    with pytest.raises(ValueError, match="backend='nccl' needs one CUDA device per rank"):
        launch(_whoami, 2, backend="nccl")


def test_max_world_size():
    assert max_world_size("gloo") == max(8, 4 * os.cpu_count())
    assert max_world_size("nccl") == torch.cuda.device_count()
    assert max_world_size() == max(max_world_size("gloo"), max_world_size("nccl"))
    with pytest.raises(ValueError, match="backend='mpi'"):
        max_world_size("mpi")


def test_errors_survive_pickling():
    failed = pickle.loads(pickle.dumps(RankFailed(1, "Traceback...\nValueError: boom", 1, [(0, "lost a peer")])))
    assert (failed.rank, failed.exitcode, failed.others, str(failed).splitlines()[0]) == \
        (1, 1, [(0, "lost a peer")], "rank 1 failed (exit code 1):")
    timeout = pickle.loads(pickle.dumps(RankTimeout([0], {0: "all_reduce"}, 3.0)))
    assert (timeout.ranks, timeout.last_collectives, timeout.timeout_s) == ([0], {0: "all_reduce"}, 3.0)


def test_two_launches_at_once_do_not_collide():
    results = {}

    def run(key):
        results[key] = launch(_sum_of_ranks, 2)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {0: [1.0, 1.0], 1: [1.0, 1.0]}


def test_the_ranks_listen_on_loopback_only():
    pytest.importorskip("psutil")
    addresses = launch(_loopback_only, 2)[0]
    assert addresses == {"127.0.0.1"}


# --- launchers around us ------------------------------------------------------------------------

def test_rank_and_world_size_alone_are_not_torchrun(monkeypatch):
    """SLURM, MPI or a user's script may set RANK and WORLD_SIZE; only torchrun's agent sets its own."""
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert launch(_whoami, 2) == [(r, 2, "cpu", "gloo", False) for r in range(2)]
    assert not dist.is_initialized()


# --- what a rank starts dies with it ---------------------------------------------------------

def _own_session(ctx):
    return os.getpid(), os.getpgid(0), os.getsid(0)


def _leave_a_child(ctx, folder, how):
    """Start a process that would outlive this rank, note its pid, then return, raise or hang."""
    child = subprocess.Popen(["sleep", "60"])
    (Path(folder) / f"child{ctx.rank}.pid").write_text(str(child.pid))
    if how == "raise" and ctx.rank == 1:
        raise RuntimeError("rank 1 leaves a child behind")
    if how == "hang" and ctx.rank == 1:
        time.sleep(3600)
    return child.pid


def _running(pid: int) -> bool:
    """Whether ``pid`` runs, by psutil (a zombie waiting for init to reap it does not)."""
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_each_rank_leads_its_own_session_and_process_group():
    for pid, pgid, sid in launch(_own_session, 2):
        assert pid == pgid == sid != os.getpgid(0)


@pytest.mark.parametrize("how, error", [("return", None), ("raise", RankFailed), ("hang", RankTimeout)])
def test_a_rank_s_own_children_do_not_outlive_the_launch(how, error, tmp_path):
    pytest.importorskip("psutil")
    if error is None:
        launch(_leave_a_child, 2, str(tmp_path), how, timeout_s=60)
    else:
        with pytest.raises(error):
            launch(_leave_a_child, 2, str(tmp_path), how, timeout_s=60 if error is RankFailed else 3)
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("child*.pid"))]
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in pids if _running(pid)] == []


# --- the parent interrupted or killed ---------------------------------------------------------

_SLEEPER = textwrap.dedent("""
    import os, sys, time
    from zerokit.runtime.launch import launch

    def sleep(ctx, folder):
        with open(os.path.join(folder, f"rank{ctx.rank}.pid"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(3600)

    if __name__ == "__main__":
        launch(sleep, 2, sys.argv[1])
""")


def _start_sleeper(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(_SLEEPER)
    # SIGINT at its default: a shell's background job (`cmd &`, nohup) starts with SIGINT ignored and its children
    # inherit that, and Python then never turns Ctrl-C into KeyboardInterrupt — the test would hang, not the launcher
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=_env_without_torchrun(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("rank*.pid"))) < 2 or any(p.stat().st_size == 0 for p in tmp_path.glob("*.pid")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.1)
    return proc, [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]


def _wait_gone(pids, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if _alive(pid)]


def test_ctrl_c_in_the_parent_kills_every_rank(tmp_path):
    proc, pids = _start_sleeper(tmp_path)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert "KeyboardInterrupt" in err
    assert _wait_gone(pids, timeout_s=5) == []


def test_a_parent_killed_hard_takes_its_ranks_along(tmp_path):
    proc, pids = _start_sleeper(tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    assert _wait_gone(pids) == []


_ABANDONED = textwrap.dedent("""
    import os, subprocess, sys, threading, time
    from zerokit.runtime.launch import launch

    def sleep(ctx, folder):
        child = subprocess.Popen(["sleep", "60"])
        with open(os.path.join(folder, f"pids{ctx.rank}.tmp"), "w") as f:
            f.write(f"{os.getpid()} {child.pid}")
        os.rename(os.path.join(folder, f"pids{ctx.rank}.tmp"), os.path.join(folder, f"pids{ctx.rank}"))
        time.sleep(3600)

    if __name__ == "__main__":
        threading.Thread(target=launch, args=(sleep, 2, sys.argv[1]), daemon=True).start()
        while len([n for n in os.listdir(sys.argv[1]) if n.startswith("pids") and n[-1].isdigit()]) < 2:
            time.sleep(0.05)
        sys.exit(0)  # the launch thread is abandoned: only the atexit hook can stop its ranks
""")


def test_at_exit_a_launch_left_running_in_a_thread_takes_its_ranks_and_their_children_along(tmp_path):
    script = tmp_path / "abandoned.py"
    script.write_text(_ABANDONED)
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], env=_env_without_torchrun(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pids = [int(pid) for p in tmp_path.glob("pids?") for pid in p.read_text().split()]
    assert len(pids) == 4
    assert _wait_gone(pids, timeout_s=5) == []


# --- under torchrun ---------------------------------------------------------------------------

_UNDER_TORCHRUN = textwrap.dedent("""
    import os
    from zerokit.runtime.launch import launch

    def who(ctx):
        return (ctx.rank, ctx.torchrun)

    first = launch(who, 2)
    second = launch(lambda ctx: ctx.rank * 10, 2)
    try:
        launch(who, 3)
    except ValueError as e:
        mismatch = "WORLD_SIZE=2" in str(e)
    print(f"RANK {os.environ['RANK']}: {first} {second} {mismatch}", flush=True)
""")


def test_under_torchrun_fn_runs_in_process_and_results_are_gathered(tmp_path):
    script = tmp_path / "under_torchrun.py"
    script.write_text(_UNDER_TORCHRUN)
    env = _env_without_torchrun()
    env["OMP_NUM_THREADS"] = "1"
    # --standalone: torchrun's agent binds a free port itself (a port picked here and released could be taken
    # by another test's process before torchrun binds it)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script)],
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    for r in range(2):
        assert f"RANK {r}: [(0, True), (1, True)] [0, 10] True" in done.stdout
