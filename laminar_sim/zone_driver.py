"""What every simulated router writes to drive the zone core, written once.

The router's decisions and the order they are strung together in are
:mod:`laminar_zone.trying`'s (``place_try``, ``pass_steps``) and
:class:`laminar_zone.core.ZoneCore`'s. A simulator only answers the requests those
generators yield. Here is the glue that ``sim fgd`` (:mod:`laminar_sim.laminar`) and
``sim replay`` (:mod:`laminar_sim.replay`) would otherwise both write, answering at once
(no network in between):

* :func:`drive`: send each request's answer back into a generator until it returns;
* :func:`gather_at_once`: a :class:`~laminar_zone.trying.GatherLeases` answered with the
  router's own :class:`~laminar_zone.gather.Gather` over a :class:`ProbePlan`, each probe
  arbitrated by the host's agent core (:func:`settle`), and with commit on probe the
  member journaled first (:class:`~laminar_zone.trying.CommitOnProbe`) and started by the
  probe that carries the commit;
* :func:`commit_at_once`: a :class:`~laminar_zone.trying.CommitMembers` answered by each
  host's ``AgentCore.commit``, each reply recorded into its placement;
* :func:`start_on`: an agent commits a lease to a placement's subjob, and its reply.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from laminar_agent.core import AgentCore
from laminar_agent.ledger import Bounced, Granted, ProbeOrder
from laminar_api.v1 import common_pb2, zone_pb2
from laminar_zone.core import Failure, Member, TryPlan, ZoneCore
from laminar_zone.core import Instruction as CoreInstruction
from laminar_zone.entry import Entry
from laminar_zone.gather import Bind, GiveUp, Instruction, ProbeHost, Release, Unsure
from laminar_zone.gather import Gather as GatherMachine
from laminar_zone.lifecycle import job_of
from laminar_zone.placement import Offer, ShapeCap
from laminar_zone.placements import apply_start_reply
from laminar_zone.trying import CommitOnProbe, Gathered
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


def start_on(
    host: CoreHost,
    lease_id: str,
    placement: zone_pb2.Placement,
    slice_ids: tuple[str, ...],
    now: float,
) -> common_pb2.Subjob:
    """The agent commits the lease to the placement's subjob: its reply (running)."""
    host.commit(lease_id, placement.subjob_id, now)
    return common_pb2.Subjob(
        spec=common_pb2.SubjobSpec(
            subjob_id=placement.subjob_id, job_id=job_of(placement.subjob_id)
        ),
        state=common_pb2.RUNNING,
        reason="running",
        slice_ids=list(slice_ids),
        started_unix=now,
    )


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
    on_probe = plan.commit_on_probe and probes.limits.probes_per_attempt == 1
    machine = GatherMachine(
        probes,
        plan.gang_size,
        deadline=now + budget_seconds,
        budget_seconds=budget_seconds,
        commit_on_probe=on_probe,
    )
    book = CommitOnProbe(core, entry) if on_probe else None
    leases: dict[str, tuple[H, str]] = {}
    slices: dict[str, tuple[str, ...]] = {}
    started: list[common_pb2.Subjob] = []

    def probe(step: ProbeHost) -> tuple[list[Offer], list[str]]:
        host = hosts[step.record.agent_id]
        placement = None
        if step.commit and book is not None:
            placement, instructions = book.intent(host.agent_id, host.agent_id)
            carry_out(instructions)
        orders = probe_orders(entry, plan, step.members, probe_ids)
        grants: list[Offer] = []
        bounces: list[str] = []
        for reply in host.arbitrate(orders, now):
            if isinstance(reply, Granted):
                lease = reply.lease
                ids = tuple(a.slice_id for a in lease.allocations)
                if placement is not None:
                    started.append(start(host, lease.lease_id, placement, ids))
                else:
                    leases[lease.lease_id] = (host, lease.lease_id)
                    slices[lease.lease_id] = ids
                grants.append(Offer(lease.lease_id, host.agent_id, lease.member, lease.score))
            else:
                if book is not None and placement is not None:
                    book.bounced(host.agent_id)
                bounces.append(reply.reason)
        note(host)
        return grants, bounces

    def release(offer: Offer) -> None:
        host, lease_id = leases.pop(offer.lease_id)
        host.release(lease_id)
        if released is not None:
            released(host)
        note(host)

    outcome = settle(machine, probe, release, now)
    return gathered_of(machine, book, outcome, leases, slices, started)


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


def commit_at_once(
    placements: Sequence[zone_pb2.Placement],
    leases: Sequence[tuple[H, str]],
    start: StartFn[H],
) -> list[Failure | None]:
    """Every member's Commit, taken by its agent's core (no call is lost here); each reply
    recorded into its placement."""
    for placement, (host, lease_id) in zip(placements, leases, strict=True):
        apply_start_reply(placement, start(host, lease_id, placement, tuple(placement.slice_ids)))
    return [None] * len(placements)


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
