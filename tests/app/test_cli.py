"""The ``zerokit`` command, in process: ``--option``, ``--parallel``, ``--strategies`` and clean errors."""
import json

import pytest

from zerokit import cli

ODD = ["--model", "tests/data/odd_workload.py:workload", "--world-size", "2", "--steps", "1"]
FAILING = ["--model", "tests/data/failing_workload.py:workload", "--world-size", "2", "--steps", "1"]


def compare(capsys, *args):
    code = cli.main(["compare", *args])
    out, err = capsys.readouterr()
    return code, out, err


# --- parsing, no process started -----------------------------------------------------------------

@pytest.mark.parametrize("text,value", [
    ("4", 4), ("0.5", 0.5), ("false", False), ("true", True), ("null", None), ("True", True), ("False", False),
    ("ring", "ring"), ("1f1b", "1f1b"), ('"ring"', "ring"), ("block", "block"), ("", ""),
])
def test_option_values_are_json_else_the_bare_string(text, value):
    assert cli._option_value(text) == value
    assert type(cli._option_value(text)) is type(value)


def test_parallel_is_parsed_into_degrees():
    assert cli.parse_parallel_arg("dp=2,tp=1,pp=1", 2) == {"dp": 2, "tp": 1, "pp": 1}
    assert cli.parse_parallel_arg(" dp = 2 ", 2) == {"dp": 2}
    for text in ("dp", "dp=two", "dp=2,", "=2", "dp=2;tp=1"):
        with pytest.raises(cli.UsageError, match=r"--parallel .*expected AXIS=N"):
            cli.parse_parallel_arg(text, 2)
    with pytest.raises(cli.UsageError, match="dp is given twice"):
        cli.parse_parallel_arg("dp=1,dp=2", 2)
    with pytest.raises(cli.UsageError, match="unknown axis 'xp'"):
        cli.parse_parallel_arg("dp=2,xp=1", 2)
    assert cli.parse_parallel_arg("dp=2,ep=2", 2) == {"dp": 2, "ep": 2}  # ep is carved from dp
    with pytest.raises(cli.UsageError, match="the world size is 2"):
        cli.parse_parallel_arg("dp=4", 2)


def test_unknown_option_is_refused_with_its_name_and_the_options_there_are(capsys):
    code, out, err = compare(capsys, *ODD, "--strategies", "single,ddp", "--option", "nonsense=1")
    assert code == 2
    assert err.startswith("zerokit: error: --option nonsense:")
    assert "'nonsense'" in err and "ddp: algorithm, bucket_mb" in err
    assert "Traceback" not in err


def test_a_value_of_the_wrong_type_names_the_option_and_what_is_allowed(capsys):
    code, out, err = compare(capsys, *ODD, "--strategies", "ddp,zero3", "--option", "prefetch=maybe")
    assert code == 2
    assert "prefetch='maybe' is not allowed" in err and "True" in err and "False" in err
    assert "Expecting value" not in err and "Traceback" not in err
    code, out, err = compare(capsys, *ODD, "--strategies", "ddp", "--option", "bucket_mb")
    assert code == 2 and "--option 'bucket_mb': expected KEY=VALUE" in err


def test_empty_or_unknown_strategies_are_clean_errors(capsys):
    for text in ("", " , "):
        code, out, err = compare(capsys, *ODD, "--strategies", text)
        assert code == 2
        assert "names no strategy" in err and "zero3" in err and "Traceback" not in err
    code, out, err = compare(capsys, *ODD, "--strategies", "ddp,nope")
    assert code == 2 and "'nope' is unknown; allowed:" in err and "zero1" in err
    with pytest.raises(SystemExit) as exit_:  # no value at all: argparse's own error
        cli.main(["compare", *ODD, "--strategies"])
    assert exit_.value.code == 2
    assert "--strategies: expected one argument" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no strategies to compare"):
        cli.compare(None, 2, [])


def test_tensor_parallelism_is_refused_where_it_cannot_run(capsys):
    code, out, err = compare(capsys, *ODD, "--strategies", "single,ddp", "--parallel", "dp=1,tp=2")
    assert code == 2
    assert "has no tensor-parallel plan" in err  # the odd MLP workload brings none
    code, out, err = compare(capsys, *ODD, "--strategies", "single,torch-ddp", "--parallel", "dp=1,tp=2")
    assert code == 2
    assert "tensor parallelism" in err and "does not implement yet" in err
    code, out, err = compare(capsys, *ODD, "--strategies", "single,zero2", "--parallel", "dp=1,pp=2")
    assert code == 2 and "incompatible with pipeline parallelism" in err
    code, out, err = compare(capsys, *ODD, "--strategies", "ddp", "--parallel", "dp:2")
    assert code == 2 and "--parallel 'dp:2'" in err and "e.g. dp=2,tp=1,pp=1" in err


def test_model_takes_a_builtin_workload_by_name_and_lists_them_when_it_is_neither():
    assert cli.load_workload("tiny-gpt").name == "tiny-gpt-4x128"  # zerokit.tiny_gpt() with its defaults
    assert cli.load_workload("mlp").name == "mlp-32-64-64-10"
    with pytest.raises(cli.UsageError, match=r"--model 'tiny_gpt': expected a built-in workload \(tiny-gpt, mlp: "
                                             r"zerokit.tiny_gpt, zerokit.mlp with their defaults\) or FILE.py:FUNC"):
        cli.load_workload("tiny_gpt")


@pytest.mark.parametrize("command", [[], ["tour"], ["compare"], ["plan"], ["grade"], ["bench"]])
def test_help_is_plain_text(capsys, command):
    with pytest.raises(SystemExit) as exit_:
        cli.main([*command, "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith("usage: zerokit")
    assert "`" not in out  # no reStructuredText markup in a terminal
    if not command:
        assert "tour (every parallelism on a tiny GPT), compare" in " ".join(out.split())


# --- runs (world size 2, one step) ---------------------------------------------------------------

def test_options_and_parallel_reach_the_strategies(capsys):
    """A bare string and a JSON value, each to the strategies that have it; every rank on dp."""
    code, out, err = compare(capsys, *ODD, "--strategies", "single,ddp-naive,ddp", "--parallel", "dp=2,tp=1,pp=1",
                             "--option", "algorithm=ring", "--option", "overlap=false", "--json")
    assert code == 0, err
    report = {s["strategy"]: s for s in json.loads(out)["strategies"]}
    assert report["single"]["options"] == {}
    assert report["single"]["parallel"] == {"pp": 1, "dp": 1, "tp": 1}
    assert report["ddp-naive"]["options"] == {"algorithm": "ring"}
    assert report["ddp"]["options"] == {"algorithm": "ring", "overlap": False}
    for name in ("ddp-naive", "ddp"):
        strategy = report[name]
        assert strategy["parallel"] == {"pp": 1, "dp": 2, "tp": 1}
        assert strategy["max_abs_param_diff_vs_reference"] <= 1e-6
        for rank in strategy["per_rank"]:
            assert rank["coords"] == {"pp": 0, "dp": rank["rank"], "tp": 0}
            # the ring is zerokit's own: what it sends is measured (torch's all-reduce leaves it None)
            assert rank["comm_sent_bytes_per_step"] > 0
            assert set(rank["comm_bytes_by_axis"]) == {"dp"}


def test_compare_runs_a_builtin_workload(capsys):
    code, out, err = compare(capsys, "--model", "mlp", "--world-size", "2", "--steps", "1", "--strategies",
                             "single,ddp", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["param_count"] == (32 * 64 + 64) + (64 * 64 + 64) + (64 * 10 + 10)  # zerokit.mlp()'s defaults
    ddp = {s["strategy"]: s for s in report["strategies"]}["ddp"]
    assert ddp["max_abs_param_diff_vs_reference"] <= 1e-6


def test_a_failing_rank_is_one_clean_message(capsys):
    code, out, err = compare(capsys, *FAILING, "--strategies", "single,ddp")
    assert code == 1
    assert err.startswith("zerokit compare: ddp on 2 ranks: rank 1 failed")
    assert "RuntimeError: the loss refuses to run on rank 1" in err.splitlines()[0]
    assert err.count("Traceback (most recent call last)") == 1  # the rank's own, not the CLI's
    assert "failing_workload.py" in err and "cli.py" not in err


def test_bench_needs_a_suite_or_quick(capsys):
    assert cli.main(["bench"]) == 2
    assert "name a suite (ddp, zero, offload, pipeline, scaling, sizes" in capsys.readouterr().err
    assert cli.main(["bench", "--quick", "ddp"]) == 2
    assert "give no suite with it" in capsys.readouterr().err
    assert cli.main(["bench", "tp"]) == 2
    assert "allowed: ddp, zero, offload, pipeline, scaling, sizes" in capsys.readouterr().err

