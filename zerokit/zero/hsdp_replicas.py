"""HSDP's all-reduce across the replicas: in backward, unit by unit (FSDP2's), or once at the step.

After a unit's reduce-scatter inside the shard group, rank j of every group holds shard j of a sum
over its own s ranks; the r ranks holding shard j all-reduce it over ``dp_replicate`` to complete
the sum over all N. :class:`ReplicaAllReduce` (a mixin of ``hsdp`` and ``hsdp-zero2``) decides
where, by ``replicate_all_reduce`` and ``all_reduce_every_micro_batch``:

- ``"backward"`` (the default, FSDP2's ``foreach_reduce``): in the backward of the step's last
  micro-batch — the one not under ``no_sync`` — each unit's all-reduce is launched asynchronously as
  soon as its reduce-scatter has landed, and is in flight while the rest of backward computes
  (ledger phase ``backward``). The micro-batches under ``no_sync`` are reduce-scattered into the
  shard and not all-reduced (FSDP2's ``set_requires_all_reduce(False)``); the last one all-reduces
  the shard they built up together with its own part, in place: one all-reduce per unit and step.
  With ``all_reduce_every_micro_batch=True`` every micro-batch's backward does it (FSDP2's default
  with no ``set_requires_all_reduce`` at all);
- ``"step"``: once per optimizer step, at ``step()``, every shard before the optimizer reads it
  (ledger phase ``step``, all of it exposed). zerokit's option for a loop that calls backward A
  times without ``no_sync``: each micro-batch is still summed once and all-reduced once.

Each unit's shard is, within a step, empty, *pending* (sums not yet all-reduced) or *all-reduced*.
A pending shard is all-reduced in place. A micro-batch that reaches an all-reduced shard (a second
backward without ``no_sync`` in one step, or every micro-batch) all-reduces its own reduce-scatter
output first and adds it after — asynchronously too, the output counted among the buffers in
flight. A step that finds a shard still pending (every backward ran under ``no_sync``) all-reduces
it there, so no loop leaves the replicas apart. The bytes: :func:`zerokit.theory.hsdp_collective_bytes`
(one all-reduce of every shard per step, A with ``all_reduce_every_micro_batch``).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..strategies.base import Option, boolean
from ..data_parallel.base import one_of
from .sharded import all_reduce_flat

#: where the replicas' all-reduce runs: its option's values
WHERE = ("backward", "step")
EMPTY, PENDING, ALL_REDUCED = "empty", "pending", "all-reduced"

REPLICA_OPTIONS = {
    "replicate_all_reduce": Option("backward", one_of(*WHERE),
                                   "'backward' (FSDP2's: in the last micro-batch's backward, each unit's shard "
                                   "all-reduced asynchronously as its reduce-scatter lands) or 'step' (once, at "
                                   "step(), before the optimizer reads the shards)"),
    "all_reduce_every_micro_batch": Option(False, boolean,
                                           "False (the replicas' all-reduce once per optimizer step: FSDP2's "
                                           "set_requires_all_reduce(False) on the micro-batches under no_sync) or "
                                           "True (after every micro-batch's reduce-scatter: FSDP2's default)"),
}


def check_replica_options(name: str, options: dict) -> None:
    """``all_reduce_every_micro_batch=True`` all-reduces in backward: refused with ``replicate_all_reduce='step'``."""
    if options.get("all_reduce_every_micro_batch") is True and options.get("replicate_all_reduce") == "step":
        raise ValueError(f"strategy {name!r}: all_reduce_every_micro_batch=True all-reduces in every micro-batch's "
                         f"backward, replicate_all_reduce='step' only at the step; allowed: "
                         f"replicate_all_reduce='backward' with either, or 'step' with "
                         f"all_reduce_every_micro_batch=False")


class ReplicaAllReduce:
    """The all-reduce over ``dp_replicate`` of each unit's gradient shard (see the module docstring)."""

    @classmethod
    def resolve_options(cls, options: dict) -> dict:
        resolved = super().resolve_options(options)
        check_replica_options(cls.name, resolved)
        return resolved

    def start_replicas(self) -> None:
        """Every shard empty; the next backward is the step's last unless ``no_sync`` says otherwise."""
        self._replica_state = [EMPTY] * len(self.units)
        self._last_micro_batch = True

    def _all_reduce_replicas(self, tensor: torch.Tensor, tag: str, async_op: bool = False):
        return all_reduce_flat(tensor, self.replicate_group.group, self.opts["algorithm"], async_op, tag)

    @contextmanager
    def no_sync(self):
        """Not the step's last micro-batch: reduce-scattered inside the shard group, not all-reduced across (FSDP2's
        ``set_requires_all_reduce(False)``)."""
        previous, self._last_micro_batch = self._last_micro_batch, False
        try:
            yield
        finally:
            self._last_micro_batch = previous

    def after_reduce_scatter(self, unit, reduced: torch.Tensor, land) -> None:
        """In backward: all-reduce the pending shard after ``land``, or ``reduced`` before it (see the docstring)."""
        i = unit.index
        if self.replicas == 1 or self.opts["replicate_all_reduce"] == "step":
            land()
            self._replica_state[i] = PENDING
            return
        now = self._last_micro_batch or self.opts["all_reduce_every_micro_batch"]
        tag = f"grads {getattr(unit, 'label', unit.index)} replicas"
        if self._replica_state[i] == ALL_REDUCED:
            flight = [reduced]  # the ledger sees it until it has landed
            self._in_flight.append(flight)

            def done():
                land()
                self._in_flight[:] = [f for f in self._in_flight if f is not flight]

            self.reducer.track(self._all_reduce_replicas(reduced, tag, True), 0, done)
        elif now:
            self._replica_state[i] = ALL_REDUCED
            self.reducer.track(self._all_reduce_replicas(land(), tag, True), 0)
        else:
            land()
            self._replica_state[i] = PENDING

    def step(self):
        """All-reduce what is still pending (every shard with ``replicate_all_reduce='step'``), then step."""
        if self.replicas > 1:
            shards = self.gradient_shards()
            pending = [i for i, state in enumerate(self._replica_state) if state == PENDING]
            if self.shard_buffer is not None and len(pending) == len(shards):
                self._all_reduce_replicas(self.shard_buffer, "grads replicas")  # one call for the flat buffer
            else:
                for i in pending:
                    self._all_reduce_replicas(shards[i], f"grads {self._unit_label(i)} replicas")
        self._replica_state = [ALL_REDUCED] * len(self.units)
        super().step()

    def _unit_label(self, index: int) -> str:
        unit = self.units[index]
        return getattr(unit, "label", unit.index)

    def zero_grad(self):
        super().zero_grad()
        self._replica_state = [EMPTY] * len(self.units)
