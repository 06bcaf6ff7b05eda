"""``sim replay`` on small synthetic Philly-format traces, and a slice of the real one."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from rich.console import Console

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause, end_cause
from laminar_base.errors import InvalidArgument
from laminar_sim.cli import register
from laminar_sim.replay import FifoReplay, LaminarReplay, ReplaySpec, read_jobs, run_replay

HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


def trace(tmp_path: Path, rows: Sequence[tuple[str, float, int]], cluster: str = "c1") -> Path:
    path = tmp_path / "philly_jobs_pollux.csv"
    body = "".join(f"{t},{d},{g},{d * g},{cluster}\n" for t, d, g in rows)
    path.write_text(HEADER + body)
    return path


def test_backfill_runs_a_short_job_ahead_of_a_blocked_gang_without_delaying_it(
    tmp_path: Path,
) -> None:
    # 3 hosts x 8 GPUs. A and A2: one host each for 100 s. B (gang of 2 full hosts) waits
    # for them and the free third host: the router expects it to start at 100 s, when the
    # third host's 8 free GPUs and A's 8 cover its 16 (ZoneCore.expected_start counts what
    # is free now and the running jobs' ends). C: 1 GPU for 10 s fits
    # on the third host and ends before B can start: backfilled. D: 1 GPU for 500 s would
    # delay B: it waits.
    path = trace(
        tmp_path,
        [
            ("2017-10-01 00:00:00", 100, 8),
            ("2017-10-01 00:00:00", 100, 8),
            ("2017-10-01 00:00:01", 50, 16),
            ("2017-10-01 00:00:02", 10, 1),
            ("2017-10-01 00:00:03", 500, 1),
        ],
    )
    spec = ReplaySpec(path, hosts=3)
    jobs = read_jobs(spec)
    laminar = LaminarReplay(spec, jobs)
    laminar_report = laminar.run("laminar", None)
    fifo = FifoReplay(spec, jobs)
    fifo_report = fifo.run("fifo", None)
    # Queue times. Laminar: A 0, A2 0, C 0 (backfilled), B 99 (when A and A2 end, not
    # later), D 97 (beside B). FIFO: A 0, A2 0, B 99, C 98, D 97.
    assert sorted(laminar.stats.queue) == [0.0, 0.0, 0.0, 97.0, 99.0]
    assert sorted(fifo.stats.queue) == [0.0, 0.0, 97.0, 98.0, 99.0]
    assert fifo_report["queue_seconds"]["mean"] > laminar_report["queue_seconds"]["mean"]
    assert laminar_report["finished"] == fifo_report["finished"] == 5


def test_a_gang_s_expected_start_counts_the_host_free_now(tmp_path: Path) -> None:
    # 2 hosts x 8 GPUs. A: one host for 100 s. B (gang of 2 full hosts) needs A's host and
    # the free one: with the free host counted (EASY's shadow time), B is expected at 100 s,
    # so C (1 GPU for 10 s) backfills onto the free host and ends long before; D (1 GPU for
    # 500 s) would hold that host past 100 s and delay B: it waits until B is done. Counting
    # only the running jobs' ends (8 GPUs, short of B's 16), the router had no estimate for
    # B and let nothing backfill: C waited behind B.
    path = trace(
        tmp_path,
        [
            ("2017-10-01 00:00:00", 100, 8),
            ("2017-10-01 00:00:01", 50, 16),
            ("2017-10-01 00:00:02", 10, 1),
            ("2017-10-01 00:00:03", 500, 1),
        ],
    )
    laminar = LaminarReplay(ReplaySpec(path, hosts=2), read_jobs(ReplaySpec(path, hosts=2)))
    laminar.run("laminar", None)
    # Queue times: A 0, C 0 (backfilled), B 99 (at 100 s, undelayed), D 147 (after B).
    assert sorted(laminar.stats.queue) == [0.0, 0.0, 99.0, 147.0]


def test_a_job_that_fails_is_retried_by_the_router_s_lifecycle(tmp_path: Path) -> None:
    # Job 1 (a gang of 2 hosts) exits with a failure on its first attempt; with one retry
    # allowed, the router's core (ZoneCore.evaluate) retries it, and it succeeds. Job 0
    # fails and has no retry left: the router fails it.
    path = trace(
        tmp_path,
        [("2017-10-01 00:00:00", 30, 1), ("2017-10-01 00:00:05", 20, 16)],
    )
    spec = ReplaySpec(path, hosts=2)
    laminar = LaminarReplay(spec, read_jobs(spec), failures={0: 2, 1: 1}, max_retries=1)
    report = laminar.run("laminar", None)
    assert report["finished"] == 2
    once, gang = laminar.ended["j0"], laminar.ended["j1"]
    assert gang.state == zone_pb2.JOB_SUCCEEDED and gang.retries_used == 1
    assert [(p.attempt, p.state) for p in gang.placements] == [
        (1, common_pb2.FAILED),
        (1, common_pb2.FAILED),
        (2, common_pb2.SUCCEEDED),
        (2, common_pb2.SUCCEEDED),
    ]
    assert {end_cause(p.end_cause) for p in gang.placements} == {EndCause.EXITED}
    assert once.state == zone_pb2.JOB_FAILED and once.attempts == 2
    # Job 0's retry is placed as its first attempt ends (30 s), before the gang, which
    # needs every GPU: the gang starts at 60 s, fails at 80 s, and its retry ends at 100 s.
    assert laminar.stats.jct == [60.0, 95.0]
    # Nothing runs and nothing is left in the router's memory.
    assert laminar.held == {} and laminar.core.entries == {}
    assert all(not host.core.live_states for host in laminar.hosts)


def test_free_gpus_split_across_hosts_count_as_fragmentation(tmp_path: Path) -> None:
    # Two 6-GPU jobs leave 2 + 2 GPUs free; a 4-GPU job needs them on one host and waits.
    path = trace(
        tmp_path,
        [
            ("2017-10-01 00:00:00", 100, 6),
            ("2017-10-01 00:00:00", 100, 6),
            ("2017-10-01 00:00:10", 10, 4),
            ("2017-10-01 00:00:50", 10, 1),
        ],
    )
    report = run_replay(ReplaySpec(path, hosts=2))
    for figures in report["policies"].values():
        # 4 of 16 GPUs free but useless to the head from 10 s to the last arrival at 50 s.
        assert figures["fragmentation_ratio"] == pytest.approx(4 * 40 / (16 * 50))
        assert figures["queue_seconds"]["p99"] == 90.0  # it waited for a 6-GPU job to end


def test_every_job_ends_and_no_host_is_overcommitted(tmp_path: Path) -> None:
    rows = [
        (f"2017-10-01 00:{i // 60:02d}:{i % 60:02d}", 30 + (i * 7) % 90, [1, 2, 4, 8, 16][i % 5])
        for i in range(120)
    ]
    spec = ReplaySpec(trace(tmp_path, rows), hosts=3)
    report = run_replay(spec)
    for figures in report["policies"].values():
        assert figures["finished"] == report["jobs"] == 120
        assert 0 < figures["gpu_utilization_ratio"] <= 1.0
        assert 0 <= figures["fragmentation_ratio"] <= 1.0
    again = run_replay(spec)
    for name in report["policies"]:
        report["policies"][name].pop("events_per_second")
        again["policies"][name].pop("events_per_second")
    assert report == again


def test_jobs_bigger_than_the_cluster_are_left_out(tmp_path: Path) -> None:
    spec = ReplaySpec(
        trace(tmp_path, [("2017-10-01 00:00:00", 10, 64), ("2017-10-01 00:00:05", 10, 2)]), hosts=2
    )
    assert [j.gpus for j in read_jobs(spec)] == [2]


def _cli(argv: list[str]) -> str:
    parser = argparse.ArgumentParser(prog="laminar")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    out = io.StringIO()
    assert args.func(args, Console(file=out, width=200)) == 0
    return out.getvalue()


def test_real_trace_slice_json(traces_dir: Path) -> None:
    folder = traces_dir / "philly-pollux"
    if not folder.is_dir():
        pytest.skip(f"{folder} is not present")
    report = json.loads(
        _cli(
            [
                "sim",
                "replay",
                "--trace",
                str(folder),
                "--cluster",
                "103959",
                "--limit-jobs",
                "300",
                "--hosts",
                "4",
                "-o",
                "json",
            ]
        )
    )
    assert report["jobs"] == 300
    for figures in report["policies"].values():
        assert figures["finished"] == 300
        assert set(figures["queue_seconds"]) == {"mean", "p50", "p99"}


def test_cli_bad_input_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as err:
        _cli(["sim", "replay", "--trace", str(tmp_path / "missing.csv")])
    assert err.value.field == "--trace"
    with pytest.raises(InvalidArgument) as err:
        _cli(["sim", "replay", "--trace", str(tmp_path), "--hosts", "0"])
    assert err.value.field == "--hosts"


def test_cli_plot_writes_a_png(tmp_path: Path) -> None:
    rows = [(f"2017-10-01 00:00:{i:02d}", 20 + i, [1, 2, 8][i % 3]) for i in range(30)]
    png = tmp_path / "replay.png"
    report = json.loads(
        _cli(
            [
                "sim",
                "replay",
                "--trace",
                str(trace(tmp_path, rows)),
                "--hosts",
                "2",
                "--plot",
                str(png),
                "-o",
                "json",
            ]
        )
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(len(f["queue_percentiles_seconds"]) == 100 for f in report["policies"].values())


def test_a_failed_gang_ends_once_though_its_other_members_end_after_it(tmp_path: Path) -> None:
    # Job 1, a gang of 2 hosts, fails on its first attempt with no retry allowed: the core
    # fails the job at the first member's end and stops the other, whose end comes after.
    # The job's end is counted once (its completion time recorded once).
    path = trace(
        tmp_path,
        [("2017-10-01 00:00:00", 30, 1), ("2017-10-01 00:00:05", 20, 16)],
    )
    spec = ReplaySpec(path, hosts=2)
    laminar = LaminarReplay(spec, read_jobs(spec), failures={1: 1}, max_retries=0)
    report = laminar.run("laminar", None)
    assert laminar.ended["j1"].state == zone_pb2.JOB_FAILED
    assert report["finished"] == 2
    assert len(laminar.stats.jct) == 2
