"""The index of free capacity (:class:`laminar_zone.free_index.FreeIndex`) answers as a plain
walk over every host with :func:`members_fitting` would, as summaries come and go: many
hosts with distinct largest free memories (as re-runs that each declare their own memory
leave them) asked by many distinct demands, so the grouped answer, not only the plain one
kept for irregular summaries, is what is compared. The view's own property test
(test_view_counts_props.py) holds the view's answers built on it to a scan."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_base.demand import Demand
from laminar_zone.free_index import FreeIndex
from laminar_zone.placement import CPU_ONLY_CAPACITY, ShapeCap, members_fitting

GIB = 1 << 30
AGENTS = [f"a{i}" for i in range(24)]


def _cap(total_max: int, *, share: bool) -> st.SearchStrategy[ShapeCap]:
    return st.integers(0 if not share else 1, total_max).flatmap(
        lambda total: st.builds(
            ShapeCap,
            free=st.integers(0, total),
            total=st.just(total),
            max_free_milli=st.integers(0, 1000) if share else st.just(0),
            max_free_memory_bytes=st.integers(0, 80).map(lambda g: g * GIB // 4),
        )
    )


#: Mostly what an agent's ledger sends (one model), sometimes what the index keeps aside:
#: two models of one kind (a model-less demand sums them), or figures out of range.
shapes_st = st.one_of(
    st.fixed_dictionaries(
        {"share:H100": _cap(8, share=True)}, optional={"gpu:H100": _cap(8, share=False)}
    ),
    st.fixed_dictionaries({"gpu:A100": _cap(8, share=False)}),
    st.fixed_dictionaries(
        {"mig:1g.10gb": _cap(7, share=True), "mig:3g.40gb": _cap(2, share=False)}
    ),
    st.fixed_dictionaries({"share:A100": _cap(4, share=True), "share:H100": _cap(4, share=True)}),
    st.builds(
        lambda free, milli: {"share:H100": ShapeCap(free, 1, milli, 40 * GIB)},
        st.integers(0, 3),
        st.sampled_from([0, 500, 1500, -1]),
    ),
)
need_st = st.one_of(
    st.builds(Demand, gpus=st.integers(1, 9), gpu_model=st.sampled_from(["", "A100", "H100"])),
    st.builds(
        Demand,
        gpu_milli=st.integers(1, 1100),
        gpu_model=st.sampled_from(["", "A100", "H100", "V100"]),
    ),
    st.builds(Demand, mig_profile=st.sampled_from(["1g.10gb", "3g.40gb"]), gpus=st.integers(0, 2)),
    st.builds(Demand, mig_profile=st.just("1g.10gb"), gpu_milli=st.integers(1, 1000)),
).flatmap(
    lambda need: st.integers(0, 81).map(
        lambda g: Demand(
            gpus=need.gpus,
            mig_profile=need.mig_profile,
            gpu_milli=need.gpu_milli,
            gpu_model=need.gpu_model,
            gpu_memory_bytes=g * GIB // 4,
        )
    )
)


def plain_free(held: dict[str, dict[str, ShapeCap]], need: Demand) -> int:
    return sum(min(members_fitting(need, s), CPU_ONLY_CAPACITY) for s in held.values())


def plain_fitting(held: dict[str, dict[str, ShapeCap]], need: Demand) -> int:
    return sum(
        1
        for s in held.values()
        if members_fitting(need, s) >= 1 and members_fitting(need, s, total=True) >= 1
    )


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(AGENTS), st.one_of(st.none(), shapes_st)), max_size=80
    ),
    needs=st.lists(need_st, min_size=1, max_size=12),
)
def test_free_index_answers_as_a_plain_walk(
    steps: list[tuple[str, dict[str, ShapeCap] | None]], needs: list[Demand]
) -> None:
    index = FreeIndex()
    held: dict[str, dict[str, ShapeCap]] = {}
    for i, (agent, shapes) in enumerate(steps):
        if agent in held:
            index.remove(agent, held.pop(agent))
        if shapes is not None:  # None: the agent left (stale, draining)
            held[agent] = shapes
            index.add(agent, shapes)
        if i % 7 == 0:
            for need in needs[:2]:
                assert index.free_members(need) == plain_free(held, need), need
                assert index.hosts_fitting(need) == plain_fitting(held, need), need
    for need in needs:
        assert index.free_members(need) == plain_free(held, need), need
        assert index.hosts_fitting(need) == plain_fitting(held, need), need
    for agent in list(held):
        index.remove(agent, held.pop(agent))
    assert not index.irregular and not index._by_share and not index._by_free


def test_distinct_memories_are_counted_by_bisection() -> None:
    """Hosts with one share free each and distinct free memories: a demand counts exactly
    those whose memory holds its declaration, whatever its share (grouped, none aside)."""
    index = FreeIndex()
    for i in range(10):
        index.add(f"a{i}", {"share:H100": ShapeCap(0, 1, 500 + 50 * (i % 2), i * GIB)})
    assert not index.irregular
    need = Demand(gpu_milli=250, gpu_memory_bytes=4 * GIB)
    assert index.free_members(need) == 6 * 2  # hosts 4..9, two 250-milli members each
    assert index.hosts_fitting(need) == 6
    assert index.hosts_fitting(Demand(gpu_milli=520, gpu_memory_bytes=4 * GIB)) == 3
    assert index.free_members(Demand(gpu_milli=600)) == 0
