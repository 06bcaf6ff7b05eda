"""A queue pass's starts pipelined (laminar_zone.trying.PassTry), with no sockets: the pass
waits for each try only until the try's first request that crosses the network; the
network's replies are held here and given back when the test says, so many tries are
under way at once, and one that fails after the pass answered leaves its job queued for
the next pass."""

from __future__ import annotations

import random
from collections.abc import Callable, Generator
from typing import Any

from test_zone_try_steps import CLOCK, _core, _submit

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_zone.core import Instruction, Loop, Wake, ZoneCore
from laminar_zone.entry import Entry
from laminar_zone.trying import (
    ClearMarket,
    CloseRound,
    CommitMembers,
    CommitOnProbe,
    DoInstructions,
    Gathered,
    GatherLeases,
    OpenRound,
    PassTry,
    RunInstructions,
    Slot,
    StartJob,
    TryStep,
    pass_steps,
    place_try,
)

Try = Generator[TryStep, Any, bool]


class HeldNet:
    """Drives a pass and its tries; every request that crosses the network is held until
    :meth:`reply` (or answered at once by ``at_once``, as a gather with no host to probe)."""

    def __init__(
        self, core: ZoneCore, at_once: Callable[[GatherLeases], Gathered] | None = None
    ) -> None:
        self.core = core
        self.at_once = at_once
        self.held: dict[str, tuple[Try, GatherLeases | CommitMembers]] = {}
        self.instructions: list[Instruction] = []
        self.started: list[Entry] = []
        self.answers: dict[str, bool] = {}
        self.ended: dict[str, bool] = {}

    def one_pass(self) -> list[Entry]:
        steps = pass_steps(self.core, shares={}, backfill=True, rng=random.Random(0), clock=CLOCK)
        answer: Any = None
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                left: list[Entry] = done.value
                return left
            answer = None
            if isinstance(step, StartJob):
                answer = self.start(step.entry)
            elif isinstance(step, DoInstructions):
                self.instructions += step.instructions
            else:
                assert isinstance(step, (OpenRound, ClearMarket, CloseRound))

    def start(self, entry: Entry) -> bool:
        self.started.append(entry)
        pending = PassTry()
        steps = pending.steps(
            place_try(
                self.core,
                entry,
                from_queue=True,
                lease_ttl_seconds=5.0,
                budget_seconds=2.0,
                clock=CLOCK,
            )
        )
        self._drive(entry.job.job_id, steps, None)
        answer = pending.answer()
        assert answer is not None  # no slot to wait for here
        self.answers[entry.job.job_id] = answer
        return answer

    def reply(self, job_id: str, answer: Any) -> None:
        steps, _ = self.held.pop(job_id)
        self._drive(job_id, steps, answer)

    def _drive(self, job_id: str, steps: Try, answer: Any) -> None:
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                self.ended[job_id] = bool(done.value)
                return
            answer = None
            if isinstance(step, (RunInstructions, DoInstructions)):
                self.instructions += step.instructions
            elif isinstance(step, GatherLeases) and self.at_once is not None:
                answer = self.at_once(step)
            elif isinstance(step, (GatherLeases, CommitMembers)):
                self.held[job_id] = (steps, step)
                return
            else:
                assert isinstance(step, Slot)


def started_on(core: ZoneCore, step: GatherLeases | CommitMembers, agent_id: str) -> Gathered:
    """The gather's one probe carried the commit to ``agent_id``, which started the member."""
    assert isinstance(step, GatherLeases) and step.plan.commit_on_probe
    book = CommitOnProbe(core, step.entry)
    book.intent(agent_id, f"addr-{agent_id}")
    return Gathered(
        pending=book.pending,
        committed=common_pb2.Subjob(state=common_pb2.RUNNING, reason="running"),
        slice_ids=(f"{agent_id}/gpu0",),
        probes=1,
        counted_probes=book.probes,
    )


NOTHING = Gathered(reasons=("a0: no free gpu",), probes=1, bounces=1)


def _queued(core: ZoneCore, n: int) -> list[Entry]:
    entries = [_submit(core) for _ in range(n)]
    for e in entries:
        e.job.state = zone_pb2.QUEUED
    return entries


def test_a_pass_has_every_placeable_job_s_try_in_flight_at_once() -> None:
    core = _core(agents=4)
    jobs = _queued(core, 4)
    net = HeldNet(core)

    left = net.one_pass()

    # No try has had a reply, yet the pass started every job: all four wait on the
    # network together, each job placing (and counted as such).
    assert left == []
    assert net.started == jobs
    assert set(net.held) == {e.job.job_id for e in jobs}
    assert all(isinstance(step, GatherLeases) for _, step in net.held.values())
    assert all(e.placing and e.job.state == zone_pb2.PENDING for e in jobs)
    assert net.answers == {e.job.job_id: True for e in jobs}
    assert core.tenant_usage()[0] == {"": 4.0}

    for i, e in enumerate(jobs):  # the replies come back, in any order
        net.reply(e.job.job_id, started_on(core, net.held[e.job.job_id][1], f"a{3 - i}"))
    assert net.ended == {e.job.job_id: True for e in jobs}
    assert all(e.job.state == zone_pb2.JOB_RUNNING and not e.placing for e in jobs)


def test_a_try_that_fails_after_the_pass_answered_leaves_the_job_queued_for_the_next_pass() -> None:
    core = _core(agents=2)
    (job,) = _queued(core, 1)
    net = HeldNet(core)
    net.one_pass()
    assert net.answers == {job.job.job_id: True}

    net.instructions.clear()
    net.reply(job.job.job_id, NOTHING)  # every probe bounced: the try ends, unplaced

    assert net.ended == {job.job.job_id: False}
    assert job.job.state == zone_pb2.QUEUED and not job.placing
    assert job.job.bounces == 1
    assert Wake(Loop.QUEUE) in net.instructions  # the next pass looks again
    assert core.tenant_usage()[0] == {}  # no longer counted

    net.one_pass()
    assert net.started == [job, job]
    net.reply(job.job.job_id, started_on(core, net.held[job.job.job_id][1], "a1"))
    assert job.job.state == zone_pb2.JOB_RUNNING
    assert [p.agent_id for p in job.current()] == ["a1"]


def test_a_job_whose_try_is_in_flight_is_not_tried_again_by_the_next_pass() -> None:
    core = _core(agents=4)
    first, second = _queued(core, 2)
    net = HeldNet(core)
    net.one_pass()
    net.reply(second.job.job_id, started_on(core, net.held[second.job.job_id][1], "a1"))

    net.one_pass()  # first's try still waits on the network

    assert net.started == [first, second]  # neither tried twice
    assert first.placing and set(net.held) == {first.job.job_id}
    net.reply(first.job.job_id, started_on(core, net.held[first.job.job_id][1], "a0"))
    assert len(first.job.placements) == 1 and first.job.state == zone_pb2.JOB_RUNNING


def test_a_try_that_ends_before_the_network_answers_the_pass_with_its_result() -> None:
    """A gather with no host to probe answers at once: the try ends unplaced before the
    pass goes on, so the pass reads False, as when it awaited the whole try, and the
    blocked head holds back its family."""
    core = _core(agents=2)
    head, behind = _queued(core, 2)
    net = HeldNet(core, at_once=lambda _: NOTHING)

    left = net.one_pass()

    assert net.answers == {head.job.job_id: False}
    assert net.started == [head] and left == [head, behind]
    assert not net.held and not head.placing
    assert head.job.state == zone_pb2.QUEUED
