"""Commit on probe through a real router and agents: with d = 1 (the default
``placement.probes_per_attempt``) a one-member job starts in the probe that finds it room,
with no Commit call; a host that bounces it leaves nothing behind, and the job runs where
there is room or waits."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import gate_code
from zonekit import HEARTBEAT_SECONDS, Zone, open_zone

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_cli.cluster import AgentProcess, LocalCluster

D1 = {"LAMINAR_PLACEMENT_PROBES_PER_ATTEMPT": "1"}


@pytest.fixture
def zone(tmp_path: Path) -> Iterator[Zone]:
    with LocalCluster(tmp_path) as cluster:
        z = open_zone(cluster, tmp_path, env=D1)
        for name in ("one", "two"):
            cluster.start_agent(
                name, "H100-80GB", zone=z.address, heartbeat_seconds=HEARTBEAT_SECONDS
            )
        cluster.wait_registered()
        yield z
        z.channel.close()


def _rpc_counts(agent: AgentProcess) -> dict[str, float]:
    """Calls the agent served, by method (its ``laminar_agent_rpc_duration_seconds``)."""
    with urllib.request.urlopen(f"http://{agent.metrics_address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "laminar_agent_rpc_duration_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_count"):
                counts[sample.labels["method"]] = sample.value
    return counts


def test_a_job_starts_in_its_probe_and_no_commit_is_sent(zone: Zone) -> None:
    jobs = [zone.submit("print('ran')") for _ in range(3)]
    for job in jobs:
        done = zone.wait_state(job.job_id, zone_pb2.JOB_SUCCEEDED)
        (placement,) = done.placements
        assert placement.state == common_pb2.SUCCEEDED and placement.slice_ids == ["gpu0"]
    agents = zone.cluster.agents
    counts = [_rpc_counts(a) for a in agents]
    # Probes of a burst for one agent may travel as one ProbeBatch.
    assert sum(c.get("Probe", 0) + c.get("ProbeBatch", 0) for c in counts) >= 1, counts
    assert sum(c.get("Commit", 0) + c.get("Release", 0) for c in counts) == 0, counts


def test_with_d_2_the_same_jobs_take_a_probe_and_a_commit(tmp_path: Path) -> None:
    """The control: the metric above does count Commit calls where they are made."""
    with LocalCluster(tmp_path) as cluster:
        z = open_zone(cluster, tmp_path, env={"LAMINAR_PLACEMENT_PROBES_PER_ATTEMPT": "2"})
        cluster.start_agent("one", "H100-80GB", zone=z.address, heartbeat_seconds=HEARTBEAT_SECONDS)
        cluster.wait_registered()
        job = z.submit("print('ran')")
        z.wait_state(job.job_id, zone_pb2.JOB_SUCCEEDED)
        counts = _rpc_counts(cluster.agents[0])
        z.channel.close()
    probes = counts.get("Probe", 0) + counts.get("ProbeBatch", 0)  # on the call stream: batches
    assert probes >= 1 and counts.get("Commit", 0) == 1, counts


def test_a_busy_host_bounces_and_the_job_waits_then_runs(zone: Zone, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    first = [zone.submit(gate_code(gate)) for _ in range(2)]
    for job in first:
        zone.wait_state(job.job_id, zone_pb2.JOB_RUNNING)
    third = zone.submit("print('third')")
    waiting = zone.wait_state(third.job_id, zone_pb2.QUEUED)
    # Nothing of the bounced tries is left on the job: no placement until it runs.
    assert not waiting.placements
    gate.touch()
    done = zone.wait_state(third.job_id, zone_pb2.JOB_SUCCEEDED)
    assert [p.state for p in done.placements] == [common_pb2.SUCCEEDED]
    for job in first:
        zone.wait_state(job.job_id, zone_pb2.JOB_SUCCEEDED)
