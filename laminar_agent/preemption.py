"""Which subjobs to reclaim so that a higher-priority probe fits: the Airlock ladder on the ledger.

A pure function (no I/O, time passed in). The agent calls it when a probe that
allows preemption bounced. It presents the ledger to ``laminar_airlock.policy.plan_room``
as one snapshot per candidate slice: *used* is what is committed or leased there
(bytes and milli), each subjob holding an allocation there is a view whose
observed bytes and milli are that allocation, so the room it plans is capacity the
ledger can lease. Two choices follow from that:

* Victims are **reclaimed**, never suspended: a suspended subjob keeps its slice in
  the ledger, so suspending frees no capacity a lease could use (views say
  ``free_mode="none"`` and ``suspended=False`` even for suspended subjobs, which
  are thus as good victims as running ones of their class).
* Uncommitted leases and subjobs already being terminated are not victims; their
  capacity still counts as used, so the plan may come out impossible for now.

Among slices where room can be made, the cheapest are chosen: no victim at all,
then the least important victim class touched, then fewest victims, then least
work lost, then slice id. A gang of N whole GPUs takes the N cheapest slices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from laminar_agent.ledger import Ledger, Slice
from laminar_airlock.levels import Level
from laminar_airlock.policy import (
    Action,
    PolicyConfig,
    SliceSignal,
    Snapshot,
    SubjobView,
    plan_room,
)
from laminar_base.demand import Demand


@dataclass(frozen=True)
class HolderFacts:
    """What the plan needs to know about a live subjob holding ledger capacity."""

    job_id: str
    priority: int
    lifecycle: int
    started_at: float
    is_terminating: bool = False
    #: Seconds it spent in suspensions that ended, and when the one under way began (0:
    #: none): :func:`work_seconds`.
    stopped_seconds: float = 0.0
    stopped_since_unix: float = 0.0


def work_seconds(
    started_unix: float, stopped_seconds: float, stopped_since_unix: float, now_unix: float
) -> float:
    """The work a restart of a subjob would lose (the agent knows no checkpoint): its run
    time less the time it spent suspended, by Airlock or an operator (it does no work while
    stopped), so it does not grow while it is stopped. 0 before it started."""
    if not started_unix:
        return 0.0
    stopped = stopped_seconds
    if stopped_since_unix:
        stopped += max(0.0, now_unix - stopped_since_unix)
    return max(0.0, now_unix - started_unix - stopped)


@dataclass(frozen=True)
class SliceRoom:
    slice: Slice
    needed_bytes: int
    needed_milli: int
    actions: tuple[Action, ...]


@dataclass(frozen=True)
class PreemptionPlan:
    rooms: tuple[SliceRoom, ...]

    @property
    def victims(self) -> list[str]:
        """Distinct victim subjob ids, in the order first chosen."""
        seen: dict[str, None] = {}
        for room in self.rooms:
            for action in room.actions:
                seen.setdefault(action.subjob_id, None)
        return list(seen)

    @property
    def slice_ids(self) -> list[str]:
        return [room.slice.slice_id for room in self.rooms]


def _views_on(
    ledger: Ledger, slice_id: str, holders: Mapping[str, HolderFacts], now: float
) -> list[SubjobView]:
    views: list[SubjobView] = []
    for lease in ledger.leases():
        if not lease.committed or not lease.subjob_id:
            continue
        facts = holders.get(lease.subjob_id)
        if facts is None or facts.is_terminating:
            continue
        for a in lease.allocations:
            if a.slice_id != slice_id:
                continue
            views.append(
                SubjobView(
                    subjob_id=lease.subjob_id,
                    job_id=facts.job_id,
                    slice_ids=(slice_id,),
                    priority=facts.priority,
                    lifecycle=facts.lifecycle,
                    declared_bytes=a.memory_bytes,
                    observed_bytes=a.memory_bytes,
                    started_at=facts.started_at,
                    work_since_checkpoint_seconds=work_seconds(
                        facts.started_at, facts.stopped_seconds, facts.stopped_since_unix, now
                    ),
                    suspended=False,
                    suspended_since=None,
                    readdress_count=0,
                    free_mode="none",
                    restartable=False,
                    milli=a.milli,
                )
            )
    return views


def plan_preemption(
    ledger: Ledger,
    demand: Demand,
    for_priority: int,
    holders: Mapping[str, HolderFacts],
    now: float,
    *,
    slice_id: str = "",
    owner: str = "",
) -> PreemptionPlan | None:
    """Slices (and their victims) that would let ``demand`` fit; None if no plan exists.

    ``holders`` maps live subjob ids to their facts; ``now`` is wall-clock time (for
    work lost since start).
    """
    wanted = demand.gpus if demand.gpus > 0 else 1
    rooms: list[tuple[tuple[bool, int, int, float, str], SliceRoom]] = []
    config = PolicyConfig()
    for s in ledger.shape_candidates(demand, slice_id, owner):
        committed_milli, leased_milli, committed_bytes, leased_bytes = ledger.usage(s.slice_id)
        signal = SliceSignal(
            s.slice_id,
            committed_bytes + leased_bytes,
            s.memory_total_bytes,
            Level.NORMAL,
            used_milli=committed_milli + leased_milli,
            total_milli=s.capacity_milli,
        )
        views = _views_on(ledger, s.slice_id, holders, now)
        snapshot = Snapshot(now=now, slices=(signal,), subjobs=tuple(views))
        needed_bytes, needed_milli = Ledger.room_needed(demand, s)
        actions = plan_room(
            snapshot, s.slice_id, needed_bytes, for_priority, config, needed_milli=needed_milli
        )
        if actions is None:
            continue
        by_id = {v.subjob_id: v for v in views}
        chosen = [by_id[a.subjob_id] for a in actions]
        cost = (
            bool(chosen),
            -min((v.priority for v in chosen), default=99),
            len(chosen),
            sum(v.work_since_checkpoint_seconds for v in chosen),
            s.slice_id,
        )
        rooms.append((cost, SliceRoom(s, needed_bytes, needed_milli, tuple(actions))))
    if len(rooms) < wanted:
        return None
    rooms.sort(key=lambda pair: pair[0])
    plan = PreemptionPlan(tuple(room for _, room in rooms[:wanted]))
    # Victims are chosen for GPU room; the plan stands only if what they give back of the
    # host's CPU and memory, with what is free, covers the demand's host share too.
    victims = set(plan.victims)
    freed_cpu = freed_memory = 0
    for lease in ledger.leases():
        if lease.committed and lease.subjob_id in victims:
            freed_cpu += lease.cpu_milli
            freed_memory += lease.host_memory_bytes
    host = ledger.host_free()
    cpu, memory = ledger.host_need(demand)
    if cpu > host.cpu_free_milli + freed_cpu or memory > host.memory_free_bytes + freed_memory:
        return None
    return plan
