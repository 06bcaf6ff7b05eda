"""Airlock in a running agent: priority preemption, dry run, reclamation, host-memory relief.

Preemption, dry run and reclamation run real agent processes (configured through
``LAMINAR_AIRLOCK_*`` in their environment); host-memory relief runs the agent
in-process on 127.0.0.1:0 so the test can feed it a host-memory signal. Subjobs
are real child processes in every case. The GPU-pressure scenarios run on the fake
backend and on the nvml backend over the mocked NVML (:mod:`gpu_backends`).
"""

from __future__ import annotations

import asyncio
import sys
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from gpu_backends import BACKENDS, GpuHost
from prometheus_client.parser import text_string_to_metric_families
from waiting import gate_code, until, wait_for

from laminar_agent.config import AgentConfig
from laminar_agent.server import AgentServer
from laminar_airlock.signals import HostMemory
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from laminar_base.configlib import load_config
from laminar_cli.cluster import AgentProcess, LocalCluster

GIB = 1024**3
TERMINAL = {common_pb2.SUCCEEDED, common_pb2.FAILED, common_pb2.KILLED, common_pb2.LOST}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path) as c:
        yield c


def _subjob(stub: agent_pb2_grpc.AgentStub, subjob_id: str) -> common_pb2.Subjob:
    return stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id=subjob_id), timeout=10)


def _spec(
    subjob_id: str,
    priority: int,
    resources: common_pb2.Resources,
    gate: Path,
    host: GpuHost | None = None,
    **extra: object,
) -> common_pb2.SubjobSpec:
    """A subjob that waits for ``gate``; on ``host``, using the memory it declares."""
    code = gate_code(gate)
    return common_pb2.SubjobSpec(
        subjob_id=subjob_id,
        job_id=f"job-{subjob_id}",
        command=(
            host.command(code, resources.gpu_memory_bytes) if host else [sys.executable, "-c", code]
        ),
        priority=priority,  # type: ignore[arg-type]
        resources=resources,
        **extra,  # type: ignore[arg-type]
    )


def _run_now(stub: agent_pb2_grpc.AgentStub, spec: common_pb2.SubjobSpec) -> common_pb2.Subjob:
    reply = stub.Probe(
        agent_pb2.ProbeRequest(
            job_id=spec.job_id,
            resources=spec.resources,
            priority=spec.priority,
            commit_if_fits=True,
            spec=spec,
        ),
        timeout=10,
    )
    assert reply.subjob.state == common_pb2.RUNNING, reply
    return reply.subjob


def _seen(stub: agent_pb2_grpc.AgentStub, *subjob_ids: str) -> None:
    """Wait until the backend sees each subjob use what it declares (NVML: its process)."""

    def seen_all() -> bool:
        subjobs = [_subjob(stub, s) for s in subjob_ids]
        return all(s.gpu_memory_used_bytes == s.spec.resources.gpu_memory_bytes for s in subjobs)

    wait_for(seen_all)


def _metric(agent: AgentProcess, name: str, **labels: str) -> float:
    body = urllib.request.urlopen(f"http://{agent.metrics_address}/metrics", timeout=10).read()
    total = 0.0
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _actions(stub: agent_pb2_grpc.AgentStub) -> list[agent_pb2.AirlockAction]:
    state = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=100), timeout=10)
    return list(state.recent_actions)


# ---- priority preemption ----


def test_preemption_reclaims_lower_class_before_granting(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    agent = cluster.start_agent("h", "1xA100-40GB")
    gate = tmp_path / "gate"
    gpu = common_pb2.Resources(gpus=1)
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        _run_now(stub, _spec("opp", common_pb2.OPPORTUNISTIC, gpu, gate))

        # Without allow_preemption a production probe just bounces; nothing is touched.
        plain = stub.Probe(
            agent_pb2.ProbeRequest(job_id="prod", resources=gpu, priority=common_pb2.PRODUCTION),
            timeout=10,
        )
        assert plain.WhichOneof("outcome") == "bounce" and plain.bounce.retryable
        assert not plain.preempted_subjob_ids
        assert _subjob(stub, "opp").state == common_pb2.RUNNING

        # Three concurrent production probes that allow preemption: one lease, no overcommit.
        async def race() -> list[agent_pb2.ProbeReply]:
            async with grpc.aio.insecure_channel(agent.address) as aio:
                astub = agent_pb2_grpc.AgentStub(aio)
                return list(
                    await asyncio.gather(
                        *(
                            astub.Probe(
                                agent_pb2.ProbeRequest(
                                    probe_id=f"p{i}",
                                    job_id=f"prod-{i}",
                                    resources=gpu,
                                    priority=common_pb2.PRODUCTION,
                                    allow_preemption=True,
                                    lease_ttl_seconds=10,
                                ),
                                timeout=30,
                            )
                            for i in range(3)
                        )
                    )
                )

        replies = asyncio.run(race())
        leases = [r for r in replies if r.WhichOneof("outcome") == "lease"]
        assert len(leases) == 1, replies
        (won,) = leases
        assert list(won.preempted_subjob_ids) == ["opp"]
        for lost in (r for r in replies if r is not won):
            assert lost.WhichOneof("outcome") == "bounce" and lost.bounce.retryable
        # The lease came only after the victim ended and released the GPU.
        victim = _subjob(stub, "opp")
        assert victim.state == common_pb2.KILLED
        job = won.lease.job_id
        assert victim.reason.startswith(f"preempted: by job {job} (production) needing gpu0")
        assert "opportunistic" in victim.reason and "40.0 GiB" in victim.reason
        actions = [a for a in _actions(stub) if a.subjob_id == "opp"]
        assert [(a.step, a.dry_run) for a in actions] == [("reclaim", False)]
        assert actions[0].reason.startswith("preempted:") and actions[0].bytes_freed == 40 * GIB
        assert (
            _metric(agent, "laminar_airlock_actions_total", step="reclaim", reason="preempted") == 1
        )

        # The winner's lease is real: commit a critical subjob on it.
        crit = _spec("crit", common_pb2.CRITICAL, gpu, gate)
        committed = stub.Commit(
            agent_pb2.CommitRequest(lease_id=won.lease.lease_id, spec=crit), timeout=10
        )
        assert committed.state == common_pb2.RUNNING

        # A critical subjob is never preempted for production work, nor equal classes.
        for priority in (common_pb2.PRODUCTION, common_pb2.CRITICAL):
            reply = stub.Probe(
                agent_pb2.ProbeRequest(
                    job_id="again", resources=gpu, priority=priority, allow_preemption=True
                ),
                timeout=30,
            )
            assert reply.WhichOneof("outcome") == "bounce"
            assert "no lower-priority work" in reply.bounce.reason
            assert not reply.preempted_subjob_ids
        assert _subjob(stub, "crit").state == common_pb2.RUNNING
        gate.write_text("go")
        wait_for(lambda: _subjob(stub, "crit").state in TERMINAL)
        assert _subjob(stub, "crit").state == common_pb2.SUCCEEDED


# ---- dry run ----


@pytest.mark.parametrize("backend", BACKENDS)
def test_dry_run_records_decisions_but_does_not_act(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    monkeypatch.setenv("LAMINAR_AIRLOCK_DRY_RUN", "true")
    host = GpuHost(backend, tmp_path / "gpus")
    agent = host.start(cluster, "h")
    gate = tmp_path / "gate"
    share = common_pb2.Resources(gpu_milli=400, gpu_memory_bytes=20 * GIB)
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        _run_now(stub, _spec("opp", common_pb2.OPPORTUNISTIC, share, gate, host))
        _seen(stub, "opp")
        host.inject(agent, 70 * GIB)

        def suspend_recorded() -> bool:
            return any(a.step == "suspend" and a.subjob_id == "opp" for a in _actions(stub))

        wait_for(suspend_recorded)
        state = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=100), timeout=10)
        assert state.dry_run
        (suspend,) = [a for a in state.recent_actions if a.step == "suspend"]
        assert suspend.dry_run and "80.0 GiB of 80.0 GiB" in suspend.reason
        assert not state.suspended
        assert _subjob(stub, "opp").state == common_pb2.RUNNING

        # A preemption in dry run is recorded too, and the probe bounces without a victim.
        reply = stub.Probe(
            agent_pb2.ProbeRequest(
                job_id="prod",
                resources=common_pb2.Resources(gpus=1),
                priority=common_pb2.PRODUCTION,
                allow_preemption=True,
            ),
            timeout=30,
        )
        assert reply.WhichOneof("outcome") == "bounce"
        assert "airlock dry-run: would preempt opp" in reply.bounce.reason
        assert not reply.preempted_subjob_ids
        reclaims = [a for a in _actions(stub) if a.step == "reclaim"]
        assert len(reclaims) == 1 and reclaims[0].dry_run
        assert reclaims[0].reason.startswith("preempted: by job prod (production)")

        # A decision that stays the same is recorded once, not on every 100 ms tick.
        def critical_for_a_while() -> bool:
            seconds = _metric(
                agent, "laminar_airlock_level_seconds_total", kind="shared_gpu", level="critical"
            )
            return seconds >= 1.0

        wait_for(critical_for_a_while)
        assert [a.step for a in _actions(stub) if a.subjob_id == "opp"] == ["suspend", "reclaim"]
        assert _subjob(stub, "opp").state == common_pb2.RUNNING
        dry = _metric(agent, "laminar_airlock_actions_total", step="suspend", dry_run="true")
        assert dry == 1
        assert _metric(agent, "laminar_airlock_freed_bytes_total") == 0
        gate.write_text("go")
        wait_for(lambda: _subjob(stub, "opp").state in TERMINAL)
        assert _subjob(stub, "opp").state == common_pb2.SUCCEEDED


# ---- reclamation when the re-addressing budget is spent ----


@pytest.mark.parametrize("backend", BACKENDS)
def test_spent_readdress_budget_is_reclaimed_with_the_numbers(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    monkeypatch.setenv("LAMINAR_AIRLOCK_READDRESS_AFTER_SECONDS", "0.3")
    host = GpuHost(backend, tmp_path / "gpus")
    agent = host.start(cluster, "h")
    gate = tmp_path / "gate"
    share = common_pb2.Resources(gpu_milli=400, gpu_memory_bytes=20 * GIB)
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        _run_now(stub, _spec("crit", common_pb2.CRITICAL, share, gate, host))
        # Its job was already moved twice (the router says so in the copy's environment).
        moved = _spec(
            "moved",
            common_pb2.OPPORTUNISTIC,
            share,
            gate,
            host,
            restartable=True,
            env={"LAMINAR_READDRESS_COUNT": "2"},
        )
        _run_now(stub, moved)
        _seen(stub, "crit", "moved")
        host.inject(agent, 40 * GIB)
        wait_for(lambda: _subjob(stub, "moved").state in TERMINAL)
        ended = _subjob(stub, "moved")
        assert ended.state == common_pb2.KILLED
        assert ended.reason.startswith("airlock_reclaimed: suspended ")
        assert ended.end_cause == common_pb2.END_CAUSE_RECLAIMED
        assert "readdress budget spent (2/2)" in ended.reason
        steps = [a.step for a in _actions(stub) if a.subjob_id == "moved"]
        assert steps == ["suspend", "reclaim"]
        assert _subjob(stub, "crit").state == common_pb2.RUNNING
        lost = _metric(agent, "laminar_airlock_work_lost_gpu_seconds_total", reason="deadline")
        assert lost > 0
        gate.write_text("go")
        wait_for(lambda: _subjob(stub, "crit").state in TERMINAL)


# ---- host-memory relief (in-process agent with a modelled host signal) ----


class ModelHost:
    """Host memory that a subjob "holds": ``held_bytes`` count while ``holder()`` is true."""

    def __init__(self, base_bytes: int, total_bytes: int) -> None:
        self.base_bytes = base_bytes
        self.total_bytes = total_bytes
        self.held_bytes = 0
        self.holder: Callable[[], bool] = lambda: False

    def read(self) -> HostMemory:
        held = self.held_bytes if self.holder() else 0
        return HostMemory(self.base_bytes + held, self.total_bytes, None)


@asynccontextmanager
async def in_process_agent(
    tmp_path: Path, fake_gpus: str, host: ModelHost, **airlock: object
) -> AsyncIterator[AgentServer]:
    overrides: dict[str, object] = {
        "server.listen": "127.0.0.1:0",
        "server.state_dir": str(tmp_path / "agent"),
        "server.agent_id": "inproc",
        "inventory.gpu_backend": "fake",
        "inventory.fake_gpus": fake_gpus,
        "executor.run_as_user": "",  # subjobs write into tmp_path, which only root may enter
    }
    overrides.update({f"airlock.{k}": v for k, v in airlock.items()})
    server = AgentServer(load_config(AgentConfig, overrides=overrides), host_memory=host)
    await server.start()
    try:
        yield server
    finally:
        assert server.state is not None
        node = server.state.node
        for subjob_id in list(node.live_states):  # no orphans, whatever the test did
            await node.signal(subjob_id, agent_pb2.TERMINATE, "test over", 2.0)
        await server.stop()


async def test_host_memory_pressure_reclaims_lowest_class(tmp_path: Path) -> None:
    host = ModelHost(base_bytes=50 * GIB, total_bytes=100 * GIB)
    gate = tmp_path / "gate"
    share = common_pb2.Resources(gpu_milli=100, gpu_memory_bytes=GIB)
    async with in_process_agent(tmp_path, "1xA100-80GB:shared", host, hold_seconds=0.2) as server:
        assert server.state is not None
        node = server.state.node
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            for subjob_id, priority in (
                ("crit", common_pb2.CRITICAL),
                ("opp", common_pb2.OPPORTUNISTIC),
            ):
                spec = _spec(subjob_id, priority, share, gate)
                reply = await stub.Probe(
                    agent_pb2.ProbeRequest(
                        job_id=spec.job_id,
                        resources=share,
                        priority=priority,  # type: ignore[arg-type]
                        commit_if_fits=True,
                        spec=spec,
                    ),
                    timeout=10,
                )
                assert reply.subjob.state == common_pb2.RUNNING
            # The opportunistic subjob now "holds" 45 GiB: the host is at 95% (ELEVATED).
            host.held_bytes = 45 * GIB
            host.holder = lambda: "opp" in node.live_states
            await until(lambda: "opp" not in node.live_states)
            ended = await stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="opp"), timeout=10)
            assert ended.state == common_pb2.KILLED
            assert ended.reason.startswith(
                "airlock_reclaimed: host memory at 95.0 GiB of 100.0 GiB (95.0%) > elevated mark"
            )
            state = await stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=50), timeout=10)
            (action,) = [a for a in state.recent_actions if a.subjob_id == "opp"]
            assert (action.step, action.slice_id, action.dry_run) == ("reclaim", "host", False)
            assert action.bytes_freed > 0  # the real RSS of the subjob's processes
            # Relief stops once the host is below target; the critical subjob keeps running
            # through the whole episode, until the host is back to NORMAL.
            await until(lambda: server.state is not None and int(server.state.host_level) == 1)
            state = await stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=50), timeout=10)
            assert state.host_memory_total_bytes == 100 * GIB
            assert [a.subjob_id for a in state.recent_actions] == ["opp"]
            crit = await stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="crit"), timeout=10)
            assert crit.state == common_pb2.RUNNING
            metrics = server.state.metrics
            reclaims = metrics.airlock_actions_total.labels("reclaim", "host_pressure", "false")
            assert reclaims._value.get() == 1
            gate.write_text("go")
            await until(lambda: "crit" not in node.live_states)


# ---- cooperative release, once per episode; slice names and job ids in the audit ----

#: A subjob that declares the release signal, counts each SIGUSR1 and never frees anything.
_STUBBORN = (
    "import os,signal,time\n"
    "count=os.path.join(os.path.dirname(os.environ['LAMINAR_GPU_MEM_FILE']),'usr1')\n"
    "def on_usr1(*_):\n"
    "    with open(count,'a') as f: f.write('x')\n"
    "signal.signal(signal.SIGUSR1,on_usr1)\n"
    "open(count + '.ready','w').close()\n"
    "while True: time.sleep(0.05)\n"
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_release_memory_is_sent_once_then_reclaimed_with_slice_names(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    monkeypatch.setenv("LAMINAR_AIRLOCK_RELEASE_WAIT_SECONDS", "1.0")
    monkeypatch.setenv("LAMINAR_AIRLOCK_RECLAIM_GRACE_SECONDS", "0.5")
    host = GpuHost(backend, tmp_path / "gpus")
    agent = host.start(cluster, "h")
    share = common_pb2.Resources(gpu_milli=400, gpu_memory_bytes=20 * GIB)
    spec = _spec("stub", common_pb2.OPPORTUNISTIC, share, tmp_path / "gate")
    spec.supports_release_signal = True
    del spec.command[:]
    spec.command.extend(host.command(_STUBBORN, share.gpu_memory_bytes))
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        _run_now(stub, spec)
        # Pressure only once its handler is installed: SIGUSR1 before that would kill it.
        ready = Path(agent.state_dir) / "subjobs" / "stub" / "usr1.ready"
        wait_for(ready.exists)
        _seen(stub, "stub")
        # 57 + 20 GiB: above the critical mark, so that relief is needed whatever the trend
        # (at the elevated mark, a flat trend after the jump would call for none).
        host.inject(agent, 57 * GIB)
        wait_for(lambda: _subjob(stub, "stub").state in TERMINAL)
        subjob = _subjob(stub, "stub")
        assert subjob.state == common_pb2.KILLED, subjob.reason
        assert subjob.reason.startswith("airlock_reclaimed: ")
        assert subjob.end_cause == common_pb2.END_CAUSE_RECLAIMED
        assert "asked to release memory" in subjob.reason
        steps = [(a.step, a.slice_id, a.job_id) for a in _actions(stub) if a.subjob_id == "stub"]
        assert steps == [("release_memory", "gpu0", "job-stub"), ("reclaim", "gpu0", "job-stub")]
        usr1 = Path(agent.state_dir) / "subjobs" / "stub" / "usr1"
        state = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=10), timeout=10)
        assert [s.slice_id for s in state.slices] == ["gpu0"]
    signals = usr1.read_text() if usr1.exists() else ""
    assert signals == "x", f"SIGUSR1 sent {len(signals)} times, once expected"


# ---- a backend where a stop frees nothing (NVML without cuda-checkpoint) ----


async def test_without_checkpoint_a_stop_is_not_relief_so_the_victim_is_reclaimed(
    tmp_path: Path,
) -> None:
    host = ModelHost(base_bytes=10 * GIB, total_bytes=100 * GIB)
    share = common_pb2.Resources(gpu_milli=400, gpu_memory_bytes=20 * GIB)
    async with in_process_agent(
        tmp_path, "1xA100-80GB:shared", host, reclaim_grace_seconds=0.5
    ) as server:
        assert server.state is not None
        server.state.backend.frees_memory_on_suspend = False  # type: ignore[misc]
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            spec = _spec("opp", common_pb2.OPPORTUNISTIC, share, tmp_path / "gate")
            reply = await stub.Probe(
                agent_pb2.ProbeRequest(
                    job_id=spec.job_id, resources=share, commit_if_fits=True, spec=spec
                ),
                timeout=10,
            )
            assert reply.subjob.state == common_pb2.RUNNING
            await stub.InjectLoad(
                agent_pb2.InjectLoadRequest(gpu_index=0, used_bytes=60 * GIB), timeout=10
            )
            terminal = {common_pb2.KILLED, common_pb2.FAILED, common_pb2.SUCCEEDED}
            node = server.state.node

            def ended() -> bool:
                return "opp" not in node.live_states

            await until(ended)
            subjob = await stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="opp"), timeout=10)
            assert subjob.state in terminal and subjob.state == common_pb2.KILLED
            assert "a stop frees nothing, so it is reclaimed" in subjob.reason
            state = await stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=10), timeout=10)
            assert [a.step for a in state.recent_actions] == ["reclaim"]
