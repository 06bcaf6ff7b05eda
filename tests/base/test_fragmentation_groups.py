"""The memoized fragmentation measure groups a target's shapes that differ only in CPU; it
must measure what the paper's per-shape definition (``node_fragmentation_milli``) does, on
shared GPUs and on MIG slices alike, whatever the target and the node."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_base.fragmentation import (
    MILLI_SLICING,
    FragmentationCache,
    GpuSlicing,
    NodeState,
    PodShape,
    TargetWorkload,
    node_fragmentation_milli,
)
from laminar_sim.policies import MigSlicing

MODELS = ("A10", "T4", "V100")

shape_st = st.builds(
    PodShape,
    cpu_milli=st.sampled_from([0, 1000, 4000, 8000, 12000, 32000]),
    memory_mib=st.just(0),
    num_gpu=st.integers(0, 4),
    gpu_milli=st.sampled_from([100, 250, 470, 500, 810, 1000]),
    gpu_models=st.sampled_from([(), ("A10",), ("T4", "V100")]),
).filter(lambda s: s.num_gpu <= 1 or s.gpu_milli == 1000)


@st.composite
def target_st(draw: st.DrawFn) -> TargetWorkload:
    shapes = draw(st.lists(shape_st, min_size=1, max_size=12, unique=True))
    weights = draw(st.lists(st.integers(1, 100), min_size=len(shapes), max_size=len(shapes)))
    return TargetWorkload(tuple(shapes), tuple(w / sum(weights) for w in weights))


@settings(max_examples=300, deadline=None)
@given(
    target=target_st(),
    model=st.sampled_from(MODELS),
    cpu=st.integers(0, 40000),
    milli=st.lists(st.integers(0, 1000), min_size=0, max_size=8),
    mig=st.booleans(),
)
def test_the_grouped_measure_is_the_papers(
    target: TargetWorkload, model: str, cpu: int, milli: list[int], mig: bool
) -> None:
    slicing: GpuSlicing = MigSlicing() if mig else MILLI_SLICING
    # A MIG GPU's state is a 7-bit mask of free compute slices.
    gpus = tuple(m * 127 // 1000 for m in milli) if mig else tuple(milli)
    node = NodeState(model, cpu, 1 << 20, gpus)
    want = node_fragmentation_milli(node, target, slicing)
    assert FragmentationCache(target, slicing)(node) == pytest.approx(want, abs=1e-6)


def test_shapes_differing_in_cpu_split_on_the_nodes_cpu_left() -> None:
    small = PodShape(2000, 0, 1, 500)
    large = PodShape(9000, 0, 1, 500)
    target = TargetWorkload((small, large), (0.75, 0.25))
    node = NodeState("T4", 8000, 1 << 20, (300, 1000))
    # small fits (the 300 left on gpu0 is its fragment), large cannot (all 1300 are).
    assert FragmentationCache(target, MILLI_SLICING)(node) == pytest.approx(
        0.75 * 300 + 0.25 * 1300
    )
