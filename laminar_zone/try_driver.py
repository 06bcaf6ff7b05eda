"""A placement try, driven: the steps of :mod:`laminar_zone.trying` carried out with awaits.

:class:`TryDriver` runs the generators :func:`~laminar_zone.trying.place_try` (a job
placed now, from a Submit or a queue pass) and :func:`~laminar_zone.trying.commit_steps`
(leases a client probed, CommitJob): it holds a placement slot, gathers leases through the
:class:`~laminar_zone.placer.Placer` (the commit on probe journaled before the probe goes
out, :class:`_ProbeCommit`), commits every member at once, and hands each outcome back to
the try as the core reads it (:func:`laminar_zone.failures.failure_of`). It also makes the
router's two other calls to agents: a subjob's Commit from a lease, and a stop. What a try
does next, and what any answer means, is the core's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_base.causes import EndCause
from laminar_zone.core import Failure, Member, TryPlan
from laminar_zone.entry import Entry
from laminar_zone.failures import failure_of
from laminar_zone.placements import apply_start_reply
from laminar_zone.placer import Ask
from laminar_zone.trying import (
    Clock,
    CommitMembers,
    CommitOnProbe,
    DoInstructions,
    Gathered,
    GatherLeases,
    PassTry,
    RunInstructions,
    Slot,
    TryStep,
    commit_steps,
    place_try,
)
from laminar_zone.view import AgentRecord

if TYPE_CHECKING:
    from laminar_zone.zone_parts import ZoneParts

log = logging.getLogger("laminar.zone.jobs")

#: The router's clocks, which the core's steps read their time from.
CLOCK = Clock(mono=time.monotonic, unix=time.time)


class TryDriver:
    """Placement tries and the router's calls to agents (Commit, SignalSubjob)."""

    def __init__(self, state: ZoneParts) -> None:
        self.state = state
        #: Tries under way at once (``placement.concurrency``).
        self._slots = asyncio.Semaphore(state.config.placement.concurrency)

    async def place(self, entry: Entry, *, from_queue: bool = False) -> bool:
        """One placement try (:func:`laminar_zone.trying.place_try`), its requests awaited."""
        return await self.drive(self._place_try(entry, from_queue))

    async def start_from_pass(self, entry: Entry) -> tuple[bool, asyncio.Task[bool]]:
        """A queue pass's start of ``entry``, pipelined (:class:`laminar_zone.trying.PassTry`):
        the try runs as a task of its own (``ZoneState.spawn``: shutdown cancels it) and
        this returns once it ended or waits on the network, with the pass's answer and the
        task (a pass with a clearing round open awaits it before the round clears:
        :class:`laminar_zone.trying.SettleStarts`). The pass waits with it for a placement
        slot, so tries started by passes stay within ``placement.concurrency``."""
        at_network = asyncio.get_running_loop().create_future()

        def noticed() -> None:
            if not at_network.done():
                at_network.set_result(None)

        pending = PassTry(noticed)
        task = self.state.spawn(
            self.drive(pending.steps(self._place_try(entry, True))),
            f"place-{entry.job.job_id}",
        )
        try:
            # A gather that sends no probe (no room) ends the try before the pass resumes.
            await asyncio.wait((task, at_network), return_when=asyncio.FIRST_COMPLETED)
        finally:
            at_network.cancel()
        if task.done():
            return task.result(), task  # ended before the network: its result, or its error
        answer = pending.answer()
        assert answer is not None  # it waits on the network, past its slot
        return answer, task

    def _place_try(self, entry: Entry, from_queue: bool) -> Generator[TryStep, Any, bool]:
        placement = self.state.config.placement
        return place_try(
            self.state.core,
            entry,
            from_queue=from_queue,
            lease_ttl_seconds=placement.lease_ttl_seconds,
            budget_seconds=placement.budget_seconds,
            clock=CLOCK,
        )

    async def commit_all(
        self, entry: Entry, chosen: list[tuple[AgentRecord, agent_pb2.Lease]]
    ) -> bool:
        """Commit leases a client probed (CommitJob): :func:`laminar_zone.trying.commit_steps`."""
        members = [Member(r.agent_id, r.address, tuple(lease.slice_ids)) for r, lease in chosen]
        return await self.drive(commit_steps(self.state.core, entry, members, chosen, CLOCK))

    async def drive(
        self, steps: Generator[TryStep, Any, bool], first: TryStep | None = None
    ) -> bool:
        """Carry out a try's requests in order, each awaited, from ``first`` on when the
        caller already took it from ``steps`` (a move decided within its heartbeat); the
        slot it asks for is held until it ends."""
        async with contextlib.AsyncExitStack() as held:
            try:
                answer: Any = None
                while True:
                    if first is not None:
                        step, first = first, None
                    else:
                        try:
                            step = steps.send(answer)
                        except StopIteration as done:
                            return bool(done.value)
                    answer = None
                    match step:
                        case Slot():
                            await held.enter_async_context(self._slots)
                        case RunInstructions(instructions):
                            await self.state._run(instructions)
                        case DoInstructions(instructions):
                            self.state._do(instructions)
                        case GatherLeases(entry, plan, exclude):
                            answer = await self.gather_leases(entry, plan, exclude)
                        case CommitMembers(entry, placements, leases, env):
                            answer = await self.commit_members(entry, placements, leases, env)
                        case _:
                            raise AssertionError(f"a try step the router does not know: {step}")
            finally:
                steps.close()

    async def gather_leases(
        self, entry: Entry, plan: TryPlan, exclude: frozenset[str] = frozenset()
    ) -> Gathered:
        """Probe for the try's leases (Placer.gather), the commit on probe journaled first
        (a :class:`~laminar_zone.trying.GatherLeases` request answered; a move's too)."""
        job = entry.job
        ask = Ask(
            job_id=job.job_id,
            resources=job.spec.resources,
            gang_size=plan.gang_size,
            priority=plan.priority,
            value=job.spec.value,
            tenant=job.spec.tenant,
        )
        hook = _ProbeCommit(self.state, entry) if plan.commit_on_probe else None
        got = await self.state.placer.gather(
            ask, exclude=set(exclude) or None, lease_ttl_seconds=plan.lease_ttl_seconds, commit=hook
        )
        reply = got.committed
        return Gathered(
            chosen=tuple(got.chosen) if got.chosen is not None else None,
            members=tuple(
                Member(r.agent_id, r.address, tuple(lease.slice_ids))
                for r, lease in got.chosen or ()
            ),
            failures=tuple(failure_of(e) for e in got.errors),
            reasons=tuple(got.reasons),
            probes=got.probes,
            bounces=got.bounces,
            pending=hook.book.pending if hook is not None else None,
            committed=reply.subjob if reply is not None else None,
            slice_ids=tuple(reply.lease.slice_ids) if reply is not None else (),
            unsure=got.unsure,
            counted_probes=hook.book.probes if hook is not None else 0,
        )

    async def commit_members(
        self,
        entry: Entry,
        placements: Sequence[zone_pb2.Placement],
        leases: Sequence[tuple[AgentRecord, agent_pb2.Lease]],
        env: Mapping[str, str] | None = None,
    ) -> list[Failure | None]:
        """Commit every member at once; each failure as the core reads it (a
        :class:`~laminar_zone.trying.CommitMembers` request answered; a move's too)."""
        outcomes = await asyncio.gather(
            *(
                self.commit_placement(entry, placement, lease, dict(env or {}))
                for placement, (_, lease) in zip(placements, leases, strict=True)
            ),
            return_exceptions=True,
        )
        return [failure_of(o) if isinstance(o, BaseException) else None for o in outcomes]

    # ---------------------------------------------------------------- calls to agents

    async def commit_placement(
        self,
        entry: Entry,
        placement: zone_pb2.Placement,
        lease: agent_pb2.Lease,
        env: dict[str, str] | None = None,
    ) -> None:
        """Commit ``lease`` to this placement of the job; the agent's reply is recorded."""
        spec = subjob_spec(entry, placement, env)
        subjob = await self.state.clients.stub(placement.agent_address).Commit(
            agent_pb2.CommitRequest(lease_id=lease.lease_id, spec=spec),
            timeout=self.state.config.placement.rpc_timeout_seconds,
        )
        apply_start_reply(placement, subjob)

    async def terminate(self, placement: zone_pb2.Placement, reason: str, cause: EndCause) -> None:
        """Ask the placement's agent to stop it; its end records ``cause`` (the reason is
        for people). An agent that did not answer is owed the stop (the sweep asks again);
        one that says the subjob has ended or is unknown owes nothing."""
        state = self.state
        address = placement.agent_address
        record = state.view.agents.get(placement.agent_id)
        if record is not None:
            address = record.address
        try:
            await state.clients.stub(address).SignalSubjob(
                agent_pb2.SignalSubjobRequest(
                    subjob_id=placement.subjob_id,
                    signal=agent_pb2.TERMINATE,
                    reason=reason,
                    end_cause=cause.wire,
                ),
                timeout=state.config.placement.rpc_timeout_seconds,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                log.warning(
                    "could not stop subjob %s on %s (asking again at the next sweep): %s",
                    placement.subjob_id,
                    placement.agent_id,
                    exc.details(),
                )
                stop = zone_pb2.Placement(
                    subjob_id=placement.subjob_id,
                    agent_id=placement.agent_id,
                    agent_address=address,
                )
                state.core.owe_stop(stop, reason, cause)
                return
        state.core.stop_taken(placement.subjob_id)


def subjob_spec(
    entry: Entry, placement: zone_pb2.Placement, env: dict[str, str] | None = None
) -> common_pb2.SubjobSpec:
    """How the agent should run this placement of the job."""
    job = entry.job
    return common_pb2.SubjobSpec(
        subjob_id=placement.subjob_id,
        job_id=job.job_id,
        tenant=job.spec.tenant,
        command=list(job.spec.command),
        env={**job.spec.env, **(env or {})},
        workdir=job.spec.workdir,
        priority=job.spec.priority or common_pb2.BATCH,
        lifecycle=job.spec.lifecycle or common_pb2.LONG,
        resources=job.spec.resources,
        grace_seconds=job.spec.grace_seconds,
        supports_release_signal=job.spec.supports_release_signal,
        restartable=job.spec.restartable,
        value=job.spec.value,
        expected_seconds=job.spec.expected_seconds,
        run_through_partitions=job.spec.run_through_partitions,
        array_job_id=job.array_id,
        array_index=job.array_index,
    )


class _ProbeCommit:
    """Commit on probe for one job's try (:class:`laminar_zone.placer.ProbeCommit`), as
    :class:`laminar_zone.trying.CommitOnProbe` keeps it: the intent is journaled before
    the probe goes out, and the agent is told how to run the member."""

    def __init__(self, state: ZoneParts, entry: Entry) -> None:
        self.state = state
        self.entry = entry
        self.book = CommitOnProbe(state.core, entry)

    def intent(self, record: AgentRecord) -> common_pb2.SubjobSpec:
        placement, instructions = self.book.intent(record.agent_id, record.address)
        self.state._do(instructions)
        return subjob_spec(self.entry, placement)

    def bounced(self, record: AgentRecord) -> None:
        self.book.bounced(record.agent_id)

    def may_have_run(self, exc: BaseException) -> bool:
        return failure_of(exc).unknown
