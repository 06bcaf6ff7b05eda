"""One placement try as an I/O-free state machine: probe rounds, late binding, gangs.

The router's :class:`~laminar_zone.placer.Placer` and every simulator drive this one
machine; none of them strings probes, replies and lease choice together on its own.
Events come in as method calls (:meth:`Gather.start`, :meth:`Gather.answered`,
:meth:`Gather.failed`, :meth:`Gather.timed_out`), each with the driver's clock;
instructions come out as plain values:

* :class:`ProbeHost` -- ask this host for ``members`` leases (one round's probes go out
  together; the round closes when every host answered, failed or the driver's timer
  fired);
* :class:`Release` -- give these leases back (late answers, losers of late binding,
  everything when the try gives up);
* :class:`Bind` -- commit these leases, one per gang member, in member order (or, with
  ``committed``, they are committed already: a probe that carried the commit);
* :class:`GiveUp` -- no lease for every member within the probing budget, with reasons;
* :class:`Unsure` -- a probe that carried the commit got no answer: the job may run on
  that host, and must not be placed elsewhere before the driver has confirmed it.

**Commit on probe** (``commit_on_probe``, one member only): each round probes the one best
candidate with "commit if it fits", so a placement costs one call instead of a probe and
a commit (and the release of a loser). There is nothing to compare, so it is for d = 1:
a grant is the placement (``Bind(committed=True)``), a bounce moves on to the next
candidate. Such a probe is never released and never timed out by the machine: its
outcome is known only from its answer, so the driver reports a call that may have
reached the agent with ``failed(..., may_have_run=True)``.

A try ends with exactly one :class:`Bind` or :class:`GiveUp`; after that every answer
that still arrives is released. Which hosts a round probes comes from
:class:`~laminar_zone.view.ProbePlan`; which leases win from
:func:`~laminar_zone.view.choose_offers`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from laminar_base.demand import Demand
from laminar_zone.placement import Offer, members_fitting
from laminar_zone.view import AgentRecord, choose_offers


@dataclass(frozen=True)
class ProbeHost:
    """Probe ``record`` for ``members`` gang members in round ``round``; with ``commit``,
    the probe carries "commit if it fits" (one member)."""

    record: AgentRecord
    members: int
    round: int
    commit: bool = False


@dataclass(frozen=True)
class Release:
    """Give these leases back (their agents free the capacity at once)."""

    offers: tuple[Offer, ...]


@dataclass(frozen=True)
class Bind:
    """Commit these leases: one per gang member, in member order; ``committed``: the probe
    carried the commit, and they run already."""

    offers: tuple[Offer, ...]
    committed: bool = False


@dataclass(frozen=True)
class GiveUp:
    """No lease for every member; ``reasons`` say why, host by host."""

    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Unsure:
    """A probe carrying the commit got no answer from ``agent_id``: the member may run
    there. The try ends; the driver confirms with the agent before placing it again."""

    agent_id: str
    reason: str


Instruction = ProbeHost | Release | Bind | GiveUp | Unsure


class Plan(Protocol):
    """Which hosts each round probes (:class:`~laminar_zone.view.ProbePlan`, or fixed)."""

    need: Demand
    reason: str

    def next_batch(self) -> list[AgentRecord]: ...


@dataclass
class FixedPlan:
    """One round over hosts the caller already knows fit (a simulator with exact state)."""

    records: list[AgentRecord]
    need: Demand
    reason: str = ""

    def next_batch(self) -> list[AgentRecord]:
        batch, self.records = self.records, []
        return batch


def members_to_ask(need: Demand, gang: int) -> Callable[[AgentRecord], int]:
    """Ask a host for as many members as its summary says it can hold (at least one)."""

    def members(record: AgentRecord) -> int:
        return max(1, min(gang, members_fitting(need, record.shapes)))

    return members


@dataclass
class Gather:
    """One placement try of one job attempt (all gang members)."""

    plan: Plan
    gang: int = 1
    #: Driver-clock time after which no new round starts (``inf``: rounds only).
    deadline: float = math.inf
    #: How long the budget was, for the reason given when it is spent.
    budget_seconds: float = 0.0
    #: How many members to ask each host for; default: what its summary holds.
    members: Callable[[AgentRecord], int] | None = None
    #: Each round probes one host with "commit if it fits" (one member only; see above).
    commit_on_probe: bool = False
    probes: int = 0
    bounces: int = 0
    rounds: int = 0
    reasons: list[str] = field(default_factory=list)
    offers: dict[str, Offer] = field(default_factory=dict)
    outcome: Bind | GiveUp | Unsure | None = None
    _waiting: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.commit_on_probe and self.gang > 1:
            raise ValueError("commit on probe places one member; a gang commits all or none")

    @property
    def is_done(self) -> bool:
        return self.outcome is not None

    def start(self, now: float) -> list[Instruction]:
        """The first round (or the try's end, when no host looks suitable)."""
        return self._next_round(now)

    def answered(
        self,
        agent_id: str,
        round_: int,
        grants: Sequence[Offer],
        bounces: Sequence[str],
        now: float,
    ) -> list[Instruction]:
        """A host answered its probes: leases granted and bounce reasons."""
        if self.is_done or round_ != self.rounds or agent_id not in self._waiting:
            return [Release(tuple(grants))] if grants else []
        self.probes += len(grants) + len(bounces)
        if self.commit_on_probe and grants:
            self._waiting.clear()
            self.outcome = Bind((grants[0],), committed=True)
            return [self.outcome]
        for grant in grants:
            self.offers[grant.lease_id] = grant
        self.bounces += len(bounces)
        self.reasons.extend(f"{agent_id}: {why}" for why in bounces)
        return self._one_less(agent_id, now)

    def failed(
        self, agent_id: str, round_: int, reason: str, now: float, *, may_have_run: bool = False
    ) -> list[Instruction]:
        """A probe call failed (unreachable, timed out): the host counts as answered.
        ``may_have_run``: the call may have reached the agent; for a probe carrying the
        commit that ends the try with :class:`Unsure`."""
        if self.is_done or round_ != self.rounds or agent_id not in self._waiting:
            return []
        self.reasons.append(f"{agent_id}: {reason}")
        if self.commit_on_probe and may_have_run:
            self._waiting.clear()
            self.outcome = Unsure(agent_id, reason)
            return [self.outcome]
        return self._one_less(agent_id, now)

    def timed_out(self, round_: int, now: float) -> list[Instruction]:
        """The driver's timer for ``round_`` fired: close it with what has arrived. Not for
        probes carrying the commit (their driver waits for the answer or the call's end)."""
        if self.is_done or round_ != self.rounds or not self._waiting or self.commit_on_probe:
            return []
        self._waiting.clear()
        return self._close_round(now)

    def _one_less(self, agent_id: str, now: float) -> list[Instruction]:
        self._waiting.discard(agent_id)
        if self._waiting:
            return []
        return self._close_round(now)

    def _close_round(self, now: float) -> list[Instruction]:
        picked = choose_offers(list(self.offers.values()), max(1, self.gang))
        if picked is None:
            return self._next_round(now)
        keep = {o.lease_id for o in picked}
        losers = tuple(o for k, o in self.offers.items() if k not in keep)
        self.offers.clear()
        self.outcome = Bind(tuple(picked))
        steps: list[Instruction] = [Release(losers)] if losers else []
        return [*steps, self.outcome]

    def _next_round(self, now: float) -> list[Instruction]:
        if now >= self.deadline:
            self.reasons.append(f"probe budget of {self.budget_seconds:g} s spent")
            return self._give_up()
        batch = self.plan.next_batch()
        if not batch:
            if self.plan.reason:
                self.reasons.append(self.plan.reason)
            return self._give_up()
        self.rounds += 1
        if self.commit_on_probe:
            self._waiting = {batch[0].agent_id}
            return [ProbeHost(batch[0], 1, self.rounds, commit=True)]
        self._waiting = {r.agent_id for r in batch}
        members = self.members or members_to_ask(self.plan.need, max(1, self.gang))
        return [ProbeHost(r, members(r), self.rounds) for r in batch]

    def _give_up(self) -> list[Instruction]:
        held = tuple(self.offers.values())
        self.offers.clear()
        self.outcome = GiveUp(tuple(self.reasons))
        steps: list[Instruction] = [Release(held)] if held else []
        return [*steps, self.outcome]
