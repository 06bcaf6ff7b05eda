"""The view's host counts and free members without a scan: :meth:`ZoneView.counts` (a kept
ready count, "fits ever" kept until totals or readiness change, "fits now" over the index's
pools) and :meth:`ZoneView.free_for` (over the index's pools) give exactly what a scan of
every agent gives, whatever sequence of summaries, probe replies, host figures, drains,
stale marks and sweeps came before, with queries interleaved so that kept answers are read
across changes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from viewscan import apply_event, scan_counts, scan_free

from laminar_base.demand import Demand, HostCap
from laminar_zone.placement import ShapeCap
from laminar_zone.view import ZoneView

GIB = 1 << 30
AGENTS = [f"a{i}" for i in range(7)]
MODELS = ["A100", "H100"]


def _cap(total_max: int) -> st.SearchStrategy[ShapeCap]:
    return st.integers(0, total_max).flatmap(
        lambda total: st.builds(
            ShapeCap,
            free=st.integers(0, total),
            total=st.just(total),
            max_free_milli=st.sampled_from([0, 50, 250, 499, 500, 999, 1000]),
            max_free_memory_bytes=st.sampled_from([0, 10 * GIB, 40 * GIB, 80 * GIB]),
        )
    )


shapes_st = st.fixed_dictionaries(
    {},
    optional={
        **{f"gpu:{model}": _cap(8) for model in MODELS},
        **{f"share:{model}": _cap(8) for model in MODELS},
        "mig:1g.10gb": _cap(7),
        "mig:3g.40gb": _cap(2),
    },
)
host_st = st.builds(
    HostCap,
    cpu_free_milli=st.integers(0, 64_000),
    cpu_total_milli=st.sampled_from([0, 64_000]),
    memory_free_bytes=st.integers(0, 512 * GIB),
    memory_total_bytes=st.sampled_from([0, 512 * GIB]),
)
event_st = st.one_of(
    st.tuples(st.just("heartbeat"), st.sampled_from(AGENTS), shapes_st, st.booleans()),
    st.tuples(st.just("reply"), st.sampled_from(AGENTS), shapes_st, st.booleans()),
    st.tuples(st.just("host"), st.sampled_from(AGENTS), host_st),
    st.tuples(st.just("drain"), st.sampled_from(AGENTS), st.booleans()),
    st.tuples(st.just("stale"), st.sampled_from(AGENTS)),
    st.tuples(st.just("placeholder"), st.sampled_from(AGENTS)),
    st.tuples(st.just("sweep"), st.integers(0, 3)),
)
model_st = st.sampled_from(["", *MODELS, "V100"])
need_st = st.one_of(
    st.builds(Demand, gpus=st.integers(1, 9), gpu_model=model_st),
    st.builds(Demand, gpu_milli=st.sampled_from([1, 50, 99, 250, 500, 1000]), gpu_model=model_st),
    st.builds(Demand, mig_profile=st.sampled_from(["1g.10gb", "3g.40gb", "7g.80gb"])),
    st.builds(Demand, mig_profile=st.just("1g.10gb"), gpus=st.integers(2, 3)),
    st.builds(Demand, mig_profile=st.just("1g.10gb"), gpu_milli=st.sampled_from([100, 500])),
    st.builds(Demand),
).flatmap(
    lambda need: st.builds(
        lambda cpu, memory, gpu_memory: Demand(
            gpus=need.gpus,
            mig_profile=need.mig_profile,
            gpu_milli=need.gpu_milli,
            gpu_model=need.gpu_model,
            gpu_memory_bytes=gpu_memory,
            cpu_milli=cpu,
            host_memory_bytes=memory,
        ),
        st.sampled_from([0, 1000, 70_000]),
        st.sampled_from([0, GIB, 600 * GIB]),
        st.sampled_from([0, 10 * GIB, 40 * GIB, 81 * GIB]),
    )
)
step_st = st.one_of(
    event_st.map(lambda event: ("event", event)),
    st.lists(need_st, min_size=1, max_size=3).map(lambda needs: ("ask", needs)),
)


@settings(max_examples=400, deadline=None)
@given(steps=st.lists(step_st, max_size=50), last=st.lists(need_st, min_size=1, max_size=4))
def test_counts_and_free_for_equal_a_scan(
    steps: list[tuple[str, object]], last: list[Demand]
) -> None:
    view = ZoneView(stale_after_seconds=2.5)
    now = 0.0
    for kind, payload in [*steps, ("ask", last)]:
        now += 1.0
        if kind == "event":
            apply_event(view, payload, now)  # type: ignore[arg-type]
            continue
        for need in payload:  # type: ignore[attr-defined]
            # Asked twice: the second answer may come from what the first kept.
            for _ in range(2):
                assert view.counts(need) == scan_counts(view, need), need
                assert view.free_for(need) == scan_free(view, need), need
    assert view._ready_count == sum(1 for r in view.agents.values() if r.is_ready)


def test_fits_ever_is_kept_across_free_capacity_changes() -> None:
    """A placement changes an agent's free capacity, not its totals: the "fits ever" figures
    are read from what was kept (no rescan), and still equal the scan's."""
    view = ZoneView(stale_after_seconds=60.0)
    for i in range(4):
        view.update(f"a{i}", "addr", {"gpu:A100": ShapeCap(8, 8)}, heat=0, draining=False, now=1)
    need = Demand(gpus=2)
    assert view.counts(need) == scan_counts(view, need) == view.counts(need)
    version = view._totals_version
    view.update("a0", "addr", {"gpu:A100": ShapeCap(1, 8)}, heat=0, draining=False, now=2)
    assert view._totals_version == version
    assert view.counts(need) == scan_counts(view, need)
    assert view.counts(need).fitting == 3 and view.free_for(need) == 12
    view.set_draining("a1", True)
    assert view._totals_version == version + 1
    assert view.counts(need) == scan_counts(view, need)
    assert view.counts(need).ready == 3 and view.counts(need).members_total == 12
