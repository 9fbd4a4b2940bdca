"""``benchmarks/gpu_check.py --dry``: every row of the GPU session's script, on the CPU, so CI keeps it runnable.

One plain run (about 40 s on 2 cores, 2026-12-04; the ZeRO++ qwZ / qgZ rows and the peers' offload and hpZ rows
added about 15 s, 2026-12-06): every row's line in the table printed last, none FAIL, exit
code 0, the JSON file holding every row, and the multi-rank rows (2, 4 and 8 gloo ranks, torchrun) run, not
skipped — but for a peer whose package is missing, which says so. One run under ``torchrun --nproc-per-node 2`` of
a few rows (about 10 s): the 2-rank rows run in torchrun's processes, the own loop too (no torchrun inside
torchrun), the others skip, and rank 0 alone writes the JSON. One under ``torchrun --nproc-per-node 3``: the rows
of groups of 2 are n/a, saying why, as qgZ is on one node. And, without any run, the memory row's verdict and
margin, the exit codes, and which exceptions are a refusal (n/a) and which a FAIL."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: in make test's first pass, beside the other worker: nothing here holds a wall-clock bound (each row's launch
#: has minutes of timeout), so sharing the two cores slows it and fails nothing

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCHMARKS / "gpu_check.py"
MiB = 2 ** 20


def _import():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import gpu_check
        import gpu_check_one
    finally:
        sys.path.remove(str(BENCHMARKS))
    return gpu_check, gpu_check_one


def _rows(out: Path) -> dict:
    return {row["name"]: row for row in json.loads(out.read_text())["checks"]}


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    gpu_check, _ = _import()
    out = tmp_path_factory.mktemp("gpu_check") / "rows.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--json", str(out)], capture_output=True,
                          text=True, timeout=400)
    return gpu_check, done, out


def test_dry_runs_every_row_on_the_cpu_and_none_fails(dry):
    gpu_check, done, _ = dry
    assert done.returncode == gpu_check.PASS, done.stdout[-4000:] + done.stderr[-4000:]
    table = done.stdout.split("gpu_check on CPU (--dry) (a plain script)")[1]
    rows = {line.split("  ")[0].strip(): line for line in table.splitlines()[1:] if line.strip()}
    for name, _ in gpu_check.CHECKS:
        assert name in rows, (name, table)
        assert rows[name][len(name):].split()[0] in ("ok", "n/a", "skip"), rows[name]


def test_the_json_holds_every_row_and_the_multi_rank_ones_ran(dry):
    gpu_check, done, out = dry
    assert done.returncode == gpu_check.PASS, done.stdout[-4000:] + done.stderr[-4000:]
    assert json.loads(out.read_text())["dry"] is True
    checks = _rows(out)
    assert list(checks) == [name for name, _ in gpu_check.CHECKS]
    assert all(row["status"] != "FAIL" and row["detail"] for row in checks.values()), checks
    for name, _ in gpu_check.MULTI_RANK:  # on gloo ranks with --dry: ran, not skipped (a missing package aside)
        row = checks[name]
        if row["status"] == "skip":
            assert row["detail"].startswith("skipped: ") and "is not installed" in row["detail"], row
            continue
        assert row["status"] == "ok", row
        if "tolerance" in row:  # the zerokit.train rows: their measured numbers as fields
            assert row["max_abs_param_diff"] <= row["tolerance"] and row["blocked_s"] >= 0, row
    assert checks["dp on every rank of the node"]["world_size"] == 4
    assert checks["dp on every rank of the node"]["own_reference_max_abs"] <= checks[
        "dp on every rank of the node"]["tolerance"]
    for name in ("dp×cp 2×2 zero3", "Ulysses×tp 2×2", "ep zero1", "ep zero2", "ep zero3"):
        assert checks[name]["bytes_by_axis"], checks[name]
    assert checks["memory ledger vs allocator"]["status"] == "n/a"  # no CUDA allocator on the CPU
    assert checks["memory ledger vs allocator"]["peak_bytes"] > 0
    assert checks["memory ledger vs allocator"]["margin_bytes"] > 0
    for name, _ in gpu_check.ONE_RANK:
        assert checks[name]["status"] in ("ok", "n/a"), checks[name]
    for precision in ("fp32", "bf16-mixed"):
        assert checks[f"ws=1 {precision}"]["strategies"]
    own = checks["own loop, torchrun 1 rank, zerokit.measure"]
    assert all(v["measure_seconds"] > 0 and v["measure_peak_bytes"] > 0 for k, v in own.items()
               if isinstance(v, dict) and "measure_seconds" in v), own


#: the rows of paths no other row ran on NCCL: ZeRO++'s int8 / int4 codes, the peers' host offload, DeepSpeed's hpZ
QUANTIZED = ("ZeRO++ qwZ int8 weights", "ZeRO++ qgZ int4 gradients", "ZeRO++ qgZ int8 gradients")
PEERS_ON_THE_HOST = ("peer FSDP2 zero3 offload", "peer DeepSpeed zero2 offload", "peer DeepSpeed ZeRO++ hpZ 2 of 4")


def test_the_quantized_and_offloaded_paths_have_rows_and_they_run_dry(dry):
    gpu_check, done, out = dry
    assert done.returncode == gpu_check.PASS, done.stdout[-4000:] + done.stderr[-4000:]
    names = [name for name, _ in gpu_check.MULTI_RANK]
    assert all(name in names for name in QUANTIZED + PEERS_ON_THE_HOST), names
    checks = _rows(out)
    for name in QUANTIZED:  # 4 gloo ranks as 2 nodes of 2; the codes' bytes = theory on every rank
        row = checks[name]
        assert row["status"] == "ok" and (row["world_size"], row["nodes"]) == (4, 2), row
        assert row["max_abs_param_diff"] <= row["tolerance"], row
    assert set(checks["ZeRO++ qwZ int8 weights"]["bytes_by_axis"]) == {"dp"}
    for name in QUANTIZED[1:]:  # qgZ's two hops: inside a node, then across
        assert {"node", "inter_node"} <= set(checks[name]["bytes_by_axis"]), checks[name]
    int4, int8 = (checks[name]["bytes_by_axis"]["inter_node"] for name in QUANTIZED[1:])
    assert int4 < int8  # half the codes' bytes, the same scales
    for name in PEERS_ON_THE_HOST:
        row = checks[name]
        assert row["status"] == "ok" or (row["status"] == "skip" and "is not installed" in row["detail"]), row


def test_under_torchrun_the_rows_of_its_world_run_in_its_ranks(tmp_path):
    gpu_check, _ = _import()
    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT),
                           "--dry", "--only", "ws=1 fp32,zero2 overlap,own loop under,Ulysses×tp",
                           "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**env, "OMP_NUM_THREADS": "1"})
    assert done.returncode == gpu_check.PASS, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.count("gpu_check on CPU (--dry) (torchrun, 2 ranks)") == 1  # rank 0 alone reports
    checks = _rows(out)
    assert list(checks) == ["ws=1 fp32", "zero2 overlap_comm", "Ulysses×tp 2×2", "own loop under torchrun"]
    assert checks["zero2 overlap_comm"]["status"] == "ok" and checks["zero2 overlap_comm"]["world_size"] == 2
    assert checks["own loop under torchrun"]["status"] == "ok"
    assert checks["own loop under torchrun"]["detail"].startswith("in torchrun's 2 ranks")  # no torchrun inside
    for name in ("ws=1 fp32", "Ulysses×tp 2×2"):
        assert checks[name]["status"] == "skip" and "this torchrun started 2" in checks[name]["detail"]


def test_under_torchrun_of_3_the_rows_of_groups_of_2_are_n_a_not_failures(tmp_path):
    """hsdp, hpZ (zerokit's and DeepSpeed's) and FSDP2-HSDP with groups of 2 on torchrun's 3 ranks: n/a, saying
    why, and the run exits 0; qgZ on torchrun's one node is n/a too (it runs only across nodes), qwZ runs."""
    gpu_check, _ = _import()
    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                           str(SCRIPT), "--dry", "--only", "hsdp 2×2,hpZ 2 of 4,peer FSDP2 HSDP,ZeRO++ q",
                           "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**env, "OMP_NUM_THREADS": "1"})
    assert done.returncode == gpu_check.PASS, done.stdout[-4000:] + done.stderr[-4000:]
    checks = _rows(out)
    grouped = ["hsdp 2×2", "ZeRO++ hpZ 2 of 4", "peer FSDP2 HSDP 2×2", "peer DeepSpeed ZeRO++ hpZ 2 of 4"]
    quantized = ["ZeRO++ qwZ int8 weights", "ZeRO++ qgZ int4 gradients", "ZeRO++ qgZ int8 gradients"]
    assert sorted(checks) == sorted(grouped + quantized)
    for name in grouped:
        if checks[name]["status"] == "skip":  # DeepSpeed not installed
            assert "is not installed" in checks[name]["detail"], checks[name]
            continue
        assert checks[name]["status"] == "n/a", checks[name]
        assert checks[name]["detail"].startswith("groups of 2 ranks do not divide this run's 3"), checks[name]
    assert checks["ZeRO++ qwZ int8 weights"]["status"] == "ok" and checks["ZeRO++ qwZ int8 weights"]["world_size"] == 3
    for name in quantized[1:]:
        assert checks[name]["status"] == "n/a" and "ranks are one node" in checks[name]["detail"], checks[name]


#: the torch ring-attention peer's refusal on a GPU, as its rank's traceback ends (zerokit/peers/torch_cp.py)
ON_CUDA = ("strategy 'torch-ring' runs torch's ring with the CPU flash kernel; on a GPU use torch's public "
           "context_parallel, which dispatches to the CUDA kernels")


def _failed_rank(*exceptions):
    """A RankFailed whose rank's traceback chains ``exceptions`` (the last the one the rank died of)."""
    import zerokit

    frames = '  File "zerokit/train.py", line 1, in run_rank\n    raise\n'
    parts = [f"Traceback (most recent call last):\n{frames}{e}\n" for e in exceptions]
    text = "\nThe above exception was the direct cause of the following exception:\n\n".join(parts)
    return zerokit.RankFailed(1, text, exitcode=1, where="rank 0 is finished")


DIVIDE = "shard_group_size=2 does not divide the 3 data-parallel ranks"


@pytest.mark.parametrize("raised, status, reason", [
    (_failed_rank(f"ValueError: {ON_CUDA}"), "n/a", ON_CUDA),               # a rank refused: n/a, with why
    (ValueError(DIVIDE), "n/a", DIVIDE),                                    # refused here (make_job, torchrun)
    (_failed_rank("ValueError: bad", "RuntimeError: NCCL error"), "FAIL", None),  # died of the RuntimeError
    (_failed_rank("RuntimeError: NCCL error"), "FAIL", None),
    (AssertionError("torch-ring: |Δparam| 1e-1 > 1e-5 against the reference"), "FAIL", None),
])
def test_a_refusal_with_its_reason_is_n_a_and_anything_else_fails(monkeypatch, raised, status, reason):
    gpu_check, _ = _import()
    import gpu_check_common as c

    def train(*args, **kwargs):
        raise raised

    monkeypatch.setattr(c, "train", train)
    name, fn = next((n, f) for n, f in gpu_check.MULTI_RANK if n == "peer torch ring attention")
    row = gpu_check.run(name, fn, lambda text: None)
    assert row["status"] == status, row
    if status == "n/a":
        assert row["detail"] == f"refused on 2 ranks: {reason}" and row["refused"] == reason, row
        ok = {"name": "zero1", "status": "ok"}
        assert gpu_check.verdict([ok, row], dry=False) == gpu_check.PASS  # n/a is no failure: exit 0 on GPUs


def test_a_real_rank_refusal_reads_as_its_reason():
    """A strategy's ValueError in its ranks, through zerokit.train's RankFailed: the reason, word for word."""
    import zerokit

    _import()
    import gpu_check_common as c

    with pytest.raises(zerokit.RankFailed) as failed:
        zerokit.train(zerokit.tiny_gpt(**c.SIZES["gpt"][0]), "torch-ring", world_size=2, steps=1,
                      precision="bf16-mixed", reference=False, parallel={"cp": 2}, cp_attention="ring",
                      backend="gloo", timeout_s=240)
    assert c.refusal(failed.value) == "strategy 'torch-ring' runs in fp32 only (the CPU flash kernel's fp32 path)"


def test_the_memory_row_fails_beyond_its_margin_and_only_there():
    _, one = _import()
    margin = 100 * MiB
    assert one.memory_verdict(1000 * MiB, None, None, margin) is None  # no CUDA: nothing to compare
    assert one.memory_verdict(1000 * MiB, 1100 * MiB, 1050 * MiB, margin) is None
    assert "misses memory" in one.memory_verdict(1000 * MiB, 1100 * MiB + 1, 1050 * MiB, margin)
    assert "counts bytes twice" in one.memory_verdict(1000 * MiB, 1050 * MiB, 999 * MiB, margin)


def test_the_memory_margin_is_the_sum_of_its_stated_parts():
    _, one = _import()
    s = dict(vocab=32000, seq_len=512, d_model=1024, n_layer=8, n_head=16, batch_size=8)
    parts = one.memory_margin(s, "bf16-mixed", psi=166_800_000, param_tensors=100, hopper=True)
    btv = 8 * 512 * 32000
    assert parts["the loss's backward (logits + 2 fp32 gradients)"] == btv * (2 + 8)  # larger than the step's 4·Ψ
    assert parts["cuBLAS workspace"] == 4096 * 1024 * 8 + 16 * 1024 * 8
    assert parts["one op's backward"] == 2 * 2 * 8 * 16 * 512 ** 2
    assert parts["rounding (512 B × 1056 tensors)"] == 512 * (8 * 100 + 32 * 8)
    # a ledger that missed the bf16 gradients (2·Ψ) of the H200's measured gap (1,315 MiB) would fail
    assert 1315 * MiB <= sum(parts.values()) < 1315 * MiB + 2 * 166_800_000


def test_exit_codes():
    gpu_check, _ = _import()
    ok = {"name": "zero1", "status": "ok"}
    one = {"name": "ws=1 fp32", "status": "ok"}
    skipped = {"name": "zero1", "status": "skip"}
    assert gpu_check.verdict([one, ok], dry=False) == gpu_check.PASS == 0
    assert gpu_check.verdict([one, skipped], dry=False) == gpu_check.NO_NCCL == 3  # one GPU: not a pass
    assert gpu_check.verdict([one, skipped], dry=True) == gpu_check.PASS
    assert gpu_check.verdict([{"name": "zero1", "status": "FAIL"}, ok], dry=False) == gpu_check.FAILED == 1
    assert gpu_check.main(["--dry", "--only", "no such row", "--json", os.devnull]) == gpu_check.CANNOT_RUN == 2
