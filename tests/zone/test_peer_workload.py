"""Zone-summary exchange carries each router's own observed task shapes: a peer adds them
to its target workload, and never sends back what it learned from others."""

from __future__ import annotations

from pathlib import Path

from test_membership import open_state

from laminar_api.v1 import zone_pb2
from laminar_base.demand import Demand, HostCap
from laminar_base.fragmentation import PodShape, demand_pod
from laminar_base.wire import workload_counts, workload_message
from laminar_zone.config import PeerSettings
from laminar_zone.peers import PeerRouter


async def test_a_peers_own_shapes_join_the_target_and_are_not_sent_back(tmp_path: Path) -> None:
    zone = open_state(tmp_path)
    try:
        router = PeerRouter(zone, PeerSettings())
        router.address = "127.0.0.1:1"
        mine = demand_pod(Demand(gpus=1), HostCap())
        zone.placer.workload.observe(mine)
        theirs = PodShape(4000, 0, 1, 500)
        summary = zone_pb2.ZoneSummary(zone="other", address="127.0.0.1:2")
        summary.workload.extend(workload_message({theirs: 5}))
        reply = router.accept(summary)
        assert zone.placer.workload.counts[theirs] == 5
        assert workload_counts(reply.workload) == {
            PodShape(mine.cpu_milli, 0, 1, 1000): 1
        }  # its own arrivals only
        # The peer's next summary replaces its last.
        summary.ClearField("workload")
        summary.workload.extend(workload_message({theirs: 8}))
        router.accept(summary)
        assert zone.placer.workload.counts[theirs] == 8
    finally:
        await zone.close()
        zone.store.close()
