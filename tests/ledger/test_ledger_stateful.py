"""Random interleavings of probes, commits, releases and expiry never over-commit a slice."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from laminar_agent.errors import Aborted
from laminar_agent.ledger import Bounced, Demand, Granted, Ledger, ProbeOrder, Slice, SliceKind

GIB = 1 << 30

SLICES = [
    Slice("gpu0", SliceKind.WHOLE_GPU, 0, "GPU-0", "H100", 80 * GIB),
    Slice("gpu1", SliceKind.SHARED_GPU, 1, "GPU-1", "H100", 80 * GIB),
    Slice("gpu2", SliceKind.SHARED_GPU, 2, "GPU-2", "A10", 24 * GIB),
    Slice("gpu3/mig-3g.40gb@0", SliceKind.MIG, 3, "MIG-0", "A100", 40 * GIB, "3g.40gb"),
    Slice("gpu3/mig-3g.40gb@1", SliceKind.MIG, 3, "MIG-1", "A100", 40 * GIB, "3g.40gb"),
    Slice("gpu3/mig-1g.10gb@2", SliceKind.MIG, 3, "MIG-2", "A100", 10 * GIB, "1g.10gb"),
]

demands = st.one_of(
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

probe_specs = st.tuples(
    demands,
    st.integers(1, 4),
    st.floats(0.0, 10.0),
    st.floats(0.1, 5.0),
    st.sampled_from(["", "", "gpu1", "gpu2", "gpu0"]),
)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger(SLICES, lease_prefix="t-")
        self.now = 0.0
        self.seq = 0
        self.committed: set[str] = set()

    @rule(specs=st.lists(probe_specs, min_size=1, max_size=6))
    def probe_batch(self, specs: list[tuple[Demand, int, float, float, str]]) -> None:
        orders = []
        for demand, priority, value, ttl, slice_id in specs:
            self.seq += 1
            orders.append(
                ProbeOrder(
                    f"p{self.seq}", "job", 0, demand, priority, value, self.seq, ttl, slice_id
                )
            )
        results = self.ledger.arbitrate(orders, self.now)
        assert [r.probe_id for r in results] == [o.probe_id for o in orders]
        for r in results:
            assert isinstance(r, Granted | Bounced)
            if isinstance(r, Granted):
                assert 0.0 <= r.lease.score <= 1.0
                assert r.lease.expires_at > self.now

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
