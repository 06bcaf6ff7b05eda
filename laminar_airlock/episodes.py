"""What Airlock remembers of each subjob between polls, kept one way for agent and simulator.

:func:`laminar_airlock.policy.decide` is stateless: each poll it sees a
:class:`~laminar_airlock.policy.Snapshot`. What a snapshot says of a subjob's past comes from
here: since when Airlock has held it suspended, since when it was asked to release memory
in the current pressure episode (asked once per episode), and whether it was handed to
the zone router for re-addressing. The agent's :class:`AirlockDriver` and ``sim airlock``
both keep this bookkeeping with :class:`Episodes` and change it only through its methods:
:meth:`Episodes.poll` before a decision, :meth:`Episodes.applied` after an action was
carried out, :meth:`Episodes.forget` when the subjob (or this copy of it) is gone.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from laminar_airlock.policy import (
    STEP_READDRESS,
    STEP_RECLAIM,
    STEP_RELEASE_MEMORY,
    STEP_RESUME,
    STEP_SUSPEND,
    Action,
)


@dataclass(frozen=True)
class Memory:
    """The past of one subjob, as the snapshot's :class:`SubjobView` carries it."""

    suspended_since: float | None
    release_requested_since: float | None
    readdress_requested: bool


@dataclass
class Episodes:
    """Per-subjob Airlock bookkeeping; times are the driver's monotonic clock."""

    #: Subjob -> when Airlock suspended it (it counts towards the re-address/reclaim age).
    suspended_since: dict[str, float] = field(default_factory=dict)
    #: Subjob -> when it was asked to release memory in the current pressure episode.
    release_sent: dict[str, float] = field(default_factory=dict)
    #: Subjob -> when it was handed to the zone router for re-addressing.
    readdress_pending: dict[str, float] = field(default_factory=dict)

    def prune(self, live: Container[str]) -> None:
        """Forget subjobs that are no longer live."""
        for table in (self.suspended_since, self.release_sent, self.readdress_pending):
            for subjob_id in [s for s in table if s not in live]:
                del table[subjob_id]

    def poll(self, subjob_id: str, *, suspended: bool, calm: bool, now: float) -> Memory:
        """One live subjob at one poll, before the decision.

        ``suspended``: Airlock stopped it and it is stopped now (one someone else stopped
        is not Airlock's to wait on: pass False; a suspension found without a time counts
        from now: the agent :meth:`recall` s the time of one an earlier run of it began).
        ``calm``: every slice it holds is at
        the normal level, so its pressure episode is over and it may be asked to release
        memory again in the next one.
        """
        if not suspended:
            self.suspended_since.pop(subjob_id, None)
        elif subjob_id not in self.suspended_since:
            self.suspended_since[subjob_id] = now
        if calm:
            self.release_sent.pop(subjob_id, None)
        return self.memory(subjob_id)

    def recall(
        self, subjob_id: str, suspended_since: float, readdressed_since: float | None = None
    ) -> None:
        """A suspension that began before this bookkeeping did (the agent restarted while
        the subjob was stopped): it counts from ``suspended_since``, not from the first
        poll that finds it, so an upgrade does not reset its age towards re-addressing
        or reclaim; ``readdressed_since``: it was handed to the zone router then (the hand-off
        goes on: it is neither resumed in place nor handed over a second time)."""
        self.suspended_since[subjob_id] = suspended_since
        if readdressed_since is not None:
            self.readdress_pending[subjob_id] = readdressed_since

    def memory(self, subjob_id: str) -> Memory:
        return Memory(
            self.suspended_since.get(subjob_id),
            self.release_sent.get(subjob_id),
            subjob_id in self.readdress_pending,
        )

    def applied(self, action: Action, now: float) -> None:
        """``action`` was carried out at ``now``."""
        subjob_id = action.subjob_id
        if action.step == STEP_SUSPEND:
            self.suspended_since[subjob_id] = now
        elif action.step == STEP_RESUME:
            self.suspended_since.pop(subjob_id, None)
        elif action.step == STEP_RELEASE_MEMORY:
            self.release_sent[subjob_id] = now
        elif action.step == STEP_READDRESS:
            self.readdress_pending[subjob_id] = now
        elif action.step == STEP_RECLAIM:
            self.forget(subjob_id)

    def forget(self, subjob_id: str) -> None:
        """The subjob ended, or this copy of it did (a re-addressed copy starts afresh)."""
        self.suspended_since.pop(subjob_id, None)
        self.release_sent.pop(subjob_id, None)
        self.readdress_pending.pop(subjob_id, None)
