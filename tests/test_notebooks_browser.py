"""Lessons in a real browser: JupyterLab in headless Chromium runs a lesson, a panel's slider moves, the figure changes.

The jupyterlab fixture serves a copy of the committed notebooks on loopback; lab_page
gives each test a Chromium page. Lesson 03: the bucket-size slider of its TimelinePanel
redraws the timeline. Lesson 08: the micro-batch slider of course.PipelinePanel redraws
the bubble picture and changes the simulated bubble. Skipped where Chromium, playwright
or JupyterLab are missing, with the command that installs them.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
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


def _run_until_the_panel_has_drawn(page, url, token, notebook: str, status_text: str):
    """Run every cell of ``notebook``; wait until the panel whose status shows ``status_text`` has drawn its
    picture and the kernel is idle. Returns the status widget."""
    _run_all_in_lab(page, url, token, notebook)
    status = page.locator(".widget-html").filter(has_text=status_text).last
    status.wait_for(state="attached", timeout=240_000)
    page.wait_for_function(f"() => {_LAST_IMAGE_JS}.startsWith('blob:')", timeout=60_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=240_000)
    return status


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(_browser_missing() is not None, reason=_browser_missing() or "")
def test_lesson_03_in_a_real_browser_redraws_when_the_bucket_slider_moves(lab_page):
    page, url, token, workdir = lab_page
    with _screenshot_on_failure(page, workdir):
        # the panel is the notebook's last widget: wait until it has run once and drawn its picture
        _run_until_the_panel_has_drawn(page, url, token, "03_data_parallel.ipynb", "job(s) in")
        _move_slider_and_wait_for_a_new_figure(page, "bucket_mb")


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(_browser_missing() is not None, reason=_browser_missing() or "")
def test_lesson_08_in_a_real_browser_redraws_the_bubble_when_the_micro_batch_slider_moves(lab_page):
    page, url, token, workdir = lab_page
    with _screenshot_on_failure(page, workdir):
        # course.PipelinePanel simulates and draws as soon as it is built: its status names the bubble
        status = _run_until_the_panel_has_drawn(page, url, token, "08_pipeline_parallel.ipynb", "simulated bubble")
        bubble_before = status.inner_text()
        _move_slider_and_wait_for_a_new_figure(page, "micro-batches")
        assert status.inner_text() != bubble_before, "the simulated bubble did not change with the micro-batches"
