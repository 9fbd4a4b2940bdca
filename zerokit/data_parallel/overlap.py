"""``ddp``: bucketed data parallelism whose communication hides behind backward.

Backward produces gradients from the last layer to the first. As soon as every
gradient of a bucket is ready, that bucket's all-reduce is launched asynchronously from
a gradient hook, and backward goes on computing the earlier layers while it is in
flight; a callback queued on the autograd engine waits for every bucket when backward
ends, before the optimizer step. Only what is still in flight then is *exposed*
(the timeline shades it: :func:`zerokit.timeline.exposed_comm_s`).

The lifecycle of one step, as in torch's reducer and picotron's DP wrapper:

1. ``p.grad`` of every parameter becomes a view into its flat bucket (torch's
   ``gradient_as_bucket_view``): the step's first gradient is copied into its slot,
   later micro-batches accumulate straight into the buffer that is reduced, and the
   buckets *are* the gradients in the memory ledger (model states stay exactly 16Ψ in
   fp32 with AdamW).
2. A post-accumulate-grad hook on each parameter counts it ready in its bucket; a full
   bucket is launched (divided by N, then summed) — but buckets launch strictly in
   index order, so every rank issues the same collectives in the same order even if a
   later bucket fills first.
3. At the end of backward the queued callback launches whatever has not been launched
   (unused parameters, see ``find_unused_parameters``) and waits for all of them.

Steps 2 and 3 — counting, in-order launching, waiting, the engine callback, and the
reset when backward raises — are :class:`~zerokit.data_parallel.reducer.Reducer`'s,
shared with ZeRO.

Under ``no_sync`` the hooks only accumulate; the last micro-batch reduces once.
``overlap=False`` keeps the same buckets and views but launches every bucket after
backward, so the two settings differ only in when communication starts.
``first_bucket_mb`` gives the first bucket (the last layers) its own limit, so the
first all-reduce starts early. With ``algorithm="ring"`` each bucket's ring all-reduce
runs on the calling thread as soon as the bucket is full: its rounds are visible in the
ledger, but it blocks backward while it runs (the ring has no asynchronous form).
"""
from __future__ import annotations

from ..strategies.base import Option, boolean, positive_number, register
from ..strategies.pipeline_options import PIPELINE_OPTIONS
from .buckets import GradBuckets
from .base import DataParallel
from .reducer import Reducer


def none_or_positive(x) -> bool:
    return x is None or positive_number(x)


@register
class OverlappedDataParallel(DataParallel):
    """Gradients are bucket views; each full bucket's async all-reduce starts during backward."""

    name = "ddp"
    #: data parallelism over tensor-parallel shards and pipeline stages (2-D and 3-D parallelism)
    axes = ("dp", "cp", "ep", "tp", "pp")
    options = {
        **DataParallel.options,
        **PIPELINE_OPTIONS,
        "bucket_mb": Option(25.0, positive_number, "a positive number of MiB (torch DDP's bucket_cap_mb)"),
        "first_bucket_mb": Option(None, none_or_positive,
                                  "None (the first bucket is bucket_mb too, as in torch DDP given bucket_cap_mb) "
                                  "or a positive number of MiB"),
        "overlap": Option(True, boolean, "True (launch each bucket from the gradient hooks as soon as it is full) "
                                         "or False (launch every bucket after backward)"),
    }

    def __init__(self, model, ctx, config, **options):
        super().__init__(model, ctx, config, **options)
        self.buckets = GradBuckets(self.params, self.opts["bucket_mb"], self.opts["first_bucket_mb"])
        self.buckets.attach_views()
        #: parameters that received a gradient in any micro-batch of this step
        self._seen: set = set()
        self.reducer = Reducer([len(b.params) for b in self.buckets.buckets], self._launch,
                               before_finish=self._fill_missing, after_finish=self._reduced)
        #: gradients accumulated under no_sync and not reduced yet
        self._unreduced = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_gradient_ready) for p in self.params]

    # -- during backward -----------------------------------------------------------
    def _on_gradient_ready(self, p) -> None:
        """Post-accumulate-grad hook: ``p.grad`` holds this backward's contribution."""
        self._seen.add(p)
        self.buckets.attach_view(p)  # first gradient of the step: copied into its slot, then accumulated there
        if not self._sync:
            self._unreduced = True
            return
        bucket = self.buckets.where[p][0]
        if not self.reducer.ready(bucket, p):  # a second gradient in one backward (reentrant checkpointing, say)
            if self.reducer.launched[bucket]:
                raise RuntimeError(f"strategy 'ddp': parameter {self.param_names[p]!r} received a second gradient "
                                   f"in one backward after its bucket's all-reduce had started; ddp reduces each "
                                   f"gradient once per backward (use non-reentrant checkpointing)")
            return
        if self.opts["overlap"]:
            self.reducer.launch_full()

    def _launch(self, index: int) -> None:
        bucket = self.buckets.buckets[index]
        reduce = self.average_experts if getattr(bucket.params[0], "_zerokit_expert", False) else self.average
        self.reducer.track(reduce(bucket.buffer, tag=f"bucket {bucket.index}", async_op=True))

    def _fill_missing(self) -> None:
        """End of backward, before the last buckets launch: a parameter without a gradient reduces zeros."""
        missing = [p for p in self.params if p not in self.reducer.seen]
        # a parameter that had a gradient in an earlier micro-batch of the step keeps it
        self.handle_unused([p for p in missing if p not in self._seen])
        for p in missing:
            self.buckets.attach_view(p)  # its slot holds its accumulated gradient, or zeros

    # -- the loop ------------------------------------------------------------------
    def backward(self, loss):
        self.reducer.backward(loss, sync=self._sync)

    def finish_gradient_synchronization(self):
        """Every bucket of the gradients accumulated under ``no_sync``, reduced now (what the end of a
        synchronised backward does); after a synchronised backward there is nothing left to reduce, and nothing
        happens."""
        if self._unreduced:
            self.reducer.finish()

    def _reduced(self) -> None:
        self._unreduced = False

    def zero_grad(self):
        """Gradients to None, as torch does: the first gradient of the next step is copied into its slot
        (cheaper than zeroing every bucket and adding into it); a parameter without one gets zeros."""
        for p in self.params:
            p.grad = None
        self._seen.clear()

    def track_memory(self, ledger):
        """The buckets are the gradients, also between zero_grad and the first hook (when ``p.grad`` is None)."""
        super().track_memory(ledger)
        ledger.track("grads", self.buckets.buffers)

    def reduction_units(self):
        return self.buckets.sizes
