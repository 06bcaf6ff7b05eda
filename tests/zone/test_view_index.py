"""The view's candidate index: ready agents pooled by levels of free shape, host CPU and
host memory. Whatever sequence of summaries, probe replies, drains and sweeps it sees, the
pools a demand is drawn from hold every ready agent whose summary fits it (checked against
a scan of every agent), and each agent sits exactly where its present summary puts it."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from viewscan import apply_event, scan_counts

from laminar_base.demand import Demand, HostCap
from laminar_zone.placement import ShapeCap, members_fitting
from laminar_zone.view import AgentRecord, ZoneView, host_order

GIB = 1 << 30
AGENTS = [f"a{i}" for i in range(6)]

shapes_st = st.fixed_dictionaries(
    {},
    optional={
        "gpu:A100": st.integers(0, 8).map(lambda free: ShapeCap(free, 8, 0, free * 80 * GIB)),
        "share:A100": st.integers(0, 1000).map(lambda milli: ShapeCap(1, 8, milli, 80 * GIB)),
        "mig:1g.10gb": st.integers(0, 7).map(lambda free: ShapeCap(free, 7, 0, 10 * GIB)),
    },
)
host_st = st.builds(
    HostCap,
    cpu_free_milli=st.integers(0, 64_000),
    cpu_total_milli=st.sampled_from([0, 64_000]),
    memory_free_bytes=st.integers(0, 512 * GIB),
    memory_total_bytes=st.sampled_from([0, 512 * GIB]),
    gpu_free_milli=st.just((1000,) * 8),
    gpus_total=st.just(8),
)
event_st = st.one_of(
    st.tuples(st.just("heartbeat"), st.sampled_from(AGENTS), shapes_st, st.booleans()),
    st.tuples(st.just("reply"), st.sampled_from(AGENTS), shapes_st, st.booleans()),
    st.tuples(st.just("host"), st.sampled_from(AGENTS), host_st),
    st.tuples(st.just("drain"), st.sampled_from(AGENTS), st.booleans()),
    st.tuples(st.just("sweep"), st.integers(0, 3)),
)
need_st = st.one_of(
    st.builds(Demand, gpus=st.integers(1, 8), gpu_model=st.sampled_from(["", "A100", "H100"])),
    st.builds(Demand, gpu_milli=st.integers(1, 1000)),
    st.builds(Demand, mig_profile=st.just("1g.10gb")),
    st.builds(Demand),
).flatmap(
    lambda need: st.builds(
        lambda cpu, memory: Demand(
            gpus=need.gpus,
            mig_profile=need.mig_profile,
            gpu_milli=need.gpu_milli,
            gpu_model=need.gpu_model,
            cpu_milli=cpu,
            host_memory_bytes=memory,
        ),
        st.sampled_from([0, 1, 1000, 4000, 33_000, 64_000, 70_000]),
        st.sampled_from([0, GIB, 8 * GIB, 300 * GIB, 600 * GIB]),
    )
)


def fits(record: AgentRecord, need: Demand) -> bool:
    host = record.host
    return (
        record.is_ready
        and members_fitting(need, record.shapes) >= 1
        and (host is None or host.fits(need))
    )


def apply(view: ZoneView, events: list[tuple[object, ...]]) -> None:
    for now, event in enumerate(events, start=1):
        apply_event(view, event, float(now))


@settings(max_examples=300, deadline=None)
@given(events=st.lists(event_st, max_size=40), needs=st.lists(need_st, min_size=1, max_size=6))
def test_the_pools_drawn_from_hold_every_fitting_agent(
    events: list[tuple[object, ...]], needs: list[Demand]
) -> None:
    view = ZoneView(stale_after_seconds=2.0)
    apply(view, events)
    for need in needs:
        pooled = {agent for pool in view._pools(need) for agent in pool.items}
        fitting = {a for a, r in view.agents.items() if fits(r, need)}
        assert fitting <= pooled
        assert all(view.agents[a].is_ready for a in pooled)
        drawn = view.sample(need, len(AGENTS), random.Random(0))
        assert {r.agent_id for r in drawn} <= fitting


@settings(max_examples=200, deadline=None)
@given(events=st.lists(event_st, max_size=40))
def test_each_agent_sits_where_its_present_summary_puts_it(
    events: list[tuple[object, ...]],
) -> None:
    view = ZoneView(stale_after_seconds=2.0)
    apply(view, events)
    fresh = ZoneView(stale_after_seconds=2.0)
    for agent_id, record in view.agents.items():
        fresh.agents[agent_id] = record
        fresh._reindex(record)
    assert view._pools_of == fresh._pools_of
    held = {
        (shape, levels, agent)
        for shape, pools in view._by_shape.items()
        for levels, pool in pools.items()
        for agent in pool.items
    }
    assert held == {
        (shape, levels, agent)
        for agent, pools in fresh._pools_of.items()
        for shape, levels in pools
    }
    assert all(len(pool) for pools in view._by_shape.values() for pool in pools.values())
    # Each pool's order list holds its members, sorted by the view's host order.
    for pools in view._by_shape.values():
        for pool in pools.values():
            assert pool.ordered == sorted((host_order(a), a) for a in pool.items)


#: The examples both ordered walks are checked against a scan with.
walk_given = given(
    events=st.lists(event_st, max_size=40),
    needs=st.lists(need_st, min_size=1, max_size=6),
    k=st.integers(0, 8),
    excluded=st.sets(st.sampled_from(AGENTS), max_size=3),
    salt=st.integers(0, 3),
)
walk_settings = settings(max_examples=300, deadline=None)


@walk_settings
@walk_given
def test_first_in_order_takes_the_first_fitting_agents_in_the_fixed_order(
    events: list[tuple[object, ...]],
    needs: list[Demand],
    k: int,
    excluded: set[str],
    salt: int,
) -> None:
    """Against a scan: the k fitting agents (not excluded) that come first in the view's
    host order, in that order."""
    view = ZoneView(stale_after_seconds=2.0, order_salt=salt)
    apply(view, events)
    for need in needs:
        fitting = [a for a, r in view.agents.items() if fits(r, need) and a not in excluded]
        expected = sorted(fitting, key=lambda a: host_order(a, salt))[:k]
        got = view.first_in_order(need, k, exclude=excluded)
        assert [r.agent_id for r in got] == expected


def matches(shape: str, need: Demand) -> bool:
    """Whether an advertised shape is one a GPU ``need`` is drawn from."""
    if need.mig_profile:
        return shape == f"mig:{need.mig_profile}"
    kind = "share:" if need.gpu_milli else "gpu:"
    return shape.startswith(kind) and (not need.gpu_model or shape == kind + need.gpu_model)


@walk_settings
@walk_given
def test_tightest_in_order_takes_fitting_agents_from_the_lowest_level_up(
    events: list[tuple[object, ...]],
    needs: list[Demand],
    k: int,
    excluded: set[str],
    salt: int,
) -> None:
    """Against a scan: the k fitting agents (not excluded) with the fewest free GPUs of the
    demand's shape first (its pool level), equal levels in the view's host order; none for
    a demand of a share, a MIG profile or no GPU."""
    view = ZoneView(stale_after_seconds=2.0, order_salt=salt)
    apply(view, events)
    for need in needs:
        got = [r.agent_id for r in view.tightest_in_order(need, k, exclude=excluded)]
        if need.family == "cpu" or need.gpu_milli or need.mig_profile:
            assert got == []
            continue

        def level(agent: str, need: Demand = need) -> int:
            return min(lv[0] for shape, lv in view._pools_of[agent] if matches(shape, need))

        fitting = [a for a, r in view.agents.items() if fits(r, need) and a not in excluded]
        expected = sorted(fitting, key=lambda a: (level(a), host_order(a, salt)))[:k]
        assert got == expected


def test_a_full_host_is_not_drawn_from_even_when_most_hosts_are_full() -> None:
    """Late in a fill most hosts have a GPU free and no CPU: a draw touches only the
    pools that could fit, so it finds the few that do in a handful of lookups."""
    view = ZoneView(stale_after_seconds=1e9)
    for i in range(1000):
        agent = f"h{i}"
        view.update(
            agent,
            "addr",
            {"gpu:A100": ShapeCap(1, 8, 0, 80 * GIB)},
            heat=0,
            draining=False,
            now=0.0,
        )
        cpu = 32_000 if i % 100 == 0 else 500
        view.note_host(agent, HostCap(cpu, 64_000, 256 * GIB, 512 * GIB, (1000,) * 8, 8))
    need = Demand(gpus=1, cpu_milli=16_000, host_memory_bytes=GIB)
    pooled = {agent for pool in view._pools(need) for agent in pool.items}
    assert pooled == {f"h{i}" for i in range(0, 1000, 100)}
    drawn = view.sample(need, 10, random.Random(7))
    assert {r.agent_id for r in drawn} == pooled


def test_the_fixed_order_differs_by_salt_and_is_stable() -> None:
    ids = [f"h{i}" for i in range(50)]
    first = sorted(ids, key=lambda a: host_order(a, 1))
    assert first == sorted(ids, key=lambda a: host_order(a, 1))
    assert first != sorted(ids, key=lambda a: host_order(a, 2))


def test_a_host_with_a_probe_in_flight_is_passed_over_until_it_reports() -> None:
    """Placements in flight at once do not all take the first host in the order: a probed
    host waits out of the ordered draw until a summary from it (reply or heartbeat)."""
    view = ZoneView(stale_after_seconds=1e9)
    shapes = {"gpu:A100": ShapeCap(8, 8, 0, 80 * GIB)}
    for i in range(4):
        view.update(f"h{i}", "addr", dict(shapes), heat=0, draining=False, now=0.0)
    need = Demand(gpus=1)
    first, second = (r.agent_id for r in view.first_in_order(need, 2))
    view.note_probing(first)
    assert [r.agent_id for r in view.first_in_order(need, 1)] == [second]
    view.update(first, "addr", dict(shapes), heat=0, draining=False, now=1.0, is_heartbeat=False)
    assert [r.agent_id for r in view.first_in_order(need, 1)] == [first]
    view.note_probing(first)  # a probe that got no reply: the next heartbeat clears it
    view.agents[first].summary_version = 3
    assert view.refresh(first, 3, "", now=2.0, now_unix=2.0)
    assert [r.agent_id for r in view.first_in_order(need, 1)] == [first]


def _placed(view: ZoneView) -> dict[str, object]:
    """Where each agent sits and what the view holds of its host figures."""
    pools = {
        (shape, levels): sorted(pool.items)
        for shape, by_level in view._by_shape.items()
        for levels, pool in by_level.items()
    }
    hosts = {a: (r.reported_host, r.reported_host_at, r.host) for a, r in view.agents.items()}
    return {"pools": pools, "hosts": hosts}


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(event_st, max_size=20),
    summaries=st.lists(
        st.tuples(
            st.sampled_from(AGENTS),
            shapes_st,
            st.booleans(),
            st.booleans(),
            st.one_of(st.none(), host_st),
        ),
        min_size=1,
        max_size=20,
    ),
)
def test_a_summary_with_its_host_figures_lands_as_update_then_note_host(
    events: list[tuple[object, ...]],
    summaries: list[tuple[str, dict[str, ShapeCap], bool, bool, HostCap | None]],
) -> None:
    """``update(host=...)`` (one reindex per summary) leaves the view as ``update`` then
    ``note_host`` (two) did: the same pools, the same host figures and their time."""
    one, two = ZoneView(stale_after_seconds=2.0), ZoneView(stale_after_seconds=2.0)
    apply(one, events)
    apply(two, events)
    now = 100.0
    for agent, shapes, draining, is_heartbeat, host in summaries:
        now += 1.0
        kwargs = {"heat": 0, "draining": draining, "now": now, "is_heartbeat": is_heartbeat}
        one.update(agent, "addr", dict(shapes), host=host, **kwargs)  # type: ignore[arg-type]
        two.update(agent, "addr", dict(shapes), **kwargs)  # type: ignore[arg-type]
        if host is not None:
            two.note_host(agent, host)
        assert _placed(one) == _placed(two)


@settings(max_examples=200, deadline=None)
@given(events=st.lists(event_st, max_size=30), needs=st.lists(need_st, min_size=1, max_size=4))
def test_host_counts_kept_between_changes_agree_with_a_scan(
    events: list[tuple[object, ...]], needs: list[Demand]
) -> None:
    """The host counts kept per demand until an agent's readiness or shapes change (a job
    that queues reads them; repeated failures of one demand do not scan the zone again)
    equal a scan of every agent after each summary, reply, drain and sweep."""
    view = ZoneView(stale_after_seconds=2.0)
    for event in events:
        apply(view, [event])
        for need in needs:
            assert view.counts(need) == scan_counts(view, need)
