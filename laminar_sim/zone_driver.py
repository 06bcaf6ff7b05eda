"""What every simulated router writes to drive the zone core, written once.

The router's decisions and the order they are strung together in are
:mod:`laminar_zone.trying`'s (``place_try``, ``pass_steps``) and
:class:`laminar_zone.core.ZoneCore`'s. A simulator only answers the requests those
generators yield and carries out the core's instructions. Here is the glue that
``sim fgd`` (:mod:`laminar_sim.laminar`), ``sim load`` (:mod:`laminar_sim.load`) and
``sim replay`` (:mod:`laminar_sim.replay`) would otherwise each write:

* :func:`drive`: send each request's answer back into a generator until it returns;
* :class:`GatherBook`: one gather's :class:`~laminar_zone.gather.Gather` over a
  :class:`ProbePlan` and its books (with commit on probe the member journaled first,
  :class:`~laminar_zone.trying.CommitOnProbe`), a probe's reply read into offers and
  bounces, and the :class:`~laminar_zone.trying.Gathered` it comes to; a probe at its
  host is :func:`arbitrate_on` (the host's agent core arbitrates; a probe that carries
  the commit starts the member there);
* :func:`gather_at_once`: a :class:`~laminar_zone.trying.GatherLeases` answered at once
  (no network in between, :func:`settle`); ``sim load`` carries the same book's probes
  over its network model instead;
* :func:`commit_on`, :func:`commit_at_once`, :func:`start_on`: a Commit at its host (a
  lapsed lease refused), and every member's commit answered at once;
* :func:`submit`: a Submit (the core's record, admission, routing and kick);
* :func:`end_on`, :func:`report_end`, :func:`confirm_on`: a subjob's end as its agent
  reports it (slices, start, end, run time, exit code, GPU memory peak) and the core's
  reading of it; the ask about a commit of unknown outcome at the agent's heartbeat;
* :func:`recover_running`: a job running when the simulation starts, as the router's
  core reads it back from its journal;
* :func:`readdress_at_once`: Airlock's ask to move a subjob (an agent's heartbeat names
  it), answered at once as the router's ``AgentReports`` answers it;
* :class:`CoreHands`: the core's instructions carried out, the common ones here and the
  rest by the simulator's own hands.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from laminar_agent.core import AgentCore, EndDecision
from laminar_agent.ledger import Bounced, Granted, ProbeOrder
from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause
from laminar_base.demand import Demand
from laminar_zone.core import (
    Confirm,
    Count,
    Failure,
    Forget,
    Journal,
    Loop,
    Member,
    NewJob,
    Place,
    Publish,
    Terminate,
    TryPlan,
    Wake,
    ZoneCore,
)
from laminar_zone.core import Instruction as CoreInstruction
from laminar_zone.core import Release as CoreRelease
from laminar_zone.entry import Entry
from laminar_zone.gather import Bind, GiveUp, Instruction, ProbeHost, Release, Unsure
from laminar_zone.gather import Gather as GatherMachine
from laminar_zone.lifecycle import job_of
from laminar_zone.placement import Offer, ShapeCap
from laminar_zone.placements import apply_start_reply
from laminar_zone.trying import (
    AskSubjob,
    CommitMembers,
    CommitOnProbe,
    ConfirmStep,
    DoInstructions,
    Gathered,
    GatherLeases,
    ReaddressStep,
    RunInstructions,
    confirm_steps,
    readdress_steps,
)
from laminar_zone.view import ProbePlan


class CoreHost(Protocol):
    """A simulated agent as :class:`CoreDriver` drives it: its decision core over its
    ledger (``laminar_sim.laminar.SimHost``, ``laminar_sim.atomized.MigHost``)."""

    agent_id: str

    @property
    def core(self) -> AgentCore: ...

    def arbitrate(self, orders: list[ProbeOrder], now: float) -> list[Granted | Bounced]: ...

    def release(self, lease_id: str) -> None: ...

    def commit(self, lease_id: str, subjob_id: str, now: float) -> object: ...

    def shapes(self) -> dict[str, ShapeCap]: ...


Step = TypeVar("Step")
#: The simulator's host type (``SimHost``, ``MigHost``): the callbacks take what it passes.
H = TypeVar("H", bound=CoreHost)
Result = TypeVar("Result")

#: A host's reply to a probe or commit carried back to the router (its fresh summary).
NoteFn = Callable[["H"], None]
#: The agent commits ``lease_id`` to ``placement``'s subjob on ``slice_ids``: its reply.
StartFn = Callable[["H", str, zone_pb2.Placement, tuple[str, ...]], common_pb2.Subjob]


def drive(steps: Generator[Step, Any, Result], answer: Callable[[Step], Any]) -> Result:
    """Run ``steps`` to its end, answering each request with ``answer``; its result."""
    reply: Any = None
    while True:
        try:
            step = steps.send(reply)
        except StopIteration as done:
            result: Result = done.value
            return result
        reply = answer(step)


def running_report(
    subjob_id: str, slice_ids: Sequence[str], started_unix: float
) -> common_pb2.Subjob:
    """A live subjob as its agent answers for it (a commit's reply, a GetSubjob)."""
    return common_pb2.Subjob(
        spec=common_pb2.SubjobSpec(subjob_id=subjob_id, job_id=job_of(subjob_id)),
        state=common_pb2.RUNNING,
        reason="running",
        slice_ids=list(slice_ids),
        started_unix=started_unix,
    )


def start_on(
    host: CoreHost,
    lease_id: str,
    placement: zone_pb2.Placement,
    slice_ids: tuple[str, ...],
    now: float,
) -> common_pb2.Subjob:
    """The agent commits the lease to the placement's subjob: its reply (running)."""
    host.commit(lease_id, placement.subjob_id, now)
    return running_report(placement.subjob_id, slice_ids, now)


class GatherBook(Generic[H]):
    """One gather's machine and books, however its probes travel: the router's
    :class:`~laminar_zone.gather.Gather` over its probe plan and, with
    ``plan.commit_on_probe`` and one probe per attempt, the
    :class:`~laminar_zone.trying.CommitOnProbe` that journals a member before the probe
    that carries its commit; the leases granted (held until released or chosen), the slices
    they took and the subjobs probes started. :func:`gather_at_once` answers its probes at
    once; ``sim load`` carries them over its network model and reads each reply when it
    arrives."""

    def __init__(
        self,
        core: ZoneCore,
        entry: Entry,
        plan: TryPlan,
        probes: ProbePlan,
        *,
        now: float,
        budget_seconds: float,
    ) -> None:
        self.entry = entry
        self.plan = plan
        on_probe = plan.commit_on_probe and probes.limits.probes_per_attempt == 1
        self.machine = GatherMachine(
            probes,
            plan.gang_size,
            deadline=now + budget_seconds,
            budget_seconds=budget_seconds,
            commit_on_probe=on_probe,
        )
        self.book = CommitOnProbe(core, entry) if on_probe else None
        self.leases: dict[str, tuple[H, str]] = {}
        self.slices: dict[str, tuple[str, ...]] = {}
        self.started: list[common_pb2.Subjob] = []

    def intent(
        self, step: ProbeHost, host: H
    ) -> tuple[zone_pb2.Placement | None, list[CoreInstruction]]:
        """Before ``step`` goes to ``host``: the placement its commit starts, if it carries
        one, and the instructions that journal it."""
        if step.commit and self.book is not None:
            return self.book.intent(host.agent_id, host.agent_id)
        return None, []

    def orders(self, step: ProbeHost, probe_ids: Iterator[int]) -> list[ProbeOrder]:
        """The probes ``step`` carries to its host (one per member)."""
        return probe_orders(self.entry, self.plan, step.members, probe_ids)

    def read(
        self,
        host: H,
        placement: zone_pb2.Placement | None,
        replies: Sequence[Granted | Bounced],
        started: Sequence[common_pb2.Subjob],
    ) -> tuple[list[Offer], list[str]]:
        """A probe's reply read by the router (:func:`arbitrate_on`'s answer): the grants,
        as offers for the machine (a lease kept unless the probe committed it), and the
        bounce reasons (a bounce of the probe that carried the commit drops its intent)."""
        self.started += started
        grants: list[Offer] = []
        bounces: list[str] = []
        for reply in replies:
            if isinstance(reply, Granted):
                lease = reply.lease
                if placement is None:
                    self.leases[lease.lease_id] = (host, lease.lease_id)
                    self.slices[lease.lease_id] = tuple(a.slice_id for a in lease.allocations)
                grants.append(Offer(lease.lease_id, host.agent_id, lease.member, lease.score))
            else:
                if self.book is not None and placement is not None:
                    self.book.bounced(host.agent_id)
                bounces.append(reply.reason)
        return grants, bounces

    def released(self, offer: Offer) -> tuple[H, str]:
        """The lease of ``offer`` given back: its host and id (the caller releases it)."""
        return self.leases.pop(offer.lease_id)

    def answer(self, outcome: Bind | GiveUp | Unsure) -> Gathered:
        """The gather is over: what it came to, for the try."""
        return gathered_of(self.machine, self.book, outcome, self.leases, self.slices, self.started)


def arbitrate_on(
    host: H,
    orders: list[ProbeOrder],
    placement: zone_pb2.Placement | None,
    start: StartFn[H],
    now: float,
) -> tuple[list[Granted | Bounced], list[common_pb2.Subjob]]:
    """A probe at its host: the agent's core arbitrates its orders and, when the probe
    carries the commit of ``placement``, starts the member on the lease it grants. The
    replies and the subjobs started, as the probe's answer carries them back."""
    replies = host.arbitrate(orders, now)
    started = []
    if placement is not None:
        for reply in replies:
            if isinstance(reply, Granted):
                ids = tuple(a.slice_id for a in reply.lease.allocations)
                started.append(start(host, reply.lease.lease_id, placement, ids))
    return replies, started


def gather_at_once(
    core: ZoneCore,
    entry: Entry,
    plan: TryPlan,
    probes: ProbePlan,
    hosts: Mapping[str, H],
    *,
    now: float,
    budget_seconds: float,
    probe_ids: Iterator[int],
    note: NoteFn[H],
    start: StartFn[H],
    carry_out: Callable[[Sequence[CoreInstruction]], None],
    released: NoteFn[H] | None = None,
) -> Gathered:
    """The router's gather over ``hosts`` (its probe plan ``probes``: candidates, limits,
    ranking), each probe a batch of the try's members arbitrated by the host's core; with
    ``plan.commit_on_probe`` and one probe per attempt the probe carries the commit (the
    member journaled first, started on the host that grants it). ``carry_out``: the
    driver's hand for the core's instructions (the intent's journal); ``released``: called for
    each lease given back."""
    book: GatherBook[H] = GatherBook(
        core, entry, plan, probes, now=now, budget_seconds=budget_seconds
    )

    def probe(step: ProbeHost) -> tuple[list[Offer], list[str]]:
        host = hosts[step.record.agent_id]
        placement, instructions = book.intent(step, host)
        carry_out(instructions)
        replies, started = arbitrate_on(host, book.orders(step, probe_ids), placement, start, now)
        answer = book.read(host, placement, replies, started)
        note(host)
        return answer

    def release(offer: Offer) -> None:
        host, lease_id = book.released(offer)
        host.release(lease_id)
        if released is not None:
            released(host)
        note(host)

    return book.answer(settle(book.machine, probe, release, now))


def probe_orders(
    entry: Entry, plan: TryPlan, members: int, probe_ids: Iterator[int]
) -> list[ProbeOrder]:
    """The probes of one :class:`ProbeHost` for ``members`` of ``entry``'s try, as the
    router's Probe call carries them to the agent's arbitration."""
    job = entry.job
    return [
        ProbeOrder(
            f"{job.job_id}/{m}/{next(probe_ids)}",
            job.job_id,
            m,
            entry.need,
            plan.priority,
            job.spec.value,
            next(probe_ids),
            plan.lease_ttl_seconds,
        )
        for m in range(members)
    ]


def gathered_of(
    machine: GatherMachine,
    book: CommitOnProbe | None,
    outcome: Bind | GiveUp | Unsure,
    leases: dict[str, tuple[H, str]],
    slices: Mapping[str, tuple[str, ...]],
    started: Sequence[common_pb2.Subjob],
) -> Gathered:
    """What a gather came to, for the try: the chosen leases (taken out of ``leases``, the
    uncommitted ones held) and where they are, or the probe that carried the commit and the
    subjob it ``started``; the machine's counts and reasons."""
    chosen = None
    members: tuple[Member, ...] = ()
    if isinstance(outcome, Bind) and not outcome.committed:
        chosen = tuple(leases.pop(o.lease_id) for o in outcome.offers)
        members = tuple(Member(o.agent_id, o.agent_id, slices[o.lease_id]) for o in outcome.offers)
    reply = started[-1] if started else None
    return Gathered(
        chosen=chosen,
        members=members,
        reasons=tuple(machine.reasons),
        probes=machine.probes,
        bounces=machine.bounces,
        pending=book.pending if book is not None else None,
        committed=reply,
        slice_ids=tuple(reply.slice_ids) if reply is not None else (),
        unsure=outcome.reason if isinstance(outcome, Unsure) else "",
        counted_probes=book.probes if book is not None else 0,
    )


def commit_on(
    host: H,
    lease_id: str,
    placement: zone_pb2.Placement,
    start: StartFn[H],
    now: float,
) -> common_pb2.Subjob | Failure:
    """A Commit at its host: a lease gone or lapsed is refused (the router may gather
    again); else the agent starts the placement's subjob on it (``start``): its reply."""
    lease = host.core.ledger.lease(lease_id)
    if lease is None or (not lease.committed and lease.expires_at <= now):
        return Failure("lease expired before the commit", unknown=False)
    return start(host, lease_id, placement, tuple(placement.slice_ids))


def commit_at_once(
    placements: Sequence[zone_pb2.Placement],
    leases: Sequence[tuple[H, str]],
    start: StartFn[H],
    now: float,
) -> list[Failure | None]:
    """Every member's Commit, taken by its agent's core (:func:`commit_on`; no call is
    lost here); each reply recorded into its placement."""
    answers: list[Failure | None] = []
    for placement, (host, lease_id) in zip(placements, leases, strict=True):
        reply = commit_on(host, lease_id, placement, start, now)
        if isinstance(reply, Failure):
            answers.append(reply)
        else:
            apply_start_reply(placement, reply)
            answers.append(None)
    return answers


def settle(
    machine: GatherMachine,
    probe: Callable[[ProbeHost], tuple[list[Offer], list[str]]],
    release: Callable[[Offer], None],
    now: float,
) -> Bind | GiveUp | Unsure:
    """Drive one gather where a probe is answered at once (no network in between).

    ``probe`` answers one :class:`ProbeHost` with the leases granted and bounce reasons;
    ``release`` gives one lease back. The caller commits what :class:`Bind` names.
    """
    todo = machine.start(now)
    while True:
        answers: list[Instruction] = []
        for step in todo:
            if isinstance(step, Release):
                for offer in step.offers:
                    release(offer)
            elif isinstance(step, ProbeHost):
                grants, bounces = probe(step)
                answers += machine.answered(step.record.agent_id, step.round, grants, bounces, now)
        if machine.outcome is not None and not answers:
            return machine.outcome
        todo = answers


# ==================================================================== a job's life


def submit(
    core: ZoneCore,
    spec: zone_pb2.JobSpec,
    need: Demand,
    job: NewJob,
    now: float,
    carry_out: Callable[[Sequence[CoreInstruction]], None],
) -> Entry:
    """A Submit at a simulated router: its core makes the job's record (InvalidArgument
    if no host of the zone could ever hold it), admits it, routes it and kicks it (a
    placement try, or the queue behind its family's blocked head)."""
    (entry,) = core.new_entries(spec, need, job, now, now)
    core.admit(entry)
    carry_out(core.route(entry, False, now))
    carry_out(core.kick(entry, False))
    return entry


def end_on(
    host: CoreHost,
    subjob_id: str,
    decision: EndDecision,
    now: float,
    *,
    started_unix: float,
    exit_code: int,
    peak_gpu_memory_bytes: int = 0,
) -> common_pb2.Subjob | None:
    """The agent's core ends the subjob, if it still runs (None: it ended already), and
    the end as the agent's heartbeat reports it: the slices it held, when it started
    (``started_unix``: its launch, which the simulator's executor knows) and ended, its
    run time, its exit code and its GPU memory peak (the larger of ``peak_gpu_memory_bytes``
    and what the core's polls saw), as ``laminar_agent.subjob_reads`` builds it."""
    live = host.core.subjob(subjob_id)
    if live is None:
        return None
    host.core.end(subjob_id, decision, now)
    return common_pb2.Subjob(
        spec=common_pb2.SubjobSpec(subjob_id=subjob_id, job_id=job_of(subjob_id)),
        agent_id=host.agent_id,
        slice_ids=list(live.slice_ids),
        state=decision.state,  # the state's name, as the agent's journal holds it
        reason=decision.reason,
        end_cause=decision.cause.wire,
        exit_code=exit_code,
        started_unix=started_unix,
        ended_unix=now,
        run_seconds=now - started_unix,
        peak_gpu_memory_bytes=max(peak_gpu_memory_bytes, live.peak_gpu_memory_bytes),
    )


def report_end(
    core: ZoneCore,
    agent_id: str,
    event: common_pb2.Subjob,
    now: float,
    carry_out: Callable[[Sequence[CoreInstruction]], None],
) -> Entry | None:
    """The router's core reads an agent's report of a subjob's end: it judges the member
    and the job, which leaves memory if it is done. The job it touched, if any."""
    touched, _, instructions = core.report(agent_id, event, None, now)
    carry_out(instructions)
    if touched is not None:
        carry_out(core.evaluate(touched, now))
        carry_out(core.forget_if_done(touched))
    return touched


def confirm_on(
    core: ZoneCore,
    host: CoreHost,
    started_unix: Mapping[str, float],
    now: float,
    carry_out: Callable[[Sequence[CoreInstruction]], None],
) -> None:
    """The agent's heartbeat after a commit of unknown outcome: the router's
    :func:`~laminar_zone.trying.confirm_steps`, each GetSubjob answered by ``host`` (the
    subjob as the agent runs it, launched at ``started_unix[subjob_id]``, or None: never
    started), as the daemon's ``laminar_zone.reports`` answers it over gRPC."""

    def answer(step: ConfirmStep) -> common_pb2.Subjob | None:
        match step:
            case AskSubjob(p):
                live = host.core.subjob(p.subjob_id)
                if live is None:
                    return None
                return running_report(p.subjob_id, live.slice_ids, started_unix[p.subjob_id])
            case DoInstructions(instructions):
                carry_out(instructions)
        return None

    drive(confirm_steps(core, host.agent_id, clock=lambda: now), answer)


def recover_running(
    core: ZoneCore,
    spec: zone_pb2.JobSpec,
    need: Demand,
    job: NewJob,
    placement: zone_pb2.Placement,
    now: float,
    carry_out: Callable[[Sequence[CoreInstruction]], None],
) -> Entry:
    """A job that runs at ``now`` as one member, ``placement`` (committed on its agent
    already), read back by the router's core as from its journal after a restart
    (:meth:`~laminar_zone.core.ZoneCore.recovered`): a cluster that is already busy when
    the simulation starts. Its end, retries and moves are the core's from then on."""
    (entry,) = core.new_entries(spec, need, job, now, now)
    entry.job.state = zone_pb2.JOB_RUNNING
    entry.job.started_unix = now
    entry.job.placements.append(placement)
    carry_out(core.recovered(entry, False, now))
    return entry


def readdress_at_once(
    core: ZoneCore,
    agent_id: str,
    subjob_id: str,
    *,
    gather: Callable[[Entry, TryPlan, set[str]], Gathered],
    lease_ttl_seconds: float,
    start: StartFn[H],
    now: float,
    carry_out: Callable[[Sequence[CoreInstruction]], None],
) -> bool:
    """Airlock on ``agent_id`` asks to move ``subjob_id`` (its heartbeat names it): the
    router's :func:`~laminar_zone.trying.readdress_steps`, answered at once as the daemon's
    ``laminar_zone.reports.AgentReports`` answers them over gRPC: the gather of one member
    over every other host by ``gather(entry, plan, exclude)`` (the router's
    ``Placer.gather`` with ``exclude``), the copy's Commit by its host's agent core
    (:func:`commit_at_once`, ``start``), the core's instructions by ``carry_out`` (a lease
    given back included: its hands must release). Whether the copy runs; False: the core
    would not move it, or no other host took it (the agent asks again at its next
    heartbeat)."""

    def answer(step: ReaddressStep) -> Any:
        match step:
            case GatherLeases(entry, plan, exclude):
                return gather(entry, plan, set(exclude))
            case CommitMembers(_, placements, leases):
                return commit_at_once(placements, leases, start, now)
            case RunInstructions(instructions) | DoInstructions(instructions):
                carry_out(instructions)
        return None

    steps = readdress_steps(
        core, agent_id, subjob_id, lease_ttl_seconds=lease_ttl_seconds, clock=lambda: now
    )
    return drive(steps, answer)


# ==================================================================== the core's hands

#: A placement try of the entry now (``from_queue``): what ``Place`` asks.
PlaceFn = Callable[[Entry, bool], object]
#: The agent is asked to stop the placement's subjob (``why``, ``cause``).
TerminateFn = Callable[[zone_pb2.Placement, str, EndCause], None]


class CoreHands:
    """What every simulated router does with its core's instructions, written once:
    ``Place`` a try, ``Terminate`` a stop, ``Release`` each lease, a ``Wake`` of the loops
    in ``wakes``, ``Confirm`` an ask at the agent's next heartbeat: each by the
    simulator's own hand (one it was not given is an error: the instruction cannot occur
    there); ``Journal`` has no journal but lets a job written as ended leave memory, as the
    router's save does once no subjob of it lives; watchers, metrics, the market and
    other wakes are not simulated. ``who`` names the simulator in that error."""

    def __init__(
        self,
        core: ZoneCore,
        who: str,
        *,
        place: PlaceFn,
        wake: Callable[[], None],
        wakes: frozenset[Loop] = frozenset({Loop.QUEUE}),
        terminate: TerminateFn | None = None,
        release: Callable[[Any, str], None] | None = None,
        confirm: Callable[[str], object] | None = None,
    ) -> None:
        self.core = core
        self.who = who
        self.place = place
        self.wake = wake
        self.wakes = wakes
        self.terminate = terminate
        self.release = release
        self.confirm = confirm

    def carry_out(self, instructions: Sequence[CoreInstruction]) -> None:
        for instruction in instructions:
            match instruction:
                case Place(entry, from_queue):
                    self.place(entry, from_queue)
                case Terminate(placement, why, cause) if self.terminate is not None:
                    self.terminate(placement, why, cause)
                case CoreRelease(leases) if self.release is not None:
                    for host, lease_id in leases:
                        self.release(host, lease_id)
                case Wake(loop) if loop in self.wakes:
                    self.wake()
                case Confirm(agent_id, _) if self.confirm is not None:
                    self.confirm(agent_id)
                case Journal(entries):
                    for entry in entries:
                        self.carry_out(self.core.forget_if_done(entry))
                case Publish() | Count() | Forget() | Wake():
                    pass
                case _:
                    raise AssertionError(f"not carried out by {self.who}: {instruction!r}")
