"""Rigid against atomized on MIG hosts (``sim replay --mode rigid,atomized``).

Synthetic jobs and memory profiles: no trace file is needed except in the last test.
"""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import laminar_sim.atomized
from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause, end_cause
from laminar_base.errors import InvalidArgument
from laminar_sim.atomized import (
    AtomizeSpec,
    MemoryProfile,
    MigReplay,
    SimJob,
    make_jobs,
    run_experiment,
)
from laminar_sim.cli import register
from laminar_sim.replay import TraceJob
from laminar_zone.atomizer import Atomizer
from laminar_zone.entry import Entry
from laminar_zone.queue import Clear
from laminar_zone.round import Cleared, ClearingRound, Closed, Extend, Start, Stop

GIB = 1024**3
#: Two hosts: per host two GPUs in halves (3g.40gb) and one in sevenths (1g.10gb).
SMALL_LAYOUT = "2xH100-80GB:mig=3g.40gb+3g.40gb,1xH100-80GB:mig=1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb"
MODE_FIELDS = {
    "jobs",
    "finished",
    "jct_seconds",
    "jct_percentiles_seconds",
    "queue_seconds",
    "queue_by_class_seconds",
    "gpu_utilization_ratio",
    "useful_work_ratio",
    "fragmentation_ratio",
    "violation_ratio",
    "violations",
    "violation_basis",
    "subjobs_per_job",
    "window_fill_ratio",
}


def profiles() -> list[MemoryProfile]:
    """Small jobs that fit a 1g.10gb slice now and then, and bigger ones near 40 GB."""
    return [
        MemoryProfile("small", tuple(sorted(int((6 + (i % 7) * 0.7) * GIB) for i in range(24)))),
        MemoryProfile("mid", tuple(sorted(int((14 + (i % 5) * 2.5) * GIB) for i in range(24)))),
        MemoryProfile("big", tuple(sorted(int((30 + (i % 9) * 1.2) * GIB) for i in range(24)))),
    ]


def trace_jobs(n: int = 60) -> list[TraceJob]:
    return [
        TraceJob(i, 97.0 * i, 300.0 + (i * 613) % 5400, [1, 1, 1, 2, 1, 4][i % 6]) for i in range(n)
    ]


def spec(**overrides: Any) -> AtomizeSpec:
    # Gangs in the market are the default (AtomizeSpec.market_gangs); most tests here weigh
    # single-GPU atomization beside rigid gangs, and the gang tests opt in.
    base: dict[str, Any] = {
        "hosts": 2,
        "mig_layout": SMALL_LAYOUT,
        "seed": 7,
        "market_gangs": False,
    }
    base.update(overrides)
    return AtomizeSpec(**base)


def test_atomized_runs_every_unit_of_every_job_exactly_once() -> None:
    s = spec(horizon_seconds=900.0)
    jobs = make_jobs(trace_jobs(), profiles(), s.seed)
    sim = MigReplay(s, jobs, "atomized")
    report = sim.run()
    assert report["finished"] == report["jobs"] == 60
    atomized = [st for st in sim.states if st.contract is not None]
    assert atomized and len(atomized) == sum(1 for j in jobs if j.gpus == 1)
    for state in atomized:
        assert state.contract is not None
        covered = sorted(state.done)
        cursor = 0
        for start, count in covered:
            assert start == cursor and count >= 1  # no gap, no overlap, no repeat
            cursor += count
        assert cursor == state.contract.total_units
    for state in sim.states:
        assert state.end is not None and state.first_start is not None
        assert state.end >= state.first_start >= state.job.arrival
    # A horizon shorter than most jobs cuts their runs into several windows: each window's
    # end starts a new piece or extends the running one in place.
    windows = report["subjobs_per_atomized_job"] * len(atomized) + report["extensions"]
    assert windows > 1.5 * len(atomized)
    assert not sim.driver.live and not sim.waiting and not sim.rigid_queue
    assert sim.core.entries == {}  # every job ended and left the router's memory
    assert all(not host.ledger.leases() for host in sim.hosts)
    assert len(sim.free) == sum(len(host.ledger.slices) for host in sim.hosts)


def test_violations_are_counted_and_bounded() -> None:
    s = spec(horizon_seconds=900.0)
    jobs = make_jobs(trace_jobs(), profiles(), s.seed)
    report = run_experiment(
        s, [TraceJob(j.index, j.arrival, j.duration, j.gpus) for j in jobs], profiles()
    )
    atomized = report["modes"]["atomized"]
    rigid = report["modes"]["rigid"]
    assert atomized["violation_basis"] == "subjobs" and rigid["violation_basis"] == "jobs"
    for figures in (atomized, rigid):
        assert 0.0 <= figures["violation_ratio"] < 1.0
        population = figures["violation_population"]
        assert figures["violation_ratio"] == round(figures["violations"] / population, 4)
    assert rigid["violation_population"] == rigid["jobs"]
    assert atomized["violation_population"] == round(
        atomized["subjobs_per_atomized_job"] * atomized["atomized_jobs"]
    )
    # Each violation has one cause: memory + time never exceed the violations counted.
    for figures in (atomized, rigid):
        assert sum(figures["violations_by_cause"].values()) == figures["violations"]
    # Pieces sized at 1 - epsilon overrun now and then, never most of the time.
    assert atomized["violation_ratio"] < 0.25
    assert 0.0 < atomized["window_fill_ratio"] <= 1.0


def test_same_seed_same_report_and_another_seed_differs() -> None:
    jobs = trace_jobs(40)

    def run(seed: int) -> dict[str, Any]:
        report = run_experiment(spec(seed=seed), jobs, profiles())
        for figures in report["modes"].values():
            figures.pop("wall_seconds")
        return report

    first = run(3)
    assert first == run(3)
    assert first != run(4)
    json.dumps(first)  # JSON-ready
    assert set(first["modes"]) == {"rigid", "atomized"}
    for figures in first["modes"].values():
        assert set(figures) >= MODE_FIELDS
        assert set(figures["queue_by_class_seconds"]) == {"production", "batch", "opportunistic"}
        assert 0 < figures["gpu_utilization_ratio"] <= 1.0
        assert 0 <= figures["fragmentation_ratio"] <= 1.0


def write_genai(folder: Path) -> Path:
    """A GenAI-format memory CSV: three pods, 400 samples each (6 hours), 57 s apart."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = ["timestamp_anon,value,container_ip\n"]
    for t in range(400):
        for pod, base in (("aa", 14e9), ("bb", 30e9), ("cc", 50e9)):
            rows.append(f"{1000.0 + 57 * t},{base * (1 + 0.3 * ((t * 7) % 11) / 11)},{pod}\n")
    (folder / "pod_gpu_memory_used_bytes_anon.csv").write_text("".join(rows))
    return folder


def write_philly(path: Path, n: int = 40) -> Path:
    rows = ["timestamp,duration,num_gpus,gpu_time,cluster\n"]
    for i in range(n):
        d, g = 200 + (i * 379) % 4000, [1, 1, 2, 1][i % 4]
        rows.append(f"2017-10-01 {i // 60:02d}:{i % 60:02d}:00,{d},{g},{d * g},c1\n")
    path.write_text("".join(rows))
    return path


def cli(argv: list[str]) -> str:
    parser = argparse.ArgumentParser(prog="laminar")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    out = io.StringIO()
    assert args.func(args, Console(file=out, width=200)) == 0
    return out.getvalue()


def test_cli_json_table_and_plot(tmp_path: Path) -> None:
    philly = write_philly(tmp_path / "philly_jobs_pollux.csv")
    genai = write_genai(tmp_path / "genai")
    argv = ["sim", "replay", "--trace", str(philly), "--genai-trace", str(genai)]
    argv += ["--hosts", "2", "--mode", "rigid,atomized", "--horizon-seconds", "1200"]
    png = tmp_path / "jct.png"
    report = json.loads(cli([*argv, "-o", "json", "--plot", str(png)]))
    assert report["experiment"] == "replay" and report["mode"] == "rigid,atomized"
    assert report["jobs"] == 40 and report["clearing_policy"] == "srpt"
    assert report["starvation_ratio"] == 2.0 and report["starvation_floor_seconds"] == 4 * 86400
    for figures in report["modes"].values():
        assert set(figures) >= MODE_FIELDS
        assert figures["finished"] == 40
        assert len(figures["jct_percentiles_seconds"]) == 100
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = cli(argv)
    assert "safety violations" in table and "atomized" in table
    # The whole-GPU replay's JSON keeps its shape.
    plain = json.loads(cli(["sim", "replay", "--trace", str(philly), "--hosts", "2", "-o", "json"]))
    assert plain["mode"] == "rigid" and set(plain["policies"]) == {"laminar", "fifo"}


def test_cli_bad_mode_and_layout_name_the_flag(tmp_path: Path) -> None:
    philly = write_philly(tmp_path / "philly_jobs_pollux.csv")
    genai = write_genai(tmp_path / "genai")
    base = ["sim", "replay", "--trace", str(philly), "--genai-trace", str(genai)]
    with pytest.raises(InvalidArgument) as err:
        cli([*base, "--mode", "rigid,elastic"])
    assert err.value.field == "--mode"
    with pytest.raises(InvalidArgument) as err:
        cli([*base, "--mode", "atomized", "--mig-layout", "H100-80GB:mig=7g.80gb+1g.10gb"])
    assert err.value.field == "--mig-layout"
    with pytest.raises(InvalidArgument) as err:
        cli([*base, "--mode", "atomized", "--genai-trace", str(tmp_path / "nowhere")])
    assert err.value.field == "--genai-trace"
    with pytest.raises(InvalidArgument) as err:
        cli([*base, "--mode", "atomized", "--horizon-seconds", "inf"])
    assert err.value.field == "--horizon-seconds"
    with pytest.raises(InvalidArgument) as err:
        cli([*base, "--mode", "atomized", "--epsilon", "0.5"])
    assert err.value.field == "--epsilon"
    with pytest.raises(InvalidArgument) as err:
        cli([*base, "--mode", "atomized", "--starvation-ratio", "-1"])
    assert err.value.field == "--starvation-ratio"
    with pytest.raises(InvalidArgument) as err:
        cli([*base, "--mode", "atomized", "--starvation-floor-seconds", "-5"])
    assert err.value.field == "--starvation-floor-seconds"


def test_real_traces_slice(traces_dir: Path) -> None:
    philly = traces_dir / "philly-pollux"
    genai = traces_dir / "alibaba-genai-v2026"
    for folder in (philly, genai):
        if not folder.is_dir():
            print(f"skipping: {folder} is not present")
            pytest.skip(f"{folder} is not present")
    argv = ["sim", "replay", "--trace", str(philly), "--genai-trace", str(genai)]
    argv += ["--cluster", "103959", "--limit-jobs", "150", "--hosts", "2", "--speedup", "4"]
    report = json.loads(cli([*argv, "--mode", "rigid,atomized", "-o", "json"]))
    assert report["jobs"] + report["left_out_jobs"] == 150
    assert report["memory_profiles"] > 50
    for figures in report["modes"].values():
        assert figures["finished"] == report["jobs"]


def test_an_uncontended_atomized_job_runs_as_one_piece_and_costs_one_checkpoint() -> None:
    """Incumbency: one 5-hour job alone on the hosts with 15-minute windows keeps its slice
    at every window's end: one piece, no violation, its run plus one checkpoint. Without
    incumbency it checkpoints and restarts at every window."""
    jobs = make_jobs([TraceJob(0, 0.0, 5 * 3600.0, 1)], profiles()[:1], 7)
    finished = {}
    for incumbency in (True, False):
        sim = MigReplay(spec(horizon_seconds=900.0, incumbency=incumbency), jobs, "atomized")
        report = sim.run()
        (state,) = sim.states
        assert state.end is not None and state.first_start == 0.0
        finished[incumbency] = (report, state)
    report, state = finished[True]
    assert report["subjobs"] == 1 and report["violations"] == 0
    assert report["extensions"] >= 19 and report["displaced"] == 0
    assert state.contract is not None and state.end is not None
    assert state.done == [(0, state.contract.total_units)]
    # The run (one speed draw, within a few sigma of 5 h) plus one checkpoint at the end.
    assert 0.3 * 5 * 3600 < state.end - 30.0 < 3 * 5 * 3600
    old, old_state = finished[False]
    assert old["subjobs"] > 10 and old["extensions"] == 0
    assert old_state.end is not None and old_state.end > state.end


def test_srpts_starvation_guard_lets_a_long_job_through_a_stream_of_short_ones() -> None:
    """One slice, one class: a 10-hour job arrives beside a stream of 50-minute jobs, one an
    hour for 30 hours. Pure SRPT (ratio 0) lets it run only in the gaps and displaces it at
    its windows' ends, so it ends after the whole stream; with the guard (patience 1 x (work
    left + 6 h)) it becomes starved, keeps its slice against the short jobs and ends long
    before the stream does, while no short job waits more than about its run."""
    memory = profiles()[0]

    def job(index: int, arrival: float, seconds: float) -> SimJob:
        return SimJob(index, arrival, seconds, 1, "batch", 3, "t0", memory, 0.05)

    shorts = [job(i, 3600.0 * (i - 1), 3000.0) for i in range(2, 32)]
    jobs = sorted([job(0, 0.0, 3000.0), job(1, 60.0, 36000.0), *shorts], key=lambda j: j.arrival)
    ends: dict[float, tuple[float, float, float]] = {}
    for ratio in (0.0, 1.0):
        layout = "1xH100-80GB:mig=7g.80gb"
        s = spec(
            hosts=1, mig_layout=layout, starvation_ratio=ratio, starvation_floor_seconds=6 * 3600.0
        )
        sim = MigReplay(s, jobs, "atomized")
        report = sim.run()
        assert report["finished"] == len(jobs)
        by_index = {st.job.index: st for st in sim.states}
        long_end = by_index[1].end
        assert long_end is not None
        stream_end = max(by_index[j.index].end or 0.0 for j in shorts)
        worst_short = max((by_index[j.index].end or 0.0) - j.arrival for j in shorts)
        ends[ratio] = (long_end, stream_end, worst_short)
    long_end, stream_end, _ = ends[0.0]
    assert long_end > stream_end  # pure SRPT: starved until the stream is done
    long_end, stream_end, worst_short = ends[1.0]
    # Starved once in the system for its patience (16 h at most), then run to the end.
    assert 10 * 3600.0 < long_end < (16 + 10) * 3600.0
    assert long_end < stream_end - 5 * 3600.0
    assert worst_short < 12 * 3600.0  # the short jobs wait out its run, no longer


class RecordingRound(ClearingRound):
    """The simulator's round, recorded: what it was given and what each step decided."""

    rounds: list[RecordingRound] = []

    def __post_init__(self) -> None:
        super().__post_init__()
        self.events: list[tuple[str, Any, Any]] = []
        RecordingRound.rounds.append(self)

    def take(self, keys: Iterable[tuple[str, str]]) -> None:
        keys = list(keys)
        self.events.append(("take", keys, None))
        super().take(keys)

    def clear(self, step: Clear) -> Cleared:
        cleared = super().clear(step)
        self.events.append(("clear", step, cleared))
        return cleared

    def close(self) -> Closed:
        closed = super().close()
        self.events.append(("close", None, closed))
        return closed


def allowed(
    spec: zone_pb2.JobSpec,
    windows: dict[tuple[str, str], common_pb2.Window],
    job_id: str,
    key: tuple[str, str],
) -> bool:
    """The router's spec check (Atomizer._allows) on a slice as an agent advertises it."""
    return Atomizer._allows(spec, windows[key])


def test_the_simulator_carries_out_the_routers_round_decisions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MigReplay and the router drive one round machine: each pass of a contended run is
    replayed through a ClearingRound set up as Atomizer.open_round sets it up (a quota
    table, the pass's tally, the spec check of Atomizer._allows on the slice as a
    common_pb2.Window), and gives the same decisions; and the simulator carried out exactly
    those (pieces started, extended, displaced and stopped at close)."""
    RecordingRound.rounds = []
    monkeypatch.setattr(laminar_sim.atomized, "ClearingRound", RecordingRound)
    s = spec(horizon_seconds=900.0)
    sim = MigReplay(s, make_jobs(trace_jobs(), profiles(), s.seed), "atomized")
    report = sim.run()
    assert report["finished"] == report["jobs"]
    rounds = RecordingRound.rounds
    job_spec = zone_pb2.JobSpec(name="replayed")
    starts = extends = displaced = closed_stops = 0
    for rnd in rounds:
        windows = {
            s.key: common_pb2.Window(
                agent_id=s.agent_id,
                slice_id=s.slice_id,
                kind=common_pb2.MIG,
                memory_bytes=s.memory_bytes,
            )
            for s in rnd.slices
        }
        router = ClearingRound(
            rnd.now,
            rnd.slices,
            rnd.bidders,
            rnd.policy,
            rnd.ctx,
            rnd.max_window_seconds,
            quotas={},
            units={},
            memory={},
            allows=partial(allowed, job_spec, windows),
        )
        for kind, given, got in rnd.events:
            if kind == "take":
                router.take(given)
            elif kind == "clear":
                assert router.clear(given).decisions == got.decisions
                starts += sum(isinstance(d, Start) for d in got.decisions)
                extends += sum(isinstance(d, Extend) for d in got.decisions)
                displaced += sum(isinstance(d, Stop) for d in got.decisions)
            else:
                assert router.close() == got
                closed_stops += len(got.stops)
    assert starts == report["subjobs"] - sum(st.runs for st in sim.states if st.contract is None)
    assert extends == report["extensions"] > 0
    assert displaced == report["displaced"]
    assert closed_stops > 0  # pieces no extension fitted stopped at the round's close


def test_a_rigid_job_killed_for_memory_is_retried_by_the_routers_core() -> None:
    """A rigid job whose profile (6 GiB at its 0.95 quantile: a 1g.10gb slice) peaks at
    30 GiB now and then: the kill is reported to the router's core as the agent reports it
    (KILLED, reclaimed for memory, with the peak), and the core's lifecycle retries the job
    (a counted retry, a new attempt) asking a profile that holds the peak (3g.40gb); it
    then runs to its end. Nothing in the simulator requeues or widens it."""
    spiky = MemoryProfile("spiky", tuple(sorted([6 * GIB] * 23 + [30 * GIB])))
    job = SimJob(0, 0.0, 100 * 3600.0, 1, "batch", 3, "t0", spiky, 0.05)
    sim = MigReplay(spec(), [job], "rigid")
    ended: list[zone_pb2.Job] = []
    job_ended = sim.job_ended

    def record(entry: Entry) -> None:
        copy = zone_pb2.Job()
        copy.CopyFrom(entry.job)
        ended.append(copy)
        job_ended(entry)

    sim.job_ended = record  # type: ignore[method-assign]
    report = sim.run()
    (state,) = sim.states
    (done,) = ended
    assert done.state == zone_pb2.JOB_SUCCEEDED and state.end is not None
    assert done.attempts >= 2 and done.retries_used == done.attempts - 1
    first = [p for p in done.placements if p.attempt == 1]
    assert [(p.state, end_cause(p.end_cause)) for p in first] == [
        (common_pb2.KILLED, EndCause.RECLAIMED)
    ]
    assert first[0].peak_gpu_memory_bytes == 30 * GIB
    last = [p for p in done.placements if p.attempt == done.attempts]
    assert [p.state for p in last] == [common_pb2.SUCCEEDED]
    assert sim.slice_of[(last[0].agent_id, last[0].slice_ids[0])][0] == "3g.40gb"
    assert done.spec.resources.mig_profile == "3g.40gb"
    assert report["rigid_jobs_killed"] == 1 and report["rigid_jobs_failed"] == 0
    assert state.runs == done.attempts and sim.core.entries == {}


def test_rigid_jobs_ask_the_most_retries_a_spec_may() -> None:
    from laminar_zone.spec import MAX_RETRIES

    assert laminar_sim.atomized.RIGID_MAX_RETRIES == MAX_RETRIES


def test_market_gangs_run_every_unit_once_on_one_slice_per_member() -> None:
    # A loose epsilon: pieces bid on slices their peaks overflow now and then.
    s = spec(horizon_seconds=900.0, market_gangs=True, epsilon=0.3)
    jobs = make_jobs(trace_jobs(), profiles(), s.seed)
    sim = MigReplay(s, jobs, "atomized")
    report = sim.run()
    assert report["finished"] == report["jobs"] == 60
    gangs = [st for st in sim.states if st.job.gpus > 1]
    assert gangs and all(st.contract is not None for st in gangs)
    assert report["rigid_jobs"] == 0
    kills = 0
    for state in gangs:
        assert state.contract is not None and state.entry is not None
        cursor = 0
        for start, count in sorted(state.done):
            assert start == cursor and count >= 1  # no gap, no overlap, no repeat
            cursor += count
        assert cursor == state.contract.total_units
        # Each piece is one placement per member, on distinct slices, ended together.
        runs: dict[str, list[zone_pb2.Placement]] = {}
        for p in state.entry.job.placements:
            runs.setdefault(p.subjob_id.rsplit("m", 1)[0], []).append(p)
        for members in runs.values():
            assert len(members) == state.job.gpus
            assert len({(p.agent_id, p.slice_ids[0]) for p in members}) == state.job.gpus
            assert len({p.resources.mig_profile for p in members}) == 1
            causes = sorted(end_cause(p.end_cause) for p in members)
            if EndCause.RECLAIMED in causes:
                kills += 1
                assert causes.count(EndCause.RECLAIMED) == 1
                assert causes.count(EndCause.GANG_STOPPED) == state.job.gpus - 1
            else:
                assert len(set(causes)) == 1
    assert kills > 0  # the profiles' peaks kill some gang pieces: siblings stopped
    assert all(not host.ledger.leases() for host in sim.hosts)
    assert len(sim.free) == sum(len(host.ledger.slices) for host in sim.hosts)


def test_gangs_bid_in_the_market_by_default() -> None:
    jobs = make_jobs(trace_jobs(), profiles(), 7)
    sim = MigReplay(AtomizeSpec(hosts=2, mig_layout=SMALL_LAYOUT, seed=7), jobs, "atomized")
    gangs = [st for st in sim.states if st.job.gpus > 1]
    assert gangs and all(st.contract is not None for st in gangs)


def test_market_gangs_off_leaves_gangs_rigid() -> None:
    jobs = make_jobs(trace_jobs(), profiles(), 7)
    sim = MigReplay(spec(market_gangs=False), jobs, "atomized")
    assert all(st.contract is None for st in sim.states if st.job.gpus > 1)
    assert sim.run()["rigid_jobs"] == sum(1 for j in jobs if j.gpus > 1)


def test_a_gang_piece_past_its_window_overruns_once_as_in_the_router() -> None:
    """Without incumbency a gang's piece runs into its window's end: one member carries
    the overrun (one violation, one widening), the others stop with it (``GANG_STOPPED``),
    as the router's window enforcement reports it (laminar_zone.atoms.gang_member_cause)."""
    s = spec(horizon_seconds=900.0, market_gangs=True, incumbency=False)
    jobs = make_jobs(trace_jobs(), profiles(), s.seed)
    sim = MigReplay(s, jobs, "atomized")
    report = sim.run()
    assert report["finished"] == report["jobs"]
    overruns = 0
    for state in sim.states:
        if state.job.gpus < 2 or state.entry is None:
            continue
        runs: dict[str, list[zone_pb2.Placement]] = {}
        for p in state.entry.job.placements:
            runs.setdefault(p.subjob_id.rsplit("m", 1)[0], []).append(p)
        for members in runs.values():
            causes = [end_cause(p.end_cause) for p in members]
            if EndCause.OVERRAN in causes:
                overruns += 1
                assert causes.count(EndCause.OVERRAN) == 1
                assert causes.count(EndCause.GANG_STOPPED) == state.job.gpus - 1
    assert overruns > 0  # gang pieces do run into their windows' end
