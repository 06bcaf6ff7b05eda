"""Ranked probing (ProbePlan with a rank): at most d probes a round, a bounded number of
candidates scored whatever the zone's size, best first, and never a host whose summary
shows too little host CPU or memory."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_base.demand import Demand, HostCap
from laminar_base.fragmentation import (
    MILLI_SLICING,
    FragmentationCache,
    NodeState,
    PodShape,
    TargetWorkload,
    fgd_gpus,
    fgd_score,
    least_fragmenting_delta,
)
from laminar_zone.placement import ShapeCap, fragmentation_rank
from laminar_zone.view import (
    ORDERED_SIZE,
    AgentRecord,
    ProbeLimits,
    ProbePlan,
    ZoneView,
    fragmentation_ranking,
    host_order,
)

GIB = 1 << 30
NEED = Demand(gpu_milli=500, cpu_milli=4000, host_memory_bytes=8 * GIB)


def make_view(cpu_free: list[int]) -> ZoneView:
    view = ZoneView(stale_after_seconds=1e9)
    for i, cpu in enumerate(cpu_free):
        agent = f"h{i}"
        shapes = {
            "gpu:A100": ShapeCap(8, 8, 0, 80 * GIB),
            "share:A100": ShapeCap(8, 8, 1000, 80 * GIB),
        }
        view.update(agent, f"addr{i}", shapes, heat=0, draining=False, now=0.0)
        view.note_host(agent, HostCap(cpu, 64_000, 256 * GIB, 512 * GIB, (1000,) * 8, 8))
    return view


@settings(max_examples=60, deadline=None)
@given(
    cpu_free=st.lists(st.sampled_from([0, 2000, 4000, 64_000]), min_size=1, max_size=400),
    d=st.integers(1, 4),
    sample_size=st.integers(1, 24),
    regenerations=st.integers(0, 3),
    max_attempts=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    ordered_size=st.integers(0, 24),
)
def test_ranked_plan_probes_at_most_d_of_a_bounded_sample_best_first(
    cpu_free: list[int],
    d: int,
    sample_size: int,
    regenerations: int,
    max_attempts: int,
    seed: int,
    ordered_size: int,
) -> None:
    view = make_view(cpu_free)
    scores = {f"h{i}": random.Random(seed + i).random() for i in range(len(cpu_free))}
    calls: list[str] = []

    def rank(record: AgentRecord) -> float | None:
        calls.append(record.agent_id)
        return scores[record.agent_id]

    limits = ProbeLimits(d, sample_size, max_attempts, regenerations, ordered_size)
    plan = ProbePlan(view, NEED, limits, random.Random(seed), rank=rank)
    probed: list[str] = []
    while batch := plan.next_batch():
        assert len(batch) <= d
        ranked = [scores[r.agent_id] for r in batch]
        assert ranked == sorted(ranked, reverse=True)
        probed += [r.agent_id for r in batch]
    assert len(probed) == len(set(probed)) <= d * max_attempts
    # Scoring is bounded by the sample and its redraws, not by the zone's size.
    drawn = sample_size + ordered_size + limits.tight_size
    assert len(calls) == plan.scored <= drawn * (1 + regenerations)
    # Too little host CPU left shows in the summary: such a host is never probed.
    assert all(cpu_free[int(a[1:])] >= NEED.cpu_milli for a in probed)
    if any(c >= NEED.cpu_milli for c in cpu_free):
        assert probed or plan.scored == 0
    else:
        assert not probed and plan.reason == "no host's summary shows room"


def test_the_first_round_probes_the_best_of_the_sample() -> None:
    view = make_view([64_000] * 6)
    scores = {f"h{i}": s for i, s in enumerate([0.1, 0.9, 0.3, 0.8, 0.2, 0.5])}
    plan = ProbePlan(
        view, NEED, ProbeLimits(2, 6, 4, 0), random.Random(1), rank=lambda r: scores[r.agent_id]
    )
    assert [r.agent_id for r in plan.next_batch()] == ["h1", "h3"]
    assert [r.agent_id for r in plan.next_batch()] == ["h5", "h2"]


def test_fragmentation_rank_prefers_the_gpu_a_share_fills_and_rules_out_short_hosts() -> None:
    frag = FragmentationCache(
        TargetWorkload((PodShape(1000, 0, 1, 500), PodShape(1000, 0, 1, 1000)), (0.5, 0.5)),
        MILLI_SLICING,
    )
    shapes = {"share:A100": ShapeCap(2, 2, 1000, 80 * GIB)}
    half_used = HostCap(32_000, 64_000, 64 * GIB, 128 * GIB, (500, 1000), 2)
    empty = HostCap(32_000, 64_000, 64 * GIB, 128 * GIB, (1000, 1000), 2)
    no_cpu = HostCap(1000, 64_000, 64 * GIB, 128 * GIB, (1000, 1000), 2)
    filled = fragmentation_rank(NEED, half_used, shapes, frag)
    fresh = fragmentation_rank(NEED, empty, shapes, frag)
    assert filled is not None and fresh is not None and filled > fresh
    assert fragmentation_rank(NEED, no_cpu, shapes, frag) is None


def test_a_mig_profile_is_ranked_to_the_gpu_it_fills() -> None:
    """A MIG profile's candidates are ranked too (its compute slices as a share of a GPU):
    a GPU whose free slices the profile fills beats an idle one it would cut up."""
    frag = FragmentationCache(
        TargetWorkload((PodShape(1000, 0, 1, 429), PodShape(1000, 0, 1, 1000)), (0.5, 0.5)),
        MILLI_SLICING,
    )
    rank = fragmentation_ranking(Demand(mig_profile="3g.40gb"), frag)
    assert rank is not None
    shapes = {"mig:3g.40gb": ShapeCap(1, 2, 0, 40 * GIB)}
    scores = {}
    for name, free in (("three_free", 429), ("idle", 1000)):
        record = AgentRecord(name, f"{name}:1", shapes=shapes)
        record.reported_host = HostCap(32_000, 64_000, 64 * GIB, 128 * GIB, (free,), 1)
        scores[name] = rank(record)
    assert scores["three_free"] is not None and scores["idle"] is not None
    assert scores["three_free"] > scores["idle"]


def test_a_heartbeat_outdates_the_host_figures_of_a_probe_reply() -> None:
    view = make_view([0])  # its last probe reply showed no CPU left
    rng = random.Random(1)
    assert view.sample(NEED, 4, rng) == []
    shapes = view.agents["h0"].shapes
    # A heartbeat (which does not carry host figures to the view yet) came since: the old
    # "no CPU" is no longer trusted, so the host is probed again and answers for itself.
    view.update("h0", "addr0", shapes, heat=0, draining=False, now=5.0)
    assert view.agents["h0"].host is None
    assert [r.agent_id for r in view.sample(NEED, 4, rng)] == ["h0"]


def test_the_simulators_default_limits_are_the_routers() -> None:
    from laminar_zone.config import PlacementSettings

    assert PlacementSettings().limits() == ProbeLimits()
    # d = 1 commits on probe, a MIG profile too; a gang still compares two hosts per round.
    one = Demand(gpus=1)
    assert ProbeLimits().probes_per_attempt == 1
    assert ProbeLimits().for_try(one, 1).probes_per_attempt == 1
    assert ProbeLimits().for_try(one, 3).probes_per_attempt == 2
    assert ProbeLimits().for_try(Demand(mig_profile="3g.40gb"), 1).probes_per_attempt == 1
    assert ProbeLimits().for_try(Demand(mig_profile="3g.40gb"), 2).probes_per_attempt == 2
    assert ProbeLimits(probes_per_attempt=4).for_try(one, 3).probes_per_attempt == 4


TARGET = TargetWorkload(
    (PodShape(4000, 0, 1, 500), PodShape(8000, 0, 2, 1000), PodShape(2000, 0, 1, 250)),
    (0.5, 0.3, 0.2),
)


@settings(max_examples=80, deadline=None)
@given(
    nodes=st.lists(
        st.tuples(
            st.integers(0, 16_000),
            st.lists(st.sampled_from([0, 250, 500, 750, 1000]), min_size=1, max_size=4),
        ),
        min_size=1,
        max_size=12,
    ),
    pods=st.lists(
        st.tuples(
            st.sampled_from([0, 2000, 4000]), st.sampled_from([(1, 250), (1, 500), (2, 1000)])
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_memoized_node_score_is_fgds_score_of_the_least_fragmenting_placement(
    nodes: list[tuple[int, list[int]]], pods: list[tuple[int, tuple[int, int]]]
) -> None:
    frag = FragmentationCache(TARGET, MILLI_SLICING)
    for cpu, gpus in nodes:
        for order in (gpus, gpus[::-1]):
            node = NodeState("A100", cpu, 1 << 20, tuple(order))
            for pod_cpu, (count, milli) in pods:
                pod = PodShape(pod_cpu, 0, count, milli)
                best = least_fragmenting_delta(node, pod, frag)
                want = None if best is None else fgd_gpus(node, pod, frag)
                assert (best is None) == (want is None)
                if best is not None and want is not None:
                    assert frag.node_score(node, pod) == fgd_score(best[1]) == want[1]


def ordered_view(hosts: int, salt: int) -> ZoneView:
    """``hosts`` alike hosts h0, h1, ... in a view whose fixed order ``salt`` picks; every
    third (h0, h3, ...) has no CPU left for NEED."""
    view = ZoneView(stale_after_seconds=1e9, order_salt=salt)
    for i in range(hosts):
        agent = f"h{i}"
        shapes = {"share:A100": ShapeCap(8, 8, 1000, 80 * GIB)}
        view.update(agent, f"addr{i}", shapes, heat=0, draining=False, now=0.0)
        cpu = 0 if i % 3 == 0 else 64_000
        view.note_host(agent, HostCap(cpu, 64_000, 256 * GIB, 512 * GIB, (1000,) * 8, 8))
    return view


@settings(max_examples=40, deadline=None)
@given(
    hosts=st.integers(2, 60),
    ordered_size=st.integers(1, 8),
    sample_size=st.integers(0, 8),
    seed=st.integers(0, 2**16),
    salt=st.integers(0, 2**16),
)
def test_equal_scores_go_to_the_host_first_in_the_fixed_order(
    hosts: int, ordered_size: int, sample_size: int, seed: int, salt: int
) -> None:
    """As FGD breaks equal scores by one fixed node order, the router breaks them by its
    view's host order: whatever the random sample holds, the first host probed is the
    fitting host first in that order."""
    view = ordered_view(hosts, salt)
    limits = ProbeLimits(1, sample_size, 4, 0, ordered_size)
    plan = ProbePlan(view, NEED, limits, random.Random(seed), rank=lambda r: 50.0)
    fitting = [f"h{i}" for i in range(hosts) if i % 3]
    first = min(fitting, key=view.order_of)
    assert [r.agent_id for r in plan.next_batch()] == [first]


@settings(max_examples=20, deadline=None)
@given(salt=st.integers(0, 2**16), seed=st.integers(0, 2**16))
def test_the_default_draw_ranks_the_first_fitting_hosts_in_order(salt: int, seed: int) -> None:
    """The default ordered draw reaches the ORDERED_SIZE-th fitting host in the view's
    order, past hosts that cannot take the demand: with no random sample, a better score
    there is probed first, and one host further is never drawn."""
    hosts = 120
    limits = replace(ProbeLimits(), sample_size=0, regenerations=0, tight_size=0)
    last = ORDERED_SIZE - 1
    assert limits.ordered_size == ORDERED_SIZE
    for place, probed in ((last, last), (last + 1, 0)):
        view = ordered_view(hosts, salt)
        fitting = sorted((f"h{i}" for i in range(hosts) if i % 3), key=view.order_of)
        target = fitting[place]

        def rank(record: AgentRecord, target: str = target) -> float:
            return 90.0 if record.agent_id == target else 50.0

        plan = ProbePlan(view, NEED, limits, random.Random(seed), rank=rank)
        assert [r.agent_id for r in plan.next_batch()] == [fitting[probed]]


@settings(max_examples=20, deadline=None)
@given(salt=st.integers(0, 2**16), seed=st.integers(0, 2**16), place=st.integers(40, 119))
def test_a_host_the_task_fills_exactly_is_ranked_wherever_it_is_in_the_order(
    salt: int, seed: int, place: int
) -> None:
    """Hosts with all 8 GPUs free, one with exactly the 2 a task asks for, far past the
    ordered draw: the tight draw brings it to the ranking, so a better score there is
    probed first; without the tight draw (and no random sample) it is never drawn."""
    view = ZoneView(stale_after_seconds=1e9, order_salt=salt)
    ids = [f"h{i}" for i in range(120)]
    by_order = sorted(ids, key=lambda a: host_order(a, salt))
    exact = by_order[place]
    for agent in ids:
        free = 2 if agent == exact else 8
        shapes = {"gpu:A100": ShapeCap(free, 8, 0, 80 * GIB)}
        view.update(agent, "addr", shapes, heat=0, draining=False, now=0.0)
        gpus = (1000,) * free + (0,) * (8 - free)
        view.note_host(agent, HostCap(64_000, 64_000, 256 * GIB, 512 * GIB, gpus, 8))
    need = Demand(gpus=2, cpu_milli=1000, host_memory_bytes=GIB)

    def rank(record: AgentRecord) -> float:
        return 90.0 if record.agent_id == exact else 50.0

    for tight, probed in ((1, exact), (0, by_order[0])):
        limits = replace(ProbeLimits(), sample_size=0, regenerations=0, tight_size=tight)
        plan = ProbePlan(view, need, limits, random.Random(seed), rank=rank)
        assert [r.agent_id for r in plan.next_batch()] == [probed]
