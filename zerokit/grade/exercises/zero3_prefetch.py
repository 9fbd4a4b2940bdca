"""Exercise 13: ZeRO-3 prefetch under a dynamic graph (DeepSpeed's trace: recorded, trusted, invalidated, re-recorded).

Interface: ``PrefetchTrace`` (``next_unit(phase, i)``, ``end_step()``) and ``Zero3Prefetch(blocks,
lr, group=None)`` whose ``begin(phase, i)`` the learner writes; exercise 06's hooks, ``gather``,
``wait``, ``free`` and ``self.works`` are given. Graded on 2 ranks over 6 SGD steps of four blocks
whose block 2 a branch skips in steps 2 and 3: the gradient shards and parameters against
single-process training (what ZeRO-3 without prefetch computes); the all-gathers of each forward
and backward, read from the probe's ledger and told apart by their sizes (every unit has its own),
against the order the pass took — every unit that ran gathered exactly once, a unit that did not
run at most once and only where the order left the trace; and, wherever a pass repeats the previous
step's order, the next unit's gather launched before each unit began.
"""
from __future__ import annotations

from typing import Dict, List

import torch
import torch.nn as nn

from .. import reference as ref
from ..core import Check, Exercise, Fail, Scenario
from ..probe import Mistake

LR = 0.1
N = 2
#: per step, whether the branch takes block 2 (taken, taken, skipped, skipped, taken, taken)
ROUTES = (True, True, False, False, True, True)
PHASES = ("forward", "backward")


def blocks() -> nn.ModuleList:
    """Four blocks of different sizes (so that each unit's all-gather has its own size), from a fixed seed."""
    torch.manual_seed(0)
    return nn.ModuleList([nn.Sequential(nn.Linear(8, 16), nn.Tanh()), nn.Sequential(nn.Linear(16, 16), nn.Tanh()),
                          nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Tanh()), nn.Linear(16, 4)])


def forward(model: nn.ModuleList, x: torch.Tensor, deep: bool) -> torch.Tensor:
    """The dynamic graph: block 2 runs only when the step's batch takes the branch (the same on every rank)."""
    h = model[1](model[0](x))
    if deep:
        h = model[2](h)
    return model[3](h)


def unit_bytes() -> Dict[int, int]:
    """All-gather payload (bytes, fp32, padded to a multiple of N) -> unit index."""
    sizes = {}
    for k, block in enumerate(blocks()):
        numel = sum(p.numel() for p in block.parameters())
        sizes[-(-numel // N) * N * 4] = k
    return sizes


def order_of(deep: bool, phase: str) -> List[int]:
    forward_order = [0, 1, 2, 3] if deep else [0, 1, 3]
    return forward_order if phase == "forward" else forward_order[::-1]


def _train(ctx, ns, probe):
    model = blocks()
    zero = ns["Zero3Prefetch"](model, LR)
    sizes = unit_bytes()
    now = {"pass": None}
    events = []

    def began(phase, j):
        label = now["pass"]
        issued = [sizes.get(c.nbytes, -1) for c in probe.records if c.op == "all_gather" and c.phase == label]
        work = getattr(zero, "works", {}).get(j)
        if work is not None and not (work.is_completed() if hasattr(work, "is_completed") else False):
            raise Mistake("used-in-flight", f"unit {j}'s {phase} began in {_name(label)} while its own prefetched "
                                            f"gather was still in flight (never waited for): it would compute on "
                                            f"memory the all-gather has not written yet")
        events.append({"pass": label, "unit": j, "issued": issued})

    def after_forward(module, args, output, j):
        if output.requires_grad:  # registered after the learner's hooks: runs after their pre_backward
            output.register_hook(lambda grad: began("backward", j))

    for j, block in enumerate(model):  # after the learner's hooks: unit j is ready and the prefetch launched
        block.register_forward_pre_hook(lambda module, args, j=j: began("forward", j))
        block.register_forward_hook(lambda module, args, output, j=j: after_forward(module, args, output, j))
    rows = ref.local_rows(12, ctx.rank, ctx.world_size)
    grads, held = [], []
    for step, deep in enumerate(ROUTES):
        x, y = ref.batch(step)
        now["pass"] = f"{step}:forward"
        with probe.phase(now["pass"]):
            loss = ref.mse(forward(model, x[rows], deep), y[rows])
        now["pass"] = f"{step}:backward"
        with probe.phase(now["pass"]):
            loss.backward()
        grads.append({i: zero.grad_shards[i].detach().clone() for i in range(len(model)) if zero.reduced[i]})
        now["pass"] = f"{step}:step"
        with probe.phase(now["pass"]):
            zero.step()
        held.append([u.data.untyped_storage().nbytes() for u in zero.units])
    return {"events": events, "grads": grads, "held": held, "shards": [s.detach().clone() for s in zero.shards],
            "gathers": [(c.phase, sizes.get(c.nbytes, -1)) for c in probe.records if c.op == "all_gather"],
            "invalidations": getattr(getattr(zero, "trace", None), "invalidations", None)}


def reference_run() -> dict:
    """One process, the whole batch, the same branches: gradients per step by unit (None: not run), final params."""
    model = blocks()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    grads = []
    for step, deep in enumerate(ROUTES):
        x, y = ref.batch(step)
        ref.mse(forward(model, x, deep), y).backward()
        grads.append([None if any(p.grad is None for p in block.parameters())
                      else torch.cat([p.grad.reshape(-1) for p in block.parameters()]) for block in model])
        optimizer.step()
        optimizer.zero_grad()
    return {"grads": grads, "params": [torch.cat([p.detach().reshape(-1) for p in block.parameters()])
                                       for block in model]}


def _passes(r) -> Dict[str, List[int]]:
    """The order each pass took, as the grader's own hooks saw the units begin."""
    out: Dict[str, List[int]] = {}
    for e in r["events"]:
        out.setdefault(e["pass"], []).append(e["unit"])
    return out


def _name(label: str) -> str:
    step, phase = label.split(":")
    return f"step {step}'s {phase}"


def _judge_parity(results, ns):
    expected = reference_run()
    for step in range(len(ROUTES)):
        for u, want in enumerate(expected["grads"][step]):
            if want is None:
                continue
            shards = [r["grads"][step].get(u) for r in results]
            if any(s is None for s in shards):
                rank = next(k for k, s in enumerate(shards) if s is None)
                raise Fail(f"rank {rank}: unit {u}'s gradient was not reduce-scattered in step {step}", "reduced",
                           "missing", rank)
            whole = torch.cat(shards)[:want.numel()]
            diff = float((whole - want).abs().max())
            if not diff <= ref.GRAD_ATOL:
                raise Fail(f"step {step}: unit {u}'s gradient (every rank's shard put together) differs from "
                           f"single-process training's by {diff:.3g}", f"≤ {ref.GRAD_ATOL:g}", f"{diff:.3g}")
    for u, want in enumerate(expected["params"]):
        whole = torch.cat([r["shards"][u] for r in results])[:want.numel()]
        diff = float((whole - want).abs().max())
        if not diff <= ref.PARAM_ATOL:
            raise Fail(f"after {len(ROUTES)} SGD steps unit {u}'s parameters differ from single-process training's "
                       f"by {diff:.3g}", f"≤ {ref.PARAM_ATOL:g}", f"{diff:.3g}")
    return (f"every step's gradients and, after {len(ROUTES)} SGD steps, the parameters equal single-process "
            f"training's (ZeRO-3 without prefetch computes the same); no unit computed before its gather finished")


def _judge_once(results, ns):
    for rank, r in enumerate(results):
        passes = _passes(r)
        for step, deep in enumerate(ROUTES):
            for phase in PHASES:
                label = f"{step}:{phase}"
                ran = passes.get(label, [])
                if ran != order_of(deep, phase):
                    raise Fail(f"rank {rank}: in {_name(label)} the units began in the order {ran}",
                               order_of(deep, phase),
                               ran, rank, hint="the hooks of the given class drive begin(phase, i); keep them")
                gathered = [u for p, u in r["gathers"] if p == label]
                if -1 in gathered:
                    raise Fail(f"rank {rank}: an all-gather in {_name(label)} has the size of no unit: gather whole "
                               f"units with the given gather(i)", "one all-gather per unit", gathered, rank)
                counts = {u: gathered.count(u) for u in set(gathered)}
                for u in ran:
                    if counts.get(u, 0) != 1:
                        again = (" — it was prefetched already: wait for that gather instead of gathering again"
                                 if counts.get(u, 0) > 1 else "")
                        raise Fail(f"rank {rank}: unit {u} was gathered {counts.get(u, 0)} times in {_name(label)}"
                                   f"{again}", 1, counts.get(u, 0), rank)
                strays = sorted(u for u in counts if u not in ran)
                if not strays:
                    continue
                previous = order_of(ROUTES[step - 1], phase) if step else None
                if ran == previous or step == 0:
                    why = (f"its order was {_name(f'{step - 1}:{phase}')}'s again, so a trace re-recorded at the end "
                           f"of that step predicts it exactly: an old trace is still trusted (re-record the order "
                           f"every step took)" if step else "no trace existed yet: nothing should be prefetched")
                    what = f"unit {strays[0]}, which" if len(strays) == 1 else f"units {strays}, which"
                    raise Fail(f"rank {rank}: {_name(label)} gathered {what} did not run; {why}", 0,
                               len(strays), rank)
                if len(strays) > 1 or counts[strays[0]] > 1:
                    extra = len(gathered) - len(ran)
                    raise Fail(f"rank {rank}: {_name(label)} gathered units that did not run {extra} times: once "
                               f"the order leaves the trace, stop prefetching and gather on demand",
                               "at most 1 (the unit the old trace predicted)", extra, rank)
        for step, sizes in enumerate(r["held"]):
            if any(sizes):
                raise Fail(f"rank {rank} still holds gathered units {[u for u, b in enumerate(sizes) if b]} after step "
                           f"{step}: every unit, used or only prefetched, is freed by the end of the step",
                           "0 B per unit", sizes, rank)
    return ("in every forward and backward each unit that ran was gathered exactly once, also across the branch "
            "changes; a unit that did not run was gathered only where the order left the trace (the one prefetch "
            "the old trace asked for, then freed)")


def _judge_ahead(results, ns):
    checked = 0
    for rank, r in enumerate(results):
        by_pass: Dict[str, list] = {}
        for e in r["events"]:
            by_pass.setdefault(e["pass"], []).append(e)
        diverged = None
        for step, deep in enumerate(ROUTES):
            for phase in PHASES:
                order = order_of(deep, phase)
                if step == 0:
                    continue
                if order != order_of(ROUTES[step - 1], phase):
                    diverged = diverged if diverged is not None else step
                    continue
                label = f"{step}:{phase}"
                events = by_pass.get(label, [])
                for e, nxt in zip(events, order[1:]):
                    if nxt not in e["issued"]:
                        if diverged is not None and step > diverged:
                            why = (f"the branch changed in step {diverged}; the order it took must become the "
                                   f"recorded one (re-record at the end of every step), else prefetching stops "
                                   f"for good")
                        else:
                            why = "the trace holds: prefetch the unit after this one in the recorded order"
                        raise Fail(f"rank {rank}: in {_name(label)} unit {e['unit']} began before any gather of "
                                   f"unit {nxt}, which comes next — the order repeated "
                                   f"{_name(f'{step - 1}:{phase}')}'s; {why}", f"unit {nxt}'s gather launched",
                                   "none", rank)
                    checked += 1
    steps = sorted({s for s in range(1, len(ROUTES)) if ROUTES[s] == ROUTES[s - 1]})
    return (f"in steps {', '.join(map(str, steps))}, where the order repeated the previous step's, every unit's "
            f"successor was already being gathered when it began ({checked // len(results)} prefetches per rank), "
            f"also after the branch changed")


EXERCISE = Exercise(
    key="13_zero3_prefetch",
    title="ZeRO-3 prefetch under a dynamic graph",
    minutes=45,
    needs=("PrefetchTrace", "Zero3Prefetch"),
    scenarios={"train": Scenario("train", N, _train)},
    checks=[
        Check("same-as-one-process", 3, "train", _judge_parity,
              "prefetch changes when a unit is gathered, never what it computes: a prefetched unit is ready only "
              "once its gather finished — wait(i) before unit i computes (the work is in self.works[i])",
              catches=("used-in-flight",)),
        Check("gathered-once", 3, "train", _judge_once,
              "a trace is a prediction: trust it while the order matches, and when a branch makes it wrong stop "
              "prefetching for the rest of the step instead of gathering what will not run"),
        Check("prefetched-ahead", 3, "train", _judge_ahead,
              "record the order a step took and prefetch the next unit of it in the next step — re-recorded every "
              "step, so a changed branch is prefetched again one step later"),
    ],
    hints=[
        "Prefetching hides a gather behind the compute before it: when the order in which units are used is known, "
        "gather the next unit while this one computes. The order is learned, not declared — recorded in one step, "
        "trusted in the next, and dropped the moment the model takes another path.",
        "next_unit: append the unit to this step's observed order. With no trusted order there is nothing to prefetch. "
        "If the recorded order has another unit, or none, at this position, the model took another path: stop trusting "
        "it, count the invalidation, prefetch nothing. Else the recorded unit after this one (none at the end).",
        "end_step: for each phase that saw units, this step's order becomes the recorded one (a copy); then every "
        "observed list starts empty. A trace that held is recorded again unchanged; one that was left is replaced by "
        "the order this step took.",
        "begin: ask the trace for the unit ahead first; gather this unit on demand if it is not gathered yet, and wait "
        "for it (a prefetched gather must finish before the unit computes); then launch the unit ahead asynchronously, "
        "unless it is gathered already.",
        "The code:\n"
        "next_unit(phase, i):\n"
        "    seen = self.observed[phase]\n"
        "    seen.append(i)\n"
        "    trace = self.recorded[phase]\n"
        "    if trace is None:\n"
        "        return None\n"
        "    k = len(seen) - 1\n"
        "    if k >= len(trace) or trace[k] != i:\n"
        "        self.recorded[phase] = None\n"
        "        self.invalidations += 1\n"
        "        return None\n"
        "    return trace[k + 1] if k + 1 < len(trace) else None\n"
        "end_step:\n"
        "    for phase, seen in self.observed.items():\n"
        "        if seen:\n"
        "            self.recorded[phase] = list(seen)\n"
        "        self.observed[phase] = []\n"
        "begin(phase, i):\n"
        "    ahead = self.trace.next_unit(phase, i)\n"
        "    if not self.is_gathered(i):\n"
        "        self.gather(i)\n"
        "    self.wait(i)\n"
        "    if ahead is not None and not self.is_gathered(ahead):\n"
        "        self.gather(ahead, async_op=True)",
    ],
)
