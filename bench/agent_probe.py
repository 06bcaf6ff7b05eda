"""Benchmark one agent on loopback: Probe round trip, sustained probes per second, idle cost.

Numbers are reported, never asserted. Round trips are reported next to a
baseline measured in the same run (a gRPC health check on the same channel),
because the machines are shared and noisy.

    .venv/bin/python bench/agent_probe.py [--probes 2000] [--concurrency 32] [-o json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from laminar_cli.cluster import LocalCluster


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(address: str, probes: int, concurrency: int) -> dict[str, float]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        request = agent_pb2.ProbeRequest(job_id="bench", resources=common_pb2.Resources(gpus=1))
        for _ in range(50):  # warm-up
            await stub.Probe(request)
        rtt, base = [], []
        for i in range(probes):
            t0 = time.perf_counter()
            reply = await stub.Probe(request)
            rtt.append(time.perf_counter() - t0)
            if reply.WhichOneof("outcome") == "lease":
                await stub.Release(agent_pb2.ReleaseRequest(lease_ids=[reply.lease.lease_id]))
            if i % 2 == 0:
                t0 = time.perf_counter()
                await health.Check(health_pb2.HealthCheckRequest())
                base.append(time.perf_counter() - t0)
        done = 0
        dry = agent_pb2.ProbeRequest(job_id="bench", resources=common_pb2.Resources(gpus=1))

        async def worker(deadline: float) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                reply = await stub.Probe(dry)
                if reply.WhichOneof("outcome") == "lease":
                    await stub.Release(agent_pb2.ReleaseRequest(lease_ids=[reply.lease.lease_id]))
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker(start + 5.0) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {
        "probe_rtt_p50_ms": pct(rtt, 0.5) * 1e3,
        "probe_rtt_p99_ms": pct(rtt, 0.99) * 1e3,
        "health_rtt_p50_ms": pct(base, 0.5) * 1e3,
        "probe_over_health_p50_ratio": statistics.median(rtt) / statistics.median(base),
        "probes_per_second": done / elapsed,
        "concurrency": concurrency,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--probes", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(Path(tmp)) as cluster:
        agent = cluster.start_agent("bench", "8xH100-80GB")
        proc = psutil.Process(agent.process.pid)
        proc.cpu_percent(None)
        time.sleep(5.0)  # an idle window to measure idle CPU, not synchronization
        idle = {
            "idle_cpu_percent": proc.cpu_percent(None),
            "idle_rss_mib": proc.memory_info().rss / 2**20,
        }
        result = asyncio.run(measure(agent.address, args.probes, args.concurrency))
    result.update(idle)
    result["environment"] = {  # type: ignore[assignment]
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "machine": platform.machine(),
    }
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:32} {value:.3f}" if isinstance(value, float) else f"{key:32} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
