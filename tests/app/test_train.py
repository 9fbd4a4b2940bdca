"""zerokit.train and zerokit compare: parity with the reference, exact ledgers, bad input."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import zerokit
from zerokit import theory
from zerokit.cli import compare

ROOT = Path(__file__).resolve().parents[2]


def odd_mlp():
    return zerokit.mlp((13, 37, 29, 7), batch_size=12, seed=3)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_torch_ddp_matches_reference_and_holds_16_psi(n, precision):
    work = odd_mlp()
    psi = work.param_count()
    report = compare(work, n, ["single", "torch-ddp"], steps=6, precision=precision)
    single, ddp = report["single"], report["torch-ddp"]
    if precision == "fp32":
        assert ddp.param_diff["max_abs"] <= 1e-6
        assert ddp.losses == pytest.approx(single.losses, abs=1e-6)
    else:
        assert ddp.param_diff["max_rel"] <= 1e-2
    expected = theory.model_state_bytes(0, psi, n, precision, "adamw", optimizer_tensors=6)
    for rank in ddp.ranks:
        assert sum(rank.model_state_bytes.values()) == expected.total == 16 * psi + 4 * 6
        assert rank.model_state_bytes == {"params": expected.params, "grads": expected.grads,
                                          "optimizer": expected.optimizer}
        b = theory.param_bytes_per_element(precision)
        assert rank.comm_ring_cost_bytes_per_step == theory.comm_bytes_per_step(0, psi, n, b)
        assert rank.peak_bytes >= expected.total
    assert single.ranks[0].comm_ring_cost_bytes_per_step == 0


def test_accumulation_reduces_once_per_step():
    work = odd_mlp()
    report = zerokit.train(work, "torch-ddp", world_size=2, steps=3, micro_batches=3)
    rank0 = report.result.ranks[0]
    assert rank0.comm_ring_cost_bytes_per_step == theory.comm_bytes_per_step(0, work.param_count(), 2, 4, 3)
    assert report.result.param_diff["max_abs"] <= 1e-6


def test_bad_input_is_refused_before_any_process_starts():
    work = odd_mlp()
    with pytest.raises(ValueError, match="strategy='nope' is unknown; allowed: .*torch-ddp"):
        zerokit.train(work, "nope")
    with pytest.raises(ValueError, match="precision='fp16'"):
        zerokit.train(work, "torch-ddp", precision="fp16")
    with pytest.raises(ValueError, match="optimizer='lamb'"):
        zerokit.train(work, "torch-ddp", optimizer="lamb")
    with pytest.raises(ValueError, match="no option 'bucket_size'; allowed: bucket_mb"):
        zerokit.train(work, "torch-ddp", bucket_size=3)
    with pytest.raises(ValueError, match="global batch of 12 is not divisible .* \\(5\\)"):
        zerokit.train(work, "torch-ddp", world_size=5)
    with pytest.raises(ValueError, match="world_size=0"):
        zerokit.train(work, "torch-ddp", world_size=0)
    with pytest.raises(ValueError, match="bucket_mb=-1"):
        zerokit.train(work, "torch-ddp", bucket_mb=-1)
    with pytest.raises(TypeError, match="zerokit.Workload"):
        zerokit.train(object(), "torch-ddp")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "zerokit.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("n", [2, 3])
def test_compare_cli_json(n):
    out = _cli("compare", "--model", "tests/data/odd_workload.py:workload", "--world-size", str(n),
               "--strategies", "single,torch-ddp", "--steps", "4", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    psi = data["param_count"]
    assert data["world_size"] == n and data["precision"] == "fp32"
    by_name = {s["strategy"]: s for s in data["strategies"]}
    ddp = by_name["torch-ddp"]
    assert len(ddp["per_rank"]) == n
    for rank in ddp["per_rank"]:
        assert sum(rank["model_state_bytes"].values()) == ddp["theory"]["model_state_bytes_per_rank"]["total"]
        assert rank["comm_ring_cost_bytes_per_step"] == ddp["theory"]["comm_ring_bytes_per_step"]
        assert {"rank", "model_state_bytes", "peak_bytes", "comm_ring_cost_bytes_per_step", "comm_payload_bytes_per_step", "comm_sent_bytes_per_step", "coords", "comm_bytes_by_axis"} <= set(rank)
    assert ddp["theory"]["model_state_bytes_per_rank"]["total"] == 16 * psi + 4 * 6
    assert ddp["losses"] == pytest.approx(by_name["single"]["losses"], abs=1e-6)
    assert ddp["max_abs_param_diff_vs_reference"] <= 1e-6
    assert ddp["step_time_s_median"] > 0


def test_compare_cli_refuses_unknown_strategy():
    out = _cli("compare", "--model", "tests/data/odd_workload.py:workload", "--world-size", "2",
               "--strategies", "single,ddp-magic", "--json")
    assert out.returncode == 2
    assert "strategy='ddp-magic' is unknown" in out.stderr
