"""Laminar's decentralized placement in the simulator, made of the daemons' own code.

Nothing here decides anything the daemons do not decide the same way:

* each simulated host is the agent's own decision core, :class:`laminar_agent.core.AgentCore`
  over a real :class:`laminar_agent.ledger.Ledger` (the agent's ground truth and its
  node-local choice of GPU, MIG slice or share): a probe is a batch of one through
  ``AgentCore.arbitrate``, a commit ``AgentCore.commit``, a release ``AgentCore.release``
  and a task's end ``AgentCore.end``, so a subjob's lifecycle is checked as on the agent
  (the journal rows and lease rows it returns are the driver's, and dropped here);
* each zone router is the router's own decision core, :class:`laminar_zone.core.ZoneCore`:
  a pod is submitted to it as a ``zone_pb2.Job`` (``new_entries``, ``admit``, ``route``,
  ``kick``) and placed by its try, :func:`laminar_zone.trying.place_try`, whose requests
  are answered at once over the zone's hosts (:mod:`laminar_sim.zone_driver`); a pod that
  does not place is cancelled (the fill-up protocol queues nothing) and the queue wake
  that follows runs the core's pass (:func:`laminar_zone.trying.pass_steps`);
* each zone router holds a real :class:`laminar_zone.view.ZoneView`, draws candidates
  with :class:`laminar_zone.view.ProbePlan` (a bounded sample, ranked by
  :func:`laminar_zone.placement.fragmentation_rank`, d probes per attempt, redraws,
  attempts) and binds late with :func:`laminar_zone.view.choose_offers`; every probe,
  commit and release reply carries the host's fresh summary (shapes, host CPU, memory and
  per-GPU free share) into the view, as ``Placer.note_summary`` does;
* each router learns its target workload from the tasks it places and, through the zone
  summaries it exchanges, from the tasks its peers place
  (:class:`laminar_base.fragmentation.ObservedWorkload`, optionally from a prior), and its
  agents score and choose GPUs by the same measure (``Ledger.set_fragmentation``); the
  simulator hands a router's current measure to its agents as soon as the router rebuilds
  it, where the daemons' heartbeat replies carry it within a heartbeat period;
* a job enters at a zone drawn at random and is forwarded at most once to the zone
  the router's own flow splitting picks (:func:`laminar_zone.flow.split_flow`, which
  the router's ``PeerRouter`` calls too: weights ``W_z = (1 + S_z) / (1 + H_z)^gamma``),
  with peers' summaries as of their last exchange (:meth:`ZoneView.shape_totals`).

Host CPU and memory, which the fill-up protocol of the FGD paper requires, are the
ledger's own: each host's ledger holds the trace node's CPU and memory as its totals.

Messages are counted as gRPC calls carry them: a probe, commit, release or forward is a
request and a reply (2 messages); summary exchanges between zones are counted apart.
With d = 1 (``ProbeLimits.probes_per_attempt``) a probe carries "commit if it fits", as
the router's does (:class:`laminar_zone.gather.Gather`'s commit on probe): a placement is
then one call.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from laminar_agent.core import KILLED, SUCCEEDED, AgentCore, EndDecision
from laminar_agent.inventory.mig import MIG_PROFILES
from laminar_agent.ledger import (
    Allocation,
    Bounced,
    Granted,
    Ledger,
    ProbeOrder,
    Slice,
    SliceKind,
    counter_ids,
)
from laminar_agent.mig_layout import MigGpu
from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause
from laminar_base.demand import MIG_COMPUTE_SLICES, Demand, HostCap
from laminar_base.errors import InvalidArgument
from laminar_base.fragmentation import (
    MILLI_SLICING,
    FragmentationCache,
    ObservedWorkload,
    PodShape,
    demand_pod,
)
from laminar_sim.zone_driver import (
    CoreHands,
    commit_at_once,
    drive,
    gather_at_once,
    start_on,
    submit,
)
from laminar_zone.config import PlacementSettings
from laminar_zone.core import NewJob, ZoneCore
from laminar_zone.entry import Entry
from laminar_zone.flow import PeerSummary, split_flow
from laminar_zone.placement import ShapeCap
from laminar_zone.trying import (
    Clock,
    CommitMembers,
    DoInstructions,
    GatherLeases,
    OpenRound,
    PassStep,
    RunInstructions,
    StartJob,
    TryStep,
    pass_steps,
    place_try,
)
from laminar_zone.view import ProbeLimits, ProbePlan, ZoneView, fragmentation_ranking

#: Nominal GPU memory of a simulated device (the FGD pod lists declare none).
SIM_GPU_MEMORY_BYTES = 80 * 1024**3
#: The MIG geometry (profile table) of a simulated MIG GPU, whatever its trace model.
SIM_MIG_GEOMETRY = "H100-80GB"
#: Lease TTL of a simulated probe; the commit follows within the same event.
LEASE_TTL_SECONDS = 5.0
#: The router's probe budget of one try (its default).
BUDGET_SECONDS = PlacementSettings().budget_seconds
#: gRPC request + reply.
MESSAGES_PER_CALL = 2
#: The tenant every simulated task is submitted as.
TENANT = "sim"
#: Why the fill-up protocol drops a pod that did not place (it queues nothing).
CANCEL_UNPLACED = "no room: the fill-up protocol drops a pod that does not place"
#: A host that arbitrates no CPU or memory: a task's shape as the router learns it
#: carries the CPU and memory it asks for, not a host's default share.
_NO_HOST = HostCap()


@dataclass(frozen=True)
class Ask:
    """One task as the router sees it (a single member; whole GPUs on one host; host CPU
    and memory in ``need``)."""

    need: Demand
    #: GPU models the task accepts; empty = any.
    gpu_models: tuple[str, ...] = ()


@dataclass
class Counters:
    placements: int = 0
    failures: int = 0
    probes: int = 0
    bounces: int = 0
    commits: int = 0
    releases: int = 0
    forwards: int = 0
    exchange_messages: int = 0
    view_lookups: int = 0

    @property
    def messages(self) -> int:
        calls = self.probes + self.commits + self.releases + self.forwards
        return MESSAGES_PER_CALL * calls

    def per_placement(self) -> dict[str, float]:
        tries = max(1, self.placements + self.failures)
        return {
            "messages_per_placement": round(self.messages / tries, 3),
            "probes_per_placement": round(self.probes / tries, 3),
            "bounces_per_placement": round(self.bounces / tries, 3),
            "forwards_per_placement": round(self.forwards / tries, 3),
            "exchange_messages_per_placement": round(self.exchange_messages / tries, 3),
        }


def _compute_mask(instances: set[tuple[str, int]]) -> int:
    """The compute slices (7-bit mask) MIG ``instances`` (profile, start) take."""
    mask = 0
    for name, start in instances:
        compute = MIG_PROFILES[SIM_MIG_GEOMETRY][name].compute_slices
        mask |= ((1 << compute) - 1) << min(start, MIG_COMPUTE_SLICES - compute)
    return mask


def observed_shape(ask: Ask) -> PodShape:
    """The task's shape as its router learns it (its target workload's unit)."""
    return replace(demand_pod(ask.need, _NO_HOST), gpu_models=ask.gpu_models)


class SimHost:
    """One agent: its decision core over the real ledger of its GPUs and the host's CPU and
    memory."""

    def __init__(
        self,
        agent_id: str,
        model: str,
        num_gpu: int,
        cpu_milli: int,
        memory_mib: int,
        *,
        mig: bool = False,
    ) -> None:
        """``mig``: the GPUs are MIG GPUs of :data:`SIM_MIG_GEOMETRY` that the agent
        repartitions on demand while idle; otherwise GPUs shared by milli."""
        self.agent_id = agent_id
        self.model = model
        slices = [
            Slice(
                slice_id=f"gpu{i}",
                kind=SliceKind.SHARED_GPU,
                gpu_index=i,
                device_uuid=f"{agent_id}-gpu{i}",
                gpu_model=model,
                memory_total_bytes=SIM_GPU_MEMORY_BYTES,
            )
            for i in range(num_gpu)
        ]
        on_demand = [
            MigGpu(i, model, f"{agent_id}-gpu{i}", geometry=SIM_MIG_GEOMETRY)
            for i in range(num_gpu)
        ]
        self.num_gpu = num_gpu
        self.core = AgentCore(
            Ledger(
                [] if mig else slices,
                lease_prefix=f"{agent_id}-",
                lease_ids=counter_ids(),
                cpu_total_milli=cpu_milli,
                memory_total_bytes=memory_mib << 20,
                mig_on_demand=on_demand if mig else (),
            )
        )
        self._seq = 0

    @property
    def ledger(self) -> Ledger:
        """The core's ledger, for what the agent's summary reads from it."""
        return self.core.ledger

    def shapes(self) -> dict[str, ShapeCap]:
        """The summary the agent would send (``AgentSummary.shapes``)."""
        return {
            s.shape: ShapeCap(s.free, s.total, s.max_free_milli, s.max_free_memory_bytes)
            for s in self.ledger.shapes()
        }

    def probe(self, ask: Ask, now: float) -> Granted | Bounced:
        """A batch of one probe, arbitrated by the agent's core."""
        self._seq += 1
        order = ProbeOrder(
            probe_id=str(self._seq),
            job_id="sim",
            member=0,
            demand=ask.need,
            priority=3,
            value=0.0,
            arrival_seq=self._seq,
            ttl_seconds=LEASE_TTL_SECONDS,
        )
        return self.core.arbitrate([order], now, now)[0][0]

    def arbitrate(self, orders: list[ProbeOrder], now: float) -> list[Granted | Bounced]:
        """A batch of probes (a gang's members on this host), arbitrated by the agent's core."""
        return self.core.arbitrate(orders, now, now)[0]

    def commit(self, lease_id: str, subjob_id: str, now: float) -> tuple[int, ...]:
        """Commit the lease to a new subjob; the GPU indexes it holds."""
        self.core.commit(
            lease_id,
            subjob_id,
            "sim",
            caller="",
            priority=0,
            lifecycle=common_pb2.LONG,
            now=now,
            now_unix=now,
        )
        lease = self.ledger.lease(lease_id)
        assert lease is not None
        return tuple(self.ledger.slices[a.slice_id].gpu_index for a in lease.allocations)

    def allocations(self, subjob_id: str) -> tuple[Allocation, ...]:
        """What a live subjob holds (its committed lease's allocations)."""
        live = self.core.subjob(subjob_id)
        lease = self.ledger.lease(live.lease_id) if live is not None else None
        if lease is None:
            raise KeyError(f"no live subjob {subjob_id} on {self.agent_id}")
        return tuple(lease.allocations)

    def mig_left(self) -> tuple[int, ...]:
        """Per GPU, the compute slices (a 7-bit mask) free for new work: all of an idle
        GPU (it may take any layout); of a busy one, all but its instances in use where the
        ledger carves busy GPUs, else its unused instances'."""
        full = (1 << MIG_COMPUTE_SLICES) - 1
        left = []
        for index in range(self.num_gpu):
            layout = {(name, start) for name, start, _ in self.ledger.on_demand_layout(index)}
            unused = {
                (name, start)
                for name, start in layout
                if self.ledger.usage(f"gpu{index}/{name}@{start}") == (0, 0, 0, 0)
            }
            if unused == layout:
                left.append(full)
            elif self.ledger.mig_carve_busy:  # all but the instances in use may be carved
                left.append(full & ~_compute_mask(layout - unused))
            else:
                left.append(_compute_mask(unused))
        return tuple(left)

    def release(self, lease_id: str) -> None:
        """Give back an uncommitted lease (the router's Release)."""
        self.core.release([lease_id], "")

    def end(self, subjob_id: str, now: float, *, dropped: bool = False) -> None:
        """The subjob's process ended (``dropped``: stopped before it ran, past its deadline);
        its capacity returns as the agent returns it."""
        decision = (
            EndDecision(KILLED, EndCause.TERMINATED, "dropped past its deadline")
            if dropped
            else EndDecision(SUCCEEDED, EndCause.EXITED, "exited 0")
        )
        self.core.end(subjob_id, decision, now)


@dataclass
class SimZone:
    name: str
    hosts: dict[str, SimHost]
    view: ZoneView
    #: Peers' zone summaries as of the last exchange: zone name -> (shapes, heat).
    peer_shapes: dict[str, tuple[dict[str, ShapeCap], float]] = field(default_factory=dict)
    #: This zone's own totals as of its last exchange (the router caches them too).
    local_shapes: dict[str, ShapeCap] = field(default_factory=dict)
    #: Placement tries under way at this router (the ``in_flight`` of its Placer).
    in_flight: int = 0
    #: The target workload this router learned from the tasks it placed.
    workload: ObservedWorkload = field(default_factory=lambda: ObservedWorkload(MILLI_SLICING))
    #: The measure its agents score by (the last one handed to them).
    agents_frag: FragmentationCache | None = None
    #: The router's decision core over its view (jobs, tries, queue passes).
    core: ZoneCore = field(init=False)

    def __post_init__(self) -> None:
        self.core = ZoneCore(self.view, {}, may_forward=False)

    def note(self, host: SimHost) -> None:
        """A reply's fresh summary folded into the view (not a heartbeat): its heat is the
        host's leases not yet committed, as an agent's summary reports them."""
        self.view.update(
            host.agent_id,
            "",
            host.shapes(),
            heat=host.ledger.pending_leases(),
            draining=False,
            now=0.0,
            is_heartbeat=False,
            host=host.ledger.host_free(),
        )

    def observe(self, ask: Ask) -> FragmentationCache | None:
        """Learn the task's shape; the measure the router ranks it by (None before the
        router has seen any task, or during its wait for one: ``ObservedWorkload.cache``),
        while the zone's agents score by the current measure, as a live router's do."""
        shape = observed_shape(ask)
        self.workload.observe(shape)
        frag = self.workload.cache(shape)
        agents = self.workload.cache()
        if agents is not self.agents_frag:
            for host in self.hosts.values():
                host.ledger.set_fragmentation(agents)
            self.agents_frag = agents
        return frag

    def heat(self) -> float:
        """The zone's heat as its router sends it to peers."""
        return float(self.view.heat() + self.in_flight)


class LaminarCluster:
    """Zones of simulated hosts and their routers; :meth:`place` runs one placement."""

    def __init__(
        self,
        hosts: list[SimHost],
        *,
        zone_hosts: int,
        limits: ProbeLimits,
        gamma: float,
        seed: int,
        exchange_every: int = 100,
        workload_prior: Mapping[PodShape, int] | None = None,
    ) -> None:
        """``workload_prior``: task shapes (as a router observes them, :meth:`SimZone.observe`)
        and counts each router's target workload starts from, as if learned before."""
        self.rng = random.Random(seed)
        self.limits = limits
        self.gamma = gamma
        self.exchange_every = max(1, exchange_every)
        self.counters = Counters()
        self.zones: list[SimZone] = []
        self.host_index = {h.agent_id: i for i, h in enumerate(hosts)}
        for first in range(0, len(hosts), max(1, zone_hosts)):
            members = hosts[first : first + zone_hosts]
            view = ZoneView(1e18, order_salt=self.rng.getrandbits(32))
            zone = SimZone(f"z{len(self.zones)}", {h.agent_id: h for h in members}, view)
            zone.workload.add_prior(workload_prior or {})
            for host in members:
                zone.view.update(
                    host.agent_id,
                    "",
                    host.shapes(),
                    heat=0,
                    draining=False,
                    now=0.0,
                    host=host.ledger.host_free(),
                )
            self.zones.append(zone)
        self._since_exchange = 0
        self._jobs = 0
        #: Ids of the probes the routers send (the agents' ProbeOrder ids).
        self.probe_ids = itertools.count()
        self.exchange()

    def exchange(self) -> None:
        """Every zone learns every other zone's summary (ExchangeSummary, both ways): free
        capacity and heat for flow splitting, and the task shapes it observed, which join
        the target workload (``ObservedWorkload.note_peer``)."""
        totals = {z.name: (z.view.shape_totals()[1], z.heat()) for z in self.zones}
        for zone in self.zones:
            zone.peer_shapes = {name: t for name, t in totals.items() if name != zone.name}
            zone.local_shapes = totals[zone.name][0]
            for peer in self.zones:
                if peer is not zone:  # the summary carries the peer's own observed shapes
                    zone.workload.note_peer(peer.name, peer.workload.own)
        pairs = len(self.zones) * (len(self.zones) - 1)
        self.counters.exchange_messages += MESSAGES_PER_CALL * pairs  # each zone calls each peer
        self._since_exchange = 0

    def _needs(self, ask: Ask) -> list[Ask]:
        """A task accepting several GPU models is tried as one ask per model."""
        if not ask.gpu_models or ask.need.family == "cpu":
            return [ask]
        return [
            Ask(
                Demand(
                    gpus=ask.need.gpus,
                    gpu_milli=ask.need.gpu_milli,
                    gpu_memory_bytes=ask.need.gpu_memory_bytes,
                    gpu_model=model,
                    cpu_milli=ask.need.cpu_milli,
                    host_memory_bytes=ask.need.host_memory_bytes,
                )
            )
            for model in ask.gpu_models
        ]

    def route(self, entry: SimZone, ask: Ask) -> SimZone:
        """Flow splitting at the entry zone: keep the job or forward it once."""
        if len(self.zones) == 1:
            return entry
        # Summaries as of the last exchange, which no simulated one outlives: none is stale.
        peers = [
            PeerSummary(name, shapes, heat, 0.0)
            for name, (shapes, heat) in sorted(entry.peer_shapes.items())
        ]
        split = split_flow(
            ask.need,
            (entry.name, entry.local_shapes, entry.heat()),
            peers,
            gamma=self.gamma,
            fresh_for_seconds=math.inf,
            rng=self.rng,
        )
        if split.is_local:
            return entry
        self.counters.forwards += 1
        return next(z for z in self.zones if z.name == split.target)

    def place(self, ask: Ask, now: float = 0.0) -> tuple[int, tuple[int, ...]] | None:
        """Place one task: (host index, GPU indexes), or None when the routers found no room."""
        self._since_exchange += 1
        if self._since_exchange >= self.exchange_every:
            self.exchange()
        zone = self.route(self.rng.choice(self.zones), ask)
        frag = zone.observe(ask)
        plans = [(one, self._plan(zone, one, frag)) for one in self._needs(ask)]
        if len(plans) > 1:
            # A task accepting several models: the model whose best candidate ranks best is
            # tried first (equal ranks: the candidate first in the view's host order), as a
            # centralized FGD takes the best node over all the models the task accepts.
            plans.sort(key=lambda pair: _best_candidate(zone.view, pair[1]))
        for one, plan in plans:
            placed = self._place_in(zone, one, now, plan)
            if placed is not None:
                self.counters.placements += 1
                return placed
        self.counters.failures += 1
        return None

    def _plan(self, zone: SimZone, ask: Ask, frag: FragmentationCache | None) -> ProbePlan:
        rank = fragmentation_ranking(ask.need, frag)
        return ProbePlan(zone.view, ask.need, self.limits.for_try(ask.need, 1), self.rng, rank=rank)

    def _place_in(
        self, zone: SimZone, ask: Ask, now: float, plan: ProbePlan
    ) -> tuple[int, tuple[int, ...]] | None:
        """One pod through its zone's router core: submitted, routed and kicked into a
        placement try (:func:`laminar_zone.trying.place_try`), its gather over ``plan``. A
        pod that does not place is cancelled, as the fill-up protocol queues nothing, and
        the queue wake that follows runs the core's pass (which then finds nothing waiting
        and unblocks the family)."""
        core = zone.core
        self._jobs += 1
        spec = zone_pb2.JobSpec(
            command=["pod"],
            tenant=TENANT,
            resources=common_pb2.Resources(gpus=ask.need.gpus),
            priority=common_pb2.BATCH,
        )
        router = _Router(self, zone, plan, now)
        try:
            entry = submit(
                core, spec, ask.need, NewJob(f"p{self._jobs}", zone.name), now, router.carry_out
            )
        except InvalidArgument:
            return None  # no host of the zone was ever that large: the router refuses it
        placed = None
        if entry.job.state == zone_pb2.JOB_RUNNING:
            (member,) = entry.current()
            host = zone.hosts[member.agent_id]
            slices = host.ledger.slices
            gpus = tuple(slices[a.slice_id].gpu_index for a in host.allocations(member.subjob_id))
            placed = self.host_index[host.agent_id], gpus
            # A pod of the fill-up protocol never ends and nothing asks for it again: its
            # record leaves the core now rather than at an end report that never comes
            # (it only counted into the one tenant's usage, which orders nothing here).
            core.drop(entry.job.job_id)
        else:
            router.carry_out(core.cancel(entry.job, CANCEL_UNPLACED, now))
        router.pass_if_woken()
        return placed


class _Router:
    """The zone router's driver for one pod: carries out its core's instructions and
    answers the requests of its placement try and queue pass at once, over the zone's
    hosts (:mod:`laminar_sim.zone_driver`)."""

    def __init__(self, cluster: LaminarCluster, zone: SimZone, plan: ProbePlan, now: float) -> None:
        self.cluster = cluster
        self.zone = zone
        self.plan = plan
        self.now = now
        self.clock = Clock(mono=lambda: now, unix=lambda: now)
        self.woken = False
        self.carry_out = CoreHands(zone.core, "sim fgd", place=self.place, wake=self.wake).carry_out

    def wake(self) -> None:
        """The queue's wake: a pass once the pod's try is over (:meth:`pass_if_woken`)."""
        self.woken = True

    def place(self, entry: Entry, from_queue: bool) -> bool:
        steps = place_try(
            self.zone.core,
            entry,
            from_queue=from_queue,
            lease_ttl_seconds=LEASE_TTL_SECONDS,
            budget_seconds=BUDGET_SECONDS,
            clock=self.clock,
        )
        return drive(steps, self.answer)

    def answer(self, step: TryStep | PassStep) -> Any:
        counters = self.cluster.counters
        if isinstance(step, (RunInstructions, DoInstructions)):
            self.carry_out(step.instructions)
        elif isinstance(step, GatherLeases):
            gathered = gather_at_once(
                self.zone.core,
                step.entry,
                step.plan,
                self.plan,
                self.zone.hosts,
                now=self.now,
                budget_seconds=BUDGET_SECONDS,
                probe_ids=self.cluster.probe_ids,
                note=self.zone.note,
                start=self.start,
                carry_out=self.carry_out,
                released=self.released,
            )
            counters.probes += gathered.probes
            counters.view_lookups += gathered.probes
            counters.bounces += gathered.bounces
            return gathered
        elif isinstance(step, CommitMembers):
            counters.commits += len(step.placements)
            answers = commit_at_once(step.placements, step.leases, self.start, self.now)
            for _, (host, _) in zip(step.placements, step.leases, strict=True):
                self.zone.note(host)
            return answers
        elif isinstance(step, OpenRound):
            return None  # no atomized work here: no clearing round
        elif isinstance(step, StartJob):
            raise AssertionError("the fill-up protocol queues nothing")
        return None

    def start(
        self, host: SimHost, lease_id: str, placement: zone_pb2.Placement, ids: tuple[str, ...]
    ) -> common_pb2.Subjob:
        return start_on(host, lease_id, placement, ids, self.now)

    def released(self, host: SimHost) -> None:
        self.cluster.counters.releases += 1

    def pass_if_woken(self) -> None:
        """The router's queue wake: one pass (:func:`laminar_zone.trying.pass_steps`)."""
        if not self.woken:
            return
        self.woken = False
        steps = pass_steps(
            self.zone.core, shares={}, backfill=True, rng=self.cluster.rng, clock=self.clock
        )
        drive(steps, self.answer)


def _best_candidate(view: ZoneView, plan: ProbePlan) -> tuple[float, int]:
    """Sort key of a plan by its first candidate: best rank first, then host order; a plan
    with no candidate last."""
    if not plan.sample:
        return (float("inf"), 0)
    first = plan.sample[0]
    score = plan.rank(first) if plan.rank is not None else None
    return (-(score if score is not None else 0.0), view.order_of(first.agent_id))
