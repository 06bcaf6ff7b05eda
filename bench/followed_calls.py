"""The router's CPU per followed job: SubmitAndWatch against Submit + WatchJob.

A real laminar-zone process with no agents, so nothing but the calls and the job's own
bookkeeping costs it CPU: each job is submitted and followed (one SubmitAndWatch, or a
Submit and then a WatchJob), cancelled, and its stream read to the terminal state.
Blocks of ``--jobs`` jobs (16 at a time on one channel) alternate the two ways in the same
router; its CPU (psutil) per job is printed per block. Numbers reported, never asserted.
A router that grows a queue or journal gets slower through the run, which the
alternation (each round starts with the other way) spreads over both.

    cd /tmp && PYTHONPATH=SNAPSHOT python SNAPSHOT/bench/followed_calls.py [--jobs 1500] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import psutil

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster

MODES = ("together", "separately")
WORKERS = 16


async def follow_one(stub: zone_pb2_grpc.ZoneAsyncStub, mode: str, request_id: str) -> int:
    """Submit, follow, cancel, read to the end; the stream messages received."""
    request = zone_pb2.SubmitRequest(
        spec=zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1)),
        client_request_id=request_id,
    )
    events: AsyncIterator[zone_pb2.JobEvent]
    if mode == "together":
        events = aiter(stub.SubmitAndWatch(request, timeout=60))
        job_id = (await anext(events)).job.job_id
    else:
        job_id = (await stub.Submit(request, timeout=60)).job_id
        events = aiter(stub.WatchJob(zone_pb2.WatchJobRequest(job_id=job_id), timeout=60))
        await anext(events)
    await stub.CancelJob(zone_pb2.CancelJobRequest(job_id=job_id, reason="bench"), timeout=60)
    received, state = 1, zone_pb2.JOB_STATE_UNSPECIFIED
    async for event in events:
        received, state = received + 1, event.job.state
    if state != zone_pb2.JOB_CANCELLED:
        raise RuntimeError(f"job {job_id}'s stream ended at {zone_pb2.JobState.Name(state)}")
    return received


async def run_block(
    stub: zone_pb2_grpc.ZoneAsyncStub, mode: str, tag: str, jobs: int, router: psutil.Process
) -> dict[str, float]:
    indices = iter(range(jobs))
    received: list[int] = []

    async def worker() -> None:
        for i in indices:  # the shared iterator hands each job to one worker
            received.append(await follow_one(stub, mode, f"{tag}-{i}"))

    cpu0 = sum(router.cpu_times()[:2])
    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(WORKERS)))
    seconds = time.monotonic() - t0
    return {
        "router_cpu_ms_per_job": 1000 * (sum(router.cpu_times()[:2]) - cpu0) / jobs,
        "jobs_per_second": jobs / seconds,
        "stream_messages_per_job": sum(received) / jobs,
    }


async def measure(address: str, pid: int, jobs: int, rounds: int) -> dict[str, list[float]]:
    router = psutil.Process(pid)
    out: dict[str, list[float]] = {mode: [] for mode in MODES}
    async with grpc.aio.insecure_channel(address) as channel:
        stub = zone_pb2_grpc.ZoneStub(channel)
        await run_block(stub, "separately", "warm", min(jobs, 300), router)
        for r in range(rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                block = await run_block(stub, mode, f"{mode}{r}", jobs, router)
                out[mode].append(block["router_cpu_ms_per_job"])
                print(f"round {r} {mode}: {json.dumps(block)}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1500, help="jobs per block (default 1500)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of both ways (default 5)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="followed-calls-"))
    with LocalCluster(root) as cluster:
        zone = cluster.start_zone("a")
        out = asyncio.run(measure(zone.address, zone.process.pid, args.jobs, args.rounds))
    for mode, values in out.items():
        print(
            f"{mode}: router CPU ms per job median {statistics.median(values):.3f} "
            f"[{min(values):.3f}-{max(values):.3f}]"
        )


if __name__ == "__main__":
    main()
