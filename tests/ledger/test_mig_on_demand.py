"""MIG on demand without carving (``mig_carve_busy=False``, the ops switch): an idle MIG
GPU takes a legal layout that holds the demand; a busy one is never repartitioned (issue
16). Carving a busy GPU's idle part: tests/ledger/test_mig_carve.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_agent.inventory.mig import MIG_PROFILES
from laminar_agent.ledger import Bounced, Granted, Ledger, ProbeOrder, Slice, SliceKind, counter_ids
from laminar_agent.mig_layout import MigGpu, is_legal, layout_for
from laminar_base.demand import Demand
from laminar_base.errors import InvalidArgument

MODEL = "H100-80GB"
PROFILES = sorted(MIG_PROFILES[MODEL])


def instances(index: int, layout: tuple[tuple[str, int, int], ...]) -> list[Slice]:
    return [
        Slice(
            slice_id=f"gpu{index}/{name}@{start}",
            kind=SliceKind.MIG,
            gpu_index=index,
            device_uuid=f"MIG-{index}-{start}",
            gpu_model=MODEL,
            memory_total_bytes=MIG_PROFILES[MODEL][name].memory_bytes,
            mig_profile=name,
        )
        for name, start, _ in layout
    ]


def ledger(gpus: int = 2, first_layout: str = "1g.10gb") -> Ledger:
    """``gpus`` MIG-on-demand GPUs; GPU 0 starts with ``first_layout``'s layout, the
    others with no instances."""
    return Ledger(
        instances(0, layout_for(MODEL, first_layout)) if first_layout else [],
        lease_ids=counter_ids(),
        mig_on_demand=[MigGpu(i, MODEL, f"GPU-{i}") for i in range(gpus)],
        mig_carve_busy=False,
    )


def probe(ledger_: Ledger, demand: Demand, seq: int = 1) -> Granted | Bounced:
    order = ProbeOrder(str(seq), "j", 0, demand, 3, 0.0, seq, 30.0)
    return ledger_.arbitrate([order], 0.0)[0]


def test_every_layout_chosen_is_legal_and_holds_its_profile() -> None:
    for model, table in MIG_PROFILES.items():
        for name in table:
            layout = layout_for(model, name)
            assert is_legal(model, layout), (model, name, layout)
            assert layout[0][0] == name


def test_a_profile_with_no_free_instance_repartitions_an_idle_gpu() -> None:
    led = ledger(gpus=1)
    reply = probe(led, Demand(mig_profile="3g.40gb"))
    assert isinstance(reply, Granted)
    assert [a.slice_id for a in reply.lease.allocations] == ["gpu0/3g.40gb@0"]
    assert led.on_demand_layout(0) == layout_for(MODEL, "3g.40gb")
    assert led.mig_pending[0] == layout_for(MODEL, "3g.40gb")
    led.check_invariant()


def test_a_free_instance_of_the_profile_is_used_before_any_repartition() -> None:
    led = ledger(gpus=2)
    reply = probe(led, Demand(mig_profile="1g.10gb"))
    assert isinstance(reply, Granted)
    assert reply.lease.allocations[0].slice_id.startswith("gpu0/1g.10gb@")
    assert led.mig_pending == {}


def test_a_gpu_that_holds_anything_is_never_repartitioned() -> None:
    led = ledger(gpus=1)
    held = probe(led, Demand(mig_profile="1g.10gb"))
    assert isinstance(held, Granted)
    before = led.on_demand_layout(0)
    for state in ("leased", "committed"):
        if state == "committed":
            led.commit(held.lease.lease_id, "s1", 0.0)
        reply = probe(led, Demand(mig_profile="3g.40gb"), seq=2)
        assert isinstance(reply, Bounced) and reply.retryable, state
        assert led.on_demand_layout(0) == before
    led.release(held.lease.lease_id)
    assert isinstance(probe(led, Demand(mig_profile="3g.40gb"), seq=3), Granted)


def test_a_reserved_gpu_is_never_repartitioned() -> None:
    led = ledger(gpus=1)
    led.reserve("preemptor", ["gpu0/1g.10gb@0"], 100.0)
    assert isinstance(probe(led, Demand(mig_profile="3g.40gb")), Bounced)
    assert led.on_demand_layout(0) == layout_for(MODEL, "1g.10gb")


def test_a_whole_gpu_takes_an_idle_mig_gpu_as_one_full_instance() -> None:
    led = ledger(gpus=2)
    reply = probe(led, Demand(gpus=2))
    assert isinstance(reply, Granted)
    assert sorted(a.slice_id for a in reply.lease.allocations) == [
        "gpu0/7g.80gb@0",
        "gpu1/7g.80gb@0",
    ]
    assert isinstance(probe(led, Demand(gpus=1), seq=2), Bounced)
    led.check_invariant()


def test_a_dry_run_fit_changes_no_layout() -> None:
    led = ledger(gpus=1)
    assert not isinstance(led.fit(Demand(mig_profile="7g.80gb")), str)
    assert led.on_demand_layout(0) == layout_for(MODEL, "1g.10gb")
    assert led.mig_pending == {}


def test_summaries_advertise_what_idle_gpus_could_hold() -> None:
    led = ledger(gpus=2)
    shapes = {s.shape: s for s in led.shapes()}
    assert shapes["mig:3g.40gb"].free == 4  # two idle GPUs, two 3g each
    assert shapes["mig:1g.10gb"].free == 14
    assert shapes["gpu:H100-80GB"].free == 2
    held = probe(led, Demand(mig_profile="7g.80gb"))
    assert isinstance(held, Granted)
    shapes = {s.shape: s for s in led.shapes()}
    assert shapes["mig:3g.40gb"].free == 2
    assert shapes["mig:7g.80gb"].free == 1
    assert shapes["gpu:H100-80GB"].free == 1


def test_a_gpu_without_a_profile_table_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidArgument) as err:
        Ledger([], mig_on_demand=[MigGpu(0, "T4", "GPU-0")])
    assert err.value.field == "mig_on_demand"


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("probe"), st.sampled_from(PROFILES)),
        st.tuples(st.just("whole"), st.integers(1, 2)),
        st.tuples(st.just("commit"), st.integers(0, 50)),
        st.tuples(st.just("release"), st.integers(0, 50)),
        st.tuples(st.just("reserve"), st.integers(0, 50)),
        st.tuples(st.just("unreserve"), st.integers(0, 50)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, gpus=st.integers(1, 4), first=st.sampled_from(["", *PROFILES]))
def test_random_demand_never_repartitions_a_busy_gpu_and_every_layout_is_legal(
    ops: list[tuple[str, object]], gpus: int, first: str
) -> None:
    led = ledger(gpus=gpus, first_layout=first)
    leases: list[str] = []
    owners: list[str] = []
    for seq, (op, arg) in enumerate(ops, start=1):
        before = {i: led.on_demand_layout(i) for i in range(gpus)}
        busy = {
            s.gpu_index
            for s in led.slices.values()
            if led.usage(s.slice_id) != (0, 0, 0, 0) or s.slice_id in led.reservations()
        }
        if op == "probe":
            reply = probe(led, Demand(mig_profile=str(arg)), seq)
            if isinstance(reply, Granted):
                leases.append(reply.lease.lease_id)
        elif op == "whole":
            reply = probe(led, Demand(gpus=int(str(arg))), seq)
            if isinstance(reply, Granted):
                leases.append(reply.lease.lease_id)
        elif op == "commit" and leases:
            lease_id = leases[int(str(arg)) % len(leases)]
            lease = led.lease(lease_id)
            if lease is not None and not lease.committed:
                led.commit(lease_id, f"s{seq}", 0.0)
        elif op == "release" and leases:
            led.release(leases.pop(int(str(arg)) % len(leases)))
        elif op == "reserve" and led.slices:
            slice_ids = sorted(led.slices)
            target = slice_ids[int(str(arg)) % len(slice_ids)]
            if target not in led.reservations():
                owner = f"o{seq}"
                led.reserve(owner, [target], 1e9)
                owners.append(owner)
        elif op == "unreserve" and owners:
            led.unreserve(owners.pop(int(str(arg)) % len(owners)))
        led.check_invariant()
        for index in range(gpus):
            after = led.on_demand_layout(index)
            if after != before[index]:
                assert index not in busy, f"GPU {index} was busy and got a new layout"
            if after:
                assert is_legal(MODEL, after)
        for lease_id in leases:
            lease = led.lease(lease_id)
            assert lease is not None
            assert all(a.slice_id in led.slices for a in lease.allocations)
