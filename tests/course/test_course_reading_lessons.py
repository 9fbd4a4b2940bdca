"""What a reading of lessons 00, 02–04, 06, 07, 09, 10 and 12–15 found, held: each sentence against the outputs it
sits over, each fact against its source (the papers, torch's and DeepSpeed's code), each quote of the seed in
English first with the original beside it.

Like ``test_course_reading.py`` (the other lessons), these tests read the committed notebook (the outputs of a
clean run) or the lesson's source, never re-run a lesson; where a sentence states how torch behaves, the test
asks the installed torch.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
from committed_lessons import _cells, _markdown, _printed, _source  # noqa: F401
CJK = re.compile(r"[\u4e00-\u9fff]")




def _code_cell(name: str, marker: str) -> dict:
    """The one code cell of a lesson whose source holds ``marker``."""
    found = [c for c in _cells(name) if c["cell_type"] == "code" and marker in _source(c)]
    assert len(found) == 1, (name, marker, len(found))
    return found[0]


def _html_rows(html: str) -> list:
    """A rendered table's body rows, each a list of its cells' text."""
    body = html.split("<tbody>", 1)[1] if "<tbody>" in html else html
    return [[re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, flags=re.S)]


# --- lesson 03 ---------------------------------------------------------------------------------------

def test_lesson_03_says_torchs_small_bucket_is_the_first_reduced():
    """03 said the exposed last bucket "is why torch lets you make the first buckets small": torch's 1 MiB bucket
    (``_DEFAULT_FIRST_BUCKET_BYTES``) is bucket 0 after the rebuild — the last layers' gradients, reduced first —
    so communication starts early; it does not shrink the last bucket."""
    text = _markdown("03_data_parallel")
    assert "it is why torch lets you make the first buckets small" not in text
    assert "`torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB" in text
    assert "the last layers' gradients, which backward computes first and which are reduced first" in text
    assert "communication starts sooner; the exposed last bucket keeps its 25 MiB" in text
    assert "`DDP_SET_LAST_BUCKET_CAP=1`" in text


def test_torch_ddp_caps_its_first_rebuilt_bucket_with_the_last_layers_as_lesson_03_says():
    """The installed torch, asked: with the default bucket_cap_mb the rebuilt bucket 0 is the small one and holds
    the last layer's parameters; a bucket_cap_mb given caps every bucket alike (no small first bucket)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    assert dist._DEFAULT_FIRST_BUCKET_BYTES == 1 << 20
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        def buckets(**options):
            torch.manual_seed(0)
            model = nn.Sequential(*[nn.Linear(300, 300) for _ in range(8)])  # 361,200 B of weight + bias each
            names = {id(p): n for n, p in model.named_parameters()}
            ddp = nn.parallel.DistributedDataParallel(model, **options)
            for _ in range(2):  # the first iteration records the gradients' order; its end rebuilds the buckets
                ddp(torch.randn(4, 300)).sum().backward()
            return [(b.buffer().numel() * 4, {names[id(p)].split(".")[0] for p in b.parameters()})
                    for b in ddp.reducer._get_zeros_like_grad_buckets()]

        default = buckets()
        first_bytes, first_layers = default[0]
        assert first_bytes <= 3 * 361_200 < (1 << 20) + 361_200  # filled up to the 1 MiB cap: three layers
        assert first_layers == {"7", "6", "5"}  # the last layers: backward computes them first
        assert all(size > first_bytes for size, _ in default[1:])  # the later buckets are the 25 MiB ones
        given = buckets(bucket_cap_mb=1)
        assert [layers for _, layers in given][0] == {"7", "6", "5"} and len(given) == 3  # every bucket ≤ 1 MiB
    finally:
        dist.destroy_process_group()


def test_lesson_03_exposed_time_behind_the_link_follows_the_printed_split():
    """03 called ddp-bucketed's exposed time "about the link's time per step (103 ms)" over a table splitting it
    into 66.1 ms and 45.9 ms of "straggler wait" (the emulated peer's sleep): the sentence now quotes the table's
    split, its sum, and says why behind an emulated link a straggler wait can be the link."""
    text = _markdown("03_data_parallel")
    assert "its exposed time is about the link's time per step" not in text
    table = _printed(_code_cell("03_data_parallel", 'columns = ("in flight ms", "exposed − wait ms"'))
    row = next(r for r in _html_rows(table) if r and r[0] == "ddp-bucketed, 1gbe")
    wire, waited = float(row[3]), float(row[5])  # run, step ms, in flight, exposed − wait, held, straggler wait
    sentence = _printed(_code_cell("03_data_parallel", "display(course.timeline_figure("))
    m = re.search(r"blocked time into ([\d.]+) ms once both ranks had launched and ([\d.]+) ms of straggler wait: "
                  r"([\d.]+) ms a step, (about|more than|less than) the link's ([\d.]+) ms per step", sentence)
    assert m, sentence
    assert (float(m.group(1)), float(m.group(2))) == (wire, waited)
    assert abs(float(m.group(3)) - (wire + waited)) < 0.051
    links = _printed(_code_cell("03_data_parallel", "link_ms = {"))
    gbe = next(r for r in _html_rows(links) if r and r[0] == "1gbe")
    assert float(m.group(5)) == float(gbe[-1])
    if waited > 0:
        assert "waiting for the emulated wire, not for the peer's compute" in sentence


def test_lesson_03_link_table_lists_the_named_links_once_with_their_old_names():
    """The table loops over the named systems' links (zerokit.theory.systems): one row each, the two aliases
    named beside the link they stand for, and the prose says the links that hold are printed above it."""
    from zerokit.runtime.link import ALIASES
    from zerokit.theory import systems

    rows = _html_rows(_printed(_code_cell("03_data_parallel", "link_ms = {")))
    names = [r[0] for r in rows]
    expected = [name + (f" (or {old})" if (old := {v: k for k, v in ALIASES.items()}.get(name)) else "")
                for name in systems.LINKS]
    assert names == expected + ["this machine"]
    text = _markdown("03_data_parallel")
    assert "the links printed under the table" not in text and "the links printed above the table" in text
    assert "`zerokit.theory.systems`, the table the planner reads too" in text


# --- lesson 06 ---------------------------------------------------------------------------------------

def test_lesson_06_t5_3b_is_impossible_only_without_offload():
    """06 said "T5-3B at 4.3 GB is impossible" while proposing the optimizer on the host for GPT-2 in the same
    paragraph: ZeRO-Offload leaves a GPU its 16-bit parameter shard, and the offloaded plan fits."""
    text = _markdown("06_zero3")
    assert "T5-3B at 4.3 GB is impossible: its model states alone take more" not in text
    assert "T5-3B at 4.3 GB is impossible **without offload**" in text
    assert "So T5-3B cannot train under ZeRO-3 alone in 4.3 GB per GPU" in text
    printed = _printed(_code_cell("06_zero3", 'for checkpointing, offload in (("none", "none")'))
    rows = {(r[0], r[1]): r for r in _html_rows(printed)}
    offloaded = rows[("t5-3b", "checkpointing full, optimizer offloaded")]
    assert float(offloaded[2]) < 4.3 and float(offloaded[-1]) < 4.3  # the states, and the whole plan
    assert float(rows[("t5-3b", "checkpointing full")][2]) > 4.3
    assert re.search(rf"the whole plan comes to {float(offloaded[-1]):.2f} GB: it fits in 4.3 GB", printed)


def test_lesson_06_says_how_much_of_the_exposed_time_the_link_held_from_the_table():
    """06 said without prefetch the exposed time was "most of it emulated held" over a table where the hold was
    about half: the share is now computed from the table's two columns and worded by its size."""
    from zerokit.course.claims import share_words

    text = _markdown("06_zero3")
    assert 'most of it "emulated held"' not in text
    table = _printed(_code_cell("06_zero3", "one block's all-gather holds the link"))
    rows = [r for r in _html_rows(table) if r and r[0].startswith("prefetch=")]
    share = {}
    for label in ("prefetch=False, 1gbe", "prefetch=True, 1gbe"):
        mine = [r for r in rows if r[0] == label]  # run, rank, step ms, exposed ms, emulated held ms, straggler wait
        share[label] = sum(float(r[4]) for r in mine) / sum(float(r[3]) for r in mine)
    sentence = _printed(_code_cell("06_zero3", "link_stats = {"))
    m = re.search(r"was (most of|about half of|part of|almost none of) the exposed time \((\d+)% over both ranks",
                  sentence)
    assert m, sentence
    assert abs(int(m.group(2)) / 100 - share["prefetch=False, 1gbe"]) < 0.02  # the table rounds to 0.1 ms
    near = share["prefetch=False, 1gbe"]
    assert m.group(1) in {share_words(min(1.0, max(0.0, near + d))) for d in (-0.02, 0, 0.02)}  # words by the size


# --- lesson 12 ---------------------------------------------------------------------------------------

def test_lesson_12_t5_3b_verdict_names_offload():
    """12's verdict said "t5-3b impossible": only under ZeRO-3 alone; the table gains the offloaded plan and the
    verdict says it fits with the optimizer on the host (ZeRO-Offload, lesson 09)."""
    printed = _printed(_code_cell("12_the_interview", "offloaded_plans = {"))
    rows = {r[0]: r for r in _html_rows(printed)}
    assert float(rows["t5-3b"][3]) > 4.3 and float(rows["t5-3b"][5]) < 4.3  # states alone; offloaded, the whole plan
    verdicts = _printed(_code_cell("12_the_interview", "course.show(markdown_table(claims))"))
    line = next(x for x in verdicts.splitlines() if x.startswith("| GPT-2 1.5B ZeRO-3 4.1 GB × 8"))
    assert "t5-3b impossible under ZeRO-3 alone, possible with the optimizer offloaded (ZeRO-Offload)" in line
    assert "[lesson 09](09_offload.ipynb)" in line


def test_lesson_12_names_the_bubbles_form_and_the_planners_link_table():
    """The one-page answer gave the bubble as (p − 1)/(m + p − 1) without saying of what; the link figures now come
    from zerokit/theory/systems.py (the planner's default system), not zerokit/planner/cluster.py."""
    text = _markdown("12_the_interview")
    assert "`(p − 1)/(m + p − 1)` of the step — `(p − 1)/m` of the ideal time" in text
    assert "`zerokit/planner/cluster.py`" not in text and "`zerokit/theory/systems.py`" in text


# --- the seed's quotes: English first, the original beside it -------------------------------------------

MINE = ["00_first_ranks", "02_training_memory", "03_data_parallel", "04_zero1", "06_zero3", "07_tensor_parallel",
        "09_offload", "10_activation_checkpointing", "12_the_interview", "13_own_model", "14_failure_labs",
        "15_context_parallel"]


def _paragraphs(name: str) -> list:
    lines = [line[2:] if line.startswith("# ") else line.lstrip("#") if line.startswith("#") else line
             for line in (NOTEBOOKS / "src" / f"{name}.py").read_text().splitlines()]
    return [" ".join(block.split()) for block in "\n".join(lines).split("\n\n")]


@pytest.mark.parametrize("name", MINE)
def test_every_quote_of_the_seed_gives_the_english_first(name):
    """Lessons 00, 02, 04, 09 and 10 opened their quotes with the Chinese (*"…"* — then the English); as lessons 03,
    06 and 12, each quote is now the English, then the original in its own quotation marks or parentheses."""
    for paragraph in _paragraphs(name):
        if not CJK.search(paragraph):
            continue
        assert not re.search(r'\*"[^"*]*[\u4e00-\u9fff]', paragraph), f"{name}: the original first: {paragraph[:160]!r}"
        bare = re.sub(r"“[^”]*”", "", paragraph)
        bare = re.sub(r"\((?:[^()]|（[^（）]*）)*\)", "", bare)
        assert not CJK.search(bare), f"{name}: a quote without its English beside it: {paragraph[:160]!r}"
        first_original = min(paragraph.find(m) for m in ("“", "(") if m in paragraph)
        assert re.search(r"[A-Za-z]{3,}(?:\W+[A-Za-z]{2,}){3,}", paragraph[:first_original]), paragraph[:160]


@pytest.mark.parametrize("name", ["00_first_ranks", "02_training_memory", "04_zero1"])
def test_a_lesson_that_opens_on_the_seed_links_its_introduction(name):
    assert "[docs/seed.md](../docs/seed.md)" in _source(_cells(name)[0])


# --- lesson 02 ---------------------------------------------------------------------------------------

def test_lesson_02_shows_the_step_counters_and_both_deepspeed_estimators():
    """The bytes-per-parameter column printed 12 for bf16's optimizer (12.004: the answer's "last digits", Adam's
    step counters, hidden by four significant figures); "DeepSpeed's estimator counts 18" is its ZeRO-3 one —
    its ZeRO-2 estimator, 2Ψ + 18Ψ/N, keeps the 16-bit and the fp32 gradients, 20 at one GPU."""
    states = _printed(_code_cell("02_training_memory", 'runs = {precision: zerokit.train(work, "ddp"'))
    assert "12.004" in states and "8.004" in states
    rows = {r[0]: float(r[1]) for r in _html_rows(_printed(_code_cell("02_training_memory", "estimated = {")))}
    assert sorted(rows.values()) == [16, 18, 20]
    assert any("ZeRO-2" in who and per == 20 for who, per in rows.items())
    text = _markdown("02_training_memory")
    assert "DeepSpeed's own memory estimator counts **18** bytes per parameter" not in text
    assert "both gradient copies, **20** bytes per parameter on one GPU" in text


# --- lessons 04, 09, 10 -------------------------------------------------------------------------------

def test_lesson_04_summary_does_not_call_the_papers_form_exact():
    """The summary said 4Ψ + 12Ψ/N was "measured to the byte": the bytes equal zerokit's exact figure (padding,
    step scalars), and the paper's form to within 1 % (lesson 04's own prose and checks)."""
    text = _markdown("04_zero1")
    assert "per rank in mixed precision, measured to the byte" not in text
    assert "the paper's form, within 1 % of the measured bytes" in text


def test_lesson_09_does_not_type_the_for_loops_slowdown():
    """The interview answer said a non-vectorised Adam "takes several times" a fused kernel's time; the ratio is
    this machine's (the table beside it), so the answer says it can, and points at the table."""
    text = _markdown("09_offload")
    assert "threads) takes several times a fused kernel's time" not in text
    assert "can take several times a fused kernel's time (the AdamW table above compares the two" in text


def test_lesson_10_counts_from_the_run_where_the_smaller_model_paid_more():
    """10 said the panel's smaller model "shows a larger ratio" than the larger one, over a table where every_k's
    did not (1.409 against 1.449); the sentence under the table now counts the policies from the run."""
    text = _markdown("10_activation_checkpointing")
    assert "shows a larger ratio than the larger model's" not in text and "measured on 2 shared cores" not in text
    cell = _code_cell("10_activation_checkpointing", "larger_on_small = [")
    rows = [r for r in _html_rows(_printed(cell)) if len(r) == 5 and r[0] != "none"]
    larger = [r[0] for r in rows if float(r[4]) > float(r[2])]
    m = re.search(r"paid the larger ratio to `none` for (\d+) of the (\d+) policies", _printed(cell))
    assert m and int(m.group(2)) == len(rows)
    assert abs(int(m.group(1)) - len(larger)) <= sum(1 for r in rows if abs(float(r[4]) - float(r[2])) < 0.01)


# --- lessons 07, 13, 14, 15 ---------------------------------------------------------------------------

def test_lesson_07_answer_cites_the_bars_for_the_bytes_only():
    """Its answer cited "the bars" for the activations sequence parallelism saves: the bars show bytes per layer,
    the same with and without; the saved activations are Korthikanti et al.'s, not measured here."""
    text = _markdown("07_tensor_parallel")
    assert "activations and compute (the bars)" not in text
    assert "Nothing in bytes (the bars: the same per layer)" in text and "not measured in this lesson" in text


def test_lesson_13_quotes_the_seeds_own_call_and_shows_no_warning():
    """13 put DeepSpeed's docs' `model_engine, optimizer, _, _ = …` in the seed's mouth; the seed writes
    `model = deepspeed.initialize(…)`. And its pipeline cell printed torch's reduce_op FutureWarning from each rank
    (zerokit's walk for torch DDP read obj.__class__ of every live object)."""
    first = " ".join(_source(_cells("13_own_model")[0]).split())
    assert "The seed ([docs/seed.md](../docs/seed.md)) trains with `model = deepspeed.initialize(" in first
    seed = (ROOT.parent / "shared" / "seed" / "000_355f9a282a1d3221.txt")
    if seed.exists():
        assert "model = deepspeed.initialize(model=model,model_parameters=params" in seed.read_text()
    for cell in _cells("13_own_model"):
        for output in cell.get("outputs", []):
            assert "reduce_op" not in "".join(output.get("text", "")), _source(cell)[:80]


def test_lesson_14_names_ncclss_default_and_types_no_machine():
    text = _markdown("14_failure_labs")
    assert "2 shared CPU cores" not in text
    assert "3, the default, tears it down without the abort" in text


def test_lesson_15_gives_the_rings_bytes_as_they_grow_and_types_no_machine():
    """15 said the ring sends "about 6·K_s whatever cp is" over a table of 4 at cp = 2 rising to 5.875 at 32; and its
    sentences spoke of "two shared cores" on any machine."""
    text = _markdown("15_context_parallel")
    assert "about 6·K_s whatever cp" not in text and "about constant in cp" not in text
    assert "4·K_s at cp = 2, rising towards 6·K_s, never falling" in text
    rows = _html_rows(_printed(_code_cell("15_context_parallel", "scaling = []")))
    ring = [float(r[1]) for r in rows]
    assert ring[0] == 4 and ring == sorted(ring) and ring[-1] < 6
    shown = " ".join(_printed(c) for c in _cells("15_context_parallel") if c["cell_type"] == "code")
    assert "two shared" not in shown and "two shared" not in text


def test_lesson_12_one_page_answer_says_what_the_runs_show():
    """The one-page answer said DP's traffic "doesn't grow with" N (it goes from Ψb at N = 2 towards 2Ψb), gave
    Ulysses "cp ≤ heads" (cp must divide them) and had the ring's transfers "overlapped" (lesson 15's run
    shows the waits; the ring posts them so that they can overlap)."""
    text = _markdown("12_the_interview")
    assert "traffic doesn't grow with it" not in text and "stays under `2Ψb` however large N grows" in text
    assert "cp ≤ heads" not in text and "cp must divide the heads" in text
    assert "overlapped with the blocks' compute" not in text
