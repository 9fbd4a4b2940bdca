"""No process outlives a ``zerokit`` command, however it ends; a command refused before any rank starts starts none.

Each case runs one command line as a user's shell would (a subprocess; the console script's ``main`` under an
audit hook that notes every process the command starts) and takes a census before and after it: the live
processes that are this test's descendants, and those carrying the case's mark — an environment variable every
process the command starts inherits, ranks, their children and their orphans included, so a process is counted
as the command's however it was reparented, and another zerokit command on the same machine (a notebook, a
second test worker) is not. Zombies have exited and are not counted. After the command returns, the census polls
until what it started is gone, for up to ``WAIT_S``: it waits only as long as an exit actually takes, and
anything still alive then is left behind, killed by the test and reported.

The cases are the suite's own bad inputs (tests/app/test_bad_input.py, tests/app/test_cli.py,
tests/grade/test_grade.py): the refusals before any process starts, ranks that raise, a rank that starts a helper
process and then raises or hangs, a hang stopped by ``--timeout``, and the same hang ended by Ctrl-C and by SIGTERM
(``timeout(1)``'s signal, and a Jupyter kernel's at shutdown). Each runs once alone, and a share of them once more
beside a CPU hog (a busy loop this test starts and kills), under the ``serial`` marker, as ``make test`` runs those
alone.
"""
import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import psutil
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: the environment variable that marks a case's processes; its value is RUN-N
MARK = "ZEROKIT_CENSUS_MARK"
RUN = uuid.uuid4().hex[:12]
_numbers = itertools.count()
#: how long the census waits for what a command started to be gone once the command has returned
WAIT_S = 30.0
#: how long a command may run before the test stops it (SIGTERM, then SIGKILL) and fails
COMMAND_S = 120.0

#: ``zerokit`` as its console script runs it, under an audit hook that writes one line per process started
WRAPPER = """
import os, signal, sys
# Ctrl-C as an interactive shell delivers it: a process started by one that ignores SIGINT (a background job of a
# script, a test runner's worker after some test set it) inherits the ignoring, and Python then never raises
# KeyboardInterrupt
signal.signal(signal.SIGINT, signal.default_int_handler)
STARTS = ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen")
def note(event, args):
    if event in STARTS:
        with open(os.environ["ZEROKIT_CENSUS_STARTS"], "a") as f:
            f.write(event + "\\n")
sys.addaudithook(note)
from zerokit.cli import main
sys.exit(main(sys.argv[1:]))
"""

MODEL = "tests/data/bad_input_workload.py:work"
FAILING = "tests/data/failing_workload.py:workload"

#: an exercise-01 submission: ``{before}`` on each rank, then the ring's receive that no rank ever sends to
HANG = """
import subprocess, sys
import torch.distributed as dist
EXERCISE = "01_ring_allreduce"
def ring_all_reduce(tensor, group=None):
    {before}
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    dist.recv(tensor.clone(), src=(rank - 1) % n, group=group)
"""
HELPER = 'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])'
SUBMISSIONS = {
    "hang.py": HANG.format(before="pass"),
    "helper_then_raise.py": HANG.format(before=HELPER + '; raise RuntimeError("the ring breaks after a helper")'),
    "helper_then_hang.py": HANG.format(before=HELPER),
}


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple
    code: int  # the exit status; negative: the signal it dies by
    starts: bool  # whether the command starts processes at all (False: refused before any)
    interrupt: Optional[int] = None  # a signal sent once ranks and helpers run (``ready`` processes of the case's)
    ready: int = 0


CASES = [
    # refused before any process starts
    Case("grade-missing-notebook", ("grade", "/nonexistent/ex.ipynb"), 2, False),
    Case("compare-world-size-5", ("compare", "--model", MODEL, "--world-size", "5", "--strategies", "ddp"), 2, False),
    Case("compare-model-file", ("compare", "--model", "no_such_file.py:work", "--world-size", "2",
                                "--strategies", "ddp"), 2, False),
    Case("tour-steps", ("tour", "--steps", "0"), 2, False),
    Case("plan-preset", ("plan", "--preset", "gpt-9000"), 2, False),
    Case("bench-suite", ("bench", "nosuch"), 2, False),
    # ranks start, then fail, hang, or are stopped
    Case("compare-rank-raises", ("compare", "--model", FAILING, "--world-size", "2", "--steps", "1",
                                 "--strategies", "ddp"), 1, True),
    Case("grade-not-implemented", ("grade", "exercises/01_ring_allreduce.py", "--check", "sum-2-ranks"), 1, True),
    Case("grade-helper-then-raise", ("grade", "{tmp}/helper_then_raise.py", "--check", "sum-2-ranks"), 1, True),
    Case("grade-hang-timeout", ("grade", "{tmp}/hang.py", "--check", "sum-2-ranks", "--timeout", "1"), 1, True),
    Case("grade-ctrl-c", ("grade", "{tmp}/helper_then_hang.py", "--check", "sum-2-ranks", "--timeout", "60"),
         -signal.SIGINT, True, signal.SIGINT, ready=4),
    Case("grade-sigterm", ("grade", "{tmp}/helper_then_hang.py", "--check", "sum-2-ranks", "--timeout", "60"),
         -signal.SIGTERM, True, signal.SIGTERM, ready=4),
]
#: the cases run again beside a CPU hog: one refusal that reads a file, and every way ranks end
LOADED = ["grade-missing-notebook", "compare-world-size-5", "compare-rank-raises", "grade-helper-then-raise",
          "grade-hang-timeout", "grade-sigterm"]


# --- the census ----------------------------------------------------------------------------------------------

def census(prefix: str) -> dict:
    """``{pid: description}`` of the live processes that are this test's descendants or carry a mark starting
    with ``prefix``."""
    found = {}
    for p in psutil.Process().children(recursive=True):
        found[p.pid] = p
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK, "").startswith(prefix):
                found[p.pid] = p
        except psutil.Error:  # gone, or another user's
            pass
    alive = {}
    for pid, p in found.items():
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive[pid] = f"{pid} {' '.join(p.cmdline())[:120]}"
        except psutil.Error:
            pass
    return alive


@dataclass
class Outcome:
    code: int
    err: str
    starts: int  # processes the command itself started (fork, Popen...), as its audit hook saw them
    at_return: dict  # the census's newcomers the moment the command had returned
    left: dict  # those still alive after the bounded wait
    waited_s: float


def run(case: Case, tmp: Path) -> Outcome:
    mark = f"{RUN}-{next(_numbers)}"
    starts = tmp / f"{mark}.starts"
    argv = [a.replace("{tmp}", str(tmp)) for a in case.argv]
    before = census(RUN)
    env = dict(os.environ, **{MARK: mark, "ZEROKIT_CENSUS_STARTS": str(starts)})
    proc = subprocess.Popen([sys.executable, "-c", WRAPPER, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        if case.interrupt is not None:
            deadline = time.monotonic() + COMMAND_S
            while len(set(census(mark)) - {proc.pid}) < case.ready and proc.poll() is None:
                assert time.monotonic() < deadline, f"{case.id}: its ranks and helpers never all ran"
                time.sleep(0.05)
            proc.send_signal(case.interrupt)
        _, err = proc.communicate(timeout=COMMAND_S)
    except BaseException:
        proc.terminate()
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise
    finally:
        at_return = {pid: d for pid, d in census(RUN).items() if pid not in before}
        start = time.monotonic()
        left = dict(at_return)
        while left and time.monotonic() - start < WAIT_S:  # poll: as long as the exits take, no longer
            time.sleep(0.02)
            left = {pid: d for pid, d in census(RUN).items() if pid not in before}
        waited = time.monotonic() - start
        for pid in left:  # leave nothing for the next case
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
    count = len(starts.read_text().splitlines()) if starts.exists() else 0
    return Outcome(proc.returncode, err, count, at_return, left, waited)


def check(case: Case, outcome: Outcome) -> None:
    assert not outcome.left, (f"{case.id}: {len(outcome.left)} process(es) still alive {WAIT_S:g} s after the "
                              f"command returned: {list(outcome.left.values())}\n{outcome.err[-2000:]}")
    assert outcome.code == case.code, f"{case.id}: exit status {outcome.code}, expected {case.code}\n{outcome.err}"
    if case.interrupt == signal.SIGINT:  # one line says so, no traceback
        assert "interrupted" in outcome.err and "Traceback" not in outcome.err, outcome.err
    if case.starts:
        assert outcome.starts > 0, f"{case.id}: the command started no process, so it tests nothing here"
    else:
        assert outcome.starts == 0, f"{case.id}: refused, yet it started {outcome.starts} process(es)"
        assert "zerokit: error:" in outcome.err and "Traceback" not in outcome.err, outcome.err


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("census")
    for name, text in SUBMISSIONS.items():
        (folder / name).write_text(text)
    return folder


@pytest.fixture(scope="module")
def hog():
    """A busy loop on one core for as long as the loaded cases run."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_nothing_is_left_behind(case, tmp):
    check(case, run(case, tmp))


@pytest.mark.serial
@pytest.mark.parametrize("case", [c for c in CASES if c.id in LOADED], ids=[c.id for c in CASES if c.id in LOADED])
def test_nothing_is_left_behind_beside_a_cpu_hog(case, tmp, hog):
    assert hog.poll() is None, "the CPU hog is not running"
    check(case, run(case, tmp))


def test_the_loaded_cases_exist():
    assert set(LOADED) <= {c.id for c in CASES}
