"""``laminar certs init`` writes each certificate's roles: ``NAME=ROLE[+ROLE]`` per host,
or ``--role`` for every bare name, so that many agents take one short command. A bare
name without ``--role`` gets a certificate that may make no control call, and the
command says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar_base.security import roles_of_certificate
from laminar_cli.main import main


def test_role_flag_gives_bare_names_their_role(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pki"
    hosts = "gpu-01,gpu-02,router-1=router+peer"
    assert main(["certs", "init", "--dir", str(out), "--role", "agent", "--hosts", hosts]) == 0
    assert "no role" not in capsys.readouterr().out
    for name in ("gpu-01", "gpu-02"):
        assert roles_of_certificate((out / f"{name}.pem").read_bytes()) == {"agent"}
    assert roles_of_certificate((out / "router-1.pem").read_bytes()) == {"router", "peer"}


def test_a_bare_name_without_a_role_is_named_and_a_bad_role_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pki"
    assert main(["certs", "init", "--dir", str(out), "--hosts", "ops,gpu-01=agent"]) == 0
    said = capsys.readouterr().out
    assert "ops: no role" in said and "gpu-01: no role" not in said
    assert roles_of_certificate((out / "ops.pem").read_bytes()) == frozenset()
    for bad in ("wizard", "agent+wizard"):
        argv = ["certs", "init", "--dir", str(out), "--role", bad, "--hosts", "x"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "--role" in err and "wizard" in err, err
        assert not (out / "x.pem").exists()
