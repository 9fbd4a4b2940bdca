"""``benchmarks/gpu_check.py --dry``: every check of the GPU session's script, on the CPU, so CI keeps it runnable.

One run (about 35 s on 2 cores, 2026-12-03): every check's row in the table printed last, none FAIL, the JSON
file holding every check, and the multi-rank checks (2 and 8 gloo ranks, torchrun) run, not skipped."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

#: in make test's second pass, alone: its 8-rank and torchrun checks would otherwise compete with the first pass
pytestmark = pytest.mark.serial

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    out = tmp_path_factory.mktemp("gpu_check") / "rows.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--json", str(out)], capture_output=True,
                          text=True, timeout=300)
    return gpu_check, done, out


def test_dry_runs_every_check_on_the_cpu_and_none_fails(dry):
    gpu_check, done, _ = dry
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    table = done.stdout.split("gpu_check on CPU (--dry)")[1]
    rows = {line.split("  ")[0].strip(): line for line in table.splitlines()[1:] if line.strip()}
    for name, _ in gpu_check.CHECKS:
        assert name in rows, (name, table)
        assert rows[name][len(name):].split()[0] in ("ok", "n/a", "skip"), rows[name]


def test_the_json_holds_every_check_and_the_multi_rank_ones_ran(dry):
    gpu_check, done, out = dry
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["dry"] is True
    checks = {row["name"]: row for row in report["checks"]}
    assert list(checks) == [name for name, _ in gpu_check.CHECKS]
    assert all(row["status"] != "FAIL" and row["detail"] for row in checks.values()), checks
    for name in gpu_check.MULTI_RANK:  # on gloo ranks with --dry: ran, not skipped
        assert checks[name]["status"] == "ok", checks[name]
    for name in gpu_check.MULTI_RANK[:-2]:  # the zerokit.train rows: their measured numbers as fields
        row = checks[name]
        assert row["blocked_s"] > 0 and row["max_abs_param_diff"] <= row["tolerance"], row
    assert checks["memory ledger vs allocator"]["status"] == "n/a"  # no CUDA allocator on the CPU
    assert checks["memory ledger vs allocator"]["peak_bytes"] > 0
    for precision in ("fp32", "bf16-mixed"):
        assert checks[f"ws=1 {precision}"]["status"] == "ok" and checks[f"ws=1 {precision}"]["strategies"]
