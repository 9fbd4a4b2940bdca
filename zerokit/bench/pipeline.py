"""``zerokit bench pipeline``: zerokit's ``pp`` against torch.distributed.pipelining, schedule by schedule.

Each round runs, in rotating order, zerokit's ``pp`` and torch's peer for every schedule both
have (GPipe, 1F1B, interleaved with 2 chunks) on the same tiny GPT, the same stages and the
same micro-batches. Timed runs use ``track_peak=False``; one more run of each with the
memory ledger's hooks gives the peak. Reported per schedule: the median step time of each
(the first step left out), their ratio (zerokit / torch; below 1.0 is faster, paired round
by round), the ratio of peak bytes per rank (the busiest rank), and zerokit's measured bubble next to
the simulated one (t_b = 2·t_f) — on a shared CPU the measured bubble also counts the time
a rank waits for a core.
"""
from __future__ import annotations

import time

from ..pipeline_parallel import measured, schedule as build, simulate
from ..train import train
from ..workloads import tiny_gpt
from . import median, ratio, suite_parser
from .rounds import PEAK_STEPS
from .table import conditions, load_average, machine, ms, noise, progress_log, table

PAIRS = [("gpipe", "torch-pp-gpipe", 1), ("1f1b", "torch-pp-1f1b", 1), ("interleaved", "torch-pp-interleaved", 2)]
GPT = dict(vocab=512, seq_len=64, d_model=128, n_layer=8, n_head=4, batch_size=16)
COLUMNS = [("schedule", "schedule", "s"), ("pp ms", "pp_s", ms), ("torch ms", "torch_s", ms),
           ("time ratio", "time", ".2f"), ("peak ratio", "peak", ".3f"), ("bubble measured", "bubble", ".3f"),
           ("simulated", "simulated", ".3f"), ("IQR/median", "noise", ".2f")]


def run(work, strategy: str, schedule: str, chunks: int, p: int, m: int, steps: int, timeout_s: float,
        track_peak: bool = False) -> dict:
    options = {"schedule": schedule, "chunks": chunks} if strategy == "pp" else {}
    report = train(work, strategy, world_size=p, steps=steps, optimizer="adamw", micro_batches=m, reference=False,
                   timeout_s=timeout_s, track_peak=track_peak, **options)
    result = report.results[0]
    ranks = sorted(result.ranks, key=lambda r: r.coords["pp"])
    times = [max(r.step_times_s[s] for r in ranks) for s in range(1, steps)]
    bubble = None
    if ranks[0].pipeline_spans is not None:
        bubble = measured(build(schedule, p, m, chunks), [r.pipeline_spans for r in ranks]).bubble_fraction
    return {"step_s": median(times), "times": times, "peak": max(r.peak_bytes for r in ranks), "bubble": bubble}


def _noisier(a, b):
    return None if a is None or b is None else max(a, b)


def build_parser():
    parser = suite_parser("pipeline", __doc__, steps=6, rounds=3)
    parser.add_argument("--stages", type=int, default=2, help="pipeline ranks p")
    parser.add_argument("--micro-batches", type=int, default=4)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 2 or args.rounds < 1 or args.stages < 1 or args.micro_batches < 1:
        raise ValueError("--steps must be at least 2, --rounds, --stages and --micro-batches at least 1")
    log = progress_log(args.quiet)
    work, p, m = tiny_gpt(**GPT), args.stages, args.micro_batches
    plan = [(ours, peer, chunks, name) for ours, peer, chunks in PAIRS for name in ("pp", peer)]
    samples: dict = {i: [] for i in range(len(plan))}
    start, start_machine, start_load = time.perf_counter(), machine(), load_average()
    for r in range(args.rounds):
        shift = r % len(plan)
        for i in list(range(len(plan)))[shift:] + list(range(len(plan)))[:shift]:
            sched, _, chunks, name = plan[i]
            samples[i].append(run(work, name, sched, chunks, p, m, args.steps, args.timeout))
            log(f"round {r + 1}/{args.rounds}: {name} {sched}: {1000 * samples[i][-1]['step_s']:.1f} ms")
    peaks = [run(work, name, sched, chunks, p, m, PEAK_STEPS, args.timeout, track_peak=True)["peak"]
             for sched, _, chunks, name in plan]
    rows = []
    for k, (sched, peer, chunks) in enumerate(PAIRS):
        ours, theirs = samples[2 * k], samples[2 * k + 1]
        rows.append({"schedule": sched, "pp_s": median([a["step_s"] for a in ours]),
                     "torch_s": median([b["step_s"] for b in theirs]),
                     "time": median([ratio(a["step_s"], b["step_s"]) for a, b in zip(ours, theirs)]),
                     "peak": ratio(peaks[2 * k], peaks[2 * k + 1]),
                     "bubble": median([a["bubble"] for a in ours]),
                     "simulated": simulate(build(sched, p, m, chunks)).bubble_fraction,
                     "noise": _noisier(noise([t for a in ours for t in a["times"]]),
                                       noise([t for b in theirs for t in b["times"]]))})
    print(f"zerokit bench pipeline — {work.description}; p = {p}, m = {m}, fp32 AdamW, {args.steps} steps × "
          f"{args.rounds} rounds; {start_machine}")
    print(table("", COLUMNS, rows).lstrip("\n"))
    print("(ratios are zerokit / torch, the time ratio paired round by round; peak: the busiest rank's, one run each "
          "with the memory ledger's hooks, apart from the timed runs; IQR/median: the noisier of the two)")
    print(conditions(rows, start_load, lambda r: r["schedule"]))
    print(f"bench finished in {time.perf_counter() - start:.0f} s")
    return 0
