"""The router's whole job-handling state (``ZoneState``: submit, placement, commits, the
queue, subjob events, reconciliation, loss, retries, cancel, restart from the journal),
driven with no sockets by random interleavings of what agents, users and time do, and
checked against the promises the router makes:

- no GPU ever holds two subjobs (whole GPUs here);
- a subjob id starts at most once, and one job member never runs in two places once every
  reachable agent has reported;
- nothing runs that the router does not count on (copies of ended, retried or unknown
  jobs are stopped once their agent reports);
- every ended subjob the router records has a cause; retries never exceed max_retries;
  a job succeeds only when every member of one attempt succeeded;
- no job is lost: once agents are healthy and work ends, every submitted job ends.

The agents are in-process (tests/zone/corekit.py) with the agent's real ledger deciding.
A run replays step for step: the router and the agents read a clock the test moves, and
job, probe and lease ids come from seeded or counting generators, so a failing
interleaving that hypothesis reports fails again when run alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, cast

import pytest
from corekit import FakeAgent, FakeClients, ManualClock, SeededIds, replayable, settle
from holdings_scan import assert_holdings_match
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import (
    ENDED_SUBJOB_STATES,
    LIVE_SUBJOB_STATES,
    TERMINAL_JOB_STATES,
    EndCause,
    end_cause,
)
from laminar_base.errors import FailedPrecondition
from laminar_zone.config import PlacementSettings, ZoneConfig
from laminar_zone.jobs import ZoneState
from laminar_zone.membership import Membership
from laminar_zone.metrics import ZoneMetrics
from laminar_zone.placements import COMMITTING
from laminar_zone.placer import AgentClients
from laminar_zone.store import JobStore

AGENTS = 3
GPUS_PER_AGENT = 2
CONFIG = ZoneConfig(placement=PlacementSettings(lease_ttl_seconds=30.0))
#: d = 1: each probe of a one-member job carries the commit (no separate Commit call).
COMMIT_ON_PROBE = ZoneConfig(
    placement=PlacementSettings(lease_ttl_seconds=30.0, probes_per_attempt=1)
)

#: Report rounds a flush waits at most for the router to be quiet (1 to 3 in 2,000 flushes).
FLUSH_ROUNDS = 20

agent_st = st.integers(0, AGENTS - 1)
op_st = st.one_of(
    st.tuples(
        st.just("submit"),
        st.integers(1, 2),  # GPUs per member
        st.integers(1, 2),  # gang size
        st.integers(0, 2),  # max retries
        st.sampled_from([common_pb2.PRODUCTION, common_pb2.BATCH, common_pb2.OPPORTUNISTIC]),
    ),
    st.tuples(st.just("submit_array"), st.integers(0, 3)),  # 4 elements, %limit (0: none)
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("exit"), agent_st, st.integers(0, 10), st.booleans()),
    st.tuples(st.just("heartbeat"), agent_st),
    st.tuples(st.just("silence"), agent_st),
    st.tuples(st.just("lost"), agent_st),
    st.tuples(st.just("heal"), agent_st),
    st.tuples(st.just("crash_agent"), agent_st),
    st.tuples(st.just("lose_commit_reply"), agent_st),
    st.tuples(st.just("hang_commit_then_crash_router"), agent_st),
    st.tuples(st.just("exit_before_reply"), agent_st),
    st.tuples(st.just("readdress"), agent_st, st.integers(0, 10)),
    st.tuples(st.just("queue")),
    st.tuples(st.just("sweep")),
    st.tuples(st.just("flush")),
    st.tuples(st.just("restart_router")),
)


class Harness:
    def __init__(
        self, root: Path, config: ZoneConfig = CONFIG, agents: list[FakeAgent] | None = None
    ) -> None:
        self.config = config
        self.db = root / "zone.db"
        self.clock = ManualClock()
        self._clocked = contextlib.ExitStack()
        self._clocked.enter_context(replayable(self.clock, SeededIds()))
        if agents is None:
            agents = [FakeAgent(f"a{i}", GPUS_PER_AGENT) for i in range(AGENTS)]
        for agent in agents:
            agent.clock = self.clock.monotonic
            agent.inside_call = self._check_holdings_in_flight
        self.agents = {a.agent_id: a for a in agents}
        self.job_ids: list[str] = []
        self.failures: list[BaseException] = []
        self.calls: set[asyncio.Task[Any]] = set()
        self.zone = self._open()

    def _open(self) -> ZoneState:
        self.store = JobStore(self.db)
        zone = ZoneState(
            self.config,
            self.store,
            ZoneMetrics(),
            rng=random.Random(7),
            clients=cast(AgentClients, FakeClients(self.agents)),
        )
        zone.recover()
        self.membership = Membership(zone)  # the router's heartbeat entry
        return zone

    def agent(self, index: int) -> FakeAgent:
        return self.agents[f"a{index}"]

    def tasks(self) -> set[asyncio.Task[Any]]:
        self.calls = {t for t in self.calls if not t.done()}
        return self.zone.pending_tasks() | self.calls

    async def call(self, coro: Coroutine[Any, Any, object]) -> None:
        """Await a router call as a task, so a Commit that never answers inside it (a
        queue pass places jobs itself) crashes the router instead of the test."""
        self.calls.add(asyncio.ensure_future(coro))
        await self.settle()

    async def settle(self) -> None:
        hung = asyncio.Event()
        watchers = [asyncio.ensure_future(a.hung.wait()) for a in self.agents.values()]
        for watcher in watchers:
            watcher.add_done_callback(lambda _: hung.set())
        try:
            self.failures += await settle(self.tasks, hung)
        finally:
            for watcher in watchers:
                watcher.cancel()
        if hung.is_set():
            # A Commit the agent carried out never answered: the router dies right then,
            # with the commit journaled as in flight, and comes back from its journal.
            for agent in self.agents.values():
                agent.hung.clear()
            await self.restart()

    async def restart(self) -> None:
        # The router dies: every call it has in flight dies with it (a hung one too).
        dying = self.tasks()
        for task in dying:
            task.cancel()
        await asyncio.gather(*dying, return_exceptions=True)
        self.calls.clear()
        await self.zone.close()
        self.store.close()
        self.zone = self._open()

    def heartbeat(self, agent: FakeAgent) -> None:
        if agent.silent:
            return
        request = agent.heartbeat()
        agent.heard(self.membership.on_heartbeat(request), request.has_live_subjob_ids)

    async def flush(self) -> None:
        """Periods pass: the router's tick (which asks again for stops it still owes),
        then every reachable agent reports and the router acts on it, until all is quiet:
        every reachable agent's events are acknowledged and none is asked for its live
        subjobs. (Not a fixed number of rounds: a router restarted meanwhile has heard no
        one yet, and each stop it makes is one more report.) A router that never gets
        quiet fails the test."""
        for _ in range(FLUSH_ROUNDS):
            router = self.zone
            router.sweep()
            for agent in self.agents.values():
                self.heartbeat(agent)
            await self.settle()
            if self.zone is not router:
                continue  # it restarted meanwhile: the new router has heard no one yet
            reachable = [a for a in self.agents.values() if not a.silent]
            if all(a.acked >= len(a.events) and not a.want_live for a in reachable):
                return
        raise AssertionError(f"the router is not quiet after {FLUSH_ROUNDS} report rounds")

    async def do(self, op: tuple[object, ...]) -> None:
        kind = op[0]
        if kind == "submit":
            _, gpus, gang, retries, priority = op
            spec = zone_pb2.JobSpec(
                command=["true"],
                resources=common_pb2.Resources(gpus=cast(int, gpus)),
                gang_size=cast(int, gang),
                max_retries=cast(int, retries),
                priority=cast(common_pb2.PriorityClass, priority),
            )
            job = await self.zone.submit(spec, "")
            self.job_ids.append(job.job_id)
        elif kind == "submit_array":
            limit = cast(int, op[1])
            spec = zone_pb2.JobSpec(
                command=["true"],
                resources=common_pb2.Resources(gpus=1),
                array="0-3" + (f"%{limit}" if limit else ""),
            )
            array = await self.zone.submit(spec, "")
            self.job_ids.append(array.job_id)
            self.job_ids.extend(f"{array.job_id}_{i}" for i in range(4))
        elif kind == "cancel" and self.job_ids:
            job_id = self.job_ids[cast(int, op[1]) % len(self.job_ids)]
            await self.call(self.cancel(job_id))
        elif kind == "exit":
            agent = self.agent(cast(int, op[1]))
            live = sorted(s.spec.subjob_id for s in agent.live())
            if live:
                ok = cast(bool, op[3])
                subjob_id = live[cast(int, op[2]) % len(live)]
                agent.end(
                    subjob_id,
                    common_pb2.SUCCEEDED if ok else common_pb2.FAILED,
                    EndCause.EXITED,
                    "exited 0" if ok else "exited 1",
                )
        elif kind == "heartbeat":
            self.heartbeat(self.agent(cast(int, op[1])))
        elif kind == "silence":
            self.agent(cast(int, op[1])).silent = True
        elif kind == "lost":
            agent = self.agent(cast(int, op[1]))
            record = self.zone.view.agents.get(agent.agent_id)
            if agent.silent and record is not None:
                # Silent past membership.lost_after_seconds: its fence stopped its work
                # first (the fence lease is shorter), then the router declares it lost.
                agent.fence()
                record.last_heartbeat -= self.config.membership.lost_after_seconds + 1
                self.zone.sweep()
        elif kind == "heal":
            agent = self.agent(cast(int, op[1]))
            agent.silent = False
            self.heartbeat(agent)
        elif kind == "crash_agent":
            agent = self.agent(cast(int, op[1]))
            agent.crash_and_restart()
            self.heartbeat(agent)
        elif kind == "lose_commit_reply":
            self.agent(cast(int, op[1])).lose_next_commit_reply = True
        elif kind == "hang_commit_then_crash_router":
            self.agent(cast(int, op[1])).hang_next_commit = True
        elif kind == "exit_before_reply":
            agent = self.agent(cast(int, op[1]))
            agent.exit_before_reply = True
            agent.report = lambda: self.heartbeat(agent)
        elif kind == "readdress":
            agent = self.agent(cast(int, op[1]))
            live = sorted(s.spec.subjob_id for s in agent.live())
            if live:
                agent.readdress.add(live[cast(int, op[2]) % len(live)])
        elif kind == "queue":
            await self.call(self.zone.queue_pass())
        elif kind == "sweep":
            self.zone.sweep()
        elif kind == "flush":
            await self.flush()
            self.check_reported()
        elif kind == "restart_router":
            await self.restart()
        await self.settle()
        self.check_always()

    async def cancel(self, job_id: str) -> None:
        try:
            await self.zone.cancel(job_id, "test")
        except FailedPrecondition:
            assert self.zone.get(job_id).state in TERMINAL_JOB_STATES

    # ------------------------------------------------------------------ invariants

    def jobs(self) -> list[zone_pb2.Job]:
        return [self.zone.get(job_id) for job_id in self.job_ids]

    def _check_holdings_in_flight(self) -> None:
        """Mid-try (an agent call arrives): what the core keeps of the jobs' holdings is
        still what a walk of them reads (a placing job holds)."""
        try:
            assert_holdings_match(self.zone.core)
        except AssertionError as exc:
            self.failures.append(exc)

    def check_always(self) -> None:
        assert not self.failures, self.failures
        # What the core keeps of the jobs' holdings is what a walk of them reads.
        assert_holdings_match(self.zone.core)
        for agent in self.agents.values():
            holders: dict[str, int] = {}
            for subjob in agent.live():
                for slice_id in subjob.slice_ids:
                    holders[slice_id] = holders.get(slice_id, 0) + 1
            assert all(n <= 1 for n in holders.values()), (agent.agent_id, holders)
            assert all(n == 1 for n in agent.starts.values())
        for progress in self.zone.arrays.values():
            assert not progress.limit or len(progress.active) <= progress.limit
        for job in self.jobs():
            assert job.retries_used <= job.spec.max_retries, job
            # Every job that waits, is suspended or failed says why with a code.
            if job.state in (zone_pb2.QUEUED, zone_pb2.WAITING, zone_pb2.PENDING):
                assert job.reason_code != zone_pb2.REASON_NONE, job
            if job.state == zone_pb2.JOB_SUSPENDED:
                assert job.reason_code == zone_pb2.REASON_SUSPENDED, job
            if job.state in (zone_pb2.JOB_FAILED, zone_pb2.JOB_CANCELLED):
                assert job.reason_code not in (zone_pb2.REASON_NONE, zone_pb2.REASON_PLACING), job
            if job.spec.array and job.state in TERMINAL_JOB_STATES:
                ended = job.array.succeeded + job.array.failed + job.array.cancelled
                assert ended == job.array.total == 4, job
            for p in job.placements:
                if p.state in ENDED_SUBJOB_STATES:
                    assert p.end_cause != common_pb2.END_CAUSE_UNSPECIFIED, p
            if any(p.started_unix for p in job.placements):
                # Probes are counted as they go out: a job whose member ended before its
                # probe's reply came back does not read as placed with no probe.
                assert job.probes >= 1, job
            if job.state == zone_pb2.JOB_SUCCEEDED and not job.spec.array:
                gang = max(1, job.spec.gang_size)
                attempts = {p.attempt for p in job.placements}
                assert any(
                    {
                        p.member
                        for p in job.placements
                        if p.attempt == a and p.state == common_pb2.SUCCEEDED
                    }
                    == set(range(gang))
                    for a in attempts
                ), job

    def check_reported(self) -> None:
        """Once every reachable agent has reported: nothing runs that the router does not
        count on, and no member runs twice. (The exception is a move, which runs two copies
        for a moment: when the agent of either copy falls silent in that moment, before
        the router heard that the new copy started or before the old one took its stop,
        both run until that agent answers or its fence stops its work.)"""
        jobs = {job.job_id: job for job in self.jobs()}
        copies: dict[tuple[str, int], int] = {}
        for agent in self.agents.values():
            for subjob in agent.live():
                job = jobs[subjob.spec.job_id]
                p = next(p for p in job.placements if p.subjob_id == subjob.spec.subjob_id)
                if agent.silent and _in_a_move(job, p):
                    continue
                copies[(job.job_id, p.member)] = copies.get((job.job_id, p.member), 0) + 1
                if agent.silent:
                    continue
                assert job.state not in TERMINAL_JOB_STATES, (subjob.spec.subjob_id, job)
                counted = [
                    p
                    for p in job.placements
                    if p.subjob_id == subjob.spec.subjob_id
                    and p.attempt == job.attempts
                    and p.state in LIVE_SUBJOB_STATES
                ]
                assert counted, (subjob.spec.subjob_id, job)
        assert all(n <= 1 for n in copies.values()), copies

    async def finish(self) -> None:
        """Heal everything and let all work succeed: every job must end. Time passes first,
        so leases nobody will commit lapse as their TTL says (granted in a reply that was
        lost, or to a router that died), and every agent reports at once (before the
        router's tick could count the time as its silence)."""
        placement = self.config.placement
        self.clock.now += placement.budget_seconds + 2 * placement.lease_ttl_seconds + 1
        for agent in self.agents.values():
            agent.silent = False
            agent.lose_next_commit_reply = agent.hang_next_commit = False
            agent.readdress.clear()
            self.heartbeat(agent)
        for _ in range(12):
            await self.flush()
            self.check_reported()
            await self.call(self.zone.queue_pass())
            await self.settle()
            for agent in self.agents.values():
                for subjob in agent.live():
                    agent.end(subjob.spec.subjob_id, common_pb2.SUCCEEDED, EndCause.EXITED, "ok")
            self.check_always()
            if all(job.state in TERMINAL_JOB_STATES for job in self.jobs()):
                break
        stuck = [j for j in self.jobs() if j.state not in TERMINAL_JOB_STATES]
        assert not stuck, stuck
        # Every subjob ended with a recorded cause, in memory and in the journal.
        for job in self.jobs():
            stored = self.store.get(job.job_id) if not job.array.total else None
            for record in (job, stored) if stored is not None else (job,):
                live = [p.subjob_id for p in record.placements if p.state in LIVE_SUBJOB_STATES]
                assert not live, (record.job_id, live, record)
        assert all(not a.live() for a in self.agents.values())

    async def close(self) -> None:
        try:
            await self.zone.close()
            self.store.close()
        finally:
            self._clocked.close()


def _in_a_move(job: zone_pb2.Job, p: zone_pb2.Placement) -> bool:
    """Whether ``p`` is a copy a move retired (the router owes it a stop), or a move's
    copy whose start the router has not heard of yet while the copy it moves from still
    counts."""
    if p.state == common_pb2.KILLED and end_cause(p.end_cause) is EndCause.READDRESSED:
        return True  # retired by its move (a copy believed never started is FAILED)
    index = list(job.placements).index(p)
    return (
        p.state in LIVE_SUBJOB_STATES
        and p.reason == COMMITTING
        and any(
            q.member == p.member and q.attempt == p.attempt and q.state in LIVE_SUBJOB_STATES
            for q in job.placements[:index]
        )
    )


async def scenario(ops: list[tuple[object, ...]], config: ZoneConfig = CONFIG) -> None:
    with tempfile.TemporaryDirectory() as root:
        harness = Harness(Path(root), config)
        try:
            await harness.flush()
            for op in ops:
                await harness.do(op)
            await harness.finish()
        finally:
            await harness.close()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(ops=st.lists(op_st, max_size=60))
def test_random_interleavings_keep_the_routers_promises(ops: list[tuple[object, ...]]) -> None:
    asyncio.run(scenario(ops))


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(ops=st.lists(op_st, max_size=60))
def test_commit_on_probe_keeps_the_same_promises(ops: list[tuple[object, ...]]) -> None:
    """The same interleavings with d = 1, where one-member jobs commit in their probe: a
    lost or hung reply of such a probe is a commit of unknown outcome."""
    asyncio.run(scenario(ops, COMMIT_ON_PROBE))


@pytest.mark.parametrize("config", [CONFIG, COMMIT_ON_PROBE], ids=["probe-commit", "d1"])
def test_a_lost_commit_reply_is_stopped_when_its_agent_reports(config: ZoneConfig) -> None:
    """The agent started a member whose Commit reply was lost: the router rolled back and
    retried, and the copy it gave up on is stopped at the agent's next report."""
    ops: list[tuple[object, ...]] = [
        ("lose_commit_reply", 0),
        ("lose_commit_reply", 1),
        ("lose_commit_reply", 2),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("flush",),
    ]
    asyncio.run(scenario(ops, config))


#: Interleavings where a subjob's end reaches the router before the reply of the call that
#: started it (a short job, a reply held behind a batch): each once broke a promise.
EXIT_BEFORE_REPLY = [
    # The reply's RUNNING overwrote the reported end: a succeeded job kept a live subjob.
    [("exit_before_reply", 0), ("submit_array", 0)],
    # The queue walk marked an element that had just ended QUEUED again.
    [("submit_array", 1), ("exit_before_reply", 0)],
    # The end came, then the reply was lost: the element was retried and, after a restart,
    # counted as active beside the next one (over its array's %1 limit).
    [
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("silence", 0),
        ("exit_before_reply", 0),
        ("submit_array", 1),
        ("lose_commit_reply", 0),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("submit", 1, 1, 0, common_pb2.PRODUCTION),
        ("heal", 0),
        ("queue",),
        ("restart_router",),
    ],
    # A moved copy ended before its move was done: the job was never judged.
    [
        ("submit_array", 0),
        ("exit_before_reply", 2),
        ("readdress", 0, 0),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("flush",),
    ],
    # A moved copy ended before its move was done, then the router crashed before the
    # move's Commit answered: both copies ended and were counted as two members of a
    # one-member job, which never ended.
    [
        ("submit_array", 0),
        ("exit_before_reply", 2),
        ("hang_commit_then_crash_router", 2),
        ("readdress", 1, 0),
        ("heal", 1),
    ],
    [
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("restart_router",),
        ("hang_commit_then_crash_router", 2),
        ("exit_before_reply", 2),
        ("readdress", 1, 0),
        ("flush",),
    ],
]

#: Interleavings where a move's Commit reply is lost, or the move is cut short by a router
#: crash (its Commit never answers).
MOVES_CUT_SHORT = [
    # The move's copy ended before its Commit's reply, which was then lost: the copy was
    # recorded as never started, and the job succeeded with no member that succeeded.
    [
        ("restart_router",),
        ("heartbeat", 2),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("lose_commit_reply", 2),
        ("flush",),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("exit_before_reply", 2),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("readdress", 0, 0),
        ("flush",),
    ],
    # The move's Commit reply was lost and its agent went silent: the copy it started was
    # recorded as never started, and the member was moved a second time (two copies ran).
    [
        ("flush",),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("lose_commit_reply", 0),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("readdress", 1, 0),
        ("heartbeat", 1),
        ("silence", 0),
        ("flush",),
    ],
    # The same lost reply, then the agent of the copy moved from goes silent: the move is
    # done when the copy is confirmed, and the old copy's stop is owed to its agent.
    [
        ("lose_commit_reply", 0),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("readdress", 1, 0),
        ("heartbeat", 1),
        ("silence", 1),
        ("flush",),
    ],
    # The copy moved from ended on its own after the crash, then the move's copy was
    # confirmed running: both were counted as members, and the job never ended.
    [
        ("submit_array", 0),
        ("hang_commit_then_crash_router", 2),
        ("readdress", 1, 0),
        ("heartbeat", 1),
        ("exit", 1, 0, True),
        ("heartbeat", 1),
        ("heartbeat", 2),
    ],
]


@pytest.mark.parametrize("ops", EXIT_BEFORE_REPLY)
@pytest.mark.parametrize("config", [CONFIG, COMMIT_ON_PROBE], ids=["probe-commit", "d1"])
def test_an_end_reported_before_the_start_reply_keeps_the_promises(
    ops: list[tuple[object, ...]], config: ZoneConfig
) -> None:
    asyncio.run(scenario(ops, config))


@pytest.mark.parametrize("ops", MOVES_CUT_SHORT)
@pytest.mark.parametrize("config", [CONFIG, COMMIT_ON_PROBE], ids=["probe-commit", "d1"])
def test_a_move_cut_short_keeps_the_promises(
    ops: list[tuple[object, ...]], config: ZoneConfig
) -> None:
    asyncio.run(scenario(ops, config))


def test_a_move_whose_copy_ended_before_its_commit_answered_is_finished_at_once() -> None:
    """A move's copy ended before its Commit answered, and the Commit never answered (the
    router crashed): the copy's end finishes the move (the copy moved from is retired and
    stopped, the job judged by the copy that ran), so the old copy is not moved a second
    time when its agent asks again."""

    async def run() -> None:
        with tempfile.TemporaryDirectory() as root:
            harness = Harness(Path(root))
            try:
                await harness.flush()
                await harness.do(("submit_array", 0))
                # Move a copy from an agent such that exactly one other agent has room
                # for it (wherever ranking put the elements): the move goes there.
                held = [len(harness.agent(i).live()) for i in range(AGENTS)]
                source, target = next(
                    (i, rooms[0])
                    for i in range(AGENTS)
                    if held[i]
                    and len(
                        rooms := [j for j in range(AGENTS) if j != i and held[j] < GPUS_PER_AGENT]
                    )
                    == 1
                )
                ops: list[tuple[object, ...]] = [
                    ("exit_before_reply", target),
                    ("hang_commit_then_crash_router", target),
                    ("readdress", source, 0),
                    ("heartbeat", source),  # asks for the move; its Commit hangs: crash
                ]
                for op in ops:
                    await harness.do(op)
                (moved,) = [
                    job
                    for job in harness.jobs()
                    if any(p.subjob_id.endswith("-r1") for p in job.placements)
                ]
                assert moved.state == zone_pb2.JOB_SUCCEEDED, moved
                old, new = moved.placements
                assert end_cause(old.end_cause) is EndCause.READDRESSED, old
                assert new.state == common_pb2.SUCCEEDED, new
                assert old.subjob_id not in {s.spec.subjob_id for s in harness.agent(source).live()}
                await harness.do(("heartbeat", source))  # it would have asked to move again
                assert len(harness.zone.get(moved.job_id).placements) == 2
                await harness.finish()
            finally:
                await harness.close()

    asyncio.run(run())


def test_a_lost_agent_with_an_unconfirmed_move_leaves_the_member_where_it_was() -> None:
    """A move's Commit reply was lost, then the copy's agent went silent and was declared
    lost (its fence stopped the copy if it ran): the member stays where it was, and the
    job runs on (it was failed for the loss of a copy it never counted on)."""

    async def run() -> None:
        with tempfile.TemporaryDirectory() as root:
            harness = Harness(Path(root))
            try:
                await harness.flush()
                ops: list[tuple[object, ...]] = [
                    ("flush",),
                    ("submit", 1, 1, 0, common_pb2.BATCH),
                    ("lose_commit_reply", 0),
                    ("submit", 1, 1, 0, common_pb2.BATCH),
                    ("submit", 1, 1, 0, common_pb2.BATCH),
                    ("readdress", 1, 0),
                    ("heartbeat", 1),  # the move's copy goes to a0, whose reply is lost
                    ("silence", 0),
                    ("lost", 0),
                ]
                for op in ops:
                    await harness.do(op)
                (moved,) = [
                    job
                    for job in harness.jobs()
                    if any(p.subjob_id.endswith("-r1") for p in job.placements)
                ]
                old, copy = moved.placements
                assert (old.agent_id, copy.agent_id) == ("a1", "a0"), moved
                assert moved.state == zone_pb2.JOB_RUNNING, moved
                assert old.state == common_pb2.RUNNING, moved
                assert copy.state == common_pb2.LOST, moved
                assert end_cause(copy.end_cause) is EndCause.READDRESSED, moved
                await harness.finish()
            finally:
                await harness.close()

    asyncio.run(run())


def test_a_restart_finishes_a_move_whose_copy_started() -> None:
    """The journal holds a move whose copy started and ended but whose old copy was never
    retired (the router died between the copy's report and the retirement): the restarted
    router retires the old copy at once and judges the job by the copy that ran."""

    async def run() -> None:
        with tempfile.TemporaryDirectory() as root:
            harness = Harness(Path(root))
            try:
                await harness.flush()
                await harness.do(("submit", 1, 1, 0, common_pb2.BATCH))
                job = harness.zone.get(harness.job_ids[0])
                (old,) = job.placements
                assert old.state == common_pb2.RUNNING, old
                to = next(a for a in harness.agents.values() if a.agent_id != old.agent_id)
                job.placements.add(
                    subjob_id=f"{old.subjob_id}-r1",
                    agent_id=to.agent_id,
                    agent_address=to.address,
                    member=old.member,
                    attempt=old.attempt,
                    state=common_pb2.SUCCEEDED,
                    end_cause=EndCause.EXITED.wire,
                    reason="exited 0",
                )
                harness.store.put(job)
                await harness.restart()
                await harness.settle()
                job = harness.zone.get(job.job_id)
                assert job.state == zone_pb2.JOB_SUCCEEDED, job
                assert end_cause(job.placements[0].end_cause) is EndCause.READDRESSED, job
                assert not harness.agents[old.agent_id].live()
                await harness.finish()
            finally:
                await harness.close()

    asyncio.run(run())


def test_a_cancelled_job_settles_its_unconfirmed_commit_after_a_restart() -> None:
    """A job cancelled while its commit's outcome was unknown (its agent silent), then the
    router restarts: the ended job is reloaded until its agent says the subjob never ran,
    so every subjob ends with a recorded cause."""
    ops: list[tuple[object, ...]] = [("silence", 1), ("submit", 1, 1, 0, common_pb2.BATCH)]
    ops += [("cancel", 0)] + [("submit", 1, 1, 0, common_pb2.BATCH)] * 3 + [("restart_router",)]
    asyncio.run(scenario(ops, COMMIT_ON_PROBE))


def test_a_move_cut_by_a_router_crash_runs_one_copy() -> None:
    """A move's copy whose Commit hangs, then the router crashes: the restarted router asks
    the copy's agent at its first report and retires the copy the move left behind. (The
    harness once ended its flush before the restarted router had heard anyone, and read
    the move's brief two copies as a job run twice.)"""
    ops: list[tuple[object, ...]] = [
        ("submit_array", 0),
        ("cancel", 42),
        ("lose_commit_reply", 0),
        ("readdress", 0, 0),
        ("readdress", 1, 0),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("hang_commit_then_crash_router", 1),
        ("flush",),
    ]
    asyncio.run(scenario(ops, COMMIT_ON_PROBE))


def test_leases_nobody_will_commit_lapse_and_the_queue_drains() -> None:
    """Leases granted to a router that then died, or in a reply that was lost, hold their
    GPUs until their TTL: the queue behind a two-host gang drains once they lapse. (The
    harness once let no time pass and never dropped a lapsed lease, and the gang waited
    for ever.)"""
    ops: list[tuple[object, ...]] = [
        ("hang_commit_then_crash_router", 0),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("cancel", 0),
        ("flush",),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("cancel", 50),
        ("flush",),
        ("submit", 1, 1, 0, common_pb2.BATCH),
        ("submit_array", 0),
        ("lose_commit_reply", 2),
        ("readdress", 0, 0),
        ("flush",),
        ("submit", 2, 2, 0, common_pb2.BATCH),
    ]
    asyncio.run(scenario(ops))


def test_a_router_restart_recovers_running_and_queued_jobs() -> None:
    ops: list[tuple[object, ...]] = [("submit", 2, 1, 1, common_pb2.BATCH) for _ in range(5)]
    ops += [("restart_router",), ("flush",), ("exit", 0, 0, True), ("queue",), ("flush",)]
    asyncio.run(scenario(ops))


def test_a_stop_the_agent_did_not_take_is_asked_again() -> None:
    """A cancel while the job's agent does not answer: once it answers again (without
    ever going stale, so no reconciliation), the router's tick stops the copy."""
    ops: list[tuple[object, ...]] = [("submit", 1, 1, 0, common_pb2.BATCH), ("flush",)]
    ops += [("silence", i) for i in range(AGENTS)]
    ops += [("cancel", 0)]
    ops += [("heal", i) for i in range(AGENTS)]
    ops += [("flush",)]
    asyncio.run(scenario(ops))


def test_a_copy_of_a_job_that_ended_and_was_forgotten_is_stopped() -> None:
    """A Commit reply was lost (the router rolled back and placed the job elsewhere), then
    the job was cancelled and dropped from memory: the forgotten copy's next report stops
    it, from the job's record in the journal."""
    ops: list[tuple[object, ...]] = [("silence", 0), ("lose_commit_reply", 1)]
    ops += [("lose_commit_reply", 2), ("submit", 1, 1, 0, common_pb2.BATCH), ("cancel", 0)]
    ops += [("heartbeat", 1), ("heartbeat", 2), ("flush",)]
    asyncio.run(scenario(ops))
