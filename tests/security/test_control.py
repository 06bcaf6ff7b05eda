"""Issue 13, items 2, 3, 5 and 6 (the control-plane half), re-enacted on real daemons.

Each attack of the issue, one by one: an unauthenticated public listener, a forged
event or Airlock action from an agent that does not hold the placement, ForwardJob
without a tenant's token, control calls from a certificate of the wrong role, a path
as a log id, a command execve would refuse, heartbeats inflated by such a job, a
revoked token's open stream, an empty tokens file, escape sequences in job names.
Each fails for the attacker; the daemons stay healthy.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from seckit import HEARTBEAT_SECONDS, HOSTS, failure, tls_args, trust_for
from waiting import gate_code, wait_for

from laminar_agent import __main__ as agent_main
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.errors import ConfigError
from laminar_base.security import check_exposure, is_loopback, load_trust
from laminar_base.settings import ControlSettings, TlsSettings
from laminar_cli.certs import init_certs
from laminar_cli.cluster import LocalCluster, ZoneProcess
from laminar_cli.main import main as cli_main
from laminar_zone import __main__ as zone_main
from laminar_zone.audit import AUDIT_FILE
from laminar_zone.auth import hash_token

TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789"}
INSECURE = load_trust(TlsSettings(), ControlSettings())


def _meta(tenant: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {TOKENS[tenant]}")]


def _write_tokens(path: Path, tenants: list[str]) -> None:
    path.write_text(
        "\n".join(
            f'[[token]]\ntenant = "{t}"\nrole = "tenant"\nhash = "{hash_token(TOKENS[t])}"\n'
            for t in tenants
        )
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path) as c:
        yield c


def _gated_job(stub: zone_pb2_grpc.ZoneStub, gate: Path, **kw: object) -> zone_pb2.Job:
    spec = zone_pb2.JobSpec(
        command=[sys.executable, "-c", gate_code(gate)], resources=common_pb2.Resources(gpus=1)
    )
    job = stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10, **kw)  # type: ignore[arg-type]

    def running() -> bool:
        got = stub.GetJob(zone_pb2.GetJobRequest(job_id=job.job_id), timeout=10, **kw)  # type: ignore[arg-type]
        return got.state == zone_pb2.JOB_RUNNING

    wait_for(running)
    return stub.GetJob(zone_pb2.GetJobRequest(job_id=job.job_id), timeout=10, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------ secure by default


def test_a_public_address_without_authentication_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for module, key in ((agent_main, "server.listen"), (zone_main, "server.listen")):
        argv = ["--listen", "0.0.0.0:0", "--state-dir", str(tmp_path / module.__name__)]
        if module is agent_main:
            argv += ["--gpu-backend", "fake"]
        assert module.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{key}:" in err and "--insecure" in err, err
    secret = tmp_path / "secret"
    secret.write_text("a-shared-secret-of-enough-length\n")
    secret.chmod(0o600)
    with_secret = load_trust(TlsSettings(), ControlSettings(shared_secret_file=str(secret)))
    with pytest.raises(ConfigError) as refused:  # a router also needs submitter tokens
        check_exposure(with_secret, "0.0.0.0:7400", insecure=False, tokens_file="")
    assert refused.value.field == "auth.tokens_file"
    check_exposure(with_secret, "0.0.0.0:7400", insecure=False, tokens_file="/etc/tokens")
    check_exposure(INSECURE, "0.0.0.0:7400", insecure=True, tokens_file="")
    for loopback in ("127.0.0.1:0", "localhost:7400", "[::1]:7400", "127.8.9.1:1"):
        assert is_loopback(loopback)
        check_exposure(INSECURE, loopback, insecure=False, tokens_file="")
    for public in ("0.0.0.0:1", "[::]:1", "10.1.2.3:1", "gpu-01:7401", ":7400"):
        assert not is_loopback(public)


# ------------------------------------------------------------------ forged state


def test_an_agent_cannot_report_on_or_reclaim_another_agents_subjob(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    zone = cluster.start_zone("a", heartbeat_seconds=HEARTBEAT_SECONDS)
    cluster.start_agent("gpu-01", "1xH100-80GB", zone=zone.address, heartbeat_seconds=0.2)
    cluster.wait_registered()
    gate = tmp_path / "gate"
    with grpc.insecure_channel(zone.address) as channel:
        stub = zone_pb2_grpc.ZoneStub(channel)
        job = _gated_job(stub, gate)
        placement = job.placements[0]
        forged = common_pb2.Subjob(
            spec=common_pb2.SubjobSpec(subjob_id=placement.subjob_id, job_id=job.job_id),
            agent_id="gpu-02",
            state=common_pb2.SUCCEEDED,
            run_seconds=1e7,
        )
        control = zone_pb2_grpc.ZoneControlStub(channel)
        control.Heartbeat(
            zone_pb2.HeartbeatRequest(
                summary=common_pb2.AgentSummary(agent_id="gpu-02", address="127.0.0.1:9"),
                events=[common_pb2.SubjobEvent(seq=1, subjob=forged, at_unix=1.0)],
                airlock_actions=[
                    agent_pb2.AirlockAction(
                        seq=1,
                        step="reclaim",
                        job_id=job.job_id,
                        subjob_id=placement.subjob_id,
                        reason="preempted: forged",
                    )
                ],
            ),
            timeout=10,
        )
        again = stub.GetJob(zone_pb2.GetJobRequest(job_id=job.job_id), timeout=10)
        assert again.state == zone_pb2.JOB_RUNNING
        assert again.placements[0].state == common_pb2.RUNNING
        audit = zone.state_dir / AUDIT_FILE
        assert not audit.exists() or "forged" not in audit.read_text()
        assert "ignoring an event for subjob" in zone.log_path.read_text()
        gate.write_text("")
        wait_for(
            lambda: (
                stub.GetJob(zone_pb2.GetJobRequest(job_id=job.job_id), timeout=10).state
                == zone_pb2.JOB_SUCCEEDED
            )
        )


def test_forward_job_needs_the_same_tenant_token_as_submit(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    _write_tokens(tokens, ["alice", "bob"])
    config = tmp_path / "zone.toml"
    config.write_text(f'[auth]\ntokens_file = "{tokens}"\n')
    zone = cluster.start_zone("b", extra_args=["--config", str(config)])
    spec = zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1))
    with grpc.insecure_channel(zone.address) as channel:
        control = zone_pb2_grpc.ZoneControlStub(channel)
        request = zone_pb2.ForwardJobRequest(spec=spec, from_zone="a", client_request_id="f1")
        code, _ = failure(lambda: control.ForwardJob(request, timeout=10))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        as_alice = zone_pb2.ForwardJobRequest(
            spec=zone_pb2.JobSpec(
                command=["true"], resources=common_pb2.Resources(gpus=1), tenant="alice"
            ),
            from_zone="a",
        )
        code, _ = failure(lambda: control.ForwardJob(as_alice, metadata=_meta("bob"), timeout=10))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        job = control.ForwardJob(request, metadata=_meta("bob"), timeout=10)
        assert job.spec.tenant == "bob"


# ------------------------------------------------------------------ roles


@pytest.fixture
def tls_zone(tmp_path: Path) -> Iterator[tuple[LocalCluster, ZoneProcess, str, Path]]:
    certs = tmp_path / "certs"
    init_certs(certs, [*HOSTS, "norole"])
    with LocalCluster(tmp_path / "run", trust=trust_for(certs, "ops")) as cluster:
        zone = cluster.start_zone(
            "z", heartbeat_seconds=HEARTBEAT_SECONDS, extra_args=tls_args(certs, "router")
        )
        agent = cluster.start_agent(
            "agent",
            "2xH100-80GB",
            zone=zone.address,
            heartbeat_seconds=HEARTBEAT_SECONDS,
            extra_args=tls_args(certs, "agent"),
        )
        cluster.wait_registered()
        yield cluster, zone, agent.address, certs


def test_each_control_call_checks_the_callers_role(
    tls_zone: tuple[LocalCluster, ZoneProcess, str, Path],
) -> None:
    _, zone, agent_address, certs = tls_zone
    summary = zone_pb2.ZoneSummary(zone="evil", address="127.0.0.1:9")
    heartbeat = zone_pb2.HeartbeatRequest(
        summary=common_pb2.AgentSummary(agent_id="router", address="127.0.0.1:9")
    )
    probe = agent_pb2.ProbeRequest(job_id="j", resources=common_pb2.Resources(gpus=1))
    forward = zone_pb2.ForwardJobRequest(
        from_zone="evil",
        spec=zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1)),
    )
    for who in ("agent", "ops", "norole"):  # not peers: no summaries, no forwarded jobs
        with trust_for(certs, who).channel(zone.address) as channel:
            control = zone_pb2_grpc.ZoneControlStub(channel)
            code, details = failure(lambda c=control: c.ExchangeSummary(summary, timeout=5))  # type: ignore[misc]
            assert code == grpc.StatusCode.PERMISSION_DENIED and "peer" in details, who
            code, details = failure(lambda c=control: c.ForwardJob(forward, timeout=5))  # type: ignore[misc]
            assert code == grpc.StatusCode.PERMISSION_DENIED and "peer" in details, who
    for who in ("router", "ops", "norole"):  # not agents: no heartbeats
        with trust_for(certs, who).channel(zone.address) as channel:
            control = zone_pb2_grpc.ZoneControlStub(channel)
            code, details = failure(lambda c=control: c.Heartbeat(heartbeat, timeout=5))  # type: ignore[misc]
            assert code == grpc.StatusCode.PERMISSION_DENIED and "agent" in details, who
            code, details = failure(
                lambda c=control: c.Heartbeats(iter([heartbeat]), timeout=5)  # type: ignore[misc]
            )
            assert code == grpc.StatusCode.PERMISSION_DENIED and "agent" in details, who
            assert "Heartbeats" in details, who
    for who in ("agent", "ops", "norole"):  # only a router places work on an agent
        with trust_for(certs, who).channel(agent_address) as channel:
            code, details = failure(
                lambda ch=channel: agent_pb2_grpc.AgentStub(ch).Probe(probe, timeout=5)  # type: ignore[misc]
            )
            assert code == grpc.StatusCode.PERMISSION_DENIED and "router" in details, who
            calls = iter([agent_pb2.AgentCall(probes=agent_pb2.ProbeBatchRequest(probes=[probe]))])
            code, details = failure(
                lambda ch=channel, c=calls: list(agent_pb2_grpc.AgentStub(ch).Calls(c, timeout=5))  # type: ignore[misc]
            )
            assert code == grpc.StatusCode.PERMISSION_DENIED and "router" in details, who
            assert "Calls" in details, who
    with trust_for(certs, "ops").channel(agent_address) as channel:  # an admin may read
        inventory = agent_pb2_grpc.AgentStub(channel).GetInventory(
            agent_pb2.GetInventoryRequest(), timeout=5
        )
        assert len(inventory.gpus) == 2
    with trust_for(certs, "router").channel(zone.address) as channel:  # router=router+peer
        reply = zone_pb2_grpc.ZoneControlStub(channel).ExchangeSummary(
            zone_pb2.ZoneSummary(zone="peer-zone", address="127.0.0.1:9"), timeout=5
        )
        assert reply.zone == "z"


# ------------------------------------------------------------------ bounds


def test_a_log_id_is_an_id_and_a_refused_commit_leaves_no_trace(cluster: LocalCluster) -> None:
    agent = cluster.start_agent("h", "1xH100-80GB")
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        for bad in ("../../../dev", "a/b", ".."):
            code, details = failure(
                lambda b=bad: stub.ReadLogs(agent_pb2.ReadLogsRequest(subjob_id=b), timeout=5)  # type: ignore[misc]
            )
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "subjob_id" in details
            spec = common_pb2.SubjobSpec(subjob_id=bad, job_id="j", command=["true"])
            code, details = failure(
                lambda s=spec: stub.Probe(  # type: ignore[misc]
                    agent_pb2.ProbeRequest(
                        job_id="j",
                        resources=common_pb2.Resources(gpus=1),
                        commit_if_fits=True,
                        spec=s,
                    ),
                    timeout=5,
                )
            )
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "subjob_id" in details
        listed = stub.ListSubjobs(agent_pb2.ListSubjobsRequest(), timeout=5)
        assert list(listed.subjobs) == []
        summary = stub.GetSummary(agent_pb2.GetSummaryRequest(), timeout=5)
        assert summary.active_leases == 0


def test_a_command_execve_would_refuse_is_refused_at_submit_and_heartbeats_stay_small(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    zone = cluster.start_zone("a", heartbeat_seconds=HEARTBEAT_SECONDS)
    cluster.start_agent("h", "1xH100-80GB", zone=zone.address, heartbeat_seconds=0.2)
    cluster.wait_registered()
    with grpc.insecure_channel(zone.address) as channel:
        stub = zone_pb2_grpc.ZoneStub(channel)
        huge = zone_pb2.JobSpec(command=["echo", "x" * (3 * 1024 * 1024)])
        code, details = failure(lambda: stub.Submit(zone_pb2.SubmitRequest(spec=huge), timeout=10))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "spec.command" in details
        # The largest allowed environment, on a job that fails and is retried: its events
        # must not carry it (they used to, until heartbeats outgrew the message limit).
        big_env = {f"V{i}": "y" * 60000 for i in range(8)}
        spec = zone_pb2.JobSpec(
            command=[sys.executable, "-c", "raise SystemExit(3)"],
            env=big_env,
            resources=common_pb2.Resources(gpus=1),
            max_retries=5,
        )
        job = stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)
        wait_for(
            lambda: (
                stub.GetJob(zone_pb2.GetJobRequest(job_id=job.job_id), timeout=10).state
                == zone_pb2.JOB_FAILED
            )
        )
        done = stub.GetJob(zone_pb2.GetJobRequest(job_id=job.job_id), timeout=10)
        assert done.retries_used == 5
        agents = stub.ListAgents(zone_pb2.ListAgentsRequest(), timeout=10).agents
        assert [a.state for a in agents] == [zone_pb2.AGENT_READY]


def test_a_revoked_token_ends_its_stream_and_an_empty_tokens_file_is_refused(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    _write_tokens(tokens, ["alice", "bob"])
    config = tmp_path / "zone.toml"
    config.write_text(f'[auth]\ntokens_file = "{tokens}"\n')
    zone = cluster.start_zone(
        "a", heartbeat_seconds=HEARTBEAT_SECONDS, extra_args=["--config", str(config)]
    )
    cluster.start_agent("h", "1xH100-80GB", zone=zone.address, heartbeat_seconds=0.2)
    gate = tmp_path / "gate"
    with grpc.insecure_channel(zone.address) as channel:
        stub = zone_pb2_grpc.ZoneStub(channel)
        wait_for(
            lambda: bool(
                stub.ListAgents(
                    zone_pb2.ListAgentsRequest(), metadata=_meta("bob"), timeout=5
                ).agents
            )
        )
        job = _gated_job(stub, gate, metadata=_meta("alice"))
        ended: list[grpc.StatusCode] = []
        stream = stub.WatchJob(
            zone_pb2.WatchJobRequest(job_id=job.job_id), metadata=_meta("alice"), timeout=60
        )

        def watch() -> None:
            try:
                for _ in stream:
                    pass
            except grpc.RpcError as exc:
                ended.append(exc.code())

        # A second job followed by SubmitAndWatch: its first event (the submit) is in, the
        # stream is open (the job queues behind the first on the one GPU).
        submitted = stub.SubmitAndWatch(
            zone_pb2.SubmitRequest(spec=job.spec), metadata=_meta("alice"), timeout=60
        )
        assert next(submitted).job.spec.tenant == "alice"

        def follow() -> None:
            try:
                for _ in submitted:
                    pass
            except grpc.RpcError as exc:
                ended.append(exc.code())

        reader = threading.Thread(target=watch, daemon=True)
        reader.start()
        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        _write_tokens(tokens, ["bob"])  # alice's token is revoked
        os.kill(zone.process.pid, signal.SIGHUP)
        wait_for(lambda: len(ended) == 2)
        assert ended == [grpc.StatusCode.UNAUTHENTICATED] * 2
        tokens.write_text("# nobody\n")  # an empty table would lock everyone out
        os.kill(zone.process.pid, signal.SIGHUP)
        wait_for(lambda: "no [[token]] entry" in zone.log_path.read_text())
        assert "WARNING" in next(
            line for line in zone.log_path.read_text().splitlines() if "no [[token]]" in line
        )
        # the old table stays: bob still authenticates (and sees none of alice's jobs)
        listed = stub.ListJobs(zone_pb2.ListJobsRequest(), metadata=_meta("bob"), timeout=10)
        assert list(listed.jobs) == []
    gate.write_text("")


def test_escape_sequences_in_job_text_never_reach_the_terminal(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    zone = cluster.start_zone("a")
    name = "evil\x1b]0;pwned\x07\x1b[2Jname"
    with grpc.insecure_channel(zone.address) as channel:
        stub = zone_pb2_grpc.ZoneStub(channel)
        job = stub.Submit(
            zone_pb2.SubmitRequest(
                spec=zone_pb2.JobSpec(
                    name=name, command=["true"], resources=common_pb2.Resources(gpus=1)
                )
            ),
            timeout=10,
        )
    capsys.readouterr()
    for argv in (["jobs"], ["job", job.job_id]):
        assert cli_main(["--zone", zone.address, *argv]) == 0
        out = capsys.readouterr().out
        assert "\x1b]0;" not in out and "\x1b[2J" not in out and "\x07" not in out
        assert "\\x1b]0;pwned" in out


def test_the_routers_journal_and_audit_log_are_private(cluster: LocalCluster) -> None:
    zone = cluster.start_zone("a")
    with grpc.insecure_channel(zone.address) as channel:
        stub = zone_pb2_grpc.ZoneStub(channel)
        spec = zone_pb2.JobSpec(command=["true"], env={"API_KEY": "s3cret"})
        job = stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)
        stub.CancelJob(zone_pb2.CancelJobRequest(job_id=job.job_id), timeout=10)
    for name in ("zone.db", "zone.db-wal", AUDIT_FILE):
        path = zone.state_dir / name
        if path.exists():
            assert path.stat().st_mode & 0o077 == 0, name
    assert (zone.state_dir / "zone.db").exists()
