"""The summary every probe and release reply carries: its capacity part is built once per
ledger state and must still follow every change of that state."""

from __future__ import annotations

from pathlib import Path

from laminar_agent.inventory.fake import FakeGpuBackend
from laminar_agent.node import Node
from laminar_api.v1 import agent_pb2, common_pb2


def _fresh(node: Node) -> tuple[list[tuple[str, int, int, int, int]], list[int], int]:
    """What the ledger reports now, computed afresh (no memo, no kept message)."""
    ledger = node.ledger
    shapes = [
        (s.shape, s.free, s.total, s.max_free_milli, s.max_free_memory_bytes)
        for s in ledger._shapes()
    ]
    host = ledger._host_free()
    return shapes, list(host.gpu_free_milli), ledger.pending_leases()


def _reported(
    summary: common_pb2.AgentSummary,
) -> tuple[list[tuple[str, int, int, int, int]], list[int], int]:
    shapes = [
        (s.shape, s.free, s.total, s.max_free_milli, s.max_free_memory_bytes)
        for s in summary.shapes
    ]
    return shapes, list(summary.gpu_free_milli), summary.active_leases


async def test_each_summary_reports_the_ledger_as_it_is_now(tmp_path: Path) -> None:
    node = Node("a", FakeGpuBackend("2xH100-80GB:shared", agent_id="a"), tmp_path)
    try:
        seen = [_reported(node.summary())]
        assert seen[0] == _fresh(node)
        leases = []
        for i, milli in enumerate((300, 1000, 200)):
            request = agent_pb2.ProbeRequest(
                probe_id=f"p{i}",
                job_id=f"j{i}",
                resources=common_pb2.Resources(gpu_milli=milli),
                lease_ttl_seconds=30,
            )
            reply = await node.probe(request)
            assert reply.HasField("lease")
            leases.append(reply.lease.lease_id)
            # The reply's summary and the next one (no change between) both show the grant.
            assert _reported(reply.summary) == _fresh(node) == _reported(node.summary())
            seen.append(_reported(reply.summary))
        node.ledger.hold_back("test", ["gpu1"])  # a reservation changes what is advertised
        seen.append(_reported(node.summary()))
        assert seen[-1] == _fresh(node)
        node.ledger.release_hold("test")
        for lease_id in leases:
            assert node.release([lease_id]) == 1
            seen.append(_reported(node.summary()))
            assert seen[-1] == _fresh(node)
        assert seen[-1] == seen[0]  # all given back: as at the start
        assert len({repr(s) for s in seen}) >= 5  # the figures did change on the way
    finally:
        await node.close()
