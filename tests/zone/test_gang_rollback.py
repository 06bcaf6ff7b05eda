"""A gang whose commit failed on a member, rolled back by the one decision
(``ZoneCore.roll_back``) for both kinds of job, with no sockets: a rigid gang through
``ZoneCore.committed``, an atomized gang's piece through the router's ``Atomizer`` (its
start, ``_materialize``, over a stand-in zone that carries out the core's instructions).

Hypothesis draws each member's commit (taken; refused; unanswered though its agent started
it; unanswered and never started) and the order in which the agents' side of things
happens: stops delivered or lost (owed, sent again by the sweep), confirmations of
unanswered commits, ends reported, heartbeats listing what each agent runs. Against a
model of what the agents really run it checks: the job is never placed again (a rigid
try, an atomized bid) while a member of the rolled-back attempt may still run, so no
member runs twice; and once everything is delivered, nothing runs, every member ended with
a cause, no retry was counted and the job may be placed again.

Not covered: a commit that reaches its agent after the agent said it knows no such
subjob. Then the job may be placed again while it starts; the agent's next heartbeat
stops it (``ZoneCore.reconcile``), whichever rollback rule is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_base.causes import LIVE_SUBJOB_STATES, EndCause, end_cause
from laminar_base.demand import Demand
from laminar_zone.atomizer import Atomizer
from laminar_zone.config import ZoneConfig
from laminar_zone.core import (
    Confirm,
    Failure,
    Instruction,
    JudgeAtomized,
    Member,
    Terminate,
    ZoneCore,
)
from laminar_zone.entry import Entry
from laminar_zone.lifecycle import atomized_subjob_id
from laminar_zone.market import Award, Bid, MarketWindow
from laminar_zone.placement import ShapeCap
from laminar_zone.trying import AskSubjob, DoInstructions, confirm_steps
from laminar_zone.view import ZoneView

GIB = 1 << 30
NOW = 1_700_000_000.0
AGENTS = ("a0", "a1", "a2", "a3")
#: A member's commit: taken; refused (a bounce, a lease gone); unanswered though the
#: agent started it; unanswered and never started.
TAKEN, REFUSED, LOST_STARTED, LOST_NEVER = "taken", "refused", "lost-started", "lost-never"


@dataclass
class Agents:
    """What the agents really run, and what is yet to happen on their side."""

    running: set[str] = field(default_factory=set)
    #: subjob id -> (state, cause) of the ones that ended.
    ended: dict[str, tuple[int, EndCause]] = field(default_factory=dict)
    #: ("stop", Terminate, lost once already) | ("confirm", agent) | ("report", subjob id)
    pending: list[tuple[Any, ...]] = field(default_factory=list)

    def subjob(self, subjob_id: str, job_id: str) -> common_pb2.Subjob | None:
        spec = common_pb2.SubjobSpec(subjob_id=subjob_id, job_id=job_id)
        if subjob_id in self.running:
            return common_pb2.Subjob(
                spec=spec, state=common_pb2.RUNNING, reason="running", started_unix=NOW
            )
        if subjob_id in self.ended:
            state, cause = self.ended[subjob_id]
            return common_pb2.Subjob(
                spec=spec, state=state, end_cause=cause.wire, reason="stopped", ended_unix=NOW
            )
        return None


class StandIn:
    """The router around the core and the atomizer: it carries out their instructions by
    handing them to the agents' model (a stop is a message that may be lost)."""

    def __init__(self, atomized: bool, job_id: str, agents: Agents) -> None:
        view = ZoneView(stale_after_seconds=3.0)
        for i, agent_id in enumerate(AGENTS):
            view.update(
                agent_id,
                f"127.0.0.1:{i + 1}",
                {"gpu:H100-80GB": ShapeCap(1, 1, 0, 80 * GIB)},
                heat=0,
                draining=False,
                now=0.0,
                total_gpus=1,
            )
        self.agents = agents
        self.core = ZoneCore(
            view, {}, atoms={job_id} if atomized else frozenset(), lost_after_seconds=10.0
        )
        # What the Atomizer reads of the zone (laminar_zone.atomizer.Zone).
        self.config = ZoneConfig()
        self.blocked_starts: dict[str, Any] = {}
        self.heartbeat_seconds = 1.0
        self.placer = SimpleNamespace(note_summary=lambda _: None)
        self.metrics = SimpleNamespace(window_fill=SimpleNamespace(observe=lambda _: None))
        self.clients = self
        self.market = Atomizer(cast(Any, self))
        self.finished: list[str] = []
        #: subjob id -> how its commit goes (the atomized members' probes).
        self.answers: dict[str, str] = {}

    @property
    def entries(self) -> dict[str, Entry]:
        return self.core.entries

    def carry(self, instructions: Sequence[Instruction]) -> None:
        for instruction in instructions:
            match instruction:
                case Terminate():
                    self.agents.pending.append(("stop", instruction, False))
                case Confirm(agent_id, _):
                    self.agents.pending.append(("confirm", agent_id))
                case JudgeAtomized(entry):
                    self.market.evaluate(entry)
                case _:
                    pass  # journal writes, wakes, counts, a rigid retry's Place

    # -- the atomizer's zone

    def stub(self, address: str) -> StandIn:
        return self

    async def Probe(self, request: agent_pb2.ProbeRequest, timeout: float) -> agent_pb2.ProbeReply:
        answer = self.answers[request.spec.subjob_id]
        if answer in (LOST_STARTED, TAKEN):
            self.agents.running.add(request.spec.subjob_id)
        if answer in (LOST_STARTED, LOST_NEVER):
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                "injected: no answer",
            )
        if answer == REFUSED:
            return agent_pb2.ProbeReply(bounce=agent_pb2.Bounce(reason="slice busy"))
        return agent_pb2.ProbeReply(
            subjob=common_pb2.Subjob(spec=request.spec, state=common_pb2.RUNNING, started_unix=NOW)
        )

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        try:
            coro.send(None)  # the stand-in's terminate never waits
        except StopIteration:
            pass

    def track(self, entry: Entry, agent_id: str) -> None:
        self.core.track(entry, agent_id)

    def set_placing(self, entry: Entry, placing: bool) -> None:
        self.core.set_placing(entry, placing)

    def save(self, entry: Entry) -> None:
        pass

    def evaluate(self, entry: Entry) -> None:
        self.carry(self.core.evaluate(entry, NOW))

    def finish(self, entry: Entry, state: int, reason: str, code: object = None) -> None:
        self.finished.append(reason)

    def subjob_spec(
        self, entry: Entry, placement: zone_pb2.Placement, env: dict[str, str] | None = None
    ) -> common_pb2.SubjobSpec:
        return common_pb2.SubjobSpec(
            subjob_id=placement.subjob_id, job_id=entry.job.job_id, env=env or {}
        )

    def apply_start_reply(self, placement: zone_pb2.Placement, subjob: common_pb2.Subjob) -> bool:
        placement.state = subjob.state
        placement.started_unix = subjob.started_unix
        placement.reason = "running"
        return True

    async def terminate(self, placement: zone_pb2.Placement, reason: str, cause: EndCause) -> None:
        self.agents.pending.append(("stop", Terminate(placement, reason, cause), False))

    async def roll_back_piece(
        self, entry: Entry, members: list[zone_pb2.Placement], unanswered: set[str], why: str
    ) -> None:
        self.carry(self.core.piece_rolled_back(entry, members, unanswered, why, NOW))


def _rigid(zone: StandIn, commits: list[str]) -> Entry:
    job = zone_pb2.Job(
        job_id="g1",
        spec=zone_pb2.JobSpec(
            command=["true"], resources=common_pb2.Resources(gpus=1), gang_size=len(commits)
        ),
        state=zone_pb2.PENDING,
        attempts=1,
    )
    entry = Entry(job=job, need=Demand(gpus=1))
    zone.core.admit(entry)
    members = [Member(a, f"addr-{a}", (f"{a}/gpu0",)) for a in AGENTS[: len(commits)]]
    zone.core.begin_commit(entry, members)
    answers: list[Failure | None] = []
    for p, commit in zip(entry.current(), commits, strict=True):
        if commit in (TAKEN, LOST_STARTED):
            zone.agents.running.add(p.subjob_id)
        if commit == TAKEN:
            p.state, p.reason = common_pb2.RUNNING, "running"  # the driver recorded the reply
            answers.append(None)
        elif commit == REFUSED:
            answers.append(Failure("FAILED_PRECONDITION: lease expired", unknown=False))
        else:
            answers.append(Failure("DEADLINE_EXCEEDED: no answer", unknown=True))
    ok, out = zone.core.committed(entry, answers, NOW)
    assert not ok
    zone.carry(out)
    return entry


def _atomized(zone: StandIn, commits: list[str]) -> Entry:
    size = len(commits)
    spec = zone_pb2.JobSpec(
        command=["x"],
        gang_size=size,
        atomization=common_pb2.AtomizationContract(
            total_units=100,
            seconds_per_unit=[common_pb2.Quantile(q=0.5, value=1.0)],
            peak_memory_bytes=[common_pb2.Quantile(q=0.95, value=8 * GIB)],
            checkpoint_dir="/ckpt",
        ),
    )
    job = zone_pb2.Job(job_id="g1", spec=spec, state=zone_pb2.QUEUED, attempts=1)
    entry = Entry(job=job, need=Demand(gpus=1))
    zone.core.admit(entry)
    zone.market.admit(job)
    windows = [
        MarketWindow(agent, "gpu0/3g.40gb@0", 40 * GIB, 1000, 600.0, "mig")
        for agent in AGENTS[:size]
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
            w.agent_id,
            600.0,
        )
        for w in windows
    }
    # The members' subjob ids, as _materialize names them (unit 0, the job's n-th subjob).
    zone.answers = {atomized_subjob_id("g1", 0, i): c for i, c in enumerate(commits)}
    bid = Bid("g1", "", windows[0], 0, 100, 0.99, 100.0, 0.0, pool=tuple(windows), members=size)
    started = asyncio.run(zone.market._materialize(entry, Award(bid, 1.0), by_key))
    assert not started
    if all(c == REFUSED for c in commits):  # every window was gone: no subjob existed
        assert not job.placements and job.state == zone_pb2.QUEUED
    else:
        assert sorted(p.subjob_id for p in job.placements) == sorted(zone.answers)
    return entry


def _placed_again(zone: StandIn, entry: Entry, atomized: bool) -> bool:
    """Whether the job may be placed again now: an atomized job bids (it is QUEUED); a
    rigid job's next try may begin and finds no old copy to wait for."""
    if atomized:
        return entry.job.state == zone_pb2.QUEUED
    probe = Entry(job=zone_pb2.Job.FromString(entry.job.SerializeToString()), need=entry.need)
    return zone.core.may_place(probe) and not zone.core.old_copy(probe, 0.0)[0]


def _deliver(zone: StandIn, entry: Entry, event: tuple[Any, ...], lose: bool) -> None:
    agents, core = zone.agents, zone.core
    match event:
        case ("stop", Terminate(p, why, cause), lost_before):
            if lose and not lost_before:  # no answer: owed, sent again by the sweep
                core.owe_stop(
                    zone_pb2.Placement(subjob_id=p.subjob_id, agent_id=p.agent_id), why, cause
                )
                return
            core.stop_taken(p.subjob_id)
            if p.subjob_id in agents.running:  # the first stop taken decides the cause
                agents.running.discard(p.subjob_id)
                agents.ended[p.subjob_id] = (common_pb2.KILLED, cause)
                agents.pending.append(("report", p.subjob_id, p.agent_id))
        case ("report", subjob_id, agent_id):
            subjob = agents.subjob(subjob_id, entry.job.job_id)
            assert subjob is not None
            live, _, out = core.report(agent_id, subjob, None, NOW)
            zone.carry(out)
            if live is not None:
                zone.carry(core.evaluate(live, NOW))
        case ("confirm", agent_id):
            steps = confirm_steps(core, agent_id, clock=lambda: NOW)
            reply: Any = None
            while True:
                try:
                    step = steps.send(reply)
                except StopIteration:
                    break
                reply = None
                if isinstance(step, AskSubjob):
                    reply = agents.subjob(step.placement.subjob_id, entry.job.job_id)
                elif isinstance(step, DoInstructions):
                    zone.carry(step.instructions)
        case ("heartbeat", agent_id):
            mine = sorted(s for s in agents.running if _agent_of(entry, s) == agent_id)
            zone.carry(core.reconcile(agent_id, mine))
        case ("sweep",):
            zone.carry(core.sweep(1.0, NOW))
        case _:
            raise AssertionError(event)


def _agent_of(entry: Entry, subjob_id: str) -> str:
    return next(p.agent_id for p in entry.job.placements if p.subjob_id == subjob_id)


COMMITS = st.lists(
    st.sampled_from([TAKEN, REFUSED, LOST_STARTED, LOST_NEVER]), min_size=2, max_size=4
)


@settings(max_examples=150, deadline=None)
@given(
    atomized=st.booleans(),
    commits=COMMITS.filter(lambda c: any(x != TAKEN for x in c)),
    data=st.data(),
)
def test_a_rolled_back_gang_never_runs_a_member_twice(
    atomized: bool, commits: list[str], data: st.DataObject
) -> None:
    agents = Agents()
    zone = StandIn(atomized, "g1", agents)
    entry = (_atomized if atomized else _rigid)(zone, commits)
    members = {p.subjob_id for p in entry.job.placements}
    if not members:
        return  # an atomized piece whose every member bounced (no rollback: no subjob)
    # The rollback's own decisions, member by member, for both kinds.
    by_id = {p.subjob_id: p for p in entry.job.placements}
    for p, commit in zip(entry.job.placements, commits, strict=True):
        if commit == REFUSED:
            assert p.state == common_pb2.FAILED
            assert end_cause(p.end_cause) is EndCause.COMMIT_FAILED
        else:
            assert p.state in LIVE_SUBJOB_STATES
    stops = {e[1].placement.subjob_id for e in agents.pending if e[0] == "stop"}
    assert stops == {s for s, c in zip(by_id, commits, strict=True) if c == TAKEN}
    confirms = {e[1] for e in agents.pending if e[0] == "confirm"}
    assert confirms == {
        by_id[s].agent_id
        for s, c in zip(by_id, commits, strict=True)
        if c in (LOST_STARTED, LOST_NEVER)
    }
    assert entry.job.attempts == 2

    heartbeats = [("heartbeat", a) for a in AGENTS[: len(commits)]]
    for _ in range(60):
        if not agents.pending and not zone.core.owed_stops:
            break
        choices = [*agents.pending, *heartbeats, ("sweep",)]
        event = data.draw(st.sampled_from(choices))
        if event in agents.pending:
            agents.pending.remove(event)
        _deliver(zone, entry, event, lose=data.draw(st.booleans()))
        if _placed_again(zone, entry, atomized):
            # Never placed again beside a member of the rolled-back attempt that runs.
            assert not agents.running & members, (agents.running, entry.job.reason)
    # Everything still on its way arrives, stops now taken.
    for _ in range(60):
        if not agents.pending and not zone.core.owed_stops:
            break
        if not agents.pending:
            _deliver(zone, entry, ("sweep",), lose=False)
            continue
        _deliver(zone, entry, agents.pending.pop(0), lose=False)
    assert not agents.pending and not zone.core.owed_stops
    assert not agents.running
    for p in entry.job.placements:
        assert p.state not in LIVE_SUBJOB_STATES, p
        assert end_cause(p.end_cause) in {
            EndCause.COMMIT_FAILED,
            EndCause.COMMIT_UNCONFIRMED,
            EndCause.SUPERSEDED,
        }, p
    assert entry.job.retries_used == 0 and not zone.finished
    assert _placed_again(zone, entry, atomized)


def test_an_atomized_job_recovered_mid_rollback_does_not_bid_before_its_members_end() -> None:
    """The router restarts after rolling an atomized gang's piece back (the attempt ended)
    while a member's commit is still of unknown outcome: the job waits for its agent's
    word, not for a window (it would bid beside a member that may run)."""
    zone = StandIn(True, "g1", Agents())
    entry = _atomized(zone, [TAKEN, LOST_NEVER])
    assert entry.job.attempts == 2
    restarted = ZoneCore(zone.core.view, {}, atoms={"g1"}, lost_after_seconds=10.0)
    copy = Entry(job=zone_pb2.Job.FromString(entry.job.SerializeToString()), need=entry.need)
    copy.job.state = zone_pb2.PENDING  # as journaled by the rollback
    restarted.recovered(copy, True, 0.0)
    assert copy.job.state == zone_pb2.PENDING
    assert restarted.unconfirmed == {"a1": {"g1"}}
    # Once every member has ended, a restart lets it bid again.
    for p in copy.job.placements:
        p.state, p.end_cause = common_pb2.KILLED, EndCause.COMMIT_FAILED.wire
    again = ZoneCore(zone.core.view, {}, atoms={"g1"}, lost_after_seconds=10.0)
    again.recovered(copy, True, 0.0)
    assert copy.job.state == zone_pb2.QUEUED


def test_a_rigid_gang_cancelled_while_its_commits_are_out_stays_cancelled() -> None:
    """The user cancels between the commits' sending and their answers, one of which is
    a refusal of the spec itself: the rollback stops what started, and the job stays
    cancelled with its reason (it was failed as "refused" over the cancel)."""
    zone = StandIn(False, "g1", Agents())
    job = zone_pb2.Job(
        job_id="g1",
        spec=zone_pb2.JobSpec(
            command=["true"], resources=common_pb2.Resources(gpus=1), gang_size=2
        ),
        state=zone_pb2.PENDING,
        attempts=1,
    )
    entry = Entry(job=job, need=Demand(gpus=1))
    zone.core.admit(entry)
    zone.core.begin_commit(entry, [Member(a, f"addr-{a}", (f"{a}/gpu0",)) for a in AGENTS[:2]])
    zone.core.cancel(job, "user", NOW)
    first, _ = entry.current()
    first.state, first.reason = common_pb2.RUNNING, "running"  # its commit was taken
    refused = Failure("INVALID_ARGUMENT: bad workdir", unknown=False, refused_input=True)
    ok, out = zone.core.committed(entry, [None, refused], NOW)
    assert not ok
    assert job.state == zone_pb2.JOB_CANCELLED and job.reason.startswith("cancelled"), job.reason
    assert [i.placement.subjob_id for i in out if isinstance(i, Terminate)] == [first.subjob_id]
