"""``zerokit plan``: the planner on the command line — flags in, :func:`zerokit.plan` out, as a table or JSON.

Every flag maps onto an argument of :func:`zerokit.planner.plan`; a planner ValueError is
reported against the flag it is about (``zerokit: error: --gpus: …``, exit 2), as every
``zerokit`` command reports bad input.
"""
from __future__ import annotations

import json

from .. import theory
from ..runtime.errors import UsageError
from ..theory import systems
from . import plan
from .layout import ALL_STRATEGIES, from_deepspeed_config

#: a planner error's leading argument name -> the flag that sets it
PLAN_FLAGS = {"params": "--params", "preset": "--preset", "gpus": "--gpus", "gpu_memory": "--gpu-memory",
              "gpus_per_node": "--gpus-per-node", "strategy": "--strategy", "offload": "--offload",
              "tp": "--parallel", "pp": "--parallel", "dp": "--parallel", "parallel": "--parallel",
              "micro_batch_size": "--micro-batch-size", "micro_batches": "--micro-batches",
              "checkpointing": "--checkpointing", "precision": "--precision", "convention": "--convention",
              "layers": "--layers", "hidden": "--hidden", "heads": "--heads", "ffn": "--ffn", "vocab": "--vocab",
              "seq_len": "--seq-len", "DeepSpeed": "--deepspeed-config",
              "zero_optimization": "--deepspeed-config", "train_batch_size": "--deepspeed-config",
              "name": "--preset/--params/--layers", "shard_group": "--shard-group", "cp": "--cp", "ep": "--ep",
              "cp_attention": "--cp-attention", "experts": "--experts", "top_k": "--top-k", "gpu_peak": "--gpu-peak",
              "compute_fraction": "--compute-fraction", "overlap": "--overlap", "virtual_stages": "--virtual-stages",
              "system": "--gpu/--system", "stage_layers": "--stage-layers",
              "first_stage_layers": "--first-stage-layers/--last-stage-layers",
              "last_stage_layers": "--first-stage-layers/--last-stage-layers"}

#: the bandwidth flags, in GB/s, with the Cluster field each sets
BANDWIDTH_FLAGS = (("--intra-bandwidth", "intra_bandwidth"), ("--inter-bandwidth", "inter_bandwidth"),
                   ("--host-bandwidth", "host_bandwidth"))


def _plan_error(message: str) -> str:
    """A planner ValueError prefixed with the flag it is about, when its first word names one."""
    first = message.replace("=", " ").replace(":", " ").replace(".", " ").split()[0] if message else ""
    flag = PLAN_FLAGS.get(first) or ("--intra/inter/host flags" if first.endswith(("bandwidth", "latency")) else "")
    return f"{flag}: {message}" if flag else message


def parse_stage_layers(text: str) -> list:
    """``"7,8x14,7"`` -> ``[7, 8, …, 8, 7]``: layer counts per stage, ``NxK`` for K stages of N layers."""
    counts = []
    for item in str(text).split(","):
        count, sep, times = item.strip().lower().replace("×", "x").partition("x")
        if not count.strip().isdigit() or (sep and not times.strip().isdigit()):
            raise UsageError(f"--stage-layers {text!r}: {item.strip()!r} is not a layer count; expected counts per "
                             f"stage, NxK for K stages of N layers, e.g. 7,8x14,7 (126 layers on pp=16)")
        counts += [int(count)] * (int(times) if sep else 1)
    return counts


def cmd_plan(args) -> int:
    for flag, value in (("--gpus", args.gpus), ("--gpus-per-node", args.gpus_per_node),
                        ("--shard-group", args.shard_group), ("--cp", args.cp), ("--ep", args.ep),
                        ("--experts", args.experts), ("--top-k", args.top_k),
                        ("--micro-batch-size", args.micro_batch_size), ("--micro-batches", args.micro_batches),
                        ("--virtual-stages", args.virtual_stages), ("--first-stage-layers", args.first_stage_layers),
                        ("--last-stage-layers", args.last_stage_layers)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: must be a positive whole number")
    for flag, name in BANDWIDTH_FLAGS:
        value = getattr(args, name)
        if value is not None and not value * 1e9 >= systems.MIN_BANDWIDTH:
            raise UsageError(f"{flag} {value:g}: GB/s per GPU, at least {systems.MIN_BANDWIDTH / 1e9:g} (1 MB/s), "
                             f"e.g. 25 for 200 Gb/s InfiniBand")
    links = {name: value * scale for name, value, scale in (
        ("intra_bandwidth", args.intra_bandwidth, 1e9), ("inter_bandwidth", args.inter_bandwidth, 1e9),
        ("host_bandwidth", args.host_bandwidth, 1e9), ("intra_latency", args.intra_latency, 1e-6),
        ("inter_latency", args.inter_latency, 1e-6)) if value is not None}
    if args.host_memory is not None:
        links["host_memory"] = args.host_memory * 1e9
    if args.deepspeed_config:
        try:  # read once here, so that every error in the file is reported against the flag
            from_deepspeed_config(args.deepspeed_config)
        except ValueError as e:
            raise UsageError(f"--deepspeed-config: {e}") from e
    peak = args.gpu_peak
    try:  # a bare number is TFLOP/s
        peak = float(peak) * 1e12 if peak is not None else None
    except ValueError:
        pass
    step = {k: v for k, v in dict(gpu_peak=peak, compute_fraction=args.compute_fraction, overlap=args.overlap,
                                  virtual_stages=args.virtual_stages).items() if v is not None}
    shape = dict(layers=args.layers, hidden=args.hidden, heads=args.heads, ffn=args.ffn, vocab=args.vocab,
                 seq_len=args.seq_len, tied=True if args.tied else None)
    try:
        result = plan(params=args.params, preset=args.preset, **shape, gpus=args.gpus,
                      gpu_memory=args.gpu_memory, gpus_per_node=args.gpus_per_node,
                      system=args.system or args.gpu, strategy=args.strategy,
                      offload=args.offload, parallel=args.parallel, micro_batch_size=args.micro_batch_size,
                      micro_batches=args.micro_batches, checkpointing=args.checkpointing, precision=args.precision,
                      optimizer=args.optimizer, convention=args.convention, deepspeed_config=args.deepspeed_config,
                      shard_group=args.shard_group, cp=args.cp, ep=args.ep, cp_attention=args.cp_attention,
                      experts=args.experts, top_k=args.top_k,
                      stage_layers=None if args.stage_layers is None else parse_stage_layers(args.stage_layers),
                      first_stage_layers=args.first_stage_layers, last_stage_layers=args.last_stage_layers,
                      sequence_parallel=False if args.no_sequence_parallel else None,
                      fused_attention=True if args.fused_attention else None, **step, **links)
    except ValueError as e:
        message = _plan_error(str(e))
        if message.startswith("--parallel: ") and args.parallel is None:  # the degrees came from --cp / --ep
            message = "--cp/--ep: " + message.removeprefix("--parallel: ")
        raise UsageError(message) from e
    if args.json:
        print(json.dumps(result.to_dict(advice=not args.no_advice), indent=1))
    else:
        print(result.table(advice=not args.no_advice))
    return 0


def add_plan_command(sub):
    """The ``plan`` subcommand on ``zerokit``'s subparsers."""
    plan_ = sub.add_parser("plan", help="what a real model needs per GPU on a cluster, and what it sends per step "
                                        "(computed, nothing runs)")
    model = plan_.add_argument_group("model (one of: --preset, --params, or a shape)")
    model.add_argument("--preset", help="gpt2-1.5b, t5-3b, llama-7b, llama-13b, llama-65b, llama3-8b, llama3-70b, "
                                        "llama3-405b, mixtral-8x7b, gpt3-175b")
    model.add_argument("--params", help="a bare parameter count, e.g. 7.5e9 (model states and dp traffic only)")
    for flag in ("--layers", "--hidden", "--heads", "--ffn", "--vocab", "--seq-len"):
        model.add_argument(flag, type=int)
    model.add_argument("--tied", action="store_true", help="the head shares the token embedding")
    model.add_argument("--experts", type=int, metavar="E", help="a mixture of experts: E experts per layer's MLP")
    model.add_argument("--top-k", type=int, metavar="K", help="with --experts: experts each token is routed to")
    model.add_argument("--fused-attention", action="store_true",
                       help="flash attention: no s×s scores saved (Korthikanti's formula assumes they are)")
    default = systems.SYSTEMS[systems.DEFAULT_SYSTEM]
    cluster = plan_.add_argument_group(
        "cluster", f"built of a named system (default {default.title}: {default.gpu.what}, "
                   f"{default.intra.bandwidth / 1e9:g} GB/s inside a node, {default.inter.bandwidth / 1e9:g} GB/s "
                   f"between nodes); each flag below overrides one of its figures")
    choose = cluster.add_mutually_exclusive_group()
    choose.add_argument("--gpu", metavar="GPU", type=str.lower, choices=list(systems.GPU_SYSTEMS),
                        help="the GPU, its peak, memory and links together: "
                             + ", ".join(f"{g} ({systems.SYSTEMS[s].title})" for g, s in systems.GPU_SYSTEMS.items()))
    choose.add_argument("--system", metavar="NAME", type=str.lower, choices=list(systems.SYSTEMS),
                        help=f"a named system: {', '.join(systems.SYSTEMS)} (zerokit.theory.systems lists each "
                             f"figure with its source)")
    cluster.add_argument("--gpus", type=int, default=8, help="GPUs in all (default 8)")
    cluster.add_argument("--gpu-memory", help=f"per GPU: 80GB, 80GiB, or a bare number in the convention's unit "
                                              f"(default: the system's, {default.gpu.memory / 1e9:g}GB)")
    cluster.add_argument("--gpus-per-node", type=int,
                         help=f"default: the system's, {default.gpus_per_node} (every named system has 8)")
    cluster.add_argument("--intra-bandwidth", type=float, metavar="GB/s",
                         help=f"per GPU each way inside a node (default: the system's, "
                              f"{default.intra.bandwidth / 1e9:g})")
    cluster.add_argument("--inter-bandwidth", type=float, metavar="GB/s",
                         help=f"per GPU between nodes (default: the system's, {default.inter.bandwidth / 1e9:g})")
    cluster.add_argument("--host-bandwidth", type=float, metavar="GB/s",
                         help=f"GPU to host, for offload (default: the system's, {default.host.bandwidth / 1e9:g})")
    cluster.add_argument("--intra-latency", type=float, metavar="µs",
                         help=f"per message inside a node (default: the system's, {default.intra.latency * 1e6:g})")
    cluster.add_argument("--inter-latency", type=float, metavar="µs",
                         help=f"per message between nodes (default: the system's, {default.inter.latency * 1e6:g})")
    cluster.add_argument("--host-memory", type=float, metavar="GB", help="per node, to check offload against")
    lay = plan_.add_argument_group("layout")
    lay.add_argument("--strategy", choices=ALL_STRATEGIES,
                     help="default ddp; hsdp: ZeRO-3 inside a shard group, replicated across (FSDP2's 2-D mesh); "
                          "hpz: ZeRO-3 with a secondary parameter copy inside the group (ZeRO++)")
    lay.add_argument("--shard-group", type=int, metavar="S",
                     help="hsdp/hpz: data-parallel ranks in a shard group (default: those of one node)")
    lay.add_argument("--offload", choices=("none", "optimizer", "params"),
                     help="ZeRO-Offload: the optimizer (zero1-3) or the parameters too (zero3)")
    lay.add_argument("--parallel", metavar="dp=N,tp=N,pp=N", help="degrees multiplying to --gpus (with --cp); an axis "
                                                                  "left out is 1, or for dp the rest (default: all dp)")
    lay.add_argument("--cp", type=int, metavar="N", help="context parallelism: each sequence cut over N ranks "
                                                         "(activations ÷ N; gradients reduced over dp × cp)")
    lay.add_argument("--cp-attention", choices=("ring", "ulysses"),
                     help="with --cp: ring attention (K/V blocks around the ring) or Ulysses (all-to-all to heads); "
                          "default ring")
    lay.add_argument("--ep", type=int, metavar="N", help="expert parallelism: experts spread over N of the dp ranks "
                                                         "(divides dp and the experts)")
    lay.add_argument("--stage-layers", metavar="N,N,…",
                     help="uneven pipeline stages: layers per stage, NxK for K stages of N, e.g. 7,8x14,7 "
                          "(default: layers/pp each)")
    lay.add_argument("--first-stage-layers", type=int, metavar="N",
                     help="uneven pipeline stages as Megatron's --decoder-first-pipeline-num-layers: the first "
                          "stage's layers, the rest even over the stages after it (and --last-stage-layers's)")
    lay.add_argument("--last-stage-layers", type=int, metavar="N",
                     help="the last stage's layers (Megatron's --decoder-last-pipeline-num-layers)")
    lay.add_argument("--micro-batch-size", type=int, help="sequences per GPU per micro-batch (default 1; with --cp "
                                                                    "the cp ranks share them)")
    lay.add_argument("--micro-batches", type=int, help="micro-batches per step (accumulation, pipeline; default 1)")
    lay.add_argument("--checkpointing", default="none", help="none, full, sqrt or every-K (K layers per segment)")
    lay.add_argument("--precision", choices=theory.PRECISIONS, help="default bf16-mixed, as the ZeRO paper")
    lay.add_argument("--optimizer", choices=theory.OPTIMIZERS, help="default adamw")
    lay.add_argument("--no-sequence-parallel", action="store_true", help="with tp > 1: plain tensor parallelism")
    lay.add_argument("--deepspeed-config", metavar="FILE", help="a DeepSpeed config JSON: its ZeRO stage, buckets, "
                                                                "offload, batch and precision")
    step = plan_.add_argument_group("step time (an estimate: compute at a share of peak, exposed traffic, bubble)")
    step.add_argument("--gpu-peak", metavar="GPU|TFLOPS",
                      help="default: the system's GPU (A100: 312); a100, h100, h200, v100, or the dense 16-bit peak in "
                           "TFLOP/s per GPU")
    step.add_argument("--compute-fraction", type=float, metavar="F",
                      help=f"share of that peak while computing, in (0, 1] (default "
                           f"{theory.DEFAULT_COMPUTE_FRACTION:g}: Megatron-LM on A100, within 18 %% of "
                           f"Narayanan et al. 2021 and Korthikanti et al. 2022)")
    step.add_argument("--overlap", choices=theory.OVERLAPS,
                      help="dp (default): data-parallel traffic hidden behind the backward; none: every axis exposed")
    step.add_argument("--virtual-stages", type=int, metavar="V", help="interleaved pipeline: model chunks per stage "
                                                                      "(bubble (p − 1)/(v·m); default 1)")
    plan_.add_argument("--convention", choices=("paper", "deepspeed"), default="paper",
                       help="paper: 16Ψ, K = 12, GB; deepspeed: its estimators' 18 B per parameter, GiB")
    plan_.add_argument("--no-advice", action="store_true", help="leave out the advisor's ranking")
    plan_.add_argument("--json", action="store_true", help="for scripts: per_gpu, terms, traffic, advisor")
    plan_.set_defaults(func=cmd_plan)
    return plan_
