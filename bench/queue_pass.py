"""CPU of one router queue pass as the queue grows: R running jobs (declared run times) on
in-process agents, W waiting behind them, and the router's own ``ZoneState.one_pass``
timed (process CPU, the minimum of several passes). The agents are the router tests'
in-process agents (tests/zone/corekit.py: the agent's real ledger, no sockets), so the
figure is the router's decision work alone: order, backfill, explanations, estimates.
Numbers are reported, never asserted.

    .venv/bin/python bench/queue_pass.py --running 256 --waiting 2000 --passes 5 [-o json]

``--hosts`` sets the agents (default: as many as the running jobs fill) and ``--demands K``
gives the waiting jobs K distinct demands (GPU memory declared in whole GiB, 1..K), as a
re-run's queue has: the view's counts and free members are then asked per demand. The
default rows keep one demand; add a zone of 1,000 hosts with a varied queue with
``--running 256 --waiting 2000 --hosts 1000 --demands 64``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "zone")]

from corekit import FakeAgent  # noqa: E402
from test_zone_core_props import Harness  # noqa: E402

from laminar_api.v1 import common_pb2, zone_pb2  # noqa: E402

GPUS_PER_AGENT = 8


def _spec(gpu_memory_gib: int = 0) -> zone_pb2.JobSpec:
    return zone_pb2.JobSpec(
        command=["true"],
        resources=common_pb2.Resources(gpus=1, gpu_memory_bytes=gpu_memory_gib << 30),
        expected_seconds=600,
    )


async def measure(
    running: int, waiting: int, passes: int, hosts: int = 0, demands: int = 1
) -> dict[str, object]:
    hosts = hosts or -(-running // GPUS_PER_AGENT)
    with tempfile.TemporaryDirectory() as root:
        agents = [FakeAgent(f"a{i}", GPUS_PER_AGENT) for i in range(hosts)]
        harness = Harness(Path(root), agents=agents)
        try:
            await harness.flush()
            for _ in range(running):
                await harness.zone.submit(_spec(), "")
            await harness.call(harness.zone.queue_pass())
            await harness.flush()
            for i in range(waiting):
                await harness.zone.submit(_spec(i % demands + 1 if demands > 1 else 0), "")
            await harness.call(harness.zone.queue_pass())
            await harness.flush()
            times = []
            for _ in range(passes):
                start = time.process_time()
                await harness.zone.one_pass()
                times.append(time.process_time() - start)
            states = [e.job.state for e in harness.zone.entries.values()]
        finally:
            await harness.close()
    return {
        "hosts": hosts,
        "demands": demands,
        "running": states.count(zone_pb2.JOB_RUNNING),
        "queued": states.count(zone_pb2.QUEUED),
        "pass_cpu_ms_min": round(1000 * min(times), 2),
        "pass_cpu_ms_median": round(1000 * sorted(times)[len(times) // 2], 2),
        "per_queued_job_us": round(1e6 * min(times) / max(1, states.count(zone_pb2.QUEUED)), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--running", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--waiting", type=int, nargs="+", default=[500, 2000, 5000])
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument(
        "--hosts", type=int, default=0, help="agents (0: as many as the running jobs fill)"
    )
    parser.add_argument(
        "--demands", type=int, default=1, help="distinct demands among the waiting jobs"
    )
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = parser.parse_args()
    if len(args.running) != len(args.waiting):
        print("queue_pass: --running and --waiting need as many values", file=sys.stderr)
        return 2
    rows = [
        asyncio.run(measure(r, w, args.passes, args.hosts, args.demands))
        for r, w in zip(args.running, args.waiting, strict=True)
    ]
    report = {
        "rows": rows,
        "environment": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        },
    }
    if args.output == "json":
        print(json.dumps(report, indent=2))
    else:
        for row in rows:
            print(
                f"hosts {row['hosts']:>5}  demands {row['demands']:>3}  "
                f"running {row['running']:>5}  queued {row['queued']:>6}  one pass "
                f"{row['pass_cpu_ms_min']:>8} ms CPU (min of {args.passes}), "
                f"{row['per_queued_job_us']} us per queued job"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
