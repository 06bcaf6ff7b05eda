"""Failure and policy paths that need their own cluster: router kill -9, agent death, quota,
flow splitting across zones, and many concurrent submitters."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import grpc
import pytest
from waiting import gate_code, wait_for
from zonekit import HEARTBEAT_SECONDS, TERMINAL, free_port, open_zone

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster


def test_router_kill9_and_restart_loses_no_job(tmp_path: Path) -> None:
    port = free_port()
    gate = tmp_path / "go"
    with LocalCluster(tmp_path) as cluster:
        zone = open_zone(cluster, tmp_path, listen=f"127.0.0.1:{port}")
        cluster.start_agent(
            "h0", "2xH100-80GB", zone=zone.address, heartbeat_seconds=HEARTBEAT_SECONDS
        )
        cluster.wait_registered()
        running = [zone.submit(gate_code(gate)) for _ in range(2)]
        for job in running:
            zone.wait_state(job.job_id, zone_pb2.JOB_RUNNING)
        queued = [zone.submit() for _ in range(3)]
        for job in queued:
            zone.wait_state(job.job_id, zone_pb2.QUEUED)
        waiting = zone.submit(after=[queued[0].job_id])
        cluster.zones[0].process.send_signal(signal.SIGKILL)
        cluster.zones[0].process.wait(10)
        zone.channel.close()
        cluster.zones.clear()
        zone = open_zone(cluster, tmp_path, listen=f"127.0.0.1:{port}")
        all_jobs = [*running, *queued, waiting]
        listed = {j.job_id for j in zone.stub.ListJobs(zone_pb2.ListJobsRequest(), timeout=10).jobs}
        assert {j.job_id for j in all_jobs} <= listed
        assert zone.get(running[0].job_id).state == zone_pb2.JOB_RUNNING
        gate.touch()
        for job in all_jobs:
            done = zone.wait_state(job.job_id, *TERMINAL)
            assert done.state == zone_pb2.JOB_SUCCEEDED, (job.job_id, done.reason)
        # Each job ran exactly once, even the ones running across the router restart.
        for job in all_jobs:
            assert len(zone.get(job.job_id).placements) == 1
        zone.channel.close()


def test_agent_death_marks_the_subjob_lost_and_retries_elsewhere(tmp_path: Path) -> None:
    gate = tmp_path / "go"
    with LocalCluster(tmp_path, env={"LAMINAR_MEMBERSHIP_LOST_AFTER_SECONDS": "4"}) as cluster:
        zone = open_zone(cluster, tmp_path)
        doomed = cluster.start_agent(
            "doomed", "H100-80GB", zone=zone.address, heartbeat_seconds=HEARTBEAT_SECONDS
        )
        cluster.wait_registered()
        retried = zone.submit(gate_code(gate), max_retries=1, expected_seconds=5)
        single = zone.submit(gate_code(gate), resources=common_pb2.Resources(gpu_milli=0, gpus=0))
        first = zone.wait_state(retried.job_id, zone_pb2.JOB_RUNNING)
        zone.wait_state(single.job_id, zone_pb2.JOB_RUNNING)
        assert first.placements[0].agent_id == "doomed"
        doomed.process.send_signal(signal.SIGKILL)
        doomed.process.wait(10)
        cluster.start_agent(
            "spare", "H100-80GB", zone=zone.address, heartbeat_seconds=HEARTBEAT_SECONDS
        )

        def moved() -> bool:
            job = zone.get(retried.job_id)
            return job.attempts == 2 and job.state == zone_pb2.JOB_RUNNING

        wait_for(moved, timeout_seconds=30)
        job = zone.get(retried.job_id)
        lost = job.placements[0]
        assert lost.state == common_pb2.LOST and "agent doomed silent" in lost.reason
        assert job.placements[1].agent_id == "spare"
        failed = zone.wait_state(single.job_id, *TERMINAL)
        assert failed.state == zone_pb2.JOB_FAILED  # no retries declared
        assert "agent doomed silent" in failed.reason
        gate.touch()  # also ends the orphaned subjob left on the dead agent's host
        done = zone.wait_state(retried.job_id, zone_pb2.JOB_SUCCEEDED)
        assert done.retries_used == 1
        zone.channel.close()


def test_tenant_quota_refuses_oversized_and_holds_the_rest(tmp_path: Path) -> None:
    config = tmp_path / "zone.toml"
    config.write_text('[queue]\ntenant_quotas = "alice:gpus=1"\n')
    gate = tmp_path / "go"
    with LocalCluster(tmp_path) as cluster:
        zone = open_zone(cluster, tmp_path, extra_args=["--config", str(config)])
        cluster.start_agent(
            "h0", "4xH100-80GB", zone=zone.address, heartbeat_seconds=HEARTBEAT_SECONDS
        )
        cluster.wait_registered()
        with pytest.raises(grpc.RpcError) as err:
            zone.submit(tenant="alice", resources=common_pb2.Resources(gpus=2))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "quota" in (err.value.details() or "")
        first = zone.submit(gate_code(gate), tenant="alice")
        zone.wait_state(first.job_id, zone_pb2.JOB_RUNNING)
        second = zone.submit(tenant="alice")
        held = zone.wait_state(second.job_id, zone_pb2.WAITING)
        assert held.reason.startswith("waiting for quota: tenant alice runs 1 of 1 GPUs")
        other = zone.submit(tenant="bob")
        zone.wait_state(other.job_id, zone_pb2.JOB_SUCCEEDED)
        gate.touch()
        zone.wait_state(second.job_id, zone_pb2.JOB_SUCCEEDED)
        zone.channel.close()


def test_flow_splitting_forwards_at_most_once_and_jobs_run_in_the_peer(tmp_path: Path) -> None:
    with LocalCluster(tmp_path) as cluster:
        a = cluster.start_zone("a", heartbeat_seconds=HEARTBEAT_SECONDS)
        b = cluster.start_zone("b", peers=[a.address], heartbeat_seconds=HEARTBEAT_SECONDS)
        cluster.start_agent("ha", "H100-80GB", zone=a.address, heartbeat_seconds=HEARTBEAT_SECONDS)
        cluster.start_agent(
            "hb", "4xH100-80GB", zone=b.address, heartbeat_seconds=HEARTBEAT_SECONDS
        )
        cluster.wait_registered()
        with grpc.insecure_channel(a.address) as ca, grpc.insecure_channel(b.address) as cb:
            za, zb = zone_pb2_grpc.ZoneStub(ca), zone_pb2_grpc.ZoneStub(cb)
            spec = zone_pb2.JobSpec(
                command=[sys.executable, "-c", "pass"], resources=common_pb2.Resources(gpus=1)
            )
            jobs: list[zone_pb2.Job] = []

            def forwarded_one() -> bool:
                # Zone a learns zone b from b's first summary exchange; until then (and by
                # chance afterwards) jobs stay local. Zone b has 4 free GPUs against a's 1,
                # so with W = (1+S)/(1+H) most jobs go there once its summary is fresh.
                job = za.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)
                jobs.append(job)
                final = _settled(za, job.job_id)
                return final.state == zone_pb2.FORWARDED

            wait_for(forwarded_one, timeout_seconds=30)
            for job in jobs:
                got = _settled(za, job.job_id)
                if got.state != zone_pb2.FORWARDED:
                    assert got.state == zone_pb2.JOB_SUCCEEDED
                    continue
                zone_name, _, rest = got.forwarded_to.partition("@")
                assert zone_name == "b"
                remote_id = rest.rpartition("/")[2]
                remote = _settled(zb, remote_id)
                assert remote.state == zone_pb2.JOB_SUCCEEDED  # never forwarded again
                assert remote.zone == "b"


def _settled(stub: zone_pb2_grpc.ZoneStub, job_id: str) -> zone_pb2.Job:
    final = {*TERMINAL, zone_pb2.FORWARDED}
    got = stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), timeout=10)

    def done() -> bool:
        nonlocal got
        got = stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), timeout=10)
        return got.state in final

    wait_for(done)
    return got


def test_concurrent_submitters_never_overcommit_or_lose_a_job(tmp_path: Path) -> None:
    shapes = [
        common_pb2.Resources(gpus=1),
        common_pb2.Resources(gpus=2),
        common_pb2.Resources(mig_profile="1g.10gb"),
        common_pb2.Resources(mig_profile="3g.40gb"),
        common_pb2.Resources(gpu_milli=300, gpu_memory_bytes=10 * 1024**3),
    ]
    with LocalCluster(tmp_path) as cluster:
        zone = open_zone(cluster, tmp_path)
        agents = [
            cluster.start_agent(
                "w", "2xH100-80GB", zone=zone.address, heartbeat_seconds=HEARTBEAT_SECONDS
            ),
            cluster.start_agent(
                "m",
                "H100-80GB:mig=3g.40gb+1g.10gb+1g.10gb",
                zone=zone.address,
                heartbeat_seconds=HEARTBEAT_SECONDS,
            ),
            cluster.start_agent(
                "s", "A100-80GB:shared", zone=zone.address, heartbeat_seconds=HEARTBEAT_SECONDS
            ),
        ]
        cluster.wait_registered()
        submitted: list[str] = []
        lock = threading.Lock()
        violations: list[str] = []
        stop = threading.Event()

        def submitter(k: int) -> None:
            for i in range(8):
                job = zone.submit(
                    "import time; time.sleep(0.2)",
                    resources=shapes[(k + i) % len(shapes)],
                    request_id=f"s{k}-{i}",
                )
                with lock:
                    submitted.append(job.job_id)

        def auditor() -> None:
            channels = [grpc.insecure_channel(a.address) for a in agents]
            stubs = [agent_pb2_grpc.AgentStub(c) for c in channels]
            while not stop.is_set():
                for stub in stubs:
                    inv = stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10)
                    for s in inv.slices:
                        if s.committed_milli + s.leased_milli > s.capacity_milli:
                            violations.append(f"{inv.agent_id}/{s.slice_id} milli")
                        if s.committed_memory_bytes + s.leased_memory_bytes > s.memory_total_bytes:
                            violations.append(f"{inv.agent_id}/{s.slice_id} memory")
                stop.wait(0.02)
            for c in channels:
                c.close()

        audit = threading.Thread(target=auditor)
        audit.start()
        threads = [threading.Thread(target=submitter, args=(k,)) for k in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            for job_id in submitted:
                done = zone.wait_state(job_id, *TERMINAL, timeout_seconds=90)
                assert done.state == zone_pb2.JOB_SUCCEEDED, (job_id, done.reason)
        finally:
            stop.set()
            audit.join()
        assert len(set(submitted)) == 80
        assert not violations, violations[:5]
        listed = zone.stub.ListJobs(zone_pb2.ListJobsRequest(limit=1000), timeout=10).jobs
        assert {j.job_id for j in listed} == set(submitted)
        zone.channel.close()


def test_zone_rejects_bad_config_with_exit_2(tmp_path: Path) -> None:
    import subprocess

    bad = subprocess.run(
        [sys.executable, "-m", "laminar_zone", "--state-dir", str(tmp_path), "--listen", "nope"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ},
    )
    assert bad.returncode == 2
    assert "server.listen" in bad.stderr and "Traceback" not in bad.stderr
