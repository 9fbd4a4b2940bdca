"""Times on the device's timeline (``zerokit.runtime.clock``), checked on the CPU with a GPU's timeline replayed.

On a GPU a collective returns once queued: ``perf_counter`` around it reads ~0. The fake
events below advance a "GPU clock" that only the work itself moves, while the host returns
at once — as NCCL does — so a time read from ``perf_counter`` instead of the clock shows
up as ~0 where the GPU spent seconds.
"""
import ast
from pathlib import Path

import pytest
import torch

import zerokit

ROOT = Path(__file__).resolve().parents[2] / "zerokit"


class FakeGpu:
    now = 0.0  # seconds of GPU time


class FakeEvent:
    def record(self):
        self.t = FakeGpu.now

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1000.0


def _on_a_replayed_gpu(ctx):
    import torch.distributed as dist

    from zerokit.runtime import clock, comm
    from zerokit.runtime.timeline import Tracer

    clock._event_factory = FakeEvent
    clock.use(torch.device("cuda", 0))
    real_all_reduce = dist.all_reduce

    class QueuedWork:  # what NCCL's Work does: wait() only orders streams, the GPU time passes anyway
        def __init__(self, work):
            self.work = work

        def wait(self):
            self.work.wait()
            FakeGpu.now += 0.25

    def queued_all_reduce(tensor, op=None, group=None, async_op=False):
        work = real_all_reduce(tensor, group=group, async_op=async_op)
        if async_op:
            return QueuedWork(work)
        FakeGpu.now += 0.5  # the GPU runs the collective after the call returned
        return work

    dist.all_reduce = queued_all_reduce
    ledger = comm.ledger()
    ledger.reset()
    tracer = Tracer(ctx.rank)
    with comm.phase("backward"):
        comm.all_reduce(torch.ones(4))
        comm.all_reduce(torch.ones(4), async_op=True).wait()
        with tracer.span("step"):
            FakeGpu.now += 2.0
    ledger.resolve()
    sync, waited = ledger.records
    span = tracer.events()[1]
    return sync.blocked_s, sync.t_end - sync.t_launch, waited.blocked_s, span["end"] - span["start"]


def test_collectives_and_spans_are_timed_on_the_gpus_timeline():
    sync_blocked, sync_duration, wait_blocked, span = zerokit.launch(_on_a_replayed_gpu, 1)[0]
    assert sync_blocked == pytest.approx(0.5) and sync_duration == pytest.approx(0.5)
    assert wait_blocked == pytest.approx(0.25)
    assert span == pytest.approx(2.0)


#: files whose times are on the device's timeline: none of them may read perf_counter for a time inside a step
TIMED = ["runtime/ring.py", "runtime/timeline.py", "pipeline_parallel/executor.py", "peers/torch_ddp.py",
         "runtime/torch_recording.py"]


@pytest.mark.parametrize("path", TIMED)
def test_timing_sites_read_the_device_clock(path):
    source = (ROOT / path).read_text()
    lines = source.splitlines()
    calls = [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)
             and node.attr == "perf_counter" and "perf0 =" not in lines[node.lineno - 1]]  # the tracer's origin pair
    assert not calls, f"{path} lines {calls} read time.perf_counter; take a zerokit.runtime.clock.mark() instead"


def test_comm_reads_perf_counter_only_for_the_emulated_link():
    """comm.py's collectives are marks of the clock; perf_counter is left to the emulated link (gloo only)."""
    source = (ROOT / "runtime/comm.py").read_text()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "perf_counter":
            line = source.splitlines()[node.lineno - 1]
            assert "book(" in line or "emulated_end" in source.splitlines()[node.lineno - 2] or "due" in line, line
