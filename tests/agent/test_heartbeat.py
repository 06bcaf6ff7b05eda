"""The agent's heartbeat client against a real ZoneControl server started in the test.

The test server records what arrives and acknowledges events only from the
second heartbeat on, so the test sees that unacknowledged events are sent
again and acknowledged ones are not.
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
from waiting import wait_for

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
            ack = max((e.seq for e in request.events), default=0) if len(self.requests) > 1 else 0
        return zone_pb2.HeartbeatReply(acked_seq=ack, period_seconds=0.2, zone="test")


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
