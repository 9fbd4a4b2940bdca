"""``zerokit tour`` end to end, run once (4 steps) for every assertion here: every registered strategy has a
row or a stated reason not to; each of zerokit's rows holds its model states and traffic to the theory to the
byte; a peer's row whose measurement is not the formula's says why, in a note whose bytes close the gap; the
pipeline, grid, offload and checkpointing rows show what they are there to show; every line the tour printed fits
100 columns, DeepSpeed's set-up chatter held back; the table ends by telling the reader where to go next."""
import math
import sys

import pytest

from zerokit import cli, strategies, tour, tour_results

STEPS = 4  # `zerokit tour`'s default: the runs `make tour` just made are read back when the code is the same
WORLD_SIZES = [2, 4]
LR = 1e-3  # the tour's AdamW learning rate
SECTIONS = ["data parallel", "ZeRO-1", "ZeRO-2", "ZeRO-3", "ZeRO++", "HSDP", "tensor parallel", "pipeline",
            "dp×tp grid", "offload", "checkpointing", "context parallel", "expert parallel"]


@pytest.fixture(scope="module")
def ran():
    """The CLI's tour and the results behind it: those `make tour` kept for exactly this code (its source digest), or
    a fresh run."""
    kept = tour_results.kept_results(WORLD_SIZES, STEPS)
    if kept is not None:
        return 0, kept
    captured, original = {}, tour.main

    def keep(*args, **kwargs):
        captured["results"] = original(*args, **kwargs)
        return captured["results"]

    tour.main = keep
    try:
        code = cli.main(["tour", "--steps", str(STEPS)])
    finally:
        tour.main = original
    return code, captured["results"]


def test_every_strategy_has_a_tour_row_or_a_reason():
    in_tour = {row.strategy for row in tour.tour_rows()}
    missing = set(strategies.names()) - in_tour - set(tour.NOT_IN_TOUR)
    assert not missing, f"strategies the tour cannot show: {sorted(missing)}; add a row in zerokit/tour.py"
    assert not in_tour & set(tour.NOT_IN_TOUR)


def test_the_tour_runs_every_section_and_says_where_next(ran, capsys):
    code, results = ran
    assert code == 0
    assert [s for s in SECTIONS if s in {row.section for row, _ in results}] == SECTIONS
    assert {row.world_size for row, _ in results if row.section == "ZeRO-3"} == {2, 4}
    text = tour.table(results, STEPS)
    assert all(f"\n{s}" in "\n" + text for s in SECTIONS)
    assert "make lab" in "\n".join(tour.NEXT) and "zerokit compare" in "\n".join(tour.NEXT)


def test_zerokits_rows_match_the_theory_to_the_byte(ran):
    _, results = ran
    for row, r in results:
        if row.peer:
            continue
        rank0 = r.ranks[0]
        assert sum(rank0.model_state_bytes.values()) == rank0.theory_model_states["total"], row
        for rank in r.ranks:
            assert rank.comm_ring_cost_bytes_per_step == pytest.approx(rank.theory_comm_bytes_per_step, abs=0.5), row


def test_every_row_lands_near_the_single_process(ran):
    """AdamW's step per element is at most lr·(1−β1)/√(1−β2) = 3.16·lr (Kingma & Ba §2.1, since 1−β1 > √(1−β2)),
    so two runs that agree in everything but rounding differ by at most 2·3.16·lr per step. Exact parity, run by
    run, is tested per strategy with SGD (tests/zero/test_zero.py and the others)."""
    _, results = ran
    bound = 2 * LR * (1 - 0.9) / math.sqrt(1 - 0.999) * STEPS
    for row, r in results:
        assert r.max_abs_param_diff is not None and r.max_abs_param_diff <= bound, (row, r.max_abs_param_diff)
        assert all(math.isfinite(x) for x in r.losses)


def test_the_special_rows_show_their_point(ran):
    _, results = ran
    by = {(row.section, row.strategy, row.peer): (row, r) for row, r in results}
    pp_row, pp = by[("pipeline", "pp", False)]
    assert "bubble" in tour._notes(pp_row, pp, STEPS) and "simulated" in tour._notes(pp_row, pp, STEPS)
    grid_row, grid = by[("dp×tp grid", "zero3", False)]
    axes = grid.ranks[0].comm_bytes_by_axis
    assert axes["dp"]["ring_cost_bytes"] == pytest.approx(grid.ranks[0].theory_comm_bytes_by_axis["dp"], abs=0.5)
    assert axes["tp"]["ring_cost_bytes"] == pytest.approx(grid.ranks[0].theory_comm_bytes_by_axis["tp"], abs=0.5)
    for strategy in ("zero2", "zero3"):
        r = next(r for row, r in results if row.section == "offload" and row.strategy == strategy)
        rank0 = r.ranks[0]
        assert sum(rank0.host_model_state_bytes.values()) == rank0.theory_model_states["host"]["total"]
        assert rank0.transfer_bytes_per_step == rank0.theory_transfer_bytes_per_step
    ckpt = [r for row, r in results if row.section == "checkpointing"]
    ddp = next(r for row, r in results if row.strategy == "ddp" and row.world_size == 2 and not row.options)
    for r in ckpt:
        assert r.ranks[0].recomputed_forwards == tour.TOUR_WORKLOAD["n_layer"] * STEPS
        assert r.ranks[0].peak_breakdown["activations"] < ddp.ranks[0].peak_breakdown["activations"]


def test_tour_arguments_are_checked_before_anything_runs(capsys):
    for argv, message in ((["--world-sizes", "1"], "--world-sizes 1"), (["--steps", "0"], "--steps 0"),
                          (["--timeout", "0"], "--timeout 0")):
        assert cli.main(["tour", *argv]) == 2
        assert message in capsys.readouterr().err


def test_every_line_the_tour_printed_fits_a_terminal(ran):
    _, results = ran
    printed = results.printed
    assert any(line.startswith("strategy") for line in printed) and "Where next:" in printed
    too_wide = [line for line in printed if len(line) > tour.WIDTH]
    assert not too_wide, f"{len(too_wide)} lines over {tour.WIDTH} columns, the first: {too_wide[0]!r}"


def test_deepspeeds_set_up_chatter_is_held_back(ran):
    _, results = ran
    chatter = [line for line in results.printed if tour.DEEPSPEED_CHATTER.match(line)
               or "shm_comm_op" in line or "real_accelerator" in line]
    assert not chatter, chatter[:3]
    if results.held:  # said in one line, with the count
        assert any(f"held back: {len(results.held)} lines DeepSpeed's ranks printed" in line
                   for line in results.printed)


def test_the_terminal_holds_deepspeeds_lines_and_passes_the_rest_whole(capsys):
    """DeepSpeed's lines as the ranks printed them in a tour (one an op's build, one its logger's warning), written
    the way the launcher and print() write: several lines at once, and a line in pieces."""
    built = "[r1] DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully"
    warned = ("[r0] [2026-12-06 04:03:47,536] [WARNING] [real_accelerator.py:213:get_accelerator] Setting "
              "accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.")
    failed = "[r0] RuntimeError: DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op failed to build"
    with tour.Terminal() as terminal:
        sys.stdout.write(f"{built}\n[r0] step 1\n")
        sys.stderr.write(warned + "\n")
        print("running: ZeRO-1", flush=True)
        sys.stdout.write("[r1] par")
        sys.stdout.write("tial\n" + failed + "\n")
    out, err = capsys.readouterr()
    assert terminal.held == [built, warned]
    assert terminal.printed == ["[r0] step 1", "running: ZeRO-1", "[r1] partial", failed]
    assert out == "[r0] step 1\nrunning: ZeRO-1\n[r1] partial\n" + failed + "\n" and err == ""


def test_the_layout_column_names_every_axis(ran):
    _, results = ran
    header = tour.table(results, STEPS).splitlines()[0]
    assert "dp×tp×pp×cp×ep" in header
    layouts = {(row.section, row.strategy, row.world_size, row.layout) for row, _ in results}
    assert ("context parallel", "ddp", 2, "1×1×1×2×1") in layouts
    assert ("expert parallel", "zero1", 4, "2×2×1×1×2") in layouts
    assert all(len(row.layout.split("×")) == len(tour.AXES) for row, _ in results)


def test_each_row_whose_measurement_is_not_the_formula_says_why(ran):
    """For every row, every figure that differs from the formula has a "why" note whose bytes — computed from the
    library's behaviour and the row's own ledger — make up the difference: states to the byte, traffic to the
    half byte (a ring cost is a fraction); a |Δp| over lr·steps has a note too."""
    _, results = ran
    text = tour.table(results, STEPS)
    explained = set()
    for row, r in results:
        gap, notes = tour.gaps(row, r, STEPS), {w.figure: w for w in tour.why(row, r, STEPS)}
        if gap["states"]:
            assert "states" in notes, (row, gap)
            assert notes["states"].explained == gap["states"], (row, gap, notes["states"])
        if abs(gap["traffic"]) > 0.5:
            assert "traffic" in notes, (row, gap)
            assert notes["traffic"].explained == pytest.approx(gap["traffic"], abs=0.5), (row, gap, notes["traffic"])
        if gap["|Δp|"]:
            assert "|Δp|" in notes, (row, r.max_abs_param_diff)
        for w in notes.values():
            assert f"why {w.figure}: " + w.text.split()[0] in text
            explained.add(row.strategy)
    assert "zeropp" in explained  # its quantization is more than AdamW's rounding
    if tour._have("deepspeed-zero1"):
        assert {"torch-zero1", "deepspeed-zero1", "deepspeed-zero3"} <= explained


def test_a_failed_run_shows_what_deepspeed_said(capsys):
    built = "[r0] DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully"
    with pytest.raises(RuntimeError, match="rank 0 failed"):
        with tour.Terminal():
            print(built)
            raise RuntimeError("rank 0 failed")
    assert capsys.readouterr().err == built + "\n"  # held while the run went well, out when it failed
