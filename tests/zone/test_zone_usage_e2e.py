"""Usage (showback) on a real router with real agents: figures, isolation, restart.

Jobs of known shape run on two tenants, a whole GPU for one and a MIG slice for
the other; GetUsage must report the GPU-seconds of the run times the agents
recorded (not a hard-coded duration), show each tenant token only its own rows,
count a running subjob up to now, and give the same figures after the router
restarts on the same state directory.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from test_zone_auth_e2e import TOKENS, code_of, meta, write_tokens
from waiting import gate_code, wait_for
from zonekit import HEARTBEAT_SECONDS, free_port

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster, ZoneProcess
from laminar_cli.main import main

GIB = 1 << 30
MIG_UNITS = 3 / 7  # a 3g.40gb instance holds 3 of a GPU's 7 compute slices
SLEEP = "import time; time.sleep(1.0)"


class Router:
    """One router process and a stub; ``restart`` stops it and starts it on the same state."""

    def __init__(self, cluster: LocalCluster, config: Path) -> None:
        self.cluster = cluster
        self.listen = f"127.0.0.1:{free_port()}"
        self.config = config
        self.process = self._start()
        self.channel = grpc.insecure_channel(self.process.address)
        self.stub = zone_pb2_grpc.ZoneStub(self.channel)

    def _start(self) -> ZoneProcess:
        return self.cluster.start_zone(
            "a",
            listen=self.listen,
            heartbeat_seconds=HEARTBEAT_SECONDS,
            extra_args=["--config", str(self.config)],
        )

    def restart(self) -> None:
        self.channel.close()
        self.process.process.send_signal(signal.SIGTERM)
        assert self.process.process.wait(15) == 0
        self.cluster.zones.remove(self.process)
        self.process = self._start()
        self.channel = grpc.insecure_channel(self.process.address)
        self.stub = zone_pb2_grpc.ZoneStub(self.channel)

    def usage(
        self, who: str, tenant: str = "", since: float = 0.0
    ) -> dict[tuple[str, str], zone_pb2.UsageRecord]:
        request = zone_pb2.GetUsageRequest(tenant=tenant, since_unix=since)
        reply = self.stub.GetUsage(request, metadata=meta(who), timeout=10)
        return {(r.tenant, r.slice_kind): r for r in reply.records}

    def submit(self, who: str, code: str, resources: common_pb2.Resources) -> str:
        spec = zone_pb2.JobSpec(command=[sys.executable, "-c", code], resources=resources)
        job = self.stub.Submit(zone_pb2.SubmitRequest(spec=spec), metadata=meta(who), timeout=10)
        return str(job.job_id)

    def get(self, job_id: str) -> zone_pb2.Job:
        return self.stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), metadata=meta("ops"))

    def wait_agents(self, *names: str) -> None:
        def ready() -> bool:
            reply = self.stub.ListAgents(zone_pb2.ListAgentsRequest(), metadata=meta("ops"))
            return set(names) <= {
                a.agent_id for a in reply.agents if a.state == zone_pb2.AGENT_READY
            }

        wait_for(ready)

    def wait_succeeded(self, job_id: str) -> zone_pb2.Placement:
        ended = (zone_pb2.JOB_SUCCEEDED, zone_pb2.JOB_FAILED, zone_pb2.JOB_CANCELLED)
        wait_for(lambda: self.get(job_id).state in ended)
        job = self.get(job_id)
        assert job.state == zone_pb2.JOB_SUCCEEDED, job.reason
        (placement,) = job.placements
        assert placement.run_seconds > 0
        return placement


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    tokens = tmp_path / "tokens.toml"
    write_tokens(tokens, ["alice", "bob", "ops"])
    config = tmp_path / "zone.toml"
    config.write_text(f'[auth]\ntokens_file = "{tokens}"\n')
    with LocalCluster(tmp_path) as cluster:
        r = Router(cluster, config)
        for name, gpus in (("whole", "1xH100-80GB"), ("mig", "H100-80GB:mig=3g.40gb+2g.20gb")):
            cluster.start_agent(
                name, gpus, zone=r.process.address, heartbeat_seconds=HEARTBEAT_SECONDS
            )
        r.wait_agents("whole", "mig")
        yield r
        r.channel.close()


def close(row: zone_pb2.UsageRecord, gpu_seconds: float, memory_byte_seconds: float) -> None:
    assert row.gpu_seconds == pytest.approx(gpu_seconds, rel=1e-6)
    assert row.gpu_memory_byte_seconds == pytest.approx(memory_byte_seconds, rel=1e-6)
    assert row.lost_gpu_seconds == 0.0


def memory_of(placement: zone_pb2.Placement, declared: int) -> float:
    return float(placement.peak_gpu_memory_bytes or declared) * placement.run_seconds


def test_usage_matches_run_times_isolates_tenants_and_survives_a_router_restart(
    router: Router,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    whole = common_pb2.Resources(gpus=1, gpu_memory_bytes=2 * GIB)
    mig = common_pb2.Resources(mig_profile="3g.40gb", gpu_memory_bytes=4 * GIB)
    alice_job = router.submit("alice", SLEEP, whole)
    bob_job = router.submit("bob", SLEEP, mig)
    alice_run = router.wait_succeeded(alice_job)
    bob_run = router.wait_succeeded(bob_job)

    rows = router.usage("ops")
    assert set(rows) == {("alice", "gpu:H100-80GB"), ("bob", "mig:3g.40gb")}
    close(rows["alice", "gpu:H100-80GB"], alice_run.run_seconds, memory_of(alice_run, 2 * GIB))
    close(
        rows["bob", "mig:3g.40gb"],
        MIG_UNITS * bob_run.run_seconds,
        memory_of(bob_run, 4 * GIB),
    )
    assert [r.subjobs for r in rows.values()] == [1, 1]

    # A tenant token sees its own rows only, and may not ask for another tenant's.
    assert set(router.usage("alice")) == {("alice", "gpu:H100-80GB")}
    assert set(router.usage("bob")) == {("bob", "mig:3g.40gb")}
    denied = code_of(
        lambda: router.stub.GetUsage(
            zone_pb2.GetUsageRequest(tenant="bob"), metadata=meta("alice"), timeout=10
        )
    )
    assert denied == grpc.StatusCode.PERMISSION_DENIED
    assert set(router.usage("ops", tenant="bob")) == {("bob", "mig:3g.40gb")}
    # Both ended before now: a window starting now holds nothing.
    assert router.usage("ops", since=time.time()) == {}

    # A running subjob counts up to now.
    gate = tmp_path / "gate"
    running_job = router.submit("alice", gate_code(gate), whole)

    def counted_while_running() -> bool:
        row = router.usage("alice").get(("alice", "gpu:H100-80GB"))
        return row is not None and row.subjobs == 2 and row.gpu_seconds > alice_run.run_seconds

    wait_for(counted_while_running)

    # The CLI with alice's token: her rows only, as JSON and as a table.
    monkeypatch.setenv("LAMINAR_TOKEN", TOKENS["alice"])
    address = router.process.address
    capsys.readouterr()
    assert main(["--zone", address, "usage", "--since", "1h", "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)["records"]
    assert [(r["tenant"], r["slice_kind"]) for r in listed] == [("alice", "gpu:H100-80GB")]
    assert main(["--zone", address, "usage"]) == 0
    table = capsys.readouterr().out
    assert "gpu:H100-80GB" in table and "bob" not in table

    # Restart the router on the same state directory: the figures of ended subjobs stay.
    before = router.usage("ops")
    router.restart()
    router.wait_agents("whole", "mig")
    after = router.usage("ops")
    assert after["bob", "mig:3g.40gb"] == before["bob", "mig:3g.40gb"]
    assert after["alice", "gpu:H100-80GB"].subjobs == 2

    # The subjob that ran across the restart is written once, with its recorded run time.
    gate.write_text("go")
    gated_run = router.wait_succeeded(running_job)
    final = router.usage("ops")
    alice_row = final["alice", "gpu:H100-80GB"]
    assert alice_row.subjobs == 2
    close(
        alice_row,
        alice_run.run_seconds + gated_run.run_seconds,
        memory_of(alice_run, 2 * GIB) + memory_of(gated_run, 2 * GIB),
    )
    assert final["bob", "mig:3g.40gb"] == before["bob", "mig:3g.40gb"]
