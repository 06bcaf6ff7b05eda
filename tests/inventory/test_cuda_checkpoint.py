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
    assert found.detail == f"{binary} (driver {DRIVER}, toggle only)"
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


def stateful_stand_in(folder: Path, state: str) -> Path:
    """A ``cuda-checkpoint`` as R570 and later: ``--get-state`` prints the state kept in
    ``state`` beside it (one process), ``--toggle`` flips running and checkpointed,
    ``--action unlock`` unlocks; every call but --help is appended to ``calls``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "state").write_text(state)
    path = folder / "cuda-checkpoint"
    path.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, sys\n"
        f"here = pathlib.Path({str(folder)!r})\n"
        "if sys.argv[1:] == ['--help']:\n"
        "    print('--get-state --pid <pid>\\n--toggle --pid <pid>')\n    sys.exit(0)\n"
        "with open(here / 'calls', 'a') as f:\n    f.write(' '.join(sys.argv[1:-2]) + '\\n')\n"
        "state = (here / 'state').read_text()\n"
        "if sys.argv[1] == '--get-state':\n    print(state)\n"
        "elif sys.argv[1] == '--toggle' and state in ('running', 'checkpointed'):\n"
        "    (here / 'state').write_text({'running': 'checkpointed'}.get(state, 'running'))\n"
        "elif sys.argv[1:3] == ['--action', 'unlock'] and state == 'locked':\n"
        "    (here / 'state').write_text('running')\n"
        "else:\n    print('the operation cannot be performed in the present state')\n"
        "    sys.exit(1)\n"
    )
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("state", "want", "done", "calls", "after"),
    [
        ("running", "checkpointed", True, ["--get-state", "--toggle"], "checkpointed"),
        ("checkpointed", "running", True, ["--get-state", "--toggle"], "running"),
        # Already there (a toggle that ended unrecorded): a blind toggle would undo it.
        ("checkpointed", "checkpointed", False, ["--get-state"], "checkpointed"),
        ("running", "running", False, ["--get-state"], "running"),
        # Locked (a restore not unlocked yet, or a lock): its memory is on the GPU.
        ("locked", "running", True, ["--get-state", "--action unlock"], "running"),
        (
            "locked",
            "checkpointed",
            True,
            ["--get-state", "--action unlock", "--toggle"],
            "checkpointed",
        ),
    ],
)
async def test_a_process_is_moved_only_the_way_asked_for(
    tmp_path: Path, state: str, want: str, done: bool, calls: list[str], after: str
) -> None:
    found = detect_cuda_checkpoint(str(stateful_stand_in(tmp_path, state)), DRIVER)
    assert found.tool is not None and "toggle only" not in found.detail
    assert await found.tool.to_state(4242, want) is done
    assert (tmp_path / "calls").read_text().split("\n")[:-1] == calls
    assert (tmp_path / "state").read_text() == after


async def test_an_unknown_state_is_a_failure_and_r550_toggles_blindly(tmp_path: Path) -> None:
    tool = detect_cuda_checkpoint(str(stateful_stand_in(tmp_path / "a", "failed")), DRIVER).tool
    assert tool is not None
    with pytest.raises(ToggleFailed, match="in CUDA state 'failed'"):
        await tool.to_state(4242, "running")
    r550 = detect_cuda_checkpoint(str(stand_in(tmp_path / "b")), DRIVER)
    assert r550.tool is not None and r550.detail.endswith(", toggle only)")
    assert await r550.tool.to_state(4242, "running") is True
    assert (tmp_path / "b" / "calls").read_text() == "--toggle --pid 4242\n"
