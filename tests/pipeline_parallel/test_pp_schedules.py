"""Pipeline schedules as data, without processes: well-formed, deadlock-free, and idle exactly as derived.

Every builder over a grid of (p, m, v) passes check() and simulate(); the simulated bubble
and peak in flight equal zerokit.theory's formulas (GPipe, 1F1B, interleaved) or the value
the builder's docstring derives (interleaved with m < p, ZB-H1); the compute order equals
torch.distributed.pipelining's own schedules where torch gives it without a process group;
broken schedules are caught.
"""
from types import SimpleNamespace

import pytest

import zerokit
from zerokit import theory
from zerokit.pipeline_parallel import (Action, Schedule, check, draw_schedule, gpipe, interleaved_1f1b,
                                       one_f_one_b, schedule, simulate, zb_h1)

GRID = [(p, m, v) for p in range(1, 7) for m in range(1, 13) for v in range(1, 4) if v == 1 or p > 1]
PM = sorted({(p, m) for p, m, _ in GRID})


def build(name, p, m, v=1):
    return schedule(name, p, m, v if name == "interleaved" else 1)


def zb_h1_bubble(p, m):
    """ZB-H1's bubble with F = I = W, as zb_h1's docstring derives it: idle (p − 1)F, plus (p − m)F when m < p."""
    idle = p - 1 + max(0, p - m)
    return idle / (3 * m + idle)


def compute_strings(s: Schedule):
    return [[str(a) for a in s.compute(r)] for r in range(s.ranks)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved", "zb-h1"])
def test_every_schedule_is_well_formed_and_runs(name):
    for p, m, v in GRID:
        if name != "interleaved" and v > 1:
            continue
        s = build(name, p, m, v)
        check(s)
        result = simulate(s)
        assert (s.ranks, s.micro_batches, s.chunks) == (p, m, v)
        assert len(result.spans) == p and result.makespan > 0
        per_rank = 2 * m * v if not s.splits_backward else 3 * m
        assert [len(row) for row in result.spans] == [per_rank] * p
        assert sum(result.idle_per_rank) == pytest.approx(result.bubble_fraction * p * result.makespan)
        for row in s.actions:  # the IR round-trips through its strings
            assert [Action.parse(str(a)) for a in row] == row


def test_gpipe_and_1f1b_bubble_and_peak_match_theory():
    for p, m in PM:
        for s in (gpipe(p, m), one_f_one_b(p, m)):
            result = simulate(s)  # backward = 2 · forward
            assert result.bubble_fraction == pytest.approx(theory.bubble_fraction(p, m)), (s.name, p, m)
            for f, b in ((1.0, 1.0), (2.0, 3.0)):
                assert simulate(s, f, b).makespan == pytest.approx(theory.pipeline_makespan(p, m, f, b))
        assert simulate(gpipe(p, m)).peak_in_flight == [theory.peak_stashed_microbatches("gpipe", p, m, i)
                                                        for i in range(p)]
        assert simulate(one_f_one_b(p, m)).peak_in_flight == [theory.peak_stashed_microbatches("1f1b", p, m, i)
                                                              for i in range(p)]


def test_interleaved_bubble_matches_theory_and_the_derived_value_for_m_below_p():
    for p, m, v in GRID:
        if v == 1:
            assert compute_strings(interleaved_1f1b(p, m, 1)) == compute_strings(one_f_one_b(p, m))
            continue
        for f, b in ((1.0, 2.0), (1.0, 1.0), (2.0, 3.0)):
            result = simulate(interleaved_1f1b(p, m, v), f, b)
            if m >= p:
                expected = theory.bubble_fraction(p, m, v)
            else:  # GPipe over v·p stages: makespan (m + v·p − 1)(F + B), each rank busy v·m(F + B)
                expected = 1 - v * m * (f + b) / theory.pipeline_makespan(v * p, m, f, b)
            assert result.bubble_fraction == pytest.approx(expected), (p, m, v, f, b)
        if m >= p:  # v chunks shrink the bubble below 1F1B's
            assert simulate(interleaved_1f1b(p, m, v)).bubble_fraction < simulate(one_f_one_b(p, m)).bubble_fraction


def test_zb_h1_is_below_1f1b_at_the_same_peak():
    for p, m in PM:
        z, o = simulate(zb_h1(p, m)), simulate(one_f_one_b(p, m))
        assert z.bubble_fraction == pytest.approx(zb_h1_bubble(p, m)), (p, m)
        if p > 1:
            assert z.bubble_fraction < o.bubble_fraction
        if m >= p:  # a third of 1F1B's idle time
            assert z.makespan - 3 * m == pytest.approx((o.makespan - 3 * m) / 3)
        # counting until W: rank 0 (the fullest) holds what it holds under 1F1B; every rank min(p, m)
        assert z.peak_in_flight[0] == o.peak_in_flight[0] == max(o.peak_in_flight)
        assert max(z.peak_in_flight) == max(o.peak_in_flight)
        assert z.peak_in_flight == [min(p, m)] * p


@pytest.mark.parametrize("f,i,w", [(1, 1, 1), (1, 1.5, 0.5), (1, 0.5, 1.5), (2, 2, 1), (1, 3, 0)])
def test_zb_h1_idle_for_any_split(f, i, w):
    for p in range(2, 6):
        for m in (p, p + 3):
            result = simulate(zb_h1(p, m), f, i + w, w)
            assert result.makespan - m * (f + i + w) == pytest.approx((p - 1) * max(f, i, f + i - w))
            assert result.bubble_fraction == pytest.approx(theory.zb_h1_bubble_fraction(p, m, f, i, w))


def test_simulation_by_hand():
    # GPipe, p = 2, m = 1, F = 1, B = 2: rank 1 runs F [1, 2] and B [2, 4]; rank 0 F [0, 1], B [4, 6]
    result = simulate(gpipe(2, 1))
    assert [[(str(a), s, e) for a, s, e in row] for row in result.spans] == [
        [("0F0", 0, 1), ("0B0", 4, 6)], [("1F0", 1, 2), ("1B0", 2, 4)]]
    assert result.makespan == 6 and result.idle_per_rank == [3, 3] and result.bubble_fraction == 0.5
    # the split: I = backward − weight, W = weight (backward / 2 by default)
    spans = simulate(zb_h1(1, 1), 1, 2, 0.5).spans[0]
    assert [(str(a), s, e) for a, s, e in spans] == [("0F0", 0, 1), ("0I0", 1, 2.5), ("0W0", 2.5, 3)]
    with pytest.raises(ValueError, match="weight"):
        simulate(zb_h1(2, 2), 1, 2, 3)


def test_communication_actions_are_where_the_rules_put_them():
    s = one_f_one_b(3, 2)
    assert [str(a) for a in s.actions[1][:3]] == ["1RECV_F0", "1F0", "1SEND_F0"]
    assert [str(a) for a in s.actions[2][:4]] == ["2RECV_F0", "2F0", "2B0", "2SEND_B0"]
    assert [str(a) for a in s.actions[0][-2:]] == ["0RECV_B1", "0B1"]
    z = zb_h1(2, 1)
    assert [str(a) for a in z.actions[0]] == ["0F0", "0SEND_F0", "0RECV_B0", "0I0", "0W0"]


# --- broken schedules must be caught ---------------------------------------------------------------

def mutate(s: Schedule, rank: int, edit) -> Schedule:
    rows = [list(row) for row in s.actions]
    rows[rank] = edit(rows[rank])
    return Schedule(s.name, s.ranks, s.micro_batches, s.chunks, rows)


def moved(row, action, index):
    """``row`` with ``action`` taken out and put back at ``index`` (counted after taking it out)."""
    row = [a for a in row if a != action]
    return row[:index] + [action] + row[index:]


def test_check_catches_broken_schedules():
    s = one_f_one_b(3, 4)
    cases = {
        "forward before backward": mutate(s, 2, lambda r: moved(r, Action(2, "F", 0), len(r))),
        "no forward": mutate(s, 1, lambda r: [a for a in r if a != Action(1, "F", 3)]),
        "appears twice": mutate(s, 0, lambda r: r + [Action(0, "B", 0)]),
        "belongs to rank 1": mutate(s, 0, lambda r: r + [Action(1, "W", 0)]),
        "has no 0SEND_F0": mutate(s, 0, lambda r: [a for a in r if a != Action(0, "SEND_F", 0)]),
        "receive the activation before": mutate(s, 1, lambda r: moved(r, Action(1, "RECV_F", 2), len(r))),
        "no matching": mutate(s, 2, lambda r: r + [Action(2, "SEND_F", 0)]),
        "micro-batch 4": mutate(s, 0, lambda r: r + [Action(0, "W", 4)]),
    }
    for what, broken in cases.items():
        with pytest.raises(ValueError, match=what):
            check(broken)
    split = zb_h1(2, 2)
    with pytest.raises(ValueError, match="input gradient before weight"):
        check(mutate(split, 1, lambda r: moved(r, Action(1, "W", 0), 0)))
    with pytest.raises(ValueError, match="one full backward"):
        check(mutate(split, 1, lambda r: r + [Action(1, "B", 0)]))


def test_deadlock_names_the_stuck_ranks():
    # rank 0 waits for micro-batch 0's gradient before it sends micro-batch 0's activation
    s = one_f_one_b(2, 2)
    swapped = mutate(s, 0, lambda r: moved(r, Action(0, "SEND_F", 0), r.index(Action(0, "B", 0))))
    check(swapped)
    with pytest.raises(RuntimeError, match=r"deadlocks: rank 0 waits in 0RECV_B0 .*rank 1 waits in 1RECV_F0"):
        simulate(swapped)


def test_an_off_by_one_warmup_changes_what_the_tests_hold():
    # 1F1B with one warm-up forward too many on rank 0: still runs, but holds one micro-batch more
    p, m = 3, 6
    good = one_f_one_b(p, m)
    compute = good.compute(0)
    shifted = compute[:p - 1] + [compute[p - 1], compute[p + 1], compute[p]] + compute[p + 2:]
    from zerokit.pipeline_parallel.schedules import _with_communication
    bad = _with_communication("1f1b", p, m, 1, [shifted] + [good.compute(r) for r in range(1, p)])
    check(bad)
    assert simulate(bad).peak_in_flight[0] == p + 1 != theory.peak_stashed_microbatches("1f1b", p, m, 0)


# --- torch's own orders ------------------------------------------------------------------------

torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")


class _Recorder:
    """A stand-in stage for torch's single-stage runtimes: no communication, records each compute call."""

    def __init__(self, rank, p):
        self.stage_index, self.num_stages, self.is_first, self.is_last = rank, p, rank == 0, rank == p - 1
        self.log = []

    def __getattr__(self, name):
        if name.startswith("get_") and name.endswith("_ops"):
            return lambda *args, **kwargs: []
        raise AttributeError(name)

    def forward_one_chunk(self, mb, *args, **kwargs):
        self.log.append(f"{self.stage_index}F{mb}")

    def backward_one_chunk(self, mb, *args, **kwargs):
        self.log.append(f"{self.stage_index}B{mb}")

    def perform_reduce_grad(self, *args, **kwargs):
        pass


def torch_single_stage_order(cls, p, m):
    """The compute order torch's runtime ``_step_microbatches`` runs on each rank, with recorders for stages.

    Torch's ``Schedule1F1B._get_pipeline_order`` IR is not used: in torch 2.13 it starts the
    last rank at F1 (and lists forwards beyond m when m < p − 1); the runtime is what runs.
    """
    order = []
    for rank in range(p):
        sched = cls.__new__(cls)
        sched._n_microbatches, sched._num_stages, sched._stage = m, p, _Recorder(rank, p)
        sched._loss_fn, sched._internal_losses, sched.scale_grads, sched._has_backward = None, [], False, True
        sched._check_inputs = lambda args, kwargs, targets, losses: ([None] * m, [{}] * m)
        sched._initialize_stage = lambda *args, **kwargs: None
        sched._step_microbatches([None] * m, [{}] * m)
        order.append(sched._stage.log)
    return order


def torch_multi_stage_order(cls, p, m, v):
    """Torch's ``pipeline_order`` for an interleaved class, computed without building stages or a group."""
    rounds = max(1, m // p)
    fake = SimpleNamespace(n_local_stages=v, microbatches_per_round=m // rounds, pp_group_size=p, _n_microbatches=m)
    return [[str(a) for a in cls._calculate_single_rank_operations(fake, r) if a is not None] for r in range(p)]


def _torch_or_skip(fn, *args):
    try:
        return fn(*args)
    except (AttributeError, TypeError) as e:  # torch's private layout changed
        pytest.skip(f"torch's schedule internals differ here: {e}")


def test_1f1b_and_gpipe_equal_torchs_runtime_order():
    for p, m in PM:
        if m < p:  # torch's Schedule1F1B refuses m < p
            continue
        assert compute_strings(one_f_one_b(p, m)) == _torch_or_skip(
            torch_single_stage_order, torch_schedules.Schedule1F1B, p, m), (p, m)
        assert compute_strings(gpipe(p, m)) == _torch_or_skip(
            torch_single_stage_order, torch_schedules.ScheduleGPipe, p, m), (p, m)


def test_interleaved_and_zb_h1_equal_torchs_pipeline_order():
    for p, m, v in GRID:
        if v > 1 and m % max(1, m // p) == 0:  # the m torch's interleaved schedule accepts
            assert compute_strings(interleaved_1f1b(p, m, v)) == _torch_or_skip(
                torch_multi_stage_order, torch_schedules.ScheduleInterleaved1F1B, p, m, v), (p, m, v)
        if v == 1 and m % max(1, m // p) == 0:  # torch's interleaved zero bubble with one chunk is ZB-H1
            assert compute_strings(zb_h1(p, m)) == _torch_or_skip(
                torch_multi_stage_order, torch_schedules.ScheduleInterleavedZeroBubble, p, m, 1), (p, m)


# --- inputs and entry points -------------------------------------------------------------------

@pytest.mark.parametrize("call,name", [
    (lambda: gpipe(0, 4), "p=0"), (lambda: one_f_one_b(2, 0), "m=0"), (lambda: zb_h1(2.0, 4), "p=2.0"),
    (lambda: interleaved_1f1b(2, 4, 0), "v=0"), (lambda: interleaved_1f1b(1, 4, 2), "v=2 needs p >= 2"),
    (lambda: schedule("gpipe", 0, 4), "stages=0"), (lambda: schedule("1f1b", 2, True), "micro_batches=True"),
    (lambda: schedule("interleaved", 4, 8, -1), "chunks=-1"), (lambda: schedule("1f1b", 2, 4, chunks=2), "chunks=2"),
    (lambda: schedule("pipedream", 2, 4), "known: gpipe, 1f1b, interleaved, zb-h1"),
])
def test_bad_inputs_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_entry_points_and_drawing():
    assert zerokit.schedule is schedule and zerokit.simulate is simulate
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    result = simulate(interleaved_1f1b(2, 4, 2))
    fig = draw_schedule(result)
    assert isinstance(fig, Figure) and "bubble" in fig.axes[0].get_title()
    assert {t.get_text() for t in fig.axes[0].texts} >= {"0.0", "3.1"}
    fig = draw_schedule(zb_h1(3, 4), title="zb")  # a Schedule is simulated first
    assert fig.axes[0].get_title() == "zb"
    # a measured run: spans in seconds, any object with .spans
    measured = SimpleNamespace(spans=[[(Action(0, "F", 0), 0.10, 0.12), (Action(0, "B", 0), 0.20, 0.25)],
                                      [(Action(1, "F", 0), 0.12, 0.14), (Action(1, "RECV_B", 0), 0.14, 0.14),
                                       (Action(1, "B", 0), 0.14, 0.19)]])
    fig = Figure()
    ax = fig.add_subplot(1, 1, 1)
    assert draw_schedule(measured, ax=ax) is fig
    assert ax.get_xlim() == pytest.approx((0.10, 0.25))
    with pytest.raises(TypeError, match="spans"):
        draw_schedule(42)
