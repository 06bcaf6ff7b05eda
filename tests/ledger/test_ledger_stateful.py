"""Random interleavings of probes, commits, releases, expiry, reservations and priority
preemption never over-commit a slice or the host's CPU and memory, never place a probe on
a slice reserved for another, and a preemption plan, once its victims are gone, always
lets its probe fit; with and without FGD's fragmentation scoring."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from laminar_agent.ledger import Bounced, Granted, Ledger, ProbeOrder, Slice, SliceKind, counter_ids
from laminar_agent.preemption import HolderFacts, plan_preemption
from laminar_base.demand import Demand
from laminar_base.errors import Aborted, FailedPrecondition, InvalidArgument
from laminar_base.fragmentation import MILLI_SLICING, FragmentationCache, PodShape, TargetWorkload

GIB = 1 << 30

SLICES = [
    Slice("gpu0", SliceKind.WHOLE_GPU, 0, "GPU-0", "H100", 80 * GIB),
    Slice("gpu1", SliceKind.SHARED_GPU, 1, "GPU-1", "H100", 80 * GIB),
    Slice("gpu2", SliceKind.SHARED_GPU, 2, "GPU-2", "A10", 24 * GIB),
    Slice("gpu3/mig-3g.40gb@0", SliceKind.MIG, 3, "MIG-0", "A100", 40 * GIB, "3g.40gb"),
    Slice("gpu3/mig-3g.40gb@1", SliceKind.MIG, 3, "MIG-1", "A100", 40 * GIB, "3g.40gb"),
    Slice("gpu3/mig-1g.10gb@2", SliceKind.MIG, 3, "MIG-2", "A100", 10 * GIB, "1g.10gb"),
]

#: The host's CPU and memory: four GPUs, so a whole GPU's default share is 4 cores, 16 GiB.
HOST_CPU_MILLI = 16_000
HOST_MEMORY_BYTES = 64 * GIB

gpu_demands = st.one_of(
    st.just(Demand()),
    st.builds(
        Demand,
        gpus=st.integers(1, 3),
        gpu_memory_bytes=st.sampled_from([0, 20 * GIB, 60 * GIB]),
        gpu_model=st.sampled_from(["", "H100", "A10"]),
    ),
    st.builds(
        Demand,
        mig_profile=st.sampled_from(["3g.40gb", "1g.10gb", "7g.80gb"]),
        gpu_memory_bytes=st.sampled_from([0, 5 * GIB, 20 * GIB]),
    ),
    st.builds(
        Demand,
        gpu_milli=st.integers(1, 1000),
        gpu_memory_bytes=st.sampled_from([0, GIB, 8 * GIB, 30 * GIB]),
        gpu_model=st.sampled_from(["", "H100", "A10"]),
    ),
)

#: What a member asks of the host: nothing (the default share), a little, most of it, or
#: more than the host has (never fits).
demands = st.builds(
    lambda d, cpu, memory: replace(d, cpu_milli=cpu, host_memory_bytes=memory),
    gpu_demands,
    st.sampled_from([0, 0, 500, 4_000, 12_000, 20_000]),
    st.sampled_from([0, 0, GIB, 16 * GIB, 48 * GIB, 80 * GIB]),
)

#: A small target workload for FGD's scoring: a share, a whole GPU, two whole GPUs.
TARGET = TargetWorkload(
    (PodShape(2_000, 0, 1, 500), PodShape(4_000, 0, 1, 1000), PodShape(8_000, 0, 2, 1000)),
    (0.5, 0.3, 0.2),
)

probe_specs = st.tuples(
    demands,
    st.integers(1, 4),
    st.floats(0.0, 10.0),
    st.floats(0.1, 5.0),
    st.sampled_from(["", "", "gpu1", "gpu2", "gpu0"]),
    st.sampled_from(["", "", "A", "B"]),
)


#: Demands a preemption is likely to be able to serve, so plans with victims are common.
preempt_specs = st.tuples(
    st.sampled_from(
        [
            Demand(gpus=1),
            Demand(gpus=2),
            Demand(gpus=1, gpu_model="H100"),
            Demand(mig_profile="3g.40gb"),
            Demand(mig_profile="1g.10gb"),
            Demand(gpu_milli=500, gpu_memory_bytes=8 * GIB),
            Demand(gpu_milli=300),
            Demand(gpu_milli=100, gpu_memory_bytes=30 * GIB, gpu_model="H100"),
        ]
    ),
    st.integers(1, 3),
    st.floats(0.0, 10.0),
    st.floats(0.1, 5.0),
    st.sampled_from(["", "", "", "gpu1", "gpu0"]),
    st.just(""),
)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger(
            SLICES,
            lease_prefix="t-",
            lease_ids=counter_ids(),
            cpu_total_milli=HOST_CPU_MILLI,
            memory_total_bytes=HOST_MEMORY_BYTES,
        )
        self.now = 0.0
        self.seq = 0
        self.committed: set[str] = set()
        #: Priority class of each committed lease's subjob (what preemption may take).
        self.classes: dict[str, int] = {}

    @rule(specs=st.lists(probe_specs, min_size=1, max_size=6))
    def probe_batch(self, specs: list[tuple[Demand, int, float, float, str, str]]) -> None:
        orders = []
        for demand, priority, value, ttl, slice_id, owner in specs:
            self.seq += 1
            orders.append(
                ProbeOrder(
                    f"p{self.seq}",
                    "job",
                    0,
                    demand,
                    priority,
                    value,
                    self.seq,
                    ttl,
                    slice_id,
                    owner=owner,
                )
            )
        self.ledger.expire(self.now)
        reserved = self.ledger.reservations()
        results = self.ledger.arbitrate(orders, self.now)
        assert [r.probe_id for r in results] == [o.probe_id for o in orders]
        for order, r in zip(orders, results, strict=True):
            assert isinstance(r, Granted | Bounced)
            if isinstance(r, Granted):
                assert 0.0 <= r.lease.score <= 1.0
                assert r.lease.expires_at > self.now
                for a in r.lease.allocations:
                    held = reserved.get(a.slice_id)
                    assert held is None or held[0] == order.owner, (a.slice_id, held, order)

    @rule(spec=st.one_of(probe_specs, preempt_specs), cls=st.integers(1, 4))
    def run_now(self, spec: tuple[Demand, int, float, float, str, str], cls: int) -> None:
        """Probe with commit-if-fits: a running subjob of class ``cls`` if it fits."""
        demand, _, value, ttl, slice_id, owner = spec
        self.seq += 1
        order = ProbeOrder(
            f"p{self.seq}", "job", 0, demand, cls, value, self.seq, ttl, slice_id, owner=owner
        )
        (result,) = self.ledger.arbitrate([order], self.now)
        if isinstance(result, Granted):
            lease = self.ledger.commit(result.lease.lease_id, f"sj-{self.seq}", self.now)
            self.committed.add(lease.lease_id)
            self.classes[lease.lease_id] = cls

    @rule(cls=st.integers(2, 4), data=st.data())
    def fill(self, cls: int, data: st.DataObject) -> None:
        """Commit class-``cls`` work on every free slice (a busy host to preempt from)."""
        for s in SLICES:
            if s.kind is SliceKind.MIG:
                demand = Demand(mig_profile=s.mig_profile)
            elif s.kind is SliceKind.SHARED_GPU and data.draw(st.booleans()):
                demand = Demand(gpu_milli=data.draw(st.integers(100, 1000)))
            else:
                demand = Demand(gpus=1)
            self.run_now((demand, cls, 0.0, 1.0, s.slice_id if not s.mig_profile else "", ""), cls)

    @rule(
        owner=st.sampled_from(["A", "B"]),
        slice_ids=st.sets(st.sampled_from([s.slice_id for s in SLICES]), max_size=3),
        ttl=st.floats(0.1, 5.0),
    )
    def reserve(self, owner: str, slice_ids: set[str], ttl: float) -> None:
        taken = {
            sid
            for sid, (who, until) in self.ledger.reservations().items()
            if who != owner and until > self.now
        }
        self.ledger.expire(self.now)
        if taken & slice_ids:
            with pytest.raises(FailedPrecondition):
                self.ledger.reserve(owner, sorted(slice_ids), self.now + ttl)
        else:
            self.ledger.reserve(owner, sorted(slice_ids), self.now + ttl)

    @rule(owner=st.sampled_from(["A", "B"]))
    def unreserve(self, owner: str) -> None:
        self.ledger.unreserve(owner)
        assert all(who != owner for who, _ in self.ledger.reservations().values())

    @rule(spec=preempt_specs)
    def preempt(self, spec: tuple[Demand, int, float, float, str, str]) -> None:
        """The agent's preemption path: plan, reserve, reclaim the victims, settle."""
        demand, priority, value, ttl, slice_id, _ = spec
        self.ledger.expire(self.now)
        holders = {
            lease.subjob_id: HolderFacts("job", self.classes.get(lease.lease_id, 3), 2, 0.0)
            for lease in self.ledger.leases()
            if lease.committed
        }
        try:
            plan = plan_preemption(
                self.ledger, demand, priority, holders, self.now, slice_id=slice_id, owner="P"
            )
        except InvalidArgument:
            return
        if plan is None or not plan.victims:
            return
        by_subjob = {lease.subjob_id: lease for lease in self.ledger.leases() if lease.committed}
        for victim in plan.victims:
            assert holders[victim].priority > priority  # never equal or higher priority
        self.ledger.reserve("P", plan.slice_ids, self.now + 10.0)
        for victim in plan.victims:
            lease = by_subjob[victim]
            assert self.ledger.release(lease.lease_id) is lease
            self.committed.discard(lease.lease_id)
        self.seq += 1
        order = ProbeOrder(
            f"p{self.seq}", "job", 0, demand, priority, value, self.seq, ttl, slice_id, owner="P"
        )
        (result,) = self.ledger.arbitrate([order], self.now)
        self.ledger.unreserve("P")
        assert isinstance(result, Granted), result

    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        pending = [lease for lease in self.ledger.leases() if not lease.committed]
        if not pending:
            return
        lease = data.draw(st.sampled_from(pending))
        expired = lease.expires_at <= self.now
        if expired:
            with pytest.raises(Aborted):
                self.ledger.commit(lease.lease_id, "sj", self.now)
            assert self.ledger.lease(lease.lease_id) is None
        else:
            self.ledger.commit(lease.lease_id, f"sj-{lease.lease_id}", self.now)
            self.committed.add(lease.lease_id)
            self.classes[lease.lease_id] = data.draw(st.integers(1, 4))

    @rule(data=st.data())
    def release_lease(self, data: st.DataObject) -> None:
        leases = self.ledger.leases()
        if not leases:
            return
        lease = data.draw(st.sampled_from(leases))
        assert self.ledger.release(lease.lease_id) is lease
        self.committed.discard(lease.lease_id)

    @precondition(lambda self: bool(self.committed))
    @rule(data=st.data())
    def subjob_exits(self, data: st.DataObject) -> None:
        lease_id = data.draw(st.sampled_from(sorted(self.committed)))
        released = self.ledger.release(lease_id)
        assert released is not None and released.committed
        self.committed.discard(lease_id)

    @rule(on=st.booleans())
    def score_by_fragmentation(self, on: bool) -> None:
        self.ledger.set_fragmentation(FragmentationCache(TARGET, MILLI_SLICING) if on else None)

    @rule(step=st.floats(0.0, 3.0))
    def advance_time(self, step: float) -> None:
        self.now += step
        for lease in self.ledger.expire(self.now):
            assert not lease.committed
            assert lease.expires_at <= self.now

    @invariant()
    def capacity_never_exceeded(self) -> None:
        self.ledger.check_invariant()

    @invariant()
    def usage_equals_sum_of_live_allocations(self) -> None:
        totals = {sid: [0, 0, 0, 0] for sid in self.ledger.slices}
        for lease in self.ledger.leases():
            offset = 0 if lease.committed else 1
            for a in lease.allocations:
                totals[a.slice_id][offset] += a.milli
                totals[a.slice_id][offset + 2] += a.memory_bytes
        for sid, expected in totals.items():
            assert list(self.ledger.usage(sid)) == expected
        assert self.ledger.pending_leases() == sum(
            1 for lease in self.ledger.leases() if not lease.committed
        )
        assert {lid for lid in self.committed} == {
            lease.lease_id for lease in self.ledger.leases() if lease.committed
        }

    @invariant()
    def host_never_overcommitted(self) -> None:
        cpu = sum(lease.cpu_milli for lease in self.ledger.leases())
        memory = sum(lease.host_memory_bytes for lease in self.ledger.leases())
        host = self.ledger.host_free()
        assert cpu <= HOST_CPU_MILLI and memory <= HOST_MEMORY_BYTES
        assert host.cpu_free_milli == HOST_CPU_MILLI - cpu
        assert host.memory_free_bytes == HOST_MEMORY_BYTES - memory

    @invariant()
    def shapes_consistent(self) -> None:
        for shape in self.ledger.shapes():
            assert 0 <= shape.free <= shape.total
            assert 0 <= shape.max_free_milli <= 1000


LedgerMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedgerMachine = LedgerMachine.TestCase
