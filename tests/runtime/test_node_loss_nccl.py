"""NodeLost is gloo's: on NCCL torch's watchdog tears a rank down when a collective fails or times out
(TORCH_NCCL_ASYNC_ERROR_HANDLING, which torchrun sets to 1), before Python sees an error, so the lost node is never
named there. zerokit says so (zerokit/runtime/node_loss.py ``NCCL_NOTE``) where an NCCL job can read it: on rank 0's
stderr when the ranks join, and under a communication error that did reach Python with no rank found lost."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zerokit.runtime.node_loss import NCCL_NOTE, add_nccl_note, nccl_note, say_nccl_note
from zerokit.runtime.torchrun import TORCHRUN_VARIABLES

ROOT = Path(__file__).resolve().parents[2]


def test_the_note_says_nccl_is_not_named_and_why():
    assert nccl_note("nccl") == NCCL_NOTE and nccl_note("cpu:gloo,cuda:nccl") == NCCL_NOTE
    assert nccl_note("gloo") is None and nccl_note(None) is None
    for words in ("NodeLost", "gloo only", "watchdog", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1"):
        assert words in NCCL_NOTE


def test_rank_0_of_an_nccl_job_says_it_at_joining(capsys):
    say_nccl_note("nccl", 0)
    assert capsys.readouterr().err == f"zerokit: {NCCL_NOTE}\n"
    say_nccl_note("nccl", 1)
    say_nccl_note("gloo", 0)
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not hasattr(BaseException, "add_note"), reason="exception notes are Python 3.11's")
def test_a_communication_error_on_nccl_carries_the_note():
    error = RuntimeError("NCCL communicator was aborted on rank 0")
    add_nccl_note(error, "nccl")
    assert error.__notes__ == [NCCL_NOTE]
    for exc, backend in ((RuntimeError("Connection closed by peer"), "gloo"), (ValueError("a bad batch"), "nccl")):
        add_nccl_note(exc, backend)  # gloo names the node; a rank's own error is not about a lost peer
        assert not getattr(exc, "__notes__", None)


JOB = textwrap.dedent("""
    import torch.distributed as dist
    from zerokit.runtime import torchrun

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    torchrun.rank_device = lambda backend=None: ("nccl", __import__("torch").device("cpu"))  # as an NCCL job's rank

    def collective_fails(ctx):
        raise RuntimeError("NCCL error: remote process exited or there was a network error")

    try:
        torchrun.launch_under_torchrun(collective_fails, 1, (), {}, None, 30)
    except RuntimeError as exc:
        print("NOTES", getattr(exc, "__notes__", []), flush=True)
    dist.destroy_process_group()
""")


@pytest.mark.skipif(not hasattr(BaseException, "add_note"), reason="exception notes are Python 3.11's")
def test_a_launch_under_torchrun_on_nccl_adds_the_note_to_the_error(tmp_path):
    """The torchrun path's error branch, on a rank whose group is NCCL's (told so: no GPU here) and which knows no
    other rank, so none is found lost."""
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    env.update({"RANK": "0", "WORLD_SIZE": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])})
    done = subprocess.run([sys.executable, str(job)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"NOTES {[NCCL_NOTE]!r}" in done.stdout, (done.stdout, done.stderr[-3000:])
