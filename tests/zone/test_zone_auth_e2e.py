"""Submitter authentication, tenant isolation and rate limits on a real router process.

The router reads a tokens file (sha256 hashes only); callers send
``authorization: Bearer <token>``. Agents (heartbeats) are not submitters and keep
working. SIGHUP rereads the file without touching running work.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from waiting import gate_code, wait_for
from zonekit import HEARTBEAT_SECONDS

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster, ZoneProcess
from laminar_zone.audit import AUDIT_FILE, AuditLog
from laminar_zone.auth import hash_token

TOKENS = {"alice": "alice-secret-token", "bob": "bob-secret-token", "ops": "ops-admin-token"}


def write_tokens(path: Path, names: list[str]) -> None:
    rows = []
    for name in names:
        role = "admin" if name == "ops" else "tenant"
        rows.append(
            f'[[token]]\ntenant = "{name}"\nrole = "{role}"\nhash = "{hash_token(TOKENS[name])}"\n'
        )
    path.write_text("\n".join(rows))


def start_zone(cluster: LocalCluster, tmp_path: Path, config: str) -> ZoneProcess:
    conf = tmp_path / "zone.toml"
    conf.write_text(config)
    return cluster.start_zone(
        "a", heartbeat_seconds=HEARTBEAT_SECONDS, extra_args=["--config", str(conf)]
    )


def meta(name: str | None) -> list[tuple[str, str]]:
    if name is None:
        return []
    token = TOKENS.get(name, name)
    return [("authorization", f"Bearer {token}")]


def code_of(call: Callable[[], Any]) -> grpc.StatusCode:
    try:
        result = call()
        if hasattr(result, "__iter__") and not hasattr(result, "ListFields"):
            list(result)  # a server stream: read it to get its status
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path) as c:
        yield c


def test_tokens_roles_and_tenant_isolation_on_every_submitter_rpc(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    write_tokens(tokens, ["alice", "bob", "ops"])
    zone = start_zone(cluster, tmp_path, f'[auth]\ntokens_file = "{tokens}"\n')
    cluster.start_agent("h1", "1xA100-80GB:shared", zone=zone.address, heartbeat_seconds=0.2)
    gate = tmp_path / "gate"
    with grpc.insecure_channel(zone.address) as channel:
        stub = zone_pb2_grpc.ZoneStub(channel)

        def agents_ready() -> bool:
            reply = stub.ListAgents(zone_pb2.ListAgentsRequest(), metadata=meta("ops"), timeout=10)
            return any(a.state == zone_pb2.AGENT_READY for a in reply.agents)

        wait_for(agents_ready)
        spec = zone_pb2.JobSpec(
            command=[sys.executable, "-c", gate_code(gate)],
            resources=common_pb2.Resources(gpu_milli=200, gpu_memory_bytes=1 << 30),
        )
        job = stub.Submit(zone_pb2.SubmitRequest(spec=spec), metadata=meta("alice"), timeout=10)
        assert job.spec.tenant == "alice"  # the tenant comes from the token
        job_id = job.job_id

        calls: dict[str, Callable[[list[tuple[str, str]]], Any]] = {
            "Submit": lambda m: stub.Submit(zone_pb2.SubmitRequest(spec=spec), metadata=m),
            "SubmitAndWatch": lambda m: stub.SubmitAndWatch(
                zone_pb2.SubmitRequest(spec=spec), metadata=m, timeout=2
            ),
            "GetJob": lambda m: stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), metadata=m),
            "ListJobs": lambda m: stub.ListJobs(zone_pb2.ListJobsRequest(), metadata=m),
            "WatchJob": lambda m: stub.WatchJob(
                zone_pb2.WatchJobRequest(job_id=job_id), metadata=m, timeout=2
            ),
            "GetLogs": lambda m: stub.GetLogs(zone_pb2.GetLogsRequest(job_id=job_id), metadata=m),
            "ProbeJob": lambda m: stub.ProbeJob(zone_pb2.ProbeJobRequest(spec=spec), metadata=m),
            "CommitJob": lambda m: stub.CommitJob(zone_pb2.CommitJobRequest(spec=spec), metadata=m),
            "ListAgents": lambda m: stub.ListAgents(zone_pb2.ListAgentsRequest(), metadata=m),
            "DrainAgent": lambda m: stub.DrainAgent(
                zone_pb2.DrainAgentRequest(agent="h1"), metadata=m
            ),
            "UndrainAgent": lambda m: stub.UndrainAgent(
                zone_pb2.DrainAgentRequest(agent="h1"), metadata=m
            ),
            "GetAgentAirlock": lambda m: stub.GetAgentAirlock(
                zone_pb2.GetAgentAirlockRequest(agent="h1"), metadata=m
            ),
            "InjectPressure": lambda m: stub.InjectPressure(
                zone_pb2.InjectPressureRequest(
                    agent="h1", load=agent_pb2.InjectLoadRequest(gpu_index=0, used_bytes=0)
                ),
                metadata=m,
            ),
            "GetUsage": lambda m: stub.GetUsage(zone_pb2.GetUsageRequest(), metadata=m),
            "CancelJob": lambda m: stub.CancelJob(
                zone_pb2.CancelJobRequest(job_id=job_id, reason="t"), metadata=m
            ),
        }
        for name, call in calls.items():
            for who in (None, "wrong-token"):
                got = code_of(lambda call=call, who=who: call(meta(who)))  # type: ignore[misc]
                assert got == grpc.StatusCode.UNAUTHENTICATED, (name, who, got)

        # Another tenant may not see, watch, read or cancel alice's job.
        for name in ("GetJob", "WatchJob", "GetLogs", "CancelJob"):
            got = code_of(lambda name=name: calls[name](meta("bob")))  # type: ignore[misc]
            assert got == grpc.StatusCode.PERMISSION_DENIED, (name, got)
        listed = stub.ListJobs(zone_pb2.ListJobsRequest(), metadata=meta("bob"), timeout=10)
        assert [j.job_id for j in listed.jobs] == []
        other = zone_pb2.ListJobsRequest(tenant="alice")
        assert code_of(lambda: stub.ListJobs(other, metadata=meta("bob"))) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        foreign = zone_pb2.JobSpec()
        foreign.CopyFrom(spec)
        foreign.tenant = "alice"
        assert (
            code_of(lambda: stub.Submit(zone_pb2.SubmitRequest(spec=foreign), metadata=meta("bob")))
            == grpc.StatusCode.PERMISSION_DENIED
        )
        assert (
            code_of(
                lambda: stub.SubmitAndWatch(
                    zone_pb2.SubmitRequest(spec=foreign), metadata=meta("bob"), timeout=2
                )
            )
            == grpc.StatusCode.PERMISSION_DENIED
        )
        # Administrative calls need the admin role.
        for name in ("DrainAgent", "UndrainAgent", "InjectPressure"):
            got = code_of(lambda name=name: calls[name](meta("alice")))  # type: ignore[misc]
            assert got == grpc.StatusCode.PERMISSION_DENIED, (name, got)
        for name in ("DrainAgent", "UndrainAgent", "GetJob", "ListAgents", "GetUsage"):
            got = code_of(lambda name=name: calls[name](meta("ops")))  # type: ignore[misc]
            assert got == grpc.StatusCode.OK, (name, got)
        audit = AuditLog(zone.state_dir / AUDIT_FILE).read()
        assert [(a["actor"], a["action"], a["target"]) for a in audit] == [
            ("ops (admin)", "drain", "h1"),
            ("ops (admin)", "undrain", "h1"),
        ]
        own = stub.ListJobs(zone_pb2.ListJobsRequest(), metadata=meta("alice"), timeout=10)
        assert [j.job_id for j in own.jobs] == [job_id]

        def running_now() -> bool:
            got = stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), metadata=meta("ops"))
            return got.state == zone_pb2.JOB_RUNNING

        wait_for(running_now)  # the process reports running asynchronously after Submit
        # SIGHUP: a new token works, a removed one stops working, the job runs on.
        write_tokens(tokens, ["bob", "ops"])
        os.kill(zone.process.pid, signal.SIGHUP)

        def alice_refused() -> bool:
            request = zone_pb2.ListJobsRequest()
            return code_of(lambda: stub.ListJobs(request, metadata=meta("alice"))) == (
                grpc.StatusCode.UNAUTHENTICATED
            )

        wait_for(alice_refused)
        tokens.write_text("this is not toml [[[")
        os.kill(zone.process.pid, signal.SIGHUP)
        wait_for(lambda: "tokens file not reloaded" in zone.log_path.read_text())
        assert code_of(lambda: calls["ListJobs"](meta("bob"))) == grpc.StatusCode.OK
        running = stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), metadata=meta("ops"))
        assert running.state == zone_pb2.JOB_RUNNING
        gate.write_text("go")

        def done() -> bool:
            got = stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), metadata=meta("ops"))
            return got.state == zone_pb2.JOB_SUCCEEDED

        wait_for(done)


def test_submit_rate_limit_engages_with_a_retry_hint_and_recovers(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    zone = start_zone(
        cluster,
        tmp_path,
        "[limits]\nsubmit_per_second = 2\nburst = 2\nmax_queued_per_tenant = 50\n",
    )
    spec = zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1))
    with grpc.insecure_channel(zone.address) as channel:
        stub = zone_pb2_grpc.ZoneStub(channel)
        refused: grpc.RpcError | None = None
        for _ in range(10):
            try:
                stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)
            except grpc.RpcError as exc:
                refused = exc
                break
        assert refused is not None, "ten submits in a row were never limited"
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "retry in" in (refused.details() or "")
        trailing = dict(refused.trailing_metadata() or ())  # type: ignore[attr-defined]
        assert float(trailing["retry-after-seconds"]) > 0

        def accepted_again() -> bool:
            return code_of(lambda: stub.Submit(zone_pb2.SubmitRequest(spec=spec))) == (
                grpc.StatusCode.OK
            )

        wait_for(accepted_again, timeout_seconds=10)


def test_cli_sends_the_token_and_refuses_a_readable_token_file(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    write_tokens(tokens, ["alice"])
    zone = start_zone(cluster, tmp_path, f'[auth]\ntokens_file = "{tokens}"\n')
    base = {k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")}
    base["HOME"] = str(tmp_path)
    laminar = [sys.executable, "-m", "laminar_cli.main", "--zone", zone.address, "jobs"]

    def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(laminar, env=env, capture_output=True, text=True, timeout=60)

    anonymous = run(base)
    assert anonymous.returncode == 1 and "UNAUTHENTICATED" in anonymous.stderr
    assert len(anonymous.stderr.strip().splitlines()) == 1
    assert run({**base, "LAMINAR_TOKEN": TOKENS["alice"]}).returncode == 0
    token_file = tmp_path / ".config" / "laminar" / "token"
    token_file.parent.mkdir(parents=True)
    token_file.write_text(TOKENS["alice"] + "\n")
    token_file.chmod(0o644)
    loose = run(base)
    assert loose.returncode == 2 and "chmod 600" in loose.stderr
    token_file.chmod(0o600)
    assert run(base).returncode == 0
