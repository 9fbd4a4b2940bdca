"""What several test files share: the check that no process was left behind, and one headless Chromium."""
import shutil
import time

import psutil
import pytest


def _left_behind() -> list:
    """This process's descendants, less multiprocessing's resource tracker (started by the first spawn-method
    launch in the process and kept, by design, for the process's life)."""
    return [p for p in psutil.Process().children(recursive=True) if not _is_resource_tracker(p)]


def _is_resource_tracker(p) -> bool:
    try:
        return any("resource_tracker" in part for part in p.cmdline())
    except psutil.Error:  # it ended while we looked
        return False


@pytest.fixture
def no_children_left():
    """Call it to wait up to ``timeout_s`` for every child to end, then fail naming those still alive."""
    def check(timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while (left := _left_behind()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"processes left behind: {left}"

    return check


#: the system's Chromium, driven by Playwright (the lab's and the site's browser tests); None: those tests skip
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run"]


@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium for a module's tests (each test opens its own context and page); always closed."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            yield browser
        finally:
            browser.close()
