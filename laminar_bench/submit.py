"""``laminar bench submit``: how fast a real router takes jobs into its durable queue,
and how long the ``laminar`` command takes to submit one.

One router on loopback with no agents, so every job is accepted, journaled and queued
(nothing runs). The same run measures ``Submit`` one job per call (the baseline) and
``SubmitBatch`` in batches of B, and reports jobs/s and the router's CPU per job
(psutil on the router process) for each, and their ratio. Then it runs ``laminar submit
-- true`` (a new process each time, as a script would) R times, alternating with the
interpreter's own start (``python -c pass``) and with the libraries' (the interpreter
importing gRPC and our messages), and reports the wall time and the CPU of each (median,
p90); with ``--instructions``, also the instructions of one run of each (valgrind), which
the machine's load does not move. A benchmark never fails on a number: it reports.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.errors import InvalidArgument
from laminar_bench.placement import BenchCluster, BenchSpec

#: Jobs one SubmitBatch may carry (the router's own limit).
MAX_BATCH = 10_000


@dataclass(frozen=True)
class SubmitBenchSpec:
    jobs: int = 10_000
    batch: int = 500
    #: Jobs sent one Submit call each, for the baseline.
    single: int = 500
    #: ``laminar submit`` processes run (each beside one interpreter start); 0: none.
    cli_runs: int = 20
    #: Also count the instructions of one run of each (valgrind; about 15 s).
    instructions: bool = False
    work_dir: Path | None = None

    def validate(self) -> None:
        if not 1 <= self.jobs <= 1_000_000:
            raise InvalidArgument(f"must be in 1..1000000, got {self.jobs}", field="--jobs")
        if not 1 <= self.batch <= MAX_BATCH:
            raise InvalidArgument(f"must be in 1..{MAX_BATCH}, got {self.batch}", field="--batch")
        if not 0 <= self.single <= 100_000:
            raise InvalidArgument(f"must be in 0..100000, got {self.single}", field="--single")
        if not 0 <= self.cli_runs <= 1000:
            raise InvalidArgument(f"must be in 0..1000, got {self.cli_runs}", field="--cli-runs")


def _spec(i: int) -> zone_pb2.JobSpec:
    return zone_pb2.JobSpec(
        name=f"bench-{i}", command=["true"], resources=common_pb2.Resources(gpus=1)
    )


def _measure(router: psutil.Process, jobs: int, send: Callable[[], None]) -> dict[str, float]:
    cpu0, wall0 = sum(router.cpu_times()[:2]), time.perf_counter()
    send()
    wall = time.perf_counter() - wall0
    cpu = sum(router.cpu_times()[:2]) - cpu0
    return {
        "jobs": jobs,
        "wall_seconds": round(wall, 3),
        "jobs_per_second": round(jobs / wall, 1) if wall > 0 else 0.0,
        "router_cpu_ms_per_job": round(1000 * cpu / jobs, 3) if jobs else 0.0,
    }


def _timed(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """Run one process to its end: (wall seconds, CPU seconds of it and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, cpu


def _figures(samples: list[tuple[float, float]]) -> dict[str, float]:
    walls = sorted(1000 * w for w, _ in samples)
    cpus = sorted(1000 * c for _, c in samples)
    p90 = walls[min(len(walls) - 1, int(0.9 * len(walls)))]
    return {
        "runs": len(samples),
        "wall_ms_median": round(statistics.median(walls), 1),
        "wall_ms_p90": round(p90, 1),
        "wall_ms_min": round(walls[0], 1),
        "cpu_ms_median": round(statistics.median(cpus), 1),
    }


#: What every ``laminar`` command pays before any of our code runs: the interpreter, then
#: gRPC and the generated messages (gRPC's C core imports asyncio; protobuf its pool).
LIBRARY_FLOOR = "import grpc; from laminar_api.v1 import zone_pb2, zone_pb2_grpc"
#: A run under valgrind is about 50x slower; one that takes longer than this is hung.
VALGRIND_TIMEOUT_SECONDS = 300.0


def _child_env(address: str) -> dict[str, str]:
    """The environment of the timed processes: the router's address, no resending, and
    Python's bytecode cache allowed (``PYTHONDONTWRITEBYTECODE`` would make every run
    compile our sources again, which no installed ``laminar`` does)."""
    env = {**os.environ, "LAMINAR_ZONE": address, "LAMINAR_RETRY_SECONDS": "0"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _instructions(argv: list[str], env: dict[str, str], cwd: str) -> int | None:
    """Instructions one run of ``argv`` executes, all threads (valgrind's callgrind), or
    None without valgrind or when the run under it failed. Unlike time, the count does not
    move with the machine's load."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    try:
        done = subprocess.run(
            [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
            env=env,
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            timeout=VALGRIND_TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        return None
    found = re.search(r"Collected\s*:\s*([0-9]+)", done.stderr)
    return int(found.group(1)) if done.returncode == 0 and found else None


def cli_submit_times(
    address: str, runs: int, cwd: str, *, instructions: bool = False
) -> dict[str, Any]:
    """``laminar submit -- true`` against the router at ``address``, ``runs`` times, each
    after one ``python -c pass`` (the interpreter's floor) and one import of gRPC and our
    messages (the libraries' floor), alternating so all three see the same machine. One
    untimed run of each first fills the bytecode caches. With ``instructions``, one more
    run of each under valgrind counts what it executes (None when valgrind is missing)."""
    script = Path(sys.executable).with_name("laminar")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "laminar_cli"]
    env = _child_env(address)
    argvs = {
        "python_floor": [sys.executable, "-c", "pass"],
        "library_floor": [sys.executable, "-c", LIBRARY_FLOOR],
        "submit": [*command, "submit", "--", "true"],
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in argvs}
    for argv in argvs.values():
        _timed(argv, env, cwd)  # warm: bytecode caches written, files in the page cache
    for _ in range(runs):
        for name, argv in argvs.items():
            samples[name].append(_timed(argv, env, cwd))
    figures = {name: _figures(found) for name, found in samples.items()}
    report: dict[str, Any] = {
        "command": " ".join(argvs["submit"]),
        **figures,
        "submit_over_floor": round(
            figures["submit"]["wall_ms_median"]
            / max(figures["python_floor"]["wall_ms_median"], 1e-9),
            2,
        ),
    }
    if instructions:
        counts = {name: _instructions(argv, env, cwd) for name, argv in argvs.items()}
        report["instructions"] = counts
        if counts["python_floor"] and counts["submit"]:
            report["instructions_submit_over_floor"] = round(
                counts["submit"] / counts["python_floor"], 2
            )
    return report


def run_submit_bench(spec: SubmitBenchSpec) -> dict[str, Any]:
    spec.validate()
    with tempfile.TemporaryDirectory(prefix="laminar-bench-submit-") as tmp:
        cluster = BenchCluster(spec.work_dir or Path(tmp), BenchSpec(agents=0, jobs=1))
        try:
            asyncio.run(cluster.start())  # the router alone: no agent to place on
            router = psutil.Process(cluster.router_pid)
            with grpc.insecure_channel(cluster.router_address) as channel:
                stub = zone_pb2_grpc.ZoneStub(channel)
                stub.Submit(zone_pb2.SubmitRequest(spec=_spec(-1)), timeout=30)  # warm up

                def singles() -> None:
                    for i in range(spec.single):
                        stub.Submit(zone_pb2.SubmitRequest(spec=_spec(i)), timeout=30)

                def batches() -> None:
                    for start in range(0, spec.jobs, spec.batch):
                        count = min(spec.batch, spec.jobs - start)
                        requests = [
                            zone_pb2.SubmitRequest(spec=_spec(start + i)) for i in range(count)
                        ]
                        stub.SubmitBatch(
                            zone_pb2.SubmitBatchRequest(requests=requests), timeout=120
                        )

                single = _measure(router, spec.single, singles)
                batch = _measure(router, spec.jobs, batches)
                queued = stub.ListJobs(
                    zone_pb2.ListJobsRequest(states=[zone_pb2.QUEUED], limit=1), timeout=30
                )
            cli = (
                cli_submit_times(
                    cluster.router_address, spec.cli_runs, tmp, instructions=spec.instructions
                )
                if spec.cli_runs
                else None
            )
        finally:
            cluster.stop()
    ratio = (
        round(batch["jobs_per_second"] / single["jobs_per_second"], 1)
        if single["jobs_per_second"]
        else None
    )
    return {
        "spec": {
            "jobs": spec.jobs,
            "batch": spec.batch,
            "single": spec.single,
            "cli_runs": spec.cli_runs,
            "instructions": spec.instructions,
        },
        "submit": single,
        "submit_batch": batch,
        "batch_over_single": ratio,
        "some_queued": bool(queued.jobs),
        "cli": cli,
        "cpus": psutil.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
