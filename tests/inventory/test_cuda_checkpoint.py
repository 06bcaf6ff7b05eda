"""Finding NVIDIA's cuda-checkpoint at start, and toggling a process through it, with a
stand-in binary (a small script that records its calls) in place of the real one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from laminar_agent.inventory.cuda_checkpoint import (
    CudaCheckpoint,
    ToggleFailed,
    detect_cuda_checkpoint,
)

DRIVER = "550.54.15"


def stand_in(folder: Path, *, help_text: str = "usage: --toggle --pid PID", code: int = 0) -> Path:
    """A ``cuda-checkpoint`` in ``folder`` that prints ``help_text`` for --help, appends
    every other call's arguments to ``calls`` beside it, and exits ``code``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cuda-checkpoint"
    calls = folder / "calls"
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"if sys.argv[1:] == ['--help']:\n    print({help_text!r})\n    sys.exit(0)\n"
        f"with open({str(calls)!r}, 'a') as f:\n    f.write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"print('toggled' if {code} == 0 else 'no CUDA context in that process')\n"
        f"sys.exit({code})\n"
    )
    path.chmod(0o755)
    return path


def test_found_on_path_or_where_configured(tmp_path: Path) -> None:
    binary = stand_in(tmp_path / "bin")
    found = detect_cuda_checkpoint("", DRIVER, search_path=str(tmp_path / "bin"))
    assert found.tool == CudaCheckpoint(str(binary), DRIVER)
    assert found.detail == f"{binary} (driver {DRIVER})"
    configured = detect_cuda_checkpoint(str(binary), DRIVER, search_path="")
    assert configured.is_available


@pytest.mark.parametrize(
    ("configured", "driver", "why"),
    [
        ("", DRIVER, "no cuda-checkpoint binary on PATH"),
        ("off", DRIVER, "turned off"),
        ("OFF", DRIVER, "turned off"),
        ("{bin}", "535.104.05", "driver 535.104.05 cannot toggle CUDA state (needs R550"),
        ("{bin}", "", "driver unknown cannot toggle"),
        ("{folder}", DRIVER, "is not an executable file"),
        ("{folder}/missing", DRIVER, "is not an executable file"),
    ],
)
def test_absent_says_why(tmp_path: Path, configured: str, driver: str, why: str) -> None:
    binary = stand_in(tmp_path / "bin")
    setting = configured.format(bin=binary, folder=tmp_path)
    found = detect_cuda_checkpoint(setting, driver, search_path=str(tmp_path / "empty"))
    assert found.tool is None
    assert why in found.detail


def test_a_binary_without_toggle_is_not_used(tmp_path: Path) -> None:
    binary = stand_in(tmp_path / "bin", help_text="usage: --get-state only")
    found = detect_cuda_checkpoint(str(binary), DRIVER)
    assert found.tool is None and "without offering --toggle" in found.detail


async def test_toggle_runs_the_binary_with_the_pid_and_reports_a_failure(tmp_path: Path) -> None:
    good = CudaCheckpoint(str(stand_in(tmp_path / "good")), DRIVER)
    await good.toggle(os.getpid())
    await good.toggle(4242)
    calls = (tmp_path / "good" / "calls").read_text().splitlines()
    assert calls == [f"--toggle --pid {os.getpid()}", "--toggle --pid 4242"]
    bad = CudaCheckpoint(str(stand_in(tmp_path / "bad", code=3)), DRIVER)
    with pytest.raises(ToggleFailed, match="exited 3: no CUDA context in that process"):
        await bad.toggle(4242)
