"""Poll-with-deadline, the one way tests wait for another process to reach a state."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], bool], timeout_seconds: float = 30.0) -> None:
    """Return once ``predicate()`` is true; fail the test at the deadline."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout_seconds:.0f} s")
