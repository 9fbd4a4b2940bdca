"""The committed course notebooks: built from their sources, run, clean, shaped as lessons, readable without a kernel.

nbval (``pytest --nbval-lax notebooks/``) re-runs every notebook and fails on any cell
that raises, the assertion cells included. These tests check what nbval does not: that
the committed notebooks are what ``notebooks/build.py`` makes of ``notebooks/src/``, that
they carry the outputs of a clean run and nothing of the machine that ran them, and that
each reads as a lesson (a question first, interview questions last, their answers hidden
in ``<details>``), and that every panel keeps a PNG of its last picture for readers without
a kernel. ``test_notebooks_browser.py`` runs lessons in a real browser.
"""
from __future__ import annotations

import getpass
import importlib.util
import json
import os
import re
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
LESSONS = ["00_first_ranks", "01_collectives", "02_training_memory", "03_data_parallel", "04_zero1", "05_zero2",
           "06_zero3", "07_tensor_parallel", "08_pipeline_parallel", "09_offload", "10_activation_checkpointing",
           "11_putting_it_together", "12_the_interview", "13_own_model", "14_failure_labs",
           "15_context_parallel", "16_mixture_of_experts", "17_beyond_one_node"]
#: a committed notebook stays small enough to read in a diff and to clone
MAX_NOTEBOOK_BYTES = 600_000


def _build_module():
    spec = importlib.util.spec_from_file_location("notebook_build", NOTEBOOKS / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load(name: str) -> dict:
    return json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())


def _source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _output_texts(nb: dict):
    """Every text a reader sees in the outputs: streams, plain text, HTML, errors (images excluded)."""
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            if "text" in output:
                yield "".join(output["text"]) if isinstance(output["text"], list) else output["text"]
            for mime, value in output.get("data", {}).items():
                if mime.startswith("text/"):
                    yield "".join(value) if isinstance(value, list) else value
            if output.get("output_type") == "error":
                yield output.get("evalue", "") + "".join(output.get("traceback", []))


def test_the_course_has_every_lesson_and_only_those():
    assert sorted(p.stem for p in (NOTEBOOKS / "src").glob("*.py")) == LESSONS
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == LESSONS


@pytest.mark.parametrize("name", LESSONS)
def test_notebook_is_built_from_its_source(name):
    build = _build_module()
    expected = build.parse_cells((NOTEBOOKS / "src" / f"{name}.py").read_text())
    nb = _load(name)
    kinds = ["checks" if c["cell_type"] == "code" and c.get("metadata", {}).get("jupyter", {}).get("source_hidden")
             else c["cell_type"] for c in nb["cells"]]
    assert [(kind, _source(c)) for kind, c in zip(kinds, nb["cells"])] == expected, (
        f"notebooks/{name}.ipynb differs from notebooks/src/{name}.py: run `python notebooks/build.py {name[:2]}`")


@pytest.mark.parametrize("name", LESSONS)
def test_notebook_is_committed_with_the_outputs_of_a_clean_run(name):
    nb = _load(name)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1)), "not run top to bottom, once"
    assert not any(o.get("output_type") == "error" for c in code for o in c["outputs"])
    assert sum(1 for c in code for o in c["outputs"] if "image/png" in o.get("data", {})) >= 1, "no picture"
    assert (NOTEBOOKS / f"{name}.ipynb").stat().st_size < MAX_NOTEBOOK_BYTES


@pytest.mark.parametrize("name", LESSONS)
def test_every_panel_keeps_a_picture_of_its_last_run(name):
    """A panel's cell carries a static PNG of what it drew, so the lesson reads without a kernel (GitHub, nbviewer)."""
    nb = _load(name)
    panels = [c for c in nb["cells"] if c["cell_type"] == "code" and re.search(r"course\.\w+Panel\(", _source(c))]
    assert panels, "no interactive panel"
    for cell in panels:
        pictures = [o for o in cell["outputs"] if "image/png" in o.get("data", {})]
        assert pictures, f"{name}: the panel cell {_source(cell)[:60]!r}… has no image/png output (Panel._repr_mimebundle_)"
        assert all("text/plain" in o["data"] for o in pictures)


def _noise_patterns() -> dict:
    patterns = {
        "absolute path": r"(?<![\w.])/(?:home|root|tmp|work|usr|opt|var|Users|private|mnt|srv)/",
        "site-packages": r"site-packages",
        "windows path": r"\b[A-Za-z]:\\\\",
        "ipykernel temp file": r"ipykernel_\d+",
        "process id": r"\bpid\b\s*[=:]?\s*\d+",
        "loopback port": r"127\.0\.0\.1\]?:\d+",
        "memory address": r"\bat 0x[0-9a-f]{6,}",
    }
    host = socket.gethostname()
    if len(host) >= 4:
        patterns["hostname"] = re.escape(host)
    home = os.path.expanduser("~")
    if home not in ("", "/"):
        patterns["home directory"] = re.escape(home)
    user = getpass.getuser()
    if len(user) >= 5:  # short names ("root") are ordinary words
        patterns["user name"] = rf"\b{re.escape(user)}\b"
    return patterns


@pytest.mark.parametrize("name", LESSONS)
def test_committed_notebook_carries_no_machine_specific_noise(name):
    nb = _load(name)
    assert "widgets" not in nb["metadata"], "widget state is machine- and run-specific: build.py strips it"
    assert set(nb["metadata"]) <= {"kernelspec", "language_info"}
    for cell in nb["cells"]:
        assert "execution" not in cell.get("metadata", {}), "execution timestamps"
        for output in cell.get("outputs", []):
            assert "application/vnd.jupyter.widget-view+json" not in output.get("data", {}), "a dangling widget view"
    texts = "\n".join(_output_texts(nb))
    for what, pattern in _noise_patterns().items():
        found = re.search(pattern, texts)
        assert found is None, f"{name}: {what} in the committed outputs: {texts[max(0, found.start() - 60):found.end() + 60]!r}"


def test_the_noise_check_catches_what_it_should():
    sample = "\n".join(["File /tmp/ipykernel_4242/123.py", "/work/main/zerokit/x.py", "pid 1234",
                        "[127.0.0.1]:44458", "<object at 0x7f8ca0605da0>"])
    patterns = _noise_patterns()
    for what in ("absolute path", "ipykernel temp file", "process id", "loopback port", "memory address"):
        assert re.search(patterns[what], sample), what
    assert not re.search(patterns["absolute path"], "per-rank: 2(N−1)/N · S, reduce/scatter")


#: an answer hidden until asked: a <details> block whose summary says "Answer"
_HIDDEN_ANSWER = re.compile(r"<details>\s*<summary>\s*Answer\s*</summary>(?P<answer>.*?)</details>", re.S)


def interview_problems(markdown: str) -> list:
    """What is wrong with a lesson's interview questions: each numbered question must be followed by its
    answer hidden in ``<details><summary>Answer</summary> … </details>``, with nothing of the answer
    visible next to the question (``*Question?* — answer`` is what the check catches)."""
    section = markdown.split("## Interview questions", 1)[1]
    starts = [m.start() for m in re.finditer(r"^[ \t]*\d\. ", section, flags=re.M)]
    items = [section[a:b].strip() for a, b in zip(starts, starts[1:] + [len(section)])]
    problems = [] if 2 <= len(items) <= 3 else [f"{len(items)} numbered questions; a lesson ends with 2-3"]
    for item in items:
        number = item.split(".", 1)[0]
        hidden = _HIDDEN_ANSWER.search(item)
        if hidden is None:
            problems.append(f"question {number}: no <details><summary>Answer</summary> … </details> answer")
            continue
        visible = re.sub(r"\s+", " ", item[:hidden.start()] + item[hidden.end():]).strip()
        if not re.fullmatch(r"\d\. \*[^*]+\?\*", visible):
            problems.append(f"question {number}: visible next to the question, outside <details>: {visible!r}")
        if not hidden.group("answer").strip():
            problems.append(f"question {number}: an empty answer")
    return problems


def test_the_interview_check_catches_a_visible_answer():
    hidden = ("## Interview questions\n\n1. *Why?*\n\n   <details><summary>Answer</summary>\n\n   Because.\n\n"
              "   </details>\n\n2. *How?*\n\n   <details><summary>Answer</summary>\n\n   So.\n\n   </details>\n")
    assert interview_problems(hidden) == []
    visible = hidden.replace("1. *Why?*", "1. *Why?* — because, in plain sight")
    assert any("visible" in p for p in interview_problems(visible))
    bare = "## Interview questions\n\n1. *Why?* — because.\n2. *How?* — so.\n"
    assert len([p for p in interview_problems(bare) if "no <details>" in p]) == 2
    assert interview_problems(hidden.replace("Because.", "")) == ["question 1: an empty answer"]
    assert interview_problems(hidden.split("2.")[0])[0].startswith("1 numbered questions")


@pytest.mark.parametrize("name", LESSONS)
def test_notebook_reads_as_a_lesson(name):
    nb = _load(name)
    cells = nb["cells"]
    if "**Next:**" in _source(cells[-1]) and "## Summary" not in _source(cells[-1]):  # the path onward, its own cell
        cells = cells[:-1]
    first, last = _source(cells[0]), _source(cells[-1])
    assert cells[0]["cell_type"] == "markdown" and first.startswith("# ")
    assert "**The question.**" in first and "?" in first and "**What you will see.**" in first
    assert cells[-1]["cell_type"] == "markdown" and "## Summary" in last and "## Interview questions" in last
    assert interview_problems(last) == [], f"{name}: interview answers must be hidden until asked"
    code = [_source(c) for c in cells if c["cell_type"] == "code"]
    assert any(src.lstrip().startswith(("for ", "assert ")) and "assert" in src for src in code), "no assertion cell"
    assert any(re.search(r"course\.\w+Panel\(", src) for src in code), "no interactive panel"


@pytest.mark.parametrize("name", LESSONS)
def test_every_lesson_is_a_step_on_a_path_with_its_checks_behind(name):
    """The time it takes, what it needs and the questions it answers up front; the exercise and the next lesson at
    the end; a prediction the run reveals; the assertions in collapsed checks cells; tables a reader can take in."""
    cells = _load(name)["cells"]
    markdown = [_source(c) for c in cells if c["cell_type"] == "markdown"]
    opening = " ".join(" ".join(markdown[:2]).split())
    assert all(k in opening for k in ("**Time:**", "**Needs:**", "**After it you can answer:**")), name
    assert re.search(r"\*\*Exercises?:\*\*", _source(cells[-1])) and "**Next:**" in _source(cells[-1]), name
    assert any("predict" in m.lower() and "<details>" in m for m in markdown), f"{name}: no predict-then-run cell"
    hidden = [c for c in cells
              if c["cell_type"] == "code" and c.get("metadata", {}).get("jupyter", {}).get("source_hidden")]
    assert hidden and all("assert" in _source(c) for c in hidden), f"{name}: no collapsed checks cell"
    for cell in cells:
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html", "")
            html = "".join(html) if isinstance(html, list) else html
            for head in re.findall(r"<thead>(.*?)</thead>", html, flags=re.S):
                assert head.count("<th") <= 6, f"{name}: a table of {head.count('<th')} columns"


# --- the path: the map, the closing cells, the checks a learner runs ------------------------------------

EXERCISE_LINK = re.compile(r"\.\./exercises/(\d\d_\w+)\.ipynb")


def _map_rows() -> dict:
    """{lesson: (row text, {exercises it links})} from the README's path table."""
    rows = {}
    for line in (NOTEBOOKS / "README.md").read_text().splitlines():
        m = re.match(r"\| \[[^\]]+\]\((\d\d_\w+)\.ipynb\) \|", line)
        if m and m.group(1) in LESSONS:
            rows[m.group(1)] = (line, set(EXERCISE_LINK.findall(line)))
    return rows


def test_the_map_counts_every_lesson_with_its_needs_and_run_time():
    readme = (NOTEBOOKS / "README.md").read_text()
    words = {17: "Seventeen", 18: "Eighteen"}
    assert f"{words[len(LESSONS)]} lessons" in readme
    rows = _map_rows()
    assert sorted(rows) == LESSONS, "a lesson without its row in the path table"
    for name, (line, _) in rows.items():
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 5, f"{name}: lesson, needs, read and run, question, exercises: {cells}"
        assert re.fullmatch(r"\d+ min \(run \d+ s\)", cells[2]), f"{name}: no run time: {cells[2]!r}"
        assert cells[1], f"{name}: no prerequisites"


def test_every_exercise_follows_one_lesson_and_that_lesson_names_it():
    """Exercise numbers are not lesson numbers: the README's exercise table says which lesson each follows, that
    lesson's row lists it, and the lesson's closing cell links every exercise its row lists."""
    readme = (NOTEBOOKS / "README.md").read_text()
    table = readme[readme.index("## Exercises"):readme.index("## Glossary")]
    follows = {}
    for line in table.splitlines():
        m = re.match(r"\| \[[^\]]+\]\(\.\./exercises/(\d\d_\w+)\.ipynb\) \| \[\d\d\]\((\d\d_\w+)\.ipynb\) \|$", line)
        if m:
            assert m.group(1) not in follows, f"{m.group(1)} listed twice"
            follows[m.group(1)] = m.group(2)
    exercises = sorted(p.stem for p in (ROOT / "exercises").glob("*.ipynb"))
    assert sorted(follows) == exercises, "every exercise follows exactly one lesson in the README's table"
    rows = _map_rows()
    for exercise, lesson in follows.items():
        assert exercise in rows[lesson][1], f"{exercise} follows {lesson}, whose row does not list it"
    for name in LESSONS:
        closing = [c for c in _load(name)["cells"] if c["cell_type"] == "markdown" and "**Next:**" in _source(c)]
        assert closing, f"{name}: no closing cell (**Next:**)"
        named = set(EXERCISE_LINK.findall(_source(closing[-1])))
        assert named == rows[name][1], f"{name}: the closing cell links {sorted(named)}, the map {sorted(rows[name][1])}"


@pytest.mark.parametrize("name", LESSONS)
def test_each_lesson_has_one_visible_check_yourself_cell(name):
    """Besides the collapsed checks, one cell a learner sees and runs: a short printed verdict and its assert."""
    cells = _load(name)["cells"]
    marks = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and "**Check yourself.**" in _source(c)]
    assert len(marks) == 1, f"{name}: {len(marks)} 'Check yourself' cells"
    cell = cells[marks[0] + 1]
    assert cell["cell_type"] == "code" and not cell.get("metadata", {}).get("jupyter", {}).get("source_hidden")
    code = _source(cell)
    assert "assert " in code and "print(" in code and len(code.splitlines()) <= 10, code
    printed = "".join("".join(o.get("text", "")) for o in cell["outputs"] if o.get("output_type") == "stream")
    assert printed.strip(), f"{name}: the check yourself cell printed no verdict"
