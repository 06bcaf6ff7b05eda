"""The router's one pass (ZoneState.one_pass, laminar_zone.queue.class_order) with no
sockets: when a slice frees, the waiting work of the highest class gets it, whether it is
rigid or atomized; a lower class's rigid job never takes a slice that a higher class's
atomized bid wins in the same pass (issue 17: one class order for all work)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from corekit import FakeAgent
from test_zone_core_props import Harness

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import LIVE_SUBJOB_STATES, EndCause

GIB = 1024**3


@dataclass
class WindowAgent(FakeAgent):
    """An in-process agent that advertises its free slices as windows, as the agent does
    (laminar_agent.ledger.Ledger.windows)."""

    def summary(self) -> common_pb2.AgentSummary:
        summary = super().summary()
        for w in self.ledger.windows(time.time(), {}, 16):
            summary.windows.add(
                agent_id=self.agent_id,
                slice_id=w.slice.slice_id,
                kind=common_pb2.WHOLE_GPU,
                gpu_milli=w.milli,
                memory_bytes=w.memory_bytes,
                start_unix=w.start_unix,
                end_unix=w.end_unix,
                gpu_model=w.slice.gpu_model,
            )
        return summary


def atomized(priority: int, checkpoint: Path) -> zone_pb2.JobSpec:
    contract = common_pb2.AtomizationContract(
        total_units=10,
        seconds_per_unit=[
            common_pb2.Quantile(q=0.5, value=1.0),
            common_pb2.Quantile(q=0.95, value=1.5),
        ],
        peak_memory_bytes=[
            common_pb2.Quantile(q=0.5, value=2 * GIB),
            common_pb2.Quantile(q=0.95, value=4 * GIB),
        ],
        checkpoint_overhead_seconds=0.1,
        checkpoint_dir=str(checkpoint),
    )
    return zone_pb2.JobSpec(
        command=["true"],
        resources=common_pb2.Resources(gpus=1),
        priority=priority,  # type: ignore[arg-type]
        atomization=contract,
    )


def rigid(priority: int, expected_seconds: float = 0.0) -> zone_pb2.JobSpec:
    return zone_pb2.JobSpec(
        command=["true"],
        resources=common_pb2.Resources(gpus=1),
        priority=priority,  # type: ignore[arg-type]
        expected_seconds=expected_seconds,
    )


async def freed_slice_goes_to(
    market_class: int, rigid_class: int, rigid_first: bool = False, rigid_seconds: float = 0.0
) -> str:
    """One GPU busy with a blocker; an atomized job of ``market_class`` and a rigid job of
    ``rigid_class`` wait (submitted in that order, or the other with ``rigid_first``); the
    blocker ends and one pass runs: which job got the GPU."""
    with tempfile.TemporaryDirectory() as root:
        agent = WindowAgent("a0", 1)
        harness = Harness(Path(root), agents=[agent])
        try:
            await harness.flush()
            blocker = await harness.zone.submit(rigid(common_pb2.PRODUCTION), "")
            await harness.call(harness.zone.queue_pass())
            (running,) = agent.live()
            assert harness.zone.get(blocker.job_id).state == zone_pb2.JOB_RUNNING
            await harness.flush()
            if rigid_first:
                job = await harness.zone.submit(rigid(rigid_class, rigid_seconds), "")
            piece = await harness.zone.submit(atomized(market_class, Path(root) / "ckpt"), "")
            if not rigid_first:
                job = await harness.zone.submit(rigid(rigid_class, rigid_seconds), "")
            await harness.call(harness.zone.queue_pass())  # nothing is free: both wait
            assert [s.spec.subjob_id for s in agent.live()] == [running.spec.subjob_id]
            agent.end(running.spec.subjob_id, common_pb2.SUCCEEDED, EndCause.EXITED, "ok")
            await harness.flush()  # the router hears of it; the GPU shows as a window
            await harness.call(harness.zone.queue_pass())
            assert len(agent.live()) == 1
            winners = {
                job_id
                for job_id in (piece.job_id, job.job_id)
                if any(p.state in LIVE_SUBJOB_STATES for p in harness.zone.get(job_id).placements)
            }
            assert len(winners) == 1, winners
            harness.check_always()
            (winner,) = winners
            return "atomized" if winner == piece.job_id else "rigid"
        finally:
            await harness.close()


@pytest.mark.parametrize(
    ("market_class", "rigid_class", "winner"),
    [
        (common_pb2.PRODUCTION, common_pb2.BATCH, "atomized"),
        (common_pb2.BATCH, common_pb2.OPPORTUNISTIC, "atomized"),
        (common_pb2.OPPORTUNISTIC, common_pb2.BATCH, "rigid"),
    ],
)
def test_a_freed_slice_goes_to_the_higher_class_rigid_or_atomized(
    market_class: int, rigid_class: int, winner: str
) -> None:
    assert asyncio.run(freed_slice_goes_to(market_class, rigid_class)) == winner


@pytest.mark.parametrize(("rigid_first", "winner"), [(False, "atomized"), (True, "rigid")])
def test_within_a_class_the_freed_slice_goes_to_the_job_first_in_queue_order(
    rigid_first: bool, winner: str
) -> None:
    """One order within a class: the atomized job bids before the rigid job of its class
    submitted after it (and not before one submitted before it), as the queue would order
    two rigid jobs."""
    got = asyncio.run(freed_slice_goes_to(common_pb2.BATCH, common_pb2.BATCH, rigid_first))
    assert got == winner


@pytest.mark.parametrize(("rigid_seconds", "winner"), [(5.0, "rigid"), (60.0, "atomized")])
def test_a_rigid_job_shorter_than_the_atomized_work_before_it_goes_first(
    rigid_seconds: float, winner: str
) -> None:
    """Shorter first (``queue.bids_ahead``): the atomized job (10 units of 1 s at its
    median, about 10 s of work) submitted first bids ahead of the rigid job of its class only
    if the rigid job declares a longer run; the router fills the bidding's work itself."""
    got = asyncio.run(
        freed_slice_goes_to(common_pb2.BATCH, common_pb2.BATCH, rigid_seconds=rigid_seconds)
    )
    assert got == winner
