"""``benchmarks/gpu_check.py --dry``: the GPU check's code path on the CPU, so CI keeps it runnable."""
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"


def test_gpu_check_dry_runs_every_check_on_the_cpu():
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = done.stdout.split("gpu_check on CPU (--dry)")[1]
    for check in ("strategies at world size 1", "ledger vs torch", "offload copies", "activation checkpointing",
                  "own-loop wrappers"):
        assert check in table
    assert " FAIL " not in table
