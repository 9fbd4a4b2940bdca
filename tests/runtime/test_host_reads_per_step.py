"""Host reads of tensors inside a training step: a constant per step, never one per micro-batch.

On a GPU every ``.item()``, ``float(t)``, ``.tolist()``, ``.cpu()`` of a device tensor waits for the stream to
drain; one per micro-batch stalls the host between micro-batches (the next forward's kernels are not queued while
the last backward's still run). ``zerokit.train``'s loop (:func:`zerokit.train.run_rank`) and the pipeline
executor keep each micro-batch's loss on the device and read the step's losses once, after the step.

Counted here on the CPU, inside one rank's loop: every call of those methods on any tensor, attributed to the step
``comm.set_step`` says is running (the loop marks each step's start, and the end of the last). The bounds:

* without a pipeline: 1 per step (the losses' one ``tolist``), at A = 1 and A = 4 micro-batches alike;
* with one (pp = 2, ``pp``): the last stage reads its losses once and ``Pipeline._share_loss`` reads the shared
  step loss once: ≤ 2 on every pipeline rank, at m = 2 and m = 4 alike.

SGD: torch's AdamW reads each parameter's ``step`` counter with ``.item()`` (a CPU tensor, no device wait, but a
count per parameter that would hide the loop's).
"""
import collections
from contextlib import contextmanager

import pytest
import torch

import zerokit
from zerokit.job import make_job
from zerokit.runtime import comm
from zerokit.runtime.context import RankContext
from zerokit.train import run_rank

READS = ("item", "__float__", "__int__", "__bool__", "tolist", "cpu", "numpy")
STEPS = 3
SIZE = dict(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=8)


@contextmanager
def counted_reads():
    """Yields a Counter: host reads of tensors by the step that was running (None: before the first)."""
    counts, now = collections.Counter(), [None]
    real_set_step = comm.set_step
    real = {name: getattr(torch.Tensor, name) for name in READS}

    def set_step(step):
        now[0] = step
        real_set_step(step)

    def counting(fn):
        def read(self, *args, **kwargs):
            counts[now[0]] += 1
            return fn(self, *args, **kwargs)
        return read

    comm.set_step = set_step
    for name, fn in real.items():
        setattr(torch.Tensor, name, counting(fn))
    try:
        yield counts
    finally:
        comm.set_step = real_set_step
        for name, fn in real.items():
            setattr(torch.Tensor, name, fn)


def _reads_per_step(ctx, job):
    with counted_reads() as counts:
        result = run_rank(ctx, job)
    return [counts[step] for step in range(job.steps)], result.losses


def _job(strategy, micro_batches, **kw):
    return make_job(zerokit.tiny_gpt(**SIZE), strategy, kw.pop("world_size", 1), STEPS, "fp32", "sgd", 0.1,
                    micro_batches, {}, **kw)


@pytest.mark.parametrize("micro_batches", [1, 4])
def test_the_loop_reads_the_host_once_per_step_whatever_the_micro_batches(micro_batches):
    reads, losses = _reads_per_step(RankContext(0, 1, torch.device("cpu"), "none"), _job("single", micro_batches))
    assert reads == [1] * STEPS, reads
    assert len(losses) == STEPS and all(isinstance(x, float) for x in losses)


@pytest.mark.parametrize("micro_batches", [2, 4])
def test_the_pipeline_reads_the_host_at_most_twice_per_step_whatever_the_micro_batches(micro_batches):
    job = _job("pp", micro_batches, world_size=2, parallel={"pp": 2})
    ranks = zerokit.launch(_reads_per_step, 2, job, timeout_s=240)
    for reads, _ in ranks:
        assert all(n <= 2 for n in reads), [r for r, _ in ranks]
    assert ranks[0][1] == ranks[1][1]  # the last stage's losses, shared with the first
