"""Start and stop local daemons as real child processes (used by `laminar demo` and tests)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from laminar_agent.errors import Unavailable


@dataclass
class AgentProcess:
    agent_id: str
    state_dir: Path
    process: subprocess.Popen[bytes]
    address: str = ""
    metrics_address: str = ""


@dataclass
class LocalCluster:
    """A set of agent processes on simulated GPUs; stops them all on exit (no orphans)."""

    root: Path
    agents: list[AgentProcess] = field(default_factory=list)

    def start_agent(
        self, agent_id: str, fake_gpus: str, *, zone: str = "", timeout_seconds: float = 30.0
    ) -> AgentProcess:
        state_dir = self.root / agent_id
        state_dir.mkdir(parents=True, exist_ok=True)
        info_path = state_dir / "agent.json"
        info_path.unlink(missing_ok=True)
        log = (state_dir / "agent.log").open("ab")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "laminar_agent",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--state-dir",
                str(state_dir),
                "--agent-id",
                agent_id,
                "--gpu-backend",
                "fake",
                "--fake-gpus",
                fake_gpus,
                *(["--zone", zone] if zone else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        agent = AgentProcess(agent_id, state_dir, proc)
        self.agents.append(agent)
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise Unavailable(
                    f"agent {agent_id} exited with {proc.returncode}; see {state_dir / 'agent.log'}"
                )
            if info_path.exists():
                info = json.loads(info_path.read_text())
                agent.address = info["address"]
                agent.metrics_address = info.get("metrics_address", "")
                return agent
            time.sleep(0.02)  # polling a file the child writes; bounded by the deadline
        raise Unavailable(f"agent {agent_id} did not start within {timeout_seconds:.0f} s")

    def stop(self, timeout_seconds: float = 15.0) -> list[int]:
        """SIGTERM every daemon, wait, SIGKILL stragglers; returns their exit codes."""
        for agent in self.agents:
            if agent.process.poll() is None:
                agent.process.send_signal(signal.SIGTERM)
        codes = []
        for agent in self.agents:
            try:
                codes.append(agent.process.wait(timeout_seconds))
            except subprocess.TimeoutExpired:
                agent.process.kill()
                codes.append(agent.process.wait())
        return codes

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
