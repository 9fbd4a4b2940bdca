"""The committed course notebooks: built from their sources, run, clean, shaped as lessons — and one in a real browser.

nbval (``pytest --nbval-lax notebooks/``) re-runs every notebook and fails on any cell
that raises, the assertion cells included. These tests check what nbval does not: that
the committed notebooks are what ``notebooks/build.py`` makes of ``notebooks/src/``, that
they carry the outputs of a clean run and nothing of the machine that ran them, and that
each reads as a lesson (a question first, interview questions last, their answers hidden
in ``<details>``), and that every panel keeps a PNG of its last picture for readers without
a kernel. The browser tests open a lesson in JupyterLab in headless Chromium, run it, move
a panel's slider and check that the figure changes: lesson 03's bucket size, lesson 08's
micro-batches.
"""
from __future__ import annotations

import contextlib
import getpass
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
LESSONS = ["00_first_ranks", "01_collectives", "02_training_memory", "03_data_parallel", "04_zero1", "05_zero2",
           "06_zero3", "07_tensor_parallel", "08_pipeline_parallel", "09_offload", "10_activation_checkpointing",
           "11_putting_it_together", "12_the_interview", "13_own_model", "14_failure_labs"]
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
    assert [(c["cell_type"], _source(c)) for c in nb["cells"]] == expected, (
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
    first, last = _source(cells[0]), _source(cells[-1])
    assert cells[0]["cell_type"] == "markdown" and first.startswith("# ")
    assert "**The question.**" in first and "?" in first and "**What you will see.**" in first
    assert cells[-1]["cell_type"] == "markdown" and "## Summary" in last and "## Interview questions" in last
    assert interview_problems(last) == [], f"{name}: interview answers must be hidden until asked"
    code = [_source(c) for c in cells if c["cell_type"] == "code"]
    assert any(src.lstrip().startswith(("for ", "assert ")) and "assert" in src for src in code), "no assertion cell"
    assert any(re.search(r"course\.\w+Panel\(", src) for src in code), "no interactive panel"


# --- a real browser ---------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _browser_missing() -> str | None:
    if CHROMIUM is None:
        return "Chromium is not installed (Debian: apt-get install -y chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install playwright; it drives the system Chromium)"
    if shutil.which("jupyter-lab", path=str(Path(sys.executable).parent)) is None and \
            importlib.util.find_spec("jupyterlab") is None:
        return "jupyterlab is not installed (pip install jupyterlab)"
    return None


@pytest.fixture
def jupyterlab(tmp_path):
    """JupyterLab on loopback, serving a copy of the notebooks; always stopped."""
    root = tmp_path / "course"
    shutil.copytree(NOTEBOOKS, root, ignore=shutil.ignore_patterns("src", "build.py", ".ipynb_checkpoints"))
    port, token = _free_port(), "zerokit-browser-test"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_PLATFORM_DIRS": "1"}
    env.pop("JUPYTER_PATH", None)
    log = open(tmp_path / "jupyterlab.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited early:\n{(tmp_path / 'jupyterlab.log').read_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.3)
        else:
            pytest.fail("JupyterLab did not start listening within 90 s")
        yield url, token, tmp_path
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            server.wait(timeout=10)
        log.close()


#: the src of the last widget image in the notebook: the panel's picture (a new blob URL at every redraw)
_LAST_IMAGE_JS = "([...document.querySelectorAll('.jp-OutputArea-output img.widget-image')].pop() || {src: ''}).src"


def _accept_dialogs(page, wait_s: float = 3.0) -> None:
    """Accept any modal dialog JupyterLab shows (kernel selection), with its default button."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        button = page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept")
        if button.count():
            button.first.click()
            deadline = time.monotonic() + wait_s
        page.wait_for_timeout(250)


def _figure_source(page) -> str:
    return page.evaluate(f"() => {_LAST_IMAGE_JS}")


def _run_all_in_lab(page, url: str, token: str, notebook: str) -> None:
    """Open ``notebook`` in JupyterLab, run every cell, and wait until the kernel is idle again."""
    page.goto(f"{url}/lab/tree/{notebook}?token={token}", timeout=60_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
    _accept_dialogs(page)  # a fresh JupyterLab may ask which kernel to use: the notebook's own
    page.click(".lm-MenuBar-itemLabel:text-is('Run')")
    page.click("li[data-command='runmenu:run-all']")
    _accept_dialogs(page)


def _move_slider_and_wait_for_a_new_figure(page, description: str) -> None:
    """Press → on the last slider labelled ``description``; the panel's picture must be redrawn."""
    slider = page.locator(".widget-hslider").filter(has_text=description).last
    slider.scroll_into_view_if_needed(timeout=30_000)  # lab renders only what is in view
    slider.wait_for(state="visible", timeout=30_000)
    before = _figure_source(page)
    readout = slider.locator(".widget-readout")
    value_before = readout.inner_text()
    handle = slider.locator(".noUi-handle")
    handle.scroll_into_view_if_needed()
    handle.click()
    page.keyboard.press("ArrowRight")
    page.wait_for_function(f"(old) => {_LAST_IMAGE_JS} !== old", arg=before, timeout=120_000)
    assert readout.inner_text() != value_before, f"the {description} slider did not move"
    after = _figure_source(page)
    assert after.startswith("blob:") and after != before, f"the figure did not change when {description} moved"


@pytest.fixture
def lab_page(jupyterlab):
    """A headless Chromium page next to the JupyterLab server, and where a failure leaves its screenshot."""
    from playwright.sync_api import sync_playwright

    url, token, workdir = jupyterlab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000}), url, token, workdir
        finally:
            browser.close()


@contextlib.contextmanager
def _screenshot_on_failure(page, workdir: Path):
    """On any failure inside: a full-page screenshot and the end of JupyterLab's log, printed with the error."""
    try:
        yield
    except Exception:
        page.screenshot(path=str(workdir / "failure.png"), full_page=True)
        log = (workdir / "jupyterlab.log").read_text()[-4000:]
        print(f"screenshot: {workdir / 'failure.png'}\nJupyterLab log (end):\n{log}")
        raise


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(_browser_missing() is not None, reason=_browser_missing() or "")
def test_lesson_03_in_a_real_browser_redraws_when_the_bucket_slider_moves(lab_page):
    page, url, token, workdir = lab_page
    with _screenshot_on_failure(page, workdir):
        _run_all_in_lab(page, url, token, "03_data_parallel.ipynb")
        # the panel is the notebook's last widget: wait until it has run once and drawn its picture
        status = page.locator(".widget-html").filter(has_text="job(s) in").last
        status.wait_for(state="attached", timeout=240_000)
        page.wait_for_function(f"() => {_LAST_IMAGE_JS}.startsWith('blob:')", timeout=60_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=240_000)
        _move_slider_and_wait_for_a_new_figure(page, "bucket_mb")


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(_browser_missing() is not None, reason=_browser_missing() or "")
def test_lesson_08_in_a_real_browser_redraws_the_bubble_when_the_micro_batch_slider_moves(lab_page):
    page, url, token, workdir = lab_page
    with _screenshot_on_failure(page, workdir):
        _run_all_in_lab(page, url, token, "08_pipeline_parallel.ipynb")
        # course.PipelinePanel simulates and draws as soon as it is built: its status names the bubble
        status = page.locator(".widget-html").filter(has_text="simulated bubble").last
        status.wait_for(state="attached", timeout=240_000)
        page.wait_for_function(f"() => {_LAST_IMAGE_JS}.startsWith('blob:')", timeout=60_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=240_000)
        bubble_before = status.inner_text()
        _move_slider_and_wait_for_a_new_figure(page, "micro-batches")
        assert status.inner_text() != bubble_before, "the simulated bubble did not change with the micro-batches"
