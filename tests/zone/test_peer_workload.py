"""Zone-summary exchange carries each router's own observed task shapes: a peer adds them
to its target workload, and never sends back what it learned from others."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
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


@pytest.mark.parametrize("peers", [(), ("127.0.0.1:1",)], ids=["no-peer", "a-peer"])
async def test_the_summary_is_made_each_period_only_for_peers(
    tmp_path: Path, peers: tuple[str, ...]
) -> None:
    """A router with no peer sums nothing for them each period (the summary walks every
    agent and job); one with a peer makes it every period, and a peer that calls in gets
    one at once."""
    zone = open_state(tmp_path)
    try:
        router = PeerRouter(zone, PeerSettings(peers=peers, exchange_seconds=0.01))
        made: list[zone_pb2.ZoneSummary] = []
        real = router.local_summary

        def counted() -> zone_pb2.ZoneSummary:
            made.append(real())
            return made[-1]

        router.local_summary = counted  # type: ignore[method-assign]
        stop = asyncio.Event()
        passes: list[int] = []

        def beat() -> None:
            passes.append(len(made))
            if len(passes) == 3:
                stop.set()

        await router.run(stop, beat)
        assert passes == ([0, 0, 0] if not peers else [0, 1, 2])
        reply = router.accept(zone_pb2.ZoneSummary(zone="other", address="127.0.0.1:2"))
        assert made[-1] is reply and reply.zone == zone.zone_name
    finally:
        await zone.close()
        zone.store.close()
