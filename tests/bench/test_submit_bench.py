"""`laminar bench submit`: a real router takes jobs one Submit at a time and in batches."""

from __future__ import annotations

import shutil
import sys

import pytest

from laminar_base.errors import InvalidArgument
from laminar_bench.submit import SubmitBenchSpec, _child_env, _instructions, run_submit_bench


def test_the_bench_reports_both_ways_of_submitting_and_the_clis_start() -> None:
    report = run_submit_bench(SubmitBenchSpec(jobs=30, batch=7, single=4, cli_runs=2))
    assert report["submit"]["jobs"] == 4 and report["submit_batch"]["jobs"] == 30
    for row in (report["submit"], report["submit_batch"]):
        assert row["jobs_per_second"] > 0 and row["router_cpu_ms_per_job"] >= 0
    assert report["some_queued"]  # no agents: every job waits in the journal's queue
    # Each `laminar submit` ran to exit 0 (else the run raises) beside the interpreter floor.
    cli = report["cli"]
    assert cli["submit"]["runs"] == cli["python_floor"]["runs"] == cli["library_floor"]["runs"] == 2
    assert cli["submit"]["wall_ms_median"] > 0 and cli["python_floor"]["cpu_ms_median"] > 0
    assert "instructions" not in cli  # only asked for with --instructions


def test_timed_commands_may_use_the_bytecode_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed `laminar` runs from compiled bytecode; a developer's
    PYTHONDONTWRITEBYTECODE would make every timed run compile our sources again."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("LAMINAR_ZONE", "elsewhere:1")
    env = _child_env("127.0.0.1:7411")
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert env["LAMINAR_ZONE"] == "127.0.0.1:7411" and env["LAMINAR_RETRY_SECONDS"] == "0"


def test_instruction_counts_follow_the_work_done(tmp_path: object) -> None:
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed: --instructions reports None here")
    env = _child_env("127.0.0.1:1")
    bare = _instructions([sys.executable, "-S", "-c", "pass"], env, str(tmp_path))
    more = _instructions([sys.executable, "-S", "-c", "sum(range(3_000_000))"], env, str(tmp_path))
    assert bare is not None and more is not None
    assert bare > 1_000_000  # an interpreter start is millions of instructions
    assert more > bare + 3_000_000  # three million additions cost at least one each
    failed = _instructions([sys.executable, "-S", "-c", "raise SystemExit(3)"], env, str(tmp_path))
    assert failed is None  # a run that failed counts nothing


@pytest.mark.parametrize(
    ("flag", "spec"),
    [
        ("--batch", SubmitBenchSpec(batch=0)),
        ("--jobs", SubmitBenchSpec(jobs=0)),
        ("--cli-runs", SubmitBenchSpec(cli_runs=-1)),
    ],
)
def test_bad_input_names_the_flag(flag: str, spec: SubmitBenchSpec) -> None:
    with pytest.raises(InvalidArgument) as err:
        run_submit_bench(spec)
    assert err.value.field == flag
