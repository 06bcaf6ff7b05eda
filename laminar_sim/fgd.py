"""The ``fgd`` experiment: placement quality on the openb trace, as in the FGD paper (ATC'23).

Protocol (the paper's "fill-up" evaluation), per seed:

1. Shuffle the original pod list with the seed.
2. Tune it to request 130% of the cluster's GPU capacity: append clones of
   randomly drawn original pods until the next clone would pass the target
   (or, for a list that asks for more, drop random pods until it fits).
3. Give every node a random rank from the seed; among nodes with equal best
   scores the lowest rank wins (no random tie-breaks).
4. Pods arrive one at a time; nothing departs and nothing is retried: a pod
   that fits nowhere is counted as failed. After every arrival the run logs
   the GPU requested so far ("arrived"), the GPU allocated and the cluster's
   fragmentation.

Reported, as the paper's analysis does: for each arrived level x% of the
cluster GPU capacity, the mean over arrivals whose arrived share rounds to x
of the unallocated GPU share (``100 - allocated%``), of the fragmentation
amount (% of cluster GPUs) and of the fragmentation ratio (% of idle GPU).
The headline is the unallocated GPU at 100% arrived, median and mean over
seeds 42-51. The target workload for FGD and for the fragmentation measure
is the set of pod shapes covering 95% of the original list.

In MIG mode (``mig=True``) a pod's share is rounded up to a legal MIG profile
and placed at a legal offset; arrived and allocated GPU both count the
rounded requests, so "100% arrived" still means demand equal to capacity.
The workload (which pods, in which order) is the same as without MIG.

Only the policy-independent parts (workload, node ranks) come from the seed;
``random`` draws its choices from a separate stream of the same seed, so all
policies of a seed see the same arrivals.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from laminar_base.demand import Demand
from laminar_base.fragmentation import TYPICAL_COVERAGE_RATIO, workload_rows
from laminar_base.fragmentation import typical_workload as shared_typical_workload
from laminar_sim import traces
from laminar_sim.engine import Engine
from laminar_sim.laminar import Ask, LaminarCluster, SimHost, observed_shape
from laminar_sim.policies import (
    MILLI,
    MILLI_SLICING,
    POLICIES,
    FragmentationCache,
    GpuSlicing,
    MigSlicing,
    NodeState,
    PodShape,
    TargetWorkload,
    gpu_request,
    place,
    random_gpu,
    score_node,
)
from laminar_zone.view import ProbeLimits

TUNE_RATIO = 1.3
CURVE_LEVELS = tuple(range(75, 131))
#: The paper's policy names in its result files.
PAPER_POLICY_NAMES = {"fgd": "FGD", "bestfit": "BestFit", "dotprod": "DotProd", "random": "Random"}
#: Unallocated GPU % at 100% arrived on the default list (median, mean over seeds 42-51), from
#: the paper's published per-run results; used when the results folder is not at hand.
PAPER_DEFAULT_UNALLOCATED_AT_100 = {
    "fgd": (4.77, 4.773),
    "bestfit": (7.09, 7.138),
    "dotprod": (9.445, 9.378),
    "random": (13.75, 13.697),
}

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# ---------------------------------------------------------------------------
# Workload


def typical_workload(
    pods: Sequence[PodShape], coverage_ratio: float = TYPICAL_COVERAGE_RATIO
) -> TargetWorkload:
    """The paper's target workload: the most frequent shapes of the original list
    (:func:`laminar_base.fragmentation.typical_workload` over its counts)."""
    if not pods:
        raise ValueError("typical_workload needs at least one pod")
    return shared_typical_workload(Counter(pods), coverage_ratio)


@dataclass(frozen=True)
class FillWorkload:
    """The arrival sequence of one seed: indices into the original list, clones marked."""

    origin: IntArray
    is_clone: npt.NDArray[np.bool_]
    requested_gpu_milli: int


def fill_workload(
    pods: Sequence[PodShape], capacity_gpu_milli: int, seed: int, ratio: float = TUNE_RATIO
) -> FillWorkload:
    """Shuffle, then clone random originals (or drop random pods) to ``ratio`` of capacity."""
    if capacity_gpu_milli <= 0:
        raise ValueError("the cluster has no GPUs")
    gpu = np.array([p.total_gpu_milli for p in pods], dtype=np.int64)
    if int(gpu.sum()) <= 0:
        raise ValueError("the pod list requests no GPU, so it cannot be tuned to a GPU load")
    rng = np.random.default_rng(seed)
    order = [int(i) for i in rng.permutation(len(pods))]
    clone = [False] * len(order)
    total = int(gpu.sum())
    target = ratio * capacity_gpu_milli
    if total < target:
        while True:
            idx = int(rng.integers(len(pods)))
            if total + int(gpu[idx]) > target:
                break
            order.append(idx)
            clone.append(True)
            total += int(gpu[idx])
    else:
        while total > target and order:
            drop = int(rng.integers(len(order)))
            total -= int(gpu[order[drop]])
            del order[drop]
            del clone[drop]
    return FillWorkload(np.array(order, dtype=np.int64), np.array(clone, dtype=np.bool_), total)


def node_rank(seed: int, num_nodes: int) -> IntArray:
    """A per-seed random rank of the nodes; ties between equal scores go to the lowest rank."""
    rng = np.random.default_rng([seed, 0x6E6F6465])  # "node": a stream apart from the workload
    rank = np.empty(num_nodes, dtype=np.int64)
    rank[rng.permutation(num_nodes)] = np.arange(num_nodes)
    return rank


# ---------------------------------------------------------------------------
# One fill-up run


#: The centralized baselines of the paper, and Laminar's own decentralized placement.
FGD_POLICIES = (*POLICIES, "laminar")
#: In MIG mode, the H100/A100-80GB profile a share rounded up to N of 7 slices asks for.
MIG_PROFILE_OF_SLICES = {1: "1g.10gb", 2: "2g.20gb", 3: "3g.40gb", 4: "4g.40gb", 7: "7g.80gb"}
#: Hosts per zone of the ``laminar`` policy: as many as one router is sized for (issue 15's
#: idle heartbeat goal is 4,096 agents per router), so the trace's 1,213 nodes are one zone.
#: Zones of 500 (3 zones, the default until 2026-11-28) cost packing (cpu250 7.30% against
#: 6.74% unallocated) and 1.33 messages per placement of forwards: docs/benchmarks.md,
#: "one zone, a tight draw and MIG on commit (issue 16)".
LAMINAR_ZONE_HOSTS = 4096


@dataclass
class RunLog:
    """Per-arrival log of one run, in milli-GPUs."""

    policy: str
    seed: int
    capacity_gpu_milli: int
    arrived_milli: FloatArray
    allocated_milli: FloatArray
    frag_milli: FloatArray
    failed_pods: int
    pods: int
    clones: int
    events_processed: int
    wall_seconds: float
    #: ``laminar`` only: messages, probes, bounces and forwards per placement.
    messages: dict[str, float] | None = None


class PolicyContext:
    """Caches shared by runs with the same target workload, slicing and policy.

    ``scores`` memoizes ``(node state, pod shape) -> (score, gpus)``: a node's
    score changes only when the node does, and many nodes share a state.
    """

    def __init__(
        self,
        policy: str,
        target: TargetWorkload,
        slicing: GpuSlicing,
        *,
        zone_hosts: int = LAMINAR_ZONE_HOSTS,
        limits: ProbeLimits | None = None,
        workload_prior: Mapping[PodShape, int] | None = None,
    ) -> None:
        """``zone_hosts``: hosts per zone of the ``laminar`` policy; ``limits``: its routers'
        probing budget (default: the router's defaults); ``workload_prior``: the shapes and
        counts its routers' target workloads start from (:func:`laminar_workload_prior`)."""
        if policy not in FGD_POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        self.policy = policy
        self.zone_hosts = zone_hosts
        self.limits = limits or ProbeLimits()
        self.workload_prior = workload_prior
        self.frag = FragmentationCache(target, slicing)
        self.slicing = slicing
        self.scores: dict[
            tuple[tuple[str, int, tuple[int, ...]], PodShape], tuple[int, tuple[int, ...]] | None
        ] = {}

    def score(self, node: NodeState, pod: PodShape) -> tuple[int, tuple[int, ...]] | None:
        key = ((node.model, node.cpu_left_milli, node.gpu_left), pod)
        try:
            return self.scores[key]
        except KeyError:
            value = score_node(self.policy, node, pod, self.frag)
            self.scores[key] = value
            return value


_NO_SCORE = -(10**9)


@dataclass
class _ShapeScores:
    version: IntArray
    score: IntArray
    gpus: list[tuple[int, ...]] = field(default_factory=list)


class FillRun:
    """State of one cluster during one fill-up run (arrays for speed, states for policies)."""

    def __init__(
        self,
        nodes: Sequence[traces.NodeSpec],
        ctx: PolicyContext,
        rank: IntArray,
        rng: np.random.Generator,
    ) -> None:
        slicing = ctx.slicing
        self.ctx = ctx
        self.slicing = slicing
        self.rng = rng
        self.states = [
            NodeState(n.model, n.cpu_milli, n.memory_mib, (slicing.full,) * n.num_gpu)
            for n in nodes
        ]
        n = len(nodes)
        width = max((node.num_gpu for node in nodes), default=0) or 1
        self.cpu = np.array([s.cpu_milli for s in nodes], dtype=np.int64)
        self.mem = np.array([s.memory_mib for s in nodes], dtype=np.int64)
        self.gpu = np.full((n, width), slicing.empty, dtype=np.int64)
        for i, node in enumerate(nodes):
            self.gpu[i, : node.num_gpu] = slicing.full
        self.models = np.array([s.model for s in nodes])
        self.version = np.zeros(n, dtype=np.int64)
        # Tie-break key: higher is better, so the lowest rank gets the largest bonus.
        self.tie = (n - 1 - rank).astype(np.int64)
        self.scale = n + 1
        self.model_ok: dict[tuple[str, ...], npt.NDArray[np.bool_]] = {}
        self.shape_scores: dict[PodShape, _ShapeScores] = {}
        self.laminar: LaminarCluster | None = None
        self.mig = slicing.name == "mig"
        self.laminar_hosts: list[SimHost] = []
        if ctx.policy == "laminar":
            hosts = [
                SimHost(
                    f"n{i}", node.model, node.num_gpu, node.cpu_milli, node.memory_mib, mig=self.mig
                )
                for i, node in enumerate(nodes)
            ]
            self.laminar_hosts = hosts
            self.laminar = LaminarCluster(
                hosts,
                zone_hosts=ctx.zone_hosts,
                limits=ctx.limits,
                gamma=1.0,
                seed=int(rng.integers(2**31)),
                workload_prior=ctx.workload_prior,
            )
        self.node_frag = np.array([ctx.frag(s) for s in self.states], dtype=np.float64)
        self.frag_total = float(self.node_frag.sum())
        self.allocated_milli = 0.0

    def feasible(self, pod: PodShape) -> npt.NDArray[np.bool_]:
        mask = (self.cpu >= pod.cpu_milli) & (self.mem >= pod.memory_mib)
        if pod.num_gpu == 0:
            return mask
        if pod.gpu_models:
            ok = self.model_ok.get(pod.gpu_models)
            if ok is None:
                ok = np.isin(self.models, pod.gpu_models)
                self.model_ok[pod.gpu_models] = ok
            mask &= ok
        request = gpu_request(pod, self.slicing)
        fitting = self.slicing.fits_array(self.gpu, request).sum(axis=1)
        result: npt.NDArray[np.bool_] = mask & (fitting >= pod.num_gpu)
        return result

    def choose(self, pod: PodShape) -> tuple[int, tuple[int, ...]] | None:
        """The node and GPUs the policy picks for ``pod``, or None when nothing fits."""
        if self.laminar is not None:
            return self.laminar.place(laminar_ask(pod, self.mig_profile(pod)))
        mask = self.feasible(pod)
        candidates = np.flatnonzero(mask)
        if candidates.size == 0:
            return None
        if self.ctx.policy == "random":
            node = int(candidates[int(self.rng.integers(candidates.size))])
            gpus = random_gpu(self.states[node], pod, self.slicing, self.rng)
            return None if gpus is None else (node, gpus)
        key = PodShape(pod.cpu_milli, 0, pod.num_gpu, pod.gpu_milli, pod.gpu_models)
        entry = self.shape_scores.get(key)
        if entry is None:
            n = len(self.states)
            entry = _ShapeScores(
                np.full(n, -1, dtype=np.int64), np.full(n, _NO_SCORE, dtype=np.int64), [()] * n
            )
            self.shape_scores[key] = entry
        stale = candidates[entry.version[candidates] != self.version[candidates]]
        for i in stale.tolist():
            result = self.ctx.score(self.states[i], key)
            if result is None:
                entry.score[i] = _NO_SCORE
            else:
                entry.score[i], entry.gpus[i] = result
            entry.version[i] = self.version[i]
        scores = entry.score[candidates]
        usable = scores > _NO_SCORE
        if not usable.any():
            return None
        combined = np.where(
            usable, scores * self.scale + self.tie[candidates], np.iinfo(np.int64).min
        )
        best = int(candidates[int(np.argmax(combined))])
        return best, entry.gpus[best]

    def mig_profile(self, pod: PodShape) -> str:
        """In MIG mode the profile a shared pod is rounded up to ("" otherwise)."""
        if not (self.laminar is not None and self.mig):
            return ""
        return mig_profile_of(pod, self.slicing)

    def apply(self, node: int, pod: PodShape, gpus: tuple[int, ...]) -> None:
        if self.laminar is not None and self.mig:
            # The agents' ledgers chose the instances; the free compute slices are theirs.
            old = self.states[node]
            host = self.laminar_hosts[node]
            state = NodeState(
                old.model,
                old.cpu_left_milli - pod.cpu_milli,
                old.memory_left_mib - pod.memory_mib,
                host.mig_left(),
            )
        else:
            state = place(self.states[node], pod, gpus, self.slicing)
        self.states[node] = state
        self.cpu[node] = state.cpu_left_milli
        self.mem[node] = state.memory_left_mib
        self.gpu[node, : len(state.gpu_left)] = state.gpu_left
        self.version[node] += 1
        new_frag = self.ctx.frag(state)
        self.frag_total += new_frag - self.node_frag[node]
        self.node_frag[node] = new_frag
        if pod.num_gpu:
            self.allocated_milli += pod.num_gpu * self.slicing.request_milli(
                gpu_request(pod, self.slicing)
            )


def mig_profile_of(pod: PodShape, slicing: GpuSlicing) -> str:
    """The MIG profile a shared pod is rounded up to under a MIG slicing ("" otherwise)."""
    if slicing.name != "mig" or not pod.is_shared:
        return ""
    return MIG_PROFILE_OF_SLICES[gpu_request(pod, slicing)]


def laminar_workload_prior(pods: Sequence[PodShape], slicing: GpuSlicing) -> Counter[PodShape]:
    """The pod list's shapes as Laminar's routers learn them, with their counts: the prior
    that gives the routers the target workload FGD is given (the whole list's mix) before
    the first arrival, as a router that learned the mix before would start with."""
    return Counter(observed_shape(laminar_ask(p, mig_profile_of(p, slicing))) for p in pods)


def workload_prior_text(pods: Sequence[PodShape], slicing: GpuSlicing) -> str:
    """:func:`laminar_workload_prior` as the text of a live router's
    ``placement.workload_prior_file`` (``laminar sim fgd --write-prior``): the router then
    starts from the mix ``--workload-prior`` gives the simulator's routers."""
    return json.dumps(workload_rows(laminar_workload_prior(pods, slicing)), indent=1) + "\n"


def laminar_ask(pod: PodShape, mig_profile: str = "") -> Ask:
    """A pod as Laminar's router sees it: a share (or, in MIG mode, the MIG profile it
    rounds up to), whole GPUs on one host, or CPU only, with the host CPU and memory it
    asks for."""
    # The trace asks for CPU and memory on every pod; a 0 there means none (the API's 0
    # means "the default share"), so it becomes the least that can be asked: 1.
    need = Demand(
        gpus=pod.num_gpu if pod.num_gpu and not pod.is_shared else 0,
        gpu_milli=pod.gpu_milli if pod.is_shared and not mig_profile else 0,
        mig_profile=mig_profile,
        cpu_milli=pod.cpu_milli or 1,
        host_memory_bytes=(pod.memory_mib << 20) or 1,
    )
    return Ask(need, pod.gpu_models)


def run_fill(
    nodes: Sequence[traces.NodeSpec],
    pods: Sequence[PodShape],
    ctx: PolicyContext,
    seed: int,
    ratio: float = TUNE_RATIO,
    *,
    limit: int | None = None,
) -> RunLog:
    """One fill-up run of ``ctx.policy`` for ``seed``, driven by the event engine
    (``limit``: only the first arrivals of the tuned workload)."""
    started = time.perf_counter()
    capacity = sum(n.num_gpu for n in nodes) * MILLI
    workload = fill_workload(pods, capacity, seed, ratio)
    if limit is not None:
        origin = workload.origin[:limit]
        requested = int(sum(pods[i].total_gpu_milli for i in origin.tolist()))
        workload = FillWorkload(origin, workload.is_clone[:limit], requested)
    engine = Engine(seed)
    policy_rng = np.random.default_rng([seed, 0x706F6C])  # "pol": apart from the workload
    run = FillRun(nodes, ctx, node_rank(seed, len(nodes)), policy_rng)
    count = len(workload.origin)
    arrived = np.zeros(count, dtype=np.float64)
    allocated = np.zeros(count, dtype=np.float64)
    frag = np.zeros(count, dtype=np.float64)
    failed = 0
    arrived_milli = 0.0
    # What each pod asks of the GPUs in this slicing (MIG rounds shares up to a profile).
    demand = [p.num_gpu * ctx.slicing.request_milli(gpu_request(p, ctx.slicing)) for p in pods]
    origin = workload.origin.tolist()

    def arrival(i: int) -> None:
        nonlocal failed, arrived_milli
        pod = pods[origin[i]]
        arrived_milli += demand[origin[i]]
        choice = run.choose(pod)
        if choice is None:
            failed += 1
        else:
            run.apply(choice[0], pod, choice[1])
        arrived[i] = arrived_milli
        allocated[i] = run.allocated_milli
        frag[i] = run.frag_total
        if i + 1 < count:
            engine.schedule(1.0, lambda: arrival(i + 1))

    engine.schedule(0.0, lambda: arrival(0))
    stats = engine.run()
    return RunLog(
        policy=ctx.policy,
        seed=seed,
        capacity_gpu_milli=capacity,
        arrived_milli=arrived,
        allocated_milli=allocated,
        frag_milli=frag,
        failed_pods=failed,
        pods=count,
        clones=int(workload.is_clone.sum()),
        events_processed=stats.events_processed,
        wall_seconds=time.perf_counter() - started,
        messages=None if run.laminar is None else run.laminar.counters.per_placement(),
    )


# ---------------------------------------------------------------------------
# Metrics


def discrete_curve(
    arrived_pct: FloatArray, values: FloatArray, levels: Iterable[int]
) -> dict[int, float]:
    """For each level x: mean of ``values`` over rows whose arrived % rounds to x.

    A level no row rounds to uses the rows within one point of it; a level
    with no rows near it is left out. Rounding is half-to-even, as pandas does.
    """
    rounded = np.round(arrived_pct)
    out: dict[int, float] = {}
    for level in levels:
        sel = rounded == level
        if not sel.any():
            sel = (rounded >= level - 1) & (rounded <= level + 1)
            if not sel.any():
                continue
        out[level] = float(values[sel].mean())
    return out


@dataclass(frozen=True)
class RunCurves:
    unallocated_pct: dict[int, float]
    frag_amount_pct: dict[int, float]
    frag_ratio_pct: dict[int, float]


def run_curves(log: RunLog, levels: Iterable[int] = range(0, 131)) -> RunCurves:
    """The paper's per-run curves: unallocated GPU %, fragmentation % of cluster and of idle."""
    capacity = float(log.capacity_gpu_milli)
    arrived_pct = log.arrived_milli / capacity * 100.0
    alloc_pct = np.round(log.allocated_milli / capacity * 100.0, 2)
    idle = capacity - log.allocated_milli
    ratio = (
        np.divide(log.frag_milli, idle, out=np.zeros_like(log.frag_milli), where=idle > 0) * 100.0
    )
    levels = list(levels)
    return RunCurves(
        unallocated_pct={
            k: 100.0 - v for k, v in discrete_curve(arrived_pct, alloc_pct, levels).items()
        },
        frag_amount_pct=discrete_curve(arrived_pct, log.frag_milli / capacity * 100.0, levels),
        frag_ratio_pct=discrete_curve(arrived_pct, ratio, levels),
    )


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": _r(statistics.median(values)),
        "mean": _r(statistics.fmean(values)),
        "std": _r(statistics.stdev(values)) if len(values) > 1 else 0.0,
        "min": _r(min(values)),
        "max": _r(max(values)),
    }


def _r(value: float) -> float:
    """Round for reports: the paper's own files carry two decimals."""
    return round(value, 4)


def summarize_policy(logs: Sequence[RunLog]) -> dict[str, Any]:
    """JSON-ready summary of one policy's runs (one per seed)."""
    curves = [run_curves(log) for log in logs]

    def at(metric: str, level: int) -> list[float]:
        return [getattr(c, metric)[level] for c in curves if level in getattr(c, metric)]

    def curve(metric: str) -> list[dict[str, float]]:
        rows = []
        for level in CURVE_LEVELS:
            values = at(metric, level)
            if values:
                rows.append(
                    {
                        "arrived_pct": level,
                        "median": _r(statistics.median(values)),
                        "mean": _r(statistics.fmean(values)),
                    }
                )
        return rows

    unalloc = at("unallocated_pct", 100)
    return {
        "unallocated_pct_at_100": (
            {**_stats(unalloc), "per_seed": [_r(v) for v in unalloc]} if unalloc else None
        ),
        "unallocated_pct_curve": curve("unallocated_pct"),
        "frag_amount_pct_at_100": _stats(at("frag_amount_pct", 100)) if unalloc else None,
        "frag_ratio_pct_at_100": _stats(at("frag_ratio_pct", 100)) if unalloc else None,
        "frag_amount_pct_curve": curve("frag_amount_pct"),
        "frag_ratio_pct_curve": curve("frag_ratio_pct"),
        "failed_pods_mean": statistics.fmean(log.failed_pods for log in logs),
        "pods_mean": statistics.fmean(log.pods for log in logs),
        "seeds": [log.seed for log in logs],
        "run_seconds_total": sum(log.wall_seconds for log in logs),
        "events_processed": sum(log.events_processed for log in logs),
        **_message_means(logs),
    }


def _message_means(logs: Sequence[RunLog]) -> dict[str, float]:
    """Per-placement message figures of the ``laminar`` policy, averaged over seeds."""
    rows = [log.messages for log in logs if log.messages is not None]
    if not rows:
        return {}
    return {key: _r(statistics.fmean(row[key] for row in rows)) for key in rows[0]}


# ---------------------------------------------------------------------------
# Paper figures


def paper_results(
    expected_dir: Path | None, workload: str, metric: str = "unallocated_gpu_pct"
) -> dict[str, dict[str, float]] | None:
    """The paper's ``metric`` at 100% arrived for ``workload``, by policy (median and mean).

    Read from ``headline_summary.csv`` of the published results when the
    folder is given and has the workload; else, for the unallocated GPU on
    the default list, the figures kept here. Metrics: ``unallocated_gpu_pct``,
    ``frag_amount_pct_of_cluster_gpus``, ``frag_ratio_pct_of_idle_gpu``.
    """
    name = f"openb_pod_list_{workload}"
    summary = expected_dir / "headline_summary.csv" if expected_dir else None
    if summary is not None and summary.is_file():
        found: dict[str, dict[str, float]] = {}
        by_paper = {v: k for k, v in PAPER_POLICY_NAMES.items()}
        with summary.open(newline="") as handle:
            for row in csv.DictReader(handle):
                if (
                    row["workload"] == name
                    and row["metric"] == metric
                    and row["arrived_pct"] == "100"
                    and row["policy"] in by_paper
                ):
                    found[by_paper[row["policy"]]] = {
                        "median": float(row["median"]),
                        "mean": float(row["mean"]),
                    }
        if found:
            return found
    if workload == "default" and metric == "unallocated_gpu_pct":
        return {
            k: {"median": med, "mean": mean}
            for k, (med, mean) in PAPER_DEFAULT_UNALLOCATED_AT_100.items()
        }
    return None


def paper_curves(expected_dir: Path | None, workload: str) -> dict[str, dict[int, float]] | None:
    """The paper's median unallocated GPU % per arrived level (75-130) for ``workload``.

    Read from the published per-run file ``analysis_allo_discrete.csv``; None
    when it is not at hand or lacks the workload.
    """
    path = expected_dir / "analysis_allo_discrete.csv" if expected_dir else None
    if path is None or not path.is_file():
        return None
    name = f"openb_pod_list_{workload}"
    by_paper = {f"{i:02d}-{v}": k for i, (k, v) in _PAPER_DIRS.items()}
    values: dict[str, dict[int, list[float]]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            policy = by_paper.get(row["sc_policy"])
            if row["workload"] != name or policy is None:
                continue
            per_level = values.setdefault(policy, {})
            for level in CURVE_LEVELS:
                cell = row.get(str(level), "")
                if cell:
                    per_level.setdefault(level, []).append(100.0 - float(cell))
    if not values:
        return None
    return {
        policy: {level: _r(statistics.median(v)) for level, v in sorted(levels.items())}
        for policy, levels in values.items()
    }


_PAPER_DIRS = {
    1: ("random", "Random"),
    2: ("dotprod", "DotProd"),
    5: ("bestfit", "BestFit"),
    6: ("fgd", "FGD"),
}


# ---------------------------------------------------------------------------
# The whole experiment


ProgressFn = Callable[[str, int], None]


def run_experiment(
    trace_dir: Path,
    workload: str,
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    mig: bool = False,
    ratio: float = TUNE_RATIO,
    expected_dir: Path | None = None,
    progress: ProgressFn | None = None,
    zone_hosts: int = LAMINAR_ZONE_HOSTS,
    limits: ProbeLimits | None = None,
    workload_prior: bool = False,
) -> dict[str, Any]:
    """Run every policy for every seed; the JSON-ready report of ``laminar sim fgd``.

    ``progress(policy, seed)`` is called after each run. ``zone_hosts`` and ``limits``
    shape the ``laminar`` policy's zones and probing; with ``workload_prior`` its routers
    start from the pod list's mix (:func:`laminar_workload_prior`), as FGD does, instead of
    learning it from the arrivals alone.
    """
    started = time.perf_counter()
    nodes = traces.read_nodes(traces.node_list_path(trace_dir))
    pod_specs = traces.read_pods(traces.pod_list_path(trace_dir, workload))
    pods = [p.shape for p in pod_specs]
    target = typical_workload(pods)
    slicing: GpuSlicing = MigSlicing() if mig else MILLI_SLICING
    report: dict[str, Any] = {
        "experiment": "fgd",
        "workload": workload,
        "mig": mig,
        "tune_ratio": ratio,
        "nodes": len(nodes),
        "cluster_gpus": sum(n.num_gpu for n in nodes),
        "original_pods": len(pods),
        "typical_shapes": len(target.shapes),
        "seeds": list(seeds),
        "laminar_zone_hosts": zone_hosts,
        "laminar_probes_per_attempt": (limits or ProbeLimits()).probes_per_attempt,
        "laminar_workload_prior": workload_prior,
        "policies": {},
    }
    events = 0
    for policy in policies:
        ctx = PolicyContext(
            policy,
            target,
            slicing,
            zone_hosts=zone_hosts,
            limits=limits,
            workload_prior=laminar_workload_prior(pods, slicing) if workload_prior else None,
        )
        logs = []
        for seed in seeds:
            logs.append(run_fill(nodes, pods, ctx, seed, ratio))
            if progress is not None:
                progress(policy, seed)
        summary = summarize_policy(logs)
        events += summary["events_processed"]
        report["policies"][policy] = summary
    wall = time.perf_counter() - started
    report["run_seconds"] = wall
    report["events_processed"] = events
    report["events_per_second"] = events / wall if wall > 0 else 0.0
    report["paper_unallocated_pct_at_100"] = None if mig else paper_results(expected_dir, workload)
    report["paper_frag_amount_pct_at_100"] = (
        None if mig else paper_results(expected_dir, workload, "frag_amount_pct_of_cluster_gpus")
    )
    report["paper_frag_ratio_pct_at_100"] = (
        None if mig else paper_results(expected_dir, workload, "frag_ratio_pct_of_idle_gpu")
    )
    curves = None if mig else paper_curves(expected_dir, workload)
    report["paper_unallocated_pct_curve"] = (
        None
        if curves is None
        else {p: [{"arrived_pct": k, "median": v} for k, v in c.items()] for p, c in curves.items()}
    )
    return report


def parse_seeds(text: str) -> list[int]:
    """``42-51``, ``42,43,44`` or ``42``; raises ValueError with a reason."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise ValueError("empty seed")
        cut = part.find("-", 1)
        bounds = [part] if cut < 0 else [part[:cut], part[cut + 1 :]]
        try:
            numbers = [int(b) for b in bounds]
        except ValueError:
            raise ValueError(f"{part!r} is not a number or a range") from None
        if len(numbers) == 1:
            seeds.append(numbers[0])
            continue
        low, high = numbers
        if high < low:
            raise ValueError(f"range {part} goes backwards")
        if high - low > 10_000:
            raise ValueError(f"range {part} is too long")
        seeds.extend(range(low, high + 1))
    if len(set(seeds)) != len(seeds):
        raise ValueError("a seed is listed twice")
    return seeds


def fmt_pct(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"
