"""`laminar demo`: a local cluster runs a small mixed workload through a zone router.

Three agents on simulated GPUs (one H100 split by MIG plus two whole H100s,
two A100s, one shared A100) behind one router. The workload has rigid
whole-GPU jobs, MIG-sized jobs, two fractional shares of one GPU, a
two-member gang of whole GPUs, an atomized job run as checkpointed pieces sized
to the windows agents advertise, and a job that must queue: it is submitted
once the two-GPU job and the gang run, when no host has two whole GPUs free,
and runs when one of them finishes. Progress is printed as state
changes; the end is a table of what ran where, how long it waited and ran.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli import render
from laminar_cli.cluster import LocalCluster
from laminar_cli.jobspec import describe_resources
from laminar_cli.up import DEFAULT_FAKE_GPUS, launch
from laminar_cli.zoneclient import RPC_TIMEOUT_SECONDS, current_trust, zone_stub

#: Give up on the workload after this long (it normally takes well under 15 s).
DEMO_DEADLINE_SECONDS = 60.0
POLL_SECONDS = 0.2


@dataclass(frozen=True)
class DemoJob:
    name: str
    resources: common_pb2.Resources
    seconds: float
    gang: int = 1
    priority: int = common_pb2.BATCH


WAVE_ONE = (
    DemoJob("train-a", common_pb2.Resources(gpus=2), 3.0, priority=common_pb2.PRODUCTION),
    DemoJob("gang-pair", common_pb2.Resources(gpus=1), 2.5, gang=2),
    DemoJob("eval-mig", common_pb2.Resources(mig_profile="3g.40gb"), 2.0),
    DemoJob("notebook-mig", common_pb2.Resources(mig_profile="1g.10gb"), 1.5),
    DemoJob(
        "share-half",
        common_pb2.Resources(gpu_milli=500, gpu_memory_bytes=20 * 1024**3),
        2.0,
        priority=common_pb2.OPPORTUNISTIC,
    ),
    DemoJob(
        "share-quarter", common_pb2.Resources(gpu_milli=250, gpu_memory_bytes=10 * 1024**3), 1.5
    ),
)
#: Submitted once train-a and gang-pair run: then no host has two whole GPUs free (host-0 and
#: host-1 have two each, the shared A100 counts as one), so it has to queue until one ends.
LATE_JOB = DemoJob("finetune-late", common_pb2.Resources(gpus=2), 1.5)


#: An atomized job: 12 units of 0.2 s, at most 4 a piece, checkpointing after each unit.
ATOMIZED_UNITS = 12
ATOMIZED_CODE = (
    "import os, time\n"
    "start, count = int(os.environ['LAMINAR_UNIT_START']), int(os.environ['LAMINAR_UNIT_COUNT'])\n"
    "progress = os.environ['LAMINAR_PROGRESS_FILE']\n"
    "for unit in range(start, start + count):\n"
    "    time.sleep(0.2)\n"
    "    with open(progress + '.tmp', 'w') as f: f.write(str(unit + 1))\n"
    "    os.replace(progress + '.tmp', progress)\n"
    "print('units', start, 'to', start + count - 1, 'on', os.environ['CUDA_VISIBLE_DEVICES'])\n"
)


def _submit_atomized(stub: zone_pb2_grpc.ZoneStub) -> zone_pb2.Job:
    gib = 1024**3
    spec = zone_pb2.JobSpec(
        name="sweep-atomized",
        command=[sys.executable, "-c", ATOMIZED_CODE],
        priority=common_pb2.OPPORTUNISTIC,
        lifecycle=common_pb2.TRANSIENT,
        tenant="demo",
        atomization=common_pb2.AtomizationContract(
            total_units=ATOMIZED_UNITS,
            seconds_per_unit=[
                common_pb2.Quantile(q=0.5, value=0.2),
                common_pb2.Quantile(q=0.95, value=0.3),
            ],
            peak_memory_bytes=[common_pb2.Quantile(q=0.95, value=8 * gib)],
            max_units=4,
        ),
    )
    return stub.Submit(
        zone_pb2.SubmitRequest(spec=spec, client_request_id="demo-sweep-atomized"),
        timeout=RPC_TIMEOUT_SECONDS,
    )


def demo_command(name: str, seconds: float) -> list[str]:
    code = (
        "import os, time; "
        f"time.sleep({seconds}); "
        f"print('{name} ran on', os.environ.get('CUDA_VISIBLE_DEVICES', 'cpu'))"
    )
    return [sys.executable, "-c", code]


def _submit(stub: zone_pb2_grpc.ZoneStub, job: DemoJob) -> zone_pb2.Job:
    spec = zone_pb2.JobSpec(
        name=job.name,
        command=demo_command(job.name, job.seconds),
        resources=job.resources,
        priority=job.priority,  # type: ignore[arg-type]
        lifecycle=common_pb2.TRANSIENT,
        tenant="demo",
        gang_size=job.gang,
        expected_seconds=job.seconds,
    )
    return stub.Submit(
        zone_pb2.SubmitRequest(spec=spec, client_request_id=f"demo-{job.name}"),
        timeout=RPC_TIMEOUT_SECONDS,
    )


class Progress:
    """Prints one line per job state change, with the router's reason."""

    def __init__(self, console: Console, stub: zone_pb2_grpc.ZoneStub) -> None:
        self.console = console
        self.stub = stub
        self.jobs: dict[str, zone_pb2.Job] = {}
        self.started = time.monotonic()

    def track(self, job: zone_pb2.Job) -> None:
        self._show(job)

    def _show(self, job: zone_pb2.Job) -> None:
        before = self.jobs.get(job.job_id)
        self.jobs[job.job_id] = job
        if before is not None and before.state == job.state:
            return
        state = render.job_state_name(job.state)
        line = f"{time.monotonic() - self.started:5.1f} s  {job.spec.name:<14} {state}"
        if job.state == zone_pb2.JOB_RUNNING:
            line += f" on {render.where(job)}"
        elif job.reason:
            line += f": {job.reason}"
        self.console.print(line, highlight=False)

    def poll(self) -> None:
        for job_id in list(self.jobs):
            self._show(
                self.stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), timeout=RPC_TIMEOUT_SECONDS)
            )

    def all_done(self) -> bool:
        return all(job.state in render.TERMINAL_JOB_STATES for job in self.jobs.values())

    def wait(self, predicate: Callable[[], bool], deadline: float) -> bool:
        while time.monotonic() < deadline:
            self.poll()
            if predicate():
                return True
            time.sleep(POLL_SECONDS)
        return False


def _first_output_line(stub: zone_pb2_grpc.ZoneStub, job: zone_pb2.Job) -> str:
    try:
        reply = stub.GetLogs(
            zone_pb2.GetLogsRequest(job_id=job.job_id), timeout=RPC_TIMEOUT_SECONDS
        )
    except grpc.RpcError as exc:
        return f"(no output: {exc.details()})"
    text = reply.data.decode(errors="replace").strip()
    return text.splitlines()[0] if text else ""


def summary_table(stub: zone_pb2_grpc.ZoneStub, jobs: list[zone_pb2.Job], now: float) -> Table:
    table = Table(title="what ran where", title_justify="left")
    for column in ("job", "resources", "state", "agent: slices", "waited", "ran", "output"):
        table.add_column(column, no_wrap=column in ("job", "state"))
    for job in sorted(jobs, key=lambda j: j.submitted_unix):
        resources = describe_resources(job.spec.resources)
        if job.spec.atomization.total_units:
            resources = (
                f"atomized: {job.atomization.units_done}/{job.spec.atomization.total_units} "
                f"units in {len(job.placements)} pieces"
            )
        if job.spec.gang_size > 1:
            resources = f"{job.spec.gang_size} x ({resources})"
        table.add_row(
            job.spec.name,
            resources,
            render.state_text(job.state),
            render.where(job).replace(" ", "\n") or "-",
            render.span(render.waited_seconds(job, now)),
            render.span(render.ran_seconds(job, now)),
            _first_output_line(stub, job),
        )
    return table


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """Start a router and agents, run the workload through the router, stop everything."""
    with tempfile.TemporaryDirectory(prefix="laminar-demo-", ignore_cleanup_errors=True) as tmp:
        root = Path(args.state_dir) if args.state_dir else Path(tmp)
        # Daemons inherit the environment, so they get any LAMINAR_TLS_* the CLI has too.
        cluster = LocalCluster(
            root, env=dict(getattr(args, "security_env", {})), trust=current_trust()
        )
        try:
            launch(cluster, agents=3, fake_gpus=DEFAULT_FAKE_GPUS, listen="127.0.0.1:0")
            zone = cluster.zones[0]
            console.print(f"zone router {zone.name} on {zone.address}", highlight=False)
            for agent in cluster.agents:
                console.print(
                    f"agent {agent.agent_id} on {agent.address}: {agent.fake_gpus}", highlight=False
                )
            ok = _run_workload(console, zone.address)
        finally:
            codes = cluster.stop()
        if any(code != 0 for code in codes):
            console.print(f"daemons exited with {codes}", style="red")
            return 1
        console.print(
            f"all {len(codes)} daemons stopped cleanly; nothing is left running", highlight=False
        )
    return 0 if ok else 1


def _run_workload(console: Console, address: str) -> bool:
    deadline = time.monotonic() + DEMO_DEADLINE_SECONDS
    with zone_stub(address) as stub:
        progress = Progress(console, stub)
        submitted = {job.name: _submit(stub, job) for job in WAVE_ONE}
        submitted["sweep-atomized"] = _submit_atomized(stub)
        for job in submitted.values():
            progress.track(job)
        big = [submitted["train-a"].job_id, submitted["gang-pair"].job_id]

        def big_running() -> bool:
            return all(progress.jobs[j].state == zone_pb2.JOB_RUNNING for j in big)

        if progress.wait(big_running, deadline):
            console.print(
                "no host has two whole GPUs free now; the next job has to queue", highlight=False
            )
        progress.track(_submit(stub, LATE_JOB))
        if not progress.wait(progress.all_done, deadline):
            console.print("the workload did not finish in time; cancelling the rest", style="red")
            for job in progress.jobs.values():
                if job.state not in render.TERMINAL_JOB_STATES:
                    stub.CancelJob(
                        zone_pb2.CancelJobRequest(job_id=job.job_id, reason="demo deadline"),
                        timeout=RPC_TIMEOUT_SECONDS,
                    )
        jobs = list(progress.jobs.values())
        console.print(summary_table(stub, jobs, time.time()))
    return all(job.state == zone_pb2.JOB_SUCCEEDED for job in jobs)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    demo = sub.add_parser(
        "demo", help="run a mixed workload through a router on a local simulated cluster"
    )
    demo.add_argument("--state-dir", help="keep state here instead of a temporary folder")
    demo.set_defaults(func=cmd_demo)
