"""Every `laminar` command in README.md runs as written, from the repository root, against
the cluster the README's own `laminar up --agents 3` starts.

Two things are filled in, as a reader would: the job id the README shows as an example
(`j-1234567890`) is the first job the README's commands submitted, and the agent the
README starts by hand writes its state where this test says (not /tmp/agent1), its
address (`127.0.0.1:PORT`) read from its agent.json as the README says to.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
from pathlib import Path

from docskit import LAMINAR, ROOT, run
from waiting import wait_for

EXAMPLE_JOB = "j-1234567890"


def _start_agent(words: list[str], info: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start the README's hand-made agent; its address, as `cat .../agent.json` shows."""
    agent = subprocess.Popen(words, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: info.exists() or agent.poll() is not None)
    assert agent.poll() is None, f"`{shlex.join(words)}` exited {agent.returncode}"
    return agent, str(json.loads(info.read_text())["address"])


def test_every_readme_command_runs_as_written(up_cluster: list[list[str]], tmp_path: Path) -> None:
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
                assert run([LAMINAR, "watch", first_job], timeout=120).returncode == 0
                words = [first_job if w == EXAMPLE_JOB else w for w in words]
            if "127.0.0.1:PORT" in words:
                assert agent_address, "the README uses the agent's address before starting it"
                words = [agent_address if w == "127.0.0.1:PORT" else w for w in words]
            result = run(words)
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
