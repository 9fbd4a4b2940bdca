"""``zerokit.parallelize``: the steps in their stated order, the ones not asked for skipped, and zerokit.train's
ranks going through it."""
import importlib

import torch

import zerokit
from zerokit import parallelize as parallelize_module
from zerokit.job import make_job
from zerokit.parallelize import ORDER, parallelize
from zerokit.runtime.context import RankContext
from zerokit.strategies import get as get_strategy
from zerokit.train import run_reference


class _Mesh:
    def group(self, axis):
        return f"{axis} group"


class _Context:
    mesh = _Mesh()


def test_the_order_is_torchtitans():
    assert ORDER == ("tensor", "expert", "context", "checkpointing", "pipeline", "data_parallel")


def test_every_step_applied_once_in_the_stated_order(monkeypatch):
    calls = []

    def recorder(name, returns=None):
        def record(*args, **kwargs):
            calls.append((name, args, kwargs))
            return returns
        return record

    sharded_loss = object()
    monkeypatch.setattr(parallelize_module, "apply_plan", recorder("tensor"))
    monkeypatch.setattr(parallelize_module, "register_sequence_parallel_gradient_hooks", recorder("tensor hooks"))
    monkeypatch.setattr(parallelize_module, "plan_loss", recorder("tensor loss", sharded_loss))
    monkeypatch.setattr(parallelize_module, "apply_expert_parallel", recorder("expert"))
    monkeypatch.setattr(parallelize_module, "apply_context_parallel", recorder("context"))
    monkeypatch.setattr(parallelize_module, "apply_checkpointing", recorder("checkpointing", "handle"))
    stages = torch.nn.Linear(2, 2)

    class Driver:
        def __init__(self, options, micro_batches, ctx, model, loss_fn):
            calls.append(("pipeline", (options, micro_batches, model, loss_fn), {}))
            self.module = stages

    class Strategy:
        def __init__(self, model, ctx, config, **options):
            calls.append(("data_parallel", (model, config), options))

    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 2))
    done = parallelize(model, _Context(), plan="plan", loss_fn="loss", expert_parallel=True, seq_len=16,
                       cp_attention="ulysses", checkpointing="every", pipeline={"schedule": "gpipe"},
                       pipeline_driver=Driver, micro_batches=4, strategy=Strategy, options={"bucket_mb": 1.0},
                       before_pipeline=recorder("before pipeline"))
    assert [name for name, _, _ in calls] == ["tensor", "tensor hooks", "tensor loss", "expert", "context",
                                             "checkpointing", "before pipeline", "pipeline", "data_parallel"]
    assert done.applied == list(ORDER)
    by_name = {name: (args, kwargs) for name, args, kwargs in calls}
    assert by_name["tensor"][0] == (model, "plan", "tp group")
    assert by_name["context"][0][2:] == (16, "ulysses")
    # the pipeline gets the whole (tensor-parallel) model and the vocabulary-parallel loss; the strategy its stages
    assert by_name["pipeline"][0] == ({"schedule": "gpipe"}, 4, model, sharded_loss)
    assert by_name["data_parallel"][0][0] is stages and by_name["data_parallel"][1] == {"bucket_mb": 1.0}
    assert done.model is stages and done.loss_fn is sharded_loss and done.checkpointing == "handle"
    assert done.parameters_held == sum(p.numel() for p in stages.parameters())


def test_steps_not_asked_for_are_skipped():
    model = torch.nn.Linear(2, 2)
    done = parallelize(model, _Context(), loss_fn="loss")
    assert done.applied == [] and done.model is model and done.loss_fn == "loss" and done.strategy is None
    assert done.parameters_held == 6


def test_checkpointing_then_the_strategy_on_a_real_model():
    work = zerokit.tiny_gpt(n_layer=2, d_model=32, seq_len=16, vocab=64)
    model = work.build_model()
    ctx = RankContext(0, 1, torch.device("cpu"), "none")
    done = parallelize(model, ctx, checkpointing="every", strategy=get_strategy("single"))
    assert done.applied == ["checkpointing", "data_parallel"]
    assert done.strategy.model is model and done.checkpointing is not None
    x, y = work.batch(0)
    work.loss(done.strategy.forward(x), y).backward()
    assert done.checkpointing.recomputed_forwards == 2  # the blocks ran again in backward: checkpointed


def test_train_ranks_go_through_parallelize(monkeypatch):
    train_module = importlib.import_module("zerokit.train")  # the module: zerokit.train is also the function
    applied = []

    def recording(*args, **kwargs):
        done = parallelize(*args, **kwargs)
        applied.append(done.applied)
        return done

    monkeypatch.setattr(train_module, "parallelize", recording)
    work = zerokit.tiny_gpt(n_layer=2, d_model=32, seq_len=16, vocab=64)
    result = run_reference(make_job(work, "single", 1, 1, "fp32", "sgd", 0.1, 1, {"checkpointing": "every"}))
    assert applied == [["checkpointing", "data_parallel"]]
    assert result.recomputed_forwards > 0
