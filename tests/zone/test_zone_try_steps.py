"""A placement try and a queue pass as the core's sans-IO steps (laminar_zone.trying),
driven here with no sockets, journal or ZoneState: each request is answered at once, as
the test says, and the order of the requests and the core's decisions are asserted."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Generator, Sequence
from typing import Any

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import LIVE_SUBJOB_STATES, EndCause, end_cause
from laminar_base.demand import Demand
from laminar_zone.core import (
    Confirm,
    Failure,
    Instruction,
    Journal,
    Loop,
    Member,
    Release,
    Terminate,
    Wake,
    ZoneCore,
)
from laminar_zone.entry import Entry
from laminar_zone.placement import ShapeCap
from laminar_zone.placements import COMMITTING
from laminar_zone.reasons import Reason, reason_of
from laminar_zone.trying import (
    AskSubjob,
    ClearMarket,
    Clock,
    CloseRound,
    CommitMembers,
    CommitOnProbe,
    DoInstructions,
    Gathered,
    GatherLeases,
    OpenRound,
    RunInstructions,
    SettleStarts,
    Slot,
    StartJob,
    confirm_steps,
    pass_steps,
    place_try,
    readdress_steps,
)
from laminar_zone.view import ZoneView

GIB = 1 << 30
NOW = 1_700_000_000.0
CLOCK = Clock(mono=lambda: 5.0, unix=lambda: NOW)
BUSY = Failure("FAILED_PRECONDITION: lease expired", unknown=False)
_ids = itertools.count()


def _core(agents: int = 4) -> ZoneCore:
    view = ZoneView(stale_after_seconds=3.0)
    for i in range(agents):
        view.update(
            f"a{i}",
            f"127.0.0.1:{i + 1}",
            {"gpu:H100-80GB": ShapeCap(1, 1, 0, 80 * GIB)},
            heat=0,
            draining=False,
            now=0.0,
            total_gpus=1,
        )
    return ZoneCore(view, {}, lost_after_seconds=10.0)


def _submit(core: ZoneCore, gang: int = 1, need: Demand | None = None) -> Entry:
    need = need or Demand(gpus=1)
    resources = (
        common_pb2.Resources(cpu_milli=need.cpu_milli)
        if need.cpu_milli
        else common_pb2.Resources(gpus=need.gpus)
    )
    job = zone_pb2.Job(
        job_id=f"j-{next(_ids)}",
        spec=zone_pb2.JobSpec(command=["true"], resources=resources, gang_size=gang),
        state=zone_pb2.PENDING,
        reason="placing",
        submitted_unix=NOW,
        attempts=1,
    )
    entry = Entry(job=job, need=need, submitted_mono=0.0)
    core.admit(entry)
    core.route(entry, allow_forward=False, now_mono=0.0)
    return entry


def _leases(*agents: str) -> Gathered:
    """A gather that bound one lease per member, on these agents."""
    return Gathered(
        chosen=tuple(f"lease-{a}" for a in agents),
        members=tuple(Member(a, f"addr-{a}", (f"{a}/gpu0",)) for a in agents),
        probes=len(agents),
    )


class Driver:
    """Answers a try's requests at once and records them."""

    def __init__(
        self,
        gather: Callable[[GatherLeases], Gathered],
        commit: Callable[[CommitMembers], Sequence[Failure | None]],
    ) -> None:
        self.gather = gather
        self.commit = commit
        self.requests: list[object] = []
        self.instructions: list[Instruction] = []

    def drive(self, steps: Generator[Any, Any, Any]) -> Any:
        answer: Any = None
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                return done.value
            self.requests.append(step)
            answer = None
            if isinstance(step, (RunInstructions, DoInstructions)):
                self.instructions += step.instructions
            elif isinstance(step, GatherLeases):
                answer = self.gather(step)
            elif isinstance(step, CommitMembers):
                answer = list(self.commit(step))
            else:
                assert isinstance(step, Slot)

    def count(self, kind: type) -> int:
        return sum(isinstance(r, kind) for r in self.requests)


def _try(core: ZoneCore, entry: Entry, driver: Driver, *, from_queue: bool = False) -> bool:
    steps = place_try(
        core,
        entry,
        from_queue=from_queue,
        lease_ttl_seconds=5.0,
        budget_seconds=2.0,
        clock=CLOCK,
    )
    return bool(driver.drive(steps))


def test_a_lost_commit_is_tried_once_more_and_then_the_job_is_queued() -> None:
    core = _core()
    entry = _submit(core, gang=2)
    driver = Driver(lambda _: _leases("a0", "a1"), lambda step: [BUSY] * len(step.placements))

    assert not _try(core, entry, driver)

    # Slot, then two gathers, each followed by one commit of both members: no third.
    assert isinstance(driver.requests[0], Slot) and driver.count(Slot) == 1
    assert driver.count(GatherLeases) == 2 and driver.count(CommitMembers) == 2
    kinds = [type(r) for r in driver.requests if isinstance(r, (GatherLeases, CommitMembers))]
    assert kinds == [GatherLeases, CommitMembers, GatherLeases, CommitMembers]
    job = entry.job
    assert job.state == zone_pb2.QUEUED and not entry.placing
    assert job.attempts == 3  # each lost commit began a new attempt
    assert Wake(Loop.QUEUE) in driver.instructions
    assert len(job.placements) == 4
    assert {end_cause(p.end_cause) for p in job.placements} == {EndCause.COMMIT_FAILED}


def test_a_commit_lost_once_is_placed_by_the_second_gather() -> None:
    core = _core()
    entry = _submit(core, gang=2)
    answers: list[list[Failure | None]] = [[BUSY, BUSY], [None, None]]

    def commit(step: CommitMembers) -> list[Failure | None]:
        out = answers.pop(0)
        for placement, answer in zip(step.placements, out, strict=True):
            if answer is None:
                placement.state = common_pb2.RUNNING
        return out

    driver = Driver(lambda _: _leases("a2", "a3"), commit)
    assert _try(core, entry, driver, from_queue=True)
    assert driver.count(GatherLeases) == 2
    assert entry.job.state == zone_pb2.JOB_RUNNING and not entry.placing
    assert [p.agent_id for p in entry.current()] == ["a2", "a3"]


def test_a_gang_whose_one_member_fails_to_commit_rolls_back_every_member() -> None:
    core = _core()
    entry = _submit(core, gang=2)

    def commit(step: CommitMembers) -> list[Failure | None]:
        step.placements[0].state = common_pb2.RUNNING  # member 0 started
        step.placements[0].reason = "running"
        return [None, BUSY]

    driver = Driver(lambda _: _leases("a0", "a1"), commit)
    assert not _try(core, entry, driver)

    first, second = entry.job.placements
    stops = [i for i in driver.instructions if isinstance(i, Terminate)]
    assert [(s.placement.subjob_id, s.cause) for s in stops] == [
        (first.subjob_id, EndCause.COMMIT_FAILED)
    ]
    assert second.state == common_pb2.FAILED
    # The retry finds member 0's copy still live: the job waits for its end, and is not
    # committed again meanwhile (nothing runs twice).
    assert driver.count(CommitMembers) == 1 and driver.count(GatherLeases) == 1
    assert first.state in LIVE_SUBJOB_STATES
    assert entry.job.state == zone_pb2.QUEUED
    assert reason_of(entry.job.reason_code) is Reason.PREVIOUS_COPY


def test_a_gather_that_finds_nothing_queues_the_job_without_a_commit() -> None:
    core = _core()
    entry = _submit(core)
    driver = Driver(lambda _: Gathered(reasons=("no free gpu",), probes=3, bounces=3), lambda _: [])
    assert not _try(core, entry, driver)
    assert driver.count(CommitMembers) == 0
    assert entry.job.state == zone_pb2.QUEUED and entry.job.bounces == 3


def test_a_try_stopped_early_leaves_the_job_free_to_place_again() -> None:
    core = _core()
    entry = _submit(core, gang=2)
    steps = place_try(
        core, entry, from_queue=False, lease_ttl_seconds=5.0, budget_seconds=2.0, clock=CLOCK
    )
    assert isinstance(next(steps), Slot)
    assert entry.placing and not core.may_place(entry)
    steps.close()  # the driver's task was cancelled
    assert not entry.placing and core.may_place(entry)


def _pass(
    core: ZoneCore,
    start: Callable[[Entry], bool],
    market: object | None = None,
    settle: Callable[[tuple[Entry, ...]], list[Entry]] = list,
) -> tuple[list[Entry], list[object]]:
    """One pass, each start answered by ``start`` and the round's wait for the started
    tries by ``settle`` (the entries that placed); returns the jobs left and the requests."""
    steps = pass_steps(core, shares={}, backfill=True, rng=random.Random(0), clock=CLOCK)
    requests: list[object] = []
    answer: Any = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration as done:
            return done.value, requests
        requests.append(step)
        answer = None
        if isinstance(step, OpenRound):
            answer = market
        elif isinstance(step, StartJob):
            answer = start(step.entry)
        elif isinstance(step, SettleStarts):
            answer = settle(step.entries)
        else:
            assert isinstance(step, (DoInstructions, ClearMarket, CloseRound))


def test_a_blocked_head_blocks_its_family_but_not_another() -> None:
    core = _core()
    gpu_head = _submit(core)
    gpu_next = _submit(core)
    cpu_job = _submit(core, need=Demand(cpu_milli=1000))
    for e in (gpu_head, gpu_next, cpu_job):
        e.job.state = zone_pb2.QUEUED
    tried: list[Entry] = []

    def start(entry: Entry) -> bool:
        tried.append(entry)
        if entry is gpu_head:  # the try found no room: it stays queued
            entry.job.state = zone_pb2.QUEUED
            return False
        entry.job.state = zone_pb2.JOB_RUNNING
        return True

    left, requests = _pass(core, start)

    # The gpu head blocks the next gpu job (no backfill: no run time is declared), but the
    # cpu job, of another family, is tried and starts.
    assert tried == [gpu_head, cpu_job]
    assert left == [gpu_head, gpu_next]
    assert cpu_job.job.state == zone_pb2.JOB_RUNNING
    assert core.blocked_families == {"gpu": common_pb2.BATCH}
    assert reason_of(gpu_next.job.reason_code) is Reason.PRIORITY
    assert not any(isinstance(r, (ClearMarket, CloseRound)) for r in requests)
    assert isinstance(requests[-1], DoInstructions)  # the pass's bookkeeping, journaled


def test_a_pass_with_nothing_waiting_clears_the_blocked_families() -> None:
    core = _core()
    core.blocked_families["gpu"] = common_pb2.BATCH
    left, requests = _pass(core, lambda e: True)
    assert left == [] and core.blocked_families == {}
    assert [type(r) for r in requests] == [OpenRound]


def _on_probe(core: ZoneCore, started: bool) -> Callable[[GatherLeases], Gathered]:
    """A gather whose one probe carries the commit to a0 (journaled first, as the
    router's and the simulator's gathers do through CommitOnProbe); the agent starts the
    member (``started``) or the probe's answer is lost."""

    def gather(step: GatherLeases) -> Gathered:
        assert step.plan.commit_on_probe and step.plan.gang_size == 1
        book = CommitOnProbe(core, step.entry)
        book.bounced("a1")  # a bounce elsewhere drops nothing
        placement, journal = book.intent("a0", "addr-a0")
        assert placement.reason == COMMITTING and journal
        if not started:
            return Gathered(
                pending=book.pending, unsure="DEADLINE_EXCEEDED", probes=1, counted_probes=1
            )
        reply = common_pb2.Subjob(state=common_pb2.RUNNING, reason="running")
        return Gathered(
            pending=book.pending,
            committed=reply,
            slice_ids=("a0/gpu0",),
            probes=1,
            counted_probes=book.probes,
        )

    return gather


def test_a_probe_that_carried_the_commit_places_the_job_without_a_commit() -> None:
    core = _core()
    entry = _submit(core)
    driver = Driver(_on_probe(core, started=True), lambda _: [])
    assert _try(core, entry, driver)
    assert driver.count(CommitMembers) == 0
    (placement,) = entry.job.placements
    assert placement.state == common_pb2.RUNNING and list(placement.slice_ids) == ["a0/gpu0"]
    assert entry.job.state == zone_pb2.JOB_RUNNING
    assert entry.job.probes == 1  # counted once, by the intent


def test_a_probe_carrying_the_commit_that_got_no_answer_is_confirmed_not_retried() -> None:
    core = _core()
    entry = _submit(core)
    driver = Driver(_on_probe(core, started=False), lambda _: [])
    assert not _try(core, entry, driver)
    assert Confirm("a0", entry.job.job_id) in driver.instructions
    # The member may run on a0: the try does not gather again, and the job waits for a0's
    # word before it is placed again.
    assert driver.count(GatherLeases) == 1
    assert entry.job.attempts == 2 and entry.job.state == zone_pb2.QUEUED
    waits, _ = core.old_copy(entry, 0.0)
    assert waits


def test_a_started_retry_takes_only_its_own_attempt_s_slices_from_the_round() -> None:
    """A rigid job started in the pass takes its slices from the market's round; a retry's
    earlier attempts ended, and their slices are free again for the round's bids."""
    core = _core()
    entry = _submit(core)
    entry.job.state = zone_pb2.QUEUED
    entry.job.attempts = 2
    entry.job.placements.add(
        agent_id="a0", subjob_id="old", attempt=1, state=common_pb2.FAILED, slice_ids=["gpu0"]
    )

    class Round:
        classes: tuple[int, ...] = ()
        taken: list[tuple[str, str]] = []

        def note_started(self, placements: Any) -> None:
            self.taken.extend((p.agent_id, s) for p in placements for s in p.slice_ids)

    def start(e: Entry) -> bool:
        e.job.placements.add(
            agent_id="a1", subjob_id="new", attempt=2, state=common_pb2.RUNNING, slice_ids=["gpu3"]
        )
        e.job.state = zone_pb2.JOB_RUNNING
        return True

    market = Round()
    _pass(core, start, market)
    assert market.taken == [("a1", "gpu3")]


def test_a_blocked_head_expects_the_slices_an_atomized_piece_holds_at_its_window_s_end() -> None:
    """Atomized pieces give their slices back when their windows end (a window is cut at a
    blocked head's start), so the head's expected start counts them there; counting only
    rigid jobs' ends, the head had no estimate, no window was cut for it, and pieces kept
    extending in place on the slices the gang waits for."""
    view = ZoneView(stale_after_seconds=3.0)
    view.update(
        "a0",
        "127.0.0.1:1",
        {"gpu:H100-80GB": ShapeCap(0, 2, 0, 0)},  # both GPUs busy: nothing free now
        heat=0,
        draining=False,
        now=0.0,
        total_gpus=2,
    )
    atoms = {"piece-job"}
    core = ZoneCore(
        view, {}, atoms=atoms, demand_of=lambda r: Demand(gpus=r.gpus), lost_after_seconds=10.0
    )
    pieces = Entry(
        job=zone_pb2.Job(job_id="piece-job", spec=zone_pb2.JobSpec(command=["x"])),
        need=Demand(gpus=1),
    )
    for i, end in enumerate((NOW + 300.0, NOW + 900.0)):
        pieces.job.placements.add(
            subjob_id=f"piece-{i}",
            agent_id="a0",
            state=common_pb2.RUNNING,
            resources=common_pb2.Resources(gpus=1),
            window_end_unix=end,
        )
    core.admit(pieces)
    gang = _submit(core, gang=2)
    assert core.expected_start(gang, 0.0, NOW, {}, {}) == NOW + 900.0  # both slices back
    one = _submit(core)
    assert core.expected_start(one, 0.0, NOW, {}, {}) == NOW + 300.0


def _unsure(core: ZoneCore) -> Entry:
    """A job whose probe carried its commit to a0 and got no answer: a0 is to be asked."""
    entry = _submit(core)
    assert not _try(core, entry, Driver(_on_probe(core, started=False), lambda _: []))
    return entry


def _confirm(core: ZoneCore, answer: Callable[[AskSubjob], object]) -> list[object]:
    """Drive confirm_steps for a0, answering each question with ``answer``; the steps."""
    steps = confirm_steps(core, "a0", clock=lambda: NOW)
    seen: list[object] = []
    reply: Any = None
    while True:
        try:
            step = steps.send(reply)
        except StopIteration:
            return seen
        seen.append(step)
        reply = answer(step) if isinstance(step, AskSubjob) else None


def test_an_agent_that_started_an_unsure_commit_of_an_attempt_given_up_is_told_to_stop() -> None:
    """The try gave the unsure attempt up (the job is queued for its next): the copy the
    agent says it runs is one nothing counts on, so it is stopped; the job is judged,
    journaled, and the queue woken."""
    core = _core()
    entry = _unsure(core)
    running = common_pb2.Subjob(state=common_pb2.RUNNING, reason="running", slice_ids=["a0/gpu0"])
    seen = _confirm(core, lambda ask: running)
    (ask,) = [s for s in seen if isinstance(s, AskSubjob)]
    assert ask.placement.agent_id == "a0"
    done = [i for s in seen if isinstance(s, DoInstructions) for i in s.instructions]
    stops = [i for i in done if isinstance(i, Terminate)]
    assert [t.placement.subjob_id for t in stops] == [ask.placement.subjob_id]
    assert Journal((entry,)) in done and done[-1] == Wake(Loop.QUEUE)
    assert entry.job.state == zone_pb2.QUEUED
    assert core.to_confirm("a0") == []  # answered: not asked again


def test_an_agent_that_never_started_an_unsure_commit_frees_the_job_to_place_again() -> None:
    core = _core()
    entry = _unsure(core)
    _confirm(core, lambda ask: None)
    assert not [p for p in entry.job.placements if p.state in LIVE_SUBJOB_STATES]
    waits, _ = core.old_copy(entry, 0.0)
    assert not waits and entry.job.state == zone_pb2.QUEUED


def test_an_unanswered_question_is_asked_again_at_the_next_heartbeat() -> None:
    core = _core()
    entry = _unsure(core)
    seen = _confirm(core, lambda ask: Failure("UNAVAILABLE: connection reset"))
    assert sum(isinstance(s, AskSubjob) for s in seen) == 1
    assert core.to_confirm("a0") == [entry.job.job_id]
    waits, _ = core.old_copy(entry, 0.0)
    assert waits  # still held out of placement until a0 says


def test_a_round_waits_for_the_pass_s_starts_and_learns_only_the_slices_they_took() -> None:
    """With a round open, pipelined starts are answered before their tries end: before
    the round clears or closes, the pass asks for those tries to end (SettleStarts), and
    the round is told the slices of those that placed, not of one that failed after."""
    core = _core()
    first, second = _submit(core), _submit(core)
    for e in (first, second):
        e.job.state = zone_pb2.QUEUED

    class Round:
        classes: tuple[int, ...] = ()
        taken: list[tuple[str, str]] = []

        def note_started(self, placements: Any) -> None:
            self.taken.extend((p.agent_id, s) for p in placements for s in p.slice_ids)

    def start(e: Entry) -> bool:  # both reach the network: "started, pending"
        agent = "a1" if e is first else "a2"
        e.job.placements.add(
            agent_id=agent,
            subjob_id=f"{agent}-s",
            attempt=e.job.attempts,
            state=common_pb2.RUNNING,
            slice_ids=["gpu0"],
        )
        return True

    asked: list[tuple[Entry, ...]] = []

    def settle(entries: tuple[Entry, ...]) -> list[Entry]:
        asked.append(entries)
        return [first]  # the second's try failed after the pass went on

    market = Round()
    _, requests = _pass(core, start, market, settle)
    assert asked == [(first, second)]
    settles = [i for i, r in enumerate(requests) if isinstance(r, SettleStarts)]
    closes = [i for i, r in enumerate(requests) if isinstance(r, CloseRound)]
    assert settles and closes and settles[0] < closes[0]
    assert market.taken == [("a1", "gpu0")]


# ==================================================================== moving a subjob

LOST = Failure("UNAVAILABLE: connection reset", unknown=True)


def _started(step: CommitMembers) -> list[Failure | None]:
    """Every member's Commit answered: its agent runs it."""
    for placement in step.placements:
        placement.state = common_pb2.RUNNING
        placement.reason = "running"
    return [None] * len(step.placements)


def _running_on(core: ZoneCore, agent: str) -> tuple[Entry, zone_pb2.Placement]:
    """A single-member job running on ``agent``, and its placement."""
    entry = _submit(core)
    assert _try(core, entry, Driver(lambda _: _leases(agent), _started))
    (placement,) = entry.current()
    assert placement.agent_id == agent and placement.state == common_pb2.RUNNING
    return entry, placement


def _move(
    core: ZoneCore,
    agent: str,
    subjob_id: str,
    gather: Callable[[GatherLeases], Gathered],
    commit: Callable[[CommitMembers], Sequence[Failure | None]] = _started,
) -> tuple[bool, Driver]:
    driver = Driver(gather, commit)
    steps = readdress_steps(core, agent, subjob_id, lease_ttl_seconds=5.0, clock=lambda: NOW)
    return bool(driver.drive(steps)), driver


def test_a_move_gathers_elsewhere_commits_the_copy_with_its_count_and_retires_the_old() -> None:
    core = _core()
    entry, old = _running_on(core, "a0")

    moved, driver = _move(core, "a0", old.subjob_id, lambda _: _leases("a2"))

    assert moved
    gather, journal, commit, told = driver.requests
    assert isinstance(gather, GatherLeases) and gather.entry is entry
    assert gather.exclude == frozenset({"a0"})  # elsewhere only
    assert gather.plan.gang_size == 1 and not gather.plan.commit_on_probe
    assert journal == RunInstructions((Journal((entry,)),))  # the copy, before its commit
    assert isinstance(commit, CommitMembers) and commit.leases == ("lease-a2",)
    (copy,) = commit.placements
    assert copy.agent_id == "a2" and copy.slice_ids == ["a2/gpu0"]
    assert commit.env == {"LAMINAR_READDRESS_COUNT": "1"}
    assert isinstance(told, RunInstructions)
    assert Terminate(old, old.reason, EndCause.READDRESSED) in told.instructions
    assert end_cause(old.end_cause) is EndCause.READDRESSED
    assert entry.current() == [copy]
    assert core.readdressing == set()  # the move is over: the copy may move in turn


def test_a_subjob_the_core_will_not_move_asks_for_nothing() -> None:
    core = _core()
    _, old = _running_on(core, "a0")
    gang = _submit(core, gang=2)
    assert _try(core, gang, Driver(lambda _: _leases("a1", "a2"), _started))
    member = gang.current()[0]

    for agent, subjob_id in (("a1", old.subjob_id), (member.agent_id, member.subjob_id)):
        moved, driver = _move(core, agent, subjob_id, lambda _: _leases("a3"))
        assert not moved and driver.requests == []  # not the reporter's; a gang member
    assert old.state == common_pb2.RUNNING and core.readdressing == set()


def test_a_move_that_finds_no_host_commits_nothing_and_holds_no_lease() -> None:
    core = _core()
    entry, old = _running_on(core, "a0")

    moved, driver = _move(core, "a0", old.subjob_id, lambda _: Gathered(reasons=("no room",)))

    assert not moved
    assert [type(r) for r in driver.requests] == [GatherLeases]
    assert entry.current() == [old] and old.state == common_pb2.RUNNING
    assert core.readdressing == set()  # the next heartbeat may ask again
    again, _ = _move(core, "a0", old.subjob_id, lambda _: _leases("a1"))
    assert again


def test_a_moves_commit_that_failed_is_told_to_the_core_and_the_old_copy_kept() -> None:
    core = _core()
    entry, old = _running_on(core, "a0")

    moved, driver = _move(core, "a0", old.subjob_id, lambda _: _leases("a2"), lambda _: [BUSY])

    assert not moved
    commit = next(r for r in driver.requests if isinstance(r, CommitMembers))
    (copy,) = commit.placements
    assert copy.state == common_pb2.FAILED and end_cause(copy.end_cause) is EndCause.READDRESSED
    assert isinstance(driver.requests[-1], RunInstructions)
    assert driver.requests[-1].instructions == (Journal((entry,)),)
    assert entry.current() == [old] and old.state == common_pb2.RUNNING
    assert not [i for i in driver.instructions if isinstance(i, Terminate)]
    assert core.readdressing == set()
    # A lost reply: the copy may run, so its agent is asked; the old copy still runs.
    moved, driver = _move(core, "a0", old.subjob_id, lambda _: _leases("a3"), lambda _: [LOST])
    assert not moved and Confirm("a3", entry.job.job_id) in driver.instructions
    assert old.state == common_pb2.RUNNING


def test_a_job_that_ended_while_its_move_gathered_gives_the_lease_back() -> None:
    core = _core()
    entry, old = _running_on(core, "a0")

    def gather(_: GatherLeases) -> Gathered:
        entry.job.state = zone_pb2.JOB_CANCELLED  # cancelled while the probes were out
        return _leases("a2")

    moved, driver = _move(core, "a0", old.subjob_id, gather)

    assert not moved
    assert driver.requests[1:] == [RunInstructions((Release(("lease-a2",)),))]
    assert entry.current() == [old]  # no copy journaled
    assert core.readdressing == set()


def test_a_move_stopped_early_is_over_for_the_core() -> None:
    core = _core()
    _, old = _running_on(core, "a0")
    steps = readdress_steps(core, "a0", old.subjob_id, lease_ttl_seconds=5.0, clock=lambda: NOW)
    assert isinstance(next(steps), GatherLeases)
    assert core.readdressing == {old.subjob_id}  # a second ask waits for this move
    steps.close()  # the driver's task was cancelled
    assert core.readdressing == set()
