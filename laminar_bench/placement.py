"""``laminar bench placement``: the placement hot path of a real router and real agents.

A zone router process and N agents on loopback (fake GPUs; one process per
agent up to 8 agents, pools of up to 32 agents per process above that, see
:mod:`laminar_bench.agent_pool`). Once the router lists all N agents as
ready, M jobs arrive either as a burst (C concurrent submitters, each sending
its next job as soon as the previous reply came back) or open-loop (Poisson
arrivals at R jobs per second, never waiting for replies).

Two modes:

- ``placement`` (default) measures the decision path without starting any
  process: each job is a two-phase ``ProbeJob(keep_leases=True)``. The router
  samples candidates, probes d agents in parallel, keeps the best lease and
  releases the others, exactly as for a submitted job; the benchmark then
  gives the kept lease back with the agent's ``Release``. Latency is the
  client's round trip of that ``ProbeJob`` (submit to lease in hand). The calls go over
  ``ProbeJobs`` streams by default (``--probe-calls stream``: each job one message pair on
  a long-lived stream, ``--probe-streams`` of them), or as unary calls
  (``--probe-calls unary``); a router without ``ProbeJobs`` gets unary calls and the
  report says so.
- ``launch`` submits real jobs (``true`` on a GPU share) through ``Submit``;
  every placement ends with a Commit that starts a process through the
  agent's shim. Latency is submit to running: the subjob's ``started_unix``
  (stamped by the agent right after the process was spawned) minus the
  client's clock just before it sent ``Submit`` (same host, same clock). The
  time at which the client saw the job running through ``WatchJob`` is
  reported beside it.

Everything is reported next to a baseline taken in the same invocation (the
p50 round trip of a gRPC health check to the router), because the benchmark
machines are shared and noisy. Numbers are reported, never judged: the
benchmark fails only when the cluster cannot be started.

Not covered: several zones, gangs, MIG shapes, queueing behaviour under
overload (jobs that queue are counted and reported, not studied).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from laminar_agent.executor import local_run_as_env
from laminar_agent.inventory.fake import parse_fake_spec
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.callstream import CallClient
from laminar_base.causes import FINISHED_JOB_STATES
from laminar_base.errors import InvalidArgument, Unavailable
from laminar_base.grpcutil import channel_options, rpc_error
from laminar_bench.agent_pool import POOL_INFO

#: Above this many agents, agents share processes (pools); at or below, one process each.
MAX_SINGLE_PROCESS_AGENTS = 8
DEFAULT_AGENTS_PER_POOL = 32
DEFAULT_FAKE_GPUS = "8xH100-80GB:shared"
DEFAULT_GPU_MILLI = 100
#: Airlock's poll period in the benchmark's agents (its default is 0.1 s). Fake GPUs see no
#: memory pressure here, and 256 co-located agents polling every 0.1 s would take about one of
#: the two cores of the benchmark machine away from the router being measured.
DEFAULT_AGENT_POLL_SECONDS = 1.0
HEALTH_SAMPLES = 200
IDLE_WINDOW_SECONDS = 1.0
TERMINAL_JOB_STATES = FINISHED_JOB_STATES
_POLL_SECONDS = 0.02

ProgressFn = Callable[[str, int, int], None]

#: How launch mode follows its jobs: in the submitting call, or by a WatchJob of its own.
WATCH_MODES = ("together", "separately")
#: How placement mode sends its ProbeJob calls: over ProbeJobs streams, or one unary call each.
PROBE_CALL_MODES = ("stream", "unary")


@dataclass(frozen=True)
class BenchSpec:
    """One benchmark invocation; every field has a default except the sizes."""

    agents: int
    jobs: int
    rate: float = 0.0  # jobs per second, open-loop; 0 = burst
    launch: bool = False
    #: launch mode: "together" follows each job in its SubmitAndWatch call; "separately"
    #: submits with Submit and then opens a WatchJob stream (two calls per job).
    watch: str = "together"
    submitters: int = 32
    fake_gpus: str = DEFAULT_FAKE_GPUS
    gpu_milli: int = DEFAULT_GPU_MILLI  # 0 = one whole GPU per job
    agents_per_process: int = 0  # 0 = 1 up to 8 agents, else pools of 32
    heartbeat_seconds: float = 0.0  # 0 = the router's default
    agent_poll_seconds: float = DEFAULT_AGENT_POLL_SECONDS
    lease_ttl_seconds: float = 2.0  # placement mode: TTL of the kept lease
    timeout_seconds: float = 300.0  # measurement deadline; unplaced jobs are reported
    seed: int = 1
    probes: int = 0  # the router's placement.probes_per_attempt; 0 = its default
    #: placement mode: ProbeJob calls over ProbeJobs streams ("stream") or unary ("unary").
    probe_calls: str = "stream"
    #: placement mode with streams: how many streams carry the calls (job i on stream i % n);
    #: 0 = one per submitter (measured cheapest for the router: docs/bench-placement.md).
    probe_streams: int = 0
    work_dir: Path | None = None  # state dirs and logs; default a temporary dir, removed

    def validate(self) -> None:
        if not 1 <= self.agents <= 4096:
            raise InvalidArgument(f"must be in 1..4096, got {self.agents}", field="--agents")
        if not 1 <= self.jobs <= 1_000_000:
            raise InvalidArgument(f"must be in 1..1000000, got {self.jobs}", field="--jobs")
        if not (math.isfinite(self.rate) and 0 <= self.rate <= 100_000):
            raise InvalidArgument(f"must be in 0..100000 jobs/s, got {self.rate}", field="--rate")
        if self.watch not in WATCH_MODES:
            raise InvalidArgument(
                f"must be one of {', '.join(WATCH_MODES)}, got {self.watch!r}", field="--watch"
            )
        if self.probe_calls not in PROBE_CALL_MODES:
            raise InvalidArgument(
                f"must be one of {', '.join(PROBE_CALL_MODES)}, got {self.probe_calls!r}",
                field="--probe-calls",
            )
        if not 0 <= self.probe_streams <= 4096:
            raise InvalidArgument(
                f"must be in 0..4096, got {self.probe_streams}", field="--probe-streams"
            )
        if not 1 <= self.submitters <= 4096:
            raise InvalidArgument(
                f"must be in 1..4096, got {self.submitters}", field="--submitters"
            )
        if not 0 <= self.probes <= 64:
            raise InvalidArgument(f"must be in 0..64, got {self.probes}", field="--probes")
        if not 0 <= self.gpu_milli <= 1000:
            raise InvalidArgument(f"must be in 0..1000, got {self.gpu_milli}", field="--gpu-milli")
        if not 0 <= self.agents_per_process <= 512:
            raise InvalidArgument(
                f"must be in 0..512, got {self.agents_per_process}", field="--agents-per-process"
            )
        if not 0 < self.lease_ttl_seconds <= 60:
            raise InvalidArgument(
                f"must be in (0, 60] s, got {self.lease_ttl_seconds}", field="--lease-ttl"
            )
        if not 0 < self.timeout_seconds <= 86400:
            raise InvalidArgument(
                f"must be in (0, 86400] s, got {self.timeout_seconds}", field="--timeout"
            )
        if not 0 <= self.heartbeat_seconds <= 60:
            raise InvalidArgument(
                f"must be in 0..60 s, got {self.heartbeat_seconds}", field="--heartbeat-seconds"
            )
        if not 0.001 <= self.agent_poll_seconds <= 60:
            raise InvalidArgument(
                f"must be in 0.001..60 s, got {self.agent_poll_seconds}",
                field="--agent-poll-seconds",
            )
        try:
            parse_fake_spec(self.fake_gpus)
        except InvalidArgument as exc:
            raise InvalidArgument(exc.message.split(": ", 1)[-1], field="--fake-gpus") from None
        if self.capacity_per_agent() == 0:
            raise InvalidArgument(
                f"{self.fake_gpus!r} has no GPU that takes a job of "
                + (
                    f"{self.gpu_milli} milli-GPU (mark GPUs :shared)" if self.gpu_milli else "1 GPU"
                ),
                field="--fake-gpus",
            )

    @property
    def mode(self) -> str:
        return "launch" if self.launch else "placement"

    @property
    def per_process(self) -> int:
        if self.agents_per_process:
            return self.agents_per_process
        return 1 if self.agents <= MAX_SINGLE_PROCESS_AGENTS else DEFAULT_AGENTS_PER_POOL

    def capacity_per_agent(self) -> int:
        """Jobs of this benchmark's shape one agent can hold at once."""
        total = 0
        for item in parse_fake_spec(self.fake_gpus):
            if item.mig_profiles:
                continue
            if self.gpu_milli == 0:
                total += item.count
            elif item.shared:
                total += item.count * (1000 // self.gpu_milli)
        return total

    def resources(self) -> common_pb2.Resources:
        if self.gpu_milli:
            return common_pb2.Resources(gpu_milli=self.gpu_milli)
        return common_pb2.Resources(gpus=1)


# ====================================================================== processes


@dataclass
class Child:
    """A daemon process started by the benchmark and the agents it hosts."""

    name: str
    process: subprocess.Popen[bytes]
    state_dir: Path
    info_name: str
    log_path: Path


@dataclass(frozen=True)
class AgentEndpoint:
    agent_id: str
    address: str
    metrics_address: str
    pid: int


@dataclass
class BenchCluster:
    """The router and agent processes of one run; :meth:`stop` ends every one of them.

    Children run in their own sessions, so a Ctrl-C in the terminal reaches only
    the benchmark, which then stops them (SIGTERM, then SIGKILL after a grace).
    Not covered: a benchmark killed with SIGKILL leaves them running; their pids
    are in the ``*.json`` files under the work directory.
    """

    root: Path
    spec: BenchSpec
    router: Child | None = None
    router_address: str = ""
    router_metrics_address: str = ""
    router_pid: int = 0
    agent_children: list[Child] = field(default_factory=list)
    agents: list[AgentEndpoint] = field(default_factory=list)

    def _spawn(
        self,
        name: str,
        argv: list[str],
        state_dir: Path,
        info_name: str,
        extra_env: dict[str, str] | None = None,
    ) -> Child:
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / info_name).unlink(missing_ok=True)
        env = {
            **os.environ,
            "LAMINAR_AIRLOCK_POLL_SECONDS": f"{self.spec.agent_poll_seconds:g}",
            **local_run_as_env(os.environ),
            **(extra_env or {}),
        }
        if self.spec.heartbeat_seconds:
            env["LAMINAR_ZONE_HEARTBEAT_SECONDS"] = f"{self.spec.heartbeat_seconds:g}"
        log_path = state_dir.parent / f"{state_dir.name}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # Ctrl-C reaches only the benchmark, which stops us
            )
        return Child(name, process, state_dir, info_name, log_path)

    async def start(self, progress: ProgressFn | None = None) -> None:
        """Start the router, then all agent processes at once; wait until the router lists all."""
        spec = self.spec
        argv = ["-m", "laminar_zone", "--listen", "127.0.0.1:0", "--state-dir"]
        zone_dir = self.root / "zone"
        argv += [str(zone_dir), "--metrics-listen", "127.0.0.1:0"]
        if spec.heartbeat_seconds:
            argv += ["--heartbeat-seconds", f"{spec.heartbeat_seconds:g}"]
        # The bench is one tenant offering far more than the default per-tenant
        # ProbeJob limit (20/s); the limit protects a shared router, not what we measure.
        router_env = {"LAMINAR_LIMITS_PROBE_PER_SECOND": "0"}
        if spec.probes:
            router_env["LAMINAR_PLACEMENT_PROBES_PER_ATTEMPT"] = str(spec.probes)
        self.router = self._spawn("router", argv, zone_dir, "zone.json", router_env)
        info = await _wait_info(self.router, 60.0)
        self.router_address = str(info["address"])
        self.router_metrics_address = str(info.get("metrics_address", ""))
        self.router_pid = self.router.process.pid
        per = spec.per_process
        for first in range(0, spec.agents, per):
            count = min(per, spec.agents - first)
            if per == 1:
                agent_id = f"a{first}"
                argv = ["-m", "laminar_agent", "--listen", "127.0.0.1:0"]
                argv += ["--metrics-listen", "127.0.0.1:0", "--agent-id", agent_id]
                argv += ["--state-dir", str(self.root / agent_id), "--gpu-backend", "fake"]
                argv += ["--fake-gpus", spec.fake_gpus, "--zone", self.router_address]
                child = self._spawn(agent_id, argv, self.root / agent_id, "agent.json")
            else:
                name = f"pool{first // per}"
                argv = ["-m", "laminar_bench.agent_pool", "--count", str(count)]
                argv += ["--zone", self.router_address, "--fake-gpus", spec.fake_gpus]
                argv += ["--state-dir", str(self.root / name), "--prefix", f"{name}-a"]
                argv += ["--airlock-poll-seconds", f"{spec.agent_poll_seconds:g}"]
                argv += ["--log-level", "INFO"]
                child = self._spawn(name, argv, self.root / name, POOL_INFO)
            self.agent_children.append(child)
        start_timeout = 60.0 + 0.5 * spec.agents
        for child in self.agent_children:
            info = await _wait_info(child, start_timeout)
            if child.info_name == POOL_INFO:
                for a in info["agents"]:
                    self.agents.append(
                        AgentEndpoint(
                            a["agent_id"], a["address"], a["metrics_address"], int(info["pid"])
                        )
                    )
            else:
                self.agents.append(
                    AgentEndpoint(
                        str(info["agent_id"]),
                        str(info["address"]),
                        str(info.get("metrics_address", "")),
                        int(info["pid"]),
                    )
                )
            if progress is not None:
                progress("starting agents", len(self.agents), spec.agents)
        await self._wait_registered(start_timeout)

    async def _wait_registered(self, timeout_seconds: float) -> None:
        expected = {a.agent_id for a in self.agents}
        deadline = time.monotonic() + timeout_seconds
        async with grpc.aio.insecure_channel(self.router_address, options=channel_options()) as ch:
            stub = zone_pb2_grpc.ZoneStub(ch)
            while True:
                reply = await stub.ListAgents(zone_pb2.ListAgentsRequest(), timeout=10)
                ready = {a.agent_id for a in reply.agents if a.state == zone_pb2.AGENT_READY}
                if expected <= ready:
                    return
                if time.monotonic() > deadline:
                    raise Unavailable(
                        f"the router lists {len(expected & ready)} of {len(expected)} agents "
                        f"as ready after {timeout_seconds:.0f} s"
                    )
                self._check_alive()
                await asyncio.sleep(0.1)  # heartbeats arrive on their own schedule

    def _check_alive(self) -> None:
        for child in [c for c in (self.router, *self.agent_children) if c is not None]:
            if child.process.poll() is not None:
                raise Unavailable(
                    f"{child.name} exited with {child.process.returncode}; "
                    f"last log line: {_last_line(child.log_path)}"
                )

    def agent_pids(self) -> list[int]:
        return [c.process.pid for c in self.agent_children]

    def stop(self, grace_seconds: float = 15.0) -> None:
        """SIGTERM the router, then every agent process; SIGKILL what outlives the grace."""
        groups = [[self.router] if self.router is not None else [], self.agent_children]
        for group in groups:
            for child in group:
                if child.process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        child.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_seconds
            for child in group:
                try:
                    child.process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.process.kill()
                    child.process.wait()


async def _wait_info(child: Child, timeout_seconds: float) -> dict[str, Any]:
    """Poll for the info file a daemon writes once it serves (bounded by the deadline)."""
    path = child.state_dir / child.info_name
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if child.process.poll() is not None:
            raise Unavailable(
                f"{child.name} exited with {child.process.returncode}; "
                f"last log line: {_last_line(child.log_path)}"
            )
        if path.exists():
            try:
                info: dict[str, Any] = json.loads(path.read_text())
            except ValueError:
                info = {}
            if info.get("address") or info.get("agents"):
                return info
        await asyncio.sleep(_POLL_SECONDS)  # the child writes the file when it serves
    raise Unavailable(
        f"{child.name} did not start within {timeout_seconds:.0f} s; see {child.log_path}"
    )


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1].strip() if lines else "(empty log)"


# ====================================================================== measurement


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU time of these processes (gone ones count as 0)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def children_cpu_seconds(pids: list[int]) -> float:
    """CPU time of whatever starts subjobs for these agent processes: their reaped
    descendants (shims started directly, and the commands they ran) plus each agent's
    launcher process, itself and its reaped supervisors and commands."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            agent = psutil.Process(pid)
            times = agent.cpu_times()
            total += times.children_user + times.children_system
            for child in agent.children():
                with contextlib.suppress(psutil.Error):
                    if "--serve" in child.cmdline():
                        t = child.cpu_times()
                        total += t.user + t.system + t.children_user + t.children_system
    return total


def spawn_floor(command: list[str], count: int = 200) -> dict[str, float]:
    """This machine's floor for launching ``command``: spawn and reap it ``count`` times
    back to back from this process; the rate and the CPU each costs (spawner + child)."""
    path = shutil.which(command[0]) or command[0]
    before_self = sum(psutil.Process().cpu_times()[:2])
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    for _ in range(count):
        pid = os.posix_spawn(path, command, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        os.waitpid(pid, 0)
    seconds = time.monotonic() - t0
    after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = (after_children.ru_utime - before_children.ru_utime) + (
        after_children.ru_stime - before_children.ru_stime
    )
    own = sum(psutil.Process().cpu_times()[:2]) - before_self
    return {
        "spawns": count,
        "per_second": count / seconds if seconds > 0 else 0.0,
        "cpu_ms_per_spawn": 1000 * (own + children) / count,
    }


def scrape_probes(addresses: list[str]) -> dict[str, float]:
    """Sum ``laminar_agent_probes_total`` by outcome over the agents' metrics endpoints."""

    def one(address: str) -> dict[str, float]:
        out: dict[str, float] = {}
        if not address:
            return out
        try:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
                text = response.read().decode()
        except OSError:
            return out
        for family in text_string_to_metric_families(text):
            if family.name != "laminar_agent_probes":
                continue
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    outcome = sample.labels.get("outcome", "")
                    out[outcome] = out.get(outcome, 0.0) + sample.value
        return out

    totals: dict[str, float] = {}
    unique = sorted(set(addresses))  # agents of one pool share its endpoint (label agent=ID)
    with ThreadPoolExecutor(max_workers=16) as pool:
        for counts in pool.map(one, unique):
            for k, v in counts.items():
                totals[k] = totals.get(k, 0.0) + v
    return totals


def scrape_heartbeats(address: str) -> dict[str, float]:
    """The router's heartbeat counters (all heartbeats, and those with a full summary: a
    router without that counter reports every heartbeat as full), its ready agents and its
    journal commits."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (
            "laminar_zone_heartbeats",
            "laminar_zone_heartbeat_summaries",
            "laminar_zone_journal_commits",
        ):
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[family.name] = sample.value
        elif family.name == "laminar_zone_agents":
            for sample in family.samples:
                if sample.labels.get("state") == "ready":
                    out["laminar_zone_agents_ready"] = sample.value
    out.setdefault("laminar_zone_heartbeat_summaries", out.get("laminar_zone_heartbeats", 0.0))
    return out


def environment() -> dict[str, Any]:
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count() or 0,
        "cpu_model": cpu_model,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "platform": platform.platform(),
        "memory_bytes": psutil.virtual_memory().total,
    }


class ProbeStream:
    """ProbeJob calls over one ProbeJobs stream (:class:`~laminar_base.callstream.CallClient`:
    each call waits for the reply naming it, at most ``timeout_seconds``). A call's error
    reply raises as the unary call would; the stream's end fails every call still waiting."""

    def __init__(self, stub: zone_pb2_grpc.ZoneAsyncStub, timeout_seconds: float) -> None:
        # The generated stubs type the call for the blocking API; this is the aio one.
        opener: Any = stub.ProbeJobs
        self._client: CallClient[zone_pb2.ProbeJobsRequest, zone_pb2.ProbeJobsReply] = CallClient(
            lambda: opener(), name="probe-jobs"
        )
        self._timeout = timeout_seconds

    async def probe(self, request: zone_pb2.ProbeJobRequest) -> zone_pb2.ProbeJobReply:
        reply = await self._client.call(zone_pb2.ProbeJobsRequest(probe=request), self._timeout)
        if reply.WhichOneof("outcome") == "error":
            raise rpc_error(reply.error.code, reply.error.message)
        answer: zone_pb2.ProbeJobReply = reply.reply
        return answer

    async def close(self) -> None:
        await self._client.close()


@dataclass
class Outcome:
    """What happened to one job of the run."""

    index: int
    sent_mono: float = 0.0
    submit_unix: float = 0.0
    placed: bool = False
    latency_seconds: float = 0.0
    observed_seconds: float = 0.0  # launch: until the client saw it running
    done_mono: float = 0.0
    done_unix: float = 0.0
    probes: int = 0
    bounces: int = 0
    queued: bool = False
    final_state: str = ""
    error: str = ""
    #: launch: the job's events its watch stream carried (Submit's answer included).
    events: int = 0


class Driver:
    """Sends the jobs and records one :class:`Outcome` per job (runs on one event loop)."""

    def __init__(self, spec: BenchSpec, cluster: BenchCluster, progress: ProgressFn | None) -> None:
        self.spec = spec
        self.cluster = cluster
        self.progress = progress
        self.outcomes = [Outcome(i) for i in range(spec.jobs)]
        self.placed = 0
        self.settled = 0
        self.all_settled = asyncio.Event()
        self.background: set[asyncio.Task[Any]] = set()
        self.agent_channels: dict[str, grpc.aio.Channel] = {}
        self.deadline = 0.0
        self.run_id = f"bench-{os.getpid()}-{int(time.time())}"
        #: Calls this driver made to the router's Zone service (load-independent per job).
        self.zone_calls = 0
        #: Placement mode: kept leases to give back, by agent address, sent together at the
        #: end of the loop tick (one Release per agent per tick, as a two-phase client
        #: batches them); and the Release calls made.
        self._to_release: dict[str, list[str]] = {}
        self.release_calls = 0
        #: Placement mode: the ProbeJobs streams the calls go over (none: unary calls).
        self.probe_streams: list[ProbeStream] = []

    def _settle(self, outcome: Outcome) -> None:
        self.settled += 1
        if outcome.placed:
            self.placed += 1
        if self.progress is not None:
            self.progress(f"{self.spec.mode}: placed", self.placed, self.spec.jobs)
        if self.settled == self.spec.jobs:
            self.all_settled.set()

    def _agent_stub(self, address: str) -> agent_pb2_grpc.AgentAsyncStub:
        channel = self.agent_channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=channel_options())
            self.agent_channels[address] = channel
        return agent_pb2_grpc.AgentStub(channel)

    def _spawn(self, coro: Any, name: str) -> None:
        task: asyncio.Task[Any] = asyncio.create_task(coro, name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def _remaining(self) -> float:
        return max(0.1, self.deadline - time.monotonic())

    # ---------------------------------------------------------------- one job

    async def place_one(self, stub: zone_pb2_grpc.ZoneAsyncStub, outcome: Outcome) -> None:
        """Placement mode: two-phase probe, keep the lease, give it back in the background."""
        request = zone_pb2.ProbeJobRequest(
            spec=self._job_spec(outcome.index),
            keep_leases=True,
            lease_ttl_seconds=self.spec.lease_ttl_seconds,
        )
        outcome.sent_mono = time.monotonic()
        outcome.submit_unix = time.time()
        t0 = time.perf_counter()
        self.zone_calls += 1
        try:
            if self.probe_streams:
                streams = self.probe_streams
                reply = await streams[outcome.index % len(streams)].probe(request)
            else:
                reply = await stub.ProbeJob(request, timeout=self._remaining())
        except grpc.aio.AioRpcError as exc:
            outcome.error = f"{exc.code().name}: {exc.details()}"
            self._settle(outcome)
            return
        outcome.latency_seconds = time.perf_counter() - t0
        outcome.done_mono = time.monotonic()
        outcome.done_unix = time.time()
        leases = [h for h in reply.hosts if h.fits and h.HasField("lease")]
        if leases:
            outcome.placed = True
            outcome.final_state = "leased"
            if not self._to_release:
                asyncio.get_running_loop().call_soon(self._release_kept)
            for host in leases:
                self._to_release.setdefault(host.address, []).append(host.lease.lease_id)
        else:
            outcome.final_state = "no lease"
            outcome.error = "; ".join(h.reason for h in reply.hosts)[:500] or "no host fits"
        self._settle(outcome)

    def _release_kept(self) -> None:
        """The tick's kept leases back to their agents, one Release per agent."""
        batch, self._to_release = self._to_release, {}
        for address, ids in batch.items():
            self.release_calls += 1
            self._spawn(self._release(address, ids), f"release-{address}")

    async def _release(self, address: str, lease_ids: list[str]) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):  # an unreleased lease expires (TTL)
            await self._agent_stub(address).Release(
                agent_pb2.ReleaseRequest(lease_ids=lease_ids), timeout=10
            )

    async def launch_one(self, stub: zone_pb2_grpc.ZoneAsyncStub, outcome: Outcome) -> None:
        """Launch mode: submit, and once the submit is answered follow the job in the
        background: in the same SubmitAndWatch call (``--watch together``), or with Submit
        and then a WatchJob stream (``--watch separately``)."""
        request = zone_pb2.SubmitRequest(
            spec=self._job_spec(outcome.index),
            client_request_id=f"{self.run_id}-{outcome.index}",
        )
        outcome.sent_mono = time.monotonic()
        outcome.submit_unix = time.time()
        events: AsyncIterator[zone_pb2.JobEvent]
        try:
            if self.spec.watch == "together":
                self.zone_calls += 1
                events = aiter(stub.SubmitAndWatch(request, timeout=self._remaining()))
                first = await anext(events)  # Submit's answer: the job is durable
                job_id = first.job.job_id
                events = _chain(first, events)
            else:
                self.zone_calls += 1
                job = await stub.Submit(request, timeout=self._remaining())
                job_id = job.job_id
                self.zone_calls += 1
                events = aiter(
                    stub.WatchJob(
                        zone_pb2.WatchJobRequest(job_id=job_id), timeout=self._remaining()
                    )
                )
        except (grpc.aio.AioRpcError, StopAsyncIteration) as exc:
            outcome.error = (
                f"{exc.code().name}: {exc.details()}"
                if isinstance(exc, grpc.aio.AioRpcError)
                else "the stream ended before the submit was answered"
            )
            self._settle(outcome)
            return
        self._spawn(self._follow(events, outcome), f"watch-{job_id}")

    async def _follow(self, events: AsyncIterator[zone_pb2.JobEvent], outcome: Outcome) -> None:
        settled = False
        try:
            async for event in events:
                outcome.events += 1
                job = event.job
                outcome.probes, outcome.bounces = job.probes, job.bounces
                if job.state == zone_pb2.QUEUED:
                    outcome.queued = True
                started = [p.started_unix for p in job.placements if p.started_unix > 0]
                if started and not outcome.placed:
                    outcome.placed = True
                    outcome.done_unix = min(started)
                    outcome.done_mono = time.monotonic()
                    outcome.latency_seconds = outcome.done_unix - outcome.submit_unix
                    outcome.observed_seconds = time.time() - outcome.submit_unix
                if job.state in TERMINAL_JOB_STATES:
                    outcome.final_state = zone_pb2.JobState.Name(job.state)
                    if not outcome.placed:
                        outcome.error = job.reason
                    break
                if outcome.placed and not settled:
                    settled = True
                    self._settle(outcome)
        except grpc.aio.AioRpcError as exc:
            outcome.error = outcome.error or f"{exc.code().name}: {exc.details()}"
        if not settled:
            self._settle(outcome)

    def _job_spec(self, index: int) -> zone_pb2.JobSpec:
        return zone_pb2.JobSpec(
            name=f"bench-{index}",
            command=["true"],
            resources=self.spec.resources(),
            tenant="bench",
        )

    # ---------------------------------------------------------------- arrivals

    async def run_burst(self, stub: zone_pb2_grpc.ZoneAsyncStub) -> None:
        queue = iter(self.outcomes)
        one = self.launch_one if self.spec.launch else self.place_one

        async def submitter() -> None:
            for outcome in queue:  # the shared iterator hands each job to one submitter
                await one(stub, outcome)

        workers = min(self.spec.submitters, self.spec.jobs)
        await asyncio.gather(
            *(asyncio.create_task(submitter(), name=f"submitter-{i}") for i in range(workers))
        )

    async def run_open_loop(self, stub: zone_pb2_grpc.ZoneAsyncStub) -> float:
        """Poisson arrivals at ``rate``; returns the largest lag behind the schedule (seconds)."""
        rng = random.Random(self.spec.seed)
        one = self.launch_one if self.spec.launch else self.place_one
        start = time.monotonic()
        at = 0.0
        lag = 0.0
        for outcome in self.outcomes:
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # the arrival schedule itself, not a synchronization
            lag = max(lag, time.monotonic() - (start + at))
            self._spawn(one(stub, outcome), f"arrival-{outcome.index}")
            at += rng.expovariate(self.spec.rate)
        return lag

    async def open_probe_streams(self, stub: zone_pb2_grpc.ZoneAsyncStub) -> str:
        """Placement mode with ``--probe-calls stream``: open the streams and make one dry
        run over each (so they are connected before the clock runs). Returns a note for the
        report: empty, or why the calls go unary (a router without ProbeJobs)."""
        streams = [
            ProbeStream(stub, self.spec.timeout_seconds)
            for _ in range(self.spec.probe_streams or min(self.spec.submitters, self.spec.jobs))
        ]
        dry_run = zone_pb2.ProbeJobRequest(
            spec=zone_pb2.JobSpec(command=["true"], resources=self.spec.resources(), tenant="bench")
        )
        try:
            for stream in streams:
                await stream.probe(dry_run)
        except grpc.aio.AioRpcError as exc:
            for stream in streams:
                await stream.close()
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            return f"the router has no ProbeJobs ({exc.details()}): unary ProbeJob calls"
        self.probe_streams = streams
        return ""

    async def close(self) -> None:
        for stream in self.probe_streams:
            await stream.close()
        self._release_kept()  # any the tick has not sent yet
        if self.background:
            await asyncio.gather(*list(self.background), return_exceptions=True)
        for channel in self.agent_channels.values():
            await channel.close(None)


async def _chain(
    first: zone_pb2.JobEvent, rest: AsyncIterator[zone_pb2.JobEvent]
) -> AsyncIterator[zone_pb2.JobEvent]:
    """``first``, then the stream it was read from."""
    yield first
    async for event in rest:
        yield event


async def _health_p50(channel: grpc.aio.Channel, samples: int) -> float:
    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest(service="")
    for _ in range(20):
        await stub.Check(request, timeout=10)
    rtts = []
    for _ in range(samples):
        t0 = time.perf_counter()
        await stub.Check(request, timeout=10)
        rtts.append(time.perf_counter() - t0)
    return percentile(rtts, 0.5)


async def _warm_up(stub: zone_pb2_grpc.ZoneAsyncStub, spec: BenchSpec) -> None:
    """Dry-run probes, so the router has open channels to (most) agents before the clock runs."""
    request = zone_pb2.ProbeJobRequest(
        spec=zone_pb2.JobSpec(command=["true"], resources=spec.resources(), tenant="bench"),
        max_hosts=64,
    )
    for _ in range(2 * math.ceil(spec.agents / 64) + 1):
        await stub.ProbeJob(request, timeout=30)


async def _measure(
    spec: BenchSpec, cluster: BenchCluster, progress: ProgressFn | None
) -> dict[str, Any]:
    await cluster.start(progress)
    metrics_addresses = [a.metrics_address for a in cluster.agents]
    async with grpc.aio.insecure_channel(
        cluster.router_address, options=channel_options()
    ) as channel:
        stub = zone_pb2_grpc.ZoneStub(channel)
        await _warm_up(stub, spec)
        health_before = await _health_p50(channel, HEALTH_SAMPLES)
        idle_cpu = cpu_seconds([cluster.router_pid])
        idle_agents = cpu_seconds(cluster.agent_pids())
        idle_t0 = time.monotonic()
        await asyncio.sleep(IDLE_WINDOW_SECONDS)  # a measurement window with no requests
        idle_seconds = time.monotonic() - idle_t0
        router_idle_ratio = (cpu_seconds([cluster.router_pid]) - idle_cpu) / idle_seconds
        agents_idle_ratio = (cpu_seconds(cluster.agent_pids()) - idle_agents) / idle_seconds

        probes_before = await asyncio.to_thread(scrape_probes, metrics_addresses)
        beats_before = await asyncio.to_thread(scrape_heartbeats, cluster.router_metrics_address)
        driver = Driver(spec, cluster, progress)
        probe_note = ""
        if not spec.launch and spec.probe_calls == "stream":
            probe_note = await driver.open_probe_streams(stub)
        me = psutil.Process()
        client_cpu0 = sum(me.cpu_times()[:2])
        router_cpu0 = cpu_seconds([cluster.router_pid])
        agents_cpu0 = cpu_seconds(cluster.agent_pids())
        launch_cpu0 = children_cpu_seconds(cluster.agent_pids())
        machine0 = psutil.cpu_times()
        t0 = time.monotonic()
        driver.deadline = t0 + spec.timeout_seconds
        lag = 0.0
        if spec.rate:
            lag = await driver.run_open_loop(stub)
        else:
            await driver.run_burst(stub)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(driver.all_settled.wait(), max(0.0, driver.deadline - t0))
        measured_seconds = time.monotonic() - t0
        router_cpu = cpu_seconds([cluster.router_pid]) - router_cpu0
        agents_cpu = cpu_seconds(cluster.agent_pids()) - agents_cpu0
        client_cpu = sum(me.cpu_times()[:2]) - client_cpu0
        machine_busy = _busy_ratio(machine0, psutil.cpu_times())
        await driver.close()  # releases (placement) and watches to the terminal state (launch)
        # After close: every launched process has ended and been reaped by then.
        launch_cpu = children_cpu_seconds(cluster.agent_pids()) - launch_cpu0
        floor = spawn_floor(["true"]) if spec.launch else None
        probes_after = await asyncio.to_thread(scrape_probes, metrics_addresses)
        beats_after = await asyncio.to_thread(scrape_heartbeats, cluster.router_metrics_address)
        health_after = await _health_p50(channel, HEALTH_SAMPLES)

    outcomes = driver.outcomes
    placed = [o for o in outcomes if o.placed]
    latencies = [o.latency_seconds for o in placed]
    n_placed = len(placed)
    first_sent = min((o.sent_mono for o in outcomes if o.sent_mono), default=t0)
    if spec.launch:
        first_unix = min((o.submit_unix for o in outcomes if o.submit_unix), default=0.0)
        window = max((o.done_unix for o in placed), default=first_unix) - first_unix
    else:
        window = max((o.done_mono for o in placed), default=first_sent) - first_sent
    agent_delta = {
        k: probes_after.get(k, 0.0) - probes_before.get(k, 0.0)
        for k in set(probes_after) | set(probes_before)
    }
    agent_probes = agent_delta.get("lease", 0.0) + agent_delta.get("bounce", 0.0)
    if spec.launch:
        probes_pp = _mean([float(o.probes) for o in placed])
        bounces_pp = _mean([float(o.bounces) for o in placed])
        probes_source = "router: Job.probes and Job.bounces, mean over placed jobs"
    else:
        probes_pp = agent_probes / n_placed if n_placed else 0.0
        bounces_pp = agent_delta.get("bounce", 0.0) / n_placed if n_placed else 0.0
        probes_source = "agents: laminar_agent_probes_total{outcome=lease|bounce}, summed"
    health_p50 = health_before
    p50 = percentile(latencies, 0.5)
    capacity = spec.capacity_per_agent() * spec.agents
    states: dict[str, int] = {}
    for o in outcomes:
        key = o.final_state or ("error" if o.error else "unsettled")
        states[key] = states.get(key, 0) + 1
    errors = sorted({o.error for o in outcomes if o.error and not o.placed})[:5]
    per = spec.per_process
    return {
        "mode": spec.mode,
        "arrivals": "open-loop" if spec.rate else "burst",
        "rate": spec.rate,
        "submitters": spec.submitters if not spec.rate else 0,
        "agents": spec.agents,
        "probes_per_attempt": spec.probes or "router default",
        "agents_per_process": min(per, spec.agents),
        "agent_processes": len(cluster.agent_children),
        "jobs": spec.jobs,
        "placed": n_placed,
        "not_placed": spec.jobs - n_placed,
        "jobs_queued": sum(1 for o in outcomes if o.queued),
        "final_states": states,
        "errors": errors,
        "placements_per_second": n_placed / window if window > 0 else 0.0,
        "latency_p50_ms": 1000 * p50,
        "latency_p90_ms": 1000 * percentile(latencies, 0.9),
        "latency_p99_ms": 1000 * percentile(latencies, 0.99),
        "latency_max_ms": 1000 * max(latencies, default=0.0),
        "latency_mean_ms": 1000 * _mean(latencies),
        "observed_running_p50_ms": (
            1000 * percentile([o.observed_seconds for o in placed], 0.5) if spec.launch else None
        ),
        "latency_definition": (
            "submit to running: the subjob's started_unix (agent, right after the process "
            "was spawned) minus the client's time.time() just before Submit"
            if spec.launch
            else "submit to lease: client round trip of ProbeJob(keep_leases=true); "
            "no process starts in this mode"
        ),
        "processes_started": n_placed if spec.launch else 0,
        "watch": spec.watch if spec.launch else None,
        # Placement mode: how the ProbeJob calls went ("stream": over ProbeJobs streams,
        # probe_streams of them; "unary"), and why they went unary if streams were asked.
        "probe_calls": None if spec.launch else ("stream" if driver.probe_streams else "unary"),
        "probe_streams": len(driver.probe_streams) if not spec.launch else None,
        "probe_calls_note": probe_note or None,
        "zone_calls_per_job": driver.zone_calls / spec.jobs,
        # Placement mode: the benchmark's own Release calls to agents per placement (kept
        # leases given back, batched per agent per loop tick).
        "release_calls_per_placement": driver.release_calls / max(1, driver.placed),
        "probes_per_placement": probes_pp,
        "bounces_per_placement": bounces_pp,
        "probes_source": probes_source,
        "agent_probes_per_placement": agent_probes / n_placed if n_placed else 0.0,
        "heartbeats_per_job": _per_job(
            beats_before, beats_after, "laminar_zone_heartbeats", n_placed
        ),
        "heartbeat_summaries_per_job": _per_job(
            beats_before, beats_after, "laminar_zone_heartbeat_summaries", n_placed
        ),
        "journal_commits_per_job": _per_job(
            beats_before, beats_after, "laminar_zone_journal_commits", n_placed
        ),
        "watch_events_per_job": (
            sum(o.events for o in outcomes) / spec.jobs if spec.launch else None
        ),
        "router_cpu_seconds_per_placement": router_cpu / n_placed if n_placed else 0.0,
        "router_cpu_seconds_per_placement_net_of_idle": (
            max(0.0, router_cpu - router_idle_ratio * measured_seconds) / n_placed
            if n_placed
            else 0.0
        ),
        "router_cpu_seconds": router_cpu,
        "router_idle_cpu_ratio": router_idle_ratio,
        "agents_cpu_seconds_per_placement": agents_cpu / n_placed if n_placed else 0.0,
        "agents_idle_cpu_ratio": agents_idle_ratio,
        "client_cpu_seconds": client_cpu,
        "cpu_ms_per_job": _cpu_ms_per_job(
            n_placed, router_cpu, agents_cpu, launch_cpu if spec.launch else 0.0, client_cpu
        ),
        "spawn_floor": floor,
        "launch_rate_to_floor_ratio": (
            (n_placed / window) / floor["per_second"]
            if floor and window > 0 and floor["per_second"]
            else None
        ),
        "machine_cpu_busy_ratio": machine_busy,
        "measured_seconds": measured_seconds,
        "window_seconds": window,
        "arrival_lag_max_ms": 1000 * lag,
        "health_p50_ms": 1000 * health_p50,
        "health_p50_after_ms": 1000 * health_after,
        "latency_p50_to_health_p50_ratio": p50 / health_p50 if health_p50 > 0 else 0.0,
        "capacity_jobs": capacity,
        "config": {
            "fake_gpus": spec.fake_gpus,
            "gpu_milli": spec.gpu_milli,
            "job": "true, "
            + (f"{spec.gpu_milli} milli-GPU share" if spec.gpu_milli else "1 whole GPU"),
            "heartbeat_seconds": spec.heartbeat_seconds or "router default",
            "agent_airlock_poll_seconds": spec.agent_poll_seconds,
            "lease_ttl_seconds": spec.lease_ttl_seconds if not spec.launch else None,
            "timeout_seconds": spec.timeout_seconds,
            "seed": spec.seed,
        },
        "environment": environment(),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _per_job(before: dict[str, float], after: dict[str, float], key: str, jobs: int) -> float:
    """How much a router counter grew per placed job between two scrapes."""
    return (after.get(key, 0.0) - before.get(key, 0.0)) / jobs if jobs else 0.0


def _cpu_ms_per_job(
    jobs: int, router: float, agents: float, launch: float, client: float
) -> dict[str, float]:
    """CPU milliseconds per placed job by process group; total = router + agents + launch
    (launch: whatever starts subjobs, i.e. the shims, plus the commands they ran)."""
    if not jobs:
        return {"router": 0.0, "agents": 0.0, "launch": 0.0, "client": 0.0, "total": 0.0}
    ms = {
        "router": 1000 * router / jobs,
        "agents": 1000 * agents / jobs,
        "launch": 1000 * launch / jobs,
        "client": 1000 * client / jobs,
    }
    ms["total"] = ms["router"] + ms["agents"] + ms["launch"]
    return ms


def _busy_ratio(before: Any, after: Any) -> float:
    """Share of all cores' time that was busy between two ``psutil.cpu_times()`` readings."""
    total = sum(after) - sum(before)
    idle = (after.idle - before.idle) + (
        getattr(after, "iowait", 0.0) - getattr(before, "iowait", 0.0)
    )
    return (total - idle) / total if total > 0 else 0.0


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Let SIGTERM unwind like Ctrl-C so every child is stopped (main thread only)."""

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


ClusterT = TypeVar("ClusterT", bound=BenchCluster)


def measure_cluster(
    work_dir: Path | None,
    make_cluster: Callable[[Path], ClusterT],
    measure: Callable[[ClusterT], Coroutine[Any, Any, dict[str, Any]]],
) -> dict[str, Any]:
    """Build a cluster in ``work_dir`` (default a temporary dir, removed after), run
    ``measure`` on it, stop every process (also on Ctrl-C, SIGTERM or an error)."""
    root = work_dir or Path(tempfile.mkdtemp(prefix="laminar-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    cluster = make_cluster(root)
    try:
        with _terminate_as_interrupt():
            try:
                return asyncio.run(measure(cluster))
            finally:
                cluster.stop()
    finally:
        if work_dir is None:
            shutil.rmtree(root, ignore_errors=True)


def run_bench(spec: BenchSpec, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Start the cluster, measure, stop every process (also on Ctrl-C, SIGTERM or an error)."""
    spec.validate()
    return measure_cluster(
        spec.work_dir,
        lambda root: BenchCluster(root, spec),
        lambda cluster: _measure(spec, cluster, progress),
    )


__all__ = ["BenchSpec", "measure_cluster", "percentile", "run_bench"]
