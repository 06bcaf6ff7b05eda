"""Helpers for the tests that run the documentation's commands as written (README.md and
the docs' quick starts) against the local cluster the README starts with its own `laminar
up` line, on 127.0.0.1:7400."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAMINAR = ".venv/bin/laminar"
UP_PORT = 7400


def readme_commands() -> list[list[str]]:
    """The README's shell lines that run `laminar` or `laminar-agent`, comments dropped,
    backslash continuations joined."""
    commands: list[list[str]] = []
    fenced = False
    pending = ""
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text = pending + line
        pending = ""
        words = shlex.split(text, comments=True)
        if words and words[0] in (LAMINAR, ".venv/bin/laminar-agent"):
            commands.append(words)
    return commands


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds it
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def agents_ready(count: int) -> bool:
    result = run([LAMINAR, "agents", "-o", "json"])
    if result.returncode != 0:
        return False
    agents = json.loads(result.stdout).get("agents", [])
    return sum(1 for a in agents if a.get("state") == "AGENT_READY") >= count


def run(words: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")}
    return subprocess.run(
        words, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
