"""gRPC's fork handlers stay off in every Laminar process (laminar_base sets
``GRPC_ENABLE_FORK_SUPPORT=0`` before grpc is first imported): with them on, a child the
agent forks to exec (cuda-checkpoint) could crash in gRPC's code before its exec."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ENTRIES = ["laminar_agent.__main__", "laminar_zone.__main__", "laminar_cli.main"]


@pytest.mark.parametrize("entry", ENTRIES)
def test_fork_support_is_off_before_grpc_is_imported(entry: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    probe = (
        "import importlib.abc, os, sys\n"
        "seen = {}\n"
        "class Spy(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'grpc':\n"
        "            seen.setdefault('at', os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))\n"
        "        return None\n"
        "sys.meta_path.insert(0, Spy())\n"
        f"import {entry}\n"
        "import grpc\n"
        "print(seen['at'], os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    # Set when grpc is first imported (by the entry, or at the latest by the line after it).
    assert out == ["0", "0"], out
