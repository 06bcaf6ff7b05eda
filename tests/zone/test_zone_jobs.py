"""Jobs through a real router and agents: run, queue, gangs, cancel, dependencies, drain, input."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from waiting import gate_code, wait_for
from zonekit import TERMINAL, Zone

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2


def test_submit_runs_to_success_with_placement_and_logs(zone: Zone) -> None:
    job = zone.submit("print('hello from laminar')", name="hello")
    assert job.job_id.startswith("j-") and job.zone == "a"
    states = [j.state for j in zone.watch_to_end(job.job_id)]
    assert states[-1] == zone_pb2.JOB_SUCCEEDED
    done = zone.get(job.job_id)
    (placement,) = done.placements
    assert placement.agent_id in ("whole", "share")
    assert placement.state == common_pb2.SUCCEEDED and placement.slice_ids
    assert done.probes >= 1 and done.started_unix >= done.submitted_unix
    logs = zone.stub.GetLogs(zone_pb2.GetLogsRequest(job_id=job.job_id), timeout=10)
    assert logs.data == b"hello from laminar\n"
    assert logs.subjob_id == placement.subjob_id


def test_submit_is_idempotent_per_request_id(zone: Zone) -> None:
    first = zone.submit(request_id="req-1")
    second = zone.submit(request_id="req-1")
    assert first.job_id == second.job_id
    zone.wait_state(first.job_id, zone_pb2.JOB_SUCCEEDED)


def test_mig_and_share_jobs_land_on_matching_slices(zone: Zone) -> None:
    mig = zone.submit(resources=common_pb2.Resources(mig_profile="2g.20gb"))
    share = zone.submit(resources=common_pb2.Resources(gpu_milli=250, gpu_memory_bytes=8 * 1024**3))
    mig_done = zone.wait_state(mig.job_id, zone_pb2.JOB_SUCCEEDED)
    share_done = zone.wait_state(share.job_id, zone_pb2.JOB_SUCCEEDED)
    assert mig_done.placements[0].agent_id == "mig"
    assert "2g.20gb" in mig_done.placements[0].slice_ids[0]
    assert share_done.placements[0].agent_id == "share"


def test_full_cluster_queues_with_explanation_then_places(zone: Zone, tmp_path: Path) -> None:
    gate = tmp_path / "go"
    blockers = [zone.submit(gate_code(gate), resources=common_pb2.Resources(mig_profile="3g.40gb"))]
    zone.wait_state(blockers[0].job_id, zone_pb2.JOB_RUNNING)
    waiting = zone.submit(resources=common_pb2.Resources(mig_profile="3g.40gb"))
    queued = zone.wait_state(waiting.job_id, zone_pb2.QUEUED)
    assert "no host with a free 3g.40gb slice" in queued.reason
    assert "1 of 3 hosts match" in queued.reason
    assert queued.queue_position == 1
    gate.touch()
    zone.wait_state(blockers[0].job_id, zone_pb2.JOB_SUCCEEDED)
    placed = zone.wait_state(waiting.job_id, zone_pb2.JOB_SUCCEEDED)
    assert placed.placements[0].agent_id == "mig"


def test_expected_start_comes_from_declared_run_time(zone: Zone, tmp_path: Path) -> None:
    gate = tmp_path / "go"
    blocker = zone.submit(
        gate_code(gate),
        resources=common_pb2.Resources(mig_profile="1g.10gb"),
        expected_seconds=120,
    )
    running = zone.wait_state(blocker.job_id, zone_pb2.JOB_RUNNING)
    later = zone.submit(resources=common_pb2.Resources(mig_profile="1g.10gb"))
    zone.wait_state(later.job_id, zone_pb2.QUEUED)
    # A job just queued says why at once; its estimate comes with the next queue pass
    # (at most queue.min_pass_seconds later), which walks the queue in order.
    wait_for(lambda: zone.get(later.job_id).expected_start_unix > 0)
    queued = zone.get(later.job_id)
    assert queued.state == zone_pb2.QUEUED
    assert queued.expected_start_unix == pytest.approx(running.started_unix + 120, abs=2)
    assert "expected start in about" in queued.reason
    gate.touch()
    zone.wait_state(later.job_id, zone_pb2.JOB_SUCCEEDED)


def test_gang_is_all_or_nothing(zone: Zone, tmp_path: Path) -> None:
    # Three whole GPUs exist (2 on "whole", 1 shared GPU on "share"): a gang of four never
    # fits and must hold no lease; a gang of three runs across hosts.
    too_big = zone.submit(gang_size=4)
    queued = zone.wait_state(too_big.job_id, zone_pb2.QUEUED)
    assert not queued.placements
    gate = tmp_path / "go"
    gang = zone.submit(gate_code(gate), gang_size=3)
    running = zone.wait_state(gang.job_id, zone_pb2.JOB_RUNNING)
    assert sorted(p.member for p in running.placements) == [0, 1, 2]
    assert {p.agent_id for p in running.placements} == {"whole", "share"}
    gate.touch()
    zone.wait_state(gang.job_id, zone_pb2.JOB_SUCCEEDED)
    zone.stub.CancelJob(zone_pb2.CancelJobRequest(job_id=too_big.job_id), timeout=10)


def test_failed_gang_member_stops_the_others_and_retries_the_gang(
    zone: Zone, tmp_path: Path
) -> None:
    marker = tmp_path / "attempt"
    # Member 0 of the first attempt fails at once; later attempts succeed.
    code = (
        "import os, pathlib, sys, time\n"
        f"m = pathlib.Path({str(marker)!r})\n"
        "first = os.environ['LAMINAR_SUBJOB_ID'].endswith('-a1-m0')\n"
        "if first: sys.exit(3)\n"
        "if '-a1-' in os.environ['LAMINAR_SUBJOB_ID']: time.sleep(60)\n"
    )
    job = zone.submit(code, gang_size=2, max_retries=1)
    done = zone.wait_state(job.job_id, zone_pb2.JOB_SUCCEEDED, timeout_seconds=40)
    assert done.retries_used == 1 and done.attempts == 2
    first = [p for p in done.placements if p.attempt == 1]
    assert {p.state for p in first} == {common_pb2.FAILED, common_pb2.KILLED}
    killed = next(p for p in first if p.state == common_pb2.KILLED)
    assert "gang member 0 ended" in killed.reason or "terminat" in killed.reason


def test_failure_without_retries_fails_the_job_with_the_reason(zone: Zone) -> None:
    job = zone.submit("raise SystemExit(7)")
    failed = zone.wait_state(job.job_id, zone_pb2.JOB_FAILED)
    assert "exit" in failed.reason and "7" in failed.reason


def test_a_run_past_its_time_limit_is_stopped_and_fails_without_a_retry(zone: Zone) -> None:
    """Slurm's --time: the router stops a subjob still running at its limit (SIGTERM, then
    SIGKILL after the grace) with cause TIME_LIMIT; the job fails with that reason code and
    its retries are not spent (it would run out of time again)."""
    job = zone.submit(
        "import time\nprint('working', flush=True)\ntime.sleep(600)",
        time_limit_seconds=1.5,
        max_retries=2,
        grace_seconds=1,
    )
    failed = zone.wait_state(job.job_id, zone_pb2.JOB_FAILED, timeout_seconds=30)
    assert failed.reason_code == zone_pb2.REASON_TIME_LIMIT
    assert "time limit" in failed.reason and "spec.time_limit_seconds" in failed.reason
    (placement,) = failed.placements
    assert placement.end_cause == common_pb2.END_CAUSE_TIME_LIMIT
    assert placement.state == common_pb2.KILLED
    assert failed.attempts == 1 and failed.retries_used == 0
    # It ran its limit out: not stopped early (the wait above bounds how late).
    assert placement.ended_unix - placement.started_unix >= 1.5
    # A job that ends within its limit is not touched.
    quick = zone.submit("print('done')", time_limit_seconds=60)
    assert zone.wait_state(quick.job_id, zone_pb2.JOB_SUCCEEDED).reason_code == zone_pb2.REASON_NONE
    # Ops see ends by cause (each subjob once): the time limit's among them.
    ends = _subjobs_ended(zone)
    assert ends.get("time_limit", 0) >= 1 and ends.get("exited", 0) >= 1, ends


def _subjobs_ended(zone: Zone) -> dict[str, float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    address = zone.cluster.zones[0].metrics_address
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        s.labels["cause"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "laminar_zone_subjobs_ended"
        for s in f.samples
    }


def test_cancel_running_and_queued_jobs(zone: Zone, tmp_path: Path) -> None:
    gate = tmp_path / "never"
    running = zone.submit(gate_code(gate), resources=common_pb2.Resources(mig_profile="3g.40gb"))
    zone.wait_state(running.job_id, zone_pb2.JOB_RUNNING)
    queued = zone.submit(resources=common_pb2.Resources(mig_profile="3g.40gb"))
    zone.wait_state(queued.job_id, zone_pb2.QUEUED)
    zone.stub.CancelJob(zone_pb2.CancelJobRequest(job_id=queued.job_id, reason="test"), timeout=10)
    cancelled = zone.stub.CancelJob(
        zone_pb2.CancelJobRequest(job_id=running.job_id, reason="user asked"), timeout=10
    )
    assert cancelled.state == zone_pb2.JOB_CANCELLED and "user asked" in cancelled.reason

    def killed() -> bool:
        return zone.get(running.job_id).placements[0].state == common_pb2.KILLED

    wait_for(killed)
    assert not zone.get(queued.job_id).placements
    # Again: harmless (a resend whose reply was lost), the job stays as it was cancelled.
    again = zone.stub.CancelJob(zone_pb2.CancelJobRequest(job_id=running.job_id), timeout=10)
    assert again.state == zone_pb2.JOB_CANCELLED and "user asked" in again.reason
    # A job that ended otherwise is not cancelled: refused, naming the job.
    done = zone.submit("pass")
    zone.wait_state(done.job_id, zone_pb2.JOB_SUCCEEDED)
    with pytest.raises(grpc.RpcError) as err:
        zone.stub.CancelJob(zone_pb2.CancelJobRequest(job_id=done.job_id), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already ended (job_succeeded)" in (err.value.details() or "")


def test_dependencies_wait_for_success_and_fail_with_the_dependency(
    zone: Zone, tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    first = zone.submit(gate_code(gate))
    second = zone.submit(after=[first.job_id])
    assert second.state == zone_pb2.WAITING and first.job_id in second.reason
    doomed = zone.submit("raise SystemExit(1)")
    orphan = zone.submit(after=[doomed.job_id])
    gate.touch()
    done = zone.wait_state(second.job_id, zone_pb2.JOB_SUCCEEDED)
    assert done.started_unix >= zone.get(first.job_id).ended_unix
    failed = zone.wait_state(orphan.job_id, zone_pb2.JOB_FAILED)
    assert doomed.job_id in failed.reason and not failed.placements


def test_drain_steers_work_away_and_undrain_brings_it_back(zone: Zone) -> None:
    info = zone.stub.DrainAgent(
        zone_pb2.DrainAgentRequest(agent="whole", reason="test"), timeout=10
    )
    assert info.state == zone_pb2.AGENT_DRAINING
    try:
        jobs = [zone.submit() for _ in range(3)]
        for job in jobs:
            done = zone.wait_state(job.job_id, zone_pb2.JOB_SUCCEEDED)
            assert done.placements[-1].agent_id == "share"
    finally:
        zone.stub.UndrainAgent(zone_pb2.DrainAgentRequest(agent="whole"), timeout=10)
    agents = {a.agent_id: a for a in zone.stub.ListAgents(zone_pb2.ListAgentsRequest()).agents}
    assert agents["whole"].state == zone_pb2.AGENT_READY


def test_probe_dry_run_and_two_phase_commit(zone: Zone) -> None:
    spec = zone_pb2.JobSpec(resources=common_pb2.Resources(mig_profile="1g.10gb"))
    dry = zone.stub.ProbeJob(zone_pb2.ProbeJobRequest(spec=spec), timeout=10)
    assert dry.hosts_total == 3 and dry.hosts_matching == 1
    assert [h.agent_id for h in dry.hosts if h.fits] == ["mig"]
    assert not any(h.HasField("lease") for h in dry.hosts)
    kept = zone.stub.ProbeJob(zone_pb2.ProbeJobRequest(spec=spec, keep_leases=True), timeout=10)
    (host,) = kept.hosts
    assert host.fits and host.lease.lease_id
    spec.command.extend(["true"])
    job = zone.stub.CommitJob(zone_pb2.CommitJobRequest(spec=spec, leases=[host.lease]), timeout=10)
    assert job.state == zone_pb2.JOB_RUNNING
    zone.wait_state(job.job_id, zone_pb2.JOB_SUCCEEDED)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (zone_pb2.JobSpec(), "spec.command"),
        (
            zone_pb2.JobSpec(
                command=["true"], resources=common_pb2.Resources(gpus=1, mig_profile="1g.10gb")
            ),
            "spec.resources.mig_profile",
        ),
        (
            zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpu_milli=5000)),
            "spec.resources.gpu_milli",
        ),
        (zone_pb2.JobSpec(command=["true"], after=["j-nope"]), "spec.after"),
        (zone_pb2.JobSpec(command=["true"], gang_size=1000), "spec.gang_size"),
        (zone_pb2.JobSpec(command=["true"], priority=42), "spec.priority"),  # type: ignore[arg-type]
        (zone_pb2.JobSpec(command=["true"], expected_seconds=-1), "spec.expected_seconds"),
        (zone_pb2.JobSpec(command=["true"], time_limit_seconds=-1), "spec.time_limit_seconds"),
        (  # stopped before it would end: refused, not left to fail later
            zone_pb2.JobSpec(command=["true"], expected_seconds=60, time_limit_seconds=30),
            "spec.expected_seconds",
        ),
        (  # no GPU has it: refused at once instead of waiting for ever
            zone_pb2.JobSpec(
                command=["true"], resources=common_pb2.Resources(mig_profile="9g.99gb")
            ),
            "spec.resources.mig_profile",
        ),
        (
            zone_pb2.JobSpec(
                command=["true"],
                resources=common_pb2.Resources(mig_profile="7g.80gb", gpu_model="A100-40GB"),
            ),
            "spec.resources.mig_profile",
        ),
        (
            zone_pb2.JobSpec(command=["true"], run_through_partitions=True),
            "spec.run_through_partitions",
        ),
    ],
)
def test_bad_submissions_are_refused_naming_the_field(
    zone: Zone, spec: zone_pb2.JobSpec, field: str
) -> None:
    before = len(zone.stub.ListJobs(zone_pb2.ListJobsRequest(), timeout=10).jobs)
    with pytest.raises(grpc.RpcError) as err:
        zone.stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (err.value.details() or "")
    assert len(zone.stub.ListJobs(zone_pb2.ListJobsRequest(), timeout=10).jobs) == before


def test_unknown_job_is_not_found(zone: Zone) -> None:
    with pytest.raises(grpc.RpcError) as err:
        zone.get("j-missing")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_list_filters_by_tenant_and_state(zone: Zone) -> None:
    job = zone.submit(tenant="filter-me")
    zone.wait_state(job.job_id, zone_pb2.JOB_SUCCEEDED)
    listed = zone.stub.ListJobs(
        zone_pb2.ListJobsRequest(tenant="filter-me", states=[zone_pb2.JOB_SUCCEEDED]), timeout=10
    ).jobs
    assert [j.job_id for j in listed] == [job.job_id]
    assert all(j.state in TERMINAL or j.state for j in listed)


def test_metrics_cover_placement_queue_jobs_and_agents(zone: Zone) -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    job = zone.submit()
    zone.wait_state(job.job_id, zone_pb2.JOB_SUCCEEDED)
    address = zone.cluster.zones[0].metrics_address
    families: dict = {}

    def scrape() -> bool:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        families.clear()
        families.update({f.name: f for f in text_string_to_metric_families(text)})
        agents = families.get("laminar_zone_agents")
        return agents is not None and any(
            s.labels.get("state") == "ready" and s.value == 3.0 for s in agents.samples
        )

    # Gauges are refreshed by the router's sweep (each heartbeat period, at most 1 s).
    wait_for(scrape)
    for name in (
        "laminar_zone_placement_duration_seconds",
        "laminar_zone_placement_probes",
        "laminar_zone_placement_bounces",
        "laminar_zone_queue_jobs",
        "laminar_zone_queue_wait_seconds",
        "laminar_zone_jobs",
        "laminar_zone_agents",
        "laminar_zone_placements",
    ):
        assert name in families, name
    ready = [
        s.value for s in families["laminar_zone_agents"].samples if s.labels.get("state") == "ready"
    ]
    assert ready == [3.0]
    placed = [
        s.value
        for s in families["laminar_zone_placements"].samples
        if s.labels.get("outcome") == "placed" and s.name.endswith("_total")
    ]
    assert placed and placed[0] >= 1


def test_readdress_request_moves_the_subjob_and_stops_the_old_copy(
    zone: Zone, tmp_path: Path
) -> None:
    from laminar_api.v1 import zone_pb2_grpc

    gate = tmp_path / "go"
    job = zone.submit(gate_code(gate), restartable=True)
    running = zone.wait_state(job.job_id, zone_pb2.JOB_RUNNING)
    old = running.placements[0]
    agents = {a.agent_id: a for a in zone.stub.ListAgents(zone_pb2.ListAgentsRequest()).agents}
    # What the agent's heartbeat carries when Airlock gives up on resuming a subjob in place.
    control = zone_pb2_grpc.ZoneControlStub(zone.channel)
    control.Heartbeat(
        zone_pb2.HeartbeatRequest(
            summary=agents[old.agent_id].summary, readdress_subjob_ids=[old.subjob_id]
        ),
        timeout=10,
    )

    def moved() -> bool:
        placements = zone.get(job.job_id).placements
        return len(placements) == 2 and placements[1].state == common_pb2.RUNNING

    wait_for(moved)
    moved_job = zone.get(job.job_id)
    first, copy = moved_job.placements
    assert first.reason.startswith("readdressed: moved to ") and first.state == common_pb2.KILLED
    assert first.end_cause == common_pb2.END_CAUSE_READDRESSED
    assert copy.agent_id != old.agent_id and copy.subjob_id.endswith("-r1")
    assert moved_job.retries_used == 0 and moved_job.state == zone_pb2.JOB_RUNNING
    # The copy's agent runs it knowing one move came before (its Airlock's budget).
    with grpc.insecure_channel(copy.agent_address) as channel:
        ran = agent_pb2_grpc.AgentStub(channel).GetSubjob(
            agent_pb2.GetSubjobRequest(subjob_id=copy.subjob_id), timeout=10
        )
    assert ran.spec.env["LAMINAR_READDRESS_COUNT"] == "1"
    gate.touch()
    done = zone.wait_state(job.job_id, zone_pb2.JOB_SUCCEEDED)
    assert done.placements[0].reason.startswith("readdressed:")
