"""The executor: runs any :class:`~.actions.Schedule` on this rank over send/recv on ``pp``.

The schedules are data and know nothing about processes; this is the only pipeline
code that does. Lifecycle:

1. ``Executor(schedule, stages, ...)`` on every rank of a pipeline: this rank's
   :class:`~.partition.Stage` modules (one per chunk), the ``pp`` group, the loss.
2. :meth:`Executor.infer_shapes` once (phase ``setup``): a forward of micro-batch 0
   through the whole pipeline under ``no_grad`` that sends each boundary's shape and
   then the tensor, so every receiver can allocate its buffers (torch's pipelining
   exchanges shapes the same way). The RNG state is restored afterwards.
3. :meth:`Executor.step` per training step: walks this rank's actions in order. ``F``
   runs a stage (the last stage keeps the micro-batch's loss / m on the device; the step's
   loss, their sum, is read to the host once, after the last action), ``B`` is a full
   backward, ``I`` and ``W`` the split one (:mod:`.split_backward`); ``SEND_*`` posts a
   send (waited for at the end of the step) and ``RECV_*`` waits for a receive, each posted
   where :mod:`.p2p_plan` says — grouped with the receives that come before it in the
   rank's one order of messages, always as one ``batch_isend_irecv`` (a single operation
   too), so that every message runs on the group's communicator on both of its ranks and
   NCCL's one stream per communicator cannot deadlock. Two stages on the same rank
   (interleaving on one rank) hand tensors over in memory. Every action is recorded with
   its start and end (``spans``, marks of :mod:`zerokit.runtime.clock`: CUDA events on a
   GPU; :meth:`Executor.timed_spans` reads them as seconds from the step's start): the
   measured timeline has the same shape as :func:`zerokit.simulate`'s.

Traffic is point-to-point only: per boundary per step, m activations forward and m
gradients backward, each ``b·s·h`` elements for a transformer (recorded by the
communication ledger as ``send``/``recv`` on the ``pp`` axis).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Dict, List, Optional

import torch
import torch.nn as nn

from ..runtime import clock, comm
from .actions import Action, Schedule
from .p2p_plan import message_of, posting_plan, receiver_stage
from .split_backward import WeightOutputs, input_backward, weight_backward

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32]


class Executor:
    """One pipeline rank: its stages, and how to run a schedule's actions on them."""

    def __init__(self, schedule: Schedule, stages: Dict[int, nn.Module], pp_rank: int, pp_ranks: List[int],
                 group, loss_fn: Callable, device: torch.device, memory=None):
        self.schedule = schedule
        self.stages = stages
        self.pp_rank = pp_rank
        #: global rank of each pipeline rank (for send/recv)
        self.pp_ranks = pp_ranks
        self.group = group
        self.loss_fn = loss_fn
        self.device = device
        self.memory = memory
        self.last_stage = schedule.stages - 1
        self.shapes: Dict[int, tuple] = {}  # stage s -> (shape, dtype) of its output
        self.split = schedule.splits_backward
        self.weight_outputs = {s: WeightOutputs(m) for s, m in stages.items()} if self.split else {}
        #: (action, start, end) of every action of the last step, seconds from the step's start
        #: the last step's actions as (action, start mark, end mark) (:meth:`timed_spans` reads them)
        self.spans: List[tuple] = []
        self._t0 = None
        self._local: Dict[tuple, torch.Tensor] = {}
        #: what to post at each send/receive action (p2p_plan), and the messages received and not yet taken
        self._plan = posting_plan(schedule, pp_rank)
        self._inbox: Dict[tuple, tuple] = {}

    # -- shapes -------------------------------------------------------------------------
    def _peer(self, stage: int) -> int:
        return self.pp_ranks[self.schedule.rank_of(stage)]

    def _local_to(self, stage: int) -> bool:
        return self.schedule.rank_of(stage) == self.pp_rank

    def infer_shapes(self, first_input: torch.Tensor) -> None:
        """Every boundary's shape and dtype, by one forward through the pipeline (see the docstring)."""
        # the shape pass draws no numbers the step would: every RNG it could touch (the CPU's, this rank's GPU's) is
        # restored after it
        cuda = [self.device.index if self.device.index is not None else torch.cuda.current_device()] \
            if self.device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=cuda), comm.phase("setup"):
            x = None
            for s in range(self.schedule.stages):
                if s in self.stages:
                    if s == 0:
                        x = first_input
                    elif not self._local_to(s - 1):
                        header = torch.zeros(9, dtype=torch.int64, device=self.device)
                        comm.recv(header, self._peer(s - 1), self.group, tag=f"shape {s - 1}")
                        shape = tuple(int(d) for d in header[1:1 + int(header[0])])
                        x = torch.empty(shape, dtype=_DTYPES[int(header[8])], device=self.device)
                        self.shapes[s - 1] = (shape, x.dtype)
                        comm.recv(x, self._peer(s - 1), self.group, tag=f"shape {s - 1}")
                    x = self.stages[s](x)
                    self.shapes[s] = (tuple(x.shape), x.dtype)
                    if s < self.last_stage and not self._local_to(s + 1):
                        if x.dim() > 7:
                            raise ValueError(f"pipeline stage {s} outputs a {x.dim()}-d tensor; at most 7 dims")
                        header = torch.zeros(9, dtype=torch.int64, device=self.device)
                        header[0] = x.dim()
                        header[1:1 + x.dim()] = torch.tensor(x.shape, device=self.device)
                        header[8] = _DTYPES.index(x.dtype)
                        comm.send(header, self._peer(s + 1), self.group, tag=f"shape {s}")
                        comm.send(x.contiguous(), self._peer(s + 1), self.group, tag=f"shape {s}")

    def timed_spans(self) -> List[tuple]:
        """The last step's actions as (action, start, end) in seconds from the step's start (after the step:
        on a GPU this waits for the events)."""
        t0 = clock.seconds(self._t0)
        return [(a, clock.seconds(start) - t0, clock.seconds(end) - t0) for a, start, end in self.spans]

    # -- one step -----------------------------------------------------------------------
    def step(self, micro: List[tuple]) -> Optional[float]:
        """Run this rank's actions for one step on its micro-batches ``[(inputs, targets), …]``;
        returns the step's loss on the rank holding the last stage (None elsewhere)."""
        m = self.schedule.micro_batches
        if len(micro) != m:
            raise ValueError(f"the schedule has {m} micro-batches, the step got {len(micro)}")
        self._micro = micro
        self._stash: Dict[tuple, dict] = {}
        self._sends: list = []
        self.spans = []
        self._losses: List[torch.Tensor] = []  # the last stage's loss / m per micro-batch, on the device
        self._t0 = clock.mark()
        actions = self.schedule.actions[self.pp_rank]
        for i, a in enumerate(actions):
            start = clock.mark()
            if i in self._plan:  # a send or receive: post what the plan groups here (p2p_plan: NCCL's order)
                self._post(self._plan[i])
            if a.kind in self._RECV:
                self._take(a)
            elif a.kind not in self._SEND:
                self._run(a)
            self.spans.append((a, start, clock.mark()))
            if self.memory is not None:
                self.memory.sample(f"pipeline {a}")
        for work in self._sends:
            work.wait()
        self._sends = []
        if self._stash:
            raise RuntimeError(f"pipeline rank {self.pp_rank}: the schedule left {sorted(self._stash)} without "
                               f"a finished backward")
        if self.last_stage not in self.stages:
            return None
        loss = 0.0  # read once, after the step: summed in micro-batch order, as Python floats
        for value in torch.stack(self._losses).tolist():
            loss += value
        self._losses = []
        return loss

    def _run(self, a: Action) -> None:
        kind = a.kind
        if kind == "F":
            self._forward(a)
        elif kind == "B":
            self._backward(a, full=True)
        elif kind == "I":
            self._backward(a, full=False)
        elif kind == "W":
            entry = self._entry(a)
            weight_backward(entry.pop("pending"), entry["root"], entry["root_grad"],
                            self.weight_outputs[a.stage].orphans)
            self._stash.pop((a.stage, a.micro))

    def _entry(self, a: Action) -> dict:
        return self._stash.setdefault((a.stage, a.micro), {})

    def _forward(self, a: Action) -> None:
        entry = self._entry(a)
        if a.stage == 0:
            x = self._micro[a.micro][0]
        else:
            x = entry.get("input")
            if x is None:  # the previous stage is on this rank: handed over in memory
                x = self._local.pop(("F", a.stage - 1, a.micro)).detach()
            if x.is_floating_point():
                x.requires_grad_(True)
        entry["input"] = x
        kept = self.weight_outputs[a.stage].capture() if self.split else None
        watch = self.memory.watch_activations() if self.memory is not None else nullcontext()
        with comm.phase("forward"), watch:
            out = self.stages[a.stage](x)
            if a.stage == self.last_stage:
                loss = self.loss_fn(out, self._micro[a.micro][1]) / self.schedule.micro_batches
                self._losses.append(loss.detach())  # no host read here: that would drain the stream
                out = loss
        if self.split:
            self.weight_outputs[a.stage].stop()
            entry["kept"] = kept
        entry["output"] = out
        if a.stage < self.last_stage and self._local_to(a.stage + 1):
            self._local[("F", a.stage, a.micro)] = out

    def _backward(self, a: Action, full: bool) -> None:
        entry = self._entry(a)
        root = entry.pop("output")
        grad = None
        if a.stage < self.last_stage:
            grad = entry.pop("grad", None)
            if grad is None:
                grad = self._local.pop(("B", a.stage + 1, a.micro))
        x = entry["input"]
        with comm.phase("backward"):
            if full:
                torch.autograd.backward(root, grad)
                input_grad = x.grad if (a.stage > 0 and x.requires_grad) else None
                self._stash.pop((a.stage, a.micro))
            else:
                result = input_backward(root, grad, x if a.stage > 0 else None, entry.pop("kept"))
                input_grad = result["input_grad"]
                entry.update(pending=result["pending"], root=root, root_grad=grad)
                entry.pop("input", None)
        if a.stage > 0:
            if self._local_to(a.stage - 1):
                self._local[("B", a.stage, a.micro)] = input_grad
            else:
                entry["input_grad"] = input_grad
                self._stash[(a.stage, a.micro)] = entry  # kept until SEND_B

    # -- point to point: as p2p_plan says, so that NCCL's one stream per communicator cannot deadlock ------------
    _SEND = ("SEND_F", "SEND_B")
    _RECV = ("RECV_F", "RECV_B")

    def _post(self, group: list) -> None:
        """Post a plan's group — receives posted early, then possibly this action's send — as one
        ``batch_isend_irecv``, a single operation too: on NCCL a lone isend / irecv would run on the pair's own
        communicator while its peer posts the same message in a batch, on the group's, and neither would finish.
        Received messages wait in the inbox for their RECV."""
        ops, receiving, sending = [], [], []
        for kind, message in group:
            what = "activation" if message[0] == "F" else "gradient"
            if kind == "send":
                send = Action(message[1], "SEND_F" if message[0] == "F" else "SEND_B", message[2])
                entry = self._entry(send)
                tensor = entry["output"].detach() if message[0] == "F" else entry.pop("input_grad")
                ops.append(("send", tensor.contiguous(), self._peer(receiver_stage(message)), f"{what} {send}"))
                sending.append((send, what))
            else:
                recv = Action(receiver_stage(message), "RECV_F" if message[0] == "F" else "RECV_B", message[2])
                # an activation has the sending stage's output shape; a gradient the receiving stage's output shape
                shape, dtype = self.shapes[message[1] if message[0] == "F" else recv.stage]
                buffer = torch.empty(shape, dtype=dtype, device=self.device)
                ops.append(("recv", buffer, self._peer(message[1]), f"{what} {recv}"))
                receiving.append((message, buffer))
        with comm.phase("forward" if group[-1][1][0] == "F" else "backward"):
            works = comm.batch_isend_irecv(ops, self.group)
        self._sends += [work for op, work in zip(ops, works) if op[0] == "send"]
        for send, what in sending:
            self._sent(send, what)
        for (message, buffer), work in zip(receiving, [w for op, w in zip(ops, works) if op[0] == "recv"]):
            self._inbox[message] = (buffer, work)

    def _take(self, a: Action) -> None:
        """A RECV: wait for its message (posted by now, here or earlier) and hand it to the stage. From a stage on
        this rank nothing crosses: the forward or backward finds the tensor in memory."""
        message = message_of(a)
        if self._local_to(message[1]):
            return
        buffer, work = self._inbox.pop(message)
        with comm.phase("forward" if a.kind == "RECV_F" else "backward"):
            work.wait()
        self._entry(a)["input" if a.kind == "RECV_F" else "grad"] = buffer

    def _sent(self, a: Action, what: str) -> None:
        entry = self._stash.get((a.stage, a.micro))
        if entry is not None and what == "gradient" and "pending" not in entry and "output" not in entry:
            self._stash.pop((a.stage, a.micro))  # a full backward's entry ends with its SEND_B
