"""Poll-with-deadline, the one way tests wait for another process to reach a state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import psutil


def wait_for(predicate: Callable[[], bool], timeout_seconds: float = 30.0) -> None:
    """Return once ``predicate()`` is true; fail the test at the deadline."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout_seconds:.0f} s")


async def until(predicate: Callable[[], bool], timeout_seconds: float = 30.0) -> None:
    """:func:`wait_for` for async tests whose subject shares their event loop (it runs
    between polls)."""
    deadline = time.monotonic() + timeout_seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_seconds:.0f} s")
        await asyncio.sleep(0.01)


def is_gone(pid: int) -> bool:
    """Whether a process has exited (a zombie awaiting its parent counts as gone)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def gate_code(gate: Path, exit_code: int = 0) -> str:
    """Python source for a subjob that runs until ``gate`` exists, then exits ``exit_code``."""
    return (
        f"import os,time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
        f"raise SystemExit({exit_code})"
    )
