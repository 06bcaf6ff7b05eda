"""Fixtures of the CLI tests: the cluster the README starts with its own `laminar up`."""

from __future__ import annotations

import shlex
import signal
import subprocess
from collections.abc import Iterator

import pytest
from docskit import LAMINAR, ROOT, UP_PORT, agents_ready, port_free, readme_commands
from waiting import wait_for


@pytest.fixture
def up_cluster() -> Iterator[list[list[str]]]:
    """Run the README's `laminar up` until the test ends (Ctrl-C, as the README says);
    yield the README's other commands."""
    commands = readme_commands()
    up = next((c for c in commands if c[1:2] == ["up"]), None)
    assert up is not None, "the README starts its cluster with `laminar up`"
    if not (ROOT / LAMINAR).exists():
        pytest.skip(f"{LAMINAR} is not installed here (make venv installs it)")
    if not port_free(UP_PORT):
        pytest.skip(f"port {UP_PORT}, where the README's `laminar up` listens, is in use")
    process = subprocess.Popen(
        up, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
    )
    try:
        wait_for(lambda: process.poll() is not None or agents_ready(3), timeout_seconds=60)
        assert process.poll() is None, f"`{shlex.join(up)}` exited {process.returncode}"
        yield [c for c in commands if c is not up]
    finally:
        process.send_signal(signal.SIGINT)  # the README's "Ctrl-C stops everything"
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
