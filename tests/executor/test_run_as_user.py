"""Subjobs of an agent running as root take an unprivileged identity (executor.run_as_user).

These tests need root (CI runs them as root in a container); elsewhere they skip
with the reason printed. What holds for a non-root agent (subjobs run as the
agent itself) is tested without root.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_executor import Recorder, make_spec, poll_until

from laminar_agent.config import AgentConfig
from laminar_agent.executor import Executor, RunAs, resolve_run_as
from laminar_agent.server import log_subjob_user
from laminar_base.configlib import load_config
from laminar_base.errors import ConfigError

IS_ROOT = os.geteuid() == 0

ID_DUMP = (
    "import json, os, sys\n"
    "ckpt = os.environ['LAMINAR_CHECKPOINT_DIR']\n"
    "open(os.path.join(ckpt, 'step'), 'w').write('1')\n"
    "open(os.environ['LAMINAR_GPU_MEM_FILE'], 'w').write('123')\n"
    "print(json.dumps({'uid': os.getuid(), 'euid': os.geteuid(), 'gid': os.getgid(),"
    " 'groups': sorted(os.getgroups()), 'home': os.environ.get('HOME'),"
    " 'user': os.environ.get('USER')}))\n"
    "print('to stderr', file=sys.stderr)\n"
)


def _skip(reason: str) -> None:
    print(reason)
    pytest.skip(reason)


def _need_root() -> None:
    if not IS_ROOT:
        _skip(f"needs root to change user (running as uid {os.geteuid()})")


def _open_to_others(path: Path) -> bool:
    """Whether any user may execute ``path`` (every folder above it traversable)."""
    resolved = path.resolve()
    if not resolved.stat().st_mode & stat.S_IXOTH:
        return False
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in resolved.parents)


def python_for_others() -> str:
    """A Python the subjob's user may run: ours, or the system's when ours is under a
    folder only root may enter (a pyenv under /root)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(candidate).exists() and _open_to_others(Path(candidate)):
            return candidate
    _skip(f"no Python that another user may run ({sys.executable} is root's only)")
    raise AssertionError("unreachable")


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every user can traverse (pytest's tmp_path is root-only: mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="laminar-runas-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_non_root_agent_runs_subjobs_as_itself() -> None:
    assert resolve_run_as("nobody", euid=1000) is None
    assert resolve_run_as("", euid=0) is None
    assert resolve_run_as("root", euid=0) is None


def test_an_unknown_user_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"executor\.run_as_user"):
        resolve_run_as("no-such-user-laminar", euid=0)
    assert load_config(AgentConfig).executor.run_as_user == "nobody"


async def test_root_agent_runs_subjobs_as_the_configured_user(open_dir: Path) -> None:
    _need_root()
    run_as = resolve_run_as("nobody")
    assert run_as is not None
    nobody = pwd.getpwnam("nobody")
    rec = Recorder()
    ex = Executor(open_dir / "state", on_exit=rec, run_as=run_as)
    (open_dir / "state").mkdir(mode=0o755)
    checkpoint = open_dir / "ckpt" / "job-1"
    (open_dir / "ckpt").mkdir()
    (open_dir / "ckpt").chmod(0o777)  # a shared checkpoint area; job folders are per user
    spec = make_spec(
        open_dir,
        "u1",
        ID_DUMP,
        unit_start=0,
        unit_count=4,
        checkpoint_dir=str(checkpoint),
        env={"HOME": "/override"},
    )
    spec.command = [python_for_others(), *spec.command[1:]]
    await ex.launch(spec)
    await poll_until(lambda: "u1" in rec.exits, "exit of u1")
    sdir = ex.subjob_dir("u1")
    info = rec.exits["u1"]
    assert info.exit_code == 0, (info, (sdir / "stderr").read_text())
    seen = json.loads((sdir / "stdout").read_text())
    assert seen["uid"] == seen["euid"] == nobody.pw_uid
    assert seen["gid"] == nobody.pw_gid
    assert seen["groups"] == sorted(run_as.groups)
    assert 0 not in seen["groups"]
    assert seen["user"] == "nobody" and seen["home"] == "/override"
    assert (sdir / "stderr").read_text() == "to stderr\n"
    # The checkpoint folder is the subjob's; its logs, exit.json and the folder holding
    # them stay root's and private (the subjob writes its logs through inherited
    # descriptors), so a subjob can neither swap them for links nor another read them.
    for path in (checkpoint, checkpoint / "step"):
        assert path.stat().st_uid == nobody.pw_uid, path
    for path in (sdir / "stdout", sdir / "stderr", sdir / "exit.json"):
        assert path.stat().st_uid == 0, path
        assert path.stat().st_mode & 0o077 == 0, path
    assert sdir.stat().st_uid == 0
    assert stat.S_IMODE(sdir.stat().st_mode) == 0o711  # made by the (root) supervisor
    # The launch record went to the launcher through its pipe: no copy of the job's
    # environment is left on disk.
    assert not (sdir / "launch.json").exists()
    assert ex.gpu_mem_file("u1").read_text() == "123"
    assert ex.gpu_mem_file("u1").parent != sdir
    await ex.close()


async def test_a_subjob_that_may_not_enter_its_workdir_fails_with_a_reason(
    tmp_path: Path, open_dir: Path
) -> None:
    _need_root()
    rec = Recorder()
    ex = Executor(open_dir / "state", on_exit=rec, run_as=resolve_run_as("nobody"))
    spec = make_spec(tmp_path, "u2", "print('hi')")
    spec.command = [str(tmp_path / "not-for-nobody.sh")]
    (tmp_path / "not-for-nobody.sh").write_text("#!/bin/sh\necho no\n")
    (tmp_path / "not-for-nobody.sh").chmod(0o700)
    await ex.launch(spec)
    await poll_until(lambda: "u2" in rec.exits, "exit of u2")
    assert rec.exits["u2"].exit_code == 127
    assert "Permission denied" in rec.exits["u2"].error
    await ex.close()


def test_the_agent_says_at_start_who_subjobs_run_as(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level("INFO", logger="laminar.agent")
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    log_subjob_user(None, "nobody")
    assert "not root: subjobs run as the agent's own user" in caplog.text
    caplog.clear()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    log_subjob_user(None, "")
    assert "subjobs run as root" in caplog.text
    caplog.clear()
    log_subjob_user(RunAs("nobody", 65534, 65534, (65534,), "/nonexistent"), "nobody")
    assert "subjobs run as user nobody (uid 65534" in caplog.text
