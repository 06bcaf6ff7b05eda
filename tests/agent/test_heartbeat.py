"""The agent's heartbeat client against a real ZoneControl server started in the test.

The test server records what arrives and acknowledges events and Airlock
actions only from the second heartbeat on, so the test sees that
unacknowledged ones are sent again and acknowledged ones are not.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from waiting import gate_code, wait_for

from cli.cluster import LocalCluster
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc


class RecordingZone(zone_pb2_grpc.ZoneControlServicer):
    def __init__(self) -> None:
        self.requests: list[zone_pb2.HeartbeatRequest] = []
        self.lock = threading.Lock()

    def Heartbeat(
        self, request: zone_pb2.HeartbeatRequest, context: Any
    ) -> zone_pb2.HeartbeatReply:
        with self.lock:
            self.requests.append(request)
            later = len(self.requests) > 1
            ack = max((e.seq for e in request.events), default=0) if later else 0
            ack_actions = max((a.seq for a in request.airlock_actions), default=0) if later else 0
        return zone_pb2.HeartbeatReply(
            acked_seq=ack, period_seconds=0.2, zone="test", acked_action_seq=ack_actions
        )

    def snapshot(self) -> list[zone_pb2.HeartbeatRequest]:
        with self.lock:
            return list(self.requests)


@pytest.fixture
def zone() -> Iterator[tuple[str, RecordingZone]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = RecordingZone()
    zone_pb2_grpc.add_ZoneControlServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(None)


def test_heartbeats_carry_summary_and_events_until_acked(
    tmp_path: Path, zone: tuple[str, RecordingZone]
) -> None:
    address, recorder = zone
    with LocalCluster(tmp_path) as cluster:
        agent = cluster.start_agent("hb", "2xA100-40GB", zone=address)
        wait_for(lambda: len(recorder.requests) >= 1)
        first = recorder.requests[0]
        assert first.summary.agent_id == "hb" and first.summary.address == agent.address
        assert {s.shape: s.total for s in first.summary.shapes} == {"gpu:A100-40GB": 2}
        with grpc.insecure_channel(agent.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            stub.Probe(
                agent_pb2.ProbeRequest(
                    job_id="j",
                    resources=common_pb2.Resources(gpus=1),
                    commit_if_fits=True,
                    spec=common_pb2.SubjobSpec(
                        subjob_id="s", command=[sys.executable, "-c", "pass"]
                    ),
                ),
                timeout=10,
            )

        def saw_success() -> bool:
            return any(
                e.subjob.spec.subjob_id == "s" and e.subjob.state == common_pb2.SUCCEEDED
                for r in list(recorder.requests)
                for e in r.events
            )

        wait_for(saw_success)
        # Once acknowledged, events are not sent again.
        wait_for(lambda: len(recorder.requests) >= 3 and not recorder.requests[-1].events)
        for request in recorder.requests:
            seqs = [e.seq for e in request.events]
            assert seqs == sorted(set(seqs))  # in journal order, no duplicates within one


GIB = 1024**3


def test_readdress_ids_ride_heartbeats_until_the_router_ends_the_subjob(
    tmp_path: Path, zone: tuple[str, RecordingZone], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airlock hands a long-suspended restartable subjob to the zone router: its id is on
    every heartbeat until the router, having placed a copy, ends it with "readdressed:"."""
    monkeypatch.setenv("LAMINAR_AIRLOCK_READDRESS_AFTER_SECONDS", "0.3")
    address, recorder = zone
    gate = tmp_path / "gate"
    share = common_pb2.Resources(gpu_milli=400, gpu_memory_bytes=20 * GIB)
    with LocalCluster(tmp_path) as cluster:
        agent = cluster.start_agent("hb", "1xA100-80GB:shared", zone=address)
        with grpc.insecure_channel(agent.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            for subjob_id, priority in (
                ("crit", common_pb2.CRITICAL),
                ("mover", common_pb2.OPPORTUNISTIC),
            ):
                spec = common_pb2.SubjobSpec(
                    subjob_id=subjob_id,
                    job_id=f"job-{subjob_id}",
                    command=[sys.executable, "-c", gate_code(gate)],
                    priority=priority,  # type: ignore[arg-type]
                    resources=share,
                    restartable=True,
                )
                reply = stub.Probe(
                    agent_pb2.ProbeRequest(
                        job_id=spec.job_id, resources=share, commit_if_fits=True, spec=spec
                    ),
                    timeout=10,
                )
                assert reply.subjob.state == common_pb2.RUNNING
            stub.InjectLoad(
                agent_pb2.InjectLoadRequest(gpu_index=0, used_bytes=40 * GIB), timeout=10
            )

            def asked(n: int) -> bool:
                return sum("mover" in r.readdress_subjob_ids for r in recorder.snapshot()) >= n

            wait_for(lambda: asked(3))  # asked again and again, not once
            first = next(r for r in recorder.snapshot() if "mover" in r.readdress_subjob_ids)
            assert list(first.readdress_subjob_ids) == ["mover"]
            assert first.summary.suspended_subjobs == 1
            assert first.summary.pressure in (common_pb2.ELEVATED, common_pb2.CRITICAL_PRESSURE)
            sent_actions = [a for r in recorder.snapshot() for a in r.airlock_actions]
            readdress = [a for a in sent_actions if a.step == "readdress"]
            assert readdress and readdress[0].subjob_id == "mover"
            assert "attempt 1/2" in readdress[0].reason
            got = stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="mover"), timeout=10)
            assert got.state == common_pb2.SUSPENDED

            # The router placed a copy elsewhere and now ends the old one.
            stub.SignalSubjob(
                agent_pb2.SignalSubjobRequest(
                    subjob_id="mover",
                    signal=agent_pb2.TERMINATE,
                    reason="readdressed: copy mover-2 committed on agent hb2",
                ),
                timeout=30,
            )
            ended = stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="mover"), timeout=10)
            assert ended.state == common_pb2.KILLED
            assert ended.reason.startswith("readdressed: copy mover-2 committed on agent hb2")

            def told_and_dropped() -> bool:
                requests = recorder.snapshot()
                seen = [
                    i
                    for i, r in enumerate(requests)
                    for e in r.events
                    if e.subjob.spec.subjob_id == "mover" and e.subjob.state == common_pb2.KILLED
                ]
                return bool(seen) and "mover" not in requests[-1].readdress_subjob_ids

            wait_for(told_and_dropped)
            # Actions, once acknowledged, are not sent again.
            wait_for(lambda: not recorder.snapshot()[-1].airlock_actions)
            for request in recorder.snapshot():
                seqs = [a.seq for a in request.airlock_actions]
                assert seqs == sorted(set(seqs))  # in journal order, no duplicates within one
            crit = stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="crit"), timeout=10)
            assert crit.state == common_pb2.RUNNING
            gate.write_text("go")
            wait_for(
                lambda: (
                    stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="crit"), timeout=10).state
                    == common_pb2.SUCCEEDED
                )
            )
