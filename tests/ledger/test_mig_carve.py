"""MIG on demand carving a busy GPU's idle part (issue 16, ``mig_carve_busy``, the
default): idle instances give way to the asked profile at the legal free placement that
strands least; an instance that is leased, runs something or is reserved is never
destroyed or moved, and every layout is legal."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_agent.inventory import MigInstanceInfo
from laminar_agent.inventory.mig import MIG_PROFILES
from laminar_agent.ledger import Bounced, Granted, Ledger, ProbeOrder, Slice, SliceKind, counter_ids
from laminar_agent.mig_layout import (
    MigGpu,
    carve_options,
    fragmentation,
    is_legal,
    layout_for,
    uniform_weights,
)
from laminar_base.demand import Demand
from laminar_base.fragmentation import FragmentationCache, PodShape, TargetWorkload
from laminar_sim.policies import MigSlicing

MODEL = "H100-80GB"
PROFILES = sorted(MIG_PROFILES[MODEL])
SEVEN_SMALL = tuple(("1g.10gb", s, 1) for s in range(7))


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


def ledger(gpus: int = 1, first: tuple[tuple[str, int, int], ...] = SEVEN_SMALL) -> Ledger:
    return Ledger(
        instances(0, first),
        lease_ids=counter_ids(),
        mig_on_demand=[MigGpu(i, MODEL, f"GPU-{i}") for i in range(gpus)],
    )


def probe(led: Ledger, profile: str, seq: int = 1) -> Granted | Bounced:
    order = ProbeOrder(str(seq), "j", 0, Demand(mig_profile=profile), 3, 0.0, seq, 30.0)
    return led.arbitrate([order], 0.0)[0]


def run(led: Ledger, profile: str, seq: int = 1) -> str:
    """Probe and commit ``profile``; the slice it got."""
    reply = probe(led, profile, seq)
    assert isinstance(reply, Granted), reply
    led.commit(reply.lease.lease_id, f"s{seq}", 0.0)
    return reply.lease.allocations[0].slice_id


def test_a_busy_gpu_gives_its_idle_part_to_a_profile_it_has_no_instance_of() -> None:
    led = ledger()
    small = run(led, "1g.10gb")
    assert small in {"gpu0/1g.10gb@4", "gpu0/1g.10gb@5", "gpu0/1g.10gb@6"}
    busy_usage = led.usage(small)
    big = run(led, "3g.40gb", 2)
    assert big == "gpu0/3g.40gb@0"
    # The 1g instances at 0-3 were destroyed for it; the busy one and the others stay.
    layout = led.on_demand_layout(0)
    assert layout[0] == ("3g.40gb", 0, 4)
    assert ("1g.10gb", int(small.rsplit("@", 1)[1]), 1) in layout
    assert len(layout) == 4 and is_legal(MODEL, layout)
    assert led.usage(small) == busy_usage
    assert led.mig_pending[0] == layout
    led.check_invariant()


def test_a_profile_lands_where_it_strands_least() -> None:
    # On an idle GPU a 3g.40gb takes the upper half: the lower one still holds a 4g.40gb.
    led = ledger(first=())
    assert run(led, "3g.40gb") == "gpu0/3g.40gb@4"
    assert run(led, "4g.40gb", 2) == "gpu0/4g.40gb@0"
    # Two GPUs: a 2g.20gb goes beside the busy GPU's 4g.40gb, not to the idle GPU, which
    # stays whole.
    led2 = ledger(gpus=2, first=())
    assert run(led2, "4g.40gb") == "gpu0/4g.40gb@0"
    assert run(led2, "2g.20gb", 2) == "gpu0/2g.20gb@4"  # packs GPU 0, GPU 1 stays whole
    assert led2.on_demand_layout(1) == ()


def test_an_idle_instance_of_the_profile_is_used_before_a_new_one_is_made() -> None:
    led = ledger(first=(("3g.40gb", 0, 4), ("3g.40gb", 4, 4)))
    reply = probe(led, "3g.40gb")
    assert isinstance(reply, Granted)
    assert reply.lease.allocations[0].slice_id in {"gpu0/3g.40gb@0", "gpu0/3g.40gb@4"}
    assert led.mig_pending == {}


def test_a_full_gpu_bounces_retryably_and_nothing_changes() -> None:
    led = ledger(first=(("7g.80gb", 0, 8),))
    run(led, "7g.80gb")
    reply = probe(led, "1g.10gb", 2)
    assert isinstance(reply, Bounced) and reply.retryable
    assert led.on_demand_layout(0) == (("7g.80gb", 0, 8),)


def test_reserved_and_held_back_instances_are_never_carved() -> None:
    led = ledger()
    led.reserve("preemptor", [f"gpu0/1g.10gb@{s}" for s in range(4)], 1e9)
    # 3g.40gb at 0 would destroy reserved instances, at 4 would not: 4 it is.
    assert run(led, "3g.40gb") == "gpu0/3g.40gb@4"
    held = ledger()
    held.hold_back("xid", ["gpu0/1g.10gb@0"])
    reply = probe(held, "2g.20gb")
    assert isinstance(reply, Bounced) and reply.retryable
    assert held.on_demand_layout(0) == SEVEN_SMALL


def test_without_carving_a_busy_gpu_keeps_its_layout() -> None:
    led = Ledger(
        instances(0, SEVEN_SMALL),
        lease_ids=counter_ids(),
        mig_on_demand=[MigGpu(0, MODEL, "GPU-0")],
        mig_carve_busy=False,
    )
    run(led, "1g.10gb")
    reply = probe(led, "3g.40gb", 2)
    assert isinstance(reply, Bounced) and reply.retryable
    assert led.on_demand_layout(0) == SEVEN_SMALL


def test_the_profile_mix_of_the_target_workload_steers_the_placement() -> None:
    """The measure counts the profiles a placement strands, weighted by the mix: with a
    4g.40gb-only workload a 1g.10gb on an idle GPU keeps the 4g's only placement (0-3)."""
    uniform = uniform_weights(MODEL)
    assert {name for name, _ in uniform} == {"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
    # 1g at 0 strands the 4g at 0; at 4 it strands nothing but the 7g.
    at0 = fragmentation(MODEL, (("1g.10gb", 0, 1),), uniform)
    at4 = fragmentation(MODEL, (("1g.10gb", 4, 1),), uniform)
    assert at4 < at0
    led = ledger(first=())
    only_4g = TargetWorkload((PodShape(1000, 0, 1, 571),), (1.0,))
    led.set_fragmentation(FragmentationCache(only_4g, MigSlicing()))
    slice_id = run(led, "1g.10gb")
    assert int(slice_id.rsplit("@", 1)[1]) >= 4


def test_carve_options_never_overlap_a_busy_instance() -> None:
    for profile in PROFILES:
        for busy_start in range(7):
            busy = [("1g.10gb", busy_start, 1)]
            for option in carve_options(MODEL, SEVEN_SMALL, busy, profile):
                assert is_legal(MODEL, option.layout)
                assert busy[0] in option.layout
                assert option.instance in option.layout and option.instance[0] == profile


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("probe"), st.sampled_from(PROFILES)),
        st.tuples(st.just("whole"), st.integers(1, 2)),
        st.tuples(st.just("commit"), st.integers(0, 50)),
        st.tuples(st.just("release"), st.integers(0, 50)),
        st.tuples(st.just("reserve"), st.integers(0, 50)),
        st.tuples(st.just("unreserve"), st.integers(0, 50)),
        st.tuples(st.just("apply"), st.integers(0, 3)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    ops=OPS,
    gpus=st.integers(1, 3),
    first=st.sampled_from(["", *PROFILES]),
    target=st.sampled_from([None, 1, 3, 4]),
)
def test_random_demand_never_destroys_a_busy_instance_and_every_layout_is_legal(
    ops: list[tuple[str, int | str]], gpus: int, first: str, target: int | None
) -> None:
    led = ledger(gpus=gpus, first=layout_for(MODEL, first) if first else ())
    if target is not None:  # a workload mix of one profile, as the zone would observe it
        shape = PodShape(1000, 0, 1, round(target * 1000 / 7))
        led.set_fragmentation(FragmentationCache(TargetWorkload((shape,), (1.0,)), MigSlicing()))
    leases: list[str] = []
    owners: list[str] = []
    for seq, (op, arg) in enumerate(ops, start=1):
        busy = {
            sid: led.usage(sid)
            for sid in led.slices
            if led.usage(sid) != (0, 0, 0, 0) or sid in led.reservations()
        }
        if op in ("probe", "whole"):
            demand = Demand(mig_profile=str(arg)) if op == "probe" else Demand(gpus=int(arg))
            reply = led.arbitrate([ProbeOrder(str(seq), "j", 0, demand, 3, 0.0, seq, 30.0)], 0.0)
            if isinstance(reply[0], Granted):
                leases.append(reply[0].lease.lease_id)
                if op == "probe":
                    got = reply[0].lease.allocations[0].slice_id
                    assert got not in busy, f"{got} was busy and was handed out again"
        elif op == "commit" and leases:
            lease_id = leases[int(arg) % len(leases)]
            lease = led.lease(lease_id)
            if lease is not None and not lease.committed:
                led.commit(lease_id, f"s{seq}", 0.0)
        elif op == "release" and leases:
            led.release(leases.pop(int(arg) % len(leases)))
        elif op == "reserve" and led.slices:
            target_id = sorted(led.slices)[int(arg) % len(led.slices)]
            if target_id not in led.reservations():
                owners.append(f"o{seq}")
                led.reserve(owners[-1], [target_id], 1e9)
        elif op == "unreserve" and owners:
            led.unreserve(owners.pop(int(arg) % len(owners)))
        elif op == "apply" and int(arg) in led.mig_pending:
            index = int(arg)  # the driver applied the pending layout
            led.layout_applied(
                index,
                [
                    MigInstanceInfo(
                        f"MIG-{index}-{name}-{start}",
                        name,
                        MIG_PROFILES[MODEL][name].memory_bytes,
                        start,
                        size,
                    )
                    for name, start, size in led.mig_pending[index]
                ],
            )
        led.check_invariant()
        # No instance in use, leased or reserved is destroyed, moved or changed in use.
        for sid, usage in busy.items():
            assert sid in led.slices, f"busy instance {sid} was destroyed by {op}"
            if op in ("probe", "whole", "reserve", "apply"):
                assert led.usage(sid) == usage
        for index in range(gpus):
            layout = led.on_demand_layout(index)
            assert not layout or is_legal(MODEL, layout), layout
        for lease_id in leases:
            lease = led.lease(lease_id)
            assert lease is not None
            assert all(a.slice_id in led.slices for a in lease.allocations)


def test_a_gpu_free_share_fits_the_profile_its_free_compute_slices_hold() -> None:
    """The summary's per-GPU free share is what the router's measure compares a profile's
    share with (``demand_pod``): 3 free compute slices must fit a 3g.40gb there."""
    from laminar_base.demand import HostCap
    from laminar_base.fragmentation import demand_pod

    led = ledger(gpus=2, first=())
    run(led, "4g.40gb")
    free = led.host_free().gpu_free_milli
    three = demand_pod(Demand(mig_profile="3g.40gb"), HostCap()).gpu_milli
    assert free == (three, 1000)
