"""A placement try and a queue pass as sans-IO steps of the zone core.

The decisions of one placement try and of one queue pass are the core's
(:class:`laminar_zone.core.ZoneCore`); the *order* in which they are strung together is
here, once, as generators that yield I/O requests (frozen dataclasses) and receive their
results through ``send``:

* :func:`place_try`: may the job be placed -> a placement slot -> an old copy holds it
  out? -> the try's plan -> gather leases (or commit on probe) -> what the gather's
  outcome means -> journal the intent, commit every member, judge the answers (a gang
  rolls back) -> a lost commit gathers once more -> placed, or queued;
* :func:`commit_steps`: the commit part alone (the router's CommitJob commits leases a
  client probed);
* :class:`PassTry`: a pass's start pipelined (the pass waits for a try only until its
  first request that crosses the network, the rest runs on beside it);
* :func:`pass_steps`: dependencies resolved -> the waiting jobs -> the market's round
  opened -> the pass's book -> :func:`laminar_zone.queue.class_order` (each start tried,
  each clearing round asked) -> the round closed -> the pass's bookkeeping journaled;
* :func:`confirm_steps`: an agent heartbeats after commits of unknown outcome on it ->
  each is asked about -> the answers recorded, each job judged, journaled, forgotten if
  done -> the queue woken;
* :func:`readdress_steps`: Airlock asks to move a subjob -> may it move? -> a gather of
  one member elsewhere -> nothing found (or the job ended): the lease given back -> the
  copy journaled where it was found -> its commit -> the outcome told to the core -> the
  move over.

The router (``laminar_zone.jobs.ZoneState``) drives them with awaits (gRPC, the journal,
tasks); ``sim replay`` answers them at once with the agents' own code. Neither strings
the decisions together itself. Time comes from the ``clock`` each generator is given
(the router's clocks, or the simulator's); nothing here awaits, reads the clock or does
I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import TERMINAL_JOB_STATES
from laminar_base.jobenv import READDRESS_COUNT_ENV
from laminar_zone.core import (
    Failure,
    Instruction,
    Journal,
    Loop,
    Member,
    Next,
    Release,
    TryPlan,
    Wake,
    ZoneCore,
)
from laminar_zone.entry import Entry
from laminar_zone.queue import Bidding, Clear, Start, class_order

if TYPE_CHECKING:
    import random

log = logging.getLogger("laminar.zone.trying")


@dataclass(frozen=True)
class Clock:
    """The driver's clocks: monotonic seconds (durations, ages) and Unix seconds (records)."""

    mono: Callable[[], float]
    unix: Callable[[], float]


# ==================================================================== requests of a try


@dataclass(frozen=True)
class Slot:
    """Wait for a placement slot (the router's bound on concurrent tries); answer None.
    The slot is held until the try ends."""


@dataclass(frozen=True)
class RunInstructions:
    """Carry out the core's instructions, awaiting stops, placements and forwards;
    answer None."""

    instructions: tuple[Instruction, ...]


@dataclass(frozen=True)
class DoInstructions:
    """Carry out the core's instructions without waiting for them (stops and placements
    become tasks); answer None."""

    instructions: tuple[Instruction, ...]


@dataclass(frozen=True)
class GatherLeases:
    """Gather leases for every member of ``entry``'s try as ``plan`` says (with
    ``plan.commit_on_probe`` the probes may carry the commit, each recorded first with
    :meth:`ZoneCore.probe_intent`); answer a :class:`Gathered`."""

    entry: Entry
    plan: TryPlan
    #: Agents the gather must not probe (a move's copy goes elsewhere); a try excludes none.
    exclude: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Gathered:
    """What a gather came to, as the driver read it."""

    #: One lease per member, as the driver holds them (what a ``Release`` gives back);
    #: None: nothing was bound (or the probe that carried the commit bound it).
    chosen: tuple[Any, ...] | None = None
    #: Where each chosen lease is (same order as ``chosen``).
    members: tuple[Member, ...] = ()
    #: The calls that failed, as :class:`Failure` values.
    failures: tuple[Failure, ...] = ()
    #: The probes' reasons for not placing (bounces, no candidate).
    reasons: tuple[str, ...] = ()
    probes: int = 0
    bounces: int = 0
    #: Commit on probe: the placement journaled for the last probe that carried the commit
    #: and was not surely bounced (None: no such probe is outstanding).
    pending: zone_pb2.Placement | None = None
    #: The subjob the probe that carried the commit started (None: not started).
    committed: common_pb2.Subjob | None = None
    #: The slices the started subjob took.
    slice_ids: tuple[str, ...] = ()
    #: Why a probe carrying the commit got no answer (the member may run there).
    unsure: str = ""
    #: Probes :meth:`ZoneCore.probe_intent` counted into the job already.
    counted_probes: int = 0


@dataclass(frozen=True)
class CommitMembers:
    """Commit every member: ``placements[i]`` (journaled as committing) with ``leases[i]``;
    record each reply into its placement; answer, per member, None (taken) or the
    :class:`Failure`."""

    entry: Entry
    placements: tuple[zone_pb2.Placement, ...]
    leases: tuple[Any, ...]
    #: Variables added to the job's environment for these members (a move's count); a
    #: try adds none.
    env: Mapping[str, str] = field(default_factory=dict)


TryStep = Slot | RunInstructions | DoInstructions | GatherLeases | CommitMembers


class CommitOnProbe:
    """Commit on probe for one try (a :class:`GatherLeases` whose ``plan`` says so): the
    member's placement is journaled as committing on each host before the probe that
    carries the commit goes out, and dropped again when that host bounced it. The driver
    of the gather calls :meth:`intent` and :meth:`bounced` and answers the try with
    :attr:`pending` and :attr:`probes` (:class:`Gathered`)."""

    def __init__(self, core: ZoneCore, entry: Entry) -> None:
        self.core = core
        self.entry = entry
        #: The placement journaled for the probe under way, if any.
        self.pending: zone_pb2.Placement | None = None
        #: Probes already counted into the job (the try's total adds the rest).
        self.probes = 0

    def intent(self, agent_id: str, address: str) -> tuple[zone_pb2.Placement, list[Instruction]]:
        """The member may start on ``agent_id`` with the probe about to go out: its
        placement (how the agent runs it), and the instructions that journal it."""
        placement, instructions = self.core.probe_intent(self.entry, agent_id, address)
        self.probes += 1
        self.pending = placement
        return placement, instructions

    def bounced(self, agent_id: str) -> None:
        """The probe to ``agent_id`` surely did not start the member (a bounce, or a call
        the agent refused)."""
        if self.pending is None or self.pending.agent_id != agent_id:
            return
        self.core.probe_bounced(self.entry, self.pending)
        self.pending = None


# ==================================================================== the try


def place_try(
    core: ZoneCore,
    entry: Entry,
    *,
    from_queue: bool,
    lease_ttl_seconds: float,
    budget_seconds: float,
    clock: Clock,
) -> Generator[TryStep, Any, bool]:
    """One placement try within the probe budget; returns whether the job was placed (if
    not, it waits in the queue, or has ended). A lost commit gathers once more.

    The driver must close the generator if it stops driving it early (the job is then no
    longer placing)."""
    if not core.may_place(entry):
        return False
    core.set_placing(entry, True)
    try:
        started = clock.mono()
        yield Slot()
        may_retry = True
        while True:
            outcome, gathered = yield from _gather_and_commit(
                core, entry, lease_ttl_seconds, budget_seconds, clock
            )
            if outcome is Next.STOP:
                return False
            if outcome is Next.COMMIT:  # committed: the job runs
                break
            step, instructions = core.commit_lost(entry, may_retry, clock.mono(), clock.unix())
            yield RunInstructions(tuple(instructions))
            if step is not Next.RETRY:
                return False
            may_retry = False
        now = clock.mono()
        yield DoInstructions(
            tuple(
                core.placed(
                    entry, from_queue, now - started, now, gathered.probes, gathered.bounces
                )
            )
        )
        return True
    finally:
        core.set_placing(entry, False)


def _gather_and_commit(
    core: ZoneCore,
    entry: Entry,
    lease_ttl_seconds: float,
    budget_seconds: float,
    clock: Clock,
) -> Generator[TryStep, Any, tuple[Next, Gathered]]:
    """One gather and its commit: :attr:`Next.COMMIT` when the job runs, :attr:`Next.RETRY`
    when the commit did not place it (the caller asks :meth:`ZoneCore.commit_lost`),
    :attr:`Next.STOP` when the try is over (an old copy holds the job out, nothing was
    found, or the job ended)."""
    job = entry.job
    waits, instructions = core.old_copy(entry, clock.mono())
    if instructions:
        yield RunInstructions(tuple(instructions))
    if waits:
        return Next.STOP, Gathered()
    plan = core.plan_try(entry, lease_ttl_seconds, budget_seconds)
    gathered: Gathered = yield GatherLeases(entry, plan)
    job.probes += max(0, gathered.probes - gathered.counted_probes)
    job.bounces += gathered.bounces
    if gathered.pending is not None:
        ok, instructions = core.probe_committed(
            entry,
            gathered.pending,
            gathered.committed,
            list(gathered.slice_ids),
            gathered.unsure,
            clock.unix(),
        )
        yield RunInstructions(tuple(instructions))
    else:
        step, instructions = core.gathered(
            entry,
            gathered.chosen,
            gathered.failures,
            gathered.reasons,
            clock.mono(),
            clock.unix(),
        )
        if instructions:
            yield RunInstructions(tuple(instructions))
        if step is not Next.COMMIT or gathered.chosen is None:
            return Next.STOP, gathered
        ok = yield from commit_steps(core, entry, gathered.members, gathered.chosen, clock)
    return (Next.COMMIT if ok else Next.RETRY), gathered


def commit_steps(
    core: ZoneCore,
    entry: Entry,
    members: Sequence[Member],
    leases: Sequence[Any],
    clock: Clock,
) -> Generator[TryStep, Any, bool]:
    """Journal the intent, commit every lease, and roll back all members if any fails (the
    core says how). Returns whether the job runs."""
    yield RunInstructions(tuple(core.begin_commit(entry, members)))
    answers: Sequence[Failure | None] = yield CommitMembers(
        entry, tuple(entry.current()), tuple(leases)
    )
    ok, instructions = core.committed(entry, answers, clock.unix())
    yield RunInstructions(tuple(instructions))
    return ok


class PassTry:
    """A queue pass's start of one job, pipelined: the pass waits for the job's try only
    until the try's first request that crosses the network (its gather or its commit),
    not for the whole try, so one slow or lost probe stalls no job behind it.

    The driver drives :meth:`steps` (the try's own steps, unchanged) as it drives any
    try; the pass's answer to its :class:`StartJob` is :meth:`answer` once the try ended
    or waits on the network: the try's result if it ended before (the view showed no room:
    the job queues, as when the pass awaited the whole try), else True ("started,
    pending"). The rest of the try runs on beside the pass. A try that then does not place
    the job ends as any failed try does (the core queues it, or retries it), and wakes the
    next pass. The pass's book counted the job started meanwhile, as
    :meth:`ZoneCore.tenant_usage` counts a job that is placing; the next pass counts it
    only while its try is under way (``entry.placing``: :meth:`PassBook.admit` skips it,
    so no job is tried twice).

    With a clearing round open the pass asks, before the round clears or closes, that
    the tries it started end (:class:`SettleStarts`): the round must know the slices each
    start took (:meth:`Round.note_started`) before it offers any to a lower class."""

    def __init__(self, noticed: Callable[[], None] = lambda: None) -> None:
        #: Called once, as the try makes its first request that crosses the network.
        self.noticed = noticed
        #: The try made a request that crosses the network.
        self.at_network = False
        #: The try's result once it ended (None: under way).
        self.placed: bool | None = None

    def steps(self, steps: Generator[TryStep, Any, bool]) -> Generator[TryStep, Any, bool]:
        """``steps`` (a :func:`place_try`) as they are; the first request that crosses the
        network is noticed, and a try that ends unplaced after it wakes the queue."""
        try:
            answer: Any = None
            while True:
                try:
                    step = steps.send(answer)
                except StopIteration as done:
                    self.placed = bool(done.value)
                    break
                if not self.at_network and isinstance(step, (GatherLeases, CommitMembers)):
                    self.at_network = True
                    self.noticed()
                answer = yield step
        finally:
            steps.close()
        if self.at_network and not self.placed:
            # The pass may have counted it started: the next pass looks again.
            yield DoInstructions((Wake(Loop.QUEUE),))
        return self.placed

    def answer(self) -> bool | None:
        """The pass's answer now: the try's result once it ended, True while it waits on
        the network, None before (it waits for a placement slot: so does the pass)."""
        if self.placed is not None:
            return self.placed
        return True if self.at_network else None


# ==================================================================== the pass


class Round(Protocol):
    """A clearing round spread over a pass's classes, as the driver opened it (the
    router's ``laminar_zone.atomizer.MarketRound``)."""

    @property
    def classes(self) -> Iterable[int | Bidding]: ...

    def note_started(self, placements: Iterable[zone_pb2.Placement]) -> None: ...


@dataclass(frozen=True)
class OpenRound:
    """Open the market's clearing round for this pass with the tenants' usage; answer the
    :class:`Round`, or None when no atomized work waits. ``units``/``memory`` are the
    pass's running tally per tenant, the very dicts the pass's book counts its starts
    into: the round counts its awards into them too (one quota for rigid and atomized
    work)."""

    units: dict[str, float]
    memory: dict[str, int]


@dataclass(frozen=True)
class StartJob:
    """Run a placement try of ``entry`` from the queue (:func:`place_try`,
    ``from_queue=True``); answer whether it placed the job."""

    entry: Entry


@dataclass(frozen=True)
class SettleStarts:
    """Before a clearing round clears (or closes): wait for the tries of these starts to
    end (a pipelined start is answered before its try ends, :class:`PassTry`); answer the
    entries whose try placed them. The round must know the slices a start took before it
    offers any to a lower class. A driver whose :class:`StartJob` answers are the tries'
    results answers all of them."""

    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class ClearMarket:
    """Run the clearing round ``step`` asks (``Atomizer.clear_class``); answer None."""

    round: Round
    step: Clear


@dataclass(frozen=True)
class CloseRound:
    """The pass's last class is done: close the round (``Atomizer.close_round``); answer
    None."""

    round: Round


PassStep = DoInstructions | OpenRound | StartJob | SettleStarts | ClearMarket | CloseRound


def _tell_round(market: Round, started: list[Entry]) -> Generator[PassStep, Any, None]:
    """Tell the round the slices the pass's starts took, once their tries ended."""
    if not started:
        return
    placed: Sequence[Entry] = yield SettleStarts(tuple(started))
    for entry in placed:
        market.note_started(entry.current())  # this attempt's, not earlier ones'
    started.clear()


def pass_steps(
    core: ZoneCore,
    *,
    shares: Mapping[str, float],
    backfill: bool,
    rng: random.Random,
    clock: Clock,
) -> Generator[PassStep, Any, list[Entry]]:
    """One pass over all waiting work in one class order (:func:`class_order`): per
    priority class, highest first, the walk of its rigid jobs (each start a placement try
    the driver runs; a blocked head of one family blocks no other family) and then its
    clearing round. Returns the rigid jobs left waiting."""
    now_unix = clock.unix()
    instructions = core.resolve_waiting(now_unix)
    if instructions:
        yield DoInstructions(tuple(instructions))
    waiting = core.waiting()
    units, memory = core.tenant_usage()
    market: Round | None = yield OpenRound(units, memory)
    if not waiting and market is None:
        core.idle_pass()
        return []
    book = core.begin_pass(
        waiting, units, memory, shares, now_unix, clock.mono(), backfill=backfill
    )
    steps = class_order(
        book.walk,
        book.waiting,
        lambda e: e.item,
        book.expected_start,
        market.classes if market is not None else (),
        admit=book.admit,
        waited=book.waited,
        estimate_all=True,
    )
    answer: bool | None = None
    started: list[Entry] = []  # starts the round has not been told of yet
    while True:
        try:
            step = steps.send(answer)
        except StopIteration as done:
            kept: list[Entry] = done.value
            break
        answer = None
        if isinstance(step, Start):
            entry: Entry = step.job
            if not book.may_start(entry, rng):
                answer = False
                continue
            placed: bool = yield StartJob(entry)
            if placed and market is not None:
                started.append(entry)
            answer = book.started(entry, placed)
        else:
            assert market is not None  # a round is asked only for a class with market work
            yield from _tell_round(market, started)
            yield ClearMarket(market, step)
    if market is not None:
        yield from _tell_round(market, started)
        yield CloseRound(market)
    yield DoInstructions(tuple(core.end_pass(book)))
    return kept


# ==================================================================== confirming commits


@dataclass(frozen=True)
class AskSubjob:
    """Ask the placement's agent about its subjob, a commit of unknown outcome (GetSubjob);
    answer the subjob as the agent runs it, None (the agent knows no such subjob: the
    commit never started it) or a :class:`Failure` (no answer: ask again at the agent's
    next heartbeat)."""

    placement: zone_pb2.Placement


ConfirmStep = AskSubjob | DoInstructions


def confirm_steps(
    core: ZoneCore, agent_id: str, *, clock: Callable[[], float]
) -> Generator[ConfirmStep, Any, None]:
    """The agent ``agent_id`` heartbeats while commits of unknown outcome are on it (in
    flight at a router crash, or unanswered): each is asked about, the core records the
    answer (:meth:`ZoneCore.confirmed`; an unanswered question is asked again at the next
    heartbeat), then each job is judged, journaled and forgotten if done, and the queue is
    woken. ``clock`` gives Unix seconds."""
    for job_id in core.to_confirm(agent_id):
        entry = core.entries.get(job_id)
        if entry is None:
            continue
        for p in list(entry.job.placements):
            if not core.is_unsure(p, agent_id):
                continue
            reply = yield AskSubjob(p)
            if isinstance(reply, Failure):
                core.reconfirm(agent_id, job_id)
                continue
            yield DoInstructions(tuple(core.confirmed(entry, p, reply, clock())))
        yield DoInstructions(tuple(core.evaluate(entry, clock())))
        yield DoInstructions((Journal((entry,)),))
        yield DoInstructions(tuple(core.forget_if_done(entry)))
    yield DoInstructions((Wake(Loop.QUEUE),))


# ==================================================================== moving a subjob


ReaddressStep = DoInstructions | RunInstructions | GatherLeases | CommitMembers


def readdress_steps(
    core: ZoneCore,
    agent_id: str,
    subjob_id: str,
    *,
    lease_ttl_seconds: float,
    clock: Callable[[], float],
) -> Generator[ReaddressStep, Any, bool]:
    """Airlock on ``agent_id`` asks to move ``subjob_id`` (its heartbeat names it): the core
    says whether (:meth:`ZoneCore.readdress`; its instructions come first, as
    :class:`DoInstructions`, so a driver can carry them out before the next heartbeat is
    read); a gather of one member, no commit on the probe, over every other agent; a lease
    found for a job that ended meanwhile is given back; the copy is journaled where the
    lease is (:meth:`ZoneCore.move_to`) and committed there with the count of earlier
    moves in its environment; the core is told the outcome (:meth:`ZoneCore.move_committed`:
    the old copy is retired once the copy runs, kept if the commit surely failed); the move
    is over (:meth:`ZoneCore.moved`) however the steps end, closed early included. Returns
    whether the copy was committed (False: no move, nothing found, or the commit failed;
    the agent asks again at its next heartbeat). ``clock`` gives Unix seconds."""
    entry, instructions = core.readdress(agent_id, subjob_id)
    if instructions:
        yield DoInstructions(tuple(instructions))
    if entry is None:
        return False
    job = entry.job
    old = next(p for p in entry.current() if p.subjob_id == subjob_id)
    try:
        priority = job.spec.priority or common_pb2.BATCH
        plan = TryPlan(1, priority, lease_ttl_seconds, commit_on_probe=False)
        gathered: Gathered = yield GatherLeases(entry, plan, exclude=frozenset({agent_id}))
        if gathered.chosen is None or job.state in TERMINAL_JOB_STATES:
            if gathered.chosen:
                yield RunInstructions((Release(tuple(gathered.chosen)),))
            log.info("re-addressing %s: no other host now (%s)", subjob_id, gathered.reasons[-1:])
            return False
        (lease,) = gathered.chosen
        (member,) = gathered.members
        placement, moves, instructions = core.move_to(entry, old, member)
        yield RunInstructions(tuple(instructions))
        answers: Sequence[Failure | None] = yield CommitMembers(
            entry, (placement,), (lease,), env={READDRESS_COUNT_ENV: str(moves)}
        )
        (failure,) = answers
        yield RunInstructions(tuple(core.move_committed(entry, old, placement, failure, clock())))
        return failure is None
    finally:
        core.moved(subjob_id)
