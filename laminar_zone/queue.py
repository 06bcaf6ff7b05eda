"""Pure queue policy: order, fair share, quotas, backfill and the waiting explanation.

The durable queue lives in the journal; this module only decides. Order is
priority class first, then the tenant's fair-share ratio (GPU-equivalents it
runs now divided by its share weight), then submission time. A job may run
ahead of a blocked job of the same family only when its declared run time
ends before the blocked job's expected start (EASY backfill), so the blocked
job is never delayed by it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Generic, NamedTuple, TypeVar

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
    #: Requeued after a memory kill with its peak as its need: while it waits it keeps a
    #: claim on the slices that fit it (:attr:`QueueWalk.claims`).
    is_restarted: bool = False

    # Cached: every queue pass reads them per running job (usage, release curves).
    @cached_property
    def units(self) -> float:
        return self.need.gpu_units * max(1, self.gang_size)

    @cached_property
    def memory_bytes(self) -> int:
        """The GPU memory the whole job declares (every member's), as quotas count it."""
        return self.need.memory_bytes * max(1, self.gang_size)


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
    if quota.max_gpus and running_units + item.units > quota.max_gpus + 1e-9:
        return (
            f"waiting for quota: tenant {item.tenant} runs {running_units:g} of "
            f"{quota.max_gpus:g} GPUs and this job needs {item.units:g}"
        )
    memory = item.memory_bytes
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
    #: Claims of waiting restarted jobs (``QueueItem.is_restarted``), head of their family or
    #: not: (GPU memory per member, expected start). A piece on a slice with that much
    #: memory does not keep it past that start (:func:`laminar_zone.market.class_windows`).
    claims: list[tuple[int, float]] = field(default_factory=list)
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
        claims = item.is_restarted and item.need.gpu_memory_bytes > 0
        start = estimate(ahead) if head is None or estimate_all or claims else None
        if claims and start is not None:
            self.claims.append((item.need.gpu_memory_bytes, start))
        if head is None:
            self.heads[family] = Head(item.job_id, start)
            return Waiting(position, start, "", True)
        return Waiting(position, start, head.job_id, False)


T = TypeVar("T")


class Admit(enum.Enum):
    """How a waiting rigid job enters a pass (:func:`class_order`'s ``admit``)."""

    #: It is walked: it may start, else it waits in its family's line.
    WALK = "walk"
    #: It is walked but the zone could never hold it: it waits and blocks nobody.
    NEVER = "never"
    #: It is not in this pass (a dependency, an array limit, a quota, the market's job).
    SKIP = "skip"


@dataclass(frozen=True)
class Start(Generic[T]):
    """Instruction: try to start rigid ``job`` now; answer True if it started."""

    job: T


@dataclass(frozen=True)
class Clear:
    """Instruction: the clearing round of class ``priority`` (None: every class at once) over
    the windows no higher class took, each cut at ``heads``: the family's blocked rigid head
    of this class or a higher one (EASY backfill), family -> expected start. No answer.

    ``jobs`` None: every waiting job of the class not awarded a window earlier in the pass,
    and the class's pieces whose window ends (their held slices offered). A set: a part of
    the class's round, only those waiting jobs (ahead of the class's next rigid job in queue
    order), on the free windows; held slices wait for the class's full round."""

    priority: int | None
    heads: Mapping[str, float | None]
    jobs: frozenset[str] | None = None
    #: The claims of restarted rigid jobs of this class or a higher one waiting
    #: (:attr:`QueueWalk.claims`): no piece keeps a slice that fits one past its start.
    claims: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Bidding:
    """An atomized job waiting in a pass's market (its ``QueueItem.job_id`` and class). In
    :func:`class_order`'s ``jobs`` too, in queue order, it bids ahead of the rigid jobs of
    its class that follow it there."""

    job_id: str
    priority: int
    #: The job's work left at its profile's median speed (``market.work_left_seconds``);
    #: 0 = unknown. It bids ahead of a rigid job met after it only if this is at most that
    #: job's declared run time (``class_order``'s ``shorter_first``, the default).
    work_seconds: float = 0.0


def bids_ahead(bidding: Bidding, item: QueueItem) -> bool:
    """Whether a waiting atomized job met in the walk bids before rigid ``item`` behind it:
    when its work left is at most the rigid job's declared run time (shorter work first,
    as ``srpt`` ranks the market's bids), or either is unknown (0: queue order)."""
    if bidding.work_seconds <= 0 or item.expected_seconds <= 0:
        return True
    return bidding.work_seconds <= item.expected_seconds


def class_order(
    walk: QueueWalk,
    jobs: Sequence[T],
    item_of: Callable[[T], QueueItem],
    estimate: Callable[[T, float], float | None],
    market: Iterable[int | Bidding] = (),
    *,
    admit: Callable[[T], Admit] | None = None,
    waited: Callable[[T, Waiting], None] | None = None,
    estimate_all: bool = False,
    interleave: bool = True,
    shorter_first: bool = True,
) -> Generator[Start[T] | Clear, bool | None, list[T]]:
    """One pass over all waiting work in one class order: the router's and the simulators'.

    Per priority class, highest first (the lowest number), the queue walk of that class's
    rigid ``jobs`` (:class:`QueueWalk`: a family's first job that waits becomes its blocked
    head; later ones of that family, of this class or a lower one, only backfill), then,
    if ``market`` (the classes with atomized work: waiting jobs or pieces whose window
    ends) holds the class, its clearing round. So a lower class's rigid job never takes a
    slice before a higher class's atomized bid has had its round, and an atomized bid
    never takes a window past the expected start of a blocked head of its class or higher.

    Within a class, one queue order (:func:`order_key`: fair share, then submission) for
    rigid and atomized work: a waiting atomized job given as a :class:`Bidding` and met in
    ``jobs`` (which the walk skips: ``admit`` says SKIP, or the caller gives none) bids
    before the next rigid job of its class is walked, in a part of the class's round
    (``Clear.jobs``) on the windows free then; the class's full round (those that won
    nothing, the biddings not in ``jobs``, the pieces whose window ends) follows its rigid
    walk. A class given as a bare number clears after its walk only. With ``shorter_first``
    (the default) a bidding met in the walk bids before a rigid job behind it only if its
    work is no longer (:func:`bids_ahead`); a longer one waits for the next rigid job of its
    class it is no longer than, or the class's full round: so a gang shorter than the
    single-GPU jobs submitted before it is walked ahead of them, as ``srpt`` orders the
    market's own bids (docs/benchmarks.md, "2026-11-28"). False: queue order alone.

    A generator of instructions: :class:`Start` (send back whether the job started) and
    :class:`Clear` (send back None); it returns the rigid jobs left waiting. A simulator
    answers at once (:func:`drive`); the router awaits each answer (a placement, a round).
    ``jobs`` are in :func:`order_key` order. ``admit(job)`` says whether and how a job is
    walked (None: every job is); ``waited(job, waiting)`` hears where each job that did not
    start stands; ``estimate_all`` asks an expected start for every waiting job, not only
    the heads. ``interleave=False`` is the former order: every rigid job first, then one
    round for all classes (``Clear(None)``).
    """
    work = list(market)
    bidding = {w.job_id: w for w in work if isinstance(w, Bidding)}
    classes = sorted({w.priority if isinstance(w, Bidding) else w for w in work})
    kept: list[T] = []
    ahead: list[Bidding] = []  # biddings met in the walk that have not bid yet
    for job in jobs:
        item = item_of(job)
        while interleave and classes and classes[0] < item.priority:
            ahead.clear()  # the class's full round has them
            yield Clear(classes.pop(0), _heads(walk), claims=tuple(walk.claims))
        how = admit(job) if admit is not None else Admit.WALK
        if how is Admit.SKIP or item.job_id in bidding:
            if item.job_id in bidding:
                ahead.append(bidding[item.job_id])
            continue
        if interleave and ahead:
            first = [b for b in ahead if not shorter_first or bids_ahead(b, item)]
            if first:
                ids = frozenset(b.job_id for b in first)
                yield Clear(item.priority, _heads(walk), ids, tuple(walk.claims))
                ahead = [b for b in ahead if b.job_id not in ids]
        never = how is Admit.NEVER
        if walk.may_try(item, never=never) and (yield Start(job)):
            continue
        kept.append(job)
        wait = walk.waits(item, partial(estimate, job), never=never, estimate_all=estimate_all)
        if waited is not None:
            waited(job, wait)
    if not interleave and classes:
        yield Clear(None, _heads(walk), claims=tuple(walk.claims))
    elif interleave:
        for priority in classes:
            yield Clear(priority, _heads(walk), claims=tuple(walk.claims))
    return kept


def _heads(walk: QueueWalk) -> dict[str, float | None]:
    return {family: head.expected_start for family, head in walk.heads.items()}


def drive(
    steps: Generator[Start[T] | Clear, bool | None, list[T]],
    start: Callable[[T], bool],
    clear: Callable[[Clear], None],
) -> list[T]:
    """Carry out :func:`class_order`'s instructions at once (a simulator): ``start(job)``
    tries to place a rigid job, ``clear(instruction)`` runs a clearing round. Returns the
    rigid jobs left waiting."""
    answer: bool | None = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        if isinstance(step, Start):
            answer = start(step.job)
        else:
            clear(step)
            answer = None


def walk_queue(
    walk: QueueWalk,
    jobs: Sequence[T],
    item_of: Callable[[T], QueueItem],
    start: Callable[[T], bool],
    estimate: Callable[[T, float], float | None],
) -> list[T]:
    """A pass over rigid work only (no market), started at once (a simulator); the jobs
    left waiting. ``jobs`` are in queue order; ``start(job)`` tries to place one and says
    whether it started; ``estimate(job, units_ahead)`` is a blocked head's expected start."""
    return drive(class_order(walk, jobs, item_of, estimate), start, lambda _: None)


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
