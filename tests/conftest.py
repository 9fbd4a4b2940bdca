"""What several test files share: the check that no process was left behind."""
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
