"""Leases a tenant keeps through ``ProbeJob(keep_leases)`` until ``CommitJob`` names them.

Pure bookkeeping (no I/O, the clock passed in): which leases are kept, for which tenant,
resources and gang size, until when. A lease is forgotten at its expiry in O(expired),
whatever the number kept, and is taken at most once.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from laminar_base.errors import InvalidArgument, PermissionDenied


@dataclass(frozen=True)
class KeptLease:
    """A lease a tenant holds through ProbeJob(keep_leases), until it commits or expires."""

    tenant: str
    resources: bytes
    gang_size: int
    expires_mono: float


class KeptLeases:
    def __init__(self) -> None:
        self._leases: dict[str, KeptLease] = {}
        #: (expiry, lease id) of every kept lease, soonest first; an id already taken is
        #: skipped when it comes up.
        self._expiries: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._leases)

    def keep(self, lease_id: str, lease: KeptLease) -> None:
        self._leases[lease_id] = lease
        heapq.heappush(self._expiries, (lease.expires_mono, lease_id))

    def sweep(self, now: float) -> None:
        """Forget the leases past their expiry at ``now``."""
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            _, lease_id = heapq.heappop(expiries)
            kept = self._leases.get(lease_id)
            if kept is not None and kept.expires_mono <= now:
                del self._leases[lease_id]
        if len(expiries) > 2 * len(self._leases) + 64:  # mostly taken ids: rebuild
            self._expiries = [(k.expires_mono, i) for i, k in self._leases.items()]
            heapq.heapify(self._expiries)

    @property
    def bookkeeping(self) -> int:
        """Entries held for expiry (bounded by twice the leases kept, plus a constant)."""
        return len(self._expiries)

    def check(
        self, lease_ids: Sequence[str], tenant: str, resources: bytes, gang_size: int, now: float
    ) -> None:
        """Refuse, naming ``leases[i]`` or ``spec.resources``, unless every lease is kept
        for ``tenant`` and was probed for these resources and gang size."""
        self.sweep(now)
        for i, lease_id in enumerate(lease_ids):
            kept = self._leases.get(lease_id)
            if kept is None or kept.tenant != tenant:
                # Unknown, expired, or probed for another tenant: the same answer for all
                # three, so a guess learns nothing.
                raise PermissionDenied(
                    f"lease {lease_id!r} was not probed for tenant {tenant!r} "
                    "or has expired; probe again",
                    field=f"leases[{i}]",
                )
            if kept.resources != resources or kept.gang_size != gang_size:
                raise InvalidArgument(
                    "must ask for the resources and gang size the leases were probed for",
                    field="spec.resources",
                )

    def take(self, lease_ids: Sequence[str]) -> None:
        """The leases are being committed: none of them can be named again."""
        for lease_id in lease_ids:
            self._leases.pop(lease_id, None)
