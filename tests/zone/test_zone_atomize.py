"""Atomization end to end: real router, real agents, real subjob processes that checkpoint.

An atomized job runs as a sequence of subjobs sized to advertised windows. Pressure on
the GPU where one runs makes Airlock stop it mid-way; the job resumes from its
checkpoint on another slice, and in the end every unit was done exactly once.
"""

from __future__ import annotations

import itertools
import queue
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from waiting import gate_code, wait_for
from zonekit import HEARTBEAT_SECONDS, TERMINAL, Zone, open_zone

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2
from laminar_base.causes import ENDED_SUBJOB_STATES as ENDED
from laminar_cli.cluster import AgentProcess, LocalCluster

GIB = 1024**3
WORKER = Path(__file__).parents[2] / "docs" / "examples" / "atomized_worker.py"
UNIT_SECONDS = 0.25


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    monkeypatch.setenv("LAMINAR_AIRLOCK_HOLD_SECONDS", "0.3")
    monkeypatch.setenv("LAMINAR_AIRLOCK_READDRESS_AFTER_SECONDS", "1")
    monkeypatch.setenv("LAMINAR_AIRLOCK_MAX_READDRESS", "1")
    monkeypatch.setenv("LAMINAR_AIRLOCK_RECLAIM_GRACE_SECONDS", "1")
    with LocalCluster(tmp_path) as c:
        yield c


def _market_zone(
    cluster: LocalCluster, root: Path, window_seconds: float, *, incumbency: bool = True
) -> Zone:
    config = root / "zone.toml"
    config.write_text(
        f"[market]\nmax_window_seconds = {window_seconds}\nround_seconds = 0.2\n"
        f"overrun_grace_seconds = 0.5\nincumbency = {str(incumbency).lower()}\n"
    )
    return open_zone(cluster, root, extra_args=["--config", str(config)])


def _agent(cluster: LocalCluster, zone: Zone, name: str, gpus: str) -> AgentProcess:
    return cluster.start_agent(name, gpus, zone=zone.address, heartbeat_seconds=HEARTBEAT_SECONDS)


def _contract(units: int, max_units: int, checkpoint: Path) -> common_pb2.AtomizationContract:
    return common_pb2.AtomizationContract(
        total_units=units,
        seconds_per_unit=[
            common_pb2.Quantile(q=0.5, value=UNIT_SECONDS),
            common_pb2.Quantile(q=0.95, value=UNIT_SECONDS * 1.4),
        ],
        peak_memory_bytes=[
            common_pb2.Quantile(q=0.5, value=2 * GIB),
            common_pb2.Quantile(q=0.95, value=4 * GIB),
        ],
        checkpoint_overhead_seconds=0.1,
        max_units=max_units,
        checkpoint_dir=str(checkpoint),
    )


def _submit(
    zone: Zone, contract: common_pb2.AtomizationContract, unit_seconds: object, **fields: Any
) -> zone_pb2.Job:
    """Submit an atomized job whose pieces run the example worker at ``unit_seconds`` a unit."""
    spec = zone_pb2.JobSpec(
        command=[sys.executable, str(WORKER), str(unit_seconds)], atomization=contract, **fields
    )
    return zone.stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)


def _units_log(checkpoint: Path) -> Counter[int]:
    path = checkpoint / "units.log"
    lines = path.read_text().split("\n") if path.exists() else []
    return Counter(int(line.split()[0]) for line in lines if line)


def test_atomized_job_survives_airlock_and_does_every_unit_exactly_once(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    zone = _market_zone(cluster, tmp_path, window_seconds=30.0)
    a = _agent(cluster, zone, "a", "1xH100-80GB")
    _agent(cluster, zone, "b", "H100-80GB:mig=3g.40gb+2g.20gb+1g.10gb")
    cluster.wait_registered()
    checkpoint = tmp_path / "ckpt"
    job = _submit(
        zone,
        _contract(24, 12, checkpoint),
        UNIT_SECONDS,
        name="atomized",
        priority=common_pb2.OPPORTUNISTIC,
        lifecycle=common_pb2.TRANSIENT,
        restartable=True,
    )
    job_id = job.job_id
    # The whole GPU on agent a is the largest window: the first subjob goes there.
    first = zone.wait_state(job_id, zone_pb2.JOB_RUNNING).placements[0]
    assert (first.agent_id, list(first.slice_ids)) == ("a", ["gpu0"])
    assert (first.unit_start, first.unit_count) == (0, 12)
    wait_for(lambda: sum(_units_log(checkpoint).values()) >= 2)

    # Memory pressure on that GPU: Airlock suspends the opportunistic subjob, then
    # (re-address after 1 s) hands it back; it stops mid-way with its checkpoint.
    with grpc.insecure_channel(a.address) as channel:
        agent_pb2_grpc.AgentStub(channel).InjectLoad(
            agent_pb2.InjectLoadRequest(gpu_index=0, used_bytes=79 * GIB), timeout=10
        )
    done = zone.wait_state(job_id, *TERMINAL, timeout_seconds=90)
    assert done.state == zone_pb2.JOB_SUCCEEDED, done.reason

    units = _units_log(checkpoint)
    assert sorted(units) == list(range(24))
    assert set(units.values()) == {1}, f"units redone: {[u for u, n in units.items() if n > 1]}"
    placements = list(done.placements)
    stopped = placements[0]
    assert stopped.state == common_pb2.KILLED
    assert stopped.reason.startswith(("readdressed:", "airlock_reclaimed:")), stopped.reason
    assert stopped.end_cause in (
        common_pb2.END_CAUSE_READDRESSED,
        common_pb2.END_CAUSE_RECLAIMED,
    ), stopped.end_cause
    assert 0 < stopped.units_done < stopped.unit_count
    # Every later subjob starts where the previous one's checkpoint ended, elsewhere.
    for before, after in itertools.pairwise(placements):
        assert after.unit_start == before.unit_start + before.units_done
    assert all(p.agent_id == "b" for p in placements[1:])
    assert len({(p.agent_id, tuple(p.slice_ids)) for p in placements}) >= 2
    # Usage is accounted by the slice each subjob was sized to, not the job's (empty) shape.
    usage = zone.stub.GetUsage(zone_pb2.GetUsageRequest(), timeout=10).records
    kinds = {r.slice_kind: r.gpu_seconds for r in usage}
    assert kinds.get("gpu:H100-80GB", 0) > 0
    assert any(k.startswith("mig:") and v > 0 for k, v in kinds.items()), kinds
    progress = done.atomization
    assert (progress.units_done, progress.units_total) == (24, 24)
    assert progress.subjobs == len(placements)
    # Moved for someone else's memory: not a violation of this job's profile.
    assert progress.violation_rate == 0.0
    assert progress.seconds_per_unit  # the calibrated profile is reported


def test_windows_size_subjobs_and_an_overrun_resumes_from_the_checkpoint(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    # 2 s windows without incumbency: a subjob gets only the units that fit (P >= 0.95).
    # The declared profile says 0.1 s a unit; the work takes 0.25 s, so the first subjob
    # overruns its window, is stopped, and the job goes on from its checkpoint, wider.
    zone = _market_zone(cluster, tmp_path, window_seconds=2.0, incumbency=False)
    _agent(cluster, zone, "a", "1xH100-80GB")
    cluster.wait_registered()
    checkpoint = tmp_path / "ckpt"
    contract = _contract(16, 16, checkpoint)
    del contract.seconds_per_unit[:]
    contract.seconds_per_unit.extend(
        [common_pb2.Quantile(q=0.5, value=0.08), common_pb2.Quantile(q=0.95, value=0.1)]
    )
    job = _submit(zone, contract, UNIT_SECONDS)
    done = zone.wait_state(job.job_id, *TERMINAL, timeout_seconds=90)
    assert done.state == zone_pb2.JOB_SUCCEEDED, done.reason
    units = _units_log(checkpoint)
    assert sorted(units) == list(range(16)) and set(units.values()) == {1}
    first = done.placements[0]
    # (2 s - 0.1 s overhead) / 0.1 s a unit at the 95th percentile: 19 > 16 left, so 16.
    assert first.unit_count == 16
    assert first.state == common_pb2.KILLED and first.reason.startswith("overran:")
    later = done.placements[1:]
    assert later, "the job resumed after the overrun"
    # After the overrun the profile is wider: later subjobs bid for fewer units.
    assert all(p.unit_count < first.unit_count for p in later)
    assert done.atomization.violation_rate > 0


def test_an_uncontended_piece_keeps_its_slice_and_runs_as_one_process(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Incumbency: 2 s windows, 16 units of 0.25 s (4 s of work). Nobody else wants the
    GPU, so at each window's end the piece extends in place: one process does every unit,
    with no checkpoint-and-restart in between."""
    zone = _market_zone(cluster, tmp_path, window_seconds=2.0)
    _agent(cluster, zone, "a", "1xH100-80GB")
    cluster.wait_registered()
    checkpoint = tmp_path / "ckpt"
    job = _submit(zone, _contract(16, 16, checkpoint), UNIT_SECONDS)
    done = zone.wait_state(job.job_id, *TERMINAL, timeout_seconds=60)
    assert done.state == zone_pb2.JOB_SUCCEEDED, done.reason
    assert len(done.placements) == 1, [(p.unit_start, p.reason) for p in done.placements]
    (piece,) = done.placements
    assert (piece.unit_start, piece.unit_count, piece.units_done) == (0, 16, 16)
    assert piece.state == common_pb2.SUCCEEDED and piece.end_cause == common_pb2.END_CAUSE_EXITED
    # Its window was extended: it ends well past the first 2 s window.
    assert piece.window_end_unix > piece.started_unix + 2.5
    assert piece.ended_unix - piece.started_unix > 3.5
    log = (checkpoint / "units.log").read_text().split()
    assert log[0::2] == [str(u) for u in range(16)]
    assert set(log[1::2]) == {piece.subjob_id}  # one process did every unit
    assert done.atomization.violation_rate == 0.0


def test_a_higher_class_takes_the_slice_at_the_window_end_and_the_piece_moves_on(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """An opportunistic piece holds the only whole GPU. A production job that only runs
    on whole GPUs arrives: at the piece's window's end the production bid wins the held
    window, the piece stops (its checkpoint kept, no violation), the production job runs
    there, and the opportunistic job continues on a MIG slice from its checkpoint."""
    zone = _market_zone(cluster, tmp_path, window_seconds=2.0)
    _agent(cluster, zone, "a", "1xH100-80GB")
    _agent(cluster, zone, "b", "H100-80GB:mig=3g.40gb+2g.20gb+1g.10gb")
    cluster.wait_registered()
    low_ckpt = tmp_path / "low"
    low = _submit(
        zone, _contract(40, 40, low_ckpt), UNIT_SECONDS, priority=common_pb2.OPPORTUNISTIC
    )
    first = zone.wait_state(low.job_id, zone_pb2.JOB_RUNNING).placements[0]
    assert (first.agent_id, list(first.slice_ids)) == ("a", ["gpu0"])
    high = _submit(
        zone,
        _contract(4, 4, tmp_path / "high"),
        "0.05",
        priority=common_pb2.PRODUCTION,
        resources=common_pb2.Resources(gpus=1),
    )
    high_done = zone.wait_state(high.job_id, *TERMINAL, timeout_seconds=60)
    assert high_done.state == zone_pb2.JOB_SUCCEEDED, high_done.reason
    assert [(p.agent_id, list(p.slice_ids)) for p in high_done.placements] == [("a", ["gpu0"])]
    done = zone.wait_state(low.job_id, *TERMINAL, timeout_seconds=60)
    assert done.state == zone_pb2.JOB_SUCCEEDED, done.reason
    stopped = done.placements[0]
    assert stopped.state == common_pb2.KILLED
    assert stopped.end_cause == common_pb2.END_CAUSE_PREEMPTED
    assert stopped.reason.startswith("window ended: a/gpu0 goes to job " + high.job_id)
    assert 0 < stopped.units_done < 40
    # It stopped at its window's end, not before: the production job waited for it.
    assert stopped.ended_unix >= stopped.window_end_unix - 1.0
    assert high_done.placements[0].started_unix >= stopped.ended_unix - 0.05
    later = done.placements[1:]
    assert later and later[0].agent_id == "b"
    assert later[0].unit_start == stopped.unit_start + stopped.units_done
    units = _units_log(low_ckpt)
    assert sorted(units) == list(range(40)) and set(units.values()) == {1}
    assert done.atomization.violation_rate == 0.0


def _bid_as_client(
    zone: Zone,
    job: zone_pb2.Job,
    gate: Path,
    units: Callable[[int, int], int],
    refused: list[zone_pb2.RefusedBid] | None = None,
) -> tuple[list[zone_pb2.SubjobBid], int]:
    """Attach to ``job``'s Bid stream, open ``gate`` (the job's dependency), and answer
    every announce with one bid on its first window for ``units(round, next_unit)`` units
    (claiming P(fits) 0.99); returns the winning bids and the rounds bid in, and adds the
    refusals the router announced to ``refused``."""
    requests: queue.Queue[zone_pb2.BidMessage | None] = queue.Queue()
    requests.put(zone_pb2.BidMessage(job_id=job.job_id))

    def outgoing() -> Iterator[zone_pb2.BidMessage]:
        while (message := requests.get()) is not None:
            yield message

    stream = zone.stub.Bid(outgoing(), timeout=60)
    gate.touch()
    won: list[zone_pb2.SubjobBid] = []
    rounds = 0
    try:
        for announce in stream:
            if refused is not None:
                refused.extend(announce.refused)
            if announce.won:
                won.append(announce.winning_bid)
            if announce.done:
                break
            if not announce.windows:
                continue
            next_unit = zone.get(job.job_id).atomization.units_done
            window = announce.windows[0]
            assert window.end_unix > 0  # open windows are announced with the router's cap
            requests.put(
                zone_pb2.BidMessage(
                    job_id=job.job_id,
                    round=announce.round,
                    bids=[
                        zone_pb2.SubjobBid(
                            agent_id=window.agent_id,
                            slice_id=window.slice_id,
                            unit_start=next_unit,
                            unit_count=units(rounds, next_unit),
                            seconds=1.0,
                            feasibility=0.99,  # claimed; the router judges it itself
                        )
                    ],
                )
            )
            rounds += 1
    finally:
        requests.put(None)
    return won, rounds


def test_a_client_bids_for_its_own_job_over_the_bid_stream(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    zone = _market_zone(cluster, tmp_path, window_seconds=30.0)
    _agent(cluster, zone, "a", "1xH100-80GB")
    cluster.wait_registered()
    gate = tmp_path / "gate"
    blocker = zone.submit(gate_code(gate))
    checkpoint = tmp_path / "ckpt"
    # It waits for the blocker, so the client attaches before any round.
    job = _submit(zone, _contract(9, 9, checkpoint), "0.05", after=[blocker.job_id])
    won, rounds = _bid_as_client(zone, job, gate, lambda _, nxt: min(3, 9 - nxt))
    done = zone.wait_state(job.job_id, *TERMINAL, timeout_seconds=30)
    assert done.state == zone_pb2.JOB_SUCCEEDED, done.reason
    assert [p.unit_count for p in done.placements] == [3, 3, 3]
    assert [b.unit_start for b in won] == [0, 3, 6] and rounds >= 3
    assert sorted(_units_log(checkpoint)) == list(range(9))


def test_a_window_ends_where_a_blocked_rigid_job_expects_its_capacity(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    zone = _market_zone(cluster, tmp_path, window_seconds=600.0)
    _agent(cluster, zone, "a", "3xH100-80GB")
    cluster.wait_registered()
    gate = tmp_path / "gate"
    # Two GPUs busy with jobs declared to run 8 s; a 2-GPU job then has to wait for them.
    for _ in range(2):
        busy = zone.submit(gate_code(gate), expected_seconds=8.0)
        zone.wait_state(busy.job_id, zone_pb2.JOB_RUNNING)
    big = zone.submit("print('big')", resources=common_pb2.Resources(gpus=2))
    queued = zone.wait_state(big.job_id, zone_pb2.QUEUED)
    wait_for(lambda: zone.get(big.job_id).expected_start_unix > 0)
    head_start = zone.get(big.job_id).expected_start_unix
    job = _submit(zone, _contract(400, 400, tmp_path / "ckpt"), "0.05")
    running = zone.wait_state(job.job_id, zone_pb2.JOB_RUNNING)
    piece = running.placements[0]
    assert len(piece.slice_ids) == 1
    # The free GPU is offered only until the blocked job's expected start, not for 600 s.
    # The piece is given all 400 units (about two minutes), but at its window's end it
    # does not keep the slice: the blocked job's class (batch) is the piece's own.
    assert 0 < piece.window_end_unix <= head_start + 0.5, (piece.window_end_unix, head_start)
    assert piece.unit_count == 400
    assert queued.state == zone_pb2.QUEUED
    wait_for(lambda: any(p.state in ENDED for p in zone.get(job.job_id).placements))
    stopped = zone.get(job.job_id).placements[0]
    assert stopped.state == common_pb2.KILLED
    assert stopped.reason.startswith("window ended:"), stopped.reason
    assert stopped.end_cause == common_pb2.END_CAUSE_PREEMPTED
    assert stopped.ended_unix <= head_start + 2.0
    gate.touch()
    zone.stub.CancelJob(zone_pb2.CancelJobRequest(job_id=job.job_id), timeout=10)
    assert zone.wait_state(big.job_id, *TERMINAL).state == zone_pb2.JOB_SUCCEEDED


def test_a_waiting_atomized_job_says_when_the_next_window_it_fits_opens(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    zone = _market_zone(cluster, tmp_path, window_seconds=600.0)
    _agent(cluster, zone, "a", "1xH100-80GB")
    cluster.wait_registered()
    gate = tmp_path / "gate"
    busy = zone.submit(gate_code(gate), expected_seconds=30.0)
    started = zone.wait_state(busy.job_id, zone_pb2.JOB_RUNNING).placements[0].started_unix
    job = _submit(zone, _contract(4, 4, tmp_path / "ckpt"), "0.05")
    wait_for(lambda: "opens in about" in zone.get(job.job_id).reason)
    waiting = zone.get(job.job_id)
    assert waiting.state == zone_pb2.QUEUED
    assert "a/gpu0" in waiting.reason and "0 of 4 units done" in waiting.reason
    # The busy job declared 30 s: the GPU's window opens then (agent clock, same host).
    assert abs(waiting.expected_start_unix - (started + 30.0)) < 2.0
    gate.touch()
    done = zone.wait_state(job.job_id, *TERMINAL)
    assert done.state == zone_pb2.JOB_SUCCEEDED and done.expected_start_unix == 0


def test_a_client_bid_the_jobs_profile_says_will_not_fit_is_refused(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """The router judges a client's bid as its own (P(fits) >= 1 - epsilon by the job's
    calibrated profile), whatever feasibility the client claims: 9 units of about 0.25 s
    do not fit a 2 s window; 3 do."""
    zone = _market_zone(cluster, tmp_path, window_seconds=2.0)
    _agent(cluster, zone, "a", "1xH100-80GB")
    cluster.wait_registered()
    gate = tmp_path / "gate"
    blocker = zone.submit(gate_code(gate))
    job = _submit(zone, _contract(9, 9, tmp_path / "ckpt"), "0.05", after=[blocker.job_id])
    # The first two rounds ask for everything left, then 3 units a round.
    refused: list[zone_pb2.RefusedBid] = []
    won, rounds = _bid_as_client(
        zone, job, gate, lambda round_, nxt: 9 - nxt if round_ < 2 else min(3, 9 - nxt), refused
    )
    done = zone.wait_state(job.job_id, *TERMINAL, timeout_seconds=30)
    assert done.state == zone_pb2.JOB_SUCCEEDED, done.reason
    assert rounds >= 3  # the greedy bids won nothing
    assert won and all(b.unit_count <= 3 for b in won), [b.unit_count for b in won]
    assert all(p.unit_count <= 3 for p in done.placements)
    # ...and the client was told, naming the field and the threshold.
    assert refused and refused[0].field == "bids[0].unit_count", refused
    assert "below 1 - epsilon = 0.950" in refused[0].reason, refused[0].reason


def test_a_tenants_quota_holds_for_its_atomized_pieces(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Quota `default:gpus=1`: two atomized jobs of the tenant on a 2-GPU host never run
    pieces at the same time (the market only lets a piece win within the quota)."""
    config = tmp_path / "zone.toml"
    config.write_text(
        "[market]\nmax_window_seconds = 30\nround_seconds = 0.2\noverrun_grace_seconds = 0.5\n"
        '[queue]\ntenant_quotas = "default:gpus=1"\n'
    )
    zone = open_zone(cluster, tmp_path, extra_args=["--config", str(config)])
    _agent(cluster, zone, "a", "2xH100-80GB")
    cluster.wait_registered()
    jobs = [_submit(zone, _contract(6, 3, tmp_path / f"ckpt{i}"), "0.05") for i in range(2)]
    pieces = []
    for job in jobs:
        done = zone.wait_state(job.job_id, *TERMINAL, timeout_seconds=60)
        assert done.state == zone_pb2.JOB_SUCCEEDED, done.reason
        pieces += [(p.started_unix, p.ended_unix) for p in done.placements]
    pieces.sort()
    assert len(pieces) >= 4
    for (_, end), (start, _) in itertools.pairwise(pieces):
        assert start >= end - 0.05, pieces  # one piece of the tenant at a time
