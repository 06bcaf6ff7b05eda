"""Atomized gangs end to end: real router, real agents on fake MIG GPUs, real processes.

A gang of ``g`` members bids for ``g`` windows of one family at once (laminar_zone.market);
the router starts a won piece as one unit (one commit per member, all or nothing), extends
it in place for all members together, and stops all of them when a higher class takes
one slice (each checkpoints; the gang's progress is common to its members).

The members run ``GANG_WORKER``, a gang in lockstep: every member does each unit and marks
it done; member 0 checkpoints a unit (logs it for every member of its piece, then moves
the shared progress) once all of them did it, and no member starts the next unit before
that checkpoint. ``units.log`` thus says which subjob did which unit, and a unit is in it
only if the whole piece did it (a member stopped mid-unit is not in it, as in a real
gang's collective step).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from waiting import gate_code, wait_for
from zonekit import HEARTBEAT_SECONDS, TERMINAL, Zone, open_zone

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2
from laminar_cli.cluster import AgentProcess, LocalCluster

GIB = 1024**3
UNIT_SECONDS = 0.25
MIG = "H100-80GB:mig=3g.40gb+3g.40gb"
GANG_WORKER = """
import os, signal, sys, time
from pathlib import Path
seconds = float(sys.argv[1])
start = int(os.environ["LAMINAR_UNIT_START"])
count = int(os.environ["LAMINAR_UNIT_COUNT"])
member = int(os.environ["RANK"])
size = int(os.environ["WORLD_SIZE"])
checkpoint = Path(os.environ["LAMINAR_CHECKPOINT_DIR"])
subjob = os.environ["LAMINAR_SUBJOB_ID"]
progress = checkpoint / "progress"
ready = checkpoint / "ready"
ready.mkdir(exist_ok=True)
for unit in range(start, start + count):
    time.sleep(seconds)
    mark = ready / f"{start}.{unit}.{member}"
    (ready / f"{mark.name}.tmp").write_text(subjob)
    os.replace(ready / f"{mark.name}.tmp", mark)  # this member did the unit
    if member:
        while not (progress.exists() and int(progress.read_text() or 0) > unit):
            time.sleep(0.01)  # the follower waits for the gang's checkpoint of this unit
        continue
    marks = [ready / f"{start}.{unit}.{m}" for m in range(size)]
    while not all(m.exists() for m in marks):
        time.sleep(0.01)  # member 0 checkpoints a unit once every member of its piece did it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    with (checkpoint / "units.log").open("a") as log:
        log.write("".join(f"{unit} {m.read_text()}\\n" for m in marks))
    tmp = checkpoint / "progress.tmp"
    tmp.write_text(str(unit + 1))
    os.replace(tmp, progress)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path) as c:
        yield c


def _zone(cluster: LocalCluster, root: Path, window_seconds: float) -> Zone:
    config = root / "zone.toml"
    config.write_text(
        f"[market]\nmax_window_seconds = {window_seconds}\nround_seconds = 0.2\n"
        "overrun_grace_seconds = 0.5\n"
    )
    return open_zone(cluster, root, extra_args=["--config", str(config)])


def _agent(cluster: LocalCluster, zone: Zone, name: str, gpus: str) -> AgentProcess:
    return cluster.start_agent(name, gpus, zone=zone.address, heartbeat_seconds=HEARTBEAT_SECONDS)


def _contract(units: int, checkpoint: Path, slack: float = 1.4) -> common_pb2.AtomizationContract:
    """``slack``: the declared 95th percentile of a unit's time, in units of the real one."""
    return common_pb2.AtomizationContract(
        total_units=units,
        seconds_per_unit=[
            common_pb2.Quantile(q=0.5, value=UNIT_SECONDS),
            common_pb2.Quantile(q=0.95, value=UNIT_SECONDS * slack),
        ],
        peak_memory_bytes=[
            common_pb2.Quantile(q=0.5, value=2 * GIB),
            common_pb2.Quantile(q=0.95, value=4 * GIB),
        ],
        checkpoint_overhead_seconds=0.1,
        max_units=units,
        checkpoint_dir=str(checkpoint),
    )


def _submit_gang(
    zone: Zone,
    root: Path,
    units: int,
    checkpoint: Path,
    priority: int,
    resources: common_pb2.Resources | None = None,
    slack: float = 1.4,
    **fields: Any,
) -> zone_pb2.Job:
    worker = root / "gang_worker.py"
    worker.write_text(GANG_WORKER)
    spec = zone_pb2.JobSpec(
        command=[sys.executable, str(worker), str(UNIT_SECONDS)],
        atomization=_contract(units, checkpoint, slack),
        gang_size=2,
        priority=priority,
        resources=resources or common_pb2.Resources(mig_profile="3g.40gb"),
        **fields,
    )
    return zone.stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)


def _log(checkpoint: Path) -> list[tuple[int, str]]:
    path = checkpoint / "units.log"
    lines = path.read_text().split("\n") if path.exists() else []
    return [(int(u), s) for u, s in (line.split() for line in lines if line)]


def _by_member(done: zone_pb2.Job, checkpoint: Path) -> dict[int, Counter[int]]:
    """Units logged per gang member (by the member index of the subjob that logged it)."""
    member = {p.subjob_id: p.member for p in done.placements}
    out: dict[int, Counter[int]] = {0: Counter(), 1: Counter()}
    for unit, subjob in _log(checkpoint):
        out[member[subjob]][unit] += 1
    return out


def test_an_uncontended_gang_runs_both_members_extended_in_place(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """2 s windows, 16 units of 0.25 s (4 s of work): nobody else wants the slices, so at
    each window's end the gang's piece keeps both, in place: two processes, one per
    member, do every unit, with no checkpoint-and-restart."""
    zone = _zone(cluster, tmp_path, window_seconds=2.0)
    _agent(cluster, zone, "a", MIG)
    cluster.wait_registered()
    checkpoint = tmp_path / "ckpt"
    job = _submit_gang(zone, tmp_path, 16, checkpoint, common_pb2.BATCH)
    done = zone.wait_state(job.job_id, *TERMINAL, timeout_seconds=60)
    assert done.state == zone_pb2.JOB_SUCCEEDED, done.reason
    pieces = list(done.placements)
    assert len(pieces) == 2, [(p.subjob_id, p.reason) for p in pieces]
    assert sorted(p.member for p in pieces) == [0, 1]
    slices = sorted(s for p in pieces for s in p.slice_ids)
    assert len(set(slices)) == 2 and all(s.startswith("gpu0/3g.40gb") for s in slices), slices
    for p in pieces:
        assert (p.unit_start, p.unit_count) == (0, 16)
        assert p.state == common_pb2.SUCCEEDED and p.end_cause == common_pb2.END_CAUSE_EXITED
        # Extended together: both ran well past the first 2 s window, to one window end.
        assert p.window_end_unix > p.started_unix + 2.5
        assert p.ended_unix - p.started_unix > 3.5
    assert pieces[0].window_end_unix == pieces[1].window_end_unix
    per_member = _by_member(done, checkpoint)
    for member in (0, 1):
        assert per_member[member] == Counter(range(16)), per_member[member]
    assert done.atomization.units_done == 16 and done.atomization.violation_rate == 0.0


def test_a_higher_class_takes_one_slice_and_the_whole_gang_checkpoints_and_goes_on(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """The gang holds both slices of the only GPU. A production atomized job arrives: at
    the window's end it wins one of the gang's slices; both members stop (a gang runs
    whole or not at all), checkpointed, no violation; the production job runs; then the
    gang continues from its checkpoint, once two slices are free again."""
    zone = _zone(cluster, tmp_path, window_seconds=2.0)
    _agent(cluster, zone, "a", MIG)
    cluster.wait_registered()
    checkpoint = tmp_path / "ckpt"
    gang = _submit_gang(zone, tmp_path, 40, checkpoint, common_pb2.OPPORTUNISTIC)
    running = zone.wait_state(gang.job_id, zone_pb2.JOB_RUNNING)
    assert len(running.placements) == 2
    wait_for(lambda: len(_log(checkpoint)) >= 2)
    high_spec = zone_pb2.JobSpec(
        command=[sys.executable, "-c", "print('high')"],
        atomization=_contract(2, tmp_path / "high"),
        priority=common_pb2.PRODUCTION,
        resources=common_pb2.Resources(mig_profile="3g.40gb"),
    )
    high = zone.stub.Submit(zone_pb2.SubmitRequest(spec=high_spec), timeout=10)
    high_done = zone.wait_state(high.job_id, *TERMINAL, timeout_seconds=60)
    assert high_done.state == zone_pb2.JOB_SUCCEEDED, high_done.reason
    done = zone.wait_state(gang.job_id, *TERMINAL, timeout_seconds=90)
    assert done.state == zone_pb2.JOB_SUCCEEDED, done.reason
    first = [p for p in done.placements if p.unit_start == 0]
    assert len(first) == 2
    taken = high_done.placements[0].slice_ids[0]
    for p in first:
        assert p.state == common_pb2.KILLED and p.end_cause == common_pb2.END_CAUSE_PREEMPTED
        assert p.reason.startswith(f"window ended: a/{taken} goes to job {high.job_id}"), p.reason
        # At the window's end, not before; the production job waited for the gang.
        assert p.ended_unix >= p.window_end_unix - 1.0
        assert high_done.placements[0].started_unix >= p.ended_unix - 0.05
    reached = max(p.unit_start + p.units_done for p in first)
    assert 0 < reached < 40
    later = [p for p in done.placements if p.unit_start > 0]
    assert len(later) >= 2 and later[0].unit_start == reached
    assert min(p.started_unix for p in later) >= high_done.placements[0].started_unix
    # Member 0 checkpointed every unit exactly once; the follower did each at least once
    # and redid at most the unit it was in when stopped.
    per_member = _by_member(done, checkpoint)
    assert per_member[0] == Counter(range(40)), per_member[0]
    assert set(per_member[1]) == set(range(40))
    assert done.atomization.violation_rate == 0.0


def test_a_member_whose_commit_fails_rolls_the_other_back_and_the_gang_runs_later(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """A production rigid job holds one slice past the 0.1 s it declared, so its agent
    advertises that slice as open: the gang wins both windows, the member committed on the
    busy slice bounces, and the member that started is stopped (nothing of the gang runs
    partially, and it is not placed again before that stop is reported). Once the rigid
    job ends, the gang runs both members to completion."""
    zone = _zone(cluster, tmp_path, window_seconds=30.0)
    _agent(cluster, zone, "a", MIG)
    cluster.wait_registered()
    gate = tmp_path / "gate"
    blocker = zone.submit(
        gate_code(gate),
        resources=common_pb2.Resources(mig_profile="3g.40gb"),
        priority=common_pb2.PRODUCTION,
        expected_seconds=0.1,
    )
    zone.wait_state(blocker.job_id, zone_pb2.JOB_RUNNING)
    checkpoint = tmp_path / "ckpt"
    # A generous declared pace: the run that finishes must not overrun it even on a loaded
    # machine (an interpreter's start counts in the piece's time), so the violation rate
    # below reads only whether the rollback was counted as one.
    gang = _submit_gang(zone, tmp_path, 4, checkpoint, common_pb2.OPPORTUNISTIC, slack=8.0)

    def rolled_back() -> bool:
        placements = zone.get(gang.job_id).placements
        return any(p.reason.startswith("gang rollback") and p.started_unix > 0 for p in placements)

    wait_for(rolled_back)
    assert zone.get(gang.job_id).state != zone_pb2.JOB_FAILED
    gate.touch()
    assert zone.wait_state(blocker.job_id, *TERMINAL).state == zone_pb2.JOB_SUCCEEDED
    done = zone.wait_state(gang.job_id, *TERMINAL, timeout_seconds=60)
    assert done.state == zone_pb2.JOB_SUCCEEDED, done.reason
    rollbacks = [p for p in done.placements if p.end_cause == common_pb2.END_CAUSE_COMMIT_FAILED]
    started = [p for p in rollbacks if p.started_unix > 0]
    never = [p for p in rollbacks if p.started_unix == 0]
    assert started and never
    for p in rollbacks:
        # Stopped by its agent if it started; one that never started failed to commit (as a
        # rigid gang's member does: one rollback decision, ZoneCore.roll_back).
        state = common_pb2.KILLED if p.started_unix > 0 else common_pb2.FAILED
        assert p.state == state and p.reason.startswith("gang rollback"), p.reason
        assert p.units_done == 0
    finished = [p for p in done.placements if p.state == common_pb2.SUCCEEDED]
    assert len(finished) == 2 and sorted(p.member for p in finished) == [0, 1]
    per_member = _by_member(done, checkpoint)
    assert per_member[0] == Counter(range(4)) and per_member[1] == Counter(range(4))
    # Every rolled-back member that started ended before the gang's piece started (the
    # job is not placed again before the stop is reported: no member ran twice at once).
    first_run = min(p.started_unix for p in finished)
    assert all(p.ended_unix <= first_run + 0.05 for p in started), (started, first_run)
    assert done.atomization.violation_rate == 0.0


def test_a_member_taken_by_airlock_stops_its_sibling_and_the_gang_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gang's members run on two hosts (a whole GPU each). Memory pressure on
    one host makes Airlock suspend, then hand back, its member: the piece ends there, its
    sibling on the other host is stopped with it (``GANG_STOPPED``, free), and the gang
    resumes from its common checkpoint on the two GPUs free of pressure."""
    monkeypatch.setenv("LAMINAR_AIRLOCK_HOLD_SECONDS", "0.3")
    monkeypatch.setenv("LAMINAR_AIRLOCK_READDRESS_AFTER_SECONDS", "1")
    monkeypatch.setenv("LAMINAR_AIRLOCK_MAX_READDRESS", "1")
    monkeypatch.setenv("LAMINAR_AIRLOCK_RECLAIM_GRACE_SECONDS", "1")
    with LocalCluster(tmp_path) as cluster:
        zone = _zone(cluster, tmp_path, window_seconds=30.0)
        a = _agent(cluster, zone, "a", "1xH100-80GB")
        _agent(cluster, zone, "b", "1xH100-80GB")
        cluster.wait_registered()
        # Agent c joins once the gang runs on a and b: where Airlock re-addresses to.
        checkpoint = tmp_path / "ckpt"
        gang = _submit_gang(
            zone,
            tmp_path,
            24,
            checkpoint,
            common_pb2.OPPORTUNISTIC,
            common_pb2.Resources(gpus=1),
            lifecycle=common_pb2.TRANSIENT,  # Airlock may hand it back (re-address)
            restartable=True,
        )
        running = zone.wait_state(gang.job_id, zone_pb2.JOB_RUNNING)
        assert sorted(p.agent_id for p in running.placements) == ["a", "b"]
        _agent(cluster, zone, "c", "1xH100-80GB")
        cluster.wait_registered()
        wait_for(lambda: len(_log(checkpoint)) >= 2)
        with grpc.insecure_channel(a.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            stub.InjectLoad(
                agent_pb2.InjectLoadRequest(gpu_index=0, used_bytes=79 * GIB), timeout=10
            )

            def sibling_stopped() -> bool:
                placements = zone.get(gang.job_id).placements
                return any(p.end_cause == common_pb2.END_CAUSE_GANG_STOPPED for p in placements)

            wait_for(sibling_stopped, timeout_seconds=60)
        done = zone.wait_state(gang.job_id, *TERMINAL, timeout_seconds=90)
    assert done.state == zone_pb2.JOB_SUCCEEDED, done.reason
    first = [p for p in done.placements if p.unit_start == 0 and p.started_unix > 0]
    assert len(first) == 2
    taken = next(p for p in first if p.agent_id == "a")
    sibling = next(p for p in first if p.agent_id == "b")
    assert taken.state == common_pb2.KILLED
    assert taken.end_cause in (
        common_pb2.END_CAUSE_READDRESSED,
        common_pb2.END_CAUSE_RECLAIMED,
    ), taken.end_cause
    assert sibling.state == common_pb2.KILLED
    assert sibling.end_cause == common_pb2.END_CAUSE_GANG_STOPPED
    assert sibling.reason.startswith(f"gang member {taken.member} ({taken.subjob_id}) ended")
    assert sibling.ended_unix >= taken.ended_unix
    reached = max(p.unit_start + p.units_done for p in first)
    later = [p for p in done.placements if p.unit_start > 0]
    assert len(later) >= 2 and min(p.unit_start for p in later) == reached
    assert {p.agent_id for p in later[:2]} == {"b", "c"}
    per_member = _by_member(done, checkpoint)
    assert per_member[0] == Counter(range(24)), per_member[0]
    assert set(per_member[1]) == set(range(24))
