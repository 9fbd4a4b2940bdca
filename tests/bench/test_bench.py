"""``zerokit bench``: the shared table and noise helpers, the peak readings the ratios rest on, and the new
suites run end to end with tiny arguments (a few runs each)."""
import os

import pytest

from zerokit import bench
from zerokit.bench import rounds, table
from zerokit.workloads import tiny_gpt

TINY = dict(vocab=64, seq_len=8, d_model=32, n_layer=2, n_head=2, batch_size=4)


# --- no process started ------------------------------------------------------------------------------------

def test_table_aligns_columns_and_prints_none_as_a_dash():
    rows = [{"name": "ddp", "s": 0.0123, "x": None}, {"name": "torch-ddp", "s": 0.1, "x": 1.25}]
    text = table.table("title", [("strategy", "name", "s"), ("step ms", "s", table.ms), ("ratio", "x", ".2f")], rows)
    lines = text.splitlines()
    assert lines[0] == "title"
    assert lines[1] == "strategy   step ms  ratio"
    assert lines[2] == "ddp           12.3      —"
    assert lines[3] == "torch-ddp    100.0   1.25"


def test_noise_is_iqr_over_median():
    assert table.noise([1.0]) is None
    assert table.noise([1.0, 1.0, 1.0, 1.0, 1.0]) == 0.0
    assert table.noise([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((4.0 - 2.0) / 3.0)


def test_conditions_name_the_load_and_the_noisiest_configuration():
    text = table.conditions([{"noise": 0.1, "label": "a"}, {"noise": 0.3, "label": "b"}, {"noise": None}],
                            "load average 1.00 1.00 1.00", lambda r: r["label"])
    assert text.startswith("conditions: load average 1.00 1.00 1.00 at the start, load average ")
    assert "median 0.20, worst 0.30 (b)" in text
    assert "not measurable" in table.conditions([{"noise": None}], "x", str)


def test_paired_and_peak_ratios():
    ours = {"runs": [{"step_s": 2.0}, {"step_s": 3.0}, {"step_s": 1.0}], "peak": 90}
    peer = {"runs": [{"step_s": 4.0}, {"step_s": 3.0}, {"step_s": 4.0}], "peak": 100}
    assert rounds.paired_ratio(ours, [peer]) == 0.5  # median of 0.5, 1.0, 0.25
    assert rounds.paired_ratio(ours, []) is None
    assert rounds.peak_ratio(ours, peer) == 0.9
    assert rounds.peak_ratio(ours, {"peak": None}) is None


def test_every_suite_has_quick_arguments():
    assert set(bench.QUICK) == set(bench.SUITES)
    with pytest.raises(ValueError, match="unknown; allowed: ddp, zero"):
        bench.main("tp", [])


def test_sizes_refuses_an_unknown_strategy():
    with pytest.raises(ValueError, match="--strategies nope: unknown; allowed:"):
        bench.main("sizes", ["--strategies", "nope"])


# --- peaks: torch DDP's buckets are counted (equal to ddp's), FSDP2's shards are counted while gathered ------------

def test_ddp_and_torch_ddp_peak_the_same_bytes():
    work = tiny_gpt(**TINY)
    ours = rounds.measure_peak(rounds.Entry(work, 2, "ddp", "ddp", {"bucket_mb": 1.0}), 60)
    peer = rounds.measure_peak(rounds.Entry(work, 2, "torch-ddp", "torch-ddp", {"bucket_mb": 1.0}), 60)
    assert peer["peak_breakdown"]["grads"] == 4 * work.param_count()  # the reducer's buckets, grads set to None or not
    assert ours["peak"] == peer["peak"]


def test_fsdp2_zero2_holds_the_shards_and_the_gathered_parameters():
    from zerokit.train import train

    work = tiny_gpt(**TINY)
    rank = train(work, "fsdp2-zero2", world_size=2, steps=2, reference=False).results[0].ranks[0]
    # between forward and backward every group is gathered (reshard_after_forward=False) and the shards stay
    assert rank.peak_by_category["params"] == 4 * work.param_count() + rank.model_state_bytes["params"]


# --- the new suites, end to end ------------------------------------------------------------------------------

def test_sizes_suite_prints_ratios_and_draws(tmp_path, capsys):
    out = tmp_path / "sizes.png"
    assert bench.main("sizes", ["--sizes", "0.5M", "--strategies", "ddp", "torch-ddp", "--steps", "3",
                                "--rounds", "1", "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "× peer" in text and "conditions: load average" in text and "IQR / median" in text
    line = next(l for l in text.splitlines() if l.startswith("0.5M") and " ddp " in l)
    assert float(line.split()[4]) > 0  # ddp / torch-ddp, a measured ratio
    assert os.path.getsize(out) > 10_000


@pytest.mark.serial  # the link's sleeps against step times in ms: run alone
def test_link_suite_slows_with_the_bandwidth(tmp_path, capsys):
    out = tmp_path / "link.png"
    assert bench.main("link", ["--bandwidths", "1e7", "--strategies", "ddp", "--steps", "3", "--rounds", "1",
                               "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    rows = {l.split()[1]: l.split() for l in text.splitlines() if l.startswith("ddp ")}
    # 2(N−1)/N·4Ψ ≈ 3.7 MB per step through 10 MB/s: about 0.37 s of link time, and it shows in the step
    assert 300 < float(rows["0.01"][5]) < 450
    assert float(rows["0.01"][3]) > float(rows["no"][3]) + 200  # step ms, with and without the link
    assert "conditions: load average" in text
    assert os.path.getsize(out) > 10_000
