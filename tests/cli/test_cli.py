"""`laminar up` and `laminar demo` as real subprocesses: they start, work, and leave nothing behind."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from waiting import gate_code, is_gone, wait_for

from laminar_cli.main import main


def test_up_serves_and_stops_cleanly_on_sigterm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        up = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "laminar_cli.main",
                "up",
                "--listen",
                "127.0.0.1:0",
                "--agents",
                "2",
                "--fake-gpus",
                "2xA100-40GB",
                "--state-dir",
                str(state),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "Ctrl-C stops everything" in log.read_text() or up.poll() is not None)
        assert up.poll() is None, log.read_text()
        address = json.loads((state / "zone-zone-1" / "zone.json").read_text())["address"]
        assert f"zone router listening on {address}" in log.read_text()

        # A subjob still running at stop time must not outlive the cluster either.
        capsys.readouterr()
        gate = tmp_path / "never"
        argv = ["--zone", address, "submit", "--gpus", "1", "--", sys.executable, "-c"]
        assert main([*argv, gate_code(gate)]) == 0
        job_id = capsys.readouterr().out.strip()

        def running() -> bool:
            capsys.readouterr()
            main(["--zone", address, "job", job_id, "-o", "json"])
            return bool(json.loads(capsys.readouterr().out)["state"] == "JOB_RUNNING")

        wait_for(running)
        descendants = psutil.Process(up.pid).children(recursive=True)
        assert len(descendants) >= 4  # a router, two agents, the subjob (and its shim)
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0, log.read_text()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    wait_for(lambda: all(is_gone(p.pid) for p in descendants), timeout_seconds=10)
    assert "all 3 daemons stopped cleanly" in log.read_text()


@contextlib.contextmanager
def _listening() -> Iterator[str]:
    """A plain socket listening on a loopback port for the duration of a with-block."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        host, port = sock.getsockname()
        yield f"{host}:{port}"


def test_up_refuses_a_busy_address(tmp_path: Path) -> None:
    """A router that cannot bind makes `up` fail with one line and stop what it started."""
    with _listening() as address:
        result = subprocess.run(
            [sys.executable, "-m", "laminar_cli.main", "up", "--listen", address, "--agents", "1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "zone-1" in result.stderr


def test_demo_runs_through_the_router_and_leaves_nothing_running() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "laminar_cli.main", "demo"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "zone router zone-1 on 127.0.0.1:" in out
    assert "finetune-late" in out and "queued" in out  # the job that had to wait
    assert "what ran where" in out and "gang-pair" in out
    assert "nothing is left running" in out


def test_each_command_is_found_where_the_lazy_parser_looks_for_it() -> None:
    """`laminar CMD` imports only COMMAND_MODULES[CMD] (start-up time): every command of
    the full parser must be there and come from that module."""
    from laminar_cli.completion import _subparsers
    from laminar_cli.main import COMMAND_MODULES, build_parser, command_of

    full = _subparsers(build_parser())
    plugins = {"sim", "bench"}
    assert set(full) - plugins == set(COMMAND_MODULES)
    for command in COMMAND_MODULES:
        assert command in _subparsers(build_parser(command)), command
    assert command_of(["--zone", "h:1", "--ca-file", "x", "submit", "--gpus", "1"]) == "submit"
    assert command_of(["--help"]) is None


def test_python_dash_m_runs_the_cli_with_its_exit_codes() -> None:
    """`python -m laminar_cli` is the `laminar` command where no script was installed (the
    submit benchmark falls back to it): a bad flag is one line and exit 2, not "cannot be
    directly executed"."""
    result = subprocess.run(
        [sys.executable, "-m", "laminar_cli", "submit", "--gpus", "many", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("laminar: ") and "--gpus" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
