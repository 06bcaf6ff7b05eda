"""Start and stop a local cluster as real child processes (`laminar up`, `laminar demo`, tests).

Every daemon is a real ``python -m laminar_zone`` or ``python -m laminar_agent``
process on loopback with its own state directory; the only fake is the agents'
GPU backend. Daemons run in their own sessions so a Ctrl-C in the terminal
reaches only the process that owns the cluster, which then stops them in order:
routers first (no new placements), then every live subjob through its agent
(agents deliberately leave subjobs running on SIGTERM so a restart can re-adopt
them), then the agents; stragglers are killed. Nothing is left running.

Not covered: a parent killed with SIGKILL cannot clean up; its daemons keep
running until stopped by hand (their pids are in each ``*.json`` info file).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import grpc
import psutil

from laminar_agent.executor import local_run_as_env
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, zone_pb2, zone_pb2_grpc
from laminar_base import causes
from laminar_base.errors import Unavailable
from laminar_base.grpcutil import channel_options
from laminar_base.security import INSECURE, Trust

#: Subjob states that still hold a process.
LIVE_SUBJOB_STATES = sorted(causes.LIVE_SUBJOB_STATES)
#: How long a subjob gets between SIGTERM and SIGKILL when the cluster stops.
STOP_GRACE_SECONDS = 2.0
#: Poll period while waiting for a child to write its info file.
_POLL_SECONDS = 0.02


@dataclass
class DaemonProcess:
    """One daemon child: where its state lives and where it listens once started."""

    name: str
    state_dir: Path
    process: subprocess.Popen[bytes]
    address: str = ""
    metrics_address: str = ""

    #: Where the daemon's stdout and stderr go, inside its state directory.
    LOG_NAME: ClassVar[str] = "daemon.log"

    @property
    def log_path(self) -> Path:
        return self.state_dir / self.LOG_NAME

    def is_running(self) -> bool:
        return self.process.poll() is None


@dataclass
class AgentProcess(DaemonProcess):
    zone: str = ""
    fake_gpus: str = ""

    LOG_NAME: ClassVar[str] = "agent.log"

    @property
    def agent_id(self) -> str:
        return self.name


@dataclass
class ZoneProcess(DaemonProcess):
    peers: tuple[str, ...] = ()

    LOG_NAME: ClassVar[str] = "zone.log"


@dataclass
class LocalCluster:
    """Zone routers and agents on simulated GPUs; :meth:`stop` (or leaving ``with``) ends all."""

    root: Path
    agents: list[AgentProcess] = field(default_factory=list)
    zones: list[ZoneProcess] = field(default_factory=list)
    #: Extra environment for every daemon (e.g. ``LAMINAR_ZONE_HEARTBEAT_SECONDS``).
    env: dict[str, str] = field(default_factory=dict)
    #: How this process calls the daemons (give them the same files through ``env``).
    trust: Trust = INSECURE

    def start_zone(
        self,
        name: str,
        listen: str = "127.0.0.1:0",
        peers: Sequence[str] = (),
        heartbeat_seconds: float | None = None,
        *,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        timeout_seconds: float = 30.0,
    ) -> ZoneProcess:
        """Start ``laminar_zone`` and return once it has written ``zone.json`` (it serves then)."""
        state_dir = self.root / f"zone-{name}"
        argv = [
            "-m",
            "laminar_zone",
            "--listen",
            listen,
            "--metrics-listen",
            "127.0.0.1:0",
            "--state-dir",
            str(state_dir),
            "--zone-name",
            name,
            *(["--peers", ",".join(peers)] if peers else []),
            *(["--heartbeat-seconds", f"{heartbeat_seconds:g}"] if heartbeat_seconds else []),
            *extra_args,
        ]
        proc = self._spawn(argv, state_dir, "zone.json", ZoneProcess.LOG_NAME, env)
        zone = ZoneProcess(name, state_dir, proc, peers=tuple(peers))
        self.zones.append(zone)
        info = self._wait_info(zone, "zone.json", timeout_seconds)
        zone.address = str(info["address"])
        zone.metrics_address = str(info.get("metrics_address", ""))
        return zone

    def start_agent(
        self,
        agent_id: str,
        fake_gpus: str,
        *,
        zone: str = "",
        heartbeat_seconds: float | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        timeout_seconds: float = 30.0,
    ) -> AgentProcess:
        """Start ``laminar_agent`` on fake GPUs (joined to ``zone`` when given) and wait for it."""
        state_dir = self.root / agent_id
        argv = [
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
            *extra_args,
        ]
        child_env = dict(env or {})
        if heartbeat_seconds:
            child_env["LAMINAR_ZONE_HEARTBEAT_SECONDS"] = f"{heartbeat_seconds:g}"
        child_env.update(local_run_as_env(os.environ, self.env))
        proc = self._spawn(argv, state_dir, "agent.json", AgentProcess.LOG_NAME, child_env)
        agent = AgentProcess(agent_id, state_dir, proc, zone=zone, fake_gpus=fake_gpus)
        self.agents.append(agent)
        info = self._wait_info(agent, "agent.json", timeout_seconds)
        agent.address = str(info["address"])
        agent.metrics_address = str(info.get("metrics_address", ""))
        return agent

    def _spawn(
        self,
        argv: Sequence[str],
        state_dir: Path,
        info_name: str,
        log_name: str,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / info_name).unlink(missing_ok=True)
        child_env = {**os.environ, **self.env, **(env or {})}
        with (state_dir / log_name).open("ab") as log:
            return subprocess.Popen(
                [sys.executable, *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_env,
                start_new_session=True,  # Ctrl-C reaches only us; we stop them in order
            )

    @staticmethod
    def _wait_info(
        daemon: DaemonProcess, info_name: str, timeout_seconds: float
    ) -> dict[str, object]:
        info_path = daemon.state_dir / info_name
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if daemon.process.poll() is not None:
                raise Unavailable(
                    f"{daemon.name} exited with {daemon.process.returncode}; "
                    f"last log line: {last_line(daemon.log_path)}"
                )
            if info_path.exists():
                try:
                    info: dict[str, object] = json.loads(info_path.read_text())
                except ValueError:  # written atomically, but be lenient with a partial file
                    info = {}
                if info.get("address"):
                    return info
            time.sleep(_POLL_SECONDS)  # the child writes the file; bounded by the deadline
        raise Unavailable(
            f"{daemon.name} did not start within {timeout_seconds:.0f} s; see {daemon.log_path}"
        )

    def wait_registered(self, timeout_seconds: float = 30.0) -> None:
        """Return once every running zone lists every running agent that joined it as ready."""
        deadline = time.monotonic() + timeout_seconds
        for zone in self.zones:
            if not zone.is_running():
                continue
            expected = {
                a.agent_id for a in self.agents if a.zone == zone.address and a.is_running()
            }
            with self.trust.channel(zone.address, channel_options()) as channel:
                stub = zone_pb2_grpc.ZoneStub(channel)
                while True:
                    ready = {
                        a.agent_id
                        for a in stub.ListAgents(zone_pb2.ListAgentsRequest(), timeout=5).agents
                        if a.state == zone_pb2.AGENT_READY
                    }
                    if expected <= ready:
                        break
                    if time.monotonic() > deadline:
                        missing = ", ".join(sorted(expected - ready))
                        raise Unavailable(
                            f"zone {zone.name} has no heartbeat from {missing} "
                            f"after {timeout_seconds:.0f} s"
                        )
                    time.sleep(0.05)  # heartbeats arrive on their own schedule

    def daemons(self) -> list[DaemonProcess]:
        return [*self.zones, *self.agents]

    def exited(self) -> list[DaemonProcess]:
        """Daemons that have exited (for a foreground supervisor)."""
        return [d for d in self.daemons() if not d.is_running()]

    def stop(self, timeout_seconds: float = 15.0, *, stop_subjobs: bool = True) -> list[int]:
        """Stop routers, then subjobs (unless ``stop_subjobs=False``), then agents.

        Returns the exit codes, zones first then agents, in start order. A daemon
        that ignores SIGTERM for ``timeout_seconds`` is killed (its code is then
        negative).
        """
        codes = [code for _, code in _terminate(self.zones, timeout_seconds)]
        leftovers: list[tuple[int, float]] = []
        if stop_subjobs:
            leftovers = _stop_subjobs([a for a in self.agents if a.is_running()], self.trust)
        codes += [code for _, code in _terminate(self.agents, timeout_seconds)]
        _kill_process_groups(leftovers)
        return codes

    def kill(self) -> None:
        """SIGKILL every daemon at once (a second Ctrl-C); running subjobs are not stopped."""
        for daemon in self.daemons():
            if daemon.is_running():
                daemon.process.kill()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _terminate(daemons: Iterable[DaemonProcess], timeout_seconds: float) -> list[tuple[str, int]]:
    daemons = list(daemons)
    for daemon in daemons:
        if daemon.is_running():
            daemon.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_seconds
    out = []
    for daemon in daemons:
        try:
            code = daemon.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            daemon.process.kill()
            code = daemon.process.wait()
        out.append((daemon.name, code))
    return out


def _stop_subjobs(agents: Sequence[AgentProcess], trust: Trust) -> list[tuple[int, float]]:
    """Terminate every live subjob through its agent; returns (pid, create_time) to sweep later."""
    leftovers: list[tuple[int, float]] = []
    pending: list[grpc.Future] = []  # type: ignore[type-arg]
    channels = []
    try:
        for agent in agents:
            channel = trust.channel(agent.address, channel_options())
            channels.append(channel)
            stub = agent_pb2_grpc.AgentStub(channel)
            try:
                live = stub.ListSubjobs(
                    agent_pb2.ListSubjobsRequest(states=LIVE_SUBJOB_STATES), timeout=5
                ).subjobs
            except grpc.RpcError:
                continue
            for subjob in live:
                if subjob.pid > 0:
                    with contextlib.suppress(psutil.Error):
                        leftovers.append((subjob.pid, psutil.Process(subjob.pid).create_time()))
                pending.append(
                    stub.SignalSubjob.future(
                        agent_pb2.SignalSubjobRequest(
                            subjob_id=subjob.spec.subjob_id,
                            signal=agent_pb2.TERMINATE,
                            reason="local cluster stopping",
                            grace_seconds=STOP_GRACE_SECONDS,
                        ),
                        timeout=STOP_GRACE_SECONDS + 10,
                    )
                )
        for future in pending:
            with contextlib.suppress(grpc.RpcError):
                future.result()
    finally:
        for channel in channels:
            channel.close()
    return leftovers


def _kill_process_groups(leftovers: Iterable[tuple[int, float]]) -> None:
    """SIGKILL the group of any subjob process still alive (same pid and start time)."""
    for pid, created in leftovers:
        try:
            if psutil.Process(pid).create_time() != created:
                continue
            os.killpg(pid, signal.SIGKILL)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue


def last_line(path: Path) -> str:
    """The last non-empty line of a log file, for one-line error messages."""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1].strip() if lines else "(empty log)"
