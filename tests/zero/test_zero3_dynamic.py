"""ZeRO-3 under a dynamic graph: the prefetch trace is invalidated when a data-dependent branch changes the unit order.

The model runs a shared trunk, then one of two task blocks chosen by the batch's first
token. The first step records the order units begin in; a step on the other task begins
a unit the trace did not expect: zerokit's prefetcher invalidates the trace, frees the
gather it launched for the stale branch, gathers the rest of the pass on demand, and
re-records the order, so the next step on that task prefetches again and gathers nothing
extra (:mod:`zerokit.zero.trace`). Training stays the single process's.
"""
import pytest
import torch
import torch.nn as nn

import zerokit
from zerokit.optim import OptimizerSpec
from zerokit.runtime import comm
from zerokit.strategies import TrainConfig, get
from zerokit.workloads import Block, Workload, _lm_loss
from zerokit.zero.trace import Trace

VOCAB, SEQ, D, BATCH = 64, 16, 32, 8
TASKS = [0, 0, 1, 1, 0]  # the task of each step's batch: the branch changes at steps 2 and 4


class TaskRouted(nn.Module):
    """A trunk of two blocks, then the block of the batch's task (its first token), then the head."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(SEQ, D)
        self.trunk = nn.ModuleList(Block(D, 2) for _ in range(2))
        self.tasks = nn.ModuleList(Block(D, 2) for _ in range(2))
        self.ln_f, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.trunk:
            x = block(x)
        x = self.tasks[int(idx[0, 0])](x)  # data-dependent: the input picks the block
        return self.head(self.ln_f(x))


def _batch(step):
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(2, VOCAB, (BATCH, SEQ + 1), generator=g)
    tokens[:, 0] = TASKS[step]  # the whole global batch is one task: every rank takes the same branch
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


WORK = Workload("task-routed", TaskRouted, _batch, _lm_loss)


def _strategy(ctx, name, **options):
    torch.set_num_threads(1)
    return get(name)(WORK.build_model(), ctx, TrainConfig(optimizer=OptimizerSpec("sgd", lr=0.1)), **options)


def _train(ctx, name="zero3", **options):
    strategy = _strategy(ctx, name, **options)
    gathers = []
    for step in range(len(TASKS)):
        comm.set_step(step)
        x, y = _batch(step)
        per = BATCH // ctx.world_size
        x, y = x[ctx.rank * per:(ctx.rank + 1) * per], y[ctx.rank * per:(ctx.rank + 1) * per]
        strategy.zero_grad()
        strategy.backward(WORK.loss(strategy.forward(x), y))
        strategy.step()
        gathers.append([r["tag"].removeprefix("params ") for r in comm.ledger().to_list()
                        if r["op"] == "all_gather" and r["step"] == step and r["tag"].startswith("params ")])
    out = {"params": strategy.full_parameters()}
    if name == "zero3":
        out.update(labels=[u.label for u in strategy.units], events=strategy.prefetcher.trace.events,
                   order=strategy.prefetcher.trace.order, extra=strategy.prefetcher.extra_gathers, gathers=gathers)
    return out


def test_a_changed_branch_invalidates_the_trace_and_the_next_step_gathers_nothing_extra():
    result = zerokit.launch(_train, 2)[0]
    labels = result["labels"]
    assert labels == ["trunk.0", "trunk.1", "tasks.0", "tasks.1", "TaskRouted"]
    name = {i: label for i, label in enumerate(labels)}
    # the order the prefetcher ran last: step 4's, task 0 again
    assert [name[i] for i in result["order"]["forward"]] == ["TaskRouted", "trunk.0", "trunk.1", "tasks.0"]
    events = [(e["pass"], e["phase"], e["event"], name.get(e.get("expected")), name.get(e.get("got")))
              for e in result["events"]]
    assert events == [(0, "forward", "recorded", None, None), (0, "backward", "recorded", None, None),
                      (2, "forward", "invalidated", "tasks.0", "tasks.1"), (2, "backward", "invalidated", None, None),
                      (2, "forward", "re-recorded", None, None), (2, "backward", "re-recorded", None, None),
                      (4, "forward", "invalidated", "tasks.1", "tasks.0"), (4, "backward", "invalidated", None, None),
                      (4, "forward", "re-recorded", None, None), (4, "backward", "re-recorded", None, None)]
    # every unit that runs is gathered twice (forward, backward); a step that diverged gathered the stale task's
    # block once more, for nothing; the step after it, on the same branch, gathers exactly what it runs
    for step, task in enumerate(TASKS):
        gathered = result["gathers"][step]
        ran = ["TaskRouted", "trunk.0", "trunk.1", f"tasks.{task}"]
        extra = sorted(gathered)
        for label in ran * 2:
            extra.remove(label)
        assert extra == (["tasks.0" if task else "tasks.1"] if step in (2, 4) else []), (step, gathered)
    assert result["extra"] == 2


def test_training_under_a_changing_branch_is_the_single_process_s():
    zero3 = zerokit.launch(_train, 2)[0]["params"]
    single = _train(zerokit.RankContext(0, 1, torch.device("cpu"), "none"), "single")["params"]
    assert max(float((zero3[k] - single[k]).abs().max()) for k in single) <= 1e-5


@pytest.mark.parametrize("orders,events", [
    ([[0, 1, 2], [0, 1, 2]], ["recorded"]),
    ([[0, 1, 2], [0, 2]], ["recorded", "invalidated", "re-recorded"]),   # a block skipped
    ([[0, 1, 2], [0, 1]], ["recorded", "invalidated", "re-recorded"]),   # the pass ended before its trace
    ([[0, 1, 1, 2], [0, 1, 2]], ["recorded"]),                            # a unit applied twice counts once
])
def test_the_trace_compares_each_pass_with_the_recorded_order(orders, events):
    trace = Trace()
    for order in orders:
        for index in order:
            trace.begin("forward", index)
        for index in reversed(order):
            trace.begin("backward", index)
        trace.close()
    assert [e["event"] for e in trace.events if e["phase"] == "forward"] == events
    assert trace.order["forward"] == list(dict.fromkeys(orders[-1]))
    assert trace.ahead("forward", trace.order["forward"][0]) == trace.order["forward"][1:]
