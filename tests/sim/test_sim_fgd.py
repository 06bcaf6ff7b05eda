"""The fill-up protocol and runs of each policy on small synthetic clusters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laminar_sim import fgd, traces
from laminar_sim.policies import (
    MILLI,
    MILLI_SLICING,
    POLICIES,
    MigSlicing,
    PodShape,
    TargetWorkload,
    fits,
)
from laminar_sim.traces import NodeSpec

shapes = st.builds(
    lambda cpu, kind, milli: (
        PodShape(cpu, cpu // 2, 0, 0)
        if kind == 0
        else PodShape(cpu, cpu // 2, 1, milli)
        if kind == 1
        else PodShape(cpu, cpu // 2, kind, MILLI)
    ),
    st.integers(500, 16000),
    st.sampled_from([0, 1, 1, 1, 2, 4]),
    st.sampled_from([100, 250, 300, 500, 700, 1000]),
)


# ---------------------------------------------------------------------------
# Workload tuning


@settings(max_examples=60, deadline=None)
@given(
    pods=st.lists(shapes, min_size=1, max_size=40),
    seed=st.integers(0, 2**31),
    gpus=st.integers(1, 40),
)
def test_fill_workload_reaches_the_target_from_clones_of_originals(
    pods: list[PodShape], seed: int, gpus: int
) -> None:
    if sum(p.total_gpu_milli for p in pods) == 0:
        pods = [*pods, PodShape(1000, 0, 1, 500)]
    capacity = gpus * MILLI
    work = fgd.fill_workload(pods, capacity, seed, ratio=1.3)
    total = sum(pods[i].total_gpu_milli for i in work.origin)
    assert total == work.requested_gpu_milli
    assert total <= 1.3 * capacity
    largest = max(p.total_gpu_milli for p in pods)
    assert total > 1.3 * capacity - largest  # stopped at the first clone that would overshoot
    n = len(pods)
    assert all(0 <= i < n for i in work.origin)  # everything is an original or a clone of one
    original_total = sum(p.total_gpu_milli for p in pods)
    if original_total <= 1.3 * capacity:
        # Every original arrives once, shuffled, before any clone.
        assert sorted(work.origin[:n].tolist()) == list(range(n))
        assert not work.is_clone[:n].any() and work.is_clone[n:].all()
    else:
        # Too much work: random pods were dropped, nothing was cloned.
        assert not work.is_clone.any()
        assert len(set(work.origin.tolist())) == len(work.origin)
    again = fgd.fill_workload(pods, capacity, seed, ratio=1.3)
    assert np.array_equal(again.origin, work.origin)


def test_fill_workload_depends_on_the_seed_and_shuffles() -> None:
    pods = [PodShape(1000, 0, 1, 100 + i) for i in range(50)]
    a = fgd.fill_workload(pods, 10 * MILLI, seed=42)
    b = fgd.fill_workload(pods, 10 * MILLI, seed=43)
    assert not np.array_equal(a.origin, b.origin)
    assert a.origin[:50].tolist() != list(range(50))


def test_fill_workload_rejects_gpu_free_lists() -> None:
    with pytest.raises(ValueError, match="requests no GPU"):
        fgd.fill_workload([PodShape(1000, 0, 0, 0)], 8000, seed=1)


def test_node_rank_is_a_seeded_permutation() -> None:
    rank = fgd.node_rank(42, 100)
    assert sorted(rank.tolist()) == list(range(100))
    assert np.array_equal(rank, fgd.node_rank(42, 100))
    assert not np.array_equal(rank, fgd.node_rank(43, 100))


def test_typical_workload_covers_95_percent_in_decreasing_count() -> None:
    a = PodShape(1000, 111, 1, 500)
    b = PodShape(2000, 222, 1, 1000)
    c = PodShape(0, 0, 0, 0)
    d = PodShape(4000, 0, 2, 1000)
    pods = [a] * 60 + [PodShape(1000, 999, 1, 500)] * 10 + [b] * 20 + [c] * 8 + [d] * 2
    target = fgd.typical_workload(pods)
    # Memory is ignored: the two 500-milli shapes are one (70 pods); 70+20+8 = 98 >= 95.
    assert target.shapes == (
        PodShape(1000, 0, 1, 500),
        PodShape(2000, 0, 1, 1000),
        PodShape(0, 0, 0, 0),
    )
    assert target.probabilities == pytest.approx((70 / 98, 20 / 98, 8 / 98))


# ---------------------------------------------------------------------------
# Runs


def _cluster() -> list[NodeSpec]:
    return [
        # Memory is tight (pods ask half their CPU in MiB), so it binds as often as CPU.
        NodeSpec("a", 32000, 12000, 2, "T4"),
        NodeSpec("b", 64000, 20000, 4, "T4"),
        NodeSpec("c", 96000, 40000, 8, "V100M16"),
        NodeSpec("d", 16000, 4000, 1, "P100"),
        NodeSpec("e", 16000, 8000, 0, ""),  # a CPU-only node
    ]


def _check_no_overcommit(run: fgd.FillRun, nodes: list[NodeSpec]) -> None:
    for spec, state in zip(nodes, run.states, strict=True):
        assert 0 <= state.cpu_left_milli <= spec.cpu_milli
        assert 0 <= state.memory_left_mib <= spec.memory_mib
        assert all(0 <= g <= MILLI for g in state.gpu_left)
    assert np.array_equal(run.cpu, [s.cpu_left_milli for s in run.states])


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods=st.lists(shapes, min_size=1, max_size=60), seed=st.integers(0, 1000))
def test_no_node_is_ever_overcommitted_and_failures_fit_nowhere(
    policy: str, pods: list[PodShape], seed: int
) -> None:
    nodes = _cluster()
    ctx = fgd.PolicyContext(policy, fgd.typical_workload(pods), MILLI_SLICING)
    run = fgd.FillRun(nodes, ctx, fgd.node_rank(seed, len(nodes)), np.random.default_rng(seed))
    for pod in pods:
        choice = run.choose(pod)
        if choice is None:
            assert not any(fits(s, pod, MILLI_SLICING) for s in run.states)
            continue
        node, gpus = choice
        assert fits(run.states[node], pod, MILLI_SLICING)
        assert len(gpus) == pod.num_gpu
        run.apply(node, pod, gpus)
        _check_no_overcommit(run, nodes)
    # The incrementally kept cluster fragmentation equals a fresh sum over nodes.
    assert run.frag_total == pytest.approx(
        sum(ctx.frag(s) for s in run.states), abs=1e-6
    )  # float drift of the incremental sum, in GPU-milli units


def test_ties_go_to_the_lowest_node_rank() -> None:
    nodes = [NodeSpec(f"n{i}", 8000, 8192, 1, "T4") for i in range(5)]
    pod = PodShape(1000, 1024, 1, 1000)
    ctx = fgd.PolicyContext("bestfit", TargetWorkload((pod,), (1.0,)), MILLI_SLICING)
    rank = np.array([3, 1, 4, 0, 2])
    run = fgd.FillRun(nodes, ctx, rank, np.random.default_rng(0))
    order = []
    for _ in range(5):
        choice = run.choose(pod)
        assert choice is not None
        order.append(choice[0])
        run.apply(choice[0], pod, choice[1])
    assert order == [3, 1, 4, 0, 2]
    assert run.choose(pod) is None


def test_best_fit_fills_a_started_node_first() -> None:
    nodes = [NodeSpec("big", 64000, 65536, 4, "T4"), NodeSpec("small", 64000, 65536, 4, "T4")]
    small = PodShape(1000, 1024, 1, 250)
    ctx = fgd.PolicyContext("bestfit", TargetWorkload((small,), (1.0,)), MILLI_SLICING)
    run = fgd.FillRun(nodes, ctx, np.array([1, 0]), np.random.default_rng(0))
    first = run.choose(small)
    assert first is not None and first[0] == 1  # equal scores: rank 0 wins
    run.apply(first[0], small, first[1])
    for _ in range(10):
        choice = run.choose(small)
        assert choice is not None and choice[0] == 1
        run.apply(choice[0], small, choice[1])
    # Eleven quarter-GPU tasks packed onto node "small": 2 full GPUs + 3 quarters used.
    assert sorted(run.states[1].gpu_left) == [0, 0, 250, 1000]


def test_run_fill_logs_every_arrival_and_is_deterministic() -> None:
    nodes = _cluster()
    pods = [PodShape(2000, 1024, 1, m) for m in (100, 250, 500, 700, 1000)] + [
        PodShape(4000, 2048, 2, 1000),
        PodShape(2000, 1024, 0, 0),
    ]
    target = fgd.typical_workload(pods)
    logs = {}
    for policy in POLICIES:
        log = fgd.run_fill(nodes, pods, fgd.PolicyContext(policy, target, MILLI_SLICING), seed=7)
        assert log.pods == len(log.arrived_milli) == log.events_processed
        assert np.all(np.diff(log.arrived_milli) >= 0)
        assert 1.3 * 15 * MILLI - MILLI * 2 < log.arrived_milli[-1] <= 1.3 * 15 * MILLI
        assert np.all(log.allocated_milli <= 15 * MILLI)
        assert log.failed_pods > 0  # 130% cannot all fit
        logs[policy] = log
    again = fgd.run_fill(nodes, pods, fgd.PolicyContext("random", target, MILLI_SLICING), seed=7)
    assert np.array_equal(again.allocated_milli, logs["random"].allocated_milli)
    # All policies of a seed see the same arrivals.
    assert all(
        np.array_equal(log.arrived_milli, logs["fgd"].arrived_milli) for log in logs.values()
    )


def test_a_limited_run_is_the_first_arrivals_of_the_full_one() -> None:
    nodes = _cluster()
    pods = [PodShape(2000, 1024, 1, m) for m in (100, 250, 500, 1000)]
    target = fgd.typical_workload(pods)
    full = fgd.run_fill(nodes, pods, fgd.PolicyContext("bestfit", target, MILLI_SLICING), seed=3)
    part = fgd.run_fill(
        nodes, pods, fgd.PolicyContext("bestfit", target, MILLI_SLICING), seed=3, limit=5
    )
    assert part.pods == 5 < full.pods
    assert np.array_equal(part.allocated_milli, full.allocated_milli[:5])
    assert np.array_equal(part.arrived_milli, full.arrived_milli[:5])


def test_mig_run_counts_rounded_requests() -> None:
    nodes = [NodeSpec("a", 64000, 65536, 2, "A100")]
    pods = [PodShape(1000, 1024, 1, 300)]  # 300 milli -> 3 of 7 slices
    log = fgd.run_fill(
        nodes, pods, fgd.PolicyContext("fgd", fgd.typical_workload(pods), MigSlicing()), seed=1
    )
    # Each pod takes 3/7 of a GPU; two GPUs hold four (one 1/7 slice left on each).
    assert log.allocated_milli[-1] == pytest.approx(4 * 3000 / 7)
    assert log.arrived_milli[0] == pytest.approx(3000 / 7)


def test_discrete_curve_means_rows_that_round_to_each_level() -> None:
    arrived = np.array([98.4, 99.6, 100.4, 100.6, 103.0])
    values = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    curve = fgd.discrete_curve(arrived, values, [98, 100, 101, 102, 110])
    # 99.6 and 100.4 round to 100; nothing rounds to 102, so 101..103 are used.
    assert curve == {98: 1.0, 100: 3.0, 101: 8.0, 102: 12.0}


def test_summary_of_a_real_trace_run(traces_dir: Path) -> None:
    """One best-fit run on the real default list (about a second): shape of the results."""
    folder = traces_dir / "alibaba-gpu-v2023"
    nodes = traces.read_nodes(traces.node_list_path(folder))
    pods = [p.shape for p in traces.read_pods(traces.pod_list_path(folder, "default"))]
    ctx = fgd.PolicyContext("bestfit", fgd.typical_workload(pods), MILLI_SLICING)
    log = fgd.run_fill(nodes, pods, ctx, seed=42)
    summary = fgd.summarize_policy([log])
    at100 = summary["unallocated_pct_at_100"]
    assert at100 is not None and 0 < at100["median"] < 25
    levels = [row["arrived_pct"] for row in summary["unallocated_pct_curve"]]
    assert levels == list(range(75, 131))
    assert 1.29 * 6212 * MILLI < log.arrived_milli[-1] <= 1.3 * 6212 * MILLI


def test_parse_seeds() -> None:
    assert fgd.parse_seeds("42-51") == list(range(42, 52))
    assert fgd.parse_seeds("1, 3,5") == [1, 3, 5]
    assert fgd.parse_seeds("7") == [7]
    for bad, reason in [
        ("x", "not a number"),
        ("5-1", "backwards"),
        ("1,1", "twice"),
        ("", "empty"),
    ]:
        with pytest.raises(ValueError, match=reason):
            fgd.parse_seeds(bad)
