"""Lessons in a real browser: JupyterLab in headless Chromium runs a lesson, a panel's slider moves, the figure changes.

One JupyterLab server (serving a copy of the committed notebooks on loopback) and one headless Chromium are shared
by the module's tests; lab_page gives each test a fresh browser context and page, a JupyterLab workspace of its own
(nothing another test opened is restored into it), a screenshot on failure, and shuts the test's kernels down when
it ends. Lesson 03: the bucket-size slider of its TimelinePanel redraws the timeline. Lesson 08: the micro-batch
slider of course.PipelinePanel redraws the bubble picture and changes the simulated bubble. The tests wait on
events in the page, never for a fixed time. Skipped where Chromium, playwright or JupyterLab are missing, with the
command that installs them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")  # the fixture: tests/conftest.py


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


@dataclasses.dataclass(frozen=True)
class Lab:
    """The shared JupyterLab server."""
    url: str
    token: str
    log: Path


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """JupyterLab on loopback, serving a copy of the notebooks, shared by the module's tests; always stopped."""
    workdir = tmp_path_factory.mktemp("jupyterlab")
    root = workdir / "course"
    shutil.copytree(NOTEBOOKS, root, ignore=shutil.ignore_patterns("src", "build.py", ".ipynb_checkpoints"))
    port, token = _free_port(), "zerokit-browser-test"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(workdir / "config"), "JUPYTER_DATA_DIR": str(workdir / "data"),
           "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"), "JUPYTER_PLATFORM_DIRS": "1"}
    env.pop("JUPYTER_PATH", None)
    log_path = workdir / "jupyterlab.log"
    log = open(log_path, "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: the tests ask it whether the kernel is ready
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited early:\n{log_path.read_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.3)
        else:
            pytest.fail("JupyterLab did not start listening within 90 s")
        yield Lab(url, token, log_path)
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


def _shut_down_kernels(lab: Lab) -> None:
    """Delete every session (and so its kernel) of the server, waiting for each: the next test starts clean."""
    auth = {"Authorization": f"token {lab.token}"}
    with urllib.request.urlopen(urllib.request.Request(f"{lab.url}/api/sessions", headers=auth), timeout=30) as r:
        sessions = json.load(r)
    for session in sessions:
        request = urllib.request.Request(f"{lab.url}/api/sessions/{session['id']}", method="DELETE", headers=auth)
        urllib.request.urlopen(request, timeout=60).close()


_workspace_numbers = itertools.count()


@dataclasses.dataclass(frozen=True)
class LabPage:
    """A test's page on the shared server."""
    page: Any  # playwright.sync_api.Page
    lab: Lab
    workspace: str  # a JupyterLab workspace of the test's own: nothing another test opened is restored into it
    workdir: Path  # where a failure leaves its screenshot


@pytest.fixture
def lab_page(jupyterlab, chromium, tmp_path):
    """A fresh Chromium context and page next to the shared JupyterLab server, and where a failure leaves its
    screenshot; the test's kernels are shut down when it ends."""
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    try:
        yield LabPage(context.new_page(), jupyterlab, f"test-{next(_workspace_numbers)}", tmp_path)
    finally:
        try:
            context.close()
        finally:
            _shut_down_kernels(jupyterlab)


#: the src of the last widget image in the notebook: the panel's picture (a new blob URL at every redraw)
_LAST_IMAGE_JS = "([...document.querySelectorAll('.jp-OutputArea-output img.widget-image')].pop() || {src: ''}).src"
#: the default button of a modal dialog JupyterLab shows (a fresh JupyterLab may ask which kernel to use)
_DIALOG_ACCEPT = ".jp-Dialog .jp-Dialog-button.jp-mod-accept"
#: Run All has started: a cell is queued or running (its prompt shows [*]) or the kernel is busy
_CELLS_RUNNING_JS = ("([...document.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('[*]'))"
                     " || document.querySelector(\".jp-Notebook-ExecutionIndicator[data-status='busy']\"))")


def _kernel_ready_js(notebook: str) -> str:
    """True once the notebook's own kernel is connected and idle: what Run All needs (without a kernel it only
    clears the prompts). The execution indicator cannot tell: 'idle' is its state before any kernel exists."""
    return ("(k => !!k && k.connectionStatus === 'connected' && k.status === 'idle')("
            "[...(window.jupyterapp?.shell.widgets('main') ?? [])]"
            f".find(w => w.context?.path === {json.dumps(notebook)})?.sessionContext?.session?.kernel)")


def _accept_dialogs_until(page, done_js: str, what: str, timeout_s: float) -> None:
    """Wait until the JavaScript expression ``done_js`` is true in the page, accepting every modal dialog that
    JupyterLab shows on the way with its default button (the kernel the notebook names). Waits on the page's
    state, never for a fixed time: a dialog that does not come costs nothing."""
    from playwright.sync_api import Error as PlaywrightError

    deadline = time.monotonic() + timeout_s
    while True:
        left_ms = (deadline - time.monotonic()) * 1000
        if left_ms <= 0:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        try:
            outcome = page.wait_for_function(
                f"() => document.querySelector({json.dumps(_DIALOG_ACCEPT)}) ? 'dialog' : (({done_js}) ? 'done' : '')",
                timeout=left_ms, polling=100).json_value()
        except PlaywrightError as e:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s ({e})") from e
        if outcome == "done":
            return
        button = page.query_selector(_DIALOG_ACCEPT)
        if button is None:  # the dialog closed by itself meanwhile
            continue
        with contextlib.suppress(PlaywrightError):  # it may close (detach) while we click: look again
            button.click(timeout=max(left_ms, 1))
            button.wait_for_element_state("hidden", timeout=max((deadline - time.monotonic()) * 1000, 1))


def _figure_source(page) -> str:
    return page.evaluate(f"() => {_LAST_IMAGE_JS}")


def _run_all_in_lab(lp: LabPage, notebook: str) -> None:
    """Open ``notebook`` in the test's own JupyterLab workspace and run every cell; returns once they run."""
    page, lab = lp.page, lp.lab
    page.goto(f"{lab.url}/lab/workspaces/{lp.workspace}/tree/{notebook}?token={lab.token}", timeout=60_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    # a fresh JupyterLab may ask which kernel to use (the notebook's own) before the kernel starts
    _accept_dialogs_until(page, _kernel_ready_js(notebook), f"the kernel of {notebook} is ready", timeout_s=90)
    page.click(".lm-MenuBar-itemLabel:text-is('Run')")
    page.click("li[data-command='runmenu:run-all']")
    _accept_dialogs_until(page, _CELLS_RUNNING_JS, f"Run All started the cells of {notebook}", timeout_s=60)


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


@contextlib.contextmanager
def _screenshot_on_failure(lp: LabPage):
    """On any failure inside: a full-page screenshot and the end of JupyterLab's log, printed with the error."""
    try:
        yield
    except Exception:
        shot = lp.workdir / "failure.png"
        lp.page.screenshot(path=str(shot), full_page=True)
        log = lp.lab.log.read_text()[-4000:]
        print(f"screenshot: {shot}\nJupyterLab log (end):\n{log}")
        raise


def _run_until_the_panel_has_drawn(lp: LabPage, notebook: str, status_text: str):
    """Run every cell of ``notebook``; wait until the panel whose status shows ``status_text`` has drawn its
    picture and the kernel is idle. Returns the status widget."""
    page = lp.page
    _run_all_in_lab(lp, notebook)
    status = page.locator(".widget-html").filter(has_text=status_text).last
    status.wait_for(state="attached", timeout=240_000)
    page.wait_for_function(f"() => {_LAST_IMAGE_JS}.startsWith('blob:')", timeout=60_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=240_000)
    return status


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(_browser_missing() is not None, reason=_browser_missing() or "")
def test_lesson_03_in_a_real_browser_redraws_when_the_bucket_slider_moves(lab_page):
    with _screenshot_on_failure(lab_page):
        # the panel is the notebook's last widget: wait until it has run once and drawn its picture
        _run_until_the_panel_has_drawn(lab_page, "03_data_parallel.ipynb", "job(s) in")
        _move_slider_and_wait_for_a_new_figure(lab_page.page, "bucket_mb")


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(_browser_missing() is not None, reason=_browser_missing() or "")
def test_lesson_08_in_a_real_browser_redraws_the_bubble_when_the_micro_batch_slider_moves(lab_page):
    with _screenshot_on_failure(lab_page):
        # course.PipelinePanel simulates and draws as soon as it is built: its status names the bubble
        status = _run_until_the_panel_has_drawn(lab_page, "08_pipeline_parallel.ipynb", "simulated bubble")
        bubble_before = status.inner_text()
        _move_slider_and_wait_for_a_new_figure(lab_page.page, "micro-batches")
        assert status.inner_text() != bubble_before, "the simulated bubble did not change with the micro-batches"
