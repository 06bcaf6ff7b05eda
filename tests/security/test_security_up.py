"""`laminar up --shared-secret`: a local cluster whose control calls carry a fresh secret."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from waiting import gate_code, is_gone, wait_for

from laminar_cli.main import main


def test_up_with_a_shared_secret_places_work_and_stops_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, log = tmp_path / "state", tmp_path / "up.log"
    argv = ["up", "--listen", "127.0.0.1:0", "--agents", "1", "--fake-gpus", "2xA100-40GB"]
    with log.open("wb") as out:
        up = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "laminar_cli.main",
                *argv,
                "--state-dir",
                str(state),
                "--shared-secret",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "Ctrl-C stops everything" in log.read_text() or up.poll() is not None)
        assert up.poll() is None, log.read_text()
        secret = state / "shared-secret"
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        zone = json.loads((state / "zone-zone-1" / "zone.json").read_text())["address"]
        agent = json.loads((state / "host-0" / "agent.json").read_text())["address"]
        assert "authenticated by shared secret" in (state / "host-0" / "agent.log").read_text()

        capsys.readouterr()
        gate = tmp_path / "never"  # still running at stop: up must stop it through the agent
        assert main(["--zone", zone, "submit", "--gpus", "1", "--", sys.executable, "-c",
                     gate_code(gate)]) == 0  # fmt: skip
        job_id = capsys.readouterr().out.strip()

        def running() -> bool:
            capsys.readouterr()
            main(["--zone", zone, "job", job_id, "-o", "json"])
            return bool(json.loads(capsys.readouterr().out)["state"] == "JOB_RUNNING")

        wait_for(running)
        assert main(["inventory", "--agent", agent]) == 1
        assert "UNAUTHENTICATED" in capsys.readouterr().err
        assert main(["--secret-file", str(secret), "inventory", "--agent", agent]) == 0
        descendants = psutil.Process(up.pid).children(recursive=True)
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0, log.read_text()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert "all 2 daemons stopped cleanly" in log.read_text()
    wait_for(lambda: all(is_gone(p.pid) for p in descendants), timeout_seconds=10)
