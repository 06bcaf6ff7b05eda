"""Same rules for everyone (issue 17): an atomized job is forwarded to a peer zone by flow
splitting as a rigid job is, exactly once, and runs there in the peer's market. Two real
routers, real agents, the example worker that checkpoints."""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
from test_zone_atomize import WORKER, _contract
from test_zone_failures import _settled
from waiting import wait_for
from zonekit import HEARTBEAT_SECONDS

from laminar_api.v1 import zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster


def test_an_atomized_job_is_forwarded_by_flow_splitting_and_runs_in_the_peer(
    tmp_path: Path,
) -> None:
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
            jobs: list[zone_pb2.Job] = []

            def forwarded_one() -> bool:
                # Zone a learns zone b from b's first summary exchange; until then (and by
                # chance afterwards) jobs stay local and wait for a's windows. Zone b has 4
                # free GPUs against a's 1, so most jobs go there once its summary is fresh.
                checkpoint = tmp_path / f"ckpt-{len(jobs)}"
                spec = zone_pb2.JobSpec(
                    command=[sys.executable, str(WORKER), "0.05"],
                    atomization=_contract(4, 4, checkpoint),
                )
                job = za.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)
                jobs.append(job)
                final = _settled(za, job.job_id)
                return final.state == zone_pb2.FORWARDED

            wait_for(forwarded_one, timeout_seconds=60)
            forwarded = 0
            for job in jobs:
                got = _settled(za, job.job_id)
                if got.state != zone_pb2.FORWARDED:
                    assert got.state == zone_pb2.JOB_SUCCEEDED, got.reason  # ran in a's market
                    assert got.placements and all(p.agent_id == "ha" for p in got.placements)
                    continue
                forwarded += 1
                zone_name, _, rest = got.forwarded_to.partition("@")
                assert zone_name == "b"
                assert not got.placements  # nothing of it ran in zone a
                remote = _settled(zb, rest.rpartition("/")[2])
                assert remote.state == zone_pb2.JOB_SUCCEEDED, remote.reason  # not forwarded on
                assert remote.zone == "b" and remote.spec.HasField("atomization")
                assert remote.placements and all(p.agent_id == "hb" for p in remote.placements)
                assert sum(p.units_done for p in remote.placements) >= 4
            assert forwarded == 1  # the loop stopped at the first forward
