"""Preemption planned on the ledger (pure), and slice reservations."""

from __future__ import annotations

import pytest

from laminar_agent.ledger import Bounced, Granted, Ledger, ProbeOrder, Slice, SliceKind
from laminar_agent.preemption import HolderFacts, plan_preemption
from laminar_base.demand import Demand
from laminar_base.errors import FailedPrecondition

GIB = 1 << 30
SLICES = [
    Slice("gpu0", SliceKind.WHOLE_GPU, 0, "GPU-0", "H100", 80 * GIB),
    Slice("gpu1", SliceKind.WHOLE_GPU, 1, "GPU-1", "H100", 80 * GIB),
    Slice("gpu2", SliceKind.SHARED_GPU, 2, "GPU-2", "A100", 40 * GIB),
    Slice("gpu3/3g.40gb@0", SliceKind.MIG, 3, "MIG-0", "A100", 40 * GIB, "3g.40gb"),
]


class Host:
    """A ledger plus the facts the agent would read from its journal."""

    def __init__(self) -> None:
        self.ledger = Ledger(SLICES)
        self.holders: dict[str, HolderFacts] = {}
        self.seq = 0

    def run(self, subjob_id: str, priority: int, demand: Demand, slice_id: str = "") -> None:
        self.seq += 1
        order = ProbeOrder(f"p{self.seq}", "j", 0, demand, priority, 0.0, self.seq, 5.0, slice_id)
        (result,) = self.ledger.arbitrate([order], 0.0)
        assert isinstance(result, Granted), result
        self.ledger.commit(result.lease.lease_id, subjob_id, 0.0)
        self.holders[subjob_id] = HolderFacts(f"job-{subjob_id}", priority, 2, 1000.0)

    def plan(self, demand: Demand, priority: int, slice_id: str = "") -> list[str] | None:
        plan = plan_preemption(
            self.ledger, demand, priority, self.holders, 1100.0, slice_id=slice_id
        )
        return None if plan is None else plan.victims


def test_whole_gpu_takes_the_cheapest_slice_and_only_lower_classes() -> None:
    host = Host()
    host.run("batch", 3, Demand(gpus=1), "gpu0")
    host.run("opp", 4, Demand(gpus=1), "gpu1")
    host.run("share-crit", 1, Demand(gpu_milli=200), "gpu2")
    host.run("mig-prod", 2, Demand(mig_profile="3g.40gb"))
    # Production: the opportunistic GPU goes first, never the critical share or the MIG peer.
    assert host.plan(Demand(gpus=1), 2) == ["opp"]
    assert host.plan(Demand(gpus=2), 2) == ["opp", "batch"]
    assert host.plan(Demand(gpus=3), 2) is None  # gpu2 holds critical work
    assert host.plan(Demand(mig_profile="3g.40gb"), 2) is None  # equal class
    assert host.plan(Demand(mig_profile="3g.40gb"), 1) == ["mig-prod"]
    # Batch can only take opportunistic work; opportunistic takes nothing.
    assert host.plan(Demand(gpus=1), 3) == ["opp"]
    assert host.plan(Demand(gpus=1), 4) is None
    # A pinned slice is respected.
    assert host.plan(Demand(gpus=1), 2, slice_id="gpu0") == ["batch"]


def test_share_preempts_just_enough_milli_and_bytes() -> None:
    host = Host()
    host.run("a", 4, Demand(gpu_milli=300, gpu_memory_bytes=10 * GIB))
    host.run("b", 4, Demand(gpu_milli=300, gpu_memory_bytes=10 * GIB))
    host.run("c", 3, Demand(gpu_milli=300, gpu_memory_bytes=10 * GIB))
    # 900 milli and 30 GiB of 40 used: 400 milli needs one opportunistic share gone.
    victims = host.plan(Demand(gpu_milli=400, gpu_memory_bytes=5 * GIB), 2)
    assert victims is not None and len(victims) == 1 and victims[0] in ("a", "b")
    assert host.plan(Demand(gpu_milli=100), 2) == []  # fits already
    # The whole shared GPU needs the batch share gone too.
    assert sorted(host.plan(Demand(gpus=1, gpu_model="A100"), 2) or []) == ["a", "b", "c"]


def test_leases_and_terminating_subjobs_are_not_victims() -> None:
    host = Host()
    host.run("dying", 4, Demand(gpus=1), "gpu0")
    host.holders["dying"] = HolderFacts("job-dying", 4, 2, 1000.0, is_terminating=True)
    (lease,) = host.ledger.arbitrate(
        [ProbeOrder("x", "j", 0, Demand(gpus=1), 4, 0.0, 99, 5.0, "gpu1")], 0.0
    )
    assert isinstance(lease, Granted)
    assert host.plan(Demand(gpus=1, gpu_model="H100"), 2) is None


def test_reservation_keeps_a_slice_for_its_owner() -> None:
    ledger = Ledger(SLICES)
    ledger.reserve("P", ["gpu0"], expires_at=10.0)
    with pytest.raises(FailedPrecondition):
        ledger.reserve("Q", ["gpu0"], expires_at=10.0)
    pinned = ProbeOrder("o", "j", 0, Demand(gpus=1), 1, 0.0, 1, 5.0, "gpu0")
    (other,) = ledger.arbitrate([pinned], 0.0)
    assert isinstance(other, Bounced) and "reserved" in other.reason and other.retryable
    (mine,) = ledger.arbitrate(
        [ProbeOrder("m", "j", 0, Demand(gpus=1), 4, 0.0, 2, 5.0, "gpu0", owner="P")], 0.0
    )
    assert isinstance(mine, Granted)
    ledger.release(mine.lease.lease_id)
    # Unpinned probes of others go elsewhere; the reservation lapses at its deadline.
    (free,) = ledger.arbitrate([ProbeOrder("f", "j", 0, Demand(gpus=1), 1, 0.0, 3, 5.0)], 0.0)
    assert isinstance(free, Granted) and free.lease.allocations[0].slice_id == "gpu1"
    (late,) = ledger.arbitrate(
        [ProbeOrder("l", "j", 0, Demand(gpus=1), 1, 0.0, 4, 5.0, "gpu0")], 10.0
    )
    assert isinstance(late, Granted)
    assert ledger.reservations() == {}
    ledger.reserve("P", ["gpu2"], 99.0)
    assert ledger.unreserve("P") == ["gpu2"]


def test_a_victim_is_chosen_by_the_work_it_would_lose_suspensions_left_out() -> None:
    """Two opportunistic GPUs, equal but for their past: "old" started first but spent most
    of its life suspended (by an operator), so a restart loses less of its work than of
    "busy"'s; it is the victim. Counted from the start alone, "busy" would be."""
    host = Host()
    host.run("old", 4, Demand(gpus=1), "gpu0")
    host.run("busy", 4, Demand(gpus=1), "gpu1")
    host.run("share-crit", 1, Demand(gpu_milli=200), "gpu2")  # no room to take elsewhere
    # At 1100: "old" ran from 500, stopped 900 s of it in two suspensions (one under way);
    # "busy" ran from 800 without a stop.
    host.holders["old"] = HolderFacts(
        "job-old", 4, 2, 500.0, stopped_seconds=600.0, stopped_since_unix=800.0
    )
    host.holders["busy"] = HolderFacts("job-busy", 4, 2, 800.0)
    assert host.plan(Demand(gpus=1), 2) == ["old"]  # 0 s of work against 300 s
    host.holders["old"] = HolderFacts("job-old", 4, 2, 500.0)  # never stopped: 600 s
    assert host.plan(Demand(gpus=1), 2) == ["busy"]
