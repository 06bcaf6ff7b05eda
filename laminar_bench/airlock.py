"""``laminar bench airlock``: Airlock against an OOM-killer baseline, same work, same pressure.

Each policy gets its own real agent process on the fake backend (one 80 GiB GPU shared by
fractional subjobs) and the same sequence of real subjob processes:

* **step** trials: four subjobs (critical/resident, production/resident, batch/long,
  opportunistic/transient) run for ``warmup_seconds``; then injected load pushes the GPU
  past 100 %. The reaction time is from the injection (the pressure crossing every mark
  at once) to the agent's first journaled action. Then the pressure is cleared, the
  survivors are let finish, and the next trial starts with fresh subjobs.
* **genai** runs (when a GenAI trace folder is given): three subjobs replay the memory
  curves of a sharing group of real pods (:func:`laminar_airlock.traces.choose_sharing_group`,
  chosen to go over 100 % of the GPU), compressed in time.

The baseline is the agent's ``laminar_airlock.policy = "oom-killer"``
(:func:`laminar_airlock.policy.decide_oom_killer`): nothing until the GPU is full, then SIGKILL
to the largest process, whatever its class. What is reported for both: subjobs killed by
class; *high-priority work lost*, the GPU-seconds run so far by critical and production
subjobs that were killed (a killed rigid subjob loses all of it); all work lost; how many
were suspended; reaction time p50/p99. The benchmark never fails on a number.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from laminar_agent.executor import local_run_as_env
from laminar_airlock.policy import PRIORITY_NAMES
from laminar_airlock.traces import choose_sharing_group, load_memory_curves
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from laminar_base.causes import ENDED_SUBJOB_STATES, EndCause, end_cause
from laminar_base.errors import InvalidArgument, Unavailable
from laminar_bench.placement import environment, percentile

GIB = 1024**3
GPU_TOTAL_BYTES = 80 * GIB
FAKE_GPUS = "1xA100-80GB:shared"
POLICIES = ("ladder", "oom-killer")
HIGH_PRIORITY = (common_pb2.CRITICAL, common_pb2.PRODUCTION)
TERMINAL = ENDED_SUBJOB_STATES

ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True)
class AirlockBenchSpec:
    trials: int = 10
    warmup_seconds: float = 1.0
    settle_seconds: float = 1.5
    poll_seconds: float = 0.1
    trace_dir: Path | None = None
    genai_groups: int = 3
    genai_window: int = 60
    genai_step_seconds: float = 0.08
    timeout_seconds: float = 600.0
    work_dir: Path | None = None

    def validate(self) -> None:
        if not 1 <= self.trials <= 1000:
            raise InvalidArgument(f"must be in 1..1000, got {self.trials}", field="--trials")
        if not 0.01 <= self.poll_seconds <= 5:
            raise InvalidArgument(
                f"must be in [0.01, 5] s, got {self.poll_seconds}", field="--poll-seconds"
            )
        if not 0 <= self.genai_groups <= 50:
            raise InvalidArgument(
                f"must be in 0..50, got {self.genai_groups}", field="--genai-groups"
            )
        if self.trace_dir is not None and not self.trace_dir.exists():
            raise InvalidArgument(f"{self.trace_dir} does not exist", field="--trace-dir")


@dataclass(frozen=True)
class Member:
    """One subjob of a trial: its class, declared memory and command."""

    name: str
    priority: int
    lifecycle: int
    declared_bytes: int
    gpu_milli: int
    command: tuple[str, ...]


class BenchAgent:
    """One agent process on the fake backend with ``laminar_airlock.policy`` set; stop() ends it."""

    def __init__(self, root: Path, policy: str, poll_seconds: float) -> None:
        self.state_dir = root / policy
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "LAMINAR_AIRLOCK_POLICY": policy,
            "LAMINAR_AIRLOCK_POLL_SECONDS": f"{poll_seconds:g}",
            "LAMINAR_AIRLOCK_HOLD_SECONDS": "0.3",
            "LAMINAR_AIRLOCK_RECLAIM_GRACE_SECONDS": "1",
            **local_run_as_env(os.environ),  # its subjobs write usage files in our tmp dirs
        }
        argv = [sys.executable, "-m", "laminar_agent", "--listen", "127.0.0.1:0"]
        argv += ["--agent-id", f"bench-{policy}", "--state-dir", str(self.state_dir)]
        argv += ["--gpu-backend", "fake", "--fake-gpus", FAKE_GPUS, "--log-level", "WARNING"]
        self.log_path = root / f"{policy}.log"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        info = self.state_dir / "agent.json"
        deadline = time.monotonic() + 60
        while not info.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise Unavailable(f"the {policy} agent did not start; see {self.log_path}")
            time.sleep(0.05)  # the agent writes agent.json once it serves
        self.address = str(json.loads(info.read_text())["address"])
        self.channel = grpc.insecure_channel(self.address)
        self.stub = agent_pb2_grpc.AgentStub(self.channel)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.channel.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def inject(self, used_bytes: int) -> None:
        self.stub.InjectLoad(agent_pb2.InjectLoadRequest(gpu_index=0, used_bytes=used_bytes))

    def reads_idle(self) -> bool:
        """Airlock's latest reading shows no GPU memory in use on any slice."""
        state = self.stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=1), timeout=10)
        return all(s.used_bytes == 0 for s in state.slices)

    def last_action_seq(self) -> int:
        state = self.stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=1), timeout=10)
        return max((a.seq for a in state.recent_actions), default=0)

    def actions_after(self, seq: int) -> list[agent_pb2.AirlockAction]:
        state = self.stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=1000), timeout=10)
        return [a for a in state.recent_actions if a.seq > seq and not a.dry_run]

    def start(self, subjob_id: str, member: Member) -> None:
        resources = common_pb2.Resources(
            gpu_milli=member.gpu_milli, gpu_memory_bytes=member.declared_bytes
        )
        spec = common_pb2.SubjobSpec(
            subjob_id=subjob_id,
            job_id=f"job-{subjob_id}",
            command=list(member.command),
            priority=member.priority,  # type: ignore[arg-type]
            lifecycle=member.lifecycle,  # type: ignore[arg-type]
            resources=resources,
            restartable=False,
        )
        reply = self.stub.Probe(
            agent_pb2.ProbeRequest(
                job_id=spec.job_id,
                resources=resources,
                priority=spec.priority,
                commit_if_fits=True,
                spec=spec,
            ),
            timeout=30,
        )
        if reply.subjob.state != common_pb2.RUNNING:
            raise Unavailable(f"subjob {subjob_id} did not start: {reply}")

    def subjob(self, subjob_id: str) -> common_pb2.Subjob:
        return self.stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id=subjob_id), timeout=10)


def _wait(predicate: Callable[[], bool], timeout_seconds: float, what: str) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise Unavailable(f"timed out after {timeout_seconds:.0f} s waiting for {what}")
        time.sleep(0.02)  # polling a daemon over gRPC, bounded by the deadline


@dataclass
class Tally:
    """Outcomes of one policy over every trial."""

    reaction_seconds: list[float]
    killed_by_class: dict[str, int]
    suspended: int = 0
    subjobs: int = 0
    high_priority_lost_gpu_seconds: float = 0.0
    all_lost_gpu_seconds: float = 0.0

    @classmethod
    def empty(cls) -> Tally:
        return cls([], {name: 0 for name in PRIORITY_NAMES.values()})

    def account(
        self,
        agent: BenchAgent,
        members: dict[str, Member],
        actions: list[agent_pb2.AirlockAction],
    ) -> None:
        self.subjobs += len(members)
        self.suspended += len({a.subjob_id for a in actions if a.step == "suspend"})
        for subjob_id, member in members.items():
            subjob = agent.subjob(subjob_id)
            if (
                subjob.state != common_pb2.KILLED
                or end_cause(subjob.end_cause) is not EndCause.RECLAIMED
            ):
                continue
            name = PRIORITY_NAMES.get(member.priority, str(member.priority))
            self.killed_by_class[name] = self.killed_by_class.get(name, 0) + 1
            ran = max(0.0, subjob.ended_unix - subjob.started_unix) - subjob.suspended_seconds
            lost = max(0.0, ran) * member.gpu_milli / 1000.0
            self.all_lost_gpu_seconds += lost
            if member.priority in HIGH_PRIORITY:
                self.high_priority_lost_gpu_seconds += lost

    def report(self) -> dict[str, Any]:
        ms = [1000.0 * r for r in self.reaction_seconds]
        return {
            "subjobs": self.subjobs,
            "killed": sum(self.killed_by_class.values()),
            "killed_by_class": self.killed_by_class,
            "suspended": self.suspended,
            "high_priority_work_lost_gpu_seconds": round(self.high_priority_lost_gpu_seconds, 3),
            "all_work_lost_gpu_seconds": round(self.all_lost_gpu_seconds, 3),
            "reaction_samples": len(ms),
            "reaction_p50_ms": round(percentile(ms, 0.50), 1) if ms else None,
            "reaction_p99_ms": round(percentile(ms, 0.99), 1) if ms else None,
            "reaction_max_ms": round(max(ms), 1) if ms else None,
        }


def _step_members(gate: Path) -> list[Member]:
    code = (
        f"import os,time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
        "raise SystemExit(0)"
    )
    command = (sys.executable, "-c", code)
    return [
        Member("crit", common_pb2.CRITICAL, common_pb2.RESIDENT, 30 * GIB, 300, command),
        Member("prod", common_pb2.PRODUCTION, common_pb2.RESIDENT, 20 * GIB, 300, command),
        Member("batch", common_pb2.BATCH, common_pb2.LONG, 10 * GIB, 200, command),
        Member("opp", common_pb2.OPPORTUNISTIC, common_pb2.TRANSIENT, 10 * GIB, 200, command),
    ]


def _finish_trial(agent: BenchAgent, gate: Path, subjob_ids: list[str], timeout: float) -> None:
    agent.inject(0)
    gate.write_text("go")
    _wait(
        lambda: all(agent.subjob(s).state in TERMINAL for s in subjob_ids),
        timeout,
        "the trial's subjobs to end",
    )
    # The next trial starts on a GPU Airlock reads idle: the agent admits new work by its
    # latest reading (AgentCore.pressure_refusal), whose pressure level lags the ends by up
    # to one poll (an ended subjob's memory leaves the reading at once).
    _wait(agent.reads_idle, timeout, "Airlock to read the GPU idle")


def run_step_trials(
    agent: BenchAgent, spec: AirlockBenchSpec, root: Path, tally: Tally, tick: Callable[[], None]
) -> None:
    """Injected pressure over 100 %: reaction time and who pays for it."""
    for trial in range(spec.trials):
        gate = root / f"{agent.state_dir.name}-step-{trial}.gate"
        members = {f"s{trial}-{m.name}": m for m in _step_members(gate)}
        for subjob_id, member in members.items():
            agent.start(subjob_id, member)
        time.sleep(spec.warmup_seconds)  # the work that a kill would lose
        before = agent.last_action_seq()
        injected_at = time.time()
        agent.inject(20 * GIB)  # 70 GiB declared + 20 = 90 GiB on an 80 GiB GPU

        def acted(mark: int = before) -> bool:
            return bool(agent.actions_after(mark))

        _wait(acted, 30, "the first Airlock action")
        first = agent.actions_after(before)[0]
        tally.reaction_seconds.append(max(0.0, first.at_unix - injected_at))
        time.sleep(spec.settle_seconds)  # let the policy finish its round(s)
        actions = agent.actions_after(before)
        tally.account(agent, members, actions)
        _finish_trial(agent, gate, list(members), 60)
        tick()


def run_genai(
    agent: BenchAgent, spec: AirlockBenchSpec, root: Path, tally: Tally, tick: Callable[[], None]
) -> list[dict[str, Any]]:
    """Real GPU-memory curves of pods sharing one GPU, replayed in compressed time."""
    assert spec.trace_dir is not None
    curves = load_memory_curves(spec.trace_dir)
    groups = []
    classes = [
        ("crit", common_pb2.CRITICAL, common_pb2.RESIDENT),
        ("prod", common_pb2.PRODUCTION, common_pb2.LONG),
        ("opp", common_pb2.OPPORTUNISTIC, common_pb2.TRANSIENT),
    ]
    for seed in range(spec.genai_groups):
        group = choose_sharing_group(
            curves,
            members=3,
            gpu_total_bytes=GPU_TOTAL_BYTES,
            window=spec.genai_window,
            seed=seed,
            peak_above_ratio=1.0,
        )
        groups.append({"seed": seed, "pods": list(group.pods), "start_index": group.start_index})
        gate = root / f"{agent.state_dir.name}-genai-{seed}.gate"
        members: dict[str, Member] = {}
        for (name, priority, lifecycle), curve in zip(classes, group.curves, strict=True):
            path = root / f"genai-{seed}-{name}.json"
            path.write_text(
                json.dumps({"step_seconds": spec.genai_step_seconds, "used_bytes": list(curve)})
            )
            command = (
                sys.executable,
                "-m",
                "laminar_bench.memcurve",
                str(path),
                "--gate",
                str(gate),
            )
            members[f"g{seed}-{name}"] = Member(name, priority, lifecycle, min(curve), 300, command)
        before = agent.last_action_seq()
        for subjob_id, member in members.items():
            agent.start(subjob_id, member)
        time.sleep(spec.genai_window * spec.genai_step_seconds + spec.settle_seconds)
        tally.account(agent, members, agent.actions_after(before))
        _finish_trial(agent, gate, list(members), 60)
        tick()
    return groups


def run_airlock_bench(spec: AirlockBenchSpec, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Both policies, step trials then GenAI replays; the JSON report."""
    spec.validate()
    started = time.time()
    genai = spec.trace_dir is not None and spec.genai_groups > 0
    total = len(POLICIES) * (spec.trials + (spec.genai_groups if genai else 0))
    done = [0]

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress("trials", done[0], total)

    results: dict[str, Any] = {}
    groups: list[dict[str, Any]] = []
    with _work_dir(spec.work_dir) as root:
        for policy in POLICIES:
            agent = BenchAgent(root, policy, spec.poll_seconds)
            try:
                step = Tally.empty()
                run_step_trials(agent, spec, root, step, tick)
                entry: dict[str, Any] = {"step": step.report()}
                if genai:
                    replay = Tally.empty()
                    groups = run_genai(agent, spec, root, replay, tick)
                    entry["genai"] = replay.report()
                results[policy] = entry
            finally:
                agent.stop()
    ladder, oom = results["ladder"]["step"], results["oom-killer"]["step"]
    return {
        "benchmark": "airlock",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "environment": environment(),
        "gpu": FAKE_GPUS,
        "poll_seconds": spec.poll_seconds,
        "trials": spec.trials,
        "warmup_seconds": spec.warmup_seconds,
        "genai_trace": str(spec.trace_dir) if genai else None,
        "genai_groups": groups,
        "genai_step_seconds": spec.genai_step_seconds if genai else None,
        "policies": results,
        "reaction_p50_ratio_oom_to_ladder": (
            round(oom["reaction_p50_ms"] / ladder["reaction_p50_ms"], 2)
            if ladder["reaction_p50_ms"]
            else None
        ),
        "reaction_definition": (
            "from the injection that takes the GPU over 100% (crossing every mark at once) to "
            "the agent's first journaled action, both wall clocks of this machine"
        ),
        "work_lost_definition": (
            "GPU-seconds run (not counting time suspended) by subjobs ended with "
            "airlock_reclaimed, times their GPU share; high priority = critical + production"
        ),
        "elapsed_seconds": round(time.time() - started, 1),
    }


@contextlib.contextmanager
def _work_dir(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="laminar-bench-airlock-") as tmp:
        yield Path(tmp)
