"""Burst of real jobs through a real router and N agent processes on loopback (launch mode).

Each job shares a GPU (100 milli) and runs `true`, so every placement really
starts a process through the agent's shim. Reports placements per second
(first submit to last subjob start), submit-to-running latency p50/p99 (the
subjob's start time on the agent minus the client's submit time, same host
clock), probes per placement and router CPU per placement. Numbers are
reported, never asserted.

    .venv/bin/python bench/zone_burst.py --agents 4 --jobs 200
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--submitters", type=int, default=32)
    args = parser.parse_args()
    print(
        f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"grpcio {grpc.__version__}"
    )
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(Path(tmp)) as cluster:
        zone = cluster.start_zone("a")
        for i in range(args.agents):
            cluster.start_agent(f"h{i}", "8xH100-80GB:shared", zone=zone.address)
        cluster.wait_registered(300)
        channel = grpc.insecure_channel(zone.address)
        stub = zone_pb2_grpc.ZoneStub(channel)
        router = psutil.Process(cluster.zones[0].process.pid)
        cpu_before = sum(router.cpu_times()[:2])
        spec = zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpu_milli=100))

        def submit(_: int) -> tuple[str, float]:
            at = time.time()
            return stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=60).job_id, at

        start = time.time()
        with cf.ThreadPoolExecutor(args.submitters) as pool:
            submitted = list(pool.map(submit, range(args.jobs)))
        latencies, probes, ends = [], [], []
        for job_id, at in submitted:
            while True:
                job = stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), timeout=10)
                started = [p.started_unix for p in job.placements if p.started_unix]
                if started:
                    break
                time.sleep(0.02)  # polling the router for the result, not synchronizing a test
            latencies.append(started[0] - at)
            ends.append(started[0])
            probes.append(job.probes)
        cpu = sum(router.cpu_times()[:2]) - cpu_before
        channel.close()
    latencies.sort()
    p99 = latencies[max(0, int(len(latencies) * 0.99) - 1)]
    print(
        f"agents={args.agents} jobs={args.jobs} "
        f"placements_per_second={args.jobs / (max(ends) - start):.1f} "
        f"latency_p50_ms={1000 * statistics.median(latencies):.0f} latency_p99_ms={1000 * p99:.0f} "
        f"probes_per_placement={statistics.mean(probes):.2f} "
        f"router_cpu_ms_per_placement={1000 * cpu / args.jobs:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
