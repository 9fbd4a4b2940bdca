"""DeepSpeed-style configs: every key mapped or refused with a reason; ``zerokit compare --deepspeed-config``."""
import json

import pytest

from zerokit import cli
from zerokit.zero.config import from_deepspeed, to_deepspeed

ODD_WORKLOAD = "tests/data/odd_workload.py"


def test_keys_map_to_zerokit_options_in_elements():
    options = from_deepspeed({"zero_optimization": {
        "stage": 2, "reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8, "overlap_comm": False,
        "contiguous_gradients": True, "reduce_scatter": True, "allgather_partitions": True,
        "offload_optimizer": {"device": "none"}}, "gradient_clipping": 0})
    assert options == {"stage": 2, "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 200_000_000,
                       "overlap_comm": False, "contiguous_gradients": True, "reduce_scatter": True}
    assert isinstance(options["reduce_bucket_size"], int)
    stage3 = from_deepspeed({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 1000,
                                                   "stage3_param_persistence_threshold": 0, "reduce_scatter": True}})
    assert stage3 == {"stage": 3, "prefetch": True, "prefetch_bucket_size": 1000, "param_persistence_threshold": 0}
    assert from_deepspeed({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0}}) == \
        {"stage": 3, "prefetch": False}
    # and back, for the DeepSpeed peers
    assert to_deepspeed(3, {"prefetch": False, "reduce_bucket_size": 10, "allgather_bucket_size": 5}) == \
        {"stage": 3, "stage3_prefetch_bucket_size": 0, "reduce_bucket_size": 10}


@pytest.mark.parametrize("config,message", [
    ({"zero_optimization": {"stage": 4}}, "stage=4 is not a ZeRO stage"),
    ({"zero_optimization": {"stage": 1, "bucket_size": 10}}, "zero_optimization.bucket_size is unknown"),
    ({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}, "offload_param contradicts stage 2"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}, "offloads to the CPU only"),
    ({"zero_optimization": {"stage": 1, "stage3_prefetch_bucket_size": 10}}, "contradicts stage 1"),
    ({"zero_optimization": {"stage": 3, "reduce_scatter": False}}, "contradicts stage 3"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_size": 0}}, "must be a positive whole number"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_size": -1}}, "must be a positive whole number"),
    ({"zero_optimization": {"stage": 2, "overlap_comm": "yes"}}, "must be true or false"),
    ({"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e9}}, "not implemented by zerokit"),
    ({"zero_optimization": {"stage": 2, "allgather_partitions": False}}, "allgather_partitions=false"),
    ({"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0}, "never clips"),
    ({"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}, "--precision bf16-mixed"),
    ({"zero_optimization": {"stage": 2}, "wall_clock": 1}, "'wall_clock' is unknown"),
    ({"optimizer": {}}, "set this with --optimizer"),
    ({}, "'zero_optimization' must be an object"),
])
def test_bad_configs_are_refused_clearly(config, message):
    with pytest.raises(ValueError, match=message):
        from_deepspeed(config)


def test_a_config_file(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1, "reduce_bucket_size": 300}}))
    assert from_deepspeed(str(path)) == {"stage": 1, "reduce_bucket_size": 300}
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        from_deepspeed(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="no such file"):
        from_deepspeed(tmp_path / "missing.json")


def test_compare_runs_with_a_deepspeed_config(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_size": 300, "overlap_comm": True}}))
    code = cli.main(["compare", "--model", f"{ODD_WORKLOAD}:workload", "--world-size", "2", "--strategies",
                     "zero2,zero2-naive", "--steps", "2", "--deepspeed-config", str(path), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    zero2 = next(s for s in report["strategies"] if s["strategy"] == "zero2")
    assert zero2["options"] == {"stage": 2, "reduce_bucket_size": 300, "overlap_comm": True}
    assert zero2["max_abs_param_diff_vs_reference"] <= 1e-6
    # a config for another stage is refused by the strategy, before any process starts
    code = cli.main(["compare", "--model", f"{ODD_WORKLOAD}:workload", "--world-size", "2", "--strategies",
                     "zero3", "--steps", "2", "--deepspeed-config", str(path)])
    assert code == 2
    assert "this strategy is ZeRO stage 3" in capsys.readouterr().err


def test_allgather_bucket_size_at_stage_3_is_ignored_with_a_warning_as_deepspeed_does():
    with pytest.warns(UserWarning, match="ignores it"):
        options = from_deepspeed({"zero_optimization": {"stage": 3, "allgather_bucket_size": 5e8}})
    assert "allgather_bucket_size" not in options


def test_offload_keys_map_to_zerokit_offload():
    assert from_deepspeed({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})["offload"] \
        == "optimizer"
    assert from_deepspeed({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                                 "offload_param": {"device": "cpu", "pin_memory": True}}})["offload"] \
        == "params"
    assert "offload" not in from_deepspeed({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "none"}}})
