"""The shrunk target workload (:func:`smoothed_workload`): a distribution, the counts' own
mix without shrinkage, the counts' mix in the limit of many observations, and weight only
on pairs of a GPU request and a CPU request that were each seen."""

from __future__ import annotations

import itertools
import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_base.fragmentation import (
    MILLI_SLICING,
    ObservedWorkload,
    PodShape,
    TargetWorkload,
    smoothed_workload,
    typical_workload,
)

GPU_REQUESTS = [(1, 500, ()), (2, 1000, ()), (0, 0, ()), (1, 250, ("A100",)), (8, 1000, ())]
CPUS = [0, 1000, 4000, 8000, 32000]
shape_st = st.builds(
    lambda g, cpu: PodShape(cpu, 0, g[0], g[1], g[2]),
    st.sampled_from(GPU_REQUESTS),
    st.sampled_from(CPUS),
)
counts_st = st.dictionaries(shape_st, st.integers(1, 40), min_size=1, max_size=12)


def _mix(target: TargetWorkload) -> dict[PodShape, float]:
    return dict(zip(target.shapes, target.probabilities, strict=True))


def _distance(a: TargetWorkload, b: TargetWorkload) -> float:
    """Total variation distance between two targets."""
    pa, pb = _mix(a), _mix(b)
    return 0.5 * sum(abs(pa.get(s, 0.0) - pb.get(s, 0.0)) for s in set(pa) | set(pb))


@settings(max_examples=200, deadline=None)
@given(counts=counts_st, k=st.floats(0, 2000), ratio=st.sampled_from([0.95, 1.0]))
def test_a_distribution_over_seen_gpu_and_cpu_requests(
    counts: dict[PodShape, int], k: float, ratio: float
) -> None:
    target = smoothed_workload(counts, k, ratio)
    assert math.isclose(sum(target.probabilities), 1.0, rel_tol=1e-9)
    assert all(p > 0 for p in target.probabilities)
    assert len(set(target.shapes)) == len(target.shapes)
    gpu_seen = {(s.num_gpu, s.gpu_milli, s.gpu_models) for s in counts}
    cpu_seen = {s.cpu_milli for s in counts}
    for shape in target.shapes:
        assert (shape.num_gpu, shape.gpu_milli, shape.gpu_models) in gpu_seen
        assert shape.cpu_milli in cpu_seen


@settings(max_examples=100, deadline=None)
@given(counts=counts_st, ratio=st.sampled_from([0.95, 1.0]))
def test_no_shrinkage_is_the_counts_own_mix(counts: dict[PodShape, int], ratio: float) -> None:
    assert smoothed_workload(counts, 0.0, ratio) == typical_workload(counts, ratio)


@settings(max_examples=100, deadline=None)
@given(counts=counts_st, k=st.floats(1, 1000))
def test_converges_to_the_counts_mix_as_observations_grow(
    counts: dict[PodShape, int], k: float
) -> None:
    """The same mix observed m times over: the distance to the empirical mix shrinks, and is
    under k / (k + n_min) with n_min the least observed GPU request's count."""
    distances = []
    for m in (1, 10, 100, 1_000_000):
        scaled = {s: c * m for s, c in counts.items()}
        distance = _distance(smoothed_workload(scaled, k, 1.0), typical_workload(scaled, 1.0))
        by_group: Counter[tuple[int, int, tuple[str, ...]]] = Counter()
        for s, c in scaled.items():
            by_group[(s.num_gpu, s.gpu_milli, s.gpu_models)] += c
        assert distance <= k / (k + min(by_group.values())) + 1e-9
        distances.append(distance)
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(distances))
    assert distances[-1] < 0.01


def test_a_rarely_seen_gpu_request_borrows_the_mix_cpu_requests() -> None:
    """Two tasks of 8 GPUs, both with 32 cores; 1,000 shared tasks, half with 4 cores, half
    with 8. With k = 100, the 8-GPU request keeps its total weight, and most of it moves to
    the CPU requests of the whole mix; the shared tasks' CPU mix barely moves."""
    counts = {
        PodShape(32000, 0, 8, 1000): 2,
        PodShape(4000, 0, 1, 500): 500,
        PodShape(8000, 0, 1, 500): 500,
    }
    mix = _mix(smoothed_workload(counts, 100.0, 1.0))
    eight = {s.cpu_milli: p for s, p in mix.items() if s.num_gpu == 8}
    assert math.isclose(sum(eight.values()), 2 / 1002)
    assert eight[32000] < 0.05 * sum(eight.values())
    assert math.isclose(eight[4000], eight[8000])
    shared = {s.cpu_milli: p for s, p in mix.items() if s.num_gpu == 1}
    assert shared.get(32000, 0.0) < 0.001 * sum(shared.values())


def test_observed_workload_builds_the_shrunk_target() -> None:
    """32 observations: the last build (at a doubling) saw them all."""
    workload = ObservedWorkload(MILLI_SLICING, min_observed=0, shrink_count=50.0)
    counts: Counter[PodShape] = Counter()
    for shape in [PodShape(4000, 0, 1, 500)] * 28 + [PodShape(16000, 0, 2, 1000)] * 4:
        workload.observe(shape)
        counts[shape] += 1
    cache = workload.cache()
    assert cache is not None
    assert cache.target == smoothed_workload(counts, 50.0, workload.coverage_ratio)
    assert cache.target != typical_workload(counts, workload.coverage_ratio)
