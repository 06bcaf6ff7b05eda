from __future__ import annotations

import subprocess
import sys

import pytest

from cli.main import main


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["frobnicate"], "invalid choice"),
        (["pressure", "--agent", "127.0.0.1:1", "--gpu", "0", "--used", "lots"], "--used"),
        (
            ["pressure", "--agent", "127.0.0.1:1", "--gpu", "0", "--used", "1GiB", "--for", "soon"],
            "--for",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert len(err.strip().splitlines()) == 1


def test_demo_runs_and_leaves_nothing_running() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "demo", "--agents", "2"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "host-1" in result.stdout and "all 2 agents stopped cleanly" in result.stdout
    assert "30.0GiB" in result.stdout
