"""A small ``laminar bench airlock`` run: two real agents, real subjobs, both policies.

The figures are never judged; the test checks that the report has every field and that
the two policies behave as they are defined: the OOM-killer baseline kills (and, with
the largest process a critical one, kills high-priority work), Airlock suspends the
lowest classes instead and kills nothing in the step trials.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from laminar_base.errors import InvalidArgument
from laminar_bench.cli import register


def run_cli(argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="laminar")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    out = io.StringIO()
    code: int = args.func(args, Console(file=out, width=200))
    return code, out.getvalue()


def test_bench_airlock_compares_the_ladder_with_the_oom_killer(tmp_path: Path) -> None:
    work = tmp_path / "work"
    code, out = run_cli(
        ["bench", "airlock", "--trials", "2", "--work-dir", str(work), "-o", "json"]
    )
    assert code == 0
    report = json.loads(out)
    assert report["environment"]["cores"] >= 1
    ladder = report["policies"]["ladder"]["step"]
    oom = report["policies"]["oom-killer"]["step"]
    for figures in (ladder, oom):
        assert figures["subjobs"] == 8
        assert figures["reaction_samples"] == 2
        assert figures["reaction_p50_ms"] > 0
    # The ladder relieves 90 GiB on 80 GiB by suspending batch and opportunistic work.
    assert ladder["killed"] == 0 and ladder["suspended"] == 4
    assert ladder["high_priority_work_lost_gpu_seconds"] == 0
    # The baseline kills the largest process: the 30 GiB critical subjob, every trial.
    assert oom["killed_by_class"]["critical"] == 2 and oom["suspended"] == 0
    assert oom["high_priority_work_lost_gpu_seconds"] > 0
    assert not [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any(str(work) in part for part in (p.info["cmdline"] or []))
    ]


def test_bench_airlock_rejects_bad_input_naming_the_flag() -> None:
    with pytest.raises(InvalidArgument) as err:
        run_cli(["bench", "airlock", "--trials", "0"])
    assert err.value.field == "--trials"
