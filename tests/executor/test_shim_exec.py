"""The supervisor prepares the exec before it forks; the child searches the job's PATH
as ``os.execvpe`` does. Real processes: ``python -I -S shim.py DIR``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from laminar_agent.executor import SHIM_ENV, SHIM_PATH


def _run_shim(tmp_path: Path, launch: dict[str, object]) -> dict[str, object]:
    sdir = tmp_path / "subjob"
    sdir.mkdir(parents=True)
    (sdir / "launch.json").write_text(json.dumps(launch))
    subprocess.run(
        [sys.executable, "-I", "-S", SHIM_PATH, str(sdir)], env=SHIM_ENV, check=False, timeout=60
    )
    record: dict[str, object] = json.loads((sdir / "exit.json").read_text())
    return record


def _launch(tmp_path: Path, command: list[str], path: str) -> dict[str, object]:
    return {"command": command, "env": {"PATH": path}, "cwd": str(tmp_path)}


def _script(folder: Path, name: str, body: str, mode: int = 0o755) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(f"#!/bin/sh\n{body}\n")
    os.chmod(folder / name, mode)


def test_the_command_is_found_on_the_jobs_path(tmp_path: Path) -> None:
    _script(tmp_path / "bin", "job-cmd", "exit 7")
    record = _run_shim(tmp_path, _launch(tmp_path, ["job-cmd"], f"/nowhere:{tmp_path / 'bin'}"))
    assert record["exit_code"] == 7 and "error" not in record


def test_a_found_but_refused_command_reports_why(tmp_path: Path) -> None:
    """As execvpe: the first error other than "not there" wins over a later ENOENT."""
    _script(tmp_path / "a", "job-cmd", "exit 0", mode=0o644)  # not executable
    # (root too: exec needs an x bit for everyone)
    record = _run_shim(tmp_path, _launch(tmp_path, ["job-cmd"], f"{tmp_path / 'a'}:/nowhere"))
    assert record["exit_code"] == 127
    assert "Permission denied" in str(record["error"]), record


def test_a_missing_command_and_a_bad_launch_file_end_127(tmp_path: Path) -> None:
    record = _run_shim(tmp_path, _launch(tmp_path, ["no-such-cmd-l15"], "/nowhere:/bin"))
    assert record["exit_code"] == 127 and "No such file" in str(record["error"])
    bad = tmp_path / "bad"
    bad.mkdir()
    record = _run_shim(bad, {"command": ["true"], "env": {}})  # no cwd
    assert record["exit_code"] == 127 and "launch.json" in str(record["error"])


def test_an_empty_path_searches_the_working_directory_as_execvpe(tmp_path: Path) -> None:
    """PATH="" is one empty entry (the working directory), not "no PATH" (os.defpath)."""
    _script(tmp_path, "job-cmd", "exit 5")
    assert _run_shim(tmp_path, _launch(tmp_path, ["job-cmd"], ""))["exit_code"] == 5
    record = _run_shim(tmp_path / "x", {"command": ["true"], "env": {}, "cwd": str(tmp_path)})
    assert record["exit_code"] == 0  # no PATH at all: os.defpath finds true


def test_exit_records_read_back_as_written() -> None:
    from laminar_agent.shim import _record_json

    for record in (
        {"exit_code": 0, "signal": None, "peak_rss_bytes": 1 << 40, "run_seconds": 0.25},
        {"exit_code": None, "signal": 9, "ended_unix": 1795735492.298537, "fenced": True},
        {"exit_code": 127, "error": 'cmd: "quoted"\nand \\ \u00e9 \x01', "fenced": False},
    ):
        assert json.loads(_record_json(record)) == record
