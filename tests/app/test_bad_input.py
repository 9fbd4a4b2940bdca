"""Bad inputs over the public entry points (issue 16): each case gives a clear error that names the
argument and what is allowed, within seconds, with no process left behind.

Table-driven: every row is (id, a call that must fail, words its error must contain). A call
returns the error's text: the exception's message, a rank's last traceback line for calls made
inside ``zerokit.launch``, or stderr for the CLI (which must not show a Python traceback).
"""
import subprocess
import sys
import time

import pytest
import torch

import zerokit
from zerokit import RankFailed, cli


def _ok(ctx):
    return ctx.rank


def _model():
    return torch.nn.Linear(4, 4)


def error_of(call) -> str:
    """The text of the error ``call`` raises (a rank's own error for RankFailed)."""
    try:
        call()
    except RankFailed as e:
        lines = [line for line in e.traceback.strip().splitlines() if line.strip()]
        return lines[-1]
    except SystemExit as e:  # pragma: no cover - the CLI cases go through cli_error
        return f"SystemExit {e.code}"
    except Exception as e:  # noqa: BLE001 - any clear error is what is tested
        return f"{type(e).__name__}: {e}"
    raise AssertionError("no error was raised")


def in_rank(body):
    """Run ``body(ctx)`` inside a one-rank launch; its error is the rank's."""
    return lambda: zerokit.launch(body, 1, timeout_s=60)


def cli_error(capsys, argv) -> str:
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    err = capsys.readouterr().err
    assert code not in (0, None), f"{argv} succeeded"
    assert "Traceback" not in err, err
    return err


WORK = zerokit.mlp((4, 8, 2), batch_size=4)
SCHED = zerokit.schedule("1f1b", 2, 4)

CASES = [
    # zerokit.launch
    ("launch-fn", lambda: zerokit.launch("f", 2), ["fn must be callable"]),
    ("launch-world-zero", lambda: zerokit.launch(_ok, 0), ["world_size=0", "from 1 to"]),
    ("launch-world-float", lambda: zerokit.launch(_ok, 2.5), ["world_size=2.5", "integer"]),
    ("launch-world-huge", lambda: zerokit.launch(_ok, 10 ** 6), ["world_size=1000000", "allowed 1 to"]),
    ("launch-backend", lambda: zerokit.launch(_ok, 2, backend="mpi"), ["backend='mpi'", "'gloo'", "'nccl'"]),
    ("launch-nccl-no-gpu", lambda: zerokit.launch(_ok, 10 ** 3, backend="nccl"),
     ["backend='nccl'", "CUDA device per rank"]),
    ("launch-timeout-zero", lambda: zerokit.launch(_ok, 2, timeout_s=0), ["timeout_s=0", "positive"]),
    ("launch-timeout-str", lambda: zerokit.launch(_ok, 2, timeout_s="5"), ["timeout_s='5'", "positive"]),
    ("launch-threads", lambda: zerokit.launch(_ok, 2, threads_per_rank=0), ["threads_per_rank=0", ">= 1"]),
    ("launch-start-method", lambda: zerokit.launch(_ok, 2, start_method="forkserver"),
     ["start_method='forkserver'", "'fork'", "'spawn'"]),
    ("launch-heartbeat", lambda: zerokit.launch(_ok, 2, heartbeat_s=-1), ["heartbeat_s=-1", "positive"]),
    ("launch-check-collectives", lambda: zerokit.launch(_ok, 2, check_collectives="yes"),
     ["check_collectives='yes'", "True, False or None"]),
    # zerokit.train
    ("train-workload", lambda: zerokit.train("mlp"), ["workload", "zerokit.Workload"]),
    ("train-strategy", lambda: zerokit.train(WORK, "zero9"), ["zero9", "zero1"]),
    ("train-steps", lambda: zerokit.train(WORK, "ddp", steps=0), ["steps=0", "positive integer"]),
    ("train-precision", lambda: zerokit.train(WORK, "ddp", precision="fp7"), ["fp7", "fp32"]),
    ("train-micro-batches", lambda: zerokit.train(WORK, "ddp", micro_batches=0), ["micro_batches=0", "positive"]),
    ("train-optimizer", lambda: zerokit.train(WORK, "ddp", optimizer="lion"), ["lion", "adamw"]),
    ("train-world-size", lambda: zerokit.train(WORK, "ddp", world_size=0), ["world_size=0", "positive integer"]),
    ("train-parallel-product", lambda: zerokit.train(WORK, "ddp", world_size=2, parallel={"dp": 3}),
     ["parallel", "world size", "multiply"]),
    ("train-parallel-axis", lambda: zerokit.train(WORK, "ddp", world_size=2, parallel={"xp": 2}),
     ["xp", "dp"]),
    ("train-checkpointing", lambda: zerokit.train(WORK, "ddp", checkpointing="bogus"), ["checkpointing", "none"]),
    ("train-option", lambda: zerokit.train(WORK, "ddp", colour="red"), ["colour"]),
    ("train-timeout", lambda: zerokit.train(WORK, "ddp", timeout_s=-1, reference=False), ["timeout_s=-1", "positive"]),
    ("train-lr", lambda: zerokit.train(WORK, "ddp", lr=-1), ["lr=-1", "positive"]),
    ("train-backend", lambda: zerokit.train(WORK, "ddp", backend="mpi", reference=False), ["backend='mpi'", "'gloo'"]),
    # zerokit.plan
    ("plan-preset", lambda: zerokit.plan(preset="gpt-9000"), ["gpt-9000", "llama-7b"]),
    ("plan-gpus", lambda: zerokit.plan(params=7e9, gpus=0), ["gpus", "0"]),
    ("plan-strategy", lambda: zerokit.plan(params=7e9, strategy="zero9"), ["zero9", "zero3"]),
    ("plan-precision", lambda: zerokit.plan(params=7e9, precision="fp7"), ["fp7", "bf16"]),
    ("plan-parallel", lambda: zerokit.plan(params=7e9, gpus=8, parallel="dp=3,tp=2"), ["parallel", "8"]),
    ("plan-checkpointing", lambda: zerokit.plan(params=7e9, checkpointing="some"), ["checkpointing", "none"]),
    ("plan-params", lambda: zerokit.plan(params=-1), ["params", "positive"]),
    ("plan-gpu-memory", lambda: zerokit.plan(params=7e9, gpu_memory=-5), ["gpu_memory=-5", "positive"]),
    ("plan-no-model", lambda: zerokit.plan(), ["model", "params"]),
    # zerokit.schedule / simulate
    ("schedule-name", lambda: zerokit.schedule("zigzag", 2, 4), ["zigzag", "1f1b", "gpipe"]),
    ("schedule-stages", lambda: zerokit.schedule("1f1b", 0, 4), ["stages", "0"]),
    ("schedule-micro-batches", lambda: zerokit.schedule("1f1b", 2, 0), ["micro_batches", "0"]),
    ("schedule-chunks", lambda: zerokit.schedule("gpipe", 2, 4, chunks=2), ["chunks", "interleaved"]),
    ("schedule-chunks-zero", lambda: zerokit.schedule("interleaved", 2, 4, chunks=0), ["chunks=0", ">= 1"]),
    ("simulate-schedule", lambda: zerokit.simulate("1f1b"), ["schedule", "Schedule"]),
    ("simulate-forward", lambda: zerokit.simulate(SCHED, forward=-1), ["forward=-1", ">= 0"]),
    # the own-loop wrappers, inside a launch
    ("ddp-module", in_rank(lambda ctx: zerokit.DistributedDataParallel("model")), ["module", "nn.Module"]),
    ("ddp-bucket", in_rank(lambda ctx: zerokit.DistributedDataParallel(_model(), bucket_mb=-1)),
     ["bucket_mb", "positive"]),
    ("sharded-optimizer-class", in_rank(lambda ctx: zerokit.ShardedOptimizer(_model().parameters(), "adam")),
     ["optimizer_class", "torch.optim"]),
    ("initialize-stage", in_rank(lambda ctx: zerokit.initialize(model=_model(), config={
        "train_batch_size": 4, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 7}})), ["stage", "0", "3"]),
    ("initialize-key", in_rank(lambda ctx: zerokit.initialize(model=_model(), config={
        "train_batch_size": 4, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, "bogus_key": 1})),
     ["bogus_key"]),
    ("initialize-model", in_rank(lambda ctx: zerokit.initialize(model="gpt", config={"train_batch_size": 4})),
     ["model", "nn.Module"]),
    # zerokit.grade
    ("grade-missing-file", lambda: zerokit.grade("no/such/notebook.ipynb"), ["no/such/notebook.ipynb"]),
    ("grade-exercise", lambda: zerokit.grade("exercises/01_ring_allreduce.py", exercise="ex99"), ["ex99"]),
    ("grade-checks", lambda: zerokit.grade("exercises/01_ring_allreduce.py", checks=["no_such_check"]),
     ["no_such_check"]),
    ("grade-timeout", lambda: zerokit.grade("exercises/01_ring_allreduce.py", timeout_s=-1), ["timeout_s", "positive"]),
]

MODEL = "tests/data/bad_input_workload.py:work"
CLI_CASES = [
    ("cli-no-command", [], ["command"]),
    ("cli-compare-no-model", ["compare", "--world-size", "2", "--strategies", "ddp"], ["--model"]),
    ("cli-compare-model-file", ["compare", "--model", "no_such_file.py:work", "--world-size", "2",
                                "--strategies", "ddp"], ["--model", "no_such_file.py"]),
    ("cli-compare-model-form", ["compare", "--model", "justaname", "--world-size", "2", "--strategies", "ddp"],
     ["--model", "FILE.py:FUNC"]),
    ("cli-compare-strategy", ["compare", "--model", MODEL, "--world-size", "2",
                              "--strategies", "zero9"], ["zero9"]),
    ("cli-compare-world-size", ["compare", "--model", MODEL, "--world-size", "two", "--strategies", "ddp"],
     ["--world-size", "int"]),
    ("cli-compare-precision", ["compare", "--model", MODEL, "--world-size", "2", "--strategies", "ddp",
                               "--precision", "fp7"], ["--precision", "fp32"]),
    ("cli-compare-optimizer", ["compare", "--model", MODEL, "--world-size", "2", "--strategies", "ddp",
                               "--optimizer", "lion"], ["--optimizer", "adamw"]),
    ("cli-compare-parallel", ["compare", "--model", MODEL, "--world-size", "2", "--strategies", "ddp",
                              "--parallel", "dp=x"], ["--parallel", "AXIS=N", "dp, cp, ep, tp, pp"]),
    ("cli-compare-option", ["compare", "--model", MODEL, "--world-size", "2", "--strategies", "ddp",
                            "--option", "noequals"], ["--option", "KEY=VALUE"]),
    ("cli-compare-deepspeed-config", ["compare", "--model", MODEL, "--world-size", "2", "--strategies", "ddp",
                                      "--deepspeed-config", "no_such.json"], ["--deepspeed-config", "no_such.json"]),
    ("cli-compare-world-size-zero", ["compare", "--model", MODEL, "--world-size", "0", "--strategies", "ddp"],
     ["world", "0"]),
    ("cli-tour-steps", ["tour", "--steps", "many"], ["--steps", "int"]),
    ("cli-bench-suite", ["bench", "nosuch"], ["nosuch", "allowed", "ddp"]),
]


def test_the_installed_command_gives_a_usage_error_not_a_traceback():
    """The same path as a user's shell: ``python -m zerokit.cli``, exit status 2, no Python traceback."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "zerokit.cli", "compare", "--model", MODEL, "--world-size", "2",
                           "--strategies", "zero9"], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - start < 30
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "zero9" in done.stderr and "allowed" in done.stderr, done.stderr


@pytest.fixture(autouse=True)
def no_process_left_behind(no_children_left):
    yield
    no_children_left()


def test_the_table_is_big_enough():
    assert len(CASES) + len(CLI_CASES) >= 40
    ids = [c[0] for c in CASES + CLI_CASES]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("call, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_argument_gets_a_clear_error(call, words):
    start = time.monotonic()
    text = error_of(call)
    took = time.monotonic() - start
    assert took < 10, f"took {took:.1f} s"
    missing = [w for w in words if w.lower() not in text.lower()]
    assert not missing, f"{missing} not in: {text}"


@pytest.mark.parametrize("argv, words", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_a_bad_cli_flag_gets_a_clear_error(capsys, argv, words):
    start = time.monotonic()
    text = cli_error(capsys, argv)
    assert time.monotonic() - start < 10
    missing = [w for w in words if w.lower() not in text.lower()]
    assert not missing, f"{missing} not in: {text}"
