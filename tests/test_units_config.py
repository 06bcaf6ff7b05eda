from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from laminar_base.configlib import doc, load_config
from laminar_base.errors import ConfigError, InvalidArgument
from laminar_base.units import format_size, parse_duration, parse_size


def test_parse_size_units() -> None:
    assert parse_size("10GiB") == 10 * 1024**3
    assert parse_size("512MiB") == 512 * 1024**2
    assert parse_size("80GB") == 80 * 10**9
    assert parse_size("1.5KiB") == 1536
    assert parse_size("123") == 123
    assert format_size(40 * 1024**3) == "40.0GiB"


@pytest.mark.parametrize("bad", ["", "-1GiB", "ten", "5XB", "2PiB"])
def test_parse_size_rejects(bad: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_size(bad, field="gpu_mem")
    assert "gpu_mem" in str(info.value)


def test_parse_duration() -> None:
    assert parse_duration("250ms") == pytest.approx(0.25)
    assert parse_duration("2h30m") == pytest.approx(9000)
    assert parse_duration("1.5") == pytest.approx(1.5)
    with pytest.raises(InvalidArgument):
        parse_duration("soon")


@dataclasses.dataclass(frozen=True)
class _Server:
    listen: str = dataclasses.field(default="127.0.0.1:0", metadata=doc("address"))
    ttl: float = dataclasses.field(default=0.2, metadata=doc("lease TTL", unit="seconds"))
    limit: int = dataclasses.field(default=0, metadata=doc("limit", unit="bytes"))
    debug: bool = dataclasses.field(default=False, metadata=doc("debug"))
    peers: tuple[str, ...] = dataclasses.field(default=(), metadata=doc("peers"))


@dataclasses.dataclass(frozen=True)
class _Root:
    server: _Server = dataclasses.field(default_factory=_Server)


def test_config_precedence(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[server]\nlisten = "0.0.0.0:1"\nttl = "1s"\nlimit = "1KiB"\n')
    cfg = load_config(_Root, toml_path=path)
    assert cfg.server.listen == "0.0.0.0:1" and cfg.server.ttl == 1.0 and cfg.server.limit == 1024
    cfg = load_config(
        _Root,
        toml_path=path,
        env={"LAMINAR_SERVER_LISTEN": "1.2.3.4:5", "LAMINAR_SERVER_PEERS": "a:1, b:2"},
    )
    assert cfg.server.listen == "1.2.3.4:5" and cfg.server.peers == ("a:1", "b:2")
    cfg = load_config(
        _Root, toml_path=path, env={"LAMINAR_SERVER_LISTEN": "x"}, overrides={"server.listen": "y"}
    )
    assert cfg.server.listen == "y"


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[server]\nnope = 1\n")
    with pytest.raises(ConfigError, match=r"server\.nope"):
        load_config(_Root, toml_path=path)
    with pytest.raises(ConfigError, match=r"server\.debug"):
        load_config(_Root, env={"LAMINAR_SERVER_DEBUG": "maybe"})
    with pytest.raises(ConfigError, match=r"server\.limit"):
        load_config(_Root, overrides={"server.limit": "lots"})
