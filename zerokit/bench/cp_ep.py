"""``zerokit bench cp_ep``: context and expert parallelism against torch's and DeepSpeed's layers, pair by pair.

Three pairs, each the same tiny GPT, the same data and the same gradient reductions (zerokit's ``ddp``),
differing only in the layer under test:

- **ring** (``parallel={"cp": 2}``, ``cp_attention="ring"``): zerokit's ring attention
  (:mod:`zerokit.context_parallel.ring_attention`: point-to-point sends, an explicit online softmax)
  against torch's (``torch-ring``: ``_templated_ring_attention`` with the CPU flash kernel, blocks
  passed by all-to-all; torch's public ``context_parallel`` does not run on the CPU, README, peers);
- **ulysses** (``parallel={"cp": 2}``, ``cp_attention="ulysses"``): zerokit's Ulysses attention
  (:mod:`zerokit.context_parallel.ulysses`) against DeepSpeed's ``DistributedAttention``
  (``deepspeed-ulysses``);
- **moe** (``parallel={"dp": 2, "ep": 2}``, top-1, dropless): zerokit's ``MoEMLP`` (uneven all-to-all
  of the routed rows) against DeepSpeed's ``MOELayer`` (``deepspeed-moe``: an ``[E, C, d]`` buffer
  padded to the largest expert count, even all-to-alls). One sequence per rank per step, so
  DeepSpeed's layer runs once per layer and step, as in its own use (its load-balancing loss is
  per call).

Each round runs the four configurations in rotating order; timed runs use ``track_peak=False``,
one more run of each with the memory ledger's hooks gives the peak. Reported per pair: the median
step time of each (the first step left out; the slowest rank's), their ratio (zerokit / peer,
below 1.0 is faster, paired round by round), the ratio of peak bytes per rank, and the bytes per
step each sends on the pair's axis (cp or ep, rank 0's ledger).
"""
from __future__ import annotations

import time

from ..peers.deepspeed_ulysses import deepspeed_available
from ..train import train
from ..workloads import tiny_gpt
from . import median, ratio, suite_parser
from .rounds import PEAK_STEPS
from .table import conditions, load_average, machine, ms, noise, progress_log, table

#: pair -> (zerokit's strategy, the peer, mesh, option, the axis whose bytes are reported, the GPT)
PAIRS = {
    "ring": ("ddp", "torch-ring", {"cp": 2}, {"cp_attention": "ring"}, "cp",
             dict(vocab=512, seq_len=256, d_model=128, n_layer=4, n_head=4, batch_size=4)),
    "ulysses": ("ddp", "deepspeed-ulysses", {"cp": 2}, {"cp_attention": "ulysses"}, "cp",
                dict(vocab=512, seq_len=256, d_model=128, n_layer=4, n_head=4, batch_size=4)),
    "moe": ("ddp", "deepspeed-moe", {"dp": 2, "ep": 2}, {}, "ep",
            dict(vocab=512, seq_len=128, d_model=128, n_layer=4, n_head=4, batch_size=2, n_experts=4, top_k=1)),
}
COLUMNS = [("pair", "pair", "s"), ("peer", "peer", "s"), ("zerokit ms", "ours_s", ms), ("peer ms", "peer_s", ms),
           ("time ratio", "time", ".2f"), ("peak ratio", "peak", ".3f"), ("axis", "axis", "s"),
           ("zerokit axis KiB", "ours_kib", ".1f"), ("peer axis KiB", "peer_kib", ".1f"),
           ("IQR/median", "noise", ".2f")]


def run(pair: str, strategy: str, steps: int, timeout_s: float, track_peak: bool = False) -> dict:
    _, _, parallel, options, axis, gpt = PAIRS[pair]
    report = train(tiny_gpt(**gpt), strategy, world_size=2, steps=steps, optimizer="adamw", reference=False,
                   timeout_s=timeout_s, track_peak=track_peak, parallel=parallel, **options)
    ranks = report.results[0].ranks
    times = [max(r.step_times_s[s] for r in ranks) for s in range(1, steps)]
    return {"step_s": median(times), "times": times, "peak": max(r.peak_bytes for r in ranks),
            "axis_bytes": ranks[0].comm_bytes_by_axis.get(axis, {}).get("ring_cost_bytes")}


def _noisier(a, b):
    return None if a is None or b is None else max(a, b)


def build_parser():
    parser = suite_parser("cp_ep", __doc__, steps=6, rounds=3)
    parser.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), default=list(PAIRS))
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 2 or args.rounds < 1:
        raise ValueError("--steps must be at least 2, --rounds at least 1")
    pairs = [p for p in args.pairs if deepspeed_available() or not PAIRS[p][1].startswith("deepspeed")]
    if pairs != args.pairs:
        print(f"zerokit bench cp_ep: deepspeed is not installed; left out: "
              f"{', '.join(p for p in args.pairs if p not in pairs)} (pip install deepspeed)")
    if not pairs:
        return 1
    args.pairs = pairs
    log = progress_log(args.quiet)
    plan = [(pair, name) for pair in args.pairs for name in PAIRS[pair][:2]]
    samples: dict = {i: [] for i in range(len(plan))}
    start, start_machine, start_load = time.perf_counter(), machine(), load_average()
    for r in range(args.rounds):
        shift = r % len(plan)
        for i in list(range(len(plan)))[shift:] + list(range(len(plan)))[:shift]:
            pair, name = plan[i]
            samples[i].append(run(pair, name, args.steps, args.timeout))
            log(f"round {r + 1}/{args.rounds}: {pair}: {name}: {1000 * samples[i][-1]['step_s']:.1f} ms")
    peaks = [run(pair, name, PEAK_STEPS, args.timeout, track_peak=True)["peak"] for pair, name in plan]
    rows = []
    for k, pair in enumerate(args.pairs):
        ours, theirs = samples[2 * k], samples[2 * k + 1]
        rows.append({"pair": pair, "peer": PAIRS[pair][1], "ours_s": median([a["step_s"] for a in ours]),
                     "peer_s": median([b["step_s"] for b in theirs]),
                     "time": median([ratio(a["step_s"], b["step_s"]) for a, b in zip(ours, theirs)]),
                     "peak": ratio(peaks[2 * k], peaks[2 * k + 1]), "axis": PAIRS[pair][4],
                     "ours_kib": ours[0]["axis_bytes"] / 1024, "peer_kib": theirs[0]["axis_bytes"] / 1024,
                     "noise": _noisier(noise([t for a in ours for t in a["times"]]),
                                       noise([t for b in theirs for t in b["times"]]))})
    print(f"zerokit bench cp_ep — 2 ranks, fp32 AdamW, {args.steps} steps × {args.rounds} rounds; {start_machine}")
    for pair in args.pairs:
        ours, peer, parallel, options, _, gpt = PAIRS[pair]
        print(f"  {pair}: {ours} vs {peer}, parallel={parallel}{', ' + str(options) if options else ''}, "
              f"tiny_gpt({', '.join(f'{k}={v}' for k, v in gpt.items())})")
    print(table("", COLUMNS, rows).lstrip("\n"))
    print("(ratios are zerokit / peer, the time ratio paired round by round; peak: the busiest rank's, one run "
          "each with the memory ledger's hooks, apart from the timed runs; axis KiB: bytes sent per step on the "
          "pair's axis, rank 0's ledger; IQR/median: the noisier of the two)")
    print(conditions(rows, start_load, lambda r: r["pair"]))
    print(f"bench finished in {time.perf_counter() - start:.0f} s")
    return 0
