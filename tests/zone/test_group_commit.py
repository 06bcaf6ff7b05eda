"""Group commit in the router's journal (issue 15): writes the core marks ``grouped`` share
one commit at the end of their loop tick; a write not grouped takes those waiting with it;
a commit on probe's intent is committed before its probe leaves; watchers hear of a write
only once it is committed, and a slow watcher gets the newest state, terminal included."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest
from corekit import FakeAgent, FakeClients

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_base.demand import Demand
from laminar_zone.config import ZoneConfig
from laminar_zone.core import Journal
from laminar_zone.entry import Entry
from laminar_zone.jobs import ZoneState
from laminar_zone.membership import Membership
from laminar_zone.metrics import ZoneMetrics
from laminar_zone.placer import AgentClients
from laminar_zone.queries import ZoneQueries, newest
from laminar_zone.store import JobStore

pytestmark = pytest.mark.timeout(60)


class Commits:
    """Counts the journal's commits (SQLite's trace of each statement it runs)."""

    def __init__(self, store: JobStore) -> None:
        self.count = 0
        store.db.set_trace_callback(self._traced)

    def _traced(self, sql: str) -> None:
        if sql.lstrip().upper().startswith("COMMIT"):
            self.count += 1


@pytest.fixture
async def zone(tmp_path: Path) -> AsyncIterator[ZoneState]:
    store = JobStore(tmp_path / "zone.db")
    state = ZoneState(ZoneConfig(), store, ZoneMetrics())
    try:
        yield state
    finally:
        await state.close()
        store.close()


def _entry(zone: ZoneState, job_id: str, state: int = zone_pb2.JOB_RUNNING) -> Entry:
    job = zone_pb2.Job(
        job_id=job_id,
        spec=zone_pb2.JobSpec(command=["x"], resources=common_pb2.Resources(gpus=1)),
        state=state,  # type: ignore[arg-type]
    )
    entry = Entry(job=job, need=Demand(gpus=1))
    zone.entries[job_id] = entry
    return entry


async def _next_tick() -> None:
    """Let the loop run what this tick scheduled (a callback, not a timed sleep)."""
    done = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(done.set_result, None)
    await done


async def test_grouped_writes_of_one_tick_share_one_commit_and_watchers_hear_after_it(
    zone: ZoneState,
) -> None:
    commits = Commits(zone.store)
    a, b = _entry(zone, "j-a"), _entry(zone, "j-b")
    watcher: asyncio.Queue[zone_pb2.Job] = asyncio.Queue()
    a.watchers.append(watcher)
    zone._do([Journal((a,), grouped=True)])
    zone._do([Journal((b,), grouped=True)])
    # Not committed yet, and nobody told.
    assert zone.store.get("j-a") is None and zone.store.get("j-b") is None
    assert watcher.empty() and commits.count == 0
    told = await asyncio.wait_for(watcher.get(), 5)
    assert told.state == zone_pb2.JOB_RUNNING
    stored_a, stored_b = zone.store.get("j-a"), zone.store.get("j-b")
    assert stored_a is not None and stored_b is not None
    assert commits.count == 1  # both jobs, one commit


async def test_a_write_not_grouped_commits_those_waiting_with_it(zone: ZoneState) -> None:
    commits = Commits(zone.store)
    a, b = _entry(zone, "j-a"), _entry(zone, "j-b")
    zone._do([Journal((a,), grouped=True)])
    a.job.state = zone_pb2.JOB_SUCCEEDED  # changed again before the tick's commit
    zone._do([Journal((b,))])
    # At once, in the same commit: the journal never has b newer than a write before it.
    stored = zone.store.get("j-a")
    assert stored is not None and stored.state == zone_pb2.JOB_SUCCEEDED
    assert zone.store.get("j-b") is not None and commits.count == 1
    await _next_tick()
    assert commits.count == 1  # nothing left for the tick's end


async def test_closing_the_router_commits_the_grouped_writes(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "zone.db")
    zone = ZoneState(ZoneConfig(), store, ZoneMetrics())
    zone._do([Journal((_entry(zone, "j-a"),), grouped=True)])
    await zone.close()
    assert store.get("j-a") is not None
    store.close()


@dataclass
class JournalReadingAgent(FakeAgent):
    """An agent that, as each probe carrying a commit arrives, reads the router's journal:
    what a router killed at that moment would recover."""

    store: JobStore | None = None
    journaled: list[zone_pb2.Job | None] = field(default_factory=list)

    def _read(self, probes: list[agent_pb2.ProbeRequest]) -> None:
        assert self.store is not None
        self.journaled += [self.store.get(p.spec.job_id) for p in probes if p.commit_if_fits]

    async def Probe(
        self, request: agent_pb2.ProbeRequest, timeout: float = 0
    ) -> agent_pb2.ProbeReply:
        self._read([request])
        return await super().Probe(request, timeout)

    async def ProbeBatch(
        self, request: agent_pb2.ProbeBatchRequest, timeout: float = 0
    ) -> agent_pb2.ProbeBatchReply:
        self._read(list(request.probes))
        return await super().ProbeBatch(request, timeout)


@contextlib.asynccontextmanager
async def _zone_with_agent(tmp_path: Path) -> AsyncIterator[tuple[ZoneState, JournalReadingAgent]]:
    """A router with one agent that reads the journal as each commit-carrying probe arrives,
    known to the router through its heartbeat."""
    agent = JournalReadingAgent("a0", 8)
    store = JobStore(tmp_path / "zone.db")
    agent.store = store
    zone = ZoneState(
        ZoneConfig(),
        store,
        ZoneMetrics(),
        rng=random.Random(1),
        clients=cast(AgentClients, FakeClients({"a0": agent})),
    )
    try:
        zone.recover()
        membership = Membership(zone)
        request = agent.heartbeat()
        agent.heard(membership.on_heartbeat(request), request.has_live_subjob_ids)
        yield zone, agent
    finally:
        await zone.close()
        store.close()


async def test_a_commit_on_probe_is_journaled_before_its_probe_leaves(tmp_path: Path) -> None:
    """A burst of jobs placed with commit on probe (d = 1): every probe that may start a job
    finds the job's placement journaled as committing, so a router killed then confirms it
    with the agent; the intents of one tick share commits, and every job ends running."""
    async with _zone_with_agent(tmp_path) as (zone, agent):
        store = zone.store
        commits = Commits(store)
        spec = zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1))
        jobs = await zone.submit_many([(spec, f"r{i}") for i in range(6)])
        for job in jobs:
            watched = zone.entries[job.job_id]
            while watched.job.state != zone_pb2.JOB_RUNNING:
                queue: asyncio.Queue[zone_pb2.Job] = asyncio.Queue()
                watched.watchers.append(queue)
                await asyncio.wait_for(queue.get(), 5)
                watched.watchers.remove(queue)
        assert len(agent.journaled) == len(jobs)
        for journaled in agent.journaled:
            assert journaled is not None
            (placement,) = journaled.placements
            assert placement.agent_id == "a0" and placement.state == common_pb2.STARTING
        for job in jobs:
            stored = store.get(job.job_id)
            assert stored is not None and stored.state == zone_pb2.JOB_RUNNING
        # Without grouping: one commit per intent and one per running job (12).
        assert commits.count < 2 * len(jobs), commits.count


def _job(state: int, reason: str = "") -> zone_pb2.Job:
    return zone_pb2.Job(job_id="j", state=state, reason=reason)  # type: ignore[arg-type]


def test_a_slow_watcher_gets_the_newest_state_and_stops_at_the_terminal_one() -> None:
    queue: asyncio.Queue[zone_pb2.Job] = asyncio.Queue()
    for update in (
        _job(zone_pb2.JOB_RUNNING, "started"),
        _job(zone_pb2.JOB_SUCCEEDED, "exited 0"),
        _job(zone_pb2.JOB_SUCCEEDED, "its subjob's end confirmed"),
    ):
        queue.put_nowait(update)
    got = newest(_job(zone_pb2.PENDING), queue)
    assert (got.state, got.reason) == (zone_pb2.JOB_SUCCEEDED, "exited 0")  # the first terminal
    assert queue.qsize() == 1  # what came after it is not read


def test_a_watcher_not_behind_gets_each_state() -> None:
    queue: asyncio.Queue[zone_pb2.Job] = asyncio.Queue()
    assert newest(_job(zone_pb2.PENDING), queue).state == zone_pb2.PENDING
    queue.put_nowait(_job(zone_pb2.JOB_RUNNING))
    queue.put_nowait(_job(zone_pb2.PENDING, "retrying"))
    assert newest(queue.get_nowait(), queue).reason == "retrying"  # newest, not terminal
    assert queue.empty()


async def test_a_watcher_is_not_sent_a_state_it_already_has(zone: ZoneState) -> None:
    entry = _entry(zone, "j-a")
    updates = ZoneQueries(zone).watch("j-a")
    first = await anext(updates)
    assert first.state == zone_pb2.JOB_RUNNING
    pending = asyncio.ensure_future(anext(updates))
    await _next_tick()  # the watcher waits for a change
    zone.persistence.publish(entry)  # written again, nothing changed
    await _next_tick()
    await _next_tick()
    assert not pending.done()
    entry.job.state = zone_pb2.JOB_SUCCEEDED
    zone.persistence.publish(entry)
    ended = await asyncio.wait_for(pending, 5)
    assert ended.state == zone_pb2.JOB_SUCCEEDED
    assert [u async for u in updates] == []  # the terminal state ended the watch


async def test_a_job_that_ends_while_its_first_record_is_sent_still_reaches_its_watcher(
    zone: ZoneState,
) -> None:
    """The watcher's queue is in place before the first record goes out: a job that ends
    and leaves memory while the client receives that record still sends its end."""
    entry = _entry(zone, "j-a")
    updates = ZoneQueries(zone).watch("j-a")
    first = await anext(updates)  # the stream is sending it: the watch waits at its yield
    assert first.state == zone_pb2.JOB_RUNNING
    entry.job.state = zone_pb2.JOB_SUCCEEDED
    zone.persistence.publish(entry)
    del zone.entries["j-a"]  # ended and forgotten before the watch goes on
    assert [u.state async for u in updates] == [zone_pb2.JOB_SUCCEEDED]


def _spec() -> zone_pb2.JobSpec:
    return zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1))


async def test_concurrent_submits_share_a_commit_and_each_is_durable_when_answered(
    zone: ZoneState, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[set[str]] = []  # the job ids of each journal write (one transaction each)
    put_many = zone.store.put_many

    def recorded(jobs: list[zone_pb2.Job]) -> None:
        writes.append({job.job_id for job in jobs})
        put_many(jobs)

    monkeypatch.setattr(zone.store, "put_many", recorded)
    durable: list[bool] = []

    async def submit(i: int) -> zone_pb2.Job:
        job = await zone.submit(_spec(), f"r{i}")
        durable.append(zone.store.get(job.job_id) is not None)  # as the reply leaves
        return job

    jobs = await asyncio.gather(*(submit(i) for i in range(5)))
    assert durable == [True] * 5
    ids = {job.job_id for job in jobs}
    assert len(ids) == 5
    first = next(w for w in writes if w & ids)
    assert ids <= first  # one tick's Submits, one commit (with what else it wrote)


async def test_a_submit_whose_call_ends_while_its_commit_is_awaited_still_starts_its_job(
    zone: ZoneState,
) -> None:
    """A Submit cancelled (its call ended) while the group commit is awaited: the job is in
    the core already and is committed, so it must be started as an answered one is, not
    left placing until a restart; a resend gets that job."""
    cut = asyncio.ensure_future(zone.submit(_spec(), "r-cut"))
    await _next_tick()  # the submit waits for the group commit
    cut.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cut
    answered = await zone.submit(_spec(), "r-ok")
    for _ in range(5):
        await _next_tick()
    committed = zone.store.by_request(answered.spec.tenant, "r-cut")
    assert committed is not None
    started, ok = zone.core.entries[committed.job_id].job, zone.core.entries[answered.job_id].job
    assert started.state == ok.state == zone_pb2.QUEUED  # no agent: both tried, both wait
    assert started.reason != "placing"
    assert (await zone.submit(_spec(), "r-cut")).job_id == committed.job_id


async def test_a_grouped_write_whose_commit_failed_is_committed_by_the_next_sweep(
    zone: ZoneState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick's commit fails (disk full): its grouped writes wait, and on a router with
    nothing else to write the periodic sweep commits them once the journal works again."""
    entry = _entry(zone, "j-a")

    def full(jobs: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(zone.store, "put_many", full)
    with pytest.raises(sqlite3.OperationalError):
        zone.persistence.save_many([entry], grouped=True)
        zone.persistence.flush()  # the tick's end
    monkeypatch.undo()
    assert zone.store.get("j-a") is None
    zone.sweep()
    assert zone.store.get("j-a") is not None


async def test_a_submit_repeated_before_the_first_is_answered_gets_the_same_job(
    zone: ZoneState,
) -> None:
    first, again = await asyncio.gather(zone.submit(_spec(), "r1"), zone.submit(_spec(), "r1"))
    assert first.job_id == again.job_id
    assert zone.store.count() == 1


async def test_a_failed_group_commit_fails_its_submits_and_keeps_none_of_their_jobs(
    zone: ZoneState, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(jobs: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(zone.store, "put_many", full)
    results = await asyncio.gather(
        zone.submit(_spec(), "r1"), zone.submit(_spec(), "r2"), return_exceptions=True
    )
    assert all(isinstance(r, sqlite3.OperationalError) for r in results), results
    assert zone.entries == {}
    monkeypatch.undo()
    job = await zone.submit(_spec(), "r1")  # the journal works again: accepted anew
    assert zone.store.get(job.job_id) is not None


async def test_watchers_are_not_told_of_a_commit_on_probe_intent(tmp_path: Path) -> None:
    """The intent journaled before a probe that carries the commit is the router's
    bookkeeping: a watcher of the job is next told it runs (one stream message fewer per
    followed job), while the journal still holds the intent before the probe leaves."""
    async with _zone_with_agent(tmp_path) as (zone, agent):
        entry = _entry(zone, "j-w", state=zone_pb2.PENDING)
        watcher: asyncio.Queue[zone_pb2.Job] = asyncio.Queue()
        entry.watchers.append(watcher)
        assert await zone.tries.place(entry)
        await _next_tick()  # the running job's write is grouped: told once committed
        told = [watcher.get_nowait() for _ in range(watcher.qsize())]
        assert [job.state for job in told] == [zone_pb2.JOB_RUNNING]
        (journaled,) = agent.journaled  # the intent, committed before its probe left
        assert journaled is not None and journaled.placements[0].state == common_pb2.STARTING


async def test_a_quiet_write_merged_with_a_told_one_in_the_same_commit_is_told(
    zone: ZoneState,
) -> None:
    a, b = _entry(zone, "j-a"), _entry(zone, "j-b")
    told_a: asyncio.Queue[zone_pb2.Job] = asyncio.Queue()
    told_b: asyncio.Queue[zone_pb2.Job] = asyncio.Queue()
    a.watchers.append(told_a)
    b.watchers.append(told_b)
    zone._do([Journal((a,), grouped=True, quiet=True), Journal((b,), grouped=True, quiet=True)])
    zone._do([Journal((a,), grouped=True)])  # a change a watcher acts on, same tick
    zone._do([Journal((b,), quiet=True)])  # not grouped: commits both now
    assert zone.store.get("j-a") is not None and zone.store.get("j-b") is not None
    assert told_a.qsize() == 1 and told_b.empty()
    await _next_tick()
    assert told_a.qsize() == 1 and told_b.empty()
    # A told write waiting for the tick, then a quiet write of the same job not grouped
    # (it commits both at once): the told change still reaches the watcher.
    zone._do([Journal((a,), grouped=True)])
    zone._do([Journal((a,), quiet=True)])
    assert told_a.qsize() == 2


async def test_the_journal_commits_are_counted(zone: ZoneState) -> None:
    a, b = _entry(zone, "j-a"), _entry(zone, "j-b")
    zone._do([Journal((a,), grouped=True), Journal((b,), grouped=True)])
    await _next_tick()
    zone._do([Journal((a,))])
    sample = zone.metrics.registry.get_sample_value("laminar_zone_journal_commits_total")
    assert sample == 2  # one group commit for both, one write of its own
