"""What a reading of the committed course found, held: each sentence against the outputs it sits over, each fact
against its source, each table a lesson promises there for a reader without a kernel.

``test_notebooks.py`` checks a lesson's shape; these tests check what particular cells *say*, where a reading
found a sentence the printed numbers contradict or a fact stated too widely. Each reads the committed notebook
(the outputs of a clean run) or the course map, never re-runs a lesson.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
from committed_lessons import _cells, _markdown, _printed, _source  # noqa: F401




# --- lesson 01 ---------------------------------------------------------------------------------------

def test_lesson_01_does_not_promise_the_ring_reduce_scatter_half_the_time():
    """The answer said the ring reduce-scatter's "time follows" its half bytes, over a run that printed 16.1 vs
    24.3 ms "within the noise (±44 %)": bytes are exact, the time is what the run printed."""
    text = _markdown("01_collectives")
    assert "its time follows them" not in text
    answer = text[text.index("Does gloo's reduce-scatter take about half"):]
    assert "Whether its time halves too is this machine's to say" in answer
    sentences = [_printed(c) for c in _cells("01_collectives")
                 if c["cell_type"] == "code" and "zerokit ring's reduce-scatter" in _printed(c)]
    assert sentences and re.search(r"zerokit ring's reduce-scatter [\d.]+ ms, zerokit ring's all-reduce [\d.]+ ms",
                                   sentences[0])


def test_lesson_01_tree_costs_twice_the_ring_bandwidth_on_two_ranks():
    """The tree's `2S/β` was "a little more than the ring's" while the table under it priced the tree at twice the
    ring at N = 2 (58 against 29.6 ms): the prose now says how the gap depends on N."""
    text = _markdown("01_collectives")
    assert "for about `2S/β` of bandwidth, a little more than the ring's" not in text
    assert "twice the ring's `2(N−1)/N·S/β` at N = 2" in text
    table = next(_printed(c) for c in _cells("01_collectives")
                 if c["cell_type"] == "code" and "all_reduce_seconds(bucket_bytes" in _source(c))
    row = next(line.split() for line in table.splitlines() if line.split()[:1] == ["2"])
    ring_total, tree_total = float(row[-2].replace(",", "")), float(row[-1].replace(",", ""))
    assert tree_total > 1.5 * ring_total


# --- lesson 05 ---------------------------------------------------------------------------------------

def test_lesson_05_timeline_gives_each_run_its_scale_and_says_how_the_steps_compare():
    """zero2-naive's step was a fifth of a shared axis and the 4× was not said: each panel now has its own
    axis, its title its step's length, and a sentence under the picture compares the two steps' times."""
    cells = _cells("05_zero2")
    timeline = next(c for c in cells if c["cell_type"] == "code" and "course.timeline_figure(pair" in _source(c))
    assert "shared_axis=False" in _source(timeline)
    printed = _printed(timeline)
    step = r"ZeRO-2's step \(steps 1–3, median\)"
    assert re.search(step + r" [\d.]+ ms, the naive version's [\d.]+ ms: "
                     r"(" + step + r" was (slower|faster), by [\d.]+×|within the noise)", printed)


# --- lesson 08 ---------------------------------------------------------------------------------------

def test_lesson_08_teaches_both_forms_of_the_bubble_and_says_which_is_which():
    """The bubble was taught only as (p − 1)/(m + p − 1) "as GPipe and Megatron say"; Megatron (Narayanan et al.
    2021) states (p − 1)/m of the ideal time, (p − 1)/(v·m) interleaved."""
    text = _markdown("08_pipeline_parallel")
    assert "as GPipe and Megatron say" not in text
    assert "`(p − 1)/m`" in text and "Megatron's form" in text and "GPipe's form" in text
    assert "`(p − 1)/(v·m)` of the ideal time" in text
    table = next(_printed(c) for c in _cells("08_pipeline_parallel")
                 if c["cell_type"] == "code" and "FORMULA = " in _source(c))
    assert "÷ ideal time (simulated · Megatron's (p − 1)/(v·m))" in table and "0.3750 · 0.3750" in table  # 3/8


def test_lesson_08_check_holds_each_schedule_to_its_own_formula():
    """The check printed "the formula holds" for every schedule, though interleaved and ZB-H1 have their own."""
    cells = _cells("08_pipeline_parallel")
    mark = next(i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and "**Check yourself.**" in _source(c))
    question, check = " ".join(_source(cells[mark]).split()), _printed(cells[mark + 1])
    assert "(p − 1)/(v·m + p − 1)` interleaved" in question and "(p − 1)/(3m + p − 1)` ZB-H1" in question
    assert "each against its own formula" in check and "each formula holds" in check
    assert "the formula holds" not in check


# --- lesson 11 ---------------------------------------------------------------------------------------

def test_lesson_11_sends_hsdp_and_hpz_to_lesson_17_where_they_run():
    """11 said zerokit does not run HSDP or hpZ ("planned, not measured"); lesson 17 runs and measures both."""
    text = _markdown("11_putting_it_together")
    assert "planned, not measured" not in text and "do not run these two" not in text
    assert "[lesson 17](17_beyond_one_node.ipynb) runs them on emulated nodes" in text
    closing = _source(_cells("11_putting_it_together")[-1])
    assert "(17_beyond_one_node.ipynb)" in closing.split("**Next:**", 1)[1]


def test_lesson_11_hpz_share_is_the_one_the_planner_prints():
    """hpZ serves every gather after the step's first from its secondary copy: (1 + A)/(3A) of ZeRO-3's crossing
    bytes, as the planner prints — not the 2/3 the prose kept from before gradient accumulation was counted."""
    text = _markdown("11_putting_it_together")
    assert "hpZ sits at 2/3" not in text and "a third of its crossing" not in text
    printed = next(_printed(c) for c in _cells("11_putting_it_together")
                   if c["cell_type"] == "code" and "hpZ ÷ ZeRO-3" in _source(c))
    assert "hpZ ÷ ZeRO-3: 0.375" in printed and "(1 + A)/(3A) of ZeRO-3, 3/8 at A = 8" in text


# --- lesson 16 ---------------------------------------------------------------------------------------

def test_lesson_16_experts_share_is_the_printed_one():
    """16 said the experts were "two thirds" of the tiny MoE GPT's parameters; they are 66,816 of 80,448."""
    assert "two thirds here" not in _markdown("16_mixture_of_experts")
    printed = next(_printed(c) for c in _cells("16_mixture_of_experts")
                   if c["cell_type"] == "code" and "expert_numel = " in _source(c))
    held, total, share = re.search(r"the experts hold ([\d,]+) of the model's ([\d,]+) parameters: (\d+)%",
                                   printed).groups()
    assert round(100 * int(held.replace(",", "")) / int(total.replace(",", ""))) == int(share) > 67


def _panel_table_shown(lesson: str, panel: str, header: str) -> bool:
    cell = next(c for c in _cells(lesson) if c["cell_type"] == "code" and f"course.{panel}(" in _source(c))
    html = [o["data"]["text/html"] for o in cell["outputs"] if "text/html" in o.get("data", {})]
    return any(header in ("".join(h) if isinstance(h, list) else h) for h in html)


def test_the_tables_lessons_16_and_17_promise_are_in_the_saved_notebook():
    """16 ("its table lists…") and 17 ("the table, every block size at once") promised a table that lived only in
    a live widget: the panel's cell now shows it as a static output too."""
    assert _panel_table_shown("16_mixture_of_experts", "MoEPanel", "slots dispatched, all layers (ledger)")
    assert _panel_table_shown("17_beyond_one_node", "QuantizationPanel", "block size · bits")


# --- the path ----------------------------------------------------------------------------------------

def test_the_next_links_walk_every_lesson_from_00():
    """Following each closing cell's first **Next:** link from lesson 00 reaches every lesson (it stopped at 16,
    which pointed back to the map and lesson 12: lesson 17 was never reached)."""
    lessons = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    seen, name = [], lessons[0]
    while name and name not in seen:
        seen.append(name)
        closing = _source(_cells(name)[-1]).split("**Next:**", 1)[1]
        link = re.search(r"\]\((\d\d_\w+)\.ipynb\)", closing)
        name = link.group(1) if link else None
    assert seen == lessons, f"the Next chain stops after {seen[-1]}; never reached: {sorted(set(lessons) - set(seen))}"


# --- lesson 17 ---------------------------------------------------------------------------------------

def test_lesson_17_takes_its_links_from_the_named_systems():
    """17's "a network a few dozen times narrower" (36×) rested on a 100 Gb/s NIC per GPU; a DGX H100 has 400 Gb/s
    per GPU (9×), a DGX A100 200 Gb/s (12×): the lesson shows theory.systems' table and computes its ratios."""
    from zerokit.theory import systems

    text = _markdown("17_beyond_one_node")
    assert "a few dozen times narrower" not in text and "tens of times narrower" not in text
    cell = next(c for c in _cells("17_beyond_one_node") if c["cell_type"] == "code" and "systems.SYSTEMS" in _source(c))
    printed = _printed(cell)
    for s in systems.SYSTEMS.values():
        assert s.title in printed
    for name in ("dgx-a100", "dgx-h100"):
        s = systems.system(name)
        assert f"A {s.title}'s NVLink gives each GPU {s.intra.bandwidth / s.inter.bandwidth:.0f}×" in printed
    assert "LINKS[\"ib-100g\"]" not in "".join(_source(c) for c in _cells("17_beyond_one_node"))


# --- the course map: exercises and glossary ----------------------------------------------------------

def _glossary() -> dict:
    readme = (NOTEBOOKS / "README.md").read_text()
    entries = re.findall(r"^- \*\*(.+?)\*\* — (.+)$", readme[readme.index("## Glossary"):], flags=re.M)
    return dict(entries)


def test_exercise_09_follows_the_lessons_it_needs():
    """Exercise 09 asks for ZeRO-1's bytes, ZeRO-3's bytes and a 1F1B bubble (lessons 04, 06, 08), and was listed
    "after lesson 02"."""
    readme = (NOTEBOOKS / "README.md").read_text()
    after = re.search(r"^\| \[09 predict\]\(\.\./exercises/09_predict\.ipynb\) \| \[(\d\d)\]", readme, flags=re.M)
    assert int(after.group(1)) >= 8, f"exercise 09 listed after lesson {after.group(1)}"
    header = (ROOT / "solutions" / "09_predict.py").read_text().split("\n# %%\n", 1)[0]  # the opening cell
    assert "After lessons 04 (ZeRO-1's bytes), 06 (ZeRO-3's) and 08 (the 1F1B bubble)" in " ".join(
        line.lstrip("# ").strip() for line in header.splitlines())


def test_the_glossary_tells_hsdp_from_hpz_and_gives_both_bubble_forms():
    """The glossary called hpZ "shard within a node, replicate across nodes" — HSDP's layout; hpZ keeps ZeRO-3's 1/N
    shards and adds a secondary copy per node. And the bubble: both the papers' forms, each named."""
    words = _glossary()
    assert "HSDP / hpZ" not in words
    assert "1/s of the model states" in words["HSDP"] and "replicas" in words["HSDP"]
    assert "ZeRO-3's 1/N shards" in words["hpZ"] and "secondary copy" in words["hpZ"]
    assert "replicate across" not in words["hpZ"]
    assert "`(p − 1)/(m + p − 1)` of the step (GPipe's form)" in words["bubble"]
    assert "`(p − 1)/m` of the ideal, bubble-free time (Megatron's form" in words["bubble"]
