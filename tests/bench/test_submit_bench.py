"""`laminar bench submit`: a real router takes jobs one Submit at a time and in batches."""

from __future__ import annotations

import pytest

from laminar_base.errors import InvalidArgument
from laminar_bench.submit import SubmitBenchSpec, run_submit_bench


def test_the_bench_reports_both_ways_of_submitting_and_the_clis_start() -> None:
    report = run_submit_bench(SubmitBenchSpec(jobs=30, batch=7, single=4, cli_runs=2))
    assert report["submit"]["jobs"] == 4 and report["submit_batch"]["jobs"] == 30
    for row in (report["submit"], report["submit_batch"]):
        assert row["jobs_per_second"] > 0 and row["router_cpu_ms_per_job"] >= 0
    assert report["some_queued"]  # no agents: every job waits in the journal's queue
    # Each `laminar submit` ran to exit 0 (else the run raises) beside the interpreter floor.
    cli = report["cli"]
    assert cli["submit"]["runs"] == cli["python_floor"]["runs"] == 2
    assert cli["submit"]["wall_ms_median"] > 0 and cli["python_floor"]["cpu_ms_median"] > 0


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
