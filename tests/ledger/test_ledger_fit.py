"""Ledger fits, bounces, arbitration order and lease lifecycle."""

from __future__ import annotations

import pytest

from laminar_agent.ledger import Allocation, Bounced, Granted, Ledger, ProbeOrder, Slice, SliceKind
from laminar_base.demand import Demand
from laminar_base.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)

GIB = 1 << 30


def whole(i: int, model: str = "H100", mem: int = 80 * GIB) -> Slice:
    return Slice(f"gpu{i}", SliceKind.WHOLE_GPU, i, f"GPU-{i}", model, mem)


def shared(i: int, model: str = "A10", mem: int = 24 * GIB) -> Slice:
    return Slice(f"gpu{i}", SliceKind.SHARED_GPU, i, f"GPU-{i}", model, mem)


def mig(i: int, k: int, profile: str = "3g.40gb", mem: int = 40 * GIB) -> Slice:
    return Slice(
        f"gpu{i}/mig-{profile}@{k}", SliceKind.MIG, i, f"MIG-{i}-{k}", "A100", mem, profile
    )


def probe(
    pid: str,
    demand: Demand,
    *,
    priority: int = 3,
    value: float = 1.0,
    seq: int = 0,
    ttl: float = 1.0,
    slice_id: str = "",
) -> ProbeOrder:
    return ProbeOrder(pid, f"job-{pid}", 0, demand, priority, value, seq, ttl, slice_id)


def grant(ledger: Ledger, demand: Demand, now: float = 0.0, ttl: float = 1.0) -> str:
    [result] = ledger.arbitrate([probe("p", demand, ttl=ttl)], now)
    assert isinstance(result, Granted), result
    return result.lease.lease_id


# ------------------------------------------------------------------ fits


def test_cpu_only_fits_with_no_allocations() -> None:
    assert Ledger([]).fit(Demand()) == ((), 1.0)


def test_whole_gpu_takes_all_milli_and_memory_preferring_whole_over_shared() -> None:
    ledger = Ledger([shared(0, "H100", 80 * GIB), whole(1)])
    fit = ledger.fit(Demand(gpus=1))
    assert not isinstance(fit, str)
    allocations, score = fit
    assert allocations == (Allocation("gpu1", 1000, 80 * GIB),)
    assert 0.0 <= score <= 1.0


def test_whole_gpu_uses_unused_shared_gpu_but_not_a_partly_used_one() -> None:
    ledger = Ledger([shared(0), shared(1)])
    grant(ledger, Demand(gpu_milli=100))
    fit = ledger.fit(Demand(gpus=1))
    assert not isinstance(fit, str)
    assert fit[0] == (Allocation("gpu1", 1000, 24 * GIB),)
    assert ledger.fit(Demand(gpus=2)) == "no 2 free whole GPUs (1 of 2 free)"


def test_multi_gpu_takes_distinct_slices() -> None:
    ledger = Ledger([whole(i) for i in range(4)])
    fit = ledger.fit(Demand(gpus=3))
    assert not isinstance(fit, str)
    assert [a.slice_id for a in fit[0]] == ["gpu0", "gpu1", "gpu2"]


def test_whole_gpu_prefers_smallest_memory_that_fits() -> None:
    ledger = Ledger([whole(0, mem=80 * GIB), whole(1, mem=40 * GIB)])
    small = ledger.fit(Demand(gpus=1, gpu_memory_bytes=30 * GIB))
    assert not isinstance(small, str)
    assert small[0][0].slice_id == "gpu1"
    big = ledger.fit(Demand(gpus=1, gpu_memory_bytes=60 * GIB))
    assert not isinstance(big, str)
    assert big[0][0].slice_id == "gpu0"


def test_mig_needs_exact_profile_and_packs_partly_used_gpu() -> None:
    ledger = Ledger([mig(0, 0), mig(0, 1), mig(1, 0), mig(1, 1), mig(2, 0, "1g.10gb", 10 * GIB)])
    first = grant(ledger, Demand(mig_profile="3g.40gb"))
    first_slice = ledger.lease(first).allocations[0].slice_id  # type: ignore[union-attr]
    fit = ledger.fit(Demand(mig_profile="3g.40gb"))
    assert not isinstance(fit, str)
    # The sibling on the same GPU wins so the other GPU stays entirely free.
    assert fit[0][0].slice_id.split("/")[0] == first_slice.split("/")[0]
    assert fit[0][0].slice_id != first_slice
    assert fit[0][0].milli == 1000


def test_share_goes_to_most_used_gpu_that_fits() -> None:
    ledger = Ledger([shared(0), shared(1), shared(2)])
    # Fill gpu0 to 700 and gpu1 to 300 by pinning.
    ledger.arbitrate([probe("a", Demand(gpu_milli=700), slice_id="gpu0")], 0.0)
    ledger.arbitrate([probe("b", Demand(gpu_milli=300), slice_id="gpu1")], 0.0)
    fit = ledger.fit(Demand(gpu_milli=200, gpu_memory_bytes=GIB))
    assert not isinstance(fit, str)
    assert fit[0] == (Allocation("gpu0", 200, GIB),)
    fit = ledger.fit(Demand(gpu_milli=400))
    assert not isinstance(fit, str)
    assert fit[0][0].slice_id == "gpu1"
    full_fit = ledger.fit(Demand(gpu_milli=300))
    assert not isinstance(full_fit, str)
    assert full_fit[0][0].slice_id == "gpu0"
    # Filling a GPU exactly scores higher than leaving most of a fresh one free.
    fresh = ledger.fit(Demand(gpu_milli=300), "gpu2")
    assert not isinstance(fresh, str)
    assert full_fit[1] > fresh[1]


def test_share_reserves_memory() -> None:
    ledger = Ledger([shared(0)])
    grant(ledger, Demand(gpu_milli=100, gpu_memory_bytes=20 * GIB))
    assert ledger.usage("gpu0") == (0, 100, 0, 20 * GIB)
    reason = ledger.fit(Demand(gpu_milli=100, gpu_memory_bytes=8 * GIB))
    assert isinstance(reason, str)
    assert "most free: 900 milli" in reason


def test_model_constraint_filters_slices() -> None:
    ledger = Ledger([whole(0, "H100"), whole(1, "A100")])
    fit = ledger.fit(Demand(gpus=1, gpu_model="A100"))
    assert not isinstance(fit, str)
    assert fit[0][0].slice_id == "gpu1"
    assert isinstance(ledger.fit(Demand(gpus=2, gpu_model="A100")), str)


def test_slice_pin() -> None:
    ledger = Ledger([whole(0), whole(1)])
    fit = ledger.fit(Demand(gpus=1), "gpu1")
    assert not isinstance(fit, str)
    assert fit[0][0].slice_id == "gpu1"
    assert ledger.fit(Demand(gpus=1), "gpu9") == "no slice 'gpu9' on this host"


# --------------------------------------------------------------- bounces


def bounce_of(ledger: Ledger, demand: Demand) -> Bounced:
    [result] = ledger.arbitrate([probe("x", demand)], 0.0)
    assert isinstance(result, Bounced), result
    return result


def test_bounce_retryable_when_busy() -> None:
    ledger = Ledger([mig(0, 0), mig(0, 1)])
    grant(ledger, Demand(mig_profile="3g.40gb"))
    grant(ledger, Demand(mig_profile="3g.40gb"))
    bounce = bounce_of(ledger, Demand(mig_profile="3g.40gb"))
    assert bounce == Bounced("x", "no free 3g.40gb slice (0 of 2 free)", True)


@pytest.mark.parametrize(
    "demand",
    [
        Demand(mig_profile="7g.80gb"),
        Demand(mig_profile="3g.40gb", gpu_memory_bytes=41 * GIB),
        Demand(gpus=3),
        Demand(gpus=1, gpu_memory_bytes=100 * GIB),
        Demand(gpu_milli=10),
        Demand(gpus=1, gpu_model="B200"),
    ],
)
def test_bounce_not_retryable_when_host_could_never_fit(demand: Demand) -> None:
    ledger = Ledger([whole(0), mig(1, 0)])
    bounce = bounce_of(ledger, demand)
    assert not bounce.retryable
    assert bounce.reason


def test_bounce_reason_for_whole_gpus_carries_numbers() -> None:
    ledger = Ledger([whole(0)])
    assert bounce_of(ledger, Demand(gpus=2)).reason == "needs 2 whole GPUs, host has 1 (of 1 GPUs)"


@pytest.mark.parametrize(
    ("demand", "field"),
    [
        (Demand(gpus=-1), "resources.gpus"),
        (Demand(gpu_milli=1001), "resources.gpu_milli"),
        (Demand(gpu_milli=-5), "resources.gpu_milli"),
        (Demand(gpu_memory_bytes=-1, gpus=1), "resources.gpu_memory_bytes"),
        (Demand(gpus=1, mig_profile="1g.10gb"), "resources.mig_profile"),
        (Demand(gpus=1, gpu_milli=10), "resources.gpu_milli"),
        (Demand(mig_profile="1g.10gb", gpu_milli=10), "resources.gpu_milli"),
        (Demand(gpu_memory_bytes=GIB), "resources.gpu_memory_bytes"),
    ],
)
def test_invalid_demand_names_field(demand: Demand, field: str) -> None:
    ledger = Ledger([whole(0)])
    with pytest.raises(InvalidArgument) as info:
        ledger.fit(demand)
    assert info.value.field == field
    # In a batch the bad probe bounces without breaking the others.
    results = ledger.arbitrate([probe("bad", demand), probe("ok", Demand(gpus=1), seq=1)], 0.0)
    assert isinstance(results[0], Bounced) and not results[0].retryable
    assert field in results[0].reason
    assert isinstance(results[1], Granted)


# ----------------------------------------------------------- arbitration


def test_critical_beats_batch_for_last_slice_regardless_of_arrival() -> None:
    ledger = Ledger([whole(0)])
    results = ledger.arbitrate(
        [
            probe("batch", Demand(gpus=1), priority=3, value=100.0, seq=1),
            probe("crit", Demand(gpus=1), priority=1, value=0.0, seq=9),
        ],
        0.0,
    )
    assert [type(r) for r in results] == [Bounced, Granted]
    assert [r.probe_id for r in results] == ["batch", "crit"]
    assert isinstance(results[0], Bounced) and results[0].retryable


def test_ties_broken_by_value_then_arrival() -> None:
    ledger = Ledger([whole(0)])
    results = ledger.arbitrate(
        [
            probe("low", Demand(gpus=1), value=1.0, seq=0),
            probe("high", Demand(gpus=1), value=2.0, seq=5),
        ],
        0.0,
    )
    assert isinstance(results[1], Granted)
    ledger = Ledger([whole(0)])
    results = ledger.arbitrate(
        [
            probe("late", Demand(gpus=1), seq=7),
            probe("early", Demand(gpus=1), seq=3),
        ],
        0.0,
    )
    assert isinstance(results[1], Granted) and isinstance(results[0], Bounced)


def test_arbitration_is_deterministic() -> None:
    batch = [probe(f"p{i}", Demand(gpu_milli=300), value=float(i % 3), seq=i) for i in range(8)]

    def run() -> list[object]:
        ledger = Ledger([shared(0), shared(1)], lease_prefix="a-")
        return [
            (r.probe_id, r.lease.allocations) if isinstance(r, Granted) else (r.probe_id,)
            for r in ledger.arbitrate(batch, 0.0)
        ]

    assert run() == run()


def test_arbitrate_expires_first() -> None:
    ledger = Ledger([whole(0)])
    grant(ledger, Demand(gpus=1), now=0.0, ttl=1.0)
    [result] = ledger.arbitrate([probe("next", Demand(gpus=1))], 1.0)
    assert isinstance(result, Granted)


def test_bad_ttl_and_priority_bounce() -> None:
    ledger = Ledger([whole(0)])
    results = ledger.arbitrate(
        [probe("t", Demand(gpus=1), ttl=0.0), probe("p", Demand(gpus=1), priority=9)], 0.0
    )
    assert all(isinstance(r, Bounced) and not r.retryable for r in results)
    assert ledger.leases() == []


# ------------------------------------------------------------- lifecycle


def test_commit_unknown_is_not_found() -> None:
    with pytest.raises(NotFound):
        Ledger([whole(0)]).commit("nope", "sj", 0.0)


def test_commit_expired_is_aborted_and_frees() -> None:
    ledger = Ledger([whole(0)])
    lease_id = grant(ledger, Demand(gpus=1), now=0.0, ttl=0.5)
    with pytest.raises(Aborted):
        ledger.commit(lease_id, "sj", 0.5)
    assert ledger.lease(lease_id) is None
    assert ledger.usage("gpu0") == (0, 0, 0, 0)


def test_commit_moves_leased_to_committed_and_never_expires() -> None:
    ledger = Ledger([whole(0)])
    lease_id = grant(ledger, Demand(gpus=1, gpu_memory_bytes=GIB))
    assert ledger.pending_leases() == 1
    assert ledger.usage("gpu0") == (0, 1000, 0, 80 * GIB)
    lease = ledger.commit(lease_id, "sj-1", 0.1)
    assert lease.committed and lease.subjob_id == "sj-1"
    assert ledger.usage("gpu0") == (1000, 0, 80 * GIB, 0)
    assert ledger.pending_leases() == 0
    assert ledger.expire(1e9) == []
    assert ledger.commit(lease_id, "sj-1", 2.0) is lease
    with pytest.raises(FailedPrecondition):
        ledger.commit(lease_id, "other", 2.0)


def test_release_frees_capacity() -> None:
    ledger = Ledger([whole(0)])
    lease_id = grant(ledger, Demand(gpus=1))
    ledger.commit(lease_id, "sj", 0.0)
    assert isinstance(ledger.fit(Demand(gpus=1)), str)
    released = ledger.release(lease_id)
    assert released is not None and released.lease_id == lease_id
    assert ledger.release(lease_id) is None
    assert not isinstance(ledger.fit(Demand(gpus=1)), str)


def test_expire_returns_lapsed_leases() -> None:
    ledger = Ledger([shared(0)])
    a = grant(ledger, Demand(gpu_milli=100), now=0.0, ttl=1.0)
    b = grant(ledger, Demand(gpu_milli=100), now=0.0, ttl=5.0)
    assert [lease.lease_id for lease in ledger.expire(2.0)] == [a]
    assert [lease.lease_id for lease in ledger.leases()] == [b]


def test_lease_ids_unique_and_prefixed() -> None:
    ledger = Ledger([shared(0)], lease_prefix="agent-r2-")
    ids = {grant(ledger, Demand(gpu_milli=10)) for _ in range(5)}
    assert len(ids) == 5
    assert all(i.startswith("agent-r2-") for i in ids)


def test_adopt_restores_committed_lease() -> None:
    ledger = Ledger([shared(0), whole(1)], lease_prefix="r1-")
    lease = ledger.adopt("r0-l-4", "job", 2, "sj-9", [Allocation("gpu0", 500, 4 * GIB)], priority=2)
    assert lease.committed and lease.subjob_id == "sj-9"
    assert ledger.usage("gpu0") == (500, 0, 4 * GIB, 0)
    assert ledger.lease("r0-l-4") is lease
    with pytest.raises(AlreadyExists):
        ledger.adopt("r0-l-4", "job", 2, "sj-9", [], priority=2)
    with pytest.raises(FailedPrecondition):
        ledger.adopt("r0-l-5", "job", 0, "sj", [Allocation("gpu0", 600, 0)], priority=2)
    with pytest.raises(FailedPrecondition):
        ledger.adopt("r0-l-6", "job", 0, "sj", [Allocation("gone", 1, 0)], priority=2)
    ledger.check_invariant()


def test_shapes_report_free_capacity() -> None:
    ledger = Ledger([whole(0), shared(1, "H100", 80 * GIB), mig(2, 0), mig(2, 1)])
    grant(ledger, Demand(gpu_milli=250, gpu_memory_bytes=10 * GIB))
    grant(ledger, Demand(mig_profile="3g.40gb"))
    shapes = {s.shape: s for s in ledger.shapes()}
    assert shapes["gpu:H100"].free == 1 and shapes["gpu:H100"].total == 2
    assert shapes["mig:3g.40gb"].free == 1 and shapes["mig:3g.40gb"].total == 2
    share = shapes["share:H100"]
    assert (share.free, share.total) == (1, 1)
    assert share.max_free_milli == 750
    assert share.max_free_memory_bytes == 70 * GIB


def test_check_invariant_detects_drift() -> None:
    ledger = Ledger([whole(0)])
    grant(ledger, Demand(gpus=1))
    ledger._usage["gpu0"][1] += 1  # simulate a bookkeeping bug
    with pytest.raises(AssertionError):
        ledger.check_invariant()


def test_fit_or_bounce_tells_retryable() -> None:
    ledger = Ledger([whole(0)])
    grant(ledger, Demand(gpus=1))
    busy = ledger.fit_or_bounce(Demand(gpus=1))
    assert isinstance(busy, Bounced) and busy.retryable
    never = ledger.fit_or_bounce(Demand(gpus=2))
    assert isinstance(never, Bounced) and not never.retryable
    assert ledger.fit_or_bounce(Demand()) == ((), 1.0)


def _host(frag: bool = False) -> Ledger:
    """Four shared H100s, 16 cores, 64 GiB: a whole GPU's default share is 4 cores, 16 GiB."""
    from laminar_base.fragmentation import (
        MILLI_SLICING,
        FragmentationCache,
        PodShape,
        TargetWorkload,
    )

    slices = [
        Slice(f"gpu{i}", SliceKind.SHARED_GPU, i, f"GPU-{i}", "H100", 80 << 30) for i in range(4)
    ]
    ledger = Ledger(slices, cpu_total_milli=16_000, memory_total_bytes=64 << 30)
    if frag:
        target = TargetWorkload((PodShape(1000, 0, 1, 500), PodShape(1000, 0, 1, 1000)), (0.5, 0.5))
        ledger.set_fragmentation(FragmentationCache(target, MILLI_SLICING))
    return ledger


def _probe(ledger: Ledger, demand: Demand) -> Granted | Bounced:
    order = ProbeOrder("p", "j", 0, demand, 3, 0.0, 1, 5.0)
    (result,) = ledger.arbitrate([order], 0.0)
    return result


def test_host_cpu_and_memory_default_to_the_gpu_share_and_are_never_overcommitted() -> None:
    ledger = _host()
    granted = _probe(ledger, Demand(gpus=1))
    assert isinstance(granted, Granted)
    assert (granted.lease.cpu_milli, granted.lease.host_memory_bytes) == (4000, 16 << 30)
    half = _probe(ledger, Demand(gpu_milli=500))  # half a GPU: 2 cores, 8 GiB
    assert isinstance(half, Granted) and half.lease.cpu_milli == 2000
    assert ledger.host_free().cpu_free_milli == 10_000
    # GPUs left, CPU not: a retryable bounce naming the numbers.
    short = _probe(ledger, Demand(gpu_milli=100, cpu_milli=12_000))
    assert isinstance(short, Bounced) and short.retryable
    assert "host CPU: needs 12000 milli-cores, 10000 of 16000 free" in short.reason
    # More than the host has: never fits here.
    never = _probe(ledger, Demand(gpu_milli=100, host_memory_bytes=65 << 30))
    assert isinstance(never, Bounced) and not never.retryable
    ledger.release(granted.lease.lease_id)
    assert ledger.host_free().cpu_free_milli == 14_000
    ledger.check_invariant()


def test_with_a_target_workload_a_share_goes_where_it_strands_least() -> None:
    ledger = _host(frag=True)
    first = _probe(ledger, Demand(gpu_milli=500, cpu_milli=1000))
    assert isinstance(first, Granted)
    ledger.commit(first.lease.lease_id, "s-1", 0.0)
    busy = first.lease.allocations[0].slice_id
    # Another half GPU fits the half-used GPU exactly, keeping the empty ones whole for the
    # workload's whole-GPU tasks; it scores higher there than on an empty host, where it
    # strands half a GPU that only the share half of the workload can use.
    second = _probe(ledger, Demand(gpu_milli=500, cpu_milli=1000))
    assert isinstance(second, Granted)
    assert second.lease.allocations[0].slice_id == busy
    fresh = _probe(_host(frag=True), Demand(gpu_milli=500, cpu_milli=1000))
    assert isinstance(fresh, Granted)
    assert 0.0 < fresh.lease.score < second.lease.score < 1.0
