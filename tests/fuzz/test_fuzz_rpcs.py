"""Fuzz every RPC of both daemons with random messages, then check they are whole.

A real router and a real agent (fake GPUs) run as processes on loopback. Each
example picks one RPC of the Agent, Zone or ZoneControl service and sends a
request built at random from its descriptor (see ``protofuzz``). Every answer
must be OK or a proper status code with a message; UNKNOWN, INTERNAL, or a
traceback on the wire is a daemon bug. Streaming RPCs get a bounded read.
Afterwards both daemons answer health checks and logged no traceback (background
tasks fail into the log), their SQLite journals pass
``PRAGMA integrity_check``, every journaled job and subjob decodes, and the
agent's inventory shows no slice over its capacity.

Bounded: ``FUZZ_EXAMPLES`` messages (``LAMINAR_FUZZ_EXAMPLES`` raises it for a
longer local run), derandomized so a CI failure reproduces (``LAMINAR_FUZZ_RANDOM=1``
draws new examples each run).
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from protofuzz import fill_message
from waiting import wait_for

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import AgentProcess, LocalCluster, ZoneProcess

FUZZ_EXAMPLES = int(os.environ.get("LAMINAR_FUZZ_EXAMPLES", "300"))
#: Deadline of one unary call; the daemons answer in milliseconds.
CALL_TIMEOUT_SECONDS = 10.0
#: A streaming call is read this long (or for STREAM_ITEMS items), then cancelled.
STREAM_READ_SECONDS = 0.3
STREAM_ITEMS = 3
#: Most strings in the pool of realistic ones (ids learnt from replies included).
MAX_REALISTIC = 200

#: Codes that mean "refused properly". UNAVAILABLE is accepted only while the daemon
#: still answers health checks (the router says so when an agent it asks is gone).
PROPER_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)

AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["Agent"]
ZONE_SERVICES = [
    zone_pb2.DESCRIPTOR.services_by_name["Zone"],
    zone_pb2.DESCRIPTOR.services_by_name["ZoneControl"],
]


@dataclass
class Target:
    service: ServiceDescriptor
    method: MethodDescriptor
    address: str

    @property
    def name(self) -> str:
        return f"{self.service.name}.{self.method.name}"


@dataclass
class Fleet:
    cluster: LocalCluster
    zone: ZoneProcess
    agent: AgentProcess
    channels: dict[str, grpc.Channel]
    targets: list[Target]
    realistic: list[str]
    failures: list[str] = field(default_factory=list)
    up_failures: list[str] = field(default_factory=list)
    codes: dict[str, int] = field(default_factory=dict)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fuzz")
    with LocalCluster(root) as cluster:
        zone = cluster.start_zone("fz", heartbeat_seconds=0.2)
        agent = cluster.start_agent(
            "fz-h1",
            "H100-80GB:mig=3g.40gb+2g.20gb+1g.10gb,A100-80GB:shared,H100-80GB",
            zone=zone.address,
            heartbeat_seconds=0.2,
        )
        cluster.wait_registered()
        channels = {
            address: grpc.insecure_channel(address) for address in (zone.address, agent.address)
        }
        targets = [Target(AGENT_SERVICE, m, agent.address) for m in AGENT_SERVICE.methods]
        targets += [Target(s, m, zone.address) for s in ZONE_SERVICES for m in s.methods]
        realistic = [
            agent.agent_id,
            agent.address,
            zone.address,
            "fz",
            "gpu0",
            "gpu1",
            "gpu2",
            "gpu0/3g.40gb@0",
            "3g.40gb",
            "1g.10gb",
            "H100-80GB",
            "A100-80GB",
            "stdout",
            "stderr",
            "tenant-a",
            sys.executable,
            "-c",
            "print(1)",
            str(root),
        ]
        realistic += _seed_work(channels[zone.address], channels[agent.address], root / "ckpt")
        yield Fleet(cluster, zone, agent, channels, targets, realistic)
        for channel in channels.values():
            channel.close()


#: A subjob that runs until it is stopped, so signals, logs and cancels find something alive.
_SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)"


def _seed_work(zone: grpc.Channel, agent: grpc.Channel, checkpoint: Path) -> list[str]:
    """Live work for the fuzzer to poke at: a job through the router and a subjob committed
    on the agent directly. Returns their ids."""
    zone_stub = zone_pb2_grpc.ZoneStub(zone)
    job = zone_stub.Submit(
        zone_pb2.SubmitRequest(
            spec=zone_pb2.JobSpec(
                command=[sys.executable, "-c", _SLEEPER],
                resources=common_pb2.Resources(gpus=1),
                restartable=True,
            )
        ),
        timeout=CALL_TIMEOUT_SECONDS,
    )
    agent_stub = agent_pb2_grpc.AgentStub(agent)

    def probe(subjob_id: str, **spec_fields: Any) -> agent_pb2.ProbeReply:
        return agent_stub.Probe(
            agent_pb2.ProbeRequest(
                probe_id=subjob_id,
                job_id="j-seed",
                resources=common_pb2.Resources(mig_profile="1g.10gb"),
                commit_if_fits=True,
                spec=common_pb2.SubjobSpec(
                    subjob_id=subjob_id,
                    job_id="j-seed",
                    command=[sys.executable, "-c", _SLEEPER],
                    **spec_fields,
                ),
            ),
            timeout=CALL_TIMEOUT_SECONDS,
        )

    # Classes outside their enums once reached Airlock's victim order unchecked.
    for bad in ({"priority": 37}, {"lifecycle": 29}):
        with pytest.raises(grpc.RpcError) as info:
            probe("s-bad", **bad)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert f"spec.{next(iter(bad))}" in info.value.details()  # type: ignore[attr-defined]
    reply = probe(
        "s-seed",
        priority=common_pb2.OPPORTUNISTIC,
        unit_count=3,
        checkpoint_dir=str(checkpoint),
    )
    assert reply.subjob.spec.subjob_id == "s-seed", reply
    return [job.job_id, "s-seed", "j-seed"]


def _request(draw: Any, fleet: Fleet, method: MethodDescriptor) -> Message:
    message = GetMessageClass(method.input_type)()
    wild = bool(draw(st.booleans()))
    return fill_message(draw, message, fleet.realistic, wild)


_IDS = re.compile(r'\b(?:job_id|subjob_id|lease_id|agent_id|slice_id): "([^"\\]{1,64})"')


def _learn_ids(fleet: Fleet, reply: Message) -> None:
    """Ids the daemons hand out become realistic strings for later requests."""
    for found in _IDS.findall(str(reply)):
        if found not in fleet.realistic and len(fleet.realistic) < MAX_REALISTIC:
            fleet.realistic.append(found)


def _call(fleet: Fleet, target: Target, requests: list[Message]) -> None:
    """Send one call; record a failure unless the answer is OK or a proper status."""
    channel = fleet.channels[target.address]
    path = f"/{target.service.full_name}/{target.method.name}"
    reply_class = GetMessageClass(target.method.output_type)
    serialize = type(requests[0]).SerializeToString
    is_stream_out = target.method.server_streaming
    try:
        if target.method.client_streaming:
            call = channel.stream_stream(path, serialize, reply_class.FromString)
            responses = call(iter(requests), timeout=STREAM_READ_SECONDS * 3)
            for i, _ in enumerate(responses):
                if i + 1 >= STREAM_ITEMS:
                    responses.cancel()
                    break
        elif is_stream_out:
            stream = channel.unary_stream(path, serialize, reply_class.FromString)
            responses = stream(requests[0], timeout=STREAM_READ_SECONDS)
            for i, _ in enumerate(responses):
                if i + 1 >= STREAM_ITEMS:
                    responses.cancel()
                    break
        else:
            unary = channel.unary_unary(path, serialize, reply_class.FromString)
            _learn_ids(fleet, unary(requests[0], timeout=CALL_TIMEOUT_SECONDS))
        code = grpc.StatusCode.OK
        details = ""
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""  # type: ignore[attr-defined]
    fleet.codes[code.name] = fleet.codes.get(code.name, 0) + 1
    shown = f"{target.name} -> {code.name}: {details[:300]!r}; request {_show(requests[0])}"
    if code == grpc.StatusCode.OK:
        return
    if "Traceback" in details or 'File "' in details:
        fleet.failures.append(f"traceback on the wire: {shown}")
    elif code in PROPER_CODES:
        if not details:
            fleet.failures.append(f"no message: {shown}")
    elif code == grpc.StatusCode.UNAVAILABLE:
        fleet.up_failures.append(shown)
    elif code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED) and (
        is_stream_out or target.method.client_streaming
    ):
        return  # the bounded read of a stream ended it
    else:
        fleet.failures.append(shown)


def _show(message: Message) -> str:
    text = repr(message)
    return text if len(text) < 600 else text[:600] + f"... ({len(text)} characters)"


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def test_a_job_the_agent_refuses_fails_once_instead_of_retrying(fleet: Fleet) -> None:
    """Found by this fuzzer: a job whose workdir the agent does not have was committed,
    refused with INVALID_ARGUMENT, and placed again several times a second for ever.
    Runs before the fuzzing, which may drain the agent or fill its GPUs."""
    zone = zone_pb2_grpc.ZoneStub(fleet.channels[fleet.zone.address])
    job = zone.Submit(
        zone_pb2.SubmitRequest(
            spec=zone_pb2.JobSpec(
                command=[sys.executable, "-c", "print(1)"],
                workdir="/nonexistent/laminar-fuzz",
                resources=common_pb2.Resources(gpus=1),
            )
        ),
        timeout=CALL_TIMEOUT_SECONDS,
    )
    wait_for(
        lambda: (
            zone.GetJob(zone_pb2.GetJobRequest(job_id=job.job_id), timeout=10).state
            in (zone_pb2.JOB_FAILED, zone_pb2.JOB_SUCCEEDED)
        )
    )
    done = zone.GetJob(zone_pb2.GetJobRequest(job_id=job.job_id), timeout=10)
    assert done.state == zone_pb2.JOB_FAILED and "workdir" in done.reason, done.reason
    agent = agent_pb2_grpc.AgentStub(fleet.channels[fleet.agent.address])
    subjobs = agent.ListSubjobs(agent_pb2.ListSubjobsRequest(job_id=job.job_id), timeout=10)
    assert len(subjobs.subjobs) == 1, [s.reason for s in subjobs.subjobs]
    with pytest.raises(grpc.RpcError) as info:
        zone.Submit(zone_pb2.SubmitRequest(spec=zone_pb2.JobSpec(command=["", "x"])), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "spec.command" in info.value.details()  # type: ignore[attr-defined]


def test_random_messages_to_every_rpc_get_proper_answers(fleet: Fleet) -> None:
    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        derandomize=not os.environ.get("LAMINAR_FUZZ_RANDOM"),
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        target = data.draw(st.sampled_from(fleet.targets), label="rpc")
        count = (
            data.draw(st.integers(min_value=1, max_value=3))
            if target.method.client_streaming
            else 1
        )
        requests = [_request(data.draw, fleet, target.method) for _ in range(count)]
        _call(fleet, target, requests)

    fuzz()
    print("answers by code:", dict(sorted(fleet.codes.items())))
    for daemon in (fleet.zone, fleet.agent):
        assert daemon.is_running(), f"{daemon.name} exited; see {daemon.log_path}"
        assert _serving(daemon.address), f"{daemon.name} no longer answers health checks"
        # Background work (placement, Airlock, heartbeats) fails into the log, not the wire.
        log_text = daemon.log_path.read_text(errors="replace")
        assert "Traceback" not in log_text, f"{daemon.name} logged a traceback: {daemon.log_path}"
    assert not fleet.failures, "\n".join(fleet.failures)
    # UNAVAILABLE is a proper answer only from a daemon that is up (checked just above)
    # about something else that is not (an agent address the fuzzer made up).
    for shown in fleet.up_failures:
        assert "Agent." not in shown.split(" -> ")[0], f"the agent said UNAVAILABLE: {shown}"
    _check_agent_ledger(fleet)
    _check_journals(fleet)


def _check_agent_ledger(fleet: Fleet) -> None:
    channel = fleet.channels[fleet.agent.address]
    get = channel.unary_unary(
        "/laminar.v1.Agent/GetInventory",
        agent_pb2.GetInventoryRequest.SerializeToString,
        agent_pb2.Inventory.FromString,
    )
    inventory = get(agent_pb2.GetInventoryRequest(), timeout=CALL_TIMEOUT_SECONDS)
    assert inventory.slices, "the agent lists no slices"
    for s in inventory.slices:
        used = s.committed_milli + s.leased_milli
        assert used <= s.capacity_milli, f"{s.slice_id}: {used} of {s.capacity_milli} milli"
        memory = s.committed_memory_bytes + s.leased_memory_bytes
        assert memory <= s.memory_total_bytes, (
            f"{s.slice_id}: {memory} of {s.memory_total_bytes} bytes committed or leased"
        )


def _check_journals(fleet: Fleet) -> None:
    for path in (fleet.zone.state_dir / "zone.db", fleet.agent.state_dir / "agent.db"):
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",), path
    with sqlite3.connect(f"file:{fleet.zone.state_dir / 'zone.db'}?mode=ro", uri=True) as db:
        for job_id, state, body in db.execute("SELECT job_id, state, body FROM jobs"):
            job = zone_pb2.Job.FromString(body)
            assert job.job_id == job_id, f"job {job_id} decodes as {job.job_id}"
            assert state in zone_pb2.JobState.values(), f"job {job_id}: state {state}"
    state_names = set(common_pb2.SubjobState.keys())
    with sqlite3.connect(f"file:{fleet.agent.state_dir / 'agent.db'}?mode=ro", uri=True) as db:
        for subjob_id, state, blob in db.execute("SELECT subjob_id, state, spec_blob FROM subjobs"):
            spec = common_pb2.SubjobSpec.FromString(blob)
            assert spec.subjob_id == subjob_id, f"subjob {subjob_id} decodes as {spec.subjob_id}"
            assert state in state_names, f"subjob {subjob_id}: state {state}"
    assert Path(fleet.agent.state_dir / "agent.json").exists()
