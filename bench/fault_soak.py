"""Fault soak: hundreds of real jobs under a seeded random schedule of faults.

One router and a few agents on loopback (fake GPUs, real processes). Jobs log their own
life (start, ticks, end, with their subjob id) to one file each. While they run, a
seeded schedule SIGKILLs and restarts agents and the router, freezes agents
(SIGSTOP/SIGCONT, some past `membership.lost_after_seconds`), drains and undrains them,
and injects GPU-memory pressure. At the end it reports, from the jobs' own files and
the daemons' records:

- lost jobs: submitted but not ended within the deadline;
- overlapping copies: two copies of one job running at the same time;
- copies that ran to their end but are recorded otherwise;
- overcommit: a slice whose committed share exceeds its capacity, sampled all along;
- journal integrity: `PRAGMA integrity_check` of every SQLite journal afterwards.

Numbers are reported, never asserted. Not part of `make test`:

    .venv/bin/python bench/fault_soak.py --jobs 300 --seed 1 -o json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_bench.joblog import JOB, copies, overlapping
from laminar_cli.cluster import AgentProcess, LocalCluster

TERMINAL = {zone_pb2.JOB_SUCCEEDED, zone_pb2.JOB_FAILED, zone_pb2.JOB_CANCELLED}
HEARTBEAT_SECONDS = 0.2
LOST_AFTER_SECONDS = 4.0
GIB = 1024**3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Soak:
    def __init__(self, root: Path, args: argparse.Namespace) -> None:
        self.root = root
        self.args = args
        self.rng = random.Random(args.seed)
        self.port = free_port()
        env = {"LAMINAR_MEMBERSHIP_LOST_AFTER_SECONDS": f"{LOST_AFTER_SECONDS:g}"}
        self.cluster = LocalCluster(root / "cluster", env=env)
        self.faults: dict[str, int] = {}
        self.overcommit_samples = 0
        self.overcommits: list[str] = []
        self.frozen: dict[str, float] = {}
        self.lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_zone(self) -> None:
        self.cluster.start_zone("soak", listen=self.address, heartbeat_seconds=HEARTBEAT_SECONDS)

    def start_agent(self, name: str) -> AgentProcess:
        return self.cluster.start_agent(
            name, "2xH100-80GB", zone=self.address, heartbeat_seconds=HEARTBEAT_SECONDS
        )

    def live_agent(self, name: str) -> AgentProcess:
        return [a for a in self.cluster.agents if a.agent_id == name][-1]

    def fault(self, zone: zone_pb2_grpc.ZoneStub, names: list[str]) -> None:
        kind = self.rng.choice(
            ["kill_agent", "freeze", "freeze_long", "drain", "pressure", "kill_router"]
        )
        name = self.rng.choice(names)
        agent = self.live_agent(name)
        if name in self.frozen or not agent.is_running():
            return
        self.faults[kind] = self.faults.get(kind, 0) + 1
        try:
            if kind == "kill_agent":
                os.kill(agent.process.pid, signal.SIGKILL)
                agent.process.wait(10)
                self.start_agent(name)
            elif kind in ("freeze", "freeze_long"):
                seconds = (
                    self.rng.uniform(0.5, 2.0)
                    if kind == "freeze"
                    else self.rng.uniform(LOST_AFTER_SECONDS + 1, LOST_AFTER_SECONDS + 4)
                )
                os.kill(agent.process.pid, signal.SIGSTOP)
                self.frozen[name] = time.monotonic() + seconds
            elif kind == "drain":
                zone.DrainAgent(zone_pb2.DrainAgentRequest(agent=name, reason="soak"), timeout=5)
                time.sleep(self.rng.uniform(0.2, 1.0))
                zone.UndrainAgent(zone_pb2.DrainAgentRequest(agent=name), timeout=5)
            elif kind == "pressure":
                zone.InjectPressure(
                    zone_pb2.InjectPressureRequest(
                        agent=name,
                        load=agent_pb2.InjectLoadRequest(
                            gpu_index=self.rng.randrange(2),
                            used_bytes=self.rng.choice([60, 75, 79]) * GIB,
                            duration_seconds=self.rng.uniform(0.5, 3.0),
                        ),
                    ),
                    timeout=5,
                )
            elif kind == "kill_router":
                zone_proc = [z for z in self.cluster.zones if z.is_running()][-1]
                os.kill(zone_proc.process.pid, signal.SIGKILL)
                zone_proc.process.wait(10)
                self.start_zone()
        except grpc.RpcError as exc:
            self.faults[f"{kind}_refused_{exc.code().name}"] = (
                self.faults.get(f"{kind}_refused_{exc.code().name}", 0) + 1
            )

    def thaw_due(self) -> None:
        now = time.monotonic()
        for name, until in list(self.frozen.items()):
            if now >= until:
                os.kill(self.live_agent(name).process.pid, signal.SIGCONT)
                del self.frozen[name]

    def sample_overcommit(self, names: list[str]) -> None:
        for name in names:
            agent = self.live_agent(name)
            if name in self.frozen or not agent.is_running() or not agent.address:
                continue
            try:
                with grpc.insecure_channel(agent.address) as channel:
                    inv = agent_pb2_grpc.AgentStub(channel).GetInventory(
                        agent_pb2.GetInventoryRequest(), timeout=2
                    )
            except grpc.RpcError:
                continue
            self.overcommit_samples += 1
            for s in inv.slices:
                if s.committed_milli > s.capacity_milli:
                    self.overcommits.append(f"{name}/{s.slice_id}")

    def run(self) -> dict[str, object]:
        args = self.args
        outs = self.root / "out"
        outs.mkdir()
        self.start_zone()
        names = [f"soak-{i}" for i in range(args.agents)]
        for name in names:
            self.start_agent(name)
        self.cluster.wait_registered()
        channel = grpc.insecure_channel(self.address)
        zone = zone_pb2_grpc.ZoneStub(channel)
        jobs: dict[str, Path] = {}
        for i in range(args.jobs):
            out = outs / f"job-{i}.log"
            spec = zone_pb2.JobSpec(
                name=f"soak-{i}",
                command=[sys.executable, "-c", JOB, str(out), f"{self.rng.uniform(0.5, 4):.2f}"],
                resources=common_pb2.Resources(gpus=1),
                max_retries=8,
                grace_seconds=1.0,
            )
            job = zone.Submit(
                zone_pb2.SubmitRequest(spec=spec, client_request_id=f"soak-{i}"), timeout=30
            )
            jobs[job.job_id] = out
        t0 = time.monotonic()
        deadline = t0 + args.seconds
        next_fault = t0
        states: dict[str, int] = {}
        while time.monotonic() < deadline:
            self.thaw_due()
            now = time.monotonic()
            if now >= next_fault and now < t0 + args.fault_seconds:
                self.fault(zone, names)
                next_fault = now + self.rng.expovariate(1.0 / args.fault_every)
            self.sample_overcommit(names)
            try:
                states = {
                    j: zone.GetJob(zone_pb2.GetJobRequest(job_id=j), timeout=5).state for j in jobs
                }
            except grpc.RpcError:
                time.sleep(0.5)  # the router is restarting
                continue
            if all(s in TERMINAL for s in states.values()) and now > t0 + args.fault_seconds:
                break
            time.sleep(0.3)
        for name in list(self.frozen):
            os.kill(self.live_agent(name).process.pid, signal.SIGCONT)
        self.frozen.clear()
        time.sleep(2 * LOST_AFTER_SECONDS)  # late reports arrive
        records = {}
        for j in jobs:
            try:
                records[j] = zone.GetJob(zone_pb2.GetJobRequest(job_id=j), timeout=5)
            except grpc.RpcError:
                pass
        channel.close()
        misrecorded: list[str] = []  # "job subjob STATE reason", to diagnose each one
        for j, job in records.items():
            seen = copies(jobs[j])
            for p in job.placements:
                if seen.get(p.subjob_id, (0.0, 0.0, False))[2] and p.state != common_pb2.SUCCEEDED:
                    state = common_pb2.SubjobState.Name(p.state)
                    misrecorded.append(f"{j} {p.subjob_id} {state} {p.reason}")
        self.cluster.stop()
        integrity = {}
        for db in sorted(self.root.glob("cluster/*/*.db")):
            with sqlite3.connect(db) as conn:
                integrity[str(db.relative_to(self.root))] = conn.execute(
                    "PRAGMA integrity_check"
                ).fetchone()[0]
        final = [r.state for r in records.values()]
        return {
            "jobs": len(jobs),
            "agents": args.agents,
            "seed": args.seed,
            "faults": self.faults,
            "seconds": round(time.monotonic() - t0, 1),
            "succeeded": sum(1 for s in final if s == zone_pb2.JOB_SUCCEEDED),
            "failed": sum(1 for s in final if s == zone_pb2.JOB_FAILED),
            "lost_jobs": len(jobs) - sum(1 for s in final if s in TERMINAL),
            "jobs_with_overlapping_copies": sum(1 for p in jobs.values() if overlapping(p)),
            "copies_run_to_end_not_recorded_succeeded": len(misrecorded),
            "misrecorded_copies": misrecorded,
            "copies_run": sum(len(copies(p)) for p in jobs.values()),
            "overcommit_samples": self.overcommit_samples,
            "overcommitted_slices": sorted(set(self.overcommits)),
            "journal_integrity": integrity,
            "command": " ".join(sys.argv),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=300.0, help="overall deadline")
    parser.add_argument("--fault-seconds", type=float, default=60.0, help="faults only this long")
    parser.add_argument(
        "--fault-every", type=float, default=2.0, help="mean seconds between faults"
    )
    parser.add_argument("-o", "--output", choices=("json", "text"), default="text")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="laminar-soak-") as tmp:
        soak = Soak(Path(tmp), args)
        try:
            report = soak.run()
        finally:
            soak.cluster.kill()
    if args.output == "json":
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
