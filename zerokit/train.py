"""``zerokit.train``: run a workload under a strategy on N ranks and measure everything.

The settings arrive as a :class:`zerokit.config.JobConfig` or as the keywords it is made of, and
:func:`zerokit.job.make_job` checks them before any process starts. On each rank
:func:`zerokit.parallelize.parallelize` lays the model out (tensor, expert, context parallelism,
activation checkpointing, pipeline, then the strategy); :func:`run_rank` keeps the loop and the
measurements. Every strategy goes through the same loop on every rank: zero_grad, then for each of
A micro-batches forward (phase "forward") and backward (phase "backward", under
``no_sync`` for all but the last), then the step (phase "step"). Nothing in a step waits for the device
but the step's end: the micro-batches' losses stay on it and are read to the host once, after the
step (a read per micro-batch would drain the stream between them). The ledgers are read
after the last optimizer step and before the next zero_grad. The single-process
reference runs the same loop on the whole global batch, in this process.
"""
from __future__ import annotations

import importlib
import inspect
import time
import warnings
from contextlib import nullcontext
from typing import Dict, Optional, Union

import torch

from .theory import axes
from .runtime import clock, comm
from .runtime.context import RankContext
from .runtime.memory import MemoryLedger, cuda_peak_bytes, reset_cuda_peak
from .offload.transfers import ledger as transfer_ledger
from .report import RankResult, Report, StrategyResult
from .strategies import TrainConfig, get as get_strategy
from .workloads import Workload
from .api.engine import Engine
from .checkpoint.training import Resumable
from .config import JobConfig
from .job import JOB_OPTIONS, Job, make_job  # noqa: F401 - part of zerokit.train's API
from .pipeline_parallel.options import pipelined
from .pipeline_parallel.strategy import Pipeline
from .parallelize import parallelize
from .context_parallel import layout as cp_layout
from .tensor_parallel import communicated_widths, full_parameters
from .context_parallel.apply import theory_bytes as cp_theory_bytes
from .runtime.timeline import Tracer
from .expert_parallel import gather_experts
from .expert_parallel.apply import moe_layers, routing
from .runtime.launch import check_ranks_per_node, choose_backend, launch
from .runtime.torchrun import rank_device, under_torchrun
from .runtime.link import check_backend


def _to_device(t: torch.Tensor, device, dtype) -> torch.Tensor:
    t = t.to(device)
    return t.to(dtype) if t.is_floating_point() else t


def _local_batch(job: Job, ctx: RankContext, step: int, data_parallel: bool):
    """This rank's micro-batches: its share of the global batch by its ``dp`` coordinate."""
    inputs, targets = job.workload.batch(step)
    n, i = ctx.mesh.size("dp"), ctx.mesh.coord("dp")
    if data_parallel and n > 1:
        per = inputs.shape[0] // n
        inputs = inputs[i * per:(i + 1) * per]
        targets = targets[i * per:(i + 1) * per]
    if ctx.mesh.size("cp") > 1:  # context parallelism: this rank's chunks of every sequence
        inputs, targets = (cp_layout.split(t, ctx.mesh.coord("cp"), ctx.mesh.size("cp")) for t in (inputs, targets))
    a = job.config.micro_batches
    return list(zip(inputs.chunk(a), targets.chunk(a)))


def _full_parameters(strategy, model, ctx: RankContext, tensor_parallel: bool):
    """Every parameter whole: gathered over dp by the strategy, and over tp by the plan's layout."""
    if not tensor_parallel:
        return strategy.full_parameters()
    with getattr(strategy, "gathered", nullcontext)():
        return {name: t.float().cpu() for name, t in full_parameters(model, ctx.mesh.group("tp")).items()}


def _theory_by_axis(job, ctx, strategy, model, psi: int, dtype, steps: int, plan, pipeline) -> dict:
    """What this rank's run used, read into plain numbers for :func:`zerokit.axes.by_axis`: the strategy's
    formula, the plan's widths, each MoE layer's measured split, the attention's and the pipeline's bytes."""
    mesh, b, a = ctx.mesh, torch.empty((), dtype=dtype).element_size(), job.config.micro_batches
    inputs, targets = _local_batch(job, ctx, 0, True)[0]
    terms = {}
    if mesh.size("ep") > 1:
        terms["ep"] = axes.ep_axis_bytes([(*m.exchanged[:2], m.router.in_features, m.exchanged[2])
                                                 for m in moe_layers(model)], b, mesh.size("ep"), steps)
        if mesh.size("edp") > 1:
            terms["edp"] = strategy.theory_expert_comm_bytes()
    if mesh.size("cp") > 1:
        terms["cp"] = cp_theory_bytes(model, mesh.size("cp"), job.cp_attention, inputs.shape[0], inputs.shape[1], b, a)
    if plan is not None:
        computes_loss = pipeline is None or mesh.coord("pp") == mesh.size("pp") - 1
        terms["tp"] = axes.tp_axis_bytes(targets.numel(), communicated_widths(model), mesh.size("tp"), b, a,
                                                plan.loss == "vocab_parallel" and computes_loss)
    if pipeline is not None:
        terms["pp"] = pipeline.theory_pp_bytes(b)
    dp_axis = "dp" if mesh.size("cp") == 1 else "dp_cp"
    out = axes.by_axis(dp_axis, strategy.theory_comm_bytes(psi), **terms)
    carved = getattr(strategy, "theory_comm_bytes_by_axis", None)  # dp carved into axes of its own (hsdp)
    if carved is not None:
        del out[dp_axis]
        out.update(carved())
    return out


def run_rank(ctx: RankContext, job: Job) -> RankResult:
    """Train on this rank and return its measurements."""
    cls = get_strategy(job.strategy)
    dtype = torch.bfloat16 if job.config.precision == "bf16-mixed" else torch.float32
    ctx.set_mesh(job.parallel)
    model = job.workload.build_model().to(ctx.device, dtype)
    psi = sum(p.numel() for p in model.parameters())
    ledger = comm.ledger()
    ledger.reset()
    comm.set_link(job.link)  # None (the reference, or no link=): the backend's own speed
    transfers = transfer_ledger()  # device↔host copies (zerokit.offload), counted apart from the collectives
    transfers.reset()
    tensor_parallel = ctx.mesh.size("tp") > 1 and not cls.own_tensor_parallel
    resumable = None

    def name_whole_model(whole):  # sharded checkpoints name the whole model's tensors before a pipeline splits it
        nonlocal resumable
        resumable = Resumable.for_job(job, ctx, whole)

    done = parallelize(
        model, ctx, loss_fn=job.workload.loss,
        plan=job.workload.tensor_parallel_plan(job.sequence_parallel) if tensor_parallel else None,
        expert_parallel=ctx.mesh.size("ep") > 1,
        seq_len=job.workload.batch(0)[0].shape[1] if ctx.mesh.size("cp") > 1 else None, cp_attention=job.cp_attention,
        checkpointing=job.checkpointing, checkpoint_every=job.checkpoint_every,
        pipeline=job.options if pipelined(cls, ctx) else None, micro_batches=job.config.micro_batches,
        pipeline_driver=getattr(cls, "pipeline_driver", Pipeline),
        strategy=cls, config=job.config, options=job.options, before_pipeline=name_whole_model)
    model, loss_fn, plan, pipeline, strategy = done.model, done.loss_fn, done.plan, done.pipeline, done.strategy
    checkpointing, psi_rank = done.checkpointing, done.parameters_held  # psi_rank: the tp/pp/ep shard this rank holds
    # the public engine a user's own loop drives (zerokit.initialize): one code path for both
    engine = Engine(strategy, job.config.micro_batches, zero_grad_after_step=False)
    memory = MemoryLedger(ctx.device)
    if pipeline is not None:
        pipeline.executor.memory = memory if job.track_peak else None  # its per-action samples cost time
        pipeline.infer_shapes([(_to_device(x, ctx.device, dtype), y) for x, y in
                               _local_batch(job, ctx, 0, cls.data_parallel)])
    strategy.track_memory(memory)
    if job.track_peak:
        memory.instrument(model)
    tracer = None
    if job.keep_records:
        tracer = Tracer(ctx.rank)
        tracer.instrument(model)
    span = tracer.span if tracer is not None else (lambda name: nullcontext())
    # resume_from: this run's layout filled from the checkpoint; the steps before it keep their saved losses
    start, losses = resumable.resume(strategy, engine) if resumable is not None else (0, [])
    memory.reset_peak()  # the ledger's peak and torch's both cover the steps, not the setup
    reset_cuda_peak(ctx.device)
    times = []
    for step in range(start, job.steps):
        comm.set_step(step)
        clock.anchor()  # CUDA: synchronize, and pair the GPU's timeline with perf_counter for this step's marks
        t0 = time.perf_counter()
        engine.zero_grad()
        micro = _local_batch(job, ctx, step, cls.data_parallel)
        step_loss, parts = 0.0, []  # parts: each micro-batch's loss / A, kept on the device until the step is done
        if pipeline is not None:
            # each micro-batch in its own storage, as a loader would hand it over (so the activation ledger,
            # which counts a storage once, sees every in-flight micro-batch's inputs)
            step_loss = pipeline.step(strategy, [(_to_device(x, ctx.device, dtype).clone(), y.to(ctx.device).clone())
                                                 for x, y in micro])
            micro = []
        for x, y in micro:  # the engine runs all but the last micro-batch under no_sync, and divides by their count
            x, y = _to_device(x, ctx.device, dtype), y.to(ctx.device)
            with memory.watch_activations(), span("forward"):
                out = engine(x)
                with comm.phase("forward"):
                    loss = loss_fn(out, y)
            memory.sample("after forward")
            with span("backward"):
                engine.backward(loss)
            parts.append((loss / len(micro)).detach())
        memory.sample("after backward")
        with span("step"):
            if pipeline is not None:
                with comm.phase("step"):
                    strategy.step()
            else:
                engine.step()
        memory.sample("after step")
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        for value in torch.stack(parts).tolist() if parts else ():  # the one host read of the step's losses
            step_loss += value
        times.append(time.perf_counter() - t0)
        losses.append(step_loss)
        if resumable is not None:  # save_dir: every save_every-th step and the last
            resumable.after_step(step, losses)
    comm.set_link(None)  # the gathers below are not training: the backend's own speed
    now = memory.current()
    comm.set_step(job.steps)
    ran = job.steps - start  # the steps this call ran: fewer after resume_from, and the ledgers hold only those
    with comm.phase("setup"):
        params = _full_parameters(strategy, model, ctx, tensor_parallel)
        if ctx.mesh.size("ep") > 1 and params is not None:  # the ep peers' experts too, under the whole model's names
            params = gather_experts(params, model, ctx.mesh, [n for n, _ in job.workload.build_model().named_parameters()])
        if pipeline is not None:
            params = pipeline.full_parameters(params, {id(p): n for n, p in model.named_parameters()})
    memory.remove_hooks()
    if tracer is not None:
        tracer.remove_hooks()
    ledger.resolve()
    theory_by_axis = _theory_by_axis(job, ctx, strategy, model, psi_rank, dtype, ran,
                                     plan if tensor_parallel else None, pipeline)
    payload = ledger.per_step("payload_bytes")
    ring_cost = ledger.per_step("ring_cost_bytes")
    sent = ledger.per_step("sent_bytes")
    calls = ledger.calls_per_step()
    by_axis = {axis: {k: (None if v is None else v / ran) for k, v in row.items()}
               for axis, row in ledger.by_axis().items()}
    return RankResult(
        rank=ctx.rank, losses=losses, step_times_s=times,
        model_state_bytes={k: now[k] for k in ("params", "grads", "optimizer")},
        host_model_state_bytes={k: now[f"host_{k}"] for k in ("params", "grads", "optimizer")},
        transfer_bytes_per_step=transfers.bytes_per_step(ran),
        transfer_copies_per_step=transfers.copies_per_step(ran),
        theory_transfer_bytes_per_step=strategy.theory_transfer_bytes(),
        memory_bytes=now, peak_bytes=memory.peak_total, peak_breakdown=memory.peak_breakdown,
        peak_where=memory.peak_where, peak_by_category=dict(memory.peak_by_category),
        cuda_peak_bytes=cuda_peak_bytes(ctx.device), allocator_at_peak=memory.allocator_at_peak,
        allocator_gap_max=memory.allocator_gap_max, allocator_gap_where=memory.allocator_gap_where,
        comm_payload_bytes_per_step=sum(payload.values()) / ran,
        comm_ring_cost_bytes_per_step=sum(ring_cost.values()) / ran,
        comm_sent_bytes_per_step=None if None in sent.values() else sum(sent.values()) / ran,
        comm_bytes_by_axis=by_axis, coords=ctx.mesh.coords,
        comm_calls_per_step=sum(calls.values()) / ran,
        comm_summary=ledger.summary(),
        comm_records=ledger.to_list() if job.keep_records else None,
        trace=tracer.events() if tracer is not None else None,
        theory_model_states=strategy.theory_model_states(psi_rank).as_dict(),
        theory_comm_bytes_per_step=sum(theory_by_axis.values()),
        theory_comm_bytes_by_axis=theory_by_axis,
        params=params if ctx.rank == 0 else None,
        pipeline_spans=pipeline.spans() if pipeline is not None else None,
        param_count=psi,
        recomputed_forwards=checkpointing.recomputed_forwards if checkpointing is not None else 0,
        routing=_routing(model),
    )


def _routing(model) -> Optional[dict]:
    return routing(model) if moe_layers(model) else None


# --- the parent side --------------------------------------------------------------------

def reference_device(backend: Optional[str] = None, world_size: int = 1) -> torch.device:
    """Where the reference runs: on the ranks' kind of device, so that parity compares the same kernels — the
    first GPU when the ranks run on NCCL (one GPU each), else the CPU. Under torchrun every worker computes
    the reference itself, on its own GPU (``cuda:LOCAL_RANK``): the world may span nodes, and the first GPU
    is another worker's."""
    if under_torchrun():
        return rank_device(backend)[1]
    return torch.device("cuda", 0) if choose_backend(backend, world_size) == "nccl" else torch.device("cpu")


def run_reference(job: Job, device: Optional[torch.device] = None) -> RankResult:
    """The single-process reference: the same loop on the whole global batch, in this process, on ``device``
    (None: the CPU; :func:`reference_device` says where a job's ranks would run)."""
    ref = Job(job.workload, "single", job.steps, TrainConfig(job.config.precision, job.config.optimizer, 1),
              track_peak=job.track_peak, checkpointing=job.checkpointing, checkpoint_every=job.checkpoint_every)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_rank(RankContext(0, 1, device or torch.device("cpu"), "none"), ref)
    finally:
        torch.set_num_threads(threads)


def run_job(job: Job, world_size: int, reference: Optional[RankResult] = None,
            backend: Optional[str] = None, timeout_s: float = 300.0,
            heartbeat_s: Optional[float] = None, ranks_per_node: Optional[int] = None) -> StrategyResult:
    if job.strategy == "single":
        ranks = [run_reference(job, reference_device(backend, world_size))]
    else:
        for module in get_strategy(job.strategy).preload:  # inherited by forked ranks (spawned ones import again)
            with warnings.catch_warnings():  # torch's own deprecation notices from its compiler stack's imports
                warnings.simplefilter("ignore", DeprecationWarning)
                importlib.import_module(module)
        if job.link is not None:  # refused on NCCL before any rank starts
            check_backend(job.link, choose_backend(backend, world_size))
        ranks = launch(run_rank, world_size, job, backend=backend, timeout_s=timeout_s, heartbeat_s=heartbeat_s,
                       ranks_per_node=ranks_per_node)
    return StrategyResult.from_ranks(job, ranks, reference)


def train(workload: Union[Workload, JobConfig], strategy: str = "ddp", world_size: int = 2, steps: int = 10,
          precision: str = "fp32", optimizer: str = "adamw", lr: float = 1e-3, micro_batches: int = 1,
          reference: bool = True, backend: Optional[str] = None, timeout_s: float = 300.0,
          track_peak: bool = True, keep_records: bool = False, parallel: Optional[Dict[str, int]] = None,
          sequence_parallel: bool = False, checkpointing: str = "none", checkpoint_every: Optional[int] = None,
          link=None, save_dir: Optional[str] = None, save_every: Optional[int] = None,
          resume_from: Optional[str] = None, heartbeat_s: Optional[float] = None,
          ranks_per_node: Optional[int] = None, **options) -> Report:
    """Train ``workload`` with ``strategy`` on ``world_size`` ranks; measure ledgers and parity.

    ``parallel={"dp": …, "cp": …, "tp": …, "pp": …}`` lays the ranks out on a device mesh (degrees
    multiplying to ``world_size``; default: every rank on ``dp``). With ``cp`` above 1 each rank
    holds zig-zag chunks of every sequence and attention runs across them (``cp_attention="ring"``
    or ``"ulysses"``, :mod:`zerokit.context_parallel`); the weights' gradients are reduced over dp × cp. With ``tp`` above 1 the
    model is split by the workload's tensor-parallel plan before the strategy runs on
    ``dp`` (``sequence_parallel=True`` also shards the LayerNorm regions along the sequence).
    ``checkpointing`` (``none``, ``every``, ``every_k`` with ``checkpoint_every``, ``sqrt``,
    ``selective``, ``torch-every``, ``torch-selective``) recomputes the blocks' activations in
    backward (:mod:`zerokit.activation_checkpointing`); the reference checkpoints the same way.
    ``link`` (``"nvlink"``, ``"pcie"``, ``"ib-100g"``, ``"10gbe"``, ``"1gbe"``, ``"this machine"``/None, or a
    :class:`zerokit.Link`) holds each collective's completion until an emulated α-β link has
    carried its bytes (:mod:`zerokit.runtime.link`); the collectives still run for real. Two tiers,
    ``"nvlink/10gbe"``: a collective inside a node on the first, one across nodes on the second; the
    nodes are torchrun's, or ``ranks_per_node`` ranks each (ranks 0…k−1 on node 0, …) emulated here.
    ``save_dir`` (with ``save_every``: after every k-th step, and after the last) writes sharded
    checkpoints ``save_dir/step-NNNNNN``; ``resume_from`` (a checkpoint, or a ``save_dir``: its
    latest) continues one in this run's layout, which may differ, up to ``steps`` counted from
    the beginning (:mod:`zerokit.checkpoint.training`). ``heartbeat_s`` (see :func:`zerokit.launch`): fail as
    soon as no rank has entered, waited in or left a collective for that long, instead of waiting out
    ``timeout_s`` on a deadlock.

    ``train(config)`` takes the same settings as one :class:`zerokit.config.JobConfig` (parallel dims,
    precision, schedule, memory savers); only ``reference``, ``backend``, ``timeout_s``,
    ``heartbeat_s`` and ``ranks_per_node`` go beside it.

    Returns a :class:`Report` with per-rank memory and communication ledgers, losses,
    step times and the largest parameter difference from the single-process reference.
    """
    keywords = dict(strategy=strategy, world_size=world_size, steps=steps, precision=precision, optimizer=optimizer,
                    lr=lr, micro_batches=micro_batches, track_peak=track_peak, keep_records=keep_records,
                    parallel=parallel, sequence_parallel=sequence_parallel, checkpointing=checkpointing,
                    checkpoint_every=checkpoint_every, link=link, save_dir=save_dir, save_every=save_every,
                    resume_from=resume_from)
    if isinstance(workload, JobConfig):
        defaults = inspect.signature(train).parameters
        given = [k for k, v in keywords.items() if v != defaults[k].default] + list(options)
        if given:
            raise TypeError(f"train(config, …): the JobConfig holds the job's settings; {', '.join(given)} given "
                            f"too (only reference, backend, timeout_s, heartbeat_s and ranks_per_node go beside it)")
        config = workload
    else:
        config = JobConfig.from_keywords(workload, options=options, **keywords)
    job = make_job(config)
    world_size = config.parallel.world_size
    check_ranks_per_node(ranks_per_node, world_size)  # before the reference and any rank start
    ref = run_reference(job, reference_device(backend, world_size)) if reference else None
    result = run_job(job, world_size, ref, backend=backend, timeout_s=timeout_s, heartbeat_s=heartbeat_s,
                     ranks_per_node=ranks_per_node)
    return Report([result], reference=ref)
