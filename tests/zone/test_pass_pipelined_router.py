"""The router's queue pass starts its jobs pipelined (TryDriver.start_from_pass), with
in-process agents and no sockets: the pass goes on while its tries' probes are held at
the agents, and a router that dies with tries in flight cancels them and keeps its
promises (test_zone_core_props.Harness checks them)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from corekit import FakeAgent
from test_zone_core_props import Harness

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_base.causes import EndCause


@dataclass
class GatedAgent(FakeAgent):
    """An agent whose probes wait at ``gate`` (a slow network) while it is shut."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    held: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.gate.set()

    async def _held(self) -> None:
        self.held += 1
        try:
            await self.gate.wait()
        finally:
            self.held -= 1

    async def Probe(
        self, request: agent_pb2.ProbeRequest, timeout: float = 0
    ) -> agent_pb2.ProbeReply:
        await self._held()
        return await super().Probe(request, timeout)

    async def ProbeBatch(
        self, request: agent_pb2.ProbeBatchRequest, timeout: float = 0
    ) -> agent_pb2.ProbeBatchReply:
        await self._held()
        return await super().ProbeBatch(request, timeout)


def _one_gpu() -> zone_pb2.JobSpec:
    return zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1))


async def _two_queued_with_room(harness: Harness) -> list[str]:
    """Two one-GPU jobs queued behind blockers on both one-GPU agents; the blockers end
    and the router hears of it: both jobs may start at the next pass."""
    agents = [a for a in harness.agents.values() if isinstance(a, GatedAgent)]
    await harness.flush()
    for _ in agents:
        await harness.zone.submit(_one_gpu(), "")
    await harness.call(harness.zone.queue_pass())
    blockers = [s.spec.subjob_id for a in agents for s in a.live()]
    assert len(blockers) == 2
    jobs = [(await harness.zone.submit(_one_gpu(), "")).job_id for _ in agents]
    await harness.call(harness.zone.queue_pass())  # nothing is free: both wait
    assert [harness.zone.get(j).state for j in jobs] == [zone_pb2.QUEUED] * 2
    for agent in agents:
        for subjob_id in [s.spec.subjob_id for s in agent.live()]:
            agent.end(subjob_id, common_pb2.SUCCEEDED, EndCause.EXITED, "ok")
    await harness.flush()
    for agent in agents:
        agent.gate.clear()
    return jobs


Scenario = Callable[[Harness, list[GatedAgent], list[str]], Awaitable[None]]


def _run(scenario: Scenario) -> None:
    """``scenario`` on a router over two gated one-GPU agents, once two queued jobs may
    start (the agents' gates shut)."""

    async def run() -> None:
        with tempfile.TemporaryDirectory() as root:
            agents = [GatedAgent("a0", 1), GatedAgent("a1", 1)]
            harness = Harness(Path(root), agents=list(agents))
            try:
                await scenario(harness, agents, await _two_queued_with_room(harness))
            finally:
                for agent in agents:
                    agent.gate.set()
                await harness.close()

    asyncio.run(run())


async def _pass_goes_on(harness: Harness, agents: list[GatedAgent], jobs: list[str]) -> None:
    # The pass ends with both probes sent, then held at their agents (gates shut): it
    # did not wait for their answers.
    await asyncio.wait_for(harness.zone.queue_pass(), 10.0)
    while [a.held for a in agents] != [1, 1]:
        await asyncio.sleep(0)  # the probes on their way (no timer: the loop's turns)
    assert all(harness.zone.entries[j].placing for j in jobs)

    for agent in agents:
        agent.gate.set()
    await harness.settle()
    assert [harness.zone.get(j).state for j in jobs] == [zone_pb2.JOB_RUNNING] * 2
    assert sorted(len(a.live()) for a in agents) == [1, 1]
    harness.check_always()


def test_a_pass_goes_on_while_its_tries_wait_on_the_network() -> None:
    _run(_pass_goes_on)


async def _dies_in_flight(harness: Harness, agents: list[GatedAgent], jobs: list[str]) -> None:
    await asyncio.wait_for(harness.zone.queue_pass(), 10.0)
    assert len(harness.zone.pending_tasks()) >= 2  # the tries, under way

    await harness.restart()  # cancels them (ZoneState.close)
    for agent in agents:
        agent.gate.set()
    for agent in agents:  # what reached an agent is carried out there, reply or not
        await asyncio.wait_for(agent.calls_handled(), 10.0)
    assert [a.held for a in agents] == [0, 0]
    await harness.flush()
    await harness.call(harness.zone.queue_pass())
    await harness.flush()
    harness.check_always()
    states = [harness.zone.get(j).state for j in jobs]
    assert states == [zone_pb2.JOB_RUNNING] * 2, states


def test_a_router_that_dies_with_tries_in_flight_keeps_its_promises() -> None:
    _run(_dies_in_flight)
