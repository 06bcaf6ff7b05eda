"""`laminar usage` without a router: --since parsing, bad input, and the table."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest
from rich.console import Console, RenderableType

from laminar_api.v1 import zone_pb2
from laminar_base.errors import InvalidArgument
from laminar_cli import render
from laminar_cli.main import main
from laminar_cli.usage import parse_since

NOW = 1_800_000_000.0


def _text(renderable: RenderableType) -> str:
    console = Console(file=io.StringIO(), record=True, width=240, markup=False, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_since_takes_a_duration_back_from_now_or_an_iso_time() -> None:
    assert parse_since(None, NOW) == 0.0
    assert parse_since("7d", NOW) == NOW - 7 * 86400
    assert parse_since("1h30m", NOW) == NOW - 5400
    utc = datetime(2026, 11, 1, 8, 0, tzinfo=UTC).timestamp()
    assert parse_since("2026-11-01T08:00:00Z", NOW) == utc
    assert parse_since("2026-11-01T08:00:00", NOW) == utc  # no offset: UTC
    assert parse_since("2026-11-01T09:00:00+01:00", NOW) == utc
    assert parse_since("2026-11-01", NOW) == datetime(2026, 11, 1, tzinfo=UTC).timestamp()


@pytest.mark.parametrize("text", ["yesterday", "7 parsecs", "-5m", "2026-13-01", "2099-01-01"])
def test_bad_since_names_the_flag(text: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_since(text, NOW)
    assert caught.value.field == "--since"


def test_bad_since_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--zone", "127.0.0.1:1", "usage", "--since", "last tuesday"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--since" in err and "last tuesday" in err


def test_usage_table_shows_hours_per_tenant_and_kind_with_a_total() -> None:
    records = [
        zone_pb2.UsageRecord(
            tenant="alice",
            slice_kind="gpu:H100-80GB",
            gpu_seconds=7200.0,
            gpu_memory_byte_seconds=float(10 << 30) * 3600,
            lost_gpu_seconds=1800.0,
            subjobs=3,
        ),
        zone_pb2.UsageRecord(tenant="bob", slice_kind="mig:3g.40gb", gpu_seconds=360.0, subjobs=1),
    ]
    text = _text(render.usage_table(records, NOW - 86400, NOW))
    assert "tenant" in text and "lost GPU-hours" in text
    lines = [[w for w in line.split() if w not in "│┃"] for line in text.splitlines()]
    assert ["alice", "gpu:H100-80GB", "3", "2.000", "10.000", "0.500"] in lines
    assert ["bob", "mig:3g.40gb", "1", "0.100", "0.000", "0.000"] in lines
    assert ["total", "4", "2.100", "10.000", "0.500"] in lines
    empty = _text(render.usage_table([], 0.0, NOW))
    assert "all time" in empty and "no usage recorded" in empty
