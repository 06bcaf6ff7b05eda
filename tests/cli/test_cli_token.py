"""`laminar token new` prints a token and a [[token]] line the router accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar_cli.main import main
from laminar_zone.auth import Role, TokenTable


def test_token_new_makes_a_line_the_tokens_file_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["token", "new", "--tenant", "alice", "--role", "admin"]) == 0
    token, *line = capsys.readouterr().out.splitlines()
    tokens = tmp_path / "tokens.toml"
    tokens.write_text("\n".join(line) + "\n")
    principal = TokenTable.load(tokens).authenticate(token)
    assert (principal.tenant, principal.role) == ("alice", Role.ADMIN)
    assert token not in tokens.read_text()  # only its hash is kept
    assert main(["token", "new", "--tenant", "not ok"]) == 2
    assert "--tenant" in capsys.readouterr().err
