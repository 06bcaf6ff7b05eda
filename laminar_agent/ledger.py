"""Node-local capacity ledger and probe arbitration: a pure module (no I/O, time passed in).

The agent is the single authority over its host's GPUs. Zones send *probes*; the
ledger settles a batch of them deterministically so two agents given the same
state and the same batch always answer the same way, which keeps the protocol
testable and replayable.

Capacity model
--------------
Every slice has ``capacity_milli`` (1000 = one GPU) and ``memory_total_bytes``.
A lease holds allocations ``(slice_id, milli, memory_bytes)``; while it is
uncommitted it counts as *leased*, after :meth:`Ledger.commit` as *committed*.
Committed + leased never exceeds a slice's milli or memory capacity
(:meth:`Ledger.check_invariant`).

Shapes of demand
----------------
* whole GPUs (``gpus=N``): N distinct slices, each a WHOLE_GPU slice with no use
  or a SHARED_GPU slice with no use; each takes all milli and all memory.
* MIG (``mig_profile``): one unused MIG slice of exactly that profile. With MIG on
  demand (``mig_on_demand``) a MIG GPU's layout may change to hold it
  (:mod:`laminar_agent.mig_layout`): by default (``mig_carve_busy``) idle instances of
  any MIG GPU give way to a new instance at the legal placement that strands least,
  while instances in use, leased or reserved stay; else only a MIG GPU that runs nothing
  and holds no lease or reservation takes a new layout. Whole GPUs may take such an idle
  GPU as one full-GPU instance. The driver applies a layout the ledger chose
  (:attr:`Ledger.mig_pending`) before the first subjob on that GPU starts.
* share (``gpu_milli``): part of a SHARED_GPU slice; milli and the declared
  ``gpu_memory_bytes`` are reserved.
* none of these: CPU-only, granted with no allocations and score 1.0.

Scoring (in [0, 1], higher is better; it ranks candidate placements and is
reported to the zone so it can compare agents)
-------------------------------------------------------------------------------
The goal is to minimise fragmentation:

* share: ``1 - (left_milli/capacity_milli + left_memory/memory_total) / 2`` where
  ``left_*`` is what stays free on the slice after placement. The fullest slice
  that still fits wins (best fit), so empty shared GPUs stay whole for whole-GPU
  demands.
* whole GPU: per chosen slice ``0.5 * kind + 0.5 * memory_fit`` averaged, where
  ``kind`` is 1.0 for a WHOLE_GPU slice and 0.5 for an unused SHARED_GPU slice
  (taking a shared GPU removes share capacity), and ``memory_fit`` is
  ``gpu_memory_bytes / memory_total`` (1.0 when no memory is declared).
  Candidates are taken in score order, so WHOLE_GPU slices and the smallest
  GPU that fits are used first.
* MIG: ``0.5 * memory_fit + 0.5 * packing`` where ``packing`` is the fraction of
  the other MIG slices on the same GPU already in use: filling a partly used GPU
  keeps other GPUs free for re-partitioning.

Ties are broken by slice id, so results never depend on dict order.

With a fragmentation measure set (:meth:`Ledger.set_fragmentation`, the target workload
the zone observes), the score is FGD's instead: ``placement_score`` of the change in the
host's expected fragmentation (blended with how used its GPUs are) (:mod:`laminar_base.fragmentation`), a share goes to the
GPU where it strands least, and the router, which ranks hosts by the same measure from
their summaries, compares like with like at late binding.

Host CPU and memory
-------------------
The host's CPU (milli-cores) and memory (bytes) are capacity like a slice's: a lease
holds what :func:`laminar_base.demand.host_share` gives (the demand's own figures, or a
share of the host in proportion to the GPUs taken), and committed + leased never exceeds
the host's totals. A total of 0 means that resource is not arbitrated.

Reservations
------------
Priority preemption (Airlock) frees a slice by reclaiming lower-priority
subjobs, which takes a grace period. Meanwhile the slice is *reserved* for the
preempting probe (:meth:`Ledger.reserve`, with a deadline): no probe with another
``owner`` is placed on it, so the room made for one job is not taken by another
as soon as the victims' capacity is released. A reservation holds no capacity
itself and never affects the over-commit invariant.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from laminar_agent.inventory.mig import MigProfile
from laminar_agent.mig_layout import (
    Carve,
    Instance,
    MigGpu,
    Weights,
    carve_options,
    check_gpu,
    compute_slices,
    fragmentation,
    is_legal,
    layout_for,
    placeable_count,
    smallest_of,
    uniform_weights,
)
from laminar_base.demand import (
    MIG_COMPUTE_SLICES,
    MILLI_PER_GPU,
    Demand,
    HostCap,
    host_share,
    validate_demand,
)
from laminar_base.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from laminar_base.fragmentation import (
    FragmentationCache,
    demand_pod,
    fgd_delta_milli,
    host_node,
    placement_score,
)

if TYPE_CHECKING:
    from laminar_agent.inventory import GpuInfo, MigInstanceInfo

PRIORITY_MIN = 1
PRIORITY_MAX = 4


#: Reservation owner prefix of slices kept from new work (:meth:`Ledger.hold_back`).
HELD_BACK = "held-back:"


class SliceKind(enum.Enum):
    """Values match proto ``laminar.v1.SliceKind``."""

    WHOLE_GPU = 1
    MIG = 2
    SHARED_GPU = 3


@dataclass(frozen=True)
class Slice:
    slice_id: str
    kind: SliceKind
    gpu_index: int
    device_uuid: str
    gpu_model: str
    memory_total_bytes: int
    mig_profile: str = ""
    capacity_milli: int = MILLI_PER_GPU


def slices_from_gpus(gpus: Sequence[GpuInfo]) -> list[Slice]:
    """Whole GPUs, MIG instances, and shared GPUs as ledger slices."""
    out: list[Slice] = []
    for gpu in gpus:
        if gpu.mig_enabled:
            for mig in gpu.mig_instances:
                out.append(
                    Slice(
                        slice_id=f"gpu{gpu.index}/{mig.profile}@{mig.start}",
                        kind=SliceKind.MIG,
                        gpu_index=gpu.index,
                        device_uuid=mig.uuid,
                        gpu_model=gpu.model,
                        memory_total_bytes=mig.memory_total_bytes,
                        mig_profile=mig.profile,
                    )
                )
        else:
            out.append(
                Slice(
                    slice_id=f"gpu{gpu.index}",
                    kind=SliceKind.SHARED_GPU if gpu.shared else SliceKind.WHOLE_GPU,
                    gpu_index=gpu.index,
                    device_uuid=gpu.uuid,
                    gpu_model=gpu.model,
                    memory_total_bytes=gpu.memory_total_bytes,
                )
            )
    return out


@dataclass(frozen=True)
class FreeWindow:
    """Capacity on one slice from ``start_unix`` to ``end_unix`` (0 = open-ended)."""

    slice: Slice
    milli: int
    memory_bytes: int
    start_unix: float
    end_unix: float


@dataclass(frozen=True)
class Allocation:
    slice_id: str
    milli: int
    memory_bytes: int


@dataclass(frozen=True)
class ProbeOrder:
    probe_id: str
    job_id: str
    member: int
    demand: Demand
    priority: int
    value: float
    arrival_seq: int
    ttl_seconds: float
    slice_id: str = ""
    subjob_id: str = ""
    #: Reservation owner; reserved slices are placed only for probes of the same owner.
    owner: str = ""
    #: Authenticated identity of the prober (certificate name); "" without mTLS.
    caller: str = ""


@dataclass
class LeaseRecord:
    lease_id: str
    job_id: str
    member: int
    allocations: tuple[Allocation, ...]
    score: float
    expires_at: float
    priority: int
    committed: bool = False
    subjob_id: str = ""
    #: Authenticated identity the lease was issued to; only it may commit the lease.
    caller: str = ""
    #: Host CPU (milli-cores) and memory (bytes) the lease holds.
    cpu_milli: int = 0
    host_memory_bytes: int = 0


@dataclass(frozen=True)
class Granted:
    probe_id: str
    lease: LeaseRecord


@dataclass(frozen=True)
class Bounced:
    probe_id: str
    reason: str
    retryable: bool


@dataclass(frozen=True)
class ShapeFree:
    """Free capacity of one shape, as advertised to the zone.

    ``max_free_milli`` and ``max_free_memory_bytes`` are maxima over the shape's
    slices taken independently (they may come from different slices).
    """

    shape: str
    free: int
    total: int
    max_free_milli: int
    max_free_memory_bytes: int


@dataclass(frozen=True)
class _NoFit:
    reason: str
    retryable: bool


_Fit = tuple[tuple[Allocation, ...], float]

#: Why new work of a demand on some slices would be refused although the ledger has room
#: for it, or "" (the agent's pressure rule, ``AgentCore.pressure_refusal``).
Refusal = Callable[[Demand, Sequence[str]], str]


def _memory_fit(demand_bytes: int, total_bytes: int) -> float:
    if demand_bytes <= 0 or total_bytes <= 0:
        return 1.0
    return min(1.0, demand_bytes / total_bytes)


def _full_profile(gpu: MigGpu) -> MigProfile:
    """The profile that spans the whole GPU (7 compute slices, every memory slice)."""
    return max(gpu.table.values(), key=lambda p: (p.compute_slices, p.memory_bytes))


def counter_ids() -> Callable[[], str]:
    """Lease ids 1, 2, 3...: for simulations, which must be deterministic; the agent's
    are random (see :class:`Ledger`)."""
    counter = itertools.count(1)
    return lambda: str(next(counter))


class Ledger:
    """Tracks leased and committed capacity per slice and settles probe batches."""

    def __init__(
        self,
        slices: Sequence[Slice],
        lease_prefix: str = "",
        lease_ids: Callable[[], str] | None = None,
        *,
        cpu_total_milli: int = 0,
        memory_total_bytes: int = 0,
        mig_on_demand: Sequence[MigGpu] = (),
        mig_carve_busy: bool = True,
    ) -> None:
        """``lease_ids`` makes the random part of lease ids: by default 128 random bits
        (``secrets``), so a lease cannot be guessed; a simulation passes a counter.
        ``cpu_total_milli`` and ``memory_total_bytes`` are the host's (0: not arbitrated).
        ``mig_on_demand``: the MIG GPUs whose layout the ledger may change while they are
        idle (their current instances are among ``slices``; a GPU may have none yet).
        ``mig_carve_busy``: such a GPU that runs something may still change its idle part
        (destroy idle instances, create one of the asked profile at a free legal
        placement, busy instances untouched); False: only a GPU that runs nothing changes."""
        if cpu_total_milli < 0 or memory_total_bytes < 0:
            raise InvalidArgument(
                f"host totals must be >= 0, got {cpu_total_milli} milli-cores and "
                f"{memory_total_bytes} bytes",
                field="host",
            )
        by_id: dict[str, Slice] = {}
        for s in slices:
            if s.slice_id in by_id:
                raise InvalidArgument(f"duplicate slice id {s.slice_id!r}", field="slices")
            if s.capacity_milli <= 0 or s.memory_total_bytes < 0:
                raise InvalidArgument(
                    f"slice {s.slice_id!r} has capacity_milli={s.capacity_milli} "
                    f"memory_total_bytes={s.memory_total_bytes}",
                    field="slices",
                )
            by_id[s.slice_id] = s
        self._slices = dict(sorted(by_id.items()))
        self.slices: Mapping[str, Slice] = MappingProxyType(self._slices)
        for gpu in mig_on_demand:
            check_gpu(gpu)
        self._on_demand = {gpu.gpu_index: gpu for gpu in mig_on_demand}
        #: Whether a busy MIG-on-demand GPU's idle part may be carved (see ``__init__``).
        self.mig_carve_busy = mig_carve_busy
        # The profile mix a carve is measured against, for the fragmentation measure set.
        self._weights: tuple[FragmentationCache | None, dict[str, Weights]] = (None, {})
        #: GPU index -> the layout the ledger chose that the GPU does not have yet; the
        #: driver applies it (:meth:`layout_applied`) before a subjob on that GPU starts.
        self.mig_pending: dict[int, tuple[Instance, ...]] = {}
        # Repartitions the fit being settled needs: (GPU index, layout).
        self._planned: list[tuple[int, tuple[Instance, ...]]] = []
        self._lease_prefix = lease_prefix
        self._lease_ids: Callable[[], str] = lease_ids or (lambda: secrets.token_hex(16))
        self._leases: dict[str, LeaseRecord] = {}
        # Uncommitted leases among them (every summary reports the count).
        self._pending = 0
        # (expires_at, lease_id) of every lease granted uncommitted, soonest first: expire()
        # pops the lapsed ones instead of scanning every lease at each probe batch and
        # summary. Entries of leases committed or released since stay until their time
        # comes (bounded by the grants of one TTL) and are skipped then.
        self._expiries: list[tuple[float, str]] = []
        # Per slice: [committed_milli, leased_milli, committed_memory, leased_memory].
        self._usage: dict[str, list[int]] = {sid: [0, 0, 0, 0] for sid in self.slices}
        # slice_id -> (owner, expires_at) of a preemption reservation.
        self._reserved: dict[str, tuple[str, float]] = {}
        self.cpu_total_milli = cpu_total_milli
        self.memory_total_bytes = memory_total_bytes
        # Host: [committed_cpu_milli, leased_cpu_milli, committed_memory, leased_memory].
        self._host = [0, 0, 0, 0]
        self._gpus = sorted(
            (s for s in self.slices.values() if s.kind is not SliceKind.MIG),
            key=lambda s: (s.gpu_index, s.slice_id),
        )
        self.gpus_total = len({s.gpu_index for s in self.slices.values()} | set(self._on_demand))
        models = {s.gpu_model for s in self._gpus}
        self._model = models.pop() if len(models) == 1 else ""
        self._frag: FragmentationCache | None = None
        # Bumped by every change of use, slices, layouts or reservations: the summary's
        # shapes and host figures are computed once per state (a summary goes with every
        # probe and release reply, and most of them follow no change).
        self._version = 0
        self._shapes_memo: tuple[tuple[int, bool], list[ShapeFree]] | None = None
        self._host_memo: tuple[tuple[int, bool], HostCap] | None = None

    def set_fragmentation(self, frag: FragmentationCache | None) -> None:
        """Score and choose by FGD's fragmentation gradient over ``frag``'s target workload
        (None: the fixed best-fit scores). Only hosts whose whole and shared GPUs are one
        model use it: the measure knows one model per node."""
        self._frag = frag

    def host_need(self, demand: Demand) -> tuple[int, int]:
        """(milli-cores, bytes) one member of ``demand`` holds here; 0 where not arbitrated."""
        cpu, memory = host_share(
            demand, self.cpu_total_milli, self.memory_total_bytes, self.gpus_total
        )
        return (cpu if self.cpu_total_milli else 0, memory if self.memory_total_bytes else 0)

    def state_key(self) -> tuple[int, bool]:
        """Changes with every change of what :meth:`shapes` and :meth:`host_free` report
        (use, slices, MIG layouts, reservations, the carve setting): equal keys, equal
        figures."""
        return (self._version, self.mig_carve_busy)

    def host_free(self) -> HostCap:
        """The host's free CPU and memory and each GPU's free share, for the summary
        (computed once per ledger state)."""
        key = self.state_key()
        if self._host_memo is None or self._host_memo[0] != key:
            self._host_memo = (key, self._host_free())
        return self._host_memo[1]

    def _host_free(self) -> HostCap:
        u = self._host
        return HostCap(
            cpu_free_milli=self.cpu_total_milli - u[0] - u[1],
            cpu_total_milli=self.cpu_total_milli,
            memory_free_bytes=self.memory_total_bytes - u[2] - u[3],
            memory_total_bytes=self.memory_total_bytes,
            gpu_free_milli=self._gpu_free_milli(),
            gpus_total=self.gpus_total,
        )

    def _gpu_free_milli(self) -> tuple[int, ...]:
        """Each GPU's free share in index order: a whole or shared GPU's free milli; a MIG
        on-demand GPU's, all of it while idle, else its unused instances' compute share."""
        usage = self._usage
        free = {
            s.gpu_index: max(0, s.capacity_milli - usage[s.slice_id][0] - usage[s.slice_id][1])
            for s in self._gpus
        }
        if self._on_demand:
            idle = {gpu.gpu_index for gpu in self._idle_on_demand("")}
            held = self._held_gpus() if self.mig_carve_busy else set()
            for index, gpu in self._on_demand.items():
                if index in idle:
                    free[index] = MILLI_PER_GPU
                    continue
                if self.mig_carve_busy:  # what is not pinned may be carved
                    pinned = compute_slices(gpu.geometry or gpu.model, self._pinned(index))
                    compute = 0 if index in held else MIG_COMPUTE_SLICES - pinned
                else:
                    compute = sum(
                        gpu.table[s.mig_profile].compute_slices
                        for s in self._instances(index)
                        if self._unused(s) and s.mig_profile in gpu.table
                    )
                # Rounded as a profile's share is (demand_pod), so that k free compute
                # slices fit a k-slice profile in the router's measure (floor did not).
                free[index] = round(compute * MILLI_PER_GPU / MIG_COMPUTE_SLICES)
        return tuple(free[index] for index in sorted(free))

    # ----------------------------------------------------------------- queries

    def lease(self, lease_id: str) -> LeaseRecord | None:
        return self._leases.get(lease_id)

    def leases(self) -> list[LeaseRecord]:
        return [self._leases[k] for k in sorted(self._leases)]

    def usage(self, slice_id: str) -> tuple[int, int, int, int]:
        """(committed_milli, leased_milli, committed_memory_bytes, leased_memory_bytes)."""
        if slice_id not in self._usage:
            raise NotFound(f"unknown slice {slice_id!r}")
        u = self._usage[slice_id]
        return (u[0], u[1], u[2], u[3])

    def pending_leases(self) -> int:
        return self._pending

    def _used(self, slice_id: str) -> tuple[int, int]:
        u = self._usage[slice_id]
        return u[0] + u[1], u[2] + u[3]

    def _free(self, s: Slice) -> tuple[int, int]:
        milli, memory = self._used(s.slice_id)
        return s.capacity_milli - milli, s.memory_total_bytes - memory

    def _unused(self, s: Slice) -> bool:
        milli, memory = self._used(s.slice_id)
        return milli == 0 and memory == 0

    def shapes(self) -> list[ShapeFree]:
        """Free capacity per shape: ``gpu:<model>``, ``mig:<profile>``, ``share:<model>``
        (computed once per ledger state)."""
        key = self.state_key()
        if self._shapes_memo is None or self._shapes_memo[0] != key:
            self._shapes_memo = (key, self._shapes())
        return list(self._shapes_memo[1])

    def _shapes(self) -> list[ShapeFree]:
        # Per shape: [free, total, max free milli, max free memory], each slice (or each
        # instance a MIG-on-demand GPU could hold) added as one row (ok, milli, memory):
        # the maxima are over the rows, whose figures are never negative.
        groups: dict[str, list[int]] = {}

        def add(shape: str, ok: bool, milli: int, memory: int) -> None:
            g = groups.get(shape)
            if g is None:
                groups[shape] = [int(ok), 1, milli, memory]
                return
            g[0] += ok
            g[1] += 1
            if milli > g[2]:
                g[2] = milli
            if memory > g[3]:
                g[3] = memory

        idle: set[int] = set()
        if self._on_demand:
            idle = {gpu.gpu_index for gpu in self._idle_on_demand("")}
            self._on_demand_shapes(add, idle)
        usage = self._usage
        reserved = self._reserved
        for s in self.slices.values():
            kind = s.kind
            if kind is SliceKind.MIG and (
                s.gpu_index in idle or (self.mig_carve_busy and s.gpu_index in self._on_demand)
            ):
                continue  # counted with its GPU
            u = usage[s.slice_id]
            used_milli, used_memory = u[0] + u[1], u[2] + u[3]
            free_milli = s.capacity_milli - used_milli
            free_memory = s.memory_total_bytes - used_memory
            unused = used_milli == 0 and used_memory == 0
            if reserved and self._is_held_back(s):  # takes no new work: advertise none
                free_milli, free_memory, unused = 0, 0, False
            whole_milli, whole_memory = (
                (s.capacity_milli, s.memory_total_bytes) if unused else (0, 0)
            )
            if kind is SliceKind.MIG:
                add(f"mig:{s.mig_profile}", unused, whole_milli, whole_memory)
                continue
            add(f"gpu:{s.gpu_model}", unused, whole_milli, whole_memory)
            if kind is SliceKind.SHARED_GPU:
                add(f"share:{s.gpu_model}", free_milli > 0, free_milli, free_memory)
        return [ShapeFree(shape, g[0], g[1], g[2], g[3]) for shape, g in sorted(groups.items())]

    def _on_demand_shapes(self, add: Callable[[str, bool, int, int], None], idle: set[int]) -> None:
        """The rows of the MIG-on-demand GPUs (``idle``: those that hold nothing): while
        idle, any profile's full layout and one whole GPU; while busy, what could be carved
        around the instances in use (``mig_carve_busy``), else their instances as they are
        (added with the other slices)."""
        held = self._held_gpus() if self.mig_carve_busy else set()
        for gpu in self._on_demand.values():
            is_idle = gpu.gpu_index in idle
            full = _full_profile(gpu)
            add(
                f"gpu:{gpu.model}",
                is_idle,
                MILLI_PER_GPU if is_idle else 0,
                full.memory_bytes if is_idle else 0,
            )
            carved = self.mig_carve_busy and not is_idle
            if not (is_idle or carved):
                continue
            geometry = gpu.geometry or gpu.model
            pinned = () if is_idle or gpu.gpu_index in held else tuple(self._pinned(gpu.gpu_index))
            for name, entry in gpu.table.items():
                total = placeable_count(geometry, (), name)  # on the idle GPU
                if gpu.gpu_index in held:
                    count = 0
                elif carved:  # what could be carved around the instances in use
                    count = placeable_count(geometry, pinned, name)
                else:
                    count = total
                for _ in range(count):
                    add(f"mig:{name}", True, MILLI_PER_GPU, entry.memory_bytes)
                for _ in range(total - count):
                    add(f"mig:{name}", False, 0, 0)

    def windows(
        self,
        now_unix: float,
        busy_until: Mapping[str, float],
        max_windows: int,
        reserved_until: Mapping[str, float] | None = None,
    ) -> list[FreeWindow]:
        """Time x capacity windows for atomized work, at most ``max_windows``.

        * a slice with no demand on it: its whole capacity from now, open-ended
          (``end_unix`` 0), or until a reservation on it begins (``reserved_until``);
        * a shared GPU with room left: the free share and memory from now;
        * a busy slice whose holders declared when they end (``busy_until``: slice id
          -> the latest expected end): its whole capacity from then, open-ended.

        A reserved slice (held for a preemption) advertises nothing. Windows that
        start now come first, larger memory first, then by slice id, so the cut at
        ``max_windows`` keeps what can be used at once and the order is deterministic.
        """
        held = reserved_until or {}
        out: list[FreeWindow] = []
        for s in self.slices.values():
            if s.slice_id in self._reserved:
                continue
            free_milli, free_memory = self._free(s)
            if self._unused(s):
                out.append(
                    FreeWindow(
                        s,
                        s.capacity_milli,
                        s.memory_total_bytes,
                        now_unix,
                        held.get(s.slice_id, 0.0),
                    )
                )
            elif s.kind is SliceKind.SHARED_GPU and free_milli > 0 and free_memory > 0:
                out.append(FreeWindow(s, free_milli, free_memory, now_unix, 0.0))
            elif busy_until.get(s.slice_id, 0.0) > now_unix:
                out.append(
                    FreeWindow(
                        s, s.capacity_milli, s.memory_total_bytes, busy_until[s.slice_id], 0.0
                    )
                )
        out.sort(
            key=lambda w: (w.start_unix > now_unix, w.start_unix, -w.memory_bytes, w.slice.slice_id)
        )
        return out[: max(0, max_windows)]

    # ------------------------------------------------------------------- fits

    def reservations(self) -> dict[str, tuple[str, float]]:
        """slice_id -> (owner, expires_at) of the live reservations."""
        return dict(self._reserved)

    def reserve(self, owner: str, slice_ids: Sequence[str], expires_at: float) -> None:
        """Keep ``slice_ids`` for probes of ``owner`` until ``expires_at`` or :meth:`unreserve`.

        FailedPrecondition if one is already reserved by another owner.
        """
        if not owner:
            raise InvalidArgument("must not be empty", field="owner")
        for sid in slice_ids:
            if sid not in self.slices:
                raise NotFound(f"unknown slice {sid!r}", field="slice_ids")
            held = self._reserved.get(sid)
            if held is not None and held[0] != owner:
                raise FailedPrecondition(
                    f"slice {sid!r} is reserved by {held[0]!r}", field="slice_ids"
                )
        for sid in slice_ids:
            self._reserved[sid] = (owner, expires_at)
        self._version += 1

    def hold_back(self, key: str, slice_ids: Sequence[str]) -> None:
        """Keep ``slice_ids`` from new work until :meth:`release_hold` (a GPU whose driver
        fails): no probe may lease them and summaries advertise none of them.
        FailedPrecondition while a preemption holds one of them."""
        self.reserve(f"{HELD_BACK}{key}", slice_ids, math.inf)

    def release_hold(self, key: str) -> list[str]:
        """New work may use the slices :meth:`hold_back` kept for ``key`` again."""
        return self.unreserve(f"{HELD_BACK}{key}")

    def _is_held_back(self, s: Slice) -> bool:
        held = self._reserved.get(s.slice_id)
        return held is not None and held[0].startswith(HELD_BACK)

    def unreserve(self, owner: str) -> list[str]:
        """Drop every reservation of ``owner``; returns the slice ids."""
        mine = sorted(sid for sid, (who, _) in self._reserved.items() if who == owner)
        for sid in mine:
            del self._reserved[sid]
        self._version += 1
        return mine

    def _open_to(self, s: Slice, owner: str) -> bool:
        held = self._reserved.get(s.slice_id)
        return held is None or held[0] == owner

    def shape_candidates(self, demand: Demand, slice_id: str = "", owner: str = "") -> list[Slice]:
        """Slices whose shape and size could hold ``demand`` if they were empty (use ignored,
        reservations of other owners excluded), in slice id order; [] for CPU-only."""
        validate_demand(demand)
        if demand.family == "cpu":
            return []
        if slice_id:
            candidates = [self.slices[slice_id]] if slice_id in self.slices else []
        else:
            candidates = list(self.slices.values())
        candidates = [s for s in candidates if self._open_to(s, owner)]
        if demand.gpu_model:
            candidates = [s for s in candidates if s.gpu_model == demand.gpu_model]
        if demand.gpus > 0:
            kinds = (SliceKind.WHOLE_GPU, SliceKind.SHARED_GPU)
            return [
                s
                for s in candidates
                if s.kind in kinds and s.memory_total_bytes >= demand.gpu_memory_bytes
            ]
        if demand.mig_profile:
            return [
                s
                for s in candidates
                if s.kind is SliceKind.MIG
                and s.mig_profile == demand.mig_profile
                and s.memory_total_bytes >= demand.gpu_memory_bytes
            ]
        return [
            s
            for s in candidates
            if s.kind is SliceKind.SHARED_GPU
            and s.capacity_milli >= demand.gpu_milli
            and s.memory_total_bytes >= demand.gpu_memory_bytes
        ]

    @staticmethod
    def room_needed(demand: Demand, s: Slice) -> tuple[int, int]:
        """(bytes, milli) that must be free on ``s`` for one slice of ``demand``: all of it for
        whole GPUs and MIG (they need an unused slice), the share itself for shares."""
        if demand.gpus > 0 or demand.mig_profile:
            return s.memory_total_bytes, s.capacity_milli
        return demand.gpu_memory_bytes, demand.gpu_milli

    def fit(self, demand: Demand, slice_id: str = "") -> _Fit | str:
        """Dry run: the placement arbitration would choose now, or why it would bounce."""
        result = self._fit(demand, slice_id)
        return result.reason if isinstance(result, _NoFit) else result

    def fit_or_bounce(self, demand: Demand, slice_id: str = "") -> _Fit | Bounced:
        """Like :meth:`fit`, but a miss says whether retrying could help (``probe_id`` is "")."""
        result = self._fit(demand, slice_id)
        if isinstance(result, _NoFit):
            return Bounced("", result.reason, result.retryable)
        return result

    def _fit(
        self,
        demand: Demand,
        slice_id: str,
        owner: str = "",
        admits: Callable[[str], bool] | None = None,
    ) -> _Fit | _NoFit:
        """Where ``demand`` goes now, or why not; with ``admits``, only on slices (and
        MIG-on-demand GPUs, by GPU name) it admits."""
        validate_demand(demand)
        self._planned = []
        short = self._host_short(demand)
        if short is not None:
            return short
        if demand.family == "cpu":
            return (), self._gradient(demand, ()) if self._frag else 1.0
        if slice_id:
            if slice_id not in self.slices:
                return _NoFit(f"no slice {slice_id!r} on this host", False)
            candidates = [self.slices[slice_id]]
        else:
            candidates = list(self.slices.values())
        if self._reserved:
            open_ = [s for s in candidates if self._open_to(s, owner)]
            if not open_:
                return _NoFit(
                    f"slice {candidates[0].slice_id} is reserved for a preemption"
                    if len(candidates) == 1
                    else "every candidate slice is reserved for a preemption",
                    True,
                )
            candidates = open_
        model_note = ""
        if demand.gpu_model:
            candidates = [s for s in candidates if s.gpu_model == demand.gpu_model]
            model_note = f" {demand.gpu_model}"
        idle = [] if slice_id else self._idle_on_demand(demand.gpu_model)
        if admits is not None:
            candidates = [s for s in candidates if admits(s.slice_id)]
            idle = [gpu for gpu in idle if admits(f"gpu{gpu.gpu_index}")]
        if demand.gpus > 0:
            return self._fit_whole(demand, candidates, model_note, idle)
        if demand.mig_profile:
            if self.mig_carve_busy and self._on_demand and not slice_id:
                return self._fit_carve(demand, candidates, model_note)
            return self._fit_mig(demand, candidates, model_note, idle)
        return self._fit_share(demand, candidates, model_note)

    # ------------------------------------------------------------ MIG on demand

    def _idle_on_demand(self, model: str) -> list[MigGpu]:
        """MIG-on-demand GPUs (of ``model``, any if "") that hold no use, lease or
        reservation on any instance: the only GPUs a new layout may touch."""
        if not self._on_demand:
            return []
        busy = {
            s.gpu_index
            for s in self.slices.values()
            if s.gpu_index in self._on_demand
            and (not self._unused(s) or s.slice_id in self._reserved)
        }
        return [
            gpu
            for index, gpu in sorted(self._on_demand.items())
            if index not in busy and (not model or gpu.model == model)
        ]

    def _instances(self, index: int) -> list[Slice]:
        return [s for s in self.slices.values() if s.gpu_index == index and s.kind is SliceKind.MIG]

    def _plan(self, gpu: MigGpu, profile: str) -> Allocation:
        """Plan ``gpu``'s new layout for ``profile``; the allocation of its first such
        instance (applied by :meth:`_apply_plan` when the lease is granted)."""
        layout = layout_for(gpu.geometry or gpu.model, profile)
        self._planned.append((gpu.gpu_index, layout))
        start = next(start for name, start, _ in layout if name == profile)
        return Allocation(
            f"gpu{gpu.gpu_index}/{profile}@{start}", MILLI_PER_GPU, gpu.table[profile].memory_bytes
        )

    def _apply_plan(self) -> None:
        for index, layout in self._planned:
            self._repartition(index, layout)
        self._planned = []

    def _repartition(self, index: int, layout: tuple[Instance, ...]) -> None:
        """Give GPU ``index`` the MIG ``layout``: its instances not in it are destroyed (each
        must hold no use or reservation), the new ones become slices, and those in both stay
        as they are (use, device UUID)."""
        gpu = self._on_demand[index]
        old = {s.slice_id: s for s in self._instances(index)}
        wanted = {f"gpu{index}/{name}@{start}": name for name, start, _ in layout}
        gone = [s for sid, s in old.items() if sid not in wanted]
        if any(not self._unused(s) or s.slice_id in self._reserved for s in gone):
            raise AssertionError(f"GPU {index}: a MIG instance in use cannot be destroyed")
        added = [sid for sid in wanted if sid not in old]
        if not gone and not added:
            return
        self._version += 1
        for s in gone:
            del self._slices[s.slice_id]
            del self._usage[s.slice_id]
        for slice_id in added:
            name = wanted[slice_id]
            self._slices[slice_id] = Slice(
                slice_id=slice_id,
                kind=SliceKind.MIG,
                gpu_index=index,
                device_uuid="",
                gpu_model=gpu.model,
                memory_total_bytes=gpu.table[name].memory_bytes,
                mig_profile=name,
            )
            self._usage[slice_id] = [0, 0, 0, 0]
        ordered = sorted(self._slices.items())
        self._slices.clear()
        self._slices.update(ordered)
        self.mig_pending[index] = tuple(sorted(layout, key=lambda i: i[1]))

    # ------------------------------------------------------- carving a busy GPU

    def _instance(self, gpu: MigGpu, s: Slice) -> Instance:
        return (s.mig_profile, int(s.slice_id.rsplit("@", 1)[1]), gpu.table[s.mig_profile].size)

    def _pinned(self, index: int) -> list[Instance]:
        """GPU ``index``'s instances a new layout must keep: in use, leased or reserved."""
        gpu = self._on_demand[index]
        return sorted(
            (
                self._instance(gpu, s)
                for s in self._instances(index)
                if not self._unused(s) or s.slice_id in self._reserved
            ),
            key=lambda i: i[1],
        )

    def _held_gpus(self) -> set[int]:
        """GPUs with a held-back slice (a failing driver): no new instance goes there."""
        return {s.gpu_index for s in self.slices.values() if self._is_held_back(s)}

    def _mix(self, geometry: str) -> Weights:
        """The profile mix carving measures fragmentation over: the target workload's GPU
        demand as profiles (a share rounded up to compute slices, a whole GPU the full
        profile), or each compute size alike while the ledger has no measure."""
        frag, memo = self._weights
        if frag is not self._frag:
            memo = {}
            self._weights = (self._frag, memo)
        got = memo.get(geometry)
        if got is None:
            got = uniform_weights(geometry)
            if self._frag is not None:
                mix: dict[str, float] = {}
                target = self._frag.target
                for shape, prob in zip(target.shapes, target.probabilities, strict=True):
                    if shape.num_gpu <= 0:
                        continue
                    compute = (
                        MIG_COMPUTE_SLICES
                        if shape.gpu_milli >= MILLI_PER_GPU
                        else max(1, math.ceil(shape.gpu_milli * MIG_COMPUTE_SLICES / 1000 - 0.01))
                    )
                    name = smallest_of(geometry, compute)
                    mix[name] = mix.get(name, 0.0) + prob
                total = sum(mix.values())
                if total > 0:
                    got = tuple(sorted((name, w / total) for name, w in mix.items()))
            memo[geometry] = got
        return got

    def _fit_carve(self, demand: Demand, candidates: list[Slice], model_note: str) -> _Fit | _NoFit:
        """A MIG profile with carving on: an idle instance of it or a new one carved out of
        a GPU's idle part, wherever the GPU's expected fragmentation grows least (ties: the
        fuller GPU, no new instance, fewer destroyed, lower GPU index and start). A free
        instance of a GPU the ledger does not repartition is used first."""
        fixed = [s for s in candidates if s.gpu_index not in self._on_demand]
        found = self._fit_mig_slice(demand, fixed, model_note)
        if not isinstance(found, _NoFit):
            return found
        profile = demand.mig_profile
        open_ids = {s.slice_id for s in candidates}
        held = self._held_gpus()
        best: tuple[tuple[float, int, bool, int, int, int], int, Carve, float] | None = None
        could = False
        for index, gpu in self._on_demand.items():
            entry = gpu.table.get(profile)
            if (
                entry is None
                or entry.memory_bytes < demand.gpu_memory_bytes
                or (demand.gpu_model and gpu.model != demand.gpu_model)
            ):
                continue
            could = True
            if index in held:
                continue
            geometry = gpu.geometry or gpu.model
            instances = self._instances(index)
            layout = [self._instance(gpu, s) for s in instances]
            busy = self._pinned(index)
            usable = [
                self._instance(gpu, s)
                for s in instances
                if s.mig_profile == profile
                and s.slice_id in open_ids
                and self._unused(s)
                and s.memory_total_bytes >= demand.gpu_memory_bytes
            ]
            weights = self._mix(geometry)
            before = fragmentation(geometry, tuple(busy), weights)
            for option in carve_options(geometry, layout, busy, profile, usable):
                after = tuple(sorted({*busy, option.instance}, key=lambda i: i[1]))
                delta = fragmentation(geometry, after, weights) - before
                key = (
                    round(delta, 9),
                    -compute_slices(geometry, after),
                    option.created,
                    option.destroyed,
                    index,
                    option.instance[1],
                )
                if best is None or key < best[0]:
                    best = (key, index, option, delta)
        if best is None:
            if could:
                return _NoFit(
                    f"no free{model_note} {profile} slice and no free legal placement for one "
                    "on any MIG GPU (instances in use stay where they are)",
                    True,
                )
            return found
        _, index, option, delta = best
        name, start, _ = option.instance
        if option.created:
            self._planned.append((index, option.layout))
        memory = (
            self._on_demand[index].table[name].memory_bytes
            if option.created
            else self._slices[f"gpu{index}/{name}@{start}"].memory_total_bytes
        )
        score = min(1.0, max(0.0, 0.5 - delta / (2 * MIG_COMPUTE_SLICES)))
        return (Allocation(f"gpu{index}/{name}@{start}", MILLI_PER_GPU, memory),), score

    def layout_applied(self, index: int, instances: Sequence[MigInstanceInfo]) -> None:
        """The driver gave GPU ``index`` the layout :attr:`mig_pending` holds for it: its
        instances' device UUIDs (and memory as the GPU reports it) replace the planned ones."""
        layout = self.mig_pending.get(index)
        if layout is None:
            raise FailedPrecondition(f"GPU {index} has no MIG layout to apply", field="gpu_index")
        got = sorted((i.profile, i.start) for i in instances)
        if got != sorted((name, start) for name, start, _ in layout):
            raise FailedPrecondition(
                f"GPU {index} got instances {got}, not the layout chosen {list(layout)}",
                field="gpu_index",
            )
        for inst in instances:
            slice_id = f"gpu{index}/{inst.profile}@{inst.start}"
            used = self._used(slice_id)[1]
            if inst.memory_total_bytes < used:
                raise FailedPrecondition(
                    f"{slice_id} has {inst.memory_total_bytes} bytes, {used} are leased",
                    field="gpu_index",
                )
            self._slices[slice_id] = replace(
                self._slices[slice_id],
                device_uuid=inst.uuid,
                memory_total_bytes=inst.memory_total_bytes,
            )
        del self.mig_pending[index]
        self._version += 1

    def on_demand_layout(self, index: int) -> tuple[Instance, ...]:
        """The MIG layout the ledger holds for on-demand GPU ``index``."""
        return tuple(
            (
                s.mig_profile,
                int(s.slice_id.rsplit("@", 1)[1]),
                self._on_demand[index].table[s.mig_profile].size,
            )
            for s in sorted(self._instances(index), key=lambda s: int(s.slice_id.rsplit("@", 1)[1]))
        )

    def _host_short(self, demand: Demand) -> _NoFit | None:
        cpu, memory = self.host_need(demand)
        u = self._host
        cpu_free = self.cpu_total_milli - u[0] - u[1]
        memory_free = self.memory_total_bytes - u[2] - u[3]
        if cpu > cpu_free:
            return _NoFit(
                f"host CPU: needs {cpu} milli-cores, {cpu_free} of {self.cpu_total_milli} free",
                cpu <= self.cpu_total_milli,
            )
        if memory > memory_free:
            return _NoFit(
                f"host memory: needs {memory} bytes, {memory_free} of "
                f"{self.memory_total_bytes} free",
                memory <= self.memory_total_bytes,
            )
        return None

    def _gradient(self, demand: Demand, chosen: Sequence[Slice]) -> float:
        """FGD's score of placing ``demand`` on ``chosen`` (whole or shared GPUs)."""
        assert self._frag is not None
        host = self.host_free()
        node = host_node(self._model, host)
        where = tuple(self._gpus.index(s) for s in chosen)
        delta = fgd_delta_milli(node, demand_pod(demand, host), where, self._frag)
        return placement_score(node, delta, self._frag.slicing)

    def _uses_fragmentation(self, candidates: Sequence[Slice]) -> bool:
        return self._frag is not None and bool(self._model) and bool(candidates)

    def _fit_whole(
        self, demand: Demand, candidates: list[Slice], model_note: str, idle: list[MigGpu]
    ) -> _Fit | _NoFit:
        kinds = (SliceKind.WHOLE_GPU, SliceKind.SHARED_GPU)
        gpus = [s for s in candidates if s.kind in kinds]
        capable = [s for s in gpus if s.memory_total_bytes >= demand.gpu_memory_bytes]
        # MIG-on-demand GPUs hold a whole-GPU member as one full-GPU instance.
        mig_capable = [
            gpu
            for gpu in self._on_demand.values()
            if (not demand.gpu_model or gpu.model == demand.gpu_model)
            and _full_profile(gpu).memory_bytes >= demand.gpu_memory_bytes
        ]
        if len(capable) + len(mig_capable) < demand.gpus:
            mem = f" with >= {demand.gpu_memory_bytes} bytes" if demand.gpu_memory_bytes > 0 else ""
            return _NoFit(
                f"needs {demand.gpus} whole{model_note} GPUs{mem}, "
                f"host has {len(capable) + len(mig_capable)} "
                f"(of {len(gpus) + len(self._on_demand)} GPUs)",
                False,
            )
        free = [s for s in capable if self._unused(s)]
        if len(free) < demand.gpus:
            usable = [gpu for gpu in idle if gpu in mig_capable]
            if len(free) + len(usable) < demand.gpus:
                return _NoFit(
                    f"no {demand.gpus} free whole{model_note} GPUs "
                    f"({len(free) + len(usable)} of {len(capable) + len(mig_capable)} free)",
                    True,
                )
            planned = [
                self._plan(gpu, _full_profile(gpu).name)
                for gpu in usable[: demand.gpus - len(free)]
            ]
            allocations = (
                *(Allocation(s.slice_id, s.capacity_milli, s.memory_total_bytes) for s in free),
                *planned,
            )
            # Taking a whole MIG GPU removes its instances: rank it below plain GPUs.
            return tuple(sorted(allocations, key=lambda a: a.slice_id)), 0.25

        def slice_score(s: Slice) -> float:
            kind = 1.0 if s.kind is SliceKind.WHOLE_GPU else 0.5
            return 0.5 * kind + 0.5 * _memory_fit(demand.gpu_memory_bytes, s.memory_total_bytes)

        ranked = sorted(free, key=lambda s: (-slice_score(s), s.slice_id))[: demand.gpus]
        chosen = sorted(ranked, key=lambda s: s.slice_id)
        allocations = tuple(
            Allocation(s.slice_id, s.capacity_milli, s.memory_total_bytes) for s in chosen
        )
        if self._uses_fragmentation(chosen):
            return allocations, self._gradient(demand, chosen)
        return allocations, sum(slice_score(s) for s in chosen) / len(chosen)

    def _fit_mig(
        self, demand: Demand, candidates: list[Slice], model_note: str, idle: list[MigGpu]
    ) -> _Fit | _NoFit:
        found = self._fit_mig_slice(demand, candidates, model_note)
        if not isinstance(found, _NoFit):
            return found
        profile = demand.mig_profile

        def holds(gpu: MigGpu) -> bool:
            entry = gpu.table.get(profile)
            return entry is not None and entry.memory_bytes >= demand.gpu_memory_bytes

        usable = [gpu for gpu in idle if holds(gpu)]
        if not usable:
            if not found.retryable and any(
                holds(gpu) and (not demand.gpu_model or gpu.model == demand.gpu_model)
                for gpu in self._on_demand.values()
            ):
                return _NoFit(
                    f"no free{model_note} {profile} slice, and every MIG GPU that could be "
                    "repartitioned for it is in use",
                    True,
                )
            return found
        # A GPU with no instances loses nothing to the new layout: take those first.
        gpu = min(usable, key=lambda g: (bool(self._instances(g.gpu_index)), g.gpu_index))
        allocation = self._plan(gpu, profile)
        return (allocation,), 0.5 * _memory_fit(demand.gpu_memory_bytes, allocation.memory_bytes)

    def _fit_mig_slice(
        self, demand: Demand, candidates: list[Slice], model_note: str
    ) -> _Fit | _NoFit:
        profile = demand.mig_profile
        migs = [s for s in candidates if s.kind is SliceKind.MIG and s.mig_profile == profile]
        if not migs:
            return _NoFit(f"no{model_note} {profile} slice on this host", False)
        capable = [s for s in migs if s.memory_total_bytes >= demand.gpu_memory_bytes]
        if not capable:
            largest = max(s.memory_total_bytes for s in migs)
            return _NoFit(
                f"gpu_memory_bytes {demand.gpu_memory_bytes} exceeds every {profile} slice "
                f"(largest {largest})",
                False,
            )
        free = [s for s in capable if self._unused(s)]
        if not free:
            return _NoFit(f"no free{model_note} {profile} slice (0 of {len(capable)} free)", True)

        def slice_score(s: Slice) -> float:
            siblings = [
                o
                for o in self.slices.values()
                if o.kind is SliceKind.MIG and o.gpu_index == s.gpu_index and o is not s
            ]
            used = sum(1 for o in siblings if not self._unused(o))
            packing = used / len(siblings) if siblings else 1.0
            return 0.5 * _memory_fit(demand.gpu_memory_bytes, s.memory_total_bytes) + 0.5 * packing

        best = min(free, key=lambda s: (-slice_score(s), s.slice_id))
        return (Allocation(best.slice_id, best.capacity_milli, best.memory_total_bytes),), (
            slice_score(best)
        )

    def _fit_share(self, demand: Demand, candidates: list[Slice], model_note: str) -> _Fit | _NoFit:
        shared = [s for s in candidates if s.kind is SliceKind.SHARED_GPU]
        if not shared:
            return _NoFit(f"no shared{model_note} GPU on this host", False)
        capable = [
            s
            for s in shared
            if s.capacity_milli >= demand.gpu_milli
            and s.memory_total_bytes >= demand.gpu_memory_bytes
        ]
        if not capable:
            return _NoFit(
                f"gpu_milli {demand.gpu_milli} / gpu_memory_bytes {demand.gpu_memory_bytes} "
                f"exceeds every shared{model_note} GPU "
                f"(largest {max(s.memory_total_bytes for s in shared)} bytes)",
                False,
            )
        fitting: list[tuple[float, Slice]] = []
        best_milli = best_memory = 0
        for s in capable:
            free_milli, free_memory = self._free(s)
            best_milli = max(best_milli, free_milli)
            best_memory = max(best_memory, free_memory)
            if free_milli >= demand.gpu_milli and free_memory >= demand.gpu_memory_bytes:
                left_milli = (free_milli - demand.gpu_milli) / s.capacity_milli
                left_memory = (
                    (free_memory - demand.gpu_memory_bytes) / s.memory_total_bytes
                    if s.memory_total_bytes > 0
                    else 0.0
                )
                fitting.append((1.0 - (left_milli + left_memory) / 2.0, s))
        if not fitting:
            return _NoFit(
                f"no shared{model_note} GPU with {demand.gpu_milli} milli and "
                f"{demand.gpu_memory_bytes} bytes free (most free: {best_milli} milli, "
                f"{best_memory} bytes; 0 of {len(capable)} fit)",
                True,
            )
        if self._uses_fragmentation([s for _, s in fitting]):
            # FGD: the GPU where the share strands least of what the workload could use.
            fitting = [(self._gradient(demand, [s]), s) for _, s in fitting]
        score, best = min(fitting, key=lambda pair: (-pair[0], pair[1].slice_id))
        return (Allocation(best.slice_id, demand.gpu_milli, demand.gpu_memory_bytes),), score

    # --------------------------------------------------------------- mutations

    def _add(self, lease: LeaseRecord, sign: int) -> None:
        self._version += 1
        offset = 0 if lease.committed else 1
        self._pending += offset * sign
        for a in lease.allocations:
            u = self._usage[a.slice_id]
            u[offset] += sign * a.milli
            u[offset + 2] += sign * a.memory_bytes
        self._host[offset] += sign * lease.cpu_milli
        self._host[offset + 2] += sign * lease.host_memory_bytes

    def _new_lease_id(self) -> str:
        while True:
            lease_id = f"{self._lease_prefix}l-{self._lease_ids()}"
            if lease_id not in self._leases:
                return lease_id

    def arbitrate(
        self, probes: Sequence[ProbeOrder], now: float, refusal: Refusal | None = None
    ) -> list[Granted | Bounced]:
        """Settle a batch: expire first, then grant in (priority, -value, arrival_seq) order.

        Results come back in input order. Invalid probes bounce (not retryable)
        rather than failing the whole batch. A slice ``refusal`` refuses for a probe's
        demand is left out of its choice (:meth:`_fit_admitted`).
        """
        self.expire(now)
        results: list[Granted | Bounced | None] = [None] * len(probes)
        order = sorted(
            range(len(probes)),
            key=lambda i: (probes[i].priority, -probes[i].value, probes[i].arrival_seq, i),
        )
        for i in order:
            probe = probes[i]
            results[i] = self._settle(probe, now, refusal)
        return [r for r in results if r is not None]

    def _settle(self, probe: ProbeOrder, now: float, refusal: Refusal | None) -> Granted | Bounced:
        if not PRIORITY_MIN <= probe.priority <= PRIORITY_MAX:
            return Bounced(
                probe.probe_id,
                f"priority: must be in {PRIORITY_MIN}..{PRIORITY_MAX}, got {probe.priority}",
                False,
            )
        if not (math.isfinite(probe.ttl_seconds) and probe.ttl_seconds > 0):
            return Bounced(
                probe.probe_id, f"ttl_seconds: must be > 0, got {probe.ttl_seconds}", False
            )
        if not math.isfinite(probe.value):
            return Bounced(probe.probe_id, f"value: must be finite, got {probe.value}", False)
        try:
            result = self._fit_admitted(probe, refusal)
        except InvalidArgument as exc:
            return Bounced(probe.probe_id, exc.message, False)
        if isinstance(result, _NoFit):
            return Bounced(probe.probe_id, result.reason, result.retryable)
        allocations, score = result
        self._apply_plan()
        cpu, memory = self.host_need(probe.demand)
        lease = LeaseRecord(
            lease_id=self._new_lease_id(),
            job_id=probe.job_id,
            member=probe.member,
            allocations=allocations,
            score=score,
            expires_at=now + probe.ttl_seconds,
            priority=probe.priority,
            subjob_id=probe.subjob_id,
            caller=probe.caller,
            cpu_milli=cpu,
            host_memory_bytes=memory,
        )
        self._leases[lease.lease_id] = lease
        self._add(lease, +1)
        heapq.heappush(self._expiries, (lease.expires_at, lease.lease_id))
        return Granted(probe.probe_id, lease)

    def _fit_admitted(self, probe: ProbeOrder, refusal: Refusal | None) -> _Fit | _NoFit:
        """The probe's fit among the slices ``refusal`` admits for its demand (asked one
        slice at a time): a host with a refused GPU beside one that is not places on the
        latter. Where no admitted choice exists, the choice the ledger would make without
        ``refusal`` bounces, retryable, for the reason ``refusal`` gives for its first
        refused slice; a probe the ledger could not place anyway keeps the ledger's own
        reason. A refusal is not counted against the ledger's room, and a choice that
        creates a MIG instance is checked by the instance's name once chosen."""
        demand = probe.demand
        if refusal is None:
            return self._fit(demand, probe.slice_id, probe.owner)
        verdicts: dict[str, str] = {}

        def why(slice_id: str) -> str:
            verdict = verdicts.get(slice_id)
            if verdict is None:
                verdict = verdicts[slice_id] = refusal(demand, (slice_id,))
            return verdict

        def refused(found: _Fit) -> str:
            return next((w for a in found[0] if (w := why(a.slice_id))), "")

        if demand.family != "cpu":
            ids = [probe.slice_id] if probe.slice_id in self.slices else list(self.slices)
            if any(why(i) for i in ids) and (self._on_demand or not all(why(i) for i in ids)):
                found = self._fit(demand, probe.slice_id, probe.owner, lambda i: not why(i))
                if not isinstance(found, _NoFit) and not refused(found):
                    return found
        found = self._fit(demand, probe.slice_id, probe.owner)
        if isinstance(found, _NoFit):
            return found
        reason = refused(found)
        if reason:
            self._planned = []
            return _NoFit(reason, True)
        return found

    def commit(self, lease_id: str, subjob_id: str, now: float, caller: str = "") -> LeaseRecord:
        """Turn a lease into a committed one (never expires); Aborted if it already lapsed.

        Only the identity the lease was issued to (``caller`` at probe time) may commit it.
        """
        lease = self._leases.get(lease_id)
        if lease is None:
            raise NotFound(f"unknown lease {lease_id!r}", field="lease_id")
        if lease.caller != caller:
            raise PermissionDenied(
                f"lease {lease_id!r} was issued to {lease.caller or 'an anonymous caller'!r}, "
                f"not to {caller or 'an anonymous caller'!r}",
                field="lease_id",
            )
        if lease.committed:
            if lease.subjob_id == subjob_id:
                return lease
            raise FailedPrecondition(
                f"lease {lease_id!r} already committed to subjob {lease.subjob_id!r}",
                field="lease_id",
            )
        if lease.expires_at <= now:
            self.release(lease_id)
            raise Aborted(
                f"lease {lease_id!r} expired {now - lease.expires_at:.3f} s ago", field="lease_id"
            )
        self._add(lease, -1)
        lease.committed = True
        lease.subjob_id = subjob_id
        lease.expires_at = math.inf
        self._add(lease, +1)
        return lease

    def release(self, lease_id: str) -> LeaseRecord | None:
        """Free a lease's capacity, leased or committed; None if it is unknown."""
        lease = self._leases.pop(lease_id, None)
        if lease is not None:
            self._add(lease, -1)
        return lease

    def expire(self, now: float) -> list[LeaseRecord]:
        """Drop uncommitted leases (and reservations) whose deadline is at or before ``now``."""
        for sid in [sid for sid, (_, until) in self._reserved.items() if until <= now]:
            del self._reserved[sid]
            self._version += 1
        expiries = self._expiries
        if not expiries or expiries[0][0] > now:
            return []
        lapsed: list[LeaseRecord] = []
        while expiries and expiries[0][0] <= now:
            _, lease_id = heapq.heappop(expiries)
            lease = self._leases.get(lease_id)
            if lease is not None and not lease.committed and lease.expires_at <= now:
                lapsed.append(lease)
        lapsed.sort(key=lambda lease: lease.lease_id)
        for lease in lapsed:
            self.release(lease.lease_id)
        return lapsed

    def adopt(
        self,
        lease_id: str,
        job_id: str,
        member: int,
        subjob_id: str,
        allocations: Sequence[Allocation],
        priority: int,
        cpu_milli: int = 0,
        host_memory_bytes: int = 0,
    ) -> LeaseRecord:
        """Re-adopt a running subjob's committed lease after an agent restart (with the host
        CPU and memory it held, where the journal kept them)."""
        if lease_id in self._leases:
            raise AlreadyExists(f"lease {lease_id!r} already held", field="lease_id")
        need: dict[str, list[int]] = {}
        for a in allocations:
            if a.slice_id not in self.slices:
                raise FailedPrecondition(
                    f"slice {a.slice_id!r} no longer exists on this host", field="allocations"
                )
            if a.milli < 0 or a.memory_bytes < 0:
                raise InvalidArgument(
                    f"negative allocation on {a.slice_id!r}: {a.milli} milli, "
                    f"{a.memory_bytes} bytes",
                    field="allocations",
                )
            n = need.setdefault(a.slice_id, [0, 0])
            n[0] += a.milli
            n[1] += a.memory_bytes
        for sid, (milli, memory) in need.items():
            s = self.slices[sid]
            free_milli, free_memory = self._free(s)
            if milli > free_milli or memory > free_memory:
                raise FailedPrecondition(
                    f"slice {sid!r} cannot hold {milli} milli / {memory} bytes "
                    f"({free_milli} milli / {free_memory} bytes free)",
                    field="allocations",
                )
        u = self._host
        if cpu_milli < 0 or host_memory_bytes < 0:
            raise InvalidArgument(
                f"negative host share: {cpu_milli} milli-cores, {host_memory_bytes} bytes",
                field="allocations",
            )
        if (self.cpu_total_milli and cpu_milli > self.cpu_total_milli - u[0] - u[1]) or (
            self.memory_total_bytes and host_memory_bytes > self.memory_total_bytes - u[2] - u[3]
        ):
            raise FailedPrecondition(
                f"host cannot hold {cpu_milli} milli-cores / {host_memory_bytes} bytes",
                field="allocations",
            )
        lease = replace(
            LeaseRecord(
                lease_id=lease_id,
                job_id=job_id,
                member=member,
                allocations=tuple(allocations),
                score=1.0,
                expires_at=math.inf,
                priority=priority,
                cpu_milli=cpu_milli if self.cpu_total_milli else 0,
                host_memory_bytes=host_memory_bytes if self.memory_total_bytes else 0,
            ),
            committed=True,
            subjob_id=subjob_id,
        )
        self._leases[lease_id] = lease
        self._add(lease, +1)
        return lease

    # --------------------------------------------------------------- checking

    def check_invariant(self) -> None:
        """Raise AssertionError if bookkeeping drifted or any slice is over capacity."""
        expected: dict[str, list[int]] = {sid: [0, 0, 0, 0] for sid in self.slices}
        host = [0, 0, 0, 0]
        for lease in self._leases.values():
            offset = 0 if lease.committed else 1
            host[offset] += lease.cpu_milli
            host[offset + 2] += lease.host_memory_bytes
            for a in lease.allocations:
                expected[a.slice_id][offset] += a.milli
                expected[a.slice_id][offset + 2] += a.memory_bytes
        for sid, s in self.slices.items():
            u = self._usage[sid]
            if u != expected[sid]:
                raise AssertionError(f"slice {sid}: counters {u} != sum of leases {expected[sid]}")
            if u[0] + u[1] > s.capacity_milli:
                raise AssertionError(
                    f"slice {sid}: {u[0] + u[1]} milli used > capacity {s.capacity_milli}"
                )
            if u[2] + u[3] > s.memory_total_bytes:
                raise AssertionError(
                    f"slice {sid}: {u[2] + u[3]} bytes used > memory {s.memory_total_bytes}"
                )
            if min(u) < 0:
                raise AssertionError(f"slice {sid}: negative usage {u}")
        if self._host != host:
            raise AssertionError(f"host: counters {self._host} != sum of leases {host}")
        uncommitted = [lease for lease in self._leases.values() if not lease.committed]
        if self._pending != len(uncommitted):
            raise AssertionError(f"{self._pending} leases counted pending, {len(uncommitted)} are")
        due = set(self._expiries)
        for lease in uncommitted:
            if (lease.expires_at, lease.lease_id) not in due:
                raise AssertionError(f"lease {lease.lease_id}: its expiry is not kept")
        for index, gpu in self._on_demand.items():
            layout = self.on_demand_layout(index)
            if layout and not is_legal(gpu.geometry or gpu.model, layout):
                raise AssertionError(f"GPU {index}: illegal MIG layout {layout}")
        if min(host) < 0:
            raise AssertionError(f"host: negative usage {host}")
        if self.shapes() != self._shapes() or self.host_free() != self._host_free():
            raise AssertionError("the summary kept for this state differs from a fresh one")
        if self.cpu_total_milli and host[0] + host[1] > self.cpu_total_milli:
            raise AssertionError(
                f"host: {host[0] + host[1]} milli-cores used > {self.cpu_total_milli}"
            )
        if self.memory_total_bytes and host[2] + host[3] > self.memory_total_bytes:
            raise AssertionError(
                f"host: {host[2] + host[3]} bytes used > memory {self.memory_total_bytes}"
            )
