"""Pure policy functions on hand-checkable nodes: fragmentation, FGD, best fit, dot product, MIG."""

from __future__ import annotations

import math

import numpy as np
import pytest

from laminar_sim.policies import (
    MILLI_SLICING,
    FragmentationCache,
    MigSlicing,
    NodeState,
    PodShape,
    TargetWorkload,
    best_fit_gpu,
    best_fit_score,
    dot_product_score,
    fgd_gpus,
    fgd_score,
    fits,
    node_fragmentation_milli,
    place,
    random_gpu,
    score_node,
)

WHOLE = PodShape(cpu_milli=4000, memory_mib=0, num_gpu=1, gpu_milli=1000)
HALF = PodShape(cpu_milli=2000, memory_mib=0, num_gpu=1, gpu_milli=500)
CPU_ONLY = PodShape(cpu_milli=1000, memory_mib=0, num_gpu=0, gpu_milli=0)
MIXED = TargetWorkload((WHOLE, HALF, CPU_ONLY), (0.5, 0.25, 0.25))
ONLY_WHOLE = TargetWorkload((WHOLE,), (1.0,))


def node(gpus: tuple[int, ...], cpu: int = 8000, model: str = "T4", mem: int = 65536) -> NodeState:
    return NodeState(model, cpu, mem, gpus)


def test_fragmentation_hand_computed() -> None:
    # Free GPUs 1000, 300, 0 (1300 milli in all).
    # WHOLE fits (one GPU has 1000): fragments are GPUs below 1000 -> 300.
    # HALF fits: fragments are GPUs below 500 -> 300.
    # CPU_ONLY needs no GPU: all 1300 free milli are fragments to it.
    expected = 0.5 * 300 + 0.25 * 300 + 0.25 * 1300
    assert node_fragmentation_milli(node((1000, 300, 0)), MIXED, MILLI_SLICING) == expected


def test_fragmentation_when_tasks_cannot_run_counts_every_free_gpu() -> None:
    # 1500 milli CPU left: neither WHOLE (4000) nor HALF (2000) fits; CPU_ONLY counts all anyway.
    assert node_fragmentation_milli(node((1000, 300, 0), cpu=1500), MIXED, MILLI_SLICING) == 1300
    # No GPU has 1000 free: a whole-GPU task cannot run, so all 900 milli are fragments.
    assert node_fragmentation_milli(node((600, 300)), ONLY_WHOLE, MILLI_SLICING) == 900
    # A task restricted to another GPU model cannot use this node at all.
    v100_only = PodShape(4000, 0, 1, 1000, ("V100M16",))
    target = TargetWorkload((v100_only,), (1.0,))
    assert node_fragmentation_milli(node((1000, 1000)), target, MILLI_SLICING) == 2000
    # A full node has nothing to fragment.
    assert node_fragmentation_milli(node((0, 0)), MIXED, MILLI_SLICING) == 0


def test_fragmentation_is_invariant_to_gpu_order() -> None:
    cache = FragmentationCache(MIXED, MILLI_SLICING)
    assert cache(node((1000, 300, 0))) == cache(node((0, 1000, 300)))


def test_fgd_score_is_a_truncated_sigmoid_of_the_change() -> None:
    assert fgd_score(0.0) == 50
    assert fgd_score(-300.0) == int(100 / (1 + math.exp(-0.3)))
    assert fgd_score(700.0) < fgd_score(-300.0)


def test_fgd_does_not_split_a_free_gpu_that_whole_gpu_tasks_need() -> None:
    """A 300-milli task: best fit splits node A's only free GPU, FGD fills B's partial GPU."""
    cache = FragmentationCache(ONLY_WHOLE, MILLI_SLICING)
    pod = PodShape(1000, 0, 1, 300)
    a = node((1000,))
    b = node((1000, 400))
    # Best fit: A is left with 700 free milli, B with 1100, so A scores higher.
    assert best_fit_score(a, pod, MILLI_SLICING) > best_fit_score(b, pod, MILLI_SLICING)
    # FGD: on A the free GPU becomes a 700-milli fragment (+700); on B's second GPU the
    # 400-milli fragment shrinks to 100 (-300); B's first GPU would add +700.
    assert fgd_gpus(a, pod, cache) == ((0,), fgd_score(700.0))
    assert fgd_gpus(b, pod, cache) == ((1,), fgd_score(-300.0))
    score_a = score_node("fgd", a, pod, cache)
    score_b = score_node("fgd", b, pod, cache)
    assert score_a is not None and score_b is not None and score_b[0] > score_a[0]


def test_best_fit_packs_and_picks_the_fullest_gpu_that_fits() -> None:
    pod = PodShape(2000, 0, 1, 250)
    assert best_fit_gpu(node((1000, 300, 600, 250)), pod, MILLI_SLICING) == (3,)
    assert best_fit_gpu(node((1000, 200)), pod, MILLI_SLICING) == (0,)
    assert best_fit_gpu(node((200, 100)), pod, MILLI_SLICING) is None
    # Whole GPUs: lowest-index free ones.
    two = PodShape(2000, 0, 2, 1000)
    assert best_fit_gpu(node((500, 1000, 1000, 1000)), two, MILLI_SLICING) == (1, 2)
    # The emptier node scores lower: 0.5*(cpu left)/128000 + 0.5*(gpu left)/8000 is the waste.
    busy, idle = node((250,), cpu=2000), node((1000, 1000), cpu=64000)
    assert best_fit_score(busy, pod, MILLI_SLICING) == 100
    waste = 0.5 * 62000 / 128000 + 0.5 * 1750 / 8000
    assert best_fit_score(idle, pod, MILLI_SLICING) == int((1 - waste) * 100)


def test_dot_product_prefers_the_smaller_product() -> None:
    pod = PodShape(32000, 0, 1, 1000)
    small = node((1000,), cpu=32000)
    large = node((1000,) * 8, cpu=96000)
    dot_small = (32000 / 128000 * 32000 / 128000 + 1000 / 8000 * 1000 / 8000) / 2
    assert dot_product_score(small, pod, MILLI_SLICING) == int((1 - dot_small) * 100)
    assert dot_product_score(small, pod, MILLI_SLICING) > dot_product_score(
        large, pod, MILLI_SLICING
    )


def test_fits_checks_cpu_memory_model_and_gpus() -> None:
    n = node((1000, 400), cpu=4000, mem=8192)
    assert fits(n, PodShape(4000, 8192, 1, 1000), MILLI_SLICING)
    assert not fits(n, PodShape(4001, 0, 1, 100), MILLI_SLICING)
    assert not fits(n, PodShape(0, 8193, 0, 0), MILLI_SLICING)
    assert not fits(n, PodShape(0, 0, 1, 100, ("A100",)), MILLI_SLICING)
    assert fits(n, PodShape(0, 0, 1, 100, ("A100", "T4")), MILLI_SLICING)
    assert not fits(n, PodShape(0, 0, 2, 1000), MILLI_SLICING)
    after = place(n, PodShape(1000, 1024, 1, 300), (1,), MILLI_SLICING)
    assert after == NodeState("T4", 3000, 7168, (1000, 100))


def test_random_gpu_draws_only_fitting_gpus() -> None:
    rng = np.random.default_rng(5)
    pod = PodShape(0, 0, 1, 400)
    seen = {random_gpu(node((1000, 300, 500, 100)), pod, MILLI_SLICING, rng) for _ in range(200)}
    assert seen == {(0,), (2,)}


def test_mig_rounds_up_to_profiles_and_respects_offsets() -> None:
    mig = MigSlicing()
    assert [mig.request(m) for m in (50, 142, 150, 300, 450, 550, 600, 1000)] == [
        1,
        1,
        2,
        3,
        4,
        4,
        7,
        7,
    ]
    full = mig.full
    after_4g = mig.take(full, 4)  # 4g sits at offset 0
    assert after_4g == 0b1110000
    assert mig.fits(after_4g, 3) and mig.fits(after_4g, 2) and not mig.fits(after_4g, 4)
    assert mig.take(after_4g, 3) == 0
    # Three 2g slices take offsets 0, 2, 4; the last free slice (6) fits only a 1g.
    left = full
    for _ in range(3):
        left = mig.take(left, 2)
    assert left == 0b1000000 and not mig.fits(left, 2) and mig.fits(left, 1)
    assert mig.free_milli(left) == pytest.approx(1000 / 7)
    with pytest.raises(ValueError):
        mig.take(left, 2)
    # Whole-GPU tasks need all seven slices; fragmentation sees slices as milli-GPUs.
    n = NodeState("A100", 8000, 65536, (full, after_4g))
    assert fits(n, PodShape(0, 0, 1, 1000), mig)
    assert not fits(n, PodShape(0, 0, 2, 1000), mig)
    target = TargetWorkload((PodShape(0, 0, 1, 1000),), (1.0,))
    assert node_fragmentation_milli(n, target, mig) == pytest.approx(3000 / 7)
