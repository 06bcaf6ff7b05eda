"""Pure queue policy: order, fair share, quotas, backfill and the waiting explanation.

The durable queue lives in the journal; this module only decides. Order is
priority class first, then the tenant's fair-share ratio (GPU-equivalents it
runs now divided by its share weight), then submission time. A job may run
ahead of a blocked job of the same family only when its declared run time
ends before the blocked job's expected start (EASY backfill), so the blocked
job is never delayed by it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple, TypeVar

from laminar_base.demand import Demand
from laminar_zone.config import Quota


@dataclass(frozen=True)
class QueueItem:
    job_id: str
    priority: int
    tenant: str
    submitted_unix: float
    need: Demand
    gang_size: int
    expected_seconds: float

    @property
    def units(self) -> float:
        return self.need.gpu_units * max(1, self.gang_size)


def order_key(
    item: QueueItem, usage: Mapping[str, float], shares: Mapping[str, float]
) -> tuple[int, float, float, str]:
    share = shares.get(item.tenant, 1.0)
    return (item.priority, usage.get(item.tenant, 0.0) / share, item.submitted_unix, item.job_id)


def quota_block(
    item: QueueItem,
    quota: Quota | None,
    running_units: float,
    running_memory_bytes: int,
) -> str:
    """Why ``item`` must wait for its tenant's quota now ('' = it may run)."""
    if quota is None:
        return ""
    members = max(1, item.gang_size)
    if quota.max_gpus and running_units + item.units > quota.max_gpus + 1e-9:
        return (
            f"waiting for quota: tenant {item.tenant} runs {running_units:g} of "
            f"{quota.max_gpus:g} GPUs and this job needs {item.units:g}"
        )
    memory = item.need.memory_bytes * members
    if quota.max_gpu_memory_bytes and running_memory_bytes + memory > quota.max_gpu_memory_bytes:
        return (
            f"waiting for quota: tenant {item.tenant} holds {_gib(running_memory_bytes)} of "
            f"{_gib(quota.max_gpu_memory_bytes)} GPU memory and this job declares {_gib(memory)}"
        )
    return ""


def quota_never_fits(item: QueueItem, quota: Quota | None) -> str:
    """A job larger than its tenant's whole quota can never run: refuse it at admission."""
    if quota is None:
        return ""
    if quota.max_gpus and item.units > quota.max_gpus + 1e-9:
        return (
            f"job needs {item.units:g} GPUs but tenant {item.tenant}'s quota is "
            f"{quota.max_gpus:g} (queue.tenant_quotas)"
        )
    memory = item.need.memory_bytes * max(1, item.gang_size)
    if quota.max_gpu_memory_bytes and memory > quota.max_gpu_memory_bytes:
        return (
            f"job declares {_gib(memory)} of GPU memory but tenant {item.tenant}'s quota is "
            f"{_gib(quota.max_gpu_memory_bytes)} (queue.tenant_quotas)"
        )
    return ""


def may_backfill(item: QueueItem, now: float, head_expected_start: float | None) -> bool:
    """EASY backfill: run ahead only if the job surely ends before the blocked head starts."""
    if head_expected_start is None or item.expected_seconds <= 0:
        return False
    return now + item.expected_seconds <= head_expected_start


@dataclass(frozen=True)
class Head:
    """A family's blocked head: the first job of that family in order that could not start."""

    job_id: str
    expected_start: float | None


@dataclass(frozen=True)
class Waiting:
    """Where a job that did not start stands in its family's line."""

    position: int
    expected_start: float | None
    #: The family's blocked head ahead of it ("" when it is the head, or blocks nobody).
    blocked_by: str
    is_head: bool


@dataclass
class QueueWalk:
    """One pass over waiting jobs in :func:`order_key` order, shared by router and simulators.

    The caller walks its jobs in order and, for each, asks :meth:`may_try`; a job that
    may try and does not start (or may not try) is reported to :meth:`waits`. Per family,
    the first job that waits becomes the family's blocked head; every later job of that
    family may try only as an EASY backfill (:func:`may_backfill`), so the head is never
    delayed. A job the zone could never hold (``never``) blocks nobody.
    """

    now: float
    backfill: bool = True
    heads: dict[str, Head] = field(default_factory=dict)
    _units_ahead: dict[str, float] = field(default_factory=dict)
    _positions: dict[str, int] = field(default_factory=dict)

    def may_try(self, item: QueueItem, *, never: bool = False) -> bool:
        if never:
            return False
        head = self.heads.get(item.need.family)
        if head is None:
            return True
        return self.backfill and may_backfill(item, self.now, head.expected_start)

    def waits(
        self,
        item: QueueItem,
        estimate: Callable[[float], float | None],
        *,
        never: bool = False,
        estimate_all: bool = True,
    ) -> Waiting:
        """``item`` did not start; ``estimate(units_ahead)`` is its expected start.

        The estimate is asked for the head always, for the others only with
        ``estimate_all`` (a router explains every waiting job; a simulator need not).
        """
        family = item.need.family
        position = self._positions.get(family, 0) + 1
        self._positions[family] = position
        head = self.heads.get(family)
        if never:
            return Waiting(position, None, head.job_id if head else "", False)
        ahead = self._units_ahead.get(family, 0.0)
        self._units_ahead[family] = ahead + item.units
        start = estimate(ahead) if head is None or estimate_all else None
        if head is None:
            self.heads[family] = Head(item.job_id, start)
            return Waiting(position, start, "", True)
        return Waiting(position, start, head.job_id, False)


T = TypeVar("T")


def walk_queue(
    walk: QueueWalk,
    jobs: Sequence[T],
    item_of: Callable[[T], QueueItem],
    start: Callable[[T], bool],
    estimate: Callable[[T, float], float | None],
) -> list[T]:
    """A whole pass where a start is answered at once (a simulator); the jobs left waiting.

    ``jobs`` are in queue order; ``start(job)`` tries to place one and says whether it
    started; ``estimate(job, units_ahead)`` is a blocked head's expected start. The router
    walks the same :class:`QueueWalk` step by step, awaiting each placement.
    """
    kept: list[T] = []
    for job in jobs:
        item = item_of(job)
        if walk.may_try(item) and start(job):
            continue
        kept.append(job)
        walk.waits(item, partial(estimate, job), estimate_all=False)
    return kept


class Why(NamedTuple):
    """Why a queued job waits: a stable token (``laminar_zone.reasons.Reason`` by name,
    lower case) and one line a user can act on."""

    token: str
    text: str


def why_waiting(
    need: Demand,
    *,
    gang_size: int,
    hosts_ready: int,
    hosts_matching: int,
    hosts_fitting: int,
    position: int,
    expected_start: float | None,
    now: float,
    blocked_by: str = "",
    members_total: int | None = None,
) -> Why:
    """What is missing, how many hosts match, when it may start."""
    what = need.label()
    if gang_size > 1:
        what = f"{gang_size} x {what}"
    if hosts_ready == 0:
        token, first = "no_matching_host", "no ready host in this zone"
    elif hosts_matching == 0:
        token = "no_matching_host"
        first = f"no host has a {need.label()} at all (0 of {hosts_ready} hosts match)"
    elif members_total is not None and members_total < gang_size:
        token = "too_large"
        first = (
            f"the ready hosts hold at most {members_total} x {need.label()} even when idle; "
            f"it waits for more hosts"
        )
    elif blocked_by:
        token = "priority"
        first = f"behind blocked job {blocked_by} of the same kind (no backfill: it would delay it)"
    elif hosts_fitting == 0:
        token, first = "resources", f"no host with a free {what}"
    else:
        token, first = "resources", f"capacity for {what} is contended (probes bounced)"
    parts = [first]
    if hosts_ready and hosts_matching:
        parts.append(f"{hosts_matching} of {hosts_ready} hosts match")
    parts.append(f"queue position {position}")
    if expected_start is None:
        parts.append("expected start unknown (running work declares no expected run time)")
    else:
        parts.append(f"expected start in about {math.ceil(max(0.0, expected_start - now))} s")
    return Why(token, "; ".join(parts))


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f}GiB"
