"""The ``load`` experiment on small clusters: both policies on the same arrivals."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause
from laminar_base.demand import Demand
from laminar_base.errors import InvalidArgument
from laminar_sim.cli import register
from laminar_sim.laminar import Ask, SimHost, SimZone
from laminar_sim.load import (
    LaminarRun,
    LoadSpec,
    Task,
    best_fit,
    make_tasks,
    prefill,
    run_load,
)

SMALL = LoadSpec(
    hosts=40,
    load=0.6,
    seed=3,
    window_seconds=4.0,
    warmup_seconds=1.0,
    central_decision_seconds=2e-5,
)


def test_same_seed_same_arrivals_and_report() -> None:
    assert make_tasks(SMALL) == make_tasks(SMALL)
    first, second = run_load(SMALL), run_load(SMALL)
    for report in (first, second):
        report["policies"]["laminar"].pop("wall_seconds")
        report["policies"]["central"].pop("wall_seconds")
        for figures in report["policies"].values():
            for key in ("events_per_second",):
                figures.pop(key)
        report["policies"]["laminar"].pop("router_seconds_per_placement")  # measured wall time
    assert first == second


def test_every_measured_task_starts_or_is_dropped_and_drops_count_at_the_deadline() -> None:
    spec = LoadSpec(hosts=10, load=2.0, seed=5, window_seconds=40.0, warmup_seconds=5.0)
    report = run_load(spec)
    for name, figures in report["policies"].items():
        assert figures["started"] + figures["dropped"] == report["measured_tasks"], name
        assert figures["dropped"] > 0, name  # offered more than the cluster holds
        deadline_ms = 1000 * max(spec.small_deadline_seconds, spec.large_deadline_seconds)
        assert figures["latency_p99_ms"] <= deadline_ms + 1e-6


def test_success_falls_as_load_rises_past_capacity() -> None:
    low = run_load(LoadSpec(hosts=10, load=0.4, seed=2, window_seconds=40, warmup_seconds=5))
    high = run_load(LoadSpec(hosts=10, load=2.0, seed=2, window_seconds=40, warmup_seconds=5))
    for policy in ("laminar", "central"):
        assert (
            high["policies"][policy]["start_success_ratio"]
            < low["policies"][policy]["start_success_ratio"]
        )
    assert low["policies"]["laminar"]["start_success_ratio"] > 0.95


def test_laminar_probes_d_hosts_and_never_overcommits() -> None:
    run = LaminarRun(SMALL, make_tasks(SMALL))
    out = run.run(None, "laminar")
    assert out.placements > 0
    assert 1.0 <= out.probes / out.placements <= 2.0 * 4  # d=2 per attempt, at most 4 attempts
    for host in run.hosts:
        for slice_id in host.ledger.slices:
            committed, leased, _, _ = host.ledger.usage(slice_id)
            assert 0 <= committed + leased <= 1000


def test_prefill_reaches_the_load_on_every_host() -> None:
    spec = LoadSpec(hosts=10, load=0.5, seed=1)
    hosts = LaminarRun(spec, []).hosts  # built and pre-filled by the run
    fresh = [h for h in hosts]
    assert fresh
    running = prefill(LoadSpec(hosts=10, load=0.5, seed=1), [h for h in fresh])
    assert running  # a second fill on full hosts adds little, but the first one filled them
    for host in hosts:
        used = sum(host.ledger.usage(s)[0] for s in host.ledger.slices) / 1000
        assert used >= 0.5 * spec.gpus_per_host - 0.5


def test_best_fit_picks_the_tightest_host() -> None:
    free = np.array([[1000, 1000, 1000, 1000], [500, 0, 0, 0], [700, 300, 0, 0]], dtype=np.int64)
    assert best_fit(free, Demand(gpu_milli=300)) == (2, 1)
    assert best_fit(free, Demand(gpus=4)) == (0, -1)
    assert best_fit(free, Demand(gpus=4)) is not None
    assert best_fit(free[1:], Demand(gpus=1)) is None


def _cli(argv: list[str]) -> str:
    parser = argparse.ArgumentParser(prog="laminar")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    out = io.StringIO()
    assert args.func(args, Console(file=out, width=200)) == 0
    return out.getvalue()


def test_cli_json_fields_and_bad_input() -> None:
    report = json.loads(
        _cli(
            ["sim", "load", "--hosts", "20", "--load", "0.5", "--window-seconds", "3", "-o", "json"]
        )
    )
    for figures in report["policies"].values():
        for key in (
            "start_success_ratio",
            "latency_p50_ms",
            "latency_p99_ms",
            "probes_per_placement",
            "bounces_per_placement",
            "router_seconds_per_placement",
            "events_per_second",
        ):
            assert key in figures
    assert report["policies"]["central"]["decision_seconds_measured"] > 0
    with pytest.raises(InvalidArgument) as err:
        _cli(["sim", "load", "--hosts", "20", "--load", "3"])
    assert err.value.field == "--load"


def test_cli_plot_writes_a_png(tmp_path: Path) -> None:
    png = tmp_path / "load.png"
    report = json.loads(
        _cli(
            [
                "sim",
                "load",
                "--hosts",
                "20",
                "--load",
                "0.5",
                "--window-seconds",
                "3",
                "--plot",
                str(png),
                "-o",
                "json",
            ]
        )
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for figures in report["policies"].values():
        cdf = figures["latency_percentiles_ms"]
        assert len(cdf) == 100 and cdf == sorted(cdf)


def test_a_task_behind_its_familys_blocked_head_waits_for_the_cores_pass() -> None:
    """The simulated router is its zone's core: a task that finds no room is queued and
    blocks its family; a later task of the family waits behind it in the core's queue (as
    the router's route decides; no backfill, as no running work declares a run time), not
    placed by the simulator; once the head leaves (cancelled at its start deadline) the
    queue loop's next pass starts it."""
    spec = LoadSpec(hosts=1, load=0.5, seed=3, window_seconds=1.0, policies=("laminar",))
    big = Task(0, 0.0, Ask(Demand(gpus=8)), 5.0, 0.5, True)
    small = Task(1, 0.0, Ask(Demand(gpu_milli=500)), 1.0, 2.0, False)
    run = LaminarRun(spec, [big, small])
    zone = run.cluster.zones[0]
    run.submit(zone, big)  # the host is pre-filled to half: 8 whole GPUs are not free
    assert zone.core.entries["t0"].job.state == zone_pb2.QUEUED
    run.submit(zone, small)
    waiting = zone.core.entries["t1"].job
    assert waiting.state == zone_pb2.QUEUED and "behind queued work" in waiting.reason
    run.engine.run(until_seconds=0.45)
    assert run.done == set() and run.out.probes == 0
    run.engine.run(until_seconds=0.6)
    assert run.done == {0, 1} and run.out.placements == 1 and run.out.probes == 1
    ended: list[common_pb2.Subjob] = []
    report = run.reported

    def reported(zone: SimZone, host: SimHost, event: common_pb2.Subjob) -> None:
        ended.append(event)
        report(zone, host, event)

    run.reported = reported  # type: ignore[method-assign]
    run.engine.run(until_seconds=1.7)  # it ran 1 s: its end rides the heartbeat it woke
    assert [e.state for e in ended] == [common_pb2.SUCCEEDED]
    # The end as the agent reports it: the slices the subjob held, its start and run time.
    (end,) = ended
    (host,) = zone.hosts.values()
    assert end.agent_id == host.agent_id and len(end.slice_ids) == 1
    assert end.slice_ids[0] in host.ledger.slices
    assert 0.45 < end.started_unix < 0.6 and end.ended_unix > end.started_unix
    assert end.run_seconds == pytest.approx(small.duration)  # it ran its 1 s
    assert end.end_cause == EndCause.EXITED.wire and end.exit_code == 0
    assert "t1" not in zone.core.entries  # the core judged the job ended and forgot it


def test_a_task_past_its_deadline_is_cancelled_by_its_router_and_counted_dropped() -> None:
    spec = LoadSpec(
        hosts=1, load=0.5, seed=3, window_seconds=1.0, warmup_seconds=0.0, policies=("laminar",)
    )
    big = Task(0, 0.0, Ask(Demand(gpus=8)), 5.0, 0.5, True)
    run = LaminarRun(spec, [big])
    zone = run.cluster.zones[0]
    run.submit(zone, big)
    job = zone.core.entries["t0"].job
    run.engine.run(until_seconds=0.6)
    assert job.state == zone_pb2.JOB_CANCELLED and "t0" not in zone.core.entries
    assert 0 in run.done and run.out.dropped == 1 and run.out.latencies == [0.5]
