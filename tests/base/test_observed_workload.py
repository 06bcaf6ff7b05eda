"""The target workload a router learns: its own arrivals, its peers' own arrivals (each
peer's latest summary replacing its last), and a prior; what it tells peers is its own
arrivals only, so no count travels twice."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_base.fragmentation import (
    MILLI_SLICING,
    TYPICAL_COVERAGE_RATIO,
    ObservedWorkload,
    PodShape,
    typical_workload,
)

SHAPES = [
    PodShape(4000, 0, 1, 500),
    PodShape(8000, 0, 2, 1000),
    PodShape(1000, 0, 0, 0),
    PodShape(2000, 0, 1, 250, ("A100",)),
]
shape_st = st.sampled_from(SHAPES)
counts_st = st.dictionaries(shape_st, st.integers(0, 50), max_size=4)
event_st = st.one_of(
    st.tuples(st.just("observe"), shape_st),
    st.tuples(st.just("peer"), st.sampled_from(["z1", "z2"]), counts_st),
    st.tuples(st.just("prior"), counts_st),
)


@settings(max_examples=200, deadline=None)
@given(events=st.lists(event_st, max_size=40))
def test_counts_are_own_plus_each_peers_latest_plus_the_prior(
    events: list[tuple[object, ...]],
) -> None:
    workload = ObservedWorkload(MILLI_SLICING)
    own: Counter[PodShape] = Counter()
    prior: Counter[PodShape] = Counter()
    peers: dict[str, Counter[PodShape]] = {}
    observed = 0
    for event in events:
        kind = event[0]
        if kind == "observe":
            shape = event[1]
            assert isinstance(shape, PodShape)
            workload.observe(shape)
            own[shape] += 1
        elif kind == "peer":
            name, counts = event[1], event[2]
            assert isinstance(name, str) and isinstance(counts, dict)
            workload.note_peer(name, counts)
            peers[name] = Counter({s: c for s, c in counts.items() if c > 0})
        else:
            counts = event[1]
            assert isinstance(counts, dict)
            workload.add_prior(counts)
            prior.update({s: c for s, c in counts.items() if c > 0})
        assert workload.observed >= observed  # only grows: a build's version is new
        observed = workload.observed
        want = own + prior + sum(peers.values(), Counter())
        assert +workload.counts == want
        assert workload.own == own  # what peers are told: this router's own arrivals
    frag = workload.cache()  # the agents' measure: no wait for min_observed
    if workload.counts:
        assert frag is not None and set(frag.target.shapes) <= set(workload.counts)
    else:
        assert frag is None


def test_a_peers_new_summary_replaces_its_last() -> None:
    workload = ObservedWorkload(MILLI_SLICING)
    workload.observe(SHAPES[0])
    workload.note_peer("z1", {SHAPES[1]: 5})
    workload.note_peer("z1", {SHAPES[1]: 7, SHAPES[2]: 1})
    assert workload.counts == {SHAPES[0]: 1, SHAPES[1]: 7, SHAPES[2]: 1}
    workload.note_peer("z1", {})
    assert +workload.counts == {SHAPES[0]: 1}


def test_peers_past_the_limit_are_not_counted() -> None:
    workload = ObservedWorkload(MILLI_SLICING, max_peers=1)
    workload.note_peer("z1", {SHAPES[0]: 2})
    workload.note_peer("z2", {SHAPES[0]: 3})
    assert workload.counts == {SHAPES[0]: 2}


def test_a_prior_past_max_shapes_keeps_its_most_frequent_shapes() -> None:
    """A prior with more shapes than a router keeps loses its rarest, whatever the
    file's order; shapes that differ only in host memory count as one."""
    workload = ObservedWorkload(MILLI_SLICING, max_shapes=2)
    workload.add_prior(
        {
            SHAPES[2]: 1,
            SHAPES[3]: 5,
            PodShape(4000, 1 << 30, 1, 500): 3,
            PodShape(4000, 2 << 30, 1, 500): 3,
            SHAPES[1]: 4,
        }
    )
    assert workload.counts == {SHAPES[0]: 6, SHAPES[3]: 5}
    assert workload.observed == 11


def test_no_target_before_min_observed_then_rebuilt_at_doublings_then_every_refresh() -> None:
    workload = ObservedWorkload(MILLI_SLICING, refresh_every=8, min_observed=3)
    builds = []
    for n in range(1, 41):
        workload.observe(SHAPES[n % 2])
        frag = workload.cache(SHAPES[0])
        assert (frag is None) == (n < 3)
        if workload.version == n:
            builds.append(n)
    assert builds == [1, 2, 4, 8, 16, 24, 32, 40]


def test_a_prior_counts_toward_min_observed() -> None:
    workload = ObservedWorkload(MILLI_SLICING, min_observed=10)
    workload.observe(SHAPES[0])
    assert workload.cache(SHAPES[0]) is None
    workload.add_prior({SHAPES[1]: 9})
    frag = workload.cache(SHAPES[0])
    assert frag is not None and set(frag.target.shapes) == {SHAPES[0], SHAPES[1]}


def test_only_shapes_of_one_gpu_or_none_wait_for_min_observed() -> None:
    """Before ``min_observed`` a shape of several GPUs, and the agents' measure
    (``cache()``), use the target; shapes of one GPU (whole or shared) or none do not."""
    workload = ObservedWorkload(MILLI_SLICING, min_observed=3)
    multi, shared, cpu, whole = SHAPES[1], SHAPES[0], SHAPES[2], PodShape(4000, 0, 1, 1000)
    workload.observe(multi)
    workload.observe(shared)
    frag = workload.cache(multi)
    assert frag is not None and workload.cache() is frag and workload.version == 2
    assert [workload.cache(s) for s in (shared, cpu, whole)] == [None, None, None]
    workload.observe(cpu)
    assert all(workload.cache(s) is not None for s in (shared, cpu, whole))


@settings(max_examples=100, deadline=None)
@given(counts=counts_st.filter(lambda c: any(c.values())))
def test_the_target_is_the_papers_cut_of_the_counts(counts: dict[PodShape, int]) -> None:
    """The learned target is FGD's: the most frequent observed shapes until they cover
    :data:`TYPICAL_COVERAGE_RATIO` of the tasks, renormalized."""
    workload = ObservedWorkload(MILLI_SLICING, min_observed=0)
    for shape, count in counts.items():
        workload.observe(shape, count)
    frag = workload.cache()
    assert frag is not None
    assert frag.target == typical_workload(counts, TYPICAL_COVERAGE_RATIO)
    covered = sum(counts[s] for s in frag.target.shapes)
    assert covered >= TYPICAL_COVERAGE_RATIO * sum(counts.values())
    assert abs(sum(frag.target.probabilities) - 1.0) < 1e-9
