"""The router's soft-state view of its zone, built only from heartbeats and probe replies.

Agents are authoritative; this view only steers probes. It keeps the ready agents
in pools by shape key and by levels of free capacity of that shape, free host CPU
and free host memory (each a lower bound of what a fitting demand needs), so that
drawing candidates costs O(k) plus the pools of the demand's shape, never a scan of
the zone, and a draw late in a fill does not spend its tries on hosts that are full.
Each pool is also kept in a fixed host order, so a draw can take the fitting hosts
first in that order, which is how FGD's ties are broken and why it packs. The periodic
staleness sweep is O(agents) but runs off the hot path, once per period.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from laminar_base.demand import Demand, HostCap
from laminar_base.fragmentation import FragmentationCache, ObservedWorkload, demand_pod
from laminar_zone.free_index import FreeIndex
from laminar_zone.placement import (
    CPU_ONLY_CAPACITY,
    Offer,
    ShapeCap,
    assign_gang,
    best_offers,
    fragmentation_rank,
    members_fitting,
)


class AgentStatus(enum.Enum):
    READY = "ready"
    STALE = "stale"
    DRAINING = "draining"


@dataclass
class AgentRecord:
    agent_id: str
    address: str
    hostname: str = ""
    shapes: dict[str, ShapeCap] = field(default_factory=dict)
    heat: int = 0
    draining: bool = False
    running_subjobs: int = 0
    total_gpus: int = 0
    pressure: int = 0
    last_heartbeat: float = 0.0  # monotonic
    last_heartbeat_unix: float = 0.0
    is_stale: bool = False
    generation: int = 0
    #: mTLS: the certificate name its first heartbeat came with ("" without TLS).
    identity: str = ""
    #: The agent's version of the summary this record holds (0: none that deltas refresh).
    summary_version: int = 0
    #: Host CPU, memory and per-GPU free share from a probe reply's summary, and the
    #: heartbeat time it was current at (see :attr:`host`).
    reported_host: HostCap | None = None
    reported_host_at: float = 0.0
    #: Silence allowed before the sweep marks it stale, when longer than the view's own
    #: limit: an agent on the Heartbeats stream sends only every liveness period, and its
    #: stream ending marks it stale at once (:meth:`ZoneView.mark_stale`). 0: the view's.
    silence_allowed_seconds: float = 0.0

    @property
    def status(self) -> AgentStatus:
        if self.is_stale:
            return AgentStatus.STALE
        if self.draining:
            return AgentStatus.DRAINING
        return AgentStatus.READY

    @property
    def is_ready(self) -> bool:
        return not self.is_stale and not self.draining

    @property
    def host(self) -> HostCap | None:
        """The host's CPU, memory and per-GPU free share, or None when unknown: never
        reported, or not by the summary of the latest heartbeat (a full heartbeat or a
        probe reply records it; a delta heartbeat vouches that it has not changed), so an
        outdated "no CPU left" never keeps a host out of every sample."""
        if self.reported_host is None or self.reported_host_at != self.last_heartbeat:
            return None
        return self.reported_host


class _IndexedSet:
    """A set with O(1) add, remove and uniform random pick, also kept sorted by each key's
    place in the view's fixed host order (:meth:`ZoneView.first_in_order`): adding or
    removing is O(log n) to find and a memory move of at most the pool's size."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.pos: dict[str, int] = {}
        self.ordered: list[tuple[int, str]] = []

    def add(self, key: str, order: int) -> None:
        if key not in self.pos:
            self.pos[key] = len(self.items)
            self.items.append(key)
            bisect.insort(self.ordered, (order, key))

    def discard(self, key: str, order: int) -> None:
        index = self.pos.pop(key, None)
        if index is None:
            return
        last = self.items.pop()
        if index < len(self.items):
            self.items[index] = last
            self.pos[last] = index
        at = bisect.bisect_left(self.ordered, (order, key))
        del self.ordered[at]

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class Update:
    record: AgentRecord
    is_new: bool
    came_back: bool
    freed: bool  # some shape's free count went up


@dataclass(frozen=True)
class HostCounts:
    ready: int  # ready hosts
    matching: int  # hosts that could ever hold one member
    fitting: int  # hosts whose summary shows room for one member now
    members_total: int  # members the whole zone could hold if it were empty


#: Demands :meth:`ZoneView.counts` keeps answers for (all dropped when full).
COUNTS_KEPT = 1024

#: Candidates one probe round is chosen from by default: enough for ranking to find a
#: host that strands little, few enough that scoring them costs well under a probe's RPC.
SAMPLE_SIZE = 16


def host_order(agent_id: str, salt: int = 0) -> int:
    """An agent's place in a router's fixed host order: a hash of its id (and the router's
    ``salt``), so the order is the same at every draw, random-like over hosts, and needs no
    coordination between routers."""
    digest = hashlib.blake2b(f"{salt}:{agent_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class ZoneView:
    def __init__(self, stale_after_seconds: float, *, order_salt: int = 0) -> None:
        """``order_salt`` picks the fixed host order :meth:`first_in_order` walks
        (:func:`host_order`); any value gives a random-like order."""
        self.stale_after_seconds = stale_after_seconds
        self.order_salt = order_salt
        self._order: dict[str, int] = {}
        #: Agents probed since their last summary reached this view: their summary may be
        #: about to change, so the ordered draw passes them over (see :meth:`note_probing`).
        self._probing: set[str] = set()
        #: GPUs of the largest host ever heard from (0: none yet): a job asking more per
        #: member than that could never start here.
        self.largest_gpus = 0
        self.agents: dict[str, AgentRecord] = {}
        #: Ready agents by pool: (shape, level of that shape's free capacity, level of
        #: free host CPU, level of free host memory), "" the shape of every ready agent
        #: (CPU-only demands); see :func:`_levels`. Only pools a demand could fit are drawn
        #: from, so a sample late in a fill does not spend its tries on full hosts.
        self._by_shape: dict[str, dict[tuple[int, int, int], _IndexedSet]] = {}
        self._pools_of: dict[str, list[tuple[str, tuple[int, int, int]]]] = {}
        #: Each agent's readiness and shapes as last indexed, and a version bumped whenever
        #: one of them changes: :meth:`counts` depends on nothing else, so it is kept per
        #: demand until the version moves (a reply that repeats a summary moves nothing).
        self._counted_of: dict[str, tuple[bool, dict[str, ShapeCap]]] = {}
        self._counts_version = 0
        self._counts: dict[Demand, tuple[int, HostCounts]] = {}
        #: Ready agents, kept as readiness changes (:meth:`counts`' ``ready`` without a scan).
        self._ready_count = 0
        #: A version bumped only when an agent's readiness or its shapes' totals change:
        #: what a demand could ever fit (``matching``, ``members_total``) depends on nothing
        #: else, so it is kept per demand across the free-capacity changes of every
        #: placement, which move :attr:`_counts_version`.
        self._totals_version = 0
        self._ever: dict[Demand, tuple[int, int, int]] = {}
        #: Ready agents' free capacity grouped by what a demand's member count reads, kept
        #: as readiness and shapes change: :meth:`free_for` and :meth:`counts`' "fits now"
        #: for a demand never asked before are a few bisections, not a walk over hosts.
        self._free = FreeIndex()

    # -------------------------------------------------------------- updates

    def update(
        self,
        agent_id: str,
        address: str,
        shapes: dict[str, ShapeCap],
        *,
        heat: int,
        draining: bool,
        now: float,
        now_unix: float = 0.0,
        hostname: str = "",
        running_subjobs: int = 0,
        total_gpus: int = 0,
        pressure: int = 0,
        generation: int = 0,
        is_heartbeat: bool = True,
        host: HostCap | None = None,
    ) -> Update:
        """Fold an agent's summary into the view. ``host``: the summary's host figures, as
        :meth:`note_host` records them, in the same reindex (one per summary, not two: a
        probe reply's summary is folded in on every placement)."""
        self._probing.discard(agent_id)
        record = self.agents.get(agent_id)
        is_new = record is None
        if record is None:
            record = AgentRecord(agent_id=agent_id, address=address)
            self.agents[agent_id] = record
        came_back = not is_new and record.is_stale and is_heartbeat
        freed = any(
            cap.free > record.shapes.get(shape, ShapeCap(0, 0)).free
            or cap.max_free_milli > record.shapes.get(shape, ShapeCap(0, 0)).max_free_milli
            for shape, cap in shapes.items()
        )
        if address:
            record.address = address
        record.shapes = shapes
        record.heat = heat
        record.draining = draining
        record.pressure = pressure
        record.running_subjobs = running_subjobs
        if hostname:
            record.hostname = hostname
        if total_gpus:
            record.total_gpus = total_gpus
            self.largest_gpus = max(self.largest_gpus, total_gpus)
        if generation:
            record.generation = generation
        if is_heartbeat:
            record.last_heartbeat = now
            record.last_heartbeat_unix = now_unix
            record.is_stale = False
        else:
            # A probe's reply changed what this view holds: it is no longer the summary of
            # the agent's last heartbeat, so the next delta is refused and the summary sent
            # (a lease taken and released in between leaves the agent's summary unchanged).
            record.summary_version = 0
        if host is not None:
            _record_host(record, host)
        self._reindex(record)
        return Update(record, is_new, came_back, freed or came_back or is_new)

    def refresh(
        self, agent_id: str, summary_version: int, identity: str, now: float, now_unix: float
    ) -> bool:
        """A delta heartbeat: the agent's summary is the one this view holds, so only its
        liveness moves, in O(1) (nothing to reindex: a ready agent stays ready). False,
        changing nothing, when the view cannot vouch for that summary (unknown or stale
        agent, another version or none, another certificate): the agent must send it."""
        record = self.agents.get(agent_id)
        if (
            record is None
            or record.is_stale
            or not summary_version
            or record.summary_version != summary_version
            or record.identity != identity
        ):
            return False
        self._probing.discard(agent_id)  # a probe that got no reply is over by now
        if record.reported_host_at == record.last_heartbeat:
            record.reported_host_at = now  # the same summary: its host figures still hold
        record.last_heartbeat = now
        record.last_heartbeat_unix = now_unix
        return True

    def note_host(self, agent_id: str, host: HostCap) -> None:
        """The host CPU, memory and per-GPU free share of an agent's latest summary (what
        :meth:`sample` filters on and ranking reads); unknown agents are ignored."""
        record = self.agents.get(agent_id)
        if record is not None:
            _record_host(record, host)
            self._reindex(record)

    def set_draining(self, agent_id: str, draining: bool) -> AgentRecord:
        record = self.agents[agent_id]
        record.draining = draining
        record.summary_version = 0  # changed here, not by a heartbeat: ask for the summary
        self._reindex(record)
        return record

    def mark_stale(self, agent_id: str) -> AgentRecord | None:
        """Mark an agent stale now (its heartbeat stream ended); the record when it was not
        stale before, None otherwise. Its last heartbeat stays as it was: the time it is
        declared lost after is still counted from there."""
        record = self.agents.get(agent_id)
        if record is None or record.is_stale:
            return None
        record.is_stale = True
        self._reindex(record)
        return record

    def sweep(self, now: float) -> list[AgentRecord]:
        """Mark agents silent for too long as stale; returns the ones that just became stale."""
        newly = []
        limit = self.stale_after_seconds
        for record in self.agents.values():
            if record.is_stale:
                continue
            if now - record.last_heartbeat > max(limit, record.silence_allowed_seconds):
                record.is_stale = True
                self._reindex(record)
                newly.append(record)
        return newly

    def add_placeholder(self, agent_id: str, address: str, now: float) -> AgentRecord:
        """An agent known only from the journal (router restart): stale until it heartbeats."""
        record = self.agents.get(agent_id)
        if record is None:
            record = AgentRecord(agent_id=agent_id, address=address, last_heartbeat=now)
            record.is_stale = True
            self.agents[agent_id] = record
        return record

    def _reindex(self, record: AgentRecord) -> None:
        """Move the agent to the pools its summary puts it in now: O(its shapes)."""
        agent_id = record.agent_id
        counted = self._counted_of.get(agent_id)
        if counted is None or counted[0] != record.is_ready or counted[1] != record.shapes:
            was_ready = counted is not None and counted[0]
            if was_ready != record.is_ready:
                self._ready_count += 1 if record.is_ready else -1
            if was_ready != record.is_ready or (
                record.is_ready
                and counted is not None
                and not _same_totals(counted[1], record.shapes)
            ):
                self._totals_version += 1
            if was_ready:
                assert counted is not None
                self._free.remove(agent_id, counted[1])
            shapes = dict(record.shapes)
            if record.is_ready:
                self._free.add(agent_id, shapes)
            self._counted_of[agent_id] = (record.is_ready, shapes)
            self._counts_version += 1
        order = self.order_of(agent_id)
        for shape, levels in self._pools_of.pop(agent_id, ()):
            by_level = self._by_shape[shape]
            by_level[levels].discard(agent_id, order)
            if not by_level[levels]:
                del by_level[levels]  # so a draw never walks pools left empty
        if not record.is_ready:
            return
        host_levels = _host_levels(record.host)
        where = [("", (0, *host_levels))]
        for shape, cap in record.shapes.items():
            if cap.free > 0 or cap.max_free_milli > 0:
                where.append((shape, (_shape_level(shape, cap), *host_levels)))
        for shape, levels in where:
            self._by_shape.setdefault(shape, {}).setdefault(levels, _IndexedSet()).add(
                agent_id, order
            )
        self._pools_of[agent_id] = where

    # -------------------------------------------------------------- queries

    def sample(
        self, need: Demand, k: int, rng: random.Random, *, exclude: set[str] | None = None
    ) -> list[AgentRecord]:
        """Up to k ready agents whose summary fits ``need`` (GPU shape, host CPU and
        memory), drawn at random in O(k) expected.

        Draws stop after a bounded number of tries, so a zone where almost
        nothing fits costs a few dozen lookups, not a scan.
        """
        pools = self._pools(need)
        sizes = [len(p) for p in pools]
        total = sum(sizes)
        if total == 0 or k <= 0:
            return []
        chosen: dict[str, AgentRecord] = {}
        tries = 0
        max_tries = 8 * k + 16
        while len(chosen) < k and tries < max_tries:
            tries += 1
            point = rng.randrange(total)
            for pool, size in zip(pools, sizes, strict=True):
                if point < size:
                    agent_id = pool.items[point]
                    break
                point -= size
            if agent_id in chosen or (exclude and agent_id in exclude):
                if len(chosen) + len(exclude or ()) >= total:
                    break
                continue
            record = self.agents[agent_id]
            if _summary_fits(record, need):
                chosen[agent_id] = record
        return list(chosen.values())

    def order_of(self, agent_id: str) -> int:
        """The agent's place in this view's fixed host order (:func:`host_order`)."""
        order = self._order.get(agent_id)
        if order is None:
            order = self._order[agent_id] = host_order(agent_id, self.order_salt)
        return order

    def note_probing(self, agent_id: str) -> None:
        """A probe went to the agent: until a summary from it (a reply or a heartbeat)
        arrives, :meth:`first_in_order` passes it over, so placements in flight at once do
        not all go to the first host in the order and bounce off what the first took."""
        self._probing.add(agent_id)

    def first_in_order(
        self, need: Demand, k: int, *, exclude: set[str] | None = None
    ) -> list[AgentRecord]:
        """Up to k ready agents whose summary fits ``need``, the first in the view's fixed host
        order (:func:`host_order`), in that order, passing over agents with a probe in
        flight (:meth:`note_probing`).

        Why: a centralized FGD breaks its many equal scores by one fixed node order, so it
        fills hosts one after another and keeps the rest whole; a uniform sample finds
        those partly filled hosts only by chance. Walking the fitting pools merged by that
        order finds them in O(k + pools) expected, never a scan of the zone: the walk stops
        after a bounded number of agents, as :meth:`sample` does."""
        if k <= 0:
            return []
        return self._walk_in_order([self._pools(need)], need, k, exclude)

    def tightest_in_order(
        self, need: Demand, k: int, *, exclude: set[str] | None = None
    ) -> list[AgentRecord]:
        """Up to k ready agents whose summary fits ``need``, those with the fewest free
        whole GPUs first (the index's level of the GPU shape), each level in the view's
        fixed host order, passing over agents with a probe in flight; none unless ``need``
        asks for whole GPUs (not a share, a MIG profile or no GPU: for shares it was
        measured worse, :data:`TIGHT_SIZE`).

        Why: the host FGD's score likes best for a task of whole GPUs is often one the
        task fills exactly, and such hosts are scattered through the host order, past the
        first fitting ones (:meth:`first_in_order`) and rare in a uniform sample. Ranking
        them beside those finds them as a best fit would. Bounded like
        :meth:`first_in_order`: the walk stops after ``8k + 16`` agents."""
        if k <= 0 or need.family == "cpu" or need.gpu_milli or need.mig_profile:
            return []
        by_level: dict[int, list[_IndexedSet]] = {}
        for level, pool in self._level_pools(need):
            by_level.setdefault(level, []).append(pool)
        return self._walk_in_order(
            [by_level[level] for level in sorted(by_level)], need, k, exclude
        )

    def _walk_in_order(
        self,
        groups: list[list[_IndexedSet]],
        need: Demand,
        k: int,
        exclude: set[str] | None,
    ) -> list[AgentRecord]:
        """Up to k distinct agents that fit ``need``, walking each group of pools merged by
        the host order, one group after another, passing over ``exclude`` and agents with a
        probe in flight. Stops after ``8k + 16`` agents met (repeats included), so a walk
        never scans the zone: the bound :meth:`first_in_order` and
        :meth:`tightest_in_order` share."""
        chosen: list[AgentRecord] = []
        seen: set[str] = set()  # an agent sits in one pool per shape it advertises
        max_tries = 8 * k + 16
        tries = 0
        for pools in groups:
            for _, agent_id in heapq.merge(*(p.ordered for p in pools)):
                if len(chosen) >= k or tries >= max_tries:
                    return chosen
                tries += 1
                if agent_id in seen or (exclude and agent_id in exclude):
                    continue
                seen.add(agent_id)
                if agent_id in self._probing:
                    continue
                record = self.agents[agent_id]
                if _summary_fits(record, need):
                    chosen.append(record)
        return chosen

    def _pools(self, need: Demand) -> list[_IndexedSet]:
        """The non-empty pools whose agents may fit ``need``: every agent that fits is in
        one of them (the levels are lower bounds), so drawing from them and checking each
        draw is a uniform draw over the agents that fit. O(pools of the matching shapes):
        bounded by the levels, not by the zone's size."""
        return [pool for _, pool in self._level_pools(need)]

    def _gpu_shapes(self, need: Demand) -> list[str]:
        """The index's shapes a GPU demand may use: its MIG profile's, else every whole-GPU
        (or share) shape of its model, or of any model."""
        if need.mig_profile:
            return [f"mig:{need.mig_profile}"]
        kind = "share:" if need.gpu_milli else "gpu:"
        return [
            s
            for s in self._by_shape
            if s.startswith(kind) and (not need.gpu_model or s == kind + need.gpu_model)
        ]

    def _level_pools(self, need: Demand) -> list[tuple[int, _IndexedSet]]:
        """:meth:`_pools` with each pool's free-capacity level of its shape."""
        floor_shape, floor_cpu, floor_memory = _need_levels(need)
        shapes = [""] if need.family == "cpu" else self._gpu_shapes(need)
        return [
            (level, pool)
            for shape in shapes
            for (level, cpu, memory), pool in self._by_shape.get(shape, {}).items()
            if level >= floor_shape and cpu >= floor_cpu and memory >= floor_memory and len(pool)
        ]

    def any_fits(self, need: Demand, rng: random.Random) -> bool:
        return bool(self.sample(need, 1, rng))

    def counts(self, need: Demand) -> HostCounts:
        """How many ready hosts match ``need`` ever and now, never a scan of the zone per
        call: ``ready`` is kept as agents come and go, ``matching`` and ``members_total``
        (which read only the shapes' totals) are kept per demand until an agent's readiness
        or totals change (O(agents) then), and ``fitting`` is read from the index of free
        capacity (:class:`~laminar_zone.free_index.FreeIndex`). The whole answer is also
        kept per demand until an agent's readiness or shapes change, so a job that queues,
        and the next that fails alike, cost a dictionary lookup."""
        kept = self._counts.get(need)
        if kept is not None and kept[0] == self._counts_version:
            return kept[1]
        matching, members = self._ever_counts(need)
        if need.family == "cpu":
            fits_now = members_fitting(need, {}) >= 1 and matching > 0
            fitting = self._ready_count if fits_now else 0
        else:
            fitting = self._free.hosts_fitting(need)
        counts = HostCounts(self._ready_count, matching, fitting, members)
        if len(self._counts) >= COUNTS_KEPT:
            self._counts.clear()  # bounded: demands are few, but clients choose them
        self._counts[need] = (self._counts_version, counts)
        return counts

    def _ever_counts(self, need: Demand) -> tuple[int, int]:
        """Ready hosts that could ever hold a member of ``need``, and how many members they
        could hold if empty: O(agents) once per demand, then kept until an agent's readiness
        or totals change (:attr:`_totals_version`), bounded like :meth:`counts`."""
        # Kept per the fields a host's totals are read against: memory and host CPU are
        # not, so the needs the router widens after OOM kills (each its own memory) share
        # one entry instead of each walking every agent (and, past COUNTS_KEPT of them,
        # emptying the table for the next: 82% of a 5,000-GPU `sim airlock` run).
        need = Demand(need.gpus, need.mig_profile, need.gpu_milli, 0, need.gpu_model)
        kept = self._ever.get(need)
        if kept is not None and kept[0] == self._totals_version:
            return kept[1], kept[2]
        matching = members = 0
        for record in self.agents.values():
            if record.is_ready and (ever := members_fitting(need, record.shapes, total=True)) >= 1:
                matching += 1
                members += ever
        if len(self._ever) >= COUNTS_KEPT:
            self._ever.clear()
        self._ever[need] = (self._totals_version, matching, members)
        return matching, members

    def free_for(self, need: Demand) -> int:
        """Free members of ``need`` summed over ready agents (flow splitting's S), from the
        index of free capacity (:class:`~laminar_zone.free_index.FreeIndex`): a few
        bisections per shape the demand may use, whatever the zone's size or how many
        distinct demands ask."""
        if need.family == "cpu":
            return self._ready_count * min(members_fitting(need, {}), CPU_ONLY_CAPACITY)
        return self._free.free_members(need)

    def heat(self) -> int:
        return sum(r.heat for r in self.agents.values() if r.is_ready)

    def shape_totals(self) -> tuple[int, dict[str, ShapeCap]]:
        """Ready agents and their free capacity per shape summed (a zone's advertisement):
        ``free`` and ``total`` add up, the ``max_free_*`` fields are maxima. O(agents)."""
        totals: dict[str, list[int]] = {}
        agents = 0
        for record in self.agents.values():
            if not record.is_ready:
                continue
            agents += 1
            for shape, cap in record.shapes.items():
                row = totals.setdefault(shape, [0, 0, 0, 0])
                row[0] += cap.free
                row[1] += cap.total
                row[2] = max(row[2], cap.max_free_milli)
                row[3] = max(row[3], cap.max_free_memory_bytes)
        return agents, {shape: ShapeCap(*row) for shape, row in sorted(totals.items())}


#: Level of a resource a summary does not bound (unknown host figures, a resource the
#: agent does not arbitrate): above any demand's.
UNBOUNDED_LEVEL = 1 << 10

#: Width of a level of free share (milli-GPUs): 21 levels from 0 to a whole GPU.
SHARE_LEVEL_MILLI = 50


def _same_totals(before: dict[str, ShapeCap], after: dict[str, ShapeCap]) -> bool:
    """Whether two summaries advertise the same shapes with the same totals (what a demand
    could ever fit depends on nothing else)."""
    return before.keys() == after.keys() and all(
        cap.total == before[shape].total for shape, cap in after.items()
    )


def _shape_level(shape: str, cap: ShapeCap) -> int:
    """How much of one shape an agent has free, as a level no fitting demand exceeds: the
    largest free share in steps of :data:`SHARE_LEVEL_MILLI` for ``share:``, free units for
    the others."""
    return cap.max_free_milli // SHARE_LEVEL_MILLI if shape.startswith("share:") else cap.free


def _host_levels(host: HostCap | None) -> tuple[int, int]:
    """Free host CPU and memory as levels (bit lengths, so a few dozen at most)."""
    if host is None:
        return UNBOUNDED_LEVEL, UNBOUNDED_LEVEL
    cpu = host.cpu_free_milli.bit_length() if host.cpu_total_milli else UNBOUNDED_LEVEL
    memory = host.memory_free_bytes.bit_length() if host.memory_total_bytes else UNBOUNDED_LEVEL
    return cpu, memory


def _need_levels(need: Demand) -> tuple[int, int, int]:
    """The lowest levels an agent that fits ``need`` can be at (0 where the need leaves it
    to the host: :func:`~laminar_base.demand.host_share` defaults from the host's totals)."""
    if need.family == "cpu":
        shape = 0
    elif need.mig_profile or not need.gpu_milli:
        shape = max(1, need.gpus)
    else:
        shape = need.gpu_milli // SHARE_LEVEL_MILLI
    return shape, need.cpu_milli.bit_length(), need.host_memory_bytes.bit_length()


#: A candidate's score from the router's view (higher is better) or None when its summary
#: shows it cannot take the demand; see :func:`laminar_zone.placement.fragmentation_rank`.
Rank = Callable[[AgentRecord], float | None]


#: Candidates a draw takes in the view's fixed host order before its random sample.
#: 24, measured on the six pod lists (docs/benchmarks.md, issue 16, "the ordered draw's
#: size"): cpu250 7.64 -> 7.32 with the others within 0.03 of 16; 32 cost the default list.
ORDERED_SIZE = 24


#: Candidates a draw for whole GPUs takes from the tightest fitting level of the index
#: (:meth:`ZoneView.tightest_in_order`) beside the ordered and the random ones: hosts the
#: task would fill exactly, which FGD's score often likes best. One zone, seeds 42-51:
#: multigpu50 3.05% -> 2.91% unallocated (FGD 2.98); taken for shares too (the tightest
#: largest free share) it moved gpuspec33 from 8.94 to 10.24 and helped no list
#: (docs/benchmarks.md, "one zone, a tight draw and MIG on commit (issue 16)").
TIGHT_SIZE = 8


#: d for a try that compares agents' answers when the configured d is 1: a gang gathers
#: leases over several hosts and commits them all or none.
COMPARED_PROBES_PER_ATTEMPT = 2


@dataclass(frozen=True)
class ProbeLimits:
    """The probing budget of one placement try (``[placement]`` in the router's config).

    d = 1 (the default): a one-member job's probe carries the commit
    (:class:`laminar_zone.gather.Gather`'s commit on probe), chosen by measurement
    (docs/zone.md); gangs still compare two (:meth:`for_try`)."""

    probes_per_attempt: int = 1
    sample_size: int = SAMPLE_SIZE
    max_attempts: int = 4
    regenerations: int = 2
    #: Candidates taken first in the view's fixed host order (:meth:`ZoneView.first_in_order`),
    #: ranked beside the ``sample_size`` drawn at random; on equal scores they come first.
    ordered_size: int = ORDERED_SIZE
    #: Candidates taken from the tightest fitting level up (:meth:`ZoneView.tightest_in_order`).
    tight_size: int = TIGHT_SIZE

    def for_try(self, need: Demand, gang: int) -> ProbeLimits:
        """The limits a try of ``gang`` members of ``need`` probes with: at least
        :data:`COMPARED_PROBES_PER_ATTEMPT` hosts per round for a gang, else as configured
        (d = 1: the probe carries the commit). A MIG profile compared two until
        2026-11-28 (d = 1 had cost ``sim fgd --mig`` 6.97% -> 8.11% unallocated with the
        ranking of 2026-11-25); with the ranking of now, in one zone, d = 1 gives 2.53%
        against 2.59% at 1.52 messages per placement against 3.23 (docs/benchmarks.md,
        "one zone, a tight draw and MIG on commit (issue 16)")."""
        if gang <= 1 or self.probes_per_attempt >= COMPARED_PROBES_PER_ATTEMPT:
            return self
        return replace(self, probes_per_attempt=COMPARED_PROBES_PER_ATTEMPT)


class ProbePlan:
    """Which agents one placement try probes, attempt by attempt (router and simulator).

    A draw takes the ``ordered_size`` fitting candidates first in the view's fixed host
    order (:meth:`ZoneView.first_in_order`), ``tight_size`` from the tightest fitting level
    up (:meth:`ZoneView.tightest_in_order`) and ``sample_size`` more at random; with a
    ``rank`` they are scored from their summaries (best first, equal scores in host
    order, those it rules out dropped), else taken in the order drawn; each attempt probes
    up to ``probes_per_attempt`` not yet tried; when the draw is used up it is redrawn at
    most ``regenerations`` times; at most ``max_attempts`` attempts. Scoring work per try
    is thus at most ``(ordered_size + tight_size + sample_size) * (1 + regenerations)``
    candidates (144 by default), whatever the zone's size. An empty batch means stop, and :attr:`reason` says why when
    no host looked suitable at all.
    """

    def __init__(
        self,
        view: ZoneView,
        need: Demand,
        limits: ProbeLimits,
        rng: random.Random,
        exclude: set[str] | None = None,
        rank: Rank | None = None,
    ) -> None:
        self.view = view
        self.need = need
        self.limits = limits
        self.rng = rng
        self.rank = rank
        self.excluded = len(exclude or ())
        self.tried: set[str] = set(exclude or ())
        #: Candidates scored so far (bounded by the sample size and the regenerations).
        self.scored = 0
        self.sample = self._draw()
        self.regenerations = limits.regenerations
        self.attempts = 0
        self.reason = ""

    def next_batch(self) -> list[AgentRecord]:
        if self.attempts >= self.limits.max_attempts:
            return []
        batch = [r for r in self.sample if r.agent_id not in self.tried]
        batch = batch[: self.limits.probes_per_attempt]
        if not batch and self.regenerations > 0:
            self.regenerations -= 1
            self.sample = self._draw()
            batch = self.sample[: self.limits.probes_per_attempt]
        if not batch:
            if len(self.tried) == self.excluded:
                self.reason = "no host's summary shows room"
            return []
        self.attempts += 1
        self.tried.update(r.agent_id for r in batch)
        for record in batch:
            self.view.note_probing(record.agent_id)
        return batch

    def _draw(self) -> list[AgentRecord]:
        first = self.view.first_in_order(self.need, self.limits.ordered_size, exclude=self.tried)
        exclude = self.tried | {r.agent_id for r in first} if first else self.tried
        tight = self.view.tightest_in_order(self.need, self.limits.tight_size, exclude=exclude)
        if tight:
            exclude = exclude | {r.agent_id for r in tight}
        drawn = (
            first
            + tight
            + self.view.sample(self.need, self.limits.sample_size, self.rng, exclude=exclude)
        )
        if self.rank is None:
            return drawn
        self.scored += len(drawn)
        # Equal scores go to the host first in the view's fixed order, as FGD's go to the
        # node first in its fixed rank: hosts fill one after another.
        order = self.view.order_of
        scored = [
            (score, order(r.agent_id), r) for r in drawn if (score := self.rank(r)) is not None
        ]
        scored.sort(key=lambda row: (-row[0], row[1]))
        return [r for _, _, r in scored]


def fragmentation_ranking(need: Demand, frag: FragmentationCache | None) -> Rank | None:
    """Rank candidates for ``need`` by :func:`~laminar_zone.placement.fragmentation_rank`
    over ``frag``'s target workload; None (draw order) without one. A MIG profile is ranked
    as the share of a GPU its compute slices are (``sim fgd --mig``, seeds 42-51: 3.69% ->
    3.07% unallocated against random draws)."""
    if frag is None:
        return None
    measure = frag

    def rank(record: AgentRecord) -> float | None:
        return fragmentation_rank(need, record.host, record.shapes, measure)

    return rank


def learned_ranking(workload: ObservedWorkload, need: Demand) -> Rank | None:
    """The router's ranking of one try: the demand's shape learned into the workload it has
    been asked to place, and candidates ranked by the fragmentation they would take on over
    that workload (:func:`fragmentation_ranking`); the router's ``Placer`` and ``sim
    replay`` both call it."""
    shape = demand_pod(need, HostCap())
    workload.observe(shape)
    return fragmentation_ranking(need, workload.cache(shape))


def choose_offers(offers: list[Offer], gang: int) -> list[Offer] | None:
    """Late binding: the best lease for one member, or one lease per member of a gang."""
    if not offers:
        return None
    if gang == 1:
        return [best_offers(offers)[0]]
    return assign_gang(offers, gang)


def _record_host(record: AgentRecord, host: HostCap) -> None:
    """The host figures of the record's latest summary, stamped with its heartbeat: they
    hold until the next one (``AgentRecord.host``)."""
    record.reported_host = host
    record.reported_host_at = record.last_heartbeat


def _summary_fits(record: AgentRecord, need: Demand) -> bool:
    """Whether ``record``'s summary holds one member of ``need``: a shape with room, and
    host CPU and memory (when the summary carries them)."""
    host = record.host
    return members_fitting(need, record.shapes) >= 1 and (host is None or host.fits(need))
