"""Guarded root loops in a real ``laminar-zone`` process. The fault comes in through
``sitecustomize`` on the child's PYTHONPATH, written by the test: it wraps the router's
queue pass (or its sweep) to raise while a file the test controls exists, so the router
itself has no switch for it. systemd is a datagram socket the test reads."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from waiting import wait_for

from laminar_cli.cluster import LocalCluster

FAULT = """
import os
from pathlib import Path

fault = Path(os.environ["GUARD_FAULT_DIR"])
from laminar_zone.jobs import ZoneState
from laminar_zone.server import ZoneServer

real_pass = ZoneState.queue_pass


async def queue_pass(self):
    if (fault / "break-queue").exists():
        raise RuntimeError("injected by the test: the queue pass fails")
    await real_pass(self)


ZoneState.queue_pass = queue_pass
if (fault / "fatal-tick").exists():
    real_add = ZoneServer._add_root_loops

    def add(self):
        real_add(self)
        self.supervisor.loops["zone-tick"].fatal = True

    def sweep(self):
        raise RuntimeError("injected by the test: the membership sweep fails")

    ZoneServer._add_root_loops = add
    ZoneState.sweep = sweep
"""


@pytest.fixture
def fault_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "fault"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(FAULT)
    (tmp_path / "zone.toml").write_text("[queue]\nretry_seconds = 0.05\n")
    return folder


@pytest.fixture
def notify_socket() -> Iterator[socket.socket]:
    """A stand-in for systemd's notify socket (a short path: AF_UNIX allows ~100 bytes)."""
    with tempfile.TemporaryDirectory(prefix="lam-") as folder:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(os.path.join(folder, "notify"))
        sock.settimeout(0.05)
        yield sock
        sock.close()


def child_env(fault_dir: Path, sock: socket.socket | None = None) -> dict[str, str]:
    env = {
        "GUARD_FAULT_DIR": str(fault_dir),
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(fault_dir), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    if sock is not None:
        env["NOTIFY_SOCKET"] = sock.getsockname()
        env["WATCHDOG_USEC"] = "200000"  # pings every 0.1 s
    return env


def received(sock: socket.socket) -> list[str]:
    """The notifications that have arrived so far."""
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except TimeoutError:
            return out


def status(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
    return int(reply.status)


def test_a_failing_queue_flips_health_and_starves_the_watchdog_until_it_runs_again(
    tmp_path: Path, fault_dir: Path, notify_socket: socket.socket
) -> None:
    with LocalCluster(tmp_path / "run", env=child_env(fault_dir, notify_socket)) as cluster:
        zone = cluster.start_zone("a", extra_args=["--config", str(tmp_path / "zone.toml")])
        notes: list[str] = []

        def pinged() -> bool:
            notes.extend(received(notify_socket))
            return "WATCHDOG=1" in notes

        wait_for(pinged)
        assert any(n.startswith("READY=1") for n in notes)
        assert status(zone.address) == health_pb2.HealthCheckResponse.SERVING

        (fault_dir / "break-queue").touch()
        wait_for(lambda: status(zone.address) == health_pb2.HealthCheckResponse.NOT_SERVING)
        log = zone.log_path.read_text()
        assert "root loop zone-queue failed" in log and "Traceback" in log
        assert "injected by the test: the queue pass fails" in log
        assert "health NOT_SERVING, watchdog held back: zone-queue: failed" in log

        (fault_dir / "break-queue").unlink()
        wait_for(lambda: status(zone.address) == health_pb2.HealthCheckResponse.SERVING)
        notes.clear()
        received(notify_socket)  # pings sent before SERVING came back are not evidence
        wait_for(pinged)
        assert "all root loops healthy again" in zone.log_path.read_text()
        assert zone.is_running()


def test_a_fatal_loop_that_fails_ends_the_router_with_exit_1(
    tmp_path: Path, fault_dir: Path
) -> None:
    (fault_dir / "fatal-tick").touch()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "laminar_zone",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            str(tmp_path / "zone"),
        ],
        env={**os.environ, **child_env(fault_dir)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.rstrip().splitlines()[-1] == (
        "laminar-zone: root loop zone-tick failed (its traceback is in the log)"
    )
    assert "injected by the test: the membership sweep fails" in done.stderr
    assert "zone-tick failed: the zone router stops (jobs stay in the journal)" in done.stderr
