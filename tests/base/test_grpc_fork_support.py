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
        "import builtins, os, sys\n"
        "seen = {}\n"
        "real = builtins.__import__\n"
        "def spy(name, *args, **kwargs):\n"
        "    if name == 'grpc' and 'at' not in seen:\n"
        "        seen['at'] = os.environ.get('GRPC_ENABLE_FORK_SUPPORT')\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = spy\n"
        f"import {entry}\n"
        "builtins.__import__ = real\n"
        "import grpc\n"
        "print(seen.get('at', 'never'), os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    # When grpc is first imported the variable is already set (or the entry never imports
    # grpc at start-up, as the CLI defers it), and it stays set for grpc's core.
    assert out[0] in ("0", "never"), out
    assert out[1] == "0", out
