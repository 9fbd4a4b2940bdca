"""torchrun as PID 1, as in a container started without an init (``docker run`` without ``--init``, a Kubernetes
PyTorchJob): its workers' parent is PID 1, and they are not orphans. ``unshare -p -f --mount-proc`` starts torchrun
as PID 1 of a new process namespace::

    unshare -p -f --mount-proc python -m torch.distributed.run --standalone --nproc-per-node 2 job.py

(``--standalone``: the agent binds a free port itself, so that other tests' jobs cannot take it). Skipped, with
the reason, where the kernel does not let this user make a process namespace.
"""
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zerokit.runtime.torchrun import TORCHRUN_VARIABLES

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: a new process namespace: as root, or as a user mapped to root in a new user namespace (``-r``)
UNSHARE = (["unshare", "-p", "-f", "--mount-proc"], ["unshare", "-r", "-p", "-f", "--mount-proc"])

JOB = textwrap.dedent("""
    import os
    import zerokit

    report = zerokit.train(zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2), "ddp",
                           world_size=2, steps=2, track_peak=False)
    print(f"RANK {os.environ['RANK']} PARENT {os.getppid()} LOSSES {len(report.result.losses)}", flush=True)
""")


def _unshare() -> list:
    """The first of :data:`UNSHARE` this machine permits, or a skip naming why none is."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    refusals = []
    for command in UNSHARE:
        done = subprocess.run([*command, "true"], capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            return command
        refusals.append(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")
    pytest.skip("no process namespace may be made here: " + "; ".join(refusals))


def test_workers_of_a_torchrun_that_is_pid_1_run(tmp_path):
    unshare = _unshare()
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES + ("MASTER_ADDR", "MASTER_PORT")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])})
    done = subprocess.run([*unshare, sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(job)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    for rank in range(2):  # the workers' parent, their agent, is PID 1 of the namespace: the case under test
        assert f"RANK {rank} PARENT 1 LOSSES 2" in done.stdout, (done.stdout, done.stderr[-4000:])
