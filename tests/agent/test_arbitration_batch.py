"""The arbitration batch as the node drives it: probes arriving within one window are
settled together, in the core's order; a batch the core cannot settle fails its probes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from laminar_agent.inventory.fake import FakeGpuBackend
from laminar_agent.node import Node
from laminar_api.v1 import agent_pb2, common_pb2


def _probe(job: str, priority: int) -> agent_pb2.ProbeRequest:
    return agent_pb2.ProbeRequest(
        probe_id=f"p-{job}",
        job_id=job,
        priority=priority,  # type: ignore[arg-type]
        resources=common_pb2.Resources(gpu_milli=1000),
        lease_ttl_seconds=30,
    )


async def test_probes_within_one_window_are_settled_together_by_priority(tmp_path: Path) -> None:
    node = Node(
        "a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path, batch_seconds=0.05
    )
    try:
        # The batch probe arrives first; the production probe, within the same window,
        # takes the one GPU: the batch is settled in priority order, not arrival order.
        first = asyncio.create_task(node.probe(_probe("batch", common_pb2.BATCH)))
        await asyncio.sleep(0)  # the first probe is collected before the second arrives
        second = asyncio.create_task(node.probe(_probe("prod", common_pb2.PRODUCTION)))
        async with asyncio.timeout(10):
            low, high = await asyncio.gather(first, second)
        assert high.WhichOneof("outcome") == "lease"
        assert low.WhichOneof("outcome") == "bounce"
        # A later probe opens a batch of its own.
        async with asyncio.timeout(10):
            late = await node.probe(_probe("late", common_pb2.CRITICAL))
        assert late.WhichOneof("outcome") == "bounce"  # the GPU is leased
    finally:
        await node.close()


async def test_a_batch_the_core_cannot_settle_fails_its_probes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node("a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path)
    try:

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("arbitration failed")

        monkeypatch.setattr(node.core, "arbitrate", broken)
        probes = [node.probe(_probe(f"j{i}", common_pb2.BATCH)) for i in range(2)]
        async with asyncio.timeout(10):  # each fails rather than waiting for ever
            outcomes = await asyncio.gather(*probes, return_exceptions=True)
        assert [str(o) for o in outcomes] == ["arbitration failed"] * 2
        monkeypatch.undo()
        async with asyncio.timeout(10):  # the next batch is settled as usual
            reply = await node.probe(_probe("after", common_pb2.BATCH))
        assert reply.WhichOneof("outcome") == "lease"
    finally:
        await node.close()
