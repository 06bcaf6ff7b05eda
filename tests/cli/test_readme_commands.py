"""Every `laminar` command in README.md runs as written, from the repository root, against
the cluster the README's own `laminar up --agents 3` starts.

Two things are filled in, as a reader would: the job id the README shows as an example
(`j-1234567890`) is the first job the README's commands submitted, and the agent the
README starts by hand writes its state where this test says (not /tmp/agent1), its
address (`127.0.0.1:PORT`) read from its agent.json as the README says to.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
LAMINAR = ".venv/bin/laminar"
EXAMPLE_JOB = "j-1234567890"
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


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds it
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def up_cluster() -> Iterator[list[str]]:
    commands = readme_commands()
    up = next((c for c in commands if c[1:2] == ["up"]), None)
    assert up is not None, "the README starts its cluster with `laminar up`"
    if not (ROOT / LAMINAR).exists():
        pytest.skip(f"{LAMINAR} is not installed here (make venv installs it)")
    if not _port_free(UP_PORT):
        pytest.skip(f"port {UP_PORT}, where the README's `laminar up` listens, is in use")
    process = subprocess.Popen(
        up, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
    )
    try:
        wait_for(lambda: process.poll() is not None or _agents_ready(3), timeout_seconds=60)
        assert process.poll() is None, f"`{shlex.join(up)}` exited {process.returncode}"
        yield [c for c in commands if c is not up]
    finally:
        process.send_signal(signal.SIGINT)  # the README's "Ctrl-C stops everything"
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _agents_ready(count: int) -> bool:
    result = _run([LAMINAR, "agents", "-o", "json"])
    if result.returncode != 0:
        return False
    agents = json.loads(result.stdout).get("agents", [])
    return sum(1 for a in agents if a.get("state") == "AGENT_READY") >= count


def _run(words: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")}
    return subprocess.run(
        words, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def _start_agent(words: list[str], info: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start the README's hand-made agent; its address, as `cat .../agent.json` shows."""
    agent = subprocess.Popen(words, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: info.exists() or agent.poll() is not None)
    assert agent.poll() is None, f"`{shlex.join(words)}` exited {agent.returncode}"
    return agent, str(json.loads(info.read_text())["address"])


def test_every_readme_command_runs_as_written(up_cluster: list[str], tmp_path: Path) -> None:
    first_job = ""
    agent: subprocess.Popen[bytes] | None = None
    assert len(up_cluster) >= 10, up_cluster  # the README's walk-through, found
    agent_address = ""
    try:
        for words in up_cluster:
            words = [w.replace("/tmp/agent1", str(tmp_path / "agent1")) for w in words]
            if words[0].endswith("laminar-agent"):
                agent, agent_address = _start_agent(words, tmp_path / "agent1" / "agent.json")
                continue
            if EXAMPLE_JOB in words:
                assert first_job, "the README shows a job before any was submitted"
                # A reader looks at a job once it ran: wait for it first.
                assert _run([LAMINAR, "watch", first_job], timeout=120).returncode == 0
                words = [first_job if w == EXAMPLE_JOB else w for w in words]
            if "127.0.0.1:PORT" in words:
                assert agent_address, "the README uses the agent's address before starting it"
                words = [agent_address if w == "127.0.0.1:PORT" else w for w in words]
            result = _run(words)
            assert result.returncode == 0, (
                f"`{shlex.join(words)}` exited {result.returncode}: {result.stderr}"
            )
            if words[1] == "submit" and not first_job:
                first_job = result.stdout.strip()
    finally:
        if agent is not None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)
    assert first_job.startswith("j-")
