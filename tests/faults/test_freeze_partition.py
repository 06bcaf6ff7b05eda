"""Issue 20: freezes, partitions and kills never leave two copies of a job running at once.

Real router, real agents, real subjob processes. Every job appends ``<subjob> <time>
<event>`` lines to its own file while it runs (start, a tick every 50 ms, end), so the
checks read what the copies themselves did: no two copies overlap in time, every job
ends, and every copy that ran to its end is recorded so. The router declares an agent
lost after 4 s (its fence: 4 / 1.05 - 2 = 1.8 s), heartbeats every 0.2 s.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from waiting import wait_for

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_bench.joblog import JOB, copies, overlapping
from laminar_cli.cluster import AgentProcess, LocalCluster

LOST_AFTER_SECONDS = 4.0
HEARTBEAT_SECONDS = 0.2
TERMINAL = (zone_pb2.JOB_SUCCEEDED, zone_pb2.JOB_FAILED, zone_pb2.JOB_CANCELLED)


class Zone:
    """A router process and a stub to it."""

    def __init__(self, cluster: LocalCluster) -> None:
        process = cluster.start_zone("a", heartbeat_seconds=HEARTBEAT_SECONDS)
        self.address = process.address
        self.stub = zone_pb2_grpc.ZoneStub(grpc.insecure_channel(self.address))

    def get(self, job_id: str) -> zone_pb2.Job:
        return self.stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), timeout=10)

    def wait_state(self, job_id: str, *states: int, timeout_seconds: float = 30.0) -> zone_pb2.Job:
        wait_for(lambda: self.get(job_id).state in states, timeout_seconds=timeout_seconds)
        return self.get(job_id)


def assert_no_overlap(out: Path) -> dict[str, tuple[float, float, bool]]:
    pairs = overlapping(out)
    assert not pairs, f"copies ran at the same time: {pairs}"
    return copies(out)


class Proxy:
    """A TCP relay between an agent and its router that a test can cut (a partition)."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.is_cut = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.is_cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.is_cut.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def cut(self) -> None:
        self.is_cut.set()
        with self._lock:
            for s in self._conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._conns.clear()

    def heal(self) -> None:
        self.is_cut.clear()

    def close(self) -> None:
        self.cut()
        self.server.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    env = {"LAMINAR_MEMBERSHIP_LOST_AFTER_SECONDS": f"{LOST_AFTER_SECONDS:g}"}
    with LocalCluster(tmp_path, env=env) as c:
        yield c


def _agent(cluster: LocalCluster, name: str, zone_address: str) -> AgentProcess:
    return cluster.start_agent(
        name, "H100-80GB", zone=zone_address, heartbeat_seconds=HEARTBEAT_SECONDS
    )


def _agents(cluster: LocalCluster, zone: Zone) -> list[AgentProcess]:
    return [_agent(cluster, name, zone.address) for name in ("gpu-a", "gpu-b")]


def _submit(zone: Zone, out: Path, seconds: float, **fields: object) -> zone_pb2.Job:
    spec = zone_pb2.JobSpec(
        command=[sys.executable, "-c", JOB, str(out), str(seconds)],
        resources=common_pb2.Resources(gpus=1),
        max_retries=2,
        grace_seconds=1.0,
        **fields,  # type: ignore[arg-type]
    )
    return zone.stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)


def _holder(zone: Zone, job_id: str, agents: list[AgentProcess]) -> AgentProcess:
    job = zone.wait_state(job_id, zone_pb2.JOB_RUNNING)
    return next(a for a in agents if a.agent_id == job.placements[-1].agent_id)


def _started(out: Path) -> bool:
    return out.exists() and "start" in out.read_text()


def test_an_agent_frozen_past_lost_after_never_leaves_two_copies(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    zone = Zone(cluster)
    agents = _agents(cluster, zone)
    cluster.wait_registered()
    out = tmp_path / "frozen.log"
    job = _submit(zone, out, seconds=12)
    frozen = _holder(zone, job.job_id, agents)
    wait_for(lambda: _started(out))
    frozen.process.send_signal(signal.SIGSTOP)
    try:
        moved = zone.wait_state(job.job_id, zone_pb2.JOB_RUNNING, timeout_seconds=30)
        wait_for(lambda: zone.get(job.job_id).attempts == 2, timeout_seconds=30)
        moved = zone.wait_state(job.job_id, zone_pb2.JOB_RUNNING)
        assert moved.placements[0].state == common_pb2.LOST
        wait_for(lambda: len(copies(out)) == 2)  # the retry runs elsewhere...
    finally:
        frozen.process.send_signal(signal.SIGCONT)
    done = zone.wait_state(job.job_id, *TERMINAL, timeout_seconds=60)
    assert done.state == zone_pb2.JOB_SUCCEEDED, done.reason
    seen = assert_no_overlap(out)  # ...only after the fence had stopped the first copy
    first, retry = done.placements[0], done.placements[-1]
    assert not seen[first.subjob_id][2] and seen[retry.subjob_id][2]
    # The agent came back and reported how its copy really ended.
    wait_for(lambda: zone.get(job.job_id).placements[0].state == common_pb2.KILLED)
    assert "fenced:" in zone.get(job.job_id).placements[0].reason


def test_a_copy_that_finished_during_the_freeze_is_recorded_as_finished(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    zone = Zone(cluster)
    agents = _agents(cluster, zone)
    cluster.wait_registered()
    out = tmp_path / "quick.log"
    job = _submit(zone, out, seconds=1.0)
    frozen = _holder(zone, job.job_id, agents)
    wait_for(lambda: _started(out))
    frozen.process.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: all(c[2] for c in copies(out).values()))  # it ends while frozen
        wait_for(lambda: zone.get(job.job_id).attempts == 2, timeout_seconds=30)
    finally:
        frozen.process.send_signal(signal.SIGCONT)
    done = zone.wait_state(job.job_id, *TERMINAL, timeout_seconds=60)
    assert done.state == zone_pb2.JOB_SUCCEEDED
    seen = assert_no_overlap(out)

    def recorded() -> bool:
        job_now = zone.get(job.job_id)
        return all(
            p.state == common_pb2.SUCCEEDED
            for p in job_now.placements
            if seen.get(p.subjob_id, (0, 0, False))[2]
        )

    wait_for(recorded)  # every copy that ran to its end is recorded as succeeded
    first = zone.get(job.job_id).placements[0]
    assert first.state == common_pb2.SUCCEEDED and "declared lost" in first.reason


def test_a_partitioned_agent_stops_its_copy_before_the_router_retries(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    zone = Zone(cluster)
    proxy = Proxy(zone.address)
    try:
        cut_off = _agent(cluster, "gpu-a", proxy.address)  # reaches its router via the proxy
        cluster.wait_registered()
        out = tmp_path / "partition.log"
        job = _submit(zone, out, seconds=10)
        assert _holder(zone, job.job_id, [cut_off]) is cut_off
        _agent(cluster, "gpu-b", zone.address)  # where the retry will run
        cluster.wait_registered()
        wait_for(lambda: _started(out))
        proxy.cut()  # gpu-a and its subjob go on, but the router hears nothing
        wait_for(lambda: zone.get(job.job_id).attempts == 2, timeout_seconds=30)
        assert zone.get(job.job_id).placements[0].state == common_pb2.LOST
        done = zone.wait_state(job.job_id, *TERMINAL, timeout_seconds=60)
        assert done.state == zone_pb2.JOB_SUCCEEDED, done.reason
        assert done.placements[-1].agent_id == "gpu-b"
        proxy.heal()
        seen = assert_no_overlap(out)
        assert len(seen) == 2
        # Back in touch: the agent reports how its copy really ended.
        wait_for(lambda: zone.get(job.job_id).placements[0].state == common_pb2.KILLED)
        assert "fenced:" in zone.get(job.job_id).placements[0].reason
    finally:
        proxy.close()


def test_a_job_that_runs_through_partitions_is_not_fenced(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    zone = Zone(cluster)
    proxy = Proxy(zone.address)
    try:
        cut_off = _agent(cluster, "gpu-a", proxy.address)
        cluster.wait_registered()
        out = tmp_path / "through.log"
        job = _submit(zone, out, seconds=6, restartable=True, run_through_partitions=True)
        _holder(zone, job.job_id, [cut_off])
        wait_for(lambda: _started(out))
        proxy.cut()
        wait_for(
            lambda: zone.get(job.job_id).placements[0].state == common_pb2.LOST,
            timeout_seconds=30,
        )
        first = zone.get(job.job_id).placements[0].subjob_id
        wait_for(lambda: copies(out)[first][2], timeout_seconds=30)  # ran to its end: unfenced
        proxy.heal()
        done = zone.wait_state(job.job_id, *TERMINAL, timeout_seconds=60)
        assert done.state == zone_pb2.JOB_SUCCEEDED
        wait_for(lambda: zone.get(job.job_id).placements[0].state == common_pb2.SUCCEEDED)
    finally:
        proxy.close()


def test_an_agent_killed_mid_job_leaves_no_orphan_running_beside_the_retry(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    zone = Zone(cluster)
    agents = _agents(cluster, zone)
    cluster.wait_registered()
    out = tmp_path / "killed.log"
    job = _submit(zone, out, seconds=10)
    doomed = _holder(zone, job.job_id, agents)
    wait_for(lambda: _started(out))
    os.kill(doomed.process.pid, signal.SIGKILL)
    doomed.process.wait(10)
    done = zone.wait_state(job.job_id, *TERMINAL, timeout_seconds=60)
    assert done.state == zone_pb2.JOB_SUCCEEDED
    seen = assert_no_overlap(out)
    assert not seen[done.placements[0].subjob_id][2]  # the orphan was fenced, not finished


def test_an_agent_back_from_a_partition_stops_the_copy_the_router_replaced(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Reconciliation: an unfenced copy still runs when its agent returns; the retry runs
    elsewhere; the router lists the agent's live subjobs and stops the superseded one."""
    zone = Zone(cluster)
    proxy = Proxy(zone.address)
    try:
        cut_off = _agent(cluster, "gpu-a", proxy.address)
        cluster.wait_registered()
        out = tmp_path / "reconcile.log"
        job = _submit(zone, out, seconds=60, restartable=True, run_through_partitions=True)
        _holder(zone, job.job_id, [cut_off])
        _agent(cluster, "gpu-b", zone.address)
        cluster.wait_registered()
        wait_for(lambda: _started(out))
        proxy.cut()
        wait_for(lambda: zone.get(job.job_id).attempts == 2, timeout_seconds=30)
        retry = zone.wait_state(job.job_id, zone_pb2.JOB_RUNNING).placements[-1]
        assert retry.agent_id == "gpu-b"
        first = zone.get(job.job_id).placements[0].subjob_id
        proxy.heal()
        wait_for(lambda: zone.get(job.job_id).placements[0].state == common_pb2.KILLED)
        stopped = zone.get(job.job_id).placements[0]
        assert "superseded" in stopped.reason, stopped.reason
        assert stopped.end_cause == common_pb2.END_CAUSE_SUPERSEDED, stopped.end_cause
        assert not copies(out)[first][2]  # stopped, not run to its end
        assert "reconciling agent gpu-a" in (cluster.zones[0].log_path.read_text())
        zone.stub.CancelJob(zone_pb2.CancelJobRequest(job_id=job.job_id), timeout=10)
    finally:
        proxy.close()


def test_a_router_killed_mid_job_and_restarted_leaves_one_copy_at_a_time(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """The router dies (SIGKILL) while a job runs and comes back on the same address and
    journal. Whether the fence stopped the copy meanwhile or it ran on, the job ends
    once, no two copies overlap, and each copy's record matches what it did."""
    zone = Zone(cluster)
    agents = _agents(cluster, zone)
    cluster.wait_registered()
    out = tmp_path / "router-killed.log"
    job = _submit(zone, out, seconds=6)
    _holder(zone, job.job_id, agents)
    wait_for(lambda: _started(out))
    router = cluster.zones[0]
    router.process.send_signal(signal.SIGKILL)
    router.process.wait(10)
    again = cluster.start_zone("a", listen=zone.address, heartbeat_seconds=HEARTBEAT_SECONDS)
    assert again.address == zone.address
    done = zone.wait_state(job.job_id, *TERMINAL, timeout_seconds=60)
    assert done.state == zone_pb2.JOB_SUCCEEDED
    seen = assert_no_overlap(out)
    for placement in done.placements:
        ran_to_end = seen.get(placement.subjob_id, (0.0, 0.0, False))[2]
        recorded = placement.state == common_pb2.SUCCEEDED
        assert ran_to_end == recorded, (placement.subjob_id, placement.state, placement.reason)
