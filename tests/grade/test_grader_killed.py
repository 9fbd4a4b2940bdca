"""The grader killed however hard (SIGKILL: no handler, no ``finally``) leaves nothing running: each keeper hears of
it from Linux (PDEATHSIG, SIGTERM) and kills what its submission started, processes the submission's ranks started
included.

A ``zerokit grade`` command grades an exercise-01 submission whose ranks each start a helper process and then hang
in the ring's receive; once both helpers run, the command is SIGKILLed. Every process it started carries an
environment variable of this test's, so it is found however it was reparented; the test polls until none is alive,
for up to ``WAIT_S`` (as long as the exits take, no longer), then kills and names what is left. (Before the keeper
took PDEATHSIG as SIGTERM, Linux SIGKILLed it with the grader, and the two helpers ran on.)
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]
MARK = "ZEROKIT_KILLED_GRADER_MARK"
#: how long what the grader started may take to be gone once it is killed
WAIT_S = 30.0
#: how long the helpers may take to start
START_S = 120.0
HELPER = "import time; time.sleep(300)"
SUBMISSION = f"""
import subprocess, sys
import torch.distributed as dist
EXERCISE = "01_ring_allreduce"
def ring_all_reduce(tensor, group=None):
    subprocess.Popen([sys.executable, "-c", {HELPER!r}])
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    dist.recv(tensor.clone(), src=(rank - 1) % n, group=group)
"""


def _marked(mark: str) -> dict:
    """``{pid: command line}`` of the live processes carrying ``mark``."""
    found = {}
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                found[p.pid] = " ".join(p.cmdline())[:120]
        except psutil.Error:  # gone, or another user's
            pass
    return found


def test_a_killed_grader_leaves_nothing_running(tmp_path):
    path = tmp_path / "helper_then_hang.py"
    path.write_text(SUBMISSION)
    mark = uuid.uuid4().hex
    grader = subprocess.Popen([sys.executable, "-c", "import sys; from zerokit.cli import main; sys.exit(main())",
                               "grade", str(path), "--check", "sum-2-ranks", "--timeout", "60"],
                              cwd=ROOT, env=dict(os.environ, **{MARK: mark}), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_S
        while sum(HELPER in line for line in _marked(mark).values()) < 2:
            assert grader.poll() is None, f"the grader ended (status {grader.returncode}) before both helpers ran"
            assert time.monotonic() < deadline, f"the helpers never both ran: {_marked(mark)}"
            time.sleep(0.05)
        grader.send_signal(signal.SIGKILL)
        assert grader.wait() == -signal.SIGKILL
        end = time.monotonic() + WAIT_S
        while (left := _marked(mark)) and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        if grader.poll() is None:
            grader.kill()
            grader.wait()
        left = _marked(mark)
        for pid in left:  # leave nothing for the next test
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
    assert not left, f"{len(left)} process(es) alive {WAIT_S:g} s after the grader was killed: {list(left.values())}"
