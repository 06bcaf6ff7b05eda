"""The router's start of an atomized gang's piece (``Atomizer._materialize``) over a
stand-in zone: the agents' answers are injected per member, the decisions are real.

The live tests (tests/zone/test_zone_atomize_gang.py) cover a member that bounces; here a
member whose commit goes unanswered (the agent may have started it), which a live test
cannot make happen on cue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_base.causes import EndCause
from laminar_base.demand import Demand
from laminar_zone.atomizer import Atomizer
from laminar_zone.config import ZoneConfig
from laminar_zone.core import Confirm, Journal, Terminate, ZoneCore
from laminar_zone.entry import Entry
from laminar_zone.market import Award, Bid, MarketWindow
from laminar_zone.view import ZoneView

GIB = 1024**3


class _Agents:
    """Probe answers per agent address: "start", "bounce", "refused" (an error status
    that says the agent did not take it) or "unanswered"."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.probes: list[agent_pb2.ProbeRequest] = []
        #: Called as each probe arrives, before it is answered (a cancel while it is out).
        self.on_probe: Callable[[], None] = lambda: None

    def stub(self, address: str) -> _Agents._Stub:
        return _Agents._Stub(self, address)

    class _Stub:
        def __init__(self, agents: _Agents, address: str) -> None:
            self.agents, self.address = agents, address

        async def Probe(
            self, request: agent_pb2.ProbeRequest, timeout: float
        ) -> agent_pb2.ProbeReply:
            self.agents.probes.append(request)
            self.agents.on_probe()
            answer = self.agents.answers[self.address]
            if answer == "unanswered":
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.aio.Metadata(),
                    grpc.aio.Metadata(),
                    "injected: no answer",
                )
            if answer == "refused":  # an answer that it did not take the commit
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    grpc.aio.Metadata(),
                    grpc.aio.Metadata(),
                    "injected: draining",
                )
            if answer == "bounce":
                return agent_pb2.ProbeReply(bounce=agent_pb2.Bounce(reason="slice busy"))
            return agent_pb2.ProbeReply(
                subjob=common_pb2.Subjob(
                    spec=request.spec, state=common_pb2.RUNNING, started_unix=1.0
                )
            )


class _Zone:
    """What the Atomizer needs of the router, recording the stops it asks for; a gang
    piece's rollback is the router's real core's (ZoneCore.piece_rolled_back)."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.config = ZoneConfig()
        self.blocked_starts: dict[str, Any] = {}
        self.heartbeat_seconds = 0.2
        self.clients = _Agents(answers)
        self.placer = SimpleNamespace(note_summary=lambda _: None)
        self.metrics = SimpleNamespace(window_fill=SimpleNamespace(observe=lambda _: None))
        self.stops: list[tuple[str, EndCause]] = []
        self.finished: list[str] = []
        self.market: Atomizer | None = None
        self.entries: dict[str, Entry] = {}
        self.tasks: list[asyncio.Task[Any]] = []
        self.core = ZoneCore(ZoneView(3.0), {}, atoms={"g1"})

    @property
    def unconfirmed(self) -> dict[str, set[str]]:
        return self.core.unconfirmed

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.append(task)
        return task

    def track(self, entry: Entry, agent_id: str) -> None:
        pass

    def set_placing(self, entry: Entry, placing: bool) -> None:
        self.core.set_placing(entry, placing)

    def save(self, entry: Entry) -> None:
        pass

    def evaluate(self, entry: Entry) -> None:
        assert self.market is not None
        self.market.evaluate(entry)

    def finish(self, entry: Entry, state: int, reason: str, code: object = None) -> None:
        self.finished.append(reason)

    def subjob_spec(
        self, entry: Entry, placement: zone_pb2.Placement, env: dict[str, str] | None = None
    ) -> common_pb2.SubjobSpec:
        return common_pb2.SubjobSpec(subjob_id=placement.subjob_id, env=env or {})

    def apply_start_reply(self, placement: zone_pb2.Placement, subjob: common_pb2.Subjob) -> bool:
        placement.state = subjob.state
        placement.started_unix = subjob.started_unix
        placement.reason = "running"
        return True

    async def terminate(self, placement: zone_pb2.Placement, reason: str, cause: EndCause) -> None:
        self.stops.append((placement.subjob_id, cause))

    async def roll_back_piece(
        self, entry: Entry, members: list[zone_pb2.Placement], unanswered: set[str], why: str
    ) -> None:
        for instruction in self.core.piece_rolled_back(entry, members, unanswered, why, 1.0):
            match instruction:
                case Terminate(placement, reason, cause):
                    await self.terminate(placement, reason, cause)
                case Confirm() | Journal():
                    pass  # asked at the agent's next heartbeat (unconfirmed); journaled
                case _:
                    raise AssertionError(instruction)


def _gang_job(gang_size: int = 2) -> zone_pb2.Job:
    spec = zone_pb2.JobSpec(
        command=["x"],
        gang_size=gang_size,
        atomization=common_pb2.AtomizationContract(
            total_units=100,
            seconds_per_unit=[common_pb2.Quantile(q=0.5, value=1.0)],
            peak_memory_bytes=[common_pb2.Quantile(q=0.95, value=8 * GIB)],
            checkpoint_dir="/ckpt",
        ),
    )
    return zone_pb2.Job(job_id="g1", spec=spec, state=zone_pb2.QUEUED)


def _start(
    answers: dict[str, str], on_probe: Callable[[_Zone, Entry], None] | None = None
) -> tuple[_Zone, Entry, bool]:
    zone = _Zone(answers)
    market = Atomizer(cast(Any, zone))
    zone.market = market
    job = _gang_job(len(answers))
    market.admit(job)
    entry = Entry(job=job, need=Demand(gpus=1))
    zone.core.entries[job.job_id] = entry
    if on_probe is not None:
        zone.clients.on_probe = lambda: on_probe(zone, entry)
    windows = [
        MarketWindow(agent, "gpu0/3g.40gb@0", 40 * GIB, 1000, 600.0, "mig") for agent in answers
    ]
    by_key = {
        w.key: (
            common_pb2.Window(
                agent_id=w.agent_id,
                slice_id=w.slice_id,
                kind=common_pb2.MIG,
                mig_profile="3g.40gb",
                memory_bytes=w.memory_bytes,
            ),
            w.agent_id,  # the address: the stand-in's agents are named by it
            600.0,
        )
        for w in windows
    }
    bid = Bid(
        "g1", "", windows[0], 0, 100, 0.99, 100.0, 0.0, pool=tuple(windows), members=len(answers)
    )
    started = asyncio.run(market._materialize(entry, Award(bid, 1.0), by_key))
    return zone, entry, started


def test_a_gang_starts_one_member_per_window_with_its_rank() -> None:
    zone, entry, started = _start({"a": "start", "b": "start"})
    assert started and not zone.stops
    members = list(entry.job.placements)
    assert [(p.agent_id, p.member, p.state) for p in members] == [
        ("a", 0, common_pb2.RUNNING),
        ("b", 1, common_pb2.RUNNING),
    ]
    envs = [dict(probe.spec.env) for probe in zone.clients.probes]
    assert sorted(e["RANK"] for e in envs) == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert all(p.unit_start == 0 and p.unit_count == 100 for p in members)
    # One window for the piece: every member's ends at the same instant (due together).
    assert members[0].window_end_unix > 0
    assert len({p.window_end_unix for p in members}) == 1
    assert entry.job.state == zone_pb2.JOB_RUNNING


@pytest.mark.parametrize("other", ["unanswered", "bounce"])
def test_a_member_that_does_not_start_rolls_the_started_one_back(other: str) -> None:
    zone, entry, started = _start({"a": "start", "b": other})
    assert not started
    first, second = entry.job.placements
    # The member that started is stopped; one that may have started is confirmed with its
    # agent (not stopped blindly: ZoneCore.roll_back says why), as for a rigid gang.
    if other == "unanswered":
        assert second.state == common_pb2.STARTING  # live until its agent says
        assert zone.unconfirmed == {"b": {"g1"}}
    else:
        assert second.state == common_pb2.FAILED
        assert second.end_cause == common_pb2.END_CAUSE_COMMIT_FAILED
        assert second.reason.startswith("gang rollback: never started")
    assert zone.stops == [(first.subjob_id, EndCause.COMMIT_FAILED)]
    # The rollback ended the attempt: a copy its agent says runs is stopped then.
    assert entry.job.attempts == first.attempt + 1
    # The started member is live until its agent reports its end: the job is not placed
    # again before, and nothing it did costs a retry. It shows pending, saying why (it
    # showed running, the piece's members being live).
    assert entry.job.state == zone_pb2.PENDING and entry.job.retries_used == 0
    assert "rollback" in entry.job.reason, entry.job.reason
    first.state, first.end_cause = common_pb2.KILLED, common_pb2.END_CAUSE_COMMIT_FAILED
    zone.evaluate(entry)
    if other == "unanswered":
        # The unanswered member may run: it stays a commit of unknown outcome, which its
        # agent is asked about at its next heartbeat, and the job does not bid again.
        assert entry.job.state != zone_pb2.QUEUED
        assert zone.unconfirmed == {"b": {"g1"}}
        # Its agent says it never started it (ZoneCore.confirmed records so).
        second.state = common_pb2.FAILED
        second.end_cause = common_pb2.END_CAUSE_COMMIT_UNCONFIRMED
        second.reason = "commit unconfirmed: the agent never started it"
        zone.evaluate(entry)
    assert entry.job.state == zone_pb2.QUEUED and not zone.finished
    assert entry.job.retries_used == 0


def test_a_single_piece_whose_commit_went_unanswered_is_confirmed_before_bidding_again() -> None:
    """Not a gang: one piece whose commit's answer was lost. Its agent may have started it,
    so it stays a commit of unknown outcome (as a gang member's would), asked about at the
    agent's next heartbeat; the job bids again only once the agent says. Taking it as
    never started let a new piece run the same units beside it until a heartbeat."""
    zone, entry, started = _start({"a": "unanswered"})
    assert not started and not zone.stops
    (piece,) = entry.job.placements
    assert piece.state == common_pb2.STARTING and zone.unconfirmed == {"a": {"g1"}}
    assert entry.job.attempts == piece.attempt + 1
    zone.evaluate(entry)
    assert entry.job.state != zone_pb2.QUEUED  # held out of the market while it may run
    # Its agent says it never started it (ZoneCore.confirmed records so): free, bid again.
    piece.state = common_pb2.FAILED
    piece.end_cause = common_pb2.END_CAUSE_COMMIT_UNCONFIRMED
    zone.evaluate(entry)
    assert entry.job.state == zone_pb2.QUEUED and entry.job.retries_used == 0


@pytest.mark.parametrize(
    "answers",
    [
        {"a": "unanswered"},
        {"a": "bounce"},
        {"a": "start", "b": "unanswered"},
        {"a": "start", "b": "bounce"},
        {"a": "bounce", "b": "bounce"},
    ],
)
def test_a_job_cancelled_while_its_piece_commits_stays_cancelled(answers: dict[str, str]) -> None:
    """The user cancels while the piece's commits are out and the piece does not start:
    the rollback stops or confirms what may run, but the job stays cancelled and never
    bids again (it went back to pending, then queued, and ran)."""

    def cancel(zone: _Zone, entry: Entry) -> None:
        if entry.job.state != zone_pb2.JOB_CANCELLED:
            zone.core.cancel(entry.job, "user", 1.0)

    zone, entry, started = _start(answers, cancel)
    assert not started and entry.job.state == zone_pb2.JOB_CANCELLED
    # Whatever may run is confirmed, then reported ended: the job is still cancelled.
    for p in entry.job.placements:
        if p.state in (common_pb2.STARTING, common_pb2.RUNNING):
            p.state, p.end_cause = common_pb2.KILLED, common_pb2.END_CAUSE_CANCELLED
    zone.evaluate(entry)
    assert entry.job.state == zone_pb2.JOB_CANCELLED
    assert entry.job.reason.startswith("cancelled"), entry.job.reason


def test_a_commit_the_agent_refused_with_an_error_is_not_a_commit_of_unknown_outcome() -> None:
    """FAILED_PRECONDITION (say, a draining agent) says the agent did not take the commit:
    the piece never started, as if it bounced. It was taken for an unanswered commit: the
    job waited for the agent's next heartbeat to confirm what it surely did not run."""
    zone, entry, started = _start({"a": "refused"})
    assert not started and not zone.unconfirmed and not zone.stops
    assert not entry.job.placements and entry.job.state == zone_pb2.QUEUED
    zone, entry, started = _start({"a": "start", "b": "refused"})
    first, second = entry.job.placements
    assert not started and not zone.unconfirmed
    assert second.state == common_pb2.FAILED and "refused: FAILED_PRECONDITION" in second.reason
    assert zone.stops == [(first.subjob_id, EndCause.COMMIT_FAILED)]


def test_a_gang_whose_every_member_bounced_leaves_no_subjob_behind() -> None:
    zone, entry, started = _start({"a": "bounce", "b": "bounce"})
    assert not started and not zone.stops
    assert len(entry.job.placements) == 0 and entry.job.state == zone_pb2.QUEUED


def test_a_gang_piece_past_its_window_overruns_once() -> None:
    """Both members run past their window's end: the first is stopped as the overrun (one
    time violation), the other with it, free (``GANG_STOPPED``)."""
    zone, entry, started = _start({"a": "start", "b": "start"})
    assert started
    for p in entry.job.placements:
        p.window_end_unix = 1.0  # long past
    zone.entries["g1"] = entry
    assert zone.market is not None
    asyncio.run(zone.market.enforce_windows())
    first, second = entry.job.placements
    assert zone.stops == [
        (first.subjob_id, EndCause.OVERRAN),
        (second.subjob_id, EndCause.GANG_STOPPED),
    ]
    assert second.reason.startswith(f"gang member 0 ({first.subjob_id}) overran:")
    asyncio.run(zone.market.enforce_windows())  # asked once
    assert len(zone.stops) == 2


def test_after_a_restart_a_survivor_of_a_broken_gang_piece_is_stopped() -> None:
    """Member 1 was killed and the router went down before it stopped member 0: the
    rebuilt market replays member 1's end as observed, and still stops member 0 (all or
    nothing), once."""
    zone, entry, started = _start({"a": "start", "b": "start"})
    assert started
    first, second = entry.job.placements
    second.state, second.end_cause = common_pb2.KILLED, common_pb2.END_CAUSE_RECLAIMED
    second.reason = "killed for memory"

    async def restart() -> None:
        market = Atomizer(cast(Any, zone))  # a new router process: nothing in memory
        zone.market = market
        market.admit(entry.job)
        market.evaluate(entry)
        market.evaluate(entry)  # asked once
        await asyncio.gather(*zone.tasks)

    asyncio.run(restart())
    assert zone.stops == [(first.subjob_id, EndCause.GANG_STOPPED)]
    assert first.reason.startswith(f"gang member 1 ({second.subjob_id}) ended")


def test_after_a_restart_a_rolled_back_member_is_not_stopped_again_at_its_window_end() -> None:
    """The router restarts while a rolled-back piece's started member is still stopping:
    the rebuilt market knows it as the rollback's (an earlier attempt's), so its window's
    end does not stop it once more as an overrun (a violation, a widened profile)."""
    zone, entry, started = _start({"a": "start", "b": "unanswered"})
    assert not started
    first, _ = entry.job.placements
    assert first.state == common_pb2.RUNNING and first.attempt != entry.job.attempts
    for p in entry.job.placements:
        p.window_end_unix = 1.0  # long past
    zone.entries["g1"] = entry
    stops_before = list(zone.stops)
    market = Atomizer(cast(Any, zone))  # a new router process: nothing in memory
    zone.market = market
    market.admit(entry.job)
    asyncio.run(market.enforce_windows())
    assert zone.stops == stops_before
    assert market.atoms["g1"].violations == 0
