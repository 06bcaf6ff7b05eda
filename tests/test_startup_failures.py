"""Every start-up failure is one line naming the cause and the key, exit code 2."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from laminar_agent import __main__ as agent_main
from laminar_zone import __main__ as zone_main

DAEMONS: list[tuple[Any, list[str]]] = [
    (agent_main, ["--gpu-backend", "fake"]),
    (zone_main, []),
]


@pytest.mark.parametrize(("module", "extra"), DAEMONS)
def test_a_port_in_use_is_one_line_naming_server_listen(
    module: Any, extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "s"), *extra]
        assert module.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "server.listen" in err[0] and str(port) in err[0], err


@pytest.mark.parametrize(("module", "extra"), DAEMONS)
def test_a_state_dir_that_cannot_be_used_is_one_line_naming_the_key(
    module: Any, extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = ["--listen", "127.0.0.1:0", "--state-dir", str(blocker / "state"), *extra]
    assert module.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "server.state_dir" in err[0], err


def _pki(tmp_path: Path) -> Path:
    """A PKI folder only its owner may enter (0700), as an operator locks /etc/laminar/pki
    (under pytest's own 0700 folder, which nobody cannot enter either)."""
    pki = tmp_path / "pki"
    pki.mkdir(mode=0o700)
    for name in ("ca.pem", "cert.pem", "key.pem", "secret"):
        (pki / name).write_text("x\n")
        (pki / name).chmod(0o600)
    return pki


CREDENTIAL_FLAGS = [
    (["--tls-ca-file", "{pki}/ca.pem", "--tls-cert-file", "{pki}/cert.pem"], "tls.ca_file"),
    (["--shared-secret-file", "{pki}/secret"], "control.shared_secret_file"),
]


def _unprivileged() -> list[str]:
    """A prefix that runs a command as nobody when the test runs as root (root reads any
    file); none otherwise, and the test takes the folder's permissions away instead."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        print("running as root and setpriv(1) is not installed: cannot drop to nobody")
        pytest.skip("running as root and setpriv(1) is not installed: cannot drop to nobody")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]


def _start_locked_out(
    pki: Path, daemon: str, args: list[str], env: dict[str, str] | None = None
) -> str:
    """Start ``daemon`` as a user who may not enter ``pki``; assert exit 2 and return its
    stderr, which must be one line."""
    argv = [str(Path(sys.executable).parent / daemon), *args]
    prefix = _unprivileged()
    if not prefix:
        pki.chmod(0o000)
    try:
        result = subprocess.run(
            [*prefix, *argv], capture_output=True, text=True, timeout=60, env=env
        )
    finally:
        pki.chmod(0o700)
    err = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(err) == 1, result.stderr
    assert "Permission denied" in err[0], err
    return err[0]


@pytest.mark.parametrize(("flags", "key"), CREDENTIAL_FLAGS)
@pytest.mark.parametrize("daemon", ["laminar-agent", "laminar-zone"])
def test_a_credential_the_daemon_may_not_read_is_one_line_naming_the_key(
    daemon: str, flags: list[str], key: str, tmp_path: Path
) -> None:
    """The router as a DynamicUser reading a 0700 PKI directory used to print a traceback."""
    pki = _pki(tmp_path)
    args = ["--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "s")]
    args += [f.format(pki=pki) for f in flags]
    if daemon == "laminar-agent":
        args += ["--gpu-backend", "fake"]
    assert key in _start_locked_out(pki, daemon, args)


@pytest.mark.parametrize("daemon", ["laminar-agent", "laminar-zone"])
def test_a_credential_path_that_is_a_folder_is_one_line_naming_the_key(
    daemon: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = agent_main if daemon == "laminar-agent" else zone_main
    extra = ["--gpu-backend", "fake"] if daemon == "laminar-agent" else []
    argv = ["--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "s")]
    assert module.main([*argv, "--shared-secret-file", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "control.shared_secret_file" in err[0], err
    assert "is a directory" in err[0], err


def test_an_unreadable_tokens_file_is_one_line_naming_auth_tokens_file(tmp_path: Path) -> None:
    pki = _pki(tmp_path)
    args = ["--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "s")]
    env = {**os.environ, "LAMINAR_AUTH_TOKENS_FILE": str(pki / "secret")}
    assert "auth.tokens_file" in _start_locked_out(pki, "laminar-zone", args, env)


def test_an_unreadable_config_file_is_one_line_naming_it(tmp_path: Path) -> None:
    pki = _pki(tmp_path)
    args = ["--config", str(pki / "secret"), "--state-dir", str(tmp_path / "s")]
    assert "--config" in _start_locked_out(pki, "laminar-zone", args)
