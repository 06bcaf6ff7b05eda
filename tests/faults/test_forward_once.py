"""Issue 20: forwarding across zones is exactly once, whatever the network does.

Router a has no agents and one peer, b, with a GPU host. b is frozen (SIGSTOP) just
after a has its fresh summary, so a's ForwardJob calls time out: an ambiguous failure
(b may have journaled the job). a must neither place the job itself nor create a second
one at b: it resends with the same idempotency key until b answers.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import grpc
from waiting import wait_for

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster


def test_a_forward_that_times_out_is_resent_and_lands_once(tmp_path: Path) -> None:
    # Zone b's last summary must still count while b is stopped (its weight is what sends
    # the jobs there): on a loaded machine the default 1.5 s of freshness can pass before
    # the submissions, and a would keep them.
    env = {
        "LAMINAR_PLACEMENT_RPC_TIMEOUT_SECONDS": "0.5",
        "LAMINAR_PEERS_STALE_AFTER_PERIODS": "60",
    }
    with LocalCluster(tmp_path, env=env) as cluster:
        b = cluster.start_zone("b", heartbeat_seconds=0.2)
        a = cluster.start_zone("a", peers=[b.address], heartbeat_seconds=0.2)
        cluster.start_agent("hb", "4xH100-80GB", zone=b.address, heartbeat_seconds=0.2)
        cluster.wait_registered()
        spec = zone_pb2.JobSpec(
            command=[sys.executable, "-c", "pass"], resources=common_pb2.Resources(gpus=1)
        )
        with grpc.insecure_channel(a.address) as ca, grpc.insecure_channel(b.address) as cb:
            za, zb = zone_pb2_grpc.ZoneStub(ca), zone_pb2_grpc.ZoneStub(cb)

            def forwarded_once() -> bool:  # a has b's summary: jobs go there
                job = za.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)
                got = za.GetJob(zone_pb2.GetJobRequest(job_id=job.job_id), timeout=10)
                return got.state == zone_pb2.FORWARDED

            wait_for(forwarded_once)
            before = len(zb.ListJobs(zone_pb2.ListJobsRequest(), timeout=10).jobs)
            b.process.send_signal(signal.SIGSTOP)
            try:
                sent = [
                    za.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10).job_id
                    for _ in range(6)
                ]

                def unconfirmed() -> bool:
                    return "unconfirmed" in a.log_path.read_text()

                wait_for(unconfirmed)  # at least one forward timed out and is being resent
            finally:
                b.process.send_signal(signal.SIGCONT)

            def settled() -> bool:
                states = [
                    za.GetJob(zone_pb2.GetJobRequest(job_id=j), timeout=10).state for j in sent
                ]
                return all(s != zone_pb2.PENDING for s in states)

            wait_for(settled)
            jobs_a = [za.GetJob(zone_pb2.GetJobRequest(job_id=j), timeout=10) for j in sent]
            at_b = zb.ListJobs(zone_pb2.ListJobsRequest(), timeout=10).jobs
            keys = [j.client_request_id for j in at_b if j.client_request_id.startswith("fwd:")]
            assert len(keys) == len(set(keys)), keys  # never two jobs for one forward
            forwarded = [j for j in jobs_a if j.state == zone_pb2.FORWARDED]
            assert forwarded, [j.reason for j in jobs_a]
            assert len(at_b) == before + len(forwarded)
            for job in forwarded:
                remote_id = job.forwarded_to.rpartition("/")[2]
                assert any(j.job_id == remote_id for j in at_b)
                assert not job.placements  # a never placed a forwarded job itself
