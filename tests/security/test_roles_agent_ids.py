"""Issue 13, item 2: anyone who reached the router could heartbeat for a rogue agent
(a new ``agent_id``, its own address, free shapes) and receive real jobs with their
environment. Under mTLS the certificate must name the id (test_security_mtls.py); with
a shared secret, which every host holds, ``auth.agent_ids`` is the list of ids that may
join. A secret holder heartbeating under another id is refused, and the router keeps
placing work on its real agent."""

from __future__ import annotations

from pathlib import Path

import grpc
from seckit import failure, run_job, secret_cluster

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.security import Trust

SECRET = "control-secret-held-by-every-host"


def test_a_new_agent_id_off_the_allowed_list_cannot_join(tmp_path: Path) -> None:
    agents_only = '[auth]\nagent_ids = ["gpu-01"]\n'
    with secret_cluster(tmp_path, SECRET, agents_only) as (_, zone):
        rogue = zone_pb2.HeartbeatRequest(
            summary=common_pb2.AgentSummary(
                agent_id="gpu-99",
                address="127.0.0.1:9",
                shapes=[common_pb2.ShapeCapacity(shape="H100-80GB", free=8, total=8)],
            )
        )
        with Trust(secret=SECRET).channel(zone.address) as channel:
            control = zone_pb2_grpc.ZoneControlStub(channel)
            code, details = failure(lambda: control.Heartbeat(rogue, timeout=5))
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert "gpu-99" in details and "auth.agent_ids" in details
            code, details = failure(lambda: control.Heartbeats(iter([rogue]), timeout=5))
            assert code == grpc.StatusCode.PERMISSION_DENIED  # the stream checks the same
            assert "gpu-99" in details and "auth.agent_ids" in details
            agents = zone_pb2_grpc.ZoneStub(channel).ListAgents(
                zone_pb2.ListAgentsRequest(), timeout=10
            )
            assert [a.agent_id for a in agents.agents] == ["gpu-01"]
            run_job(channel, "placed on the real agent")
