"""Airlock wired into a real agent: injected pressure suspends the lowest class, then resumes;
on the fake backend and on the nvml backend over the mocked NVML (:mod:`gpu_backends`)."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from gpu_backends import BACKENDS, GpuHost
from prometheus_client.parser import text_string_to_metric_families
from test_airlock_agent import _seen
from waiting import gate_code, wait_for

from laminar_agent.airlock_driver import HELD_META
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from laminar_cli.cluster import AgentProcess, LocalCluster

GIB = 1024**3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path) as c:
        yield c


def _state(stub: agent_pb2_grpc.AgentStub, subjob_id: str) -> int:
    request = agent_pb2.GetSubjobRequest(subjob_id=subjob_id)
    return int(stub.GetSubjob(request, timeout=10).state)


def _commit(
    stub: agent_pb2_grpc.AgentStub,
    subjob_id: str,
    priority: int,
    gate: Path,
    host: GpuHost | None = None,
    *,
    restartable: bool = False,
) -> common_pb2.Subjob:
    resources = common_pb2.Resources(gpu_milli=300, gpu_memory_bytes=20 * GIB)
    code = gate_code(gate)
    spec = common_pb2.SubjobSpec(
        subjob_id=subjob_id,
        job_id=f"job-{subjob_id}",
        command=host.command(code, 20 * GIB) if host else [sys.executable, "-c", code],
        priority=priority,  # type: ignore[arg-type]
        resources=resources,
        restartable=restartable,
    )
    reply = stub.Probe(
        agent_pb2.ProbeRequest(
            job_id=spec.job_id, resources=resources, commit_if_fits=True, spec=spec
        ),
        timeout=10,
    )
    assert reply.subjob.state == common_pb2.RUNNING
    return reply.subjob


@pytest.mark.parametrize("backend", BACKENDS)
def test_pressure_suspends_opportunistic_and_resumes(
    cluster: LocalCluster, tmp_path: Path, backend: str
) -> None:
    host = GpuHost(backend, tmp_path / "gpus")
    agent = host.start(cluster, "h")
    gate = tmp_path / "gate"
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        _commit(stub, "crit", common_pb2.CRITICAL, gate, host)
        _commit(stub, "opp", common_pb2.OPPORTUNISTIC, gate, host)
        _seen(stub, "crit", "opp")  # what the backend sees each use (NVML: its process)

        host.inject(agent, 40 * GIB)
        wait_for(lambda: _state(stub, "opp") == common_pb2.SUSPENDED)
        assert _state(stub, "crit") == common_pb2.RUNNING
        airlock = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=20), timeout=10)
        suspends = [a for a in airlock.recent_actions if a.step == "suspend"]
        assert [a.subjob_id for a in suspends] == ["opp"]
        assert suspends[0].bytes_freed == 20 * GIB
        assert (suspends[0].slice_id, suspends[0].job_id) == ("gpu0", "job-opp")
        assert [s.slice_id for s in airlock.slices] == ["gpu0"]
        assert "80.0 GiB of 80.0 GiB" in suspends[0].reason
        assert [s.spec.subjob_id for s in airlock.suspended] == ["opp"]

        host.inject(agent, 0)
        wait_for(lambda: _state(stub, "opp") == common_pb2.RUNNING)
        airlock = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=20), timeout=10)
        assert any(a.step == "resume" and a.subjob_id == "opp" for a in airlock.recent_actions)
        # Its memory comes back once it runs again (nvml: cuda-checkpoint restores a
        # continued process).
        wait_for(
            lambda: (
                stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10)
                .gpus[0]
                .memory_used_bytes
                == 40 * GIB
            )
        )

        gate.write_text("go")
        terminal = {common_pb2.SUCCEEDED, common_pb2.FAILED, common_pb2.KILLED}
        for subjob_id in ("crit", "opp"):
            wait_for(lambda sid=subjob_id: _state(stub, sid) in terminal)  # type: ignore[misc]
            assert _state(stub, subjob_id) == common_pb2.SUCCEEDED


def _checkpointed_opp(
    cluster: LocalCluster, tmp_path: Path, *, hold_copy: bool = False
) -> tuple[GpuHost, AgentProcess, Path, int]:
    """An nvml agent whose "opp" (beside a critical "crit", 20 GiB each, both waiting on
    the returned gate) Airlock has suspended through cuda-checkpoint; and opp's pid. With
    ``hold_copy`` the stand-in's copy goes on (``host.hold_checkpoint``): it returns once
    the copy has begun, opp still running."""
    host = GpuHost("nvml", tmp_path / "gpus")
    agent = host.start(cluster, "h")
    gate = tmp_path / "gate"
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        _commit(stub, "crit", common_pb2.CRITICAL, gate, host)
        pid = _commit(stub, "opp", common_pb2.OPPORTUNISTIC, gate, host).pid
        _seen(stub, "crit", "opp")
        if hold_copy:
            host.hold_checkpoint.write_text("")
        host.inject(agent, 40 * GIB)
        if hold_copy:
            wait_for(host.checkpointing.exists)
        else:
            wait_for(lambda: _state(stub, "opp") == common_pb2.SUSPENDED)
    return host, agent, gate, pid


def _ten_minutes_ago(agent: AgentProcess) -> None:
    """What the stopped agent's journal would say had it been down ten minutes: every event
    and Airlock action it journaled happened 600 s earlier."""
    with sqlite3.connect(agent.state_dir / "agent.db") as db:
        suspends = db.execute(
            "UPDATE events SET at_unix = at_unix - 600 WHERE state='SUSPENDED'"
        ).rowcount
        db.execute("UPDATE events SET at_unix = at_unix - 600 WHERE state!='SUSPENDED'")
        db.execute("UPDATE airlock_actions SET at_unix = at_unix - 600")
    assert suspends >= 1


def test_a_restarted_agent_still_restores_what_it_checkpointed(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """An upgrade while Airlock holds a subjob's CUDA state in host memory: the restarted
    agent resumes it *and* restores its state (a continued process whose state stays on
    the host would wait in its next CUDA call forever)."""
    host, agent, gate, pid = _checkpointed_opp(cluster, tmp_path)

    def listed() -> list[str]:  # its GPU process entry: on the GPU, or moved to the host
        names = (str(pid), f"{pid}.checkpointed")
        return [p.name for p in host.pid_dir.glob("*/*") if p.name in names]

    assert listed() == [f"{pid}.checkpointed"]
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(20) == 0
    # The agent stays down ten minutes, as far as its journal can tell: the suspension's
    # age (towards re-addressing and reclaim) counts from the suspend, not the restart.
    _ten_minutes_ago(agent)

    restarted = host.start(cluster, "h")  # the pressure is gone on this start
    with grpc.insecure_channel(restarted.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        wait_for(lambda: _state(stub, "opp") == common_pb2.RUNNING)
        # It came back counted at the 20 GiB it held (crit's 20 + 20), not the 0 NVML
        # reads for a process whose state is on the host.
        airlock = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=20), timeout=10)
        resumes = [a.reason for a in airlock.recent_actions if a.step == "resume"]
        assert len(resumes) == 1 and "projected 40.0 GiB of 80.0 GiB" in resumes[0], resumes
        waited = float(re.search(r"after ([0-9.]+)s suspended", resumes[0]).group(1))  # type: ignore[union-attr]
        assert waited >= 600.0, resumes
        wait_for(lambda: listed() == [str(pid)])
        gate.write_text("go")
        terminal = {common_pb2.SUCCEEDED, common_pb2.FAILED, common_pb2.KILLED}
        for subjob_id in ("crit", "opp"):
            wait_for(lambda sid=subjob_id: _state(stub, sid) in terminal)  # type: ignore[misc]
            assert _state(stub, subjob_id) == common_pb2.SUCCEEDED


def test_reclaiming_a_checkpointed_subjob_frees_nothing_more_on_the_gpu(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """A subjob whose CUDA state cuda-checkpoint moved to the host is counted at what it
    holds while suspended (its resume takes that back), but its reclaim frees none of it on
    the GPU: the suspend's 20 GiB were counted once, by the suspend."""
    host, agent, gate, _ = _checkpointed_opp(cluster, tmp_path)
    assert _freed(agent) == 20 * GIB
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(20) == 0
    _ten_minutes_ago(agent)  # suspended ten minutes ago
    env = {
        "LAMINAR_AIRLOCK_READDRESS_AFTER_SECONDS": "30",
        "LAMINAR_AIRLOCK_READDRESS_DEADLINE_SECONDS": "60",
    }
    # No room to resume it (crit's 20 + 40 GiB, 20 more would pass the resume mark): it
    # waits, and is past its deadline already.
    restarted = host.start(cluster, "h", env=env, injected=40 * GIB)
    with grpc.insecure_channel(restarted.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        wait_for(lambda: _state(stub, "opp") == common_pb2.KILLED)
        airlock = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=20), timeout=10)
        reclaims = [a for a in airlock.recent_actions if a.step == "reclaim"]
        assert [a.subjob_id for a in reclaims] == ["opp"] and "reclaim after" in reclaims[0].reason
        assert reclaims[0].bytes_freed == 0
        assert _freed(restarted) == 0
        _finish(stub, gate, "crit")


@pytest.mark.parametrize("found", ["running", "locked"])
def test_a_restore_that_ended_unrecorded_is_not_undone(
    cluster: LocalCluster, tmp_path: Path, found: str
) -> None:
    """The journal says a running subjob's CUDA state is on the host, the tool says it is
    back (a restore ended as the agent was stopped; or the tool restored and had not
    unlocked yet). The restarted agent reads the state before it acts: a blind toggle
    would move the state of a running process to the host, and its CUDA calls would wait
    forever."""
    host, agent, gate, pid = _checkpointed_opp(cluster, tmp_path)
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(20) == 0
    resumed = host.start(cluster, "h")  # the pressure is gone: resumed and restored
    with grpc.insecure_channel(resumed.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        wait_for(lambda: _state(stub, "opp") == common_pb2.RUNNING and _restores(resumed) == 1)
    resumed.process.send_signal(signal.SIGTERM)
    assert resumed.process.wait(20) == 0
    # What the journal would say had the restore ended unrecorded.
    with sqlite3.connect(agent.state_dir / "agent.db") as db:
        held = json.dumps({"opp": {str(pid): 20 * GIB}})
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (HELD_META, held))
    if found == "locked":
        listed = next(host.pid_dir.glob(f"*/{pid}"))
        os.replace(listed, listed.with_name(f"{pid}.locked"))

    restarted = host.start(cluster, "h")

    def restores(outcome: str) -> float:
        labels = {"direction": "restore", "outcome": outcome}
        return _metric(restarted, "laminar_airlock_cuda_checkpoint_toggles_total", labels)

    with grpc.insecure_channel(restarted.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        wait_for(lambda: restores("ok") + restores("already") + restores("failed") >= 1)
        # running: nothing to do; locked: unlocked (its memory was on the GPU all along)
        assert (restores("already"), restores("ok")) == ((1, 0) if found == "running" else (0, 1))
        assert [p.name for p in host.pid_dir.glob(f"*/{pid}*")] == [str(pid)]
        _finish(stub, gate, "crit", "opp")


def _freed(agent: AgentProcess) -> float:
    """``laminar_airlock_freed_bytes_total{resource="gpu"}``."""
    return _metric(agent, "laminar_airlock_freed_bytes_total", {"resource": "gpu"})


def _metric(agent: AgentProcess, name: str, labels: dict[str, str]) -> float:
    body = urllib.request.urlopen(f"http://{agent.metrics_address}/metrics", timeout=10).read()
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def _restores(agent: AgentProcess) -> float:
    """``laminar_airlock_cuda_checkpoint_toggles_total{direction="restore",outcome="ok"}``."""
    return _metric(
        agent,
        "laminar_airlock_cuda_checkpoint_toggles_total",
        {"direction": "restore", "outcome": "ok"},
    )


def test_a_subjob_resumed_by_hand_gets_its_state_back(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """An operator's SignalSubjob(RESUME) of a subjob Airlock checkpointed continues it; the
    next poll restores its CUDA state (it would otherwise wait in its next CUDA call)."""
    _, agent, gate, _ = _checkpointed_opp(cluster, tmp_path)
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        assert _restores(agent) == 0
        stub.SignalSubjob(
            agent_pb2.SignalSubjobRequest(
                subjob_id="opp", signal=agent_pb2.RESUME, reason="operator"
            ),
            timeout=10,
        )
        # Restored at a poll (then, the pressure still there, suspended again).
        wait_for(lambda: _restores(agent) >= 1)
        gate.write_text("go")


def _signal(stub: agent_pb2_grpc.AgentStub, subjob_id: str, signal: int) -> None:
    request = agent_pb2.SignalSubjobRequest(subjob_id=subjob_id, signal=signal, reason="operator")
    stub.SignalSubjob(request, timeout=10)  # type: ignore[arg-type]


def _finish(stub: agent_pb2_grpc.AgentStub, gate: Path, *subjob_ids: str) -> None:
    """Open the gate the subjobs wait on; each ends with success."""
    gate.write_text("go")
    for subjob_id in subjob_ids:
        wait_for(lambda sid=subjob_id: _state(stub, sid) == common_pb2.SUCCEEDED)  # type: ignore[misc]


def _steps(stub: agent_pb2_grpc.AgentStub, subjob_id: str) -> list[str]:
    """Airlock's journaled actions on ``subjob_id``, oldest first."""
    airlock = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=200), timeout=10)
    return [a.step for a in airlock.recent_actions if a.subjob_id == subjob_id]


def _three(
    stub: agent_pb2_grpc.AgentStub, gate: Path, host: GpuHost, *, restartable: bool = False
) -> None:
    """crit (critical) and opp, w (opportunistic; opp ``restartable``), 20 GiB each."""
    _commit(stub, "crit", common_pb2.CRITICAL, gate, host)
    _commit(stub, "opp", common_pb2.OPPORTUNISTIC, gate, host, restartable=restartable)
    _commit(stub, "w", common_pb2.OPPORTUNISTIC, gate, host)
    _seen(stub, "crit", "opp", "w")


def _operator_suspends_opp(
    cluster: LocalCluster, tmp_path: Path, backend: str
) -> tuple[GpuHost, AgentProcess, Path]:
    """An agent on ``backend`` running :func:`_three`, where an operator suspended opp and
    then Airlock suspended w for pressure; the gate they wait on."""
    host = GpuHost(backend, tmp_path / "gpus")
    agent = host.start(cluster, "h")
    gate = tmp_path / "gate"
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        _three(stub, gate, host)
        _signal(stub, "opp", agent_pb2.SUSPEND)
        host.inject(agent, 20 * GIB)  # 80 of 80 GiB with opp's (it keeps its memory)
        wait_for(lambda: _state(stub, "w") == common_pb2.SUSPENDED)
    return host, agent, gate


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_operators_suspend_is_not_resumed_by_airlock(
    cluster: LocalCluster, tmp_path: Path, backend: str
) -> None:
    """SignalSubjob(SUSPEND) holds until the operator resumes it: a calm GPU does not resume
    it (Airlock took every SUSPENDED subjob for one it had suspended). The witness that the
    ladder ran on the calm GPU: "w", which Airlock suspended beside it, is resumed."""
    host, agent, gate = _operator_suspends_opp(cluster, tmp_path, backend)
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        host.inject(agent, 0)
        wait_for(lambda: _state(stub, "w") == common_pb2.RUNNING)
        assert _state(stub, "opp") == common_pb2.SUSPENDED
        assert _steps(stub, "opp") == [] and _steps(stub, "w") == ["suspend", "resume"]
        _signal(stub, "opp", agent_pb2.RESUME)
        _finish(stub, gate, "crit", "opp", "w")


def test_an_operators_suspend_outlives_a_restart_and_the_deadlines(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """After an agent restart the journal tells the operator's suspension from Airlock's:
    past every deadline Airlock reclaims its own ("w") and leaves the operator's alone."""
    host, agent, gate = _operator_suspends_opp(cluster, tmp_path, "nvml")
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(20) == 0
    _ten_minutes_ago(agent)
    env = {
        "LAMINAR_AIRLOCK_READDRESS_AFTER_SECONDS": "30",
        "LAMINAR_AIRLOCK_READDRESS_DEADLINE_SECONDS": "60",
    }
    restarted = host.start(cluster, "h", env=env, injected=20 * GIB)  # no room to resume w
    with grpc.insecure_channel(restarted.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        wait_for(lambda: _state(stub, "w") == common_pb2.KILLED)
        assert _state(stub, "opp") == common_pb2.SUSPENDED
        assert _steps(stub, "opp") == []
        _signal(stub, "opp", agent_pb2.RESUME)
        _finish(stub, gate, "crit", "opp")


def test_a_readdress_hand_off_outlives_a_restart(cluster: LocalCluster, tmp_path: Path) -> None:
    """A subjob handed to the zone router for re-addressing stays handed over after an agent
    restart: with the pressure gone it is not resumed in place (the router's copy would run
    beside it), nor handed over a second time (its lost work counted twice). The witness
    that the ladder ran on the calm GPU: "w", suspended beside it, is resumed."""
    host = GpuHost("nvml", tmp_path / "gpus")
    env = {
        "LAMINAR_AIRLOCK_READDRESS_AFTER_SECONDS": "0.5",
        "LAMINAR_AIRLOCK_READDRESS_DEADLINE_SECONDS": "600",
        "LAMINAR_AIRLOCK_LOSS_WAIT_RATIO": "0",
    }
    agent = host.start(cluster, "h", env=dict(env))
    gate = tmp_path / "gate"
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        _three(stub, gate, host, restartable=True)
        host.inject(agent, 40 * GIB)  # both opportunistic ones are needed: 100 -> 60 GiB
        wait_for(lambda: "readdress" in _steps(stub, "opp"))
        assert _state(stub, "w") == common_pb2.SUSPENDED  # not restartable: it waits
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(20) == 0
    restarted = host.start(cluster, "h", env=dict(env))  # the pressure is gone
    with grpc.insecure_channel(restarted.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        # w's restore ends its resume: a resume of opp in the same round would follow at
        # once, before the agent's loop answers another call.
        wait_for(lambda: _state(stub, "w") == common_pb2.RUNNING and _restores(restarted) == 1)
        assert _state(stub, "opp") == common_pb2.SUSPENDED
        assert _steps(stub, "opp") == ["suspend", "readdress"]
        _finish(stub, gate, "w")


def test_a_suspend_during_airlocks_checkpoint_is_refused(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """An operator's SUSPEND while cuda-checkpoint copies the subjob's memory for Airlock's
    suspend would stop the process mid-copy (the tool never answers a stopped process): it
    is refused with FAILED_PRECONDITION, and taken once Airlock's suspend is done."""
    host, agent, gate, _ = _checkpointed_opp(cluster, tmp_path, hold_copy=True)
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            _signal(stub, "opp", agent_pb2.SUSPEND)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "cuda-checkpoint" in str(refused.value.details())
        assert _state(stub, "opp") == common_pb2.RUNNING
        host.hold_checkpoint.unlink()
        wait_for(lambda: _state(stub, "opp") == common_pb2.SUSPENDED)
        assert _restores(agent) == 0
        _signal(stub, "opp", agent_pb2.SUSPEND)  # now it is taken (and the operator's)
        _signal(stub, "opp", agent_pb2.RESUME)
        wait_for(lambda: _restores(agent) == 1)
        _finish(stub, gate, "crit", "opp")


def test_a_dry_run_agent_still_restores_what_it_checkpointed(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Restoring held CUDA state repairs the agent's own earlier suspend: a dry-run agent
    (restarted so, or reloaded) does it too, or a checkpointed subjob the operator resumes
    would wait in its next CUDA call forever."""
    host, agent, gate, pid = _checkpointed_opp(cluster, tmp_path)
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(20) == 0
    env = {"LAMINAR_AIRLOCK_DRY_RUN": "true"}
    restarted = host.start(cluster, "h", env=env, injected=40 * GIB)
    with grpc.insecure_channel(restarted.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        _signal(stub, "opp", agent_pb2.RESUME)
        wait_for(lambda: _restores(restarted) == 1)
        assert [p.name for p in host.pid_dir.glob(f"*/{pid}*")] == [str(pid)]
        _finish(stub, gate, "crit", "opp")


def test_a_failing_restore_is_tried_again_less_and_less_often(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """A restore that fails (each try may take the tool's two-minute timeout) waits one poll
    period, then twice as long after each further failure (up to a minute), and succeeds
    once the tool does."""
    host, agent, gate, pid = _checkpointed_opp(cluster, tmp_path)
    host.fail_restore.write_text("")
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        host.inject(agent, 0)  # the pressure goes: Airlock resumes it, and cannot restore

        def waits() -> list[float]:
            text = agent.log_path.read_text(errors="replace")
            return [float(w) for w in re.findall(r"opp keeps CUDA state .* in ([0-9.]+) s", text)]

        wait_for(lambda: len(waits()) >= 3)
        assert waits()[:3] == [0.1, 0.2, 0.4]  # airlock.poll_seconds, doubling
        host.fail_restore.unlink()
        wait_for(lambda: _restores(agent) == 1)
        assert [p.name for p in host.pid_dir.glob(f"*/{pid}*")] == [str(pid)]
        _finish(stub, gate, "opp")


def test_a_restore_waits_longer_after_each_failure() -> None:
    from laminar_agent.airlock_driver import RetryBackoff

    retry = RetryBackoff(first_seconds=0.5, max_seconds=3.0)
    assert retry.is_due("s", 0.0)
    assert [retry.failed("s", t) for t in (0.0, 1.0, 2.0, 3.0, 4.0)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert not retry.is_due("s", 6.9) and retry.is_due("s", 7.0)
    assert retry.is_due("t", 0.0)  # each key on its own
    retry.reset("s")
    assert retry.is_due("s", 0.0) and retry.failed("s", 0.0) == 0.5


class _Tool:
    """A stand-in cuda-checkpoint (reads states); ``fails``: every move fails."""

    reads_state = True

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []
        self.fails = False

    async def to_state(self, pid: int, want: str) -> bool:
        self.calls.append((pid, want))
        if self.fails:
            from laminar_agent.inventory.cuda_checkpoint import ToggleFailed

            raise ToggleFailed("stand-in failure")
        return True


def _held_driver(tool: _Tool, terminating: frozenset[str]) -> tuple[object, object]:
    """A driver over a node whose running subjob "s" (this process) has its CUDA state held
    on the host, as the journal says; and that node."""
    from types import SimpleNamespace

    from laminar_agent.airlock_driver import AirlockDriver
    from laminar_airlock.levels import LevelTracker

    meta = {HELD_META: json.dumps({"s": {str(os.getpid()): GIB}})}
    node = SimpleNamespace(
        journal=SimpleNamespace(get_meta=meta.get, set_meta=meta.__setitem__),
        backend=SimpleNamespace(cuda_checkpoint=SimpleNamespace(tool=tool, is_available=True)),
        live_states={"s": "RUNNING"},
        terminating=terminating,
        executor=SimpleNamespace(pid_of=lambda subjob_id: os.getpid()),
    )
    return AirlockDriver(node, LevelTracker(), poll_seconds=60.0), node  # type: ignore[arg-type]


def test_no_restore_onto_a_gpu_the_subjob_is_being_stopped_on() -> None:
    """Held state of a subjob being stopped stays on the host (its memory would go back to
    a GPU it is leaving); once it is not being stopped, it is restored."""
    import asyncio

    tool = _Tool()
    driver, node = _held_driver(tool, frozenset({"s"}))
    asyncio.run(driver._restore_running())  # type: ignore[attr-defined]
    assert tool.calls == []
    node.terminating = frozenset()  # type: ignore[attr-defined]
    asyncio.run(driver._restore_running())  # type: ignore[attr-defined]
    assert tool.calls == [(os.getpid(), "running")]


def test_a_failed_restore_is_not_tried_again_at_the_next_poll() -> None:
    """Each try may take the tool's two-minute timeout: after a failure the next poll waits
    (here a poll period of a minute), and a success is not held back."""
    import asyncio

    tool = _Tool()
    tool.fails = True
    driver, _ = _held_driver(tool, frozenset())
    asyncio.run(driver._restore_running())  # type: ignore[attr-defined]
    asyncio.run(driver._restore_running())  # type: ignore[attr-defined]
    assert tool.calls == [(os.getpid(), "running")]
