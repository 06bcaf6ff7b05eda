"""Every start-up failure is one line naming the cause and the key, exit code 2."""

from __future__ import annotations

import socket
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
