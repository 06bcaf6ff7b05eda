"""Probe, commit, launch and exit of real child processes through a real agent process."""

from __future__ import annotations

import asyncio
import signal
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import gate_code, wait_for

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from laminar_base.callstream import CallClient
from laminar_cli.cluster import AgentProcess, LocalCluster

GIB = 1024**3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path) as c:
        yield c


def _stub(agent: AgentProcess) -> tuple[grpc.Channel, agent_pb2_grpc.AgentStub]:
    channel = grpc.insecure_channel(agent.address)
    return channel, agent_pb2_grpc.AgentStub(channel)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _spec(subjob_id: str, code: str) -> common_pb2.SubjobSpec:
    return common_pb2.SubjobSpec(
        subjob_id=subjob_id, job_id=f"job-{subjob_id}", command=[sys.executable, "-c", code]
    )


def _run_now(
    stub: agent_pb2_grpc.AgentStub, subjob_id: str, resources: common_pb2.Resources, code: str
) -> agent_pb2.ProbeReply:
    """Probe with commit-if-fits: one round trip from request to a running subjob."""
    return stub.Probe(
        agent_pb2.ProbeRequest(
            job_id="j", resources=resources, commit_if_fits=True, spec=_spec(subjob_id, code)
        ),
        timeout=10,
    )


def _final(stub: agent_pb2_grpc.AgentStub, subjob_id: str) -> common_pb2.Subjob:
    terminal = {common_pb2.SUCCEEDED, common_pb2.FAILED, common_pb2.KILLED, common_pb2.LOST}
    result: list[common_pb2.Subjob] = []

    def done() -> bool:
        sj = stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id=subjob_id), timeout=10)
        result[:] = [sj]
        return sj.state in terminal

    wait_for(done)
    return result[0]


def test_probe_commit_runs_a_process(cluster: LocalCluster) -> None:
    agent = cluster.start_agent("h", "2xA100-40GB")
    channel, stub = _stub(agent)
    with channel:
        reply = stub.Probe(
            agent_pb2.ProbeRequest(
                probe_id="p1",
                job_id="j1",
                resources=common_pb2.Resources(gpus=1),
                lease_ttl_seconds=5,
            ),
            timeout=10,
        )
        assert reply.WhichOneof("outcome") == "lease"
        code = "import os,sys; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['LAMINAR_JOB_ID']); sys.exit(3)"
        sj = stub.Commit(
            agent_pb2.CommitRequest(lease_id=reply.lease.lease_id, spec=_spec("s1", code)),
            timeout=10,
        )
        assert sj.state in (common_pb2.RUNNING, common_pb2.FAILED)
        final = _final(stub, "s1")
        assert final.state == common_pb2.FAILED and final.exit_code == 3
        out = stub.ReadLogs(agent_pb2.ReadLogsRequest(subjob_id="s1"), timeout=10)
        assert out.data.decode().split() == [reply.lease.device_uuids[0], "job-s1"]
        # The GPU is free again once the subjob ended.
        summary = stub.GetSummary(agent_pb2.GetSummaryRequest(), timeout=10)
        assert {s.shape: s.free for s in summary.shapes}["gpu:A100-40GB"] == 2


def test_a_probe_batch_answers_each_commit_on_its_own(cluster: LocalCluster) -> None:
    """One batched commit-carrying probe the agent refuses (no command) fails alone,
    naming its index and field; the other runs its process and the refused one holds
    nothing."""
    agent = cluster.start_agent("h", "2xA100-40GB")
    channel, stub = _stub(agent)
    with channel:
        good = agent_pb2.ProbeRequest(
            probe_id="ok",
            job_id="j-ok",
            resources=common_pb2.Resources(gpus=1),
            commit_if_fits=True,
            spec=_spec("batched-ok", "pass"),
        )
        bad = agent_pb2.ProbeRequest(
            probe_id="bad",
            job_id="j-bad",
            resources=common_pb2.Resources(gpus=1),
            commit_if_fits=True,
            spec=common_pb2.SubjobSpec(subjob_id="batched-bad", job_id="j-bad"),
        )
        reply = stub.ProbeBatch(agent_pb2.ProbeBatchRequest(probes=[good, bad]), timeout=10)
        first, second = reply.replies
        assert not first.HasField("error") and first.subjob.spec.subjob_id == "batched-ok"
        assert second.error.code == "INVALID_ARGUMENT"
        assert second.error.message.startswith("probes[1].") and "command" in second.error.message
        assert second.WhichOneof("outcome") is None
        assert _final(stub, "batched-ok").state == common_pb2.SUCCEEDED
        with pytest.raises(grpc.RpcError) as info:
            stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="batched-bad"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        summary = stub.GetSummary(agent_pb2.GetSummaryRequest(), timeout=10)
        assert {s.shape: s.free for s in summary.shapes}["gpu:A100-40GB"] == 2


def test_concurrent_probes_for_the_last_slice(cluster: LocalCluster) -> None:
    agent = cluster.start_agent("h", "1xA100-40GB")

    async def race() -> list[agent_pb2.ProbeReply]:
        channels = [grpc.aio.insecure_channel(agent.address) for _ in range(6)]
        try:
            stubs = [agent_pb2_grpc.AgentStub(c) for c in channels]
            return list(
                await asyncio.gather(
                    *(
                        s.Probe(
                            agent_pb2.ProbeRequest(
                                probe_id=f"p{i}",
                                job_id=f"j{i}",
                                resources=common_pb2.Resources(gpus=1),
                                lease_ttl_seconds=10,
                            ),
                            timeout=10,
                        )
                        for i, s in enumerate(stubs)
                    )
                )
            )
        finally:
            for c in channels:
                await c.close()

    replies = asyncio.run(race())
    outcomes = [r.WhichOneof("outcome") for r in replies]
    assert outcomes.count("lease") == 1 and outcomes.count("bounce") == 5
    bounce = next(r for r in replies if r.WhichOneof("outcome") == "bounce")
    assert bounce.summary.agent_id == "h"


def test_lease_expiry_frees_the_slice(cluster: LocalCluster) -> None:
    agent = cluster.start_agent("h", "1xA100-40GB")
    channel, stub = _stub(agent)
    with channel:
        first = stub.Probe(
            agent_pb2.ProbeRequest(
                job_id="a", resources=common_pb2.Resources(gpus=1), lease_ttl_seconds=0.3
            ),
            timeout=10,
        )
        assert first.WhichOneof("outcome") == "lease"
        second = stub.Probe(
            agent_pb2.ProbeRequest(job_id="b", resources=common_pb2.Resources(gpus=1)), timeout=10
        )
        assert second.WhichOneof("outcome") == "bounce"

        def lease_again() -> bool:
            r = stub.Probe(
                agent_pb2.ProbeRequest(
                    job_id="b", resources=common_pb2.Resources(gpus=1), lease_ttl_seconds=5
                ),
                timeout=10,
            )
            return r.WhichOneof("outcome") == "lease"

        wait_for(lease_again, 10)
        with pytest.raises(grpc.RpcError) as info:
            stub.Commit(
                agent_pb2.CommitRequest(lease_id=first.lease.lease_id, spec=_spec("x", "pass")),
                timeout=10,
            )
        assert info.value.code() in (grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND)


def test_bad_input_names_the_field(cluster: LocalCluster) -> None:
    agent = cluster.start_agent("h", "1xA100-40GB")
    channel, stub = _stub(agent)
    with channel:
        cases = [
            (agent_pb2.ProbeRequest(resources=common_pb2.Resources(gpu_milli=5000)), "gpu_milli"),
            (
                agent_pb2.ProbeRequest(
                    resources=common_pb2.Resources(gpus=1), lease_ttl_seconds=-1
                ),
                "lease_ttl_seconds",
            ),
            (
                agent_pb2.ProbeRequest(job_id="x" * 1000, resources=common_pb2.Resources(gpus=1)),
                "job_id",
            ),
        ]
        for request, field in cases:
            with pytest.raises(grpc.RpcError) as info:
                stub.Probe(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
            assert field in (info.value.details() or "")
        with pytest.raises(grpc.RpcError) as info:
            stub.Commit(
                agent_pb2.CommitRequest(lease_id="nope", spec=_spec("y", "pass")), timeout=10
            )
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        lease = stub.Probe(
            agent_pb2.ProbeRequest(resources=common_pb2.Resources(gpus=1), lease_ttl_seconds=5),
            timeout=10,
        )
        with pytest.raises(grpc.RpcError) as info:
            stub.Commit(
                agent_pb2.CommitRequest(
                    lease_id=lease.lease.lease_id, spec=common_pb2.SubjobSpec()
                ),
                timeout=10,
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "command" in (info.value.details() or "")
        with pytest.raises(grpc.RpcError) as info:
            stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="missing"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_kill_9_and_restart_readopts_running_subjob(cluster: LocalCluster, tmp_path: Path) -> None:
    agent = cluster.start_agent("h", "2xA100-40GB")
    gate = tmp_path / "gate"
    gate2 = tmp_path / "gate2"
    channel, stub = _stub(agent)
    with channel:
        code = gate_code(gate, 7)
        reply = _run_now(stub, "keep", common_pb2.Resources(gpus=1), code)
        assert reply.subjob.state == common_pb2.RUNNING
        dying = stub.Probe(
            agent_pb2.ProbeRequest(
                job_id="j2",
                resources=common_pb2.Resources(gpus=1),
                commit_if_fits=True,
                spec=_spec(
                    "dies",
                    gate_code(gate2),
                ),
            ),
            timeout=10,
        )
        assert dying.subjob.state == common_pb2.RUNNING
    agent.process.send_signal(signal.SIGKILL)
    agent.process.wait(10)
    # Let "dies" finish while no agent is running.
    gate2.write_text("go")
    wait_for(lambda: _gone(dying.subjob.pid))
    restarted = cluster.start_agent("h", "2xA100-40GB")
    channel, stub = _stub(restarted)
    with channel:
        kept = stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="keep"), timeout=10)
        assert kept.state == common_pb2.RUNNING
        ended = _final(stub, "dies")
        assert ended.state == common_pb2.SUCCEEDED and "agent was down" in ended.reason
        assert ended.end_cause == common_pb2.END_CAUSE_EXITED
        # The re-adopted subjob still holds its GPU: only one of two is free.
        summary = stub.GetSummary(agent_pb2.GetSummaryRequest(), timeout=10)
        assert {s.shape: s.free for s in summary.shapes}["gpu:A100-40GB"] == 1
        gate.write_text("go")
        final = _final(stub, "keep")
        assert final.state == common_pb2.FAILED and final.exit_code == 7
        assert final.end_cause == common_pb2.END_CAUSE_EXITED


def test_a_stops_cause_survives_an_agent_restart(cluster: LocalCluster, tmp_path: Path) -> None:
    """The router asks to stop a subjob with a cause; the agent dies before the subjob ends.
    The restarted agent reports the end with the cause the stop was given (journaled as the
    stop began), and the reason for people keeps the stop's own words first."""
    agent = cluster.start_agent("h", "1xA100-40GB")
    gate = tmp_path / "gate"
    ready = tmp_path / "ready"
    code = (
        "import signal, pathlib\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"pathlib.Path({str(ready)!r}).write_text('up')\n{gate_code(gate)}"
    )
    channel, stub = _stub(agent)
    with channel:
        assert _run_now(stub, "moved", common_pb2.Resources(gpus=1), code).subjob.pid
        wait_for(ready.exists)
        with pytest.raises(grpc.RpcError) as info:  # it ignores SIGTERM: the stop waits
            stub.SignalSubjob(
                agent_pb2.SignalSubjobRequest(
                    subjob_id="moved",
                    signal=agent_pb2.TERMINATE,
                    reason="readdressed: moved to h2",
                    grace_seconds=120,
                    end_cause=common_pb2.END_CAUSE_READDRESSED,
                ),
                timeout=1,
            )
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        live = stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="moved"), timeout=10)
        assert live.state == common_pb2.RUNNING
        assert live.end_cause == common_pb2.END_CAUSE_UNSPECIFIED  # not ended yet
    agent.process.send_signal(signal.SIGKILL)
    agent.process.wait(10)
    restarted = cluster.start_agent("h", "1xA100-40GB")
    channel, stub = _stub(restarted)
    with channel:
        gate.write_text("go")  # it exits 0 on its own, re-adopted by the new agent
        final = _final(stub, "moved")
        assert final.state == common_pb2.KILLED
        assert final.end_cause == common_pb2.END_CAUSE_READDRESSED
        assert final.reason.startswith("readdressed: moved to h2; exited 0"), final.reason


def test_declared_memory_shows_on_the_fake_gpu(cluster: LocalCluster, tmp_path: Path) -> None:
    agent = cluster.start_agent("h", "A100-80GB:shared")
    gate = tmp_path / "gate"
    channel, stub = _stub(agent)
    with channel:
        code = gate_code(gate)
        reply = _run_now(
            stub, "share", common_pb2.Resources(gpu_milli=500, gpu_memory_bytes=20 * GIB), code
        )
        assert reply.subjob.spec.resources.gpu_milli == 500
        used = (
            stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10).gpus[0].memory_used_bytes
        )
        assert used == 20 * GIB
        gate.write_text("go")
        assert _final(stub, "share").state == common_pb2.SUCCEEDED
        used = (
            stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10).gpus[0].memory_used_bytes
        )
        assert used == 0


def test_sigterm_restart_keeps_subjobs_running(cluster: LocalCluster, tmp_path: Path) -> None:
    """Upgrade path: SIGTERM the agent, start it again; the subjob survives and is re-adopted."""
    agent = cluster.start_agent("h", "1xA100-40GB")
    gate = tmp_path / "gate"
    channel, stub = _stub(agent)
    with channel:
        code = gate_code(gate)
        reply = _run_now(stub, "survivor", common_pb2.Resources(gpus=1), code)
        pid = reply.subjob.pid
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(20) == 0
    assert not _gone(pid)
    restarted = cluster.start_agent("h", "1xA100-40GB")
    channel, stub = _stub(restarted)
    with channel:
        assert stub.GetSubjob(
            agent_pb2.GetSubjobRequest(subjob_id="survivor"), timeout=10
        ).state == (common_pb2.RUNNING)
        gate.write_text("go")
        assert _final(stub, "survivor").state == common_pb2.SUCCEEDED


def _gauge(agent: AgentProcess, name: str) -> float:
    body = urllib.request.urlopen(f"http://{agent.metrics_address}/metrics", timeout=10).read()
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    return float(families[name].samples[0].value)


def test_the_tick_keeps_the_capacity_gauges(cluster: LocalCluster, tmp_path: Path) -> None:
    """The allocated share follows commits and ends: the agent's tick sets it (summaries,
    one per probe and release reply, no longer do)."""
    agent = cluster.start_agent("h", "2xA100-40GB")
    gate = tmp_path / "gate"
    channel, stub = _stub(agent)
    with channel:
        reply = _run_now(stub, "held", common_pb2.Resources(gpus=1), gate_code(gate))
        assert reply.WhichOneof("outcome") == "lease"
        wait_for(lambda: _gauge(agent, "laminar_agent_gpu_allocated_ratio") == 0.5)
        gate.write_text("")
        assert _final(stub, "held").state == common_pb2.SUCCEEDED
        wait_for(lambda: _gauge(agent, "laminar_agent_gpu_allocated_ratio") == 0.0)


def test_a_commit_carrying_probe_checks_its_spec_before_any_lease(cluster: LocalCluster) -> None:
    """The spec a probe would commit (its priority taken from the probe when the spec has
    none) is checked once, before the ledger settles anything: a bad one is refused naming
    its field (it was bounced by the ledger before), and holds no lease."""
    agent = cluster.start_agent("h", "2xA100-40GB")
    channel, stub = _stub(agent)
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            stub.Probe(
                agent_pb2.ProbeRequest(
                    job_id="j",
                    resources=common_pb2.Resources(gpus=1),
                    priority=99,  # type: ignore[arg-type]  # no such class
                    commit_if_fits=True,
                    spec=_spec("bad", "pass"),
                ),
                timeout=10,
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "spec.priority" in (info.value.details() or "")
        summary = stub.GetSummary(agent_pb2.GetSummaryRequest(), timeout=10)
        assert summary.active_leases == 0
        assert {s.shape: s.free for s in summary.shapes}["gpu:A100-40GB"] == 2


async def test_probes_and_releases_over_the_call_stream(cluster: LocalCluster) -> None:
    """The router's way to an agent: calls as messages of one stream, answered by id,
    each failing alone (a call naming nothing, a batch over the limit) while the others
    hold their leases, then give them back on the same stream."""
    agent = cluster.start_agent("h", "2xA100-40GB")
    async with grpc.aio.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        client: CallClient[agent_pb2.AgentCall, agent_pb2.AgentCallReply] = CallClient(
            lambda: stub.Calls()
        )

        def probe(job_id: str) -> agent_pb2.ProbeRequest:
            return agent_pb2.ProbeRequest(
                job_id=job_id, resources=common_pb2.Resources(gpus=1), lease_ttl_seconds=60
            )

        def batch(*probes: agent_pb2.ProbeRequest) -> agent_pb2.AgentCall:
            return agent_pb2.AgentCall(probes=agent_pb2.ProbeBatchRequest(probes=probes))

        granted, nothing, too_many = await asyncio.gather(
            client.call(batch(probe("j1"), probe("j2")), 10),
            client.call(agent_pb2.AgentCall(), 10),
            client.call(batch(*[probe("j3")] * 257), 10),
        )
        leases = [one.lease.lease_id for one in granted.probes.replies]
        assert len(set(leases)) == 2 and all(leases)
        assert granted.probes.replies[-1].summary.active_leases == 2
        assert nothing.error.code == "INVALID_ARGUMENT" and "call" in nothing.error.message
        assert too_many.error.code == "INVALID_ARGUMENT" and "probes" in too_many.error.message
        full = await client.call(batch(probe("j4")), 10)
        assert full.probes.replies[0].HasField("bounce")
        given = await client.call(
            agent_pb2.AgentCall(release=agent_pb2.ReleaseRequest(lease_ids=leases)), 10
        )
        assert given.release.released == 2
        assert {s.shape: s.free for s in given.release.summary.shapes}["gpu:A100-40GB"] == 2
        await client.close()
