"""Place the FGD trace's pods through a real router and real agents, next to the simulator.

Issue 16's live check: the default pod list (or any list of the trace), tuned and shuffled
by the seed exactly as ``laminar sim fgd`` does, is placed one pod at a time through a
real ``laminar_zone`` router and one real agent per trace node (fake GPUs, shared by milli,
with the node's GPU count, host CPU and memory; agents hosted many per process by
``laminar_bench.agent_pool``). Placement only: each pod is placed with ``ProbeJob``
(``keep_leases``), the router's own placement path (ranked probing, late binding), and
keeps its lease for the run. The simulator then places the same pods, same seed, with the
same single zone (``laminar sim fgd``'s laminar policy, all hosts in one zone), and both
unallocated GPU shares are reported side by side. Numbers are reported, never asserted.

    .venv/bin/python bench/fgd_live.py [--pods 2000] [--seed 42] [--workload default]
        [--trace-dir DIR] [--workload-prior] [-o bench-out/fgd_live.json]

With ``--workload-prior`` the router starts from the pod list's mix: the bench writes it
as ``placement.workload_prior_file`` (``laminar sim fgd --write-prior``'s text) and the
simulator's routers start from the same prior (``laminar sim fgd --workload-prior``).

All pods must be placed within the lease TTL (60 s at most); the report says whether they
were (``within_ttl``). GPU models are not modelled (the pod lists ask for none): every
node's GPUs are fake ``T4-16GB`` shares.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402
import psutil  # noqa: E402

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc  # noqa: E402
from laminar_bench.agent_pool import MAX_POOL_AGENTS  # noqa: E402
from laminar_cli.cluster import LocalCluster  # noqa: E402
from laminar_sim import fgd, traces  # noqa: E402
from laminar_sim.policies import MILLI, MILLI_SLICING, PodShape  # noqa: E402

FAKE_MODEL = "T4-16GB"
LEASE_TTL_SECONDS = 60.0


def agent_keys(node: traces.NodeSpec) -> dict[str, object]:
    """One trace node as an agent's own config keys."""
    return {
        "inventory.fake_gpus": f"{node.num_gpu}x{FAKE_MODEL}:shared",
        "inventory.host_cpu_milli": node.cpu_milli,
        "inventory.host_memory_bytes": node.memory_mib << 20,
    }


def resources(pod: PodShape) -> common_pb2.Resources:
    """A pod as the router's API takes it (the same mapping as the simulator's)."""
    need = fgd.laminar_ask(pod).need
    return common_pb2.Resources(
        gpus=need.gpus,
        gpu_milli=need.gpu_milli,
        cpu_milli=need.cpu_milli,
        host_memory_bytes=need.host_memory_bytes,
    )


def start_pools(
    root: Path, zone: str, nodes: list[traces.NodeSpec], per_pool: int
) -> list[subprocess.Popen[bytes]]:
    procs = []
    for first in range(0, len(nodes), per_pool):
        part = nodes[first : first + per_pool]
        pool_dir = root / f"pool{first // per_pool}"
        pool_dir.mkdir(parents=True)
        per_agent = pool_dir / "agents.json"
        per_agent.write_text(json.dumps([agent_keys(n) for n in part]))
        argv = [sys.executable, "-m", "laminar_bench.agent_pool", "--count", str(len(part))]
        argv += ["--zone", zone, "--fake-gpus", f"1x{FAKE_MODEL}", "--state-dir", str(pool_dir)]
        argv += ["--prefix", f"n{first}-", "--per-agent", str(per_agent), "--no-metrics"]
        argv += ["--airlock-poll-seconds", "30", "--log-level", "WARNING"]
        with (root / f"pool{first // per_pool}.log").open("ab") as log:
            procs.append(
                subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
    return procs


async def wait_ready(address: str, count: int, procs: list[subprocess.Popen[bytes]]) -> float:
    started = time.monotonic()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = zone_pb2_grpc.ZoneStub(channel)
        while True:
            reply = await stub.ListAgents(zone_pb2.ListAgentsRequest(), timeout=30)
            ready = sum(1 for a in reply.agents if a.state == zone_pb2.AGENT_READY)
            if ready >= count:
                return time.monotonic() - started
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                raise SystemExit(f"an agent pool exited with {dead[0].returncode}")
            await asyncio.sleep(1.0)  # agents register on their own schedule


async def place_all(address: str, pods: list[PodShape], order: list[int]) -> dict[str, Any]:
    placed = failed = probes = bounces = 0
    allocated_milli = 0
    started = time.monotonic()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = zone_pb2_grpc.ZoneStub(channel)
        for n, index in enumerate(order):
            pod = pods[index]
            spec = zone_pb2.JobSpec(
                name=f"pod{n}", command=["true"], resources=resources(pod), tenant="fgd"
            )
            reply = await stub.ProbeJob(
                zone_pb2.ProbeJobRequest(
                    spec=spec, keep_leases=True, lease_ttl_seconds=LEASE_TTL_SECONDS
                ),
                timeout=30,
            )
            probes += len(reply.hosts)
            bounces += sum(1 for h in reply.hosts if not h.fits)
            if any(h.fits and h.HasField("lease") for h in reply.hosts):
                placed += 1
                allocated_milli += pod.total_gpu_milli
            else:
                failed += 1
    return {
        "placed": placed,
        "failed": failed,
        "allocated_gpu_milli": allocated_milli,
        "seconds": round(time.monotonic() - started, 2),
        # Router-agent messages: a probe is a request and a reply (with d = 1 a Submit's
        # probe carries the commit, so a placement costs the same; keep_leases commits none).
        "probes_per_pod": round(probes / max(1, len(order)), 3),
        "bounces_per_pod": round(bounces / max(1, len(order)), 3),
        "messages_per_pod": round(2 * probes / max(1, len(order)), 3),
    }


def simulate(
    nodes: list[traces.NodeSpec], pods: list[PodShape], seed: int, count: int, prior: bool
) -> dict[str, Any]:
    ctx = fgd.PolicyContext(
        "laminar",
        fgd.typical_workload(pods),
        MILLI_SLICING,
        zone_hosts=len(nodes),
        workload_prior=fgd.laminar_workload_prior(pods, MILLI_SLICING) if prior else None,
    )
    log = fgd.run_fill(nodes, pods, ctx, seed, limit=count)
    return {
        "placed": log.pods - log.failed_pods,
        "failed": log.failed_pods,
        "allocated_gpu_milli": int(log.allocated_milli[-1]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace-dir", type=Path, default=None, help="default: the bundled lists")
    p.add_argument("--workload", default="default")
    p.add_argument("--pods", type=int, default=2000, help="the first N arrivals (default 2000)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--workload-prior",
        action="store_true",
        help="the router (and the simulator's) start from the pod list's mix",
    )
    p.add_argument("--per-pool", type=int, default=MAX_POOL_AGENTS, help="agents per process")
    p.add_argument("-o", "--output", type=Path, help="write the JSON report here")
    args = p.parse_args(argv)
    trace_dir = args.trace_dir or traces.bundled_trace_dir()
    nodes = traces.read_nodes(traces.node_list_path(trace_dir))
    pods = [s.shape for s in traces.read_pods(traces.pod_list_path(trace_dir, args.workload))]
    capacity = sum(n.num_gpu for n in nodes) * MILLI
    order = fgd.fill_workload(pods, capacity, args.seed).origin.tolist()[: args.pods]
    arrived = sum(pods[i].total_gpu_milli for i in order)

    sim_started = time.perf_counter()
    sim = simulate(nodes, pods, args.seed, len(order), args.workload_prior)
    sim["seconds"] = round(time.perf_counter() - sim_started, 2)

    with tempfile.TemporaryDirectory(prefix="fgd-live-") as tmp, LocalCluster(Path(tmp)) as lc:
        lc.env["LAMINAR_LIMITS_PROBE_PER_SECOND"] = "0"  # the bench is the only tenant
        zone_env = {}
        if args.workload_prior:
            prior_file = Path(tmp) / "workload_prior.json"
            prior_file.write_text(fgd.workload_prior_text(pods, MILLI_SLICING))
            zone_env["LAMINAR_PLACEMENT_WORKLOAD_PRIOR_FILE"] = str(prior_file)
        router = lc.start_zone("fgd", heartbeat_seconds=5.0, env=zone_env)
        procs = start_pools(Path(tmp), router.address, nodes, args.per_pool)
        try:
            ready_seconds = asyncio.run(wait_ready(router.address, len(nodes), procs))
            cpu_before = psutil.Process(router.process.pid).cpu_times()
            live = asyncio.run(place_all(router.address, pods, order))
            cpu_after = psutil.Process(router.process.pid).cpu_times()
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    router_cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    live["router_cpu_ms_per_pod"] = round(1000 * router_cpu / max(1, len(order)), 3)
    live["within_ttl"] = live["seconds"] < LEASE_TTL_SECONDS

    def unallocated(figures: dict[str, Any]) -> float:
        return round(100.0 * (1.0 - float(figures["allocated_gpu_milli"]) / capacity), 3)

    report = {
        "benchmark": "fgd_live",
        "workload": args.workload,
        "seed": args.seed,
        "workload_prior": bool(args.workload_prior),
        "nodes": len(nodes),
        "cluster_gpus": capacity // MILLI,
        "pods": len(order),
        "arrived_pct": round(100.0 * arrived / capacity, 3),
        "agents_ready_seconds": round(ready_seconds, 1),
        "live": {**live, "unallocated_pct": unallocated(live)},
        "sim": {**sim, "unallocated_pct": unallocated(sim)},
        "cores": os.cpu_count(),
    }
    report["diff_points"] = round(
        report["live"]["unallocated_pct"] - report["sim"]["unallocated_pct"], 3
    )
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
