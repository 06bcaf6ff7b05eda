"""The FGD paper's fragmentation measure (USENIX ATC 2023) as pure functions of one node.

Shared by the FGD baseline of the simulator (:mod:`laminar_sim.policies`), the router's
ranking of probe candidates (:mod:`laminar_zone.view`) and the agent's choice of a GPU
inside its host (:mod:`laminar_agent.ledger`), so all three measure the same thing.

A node's fragmentation is the expected GPU capacity (milli-GPUs) a task drawn from a
target workload could not use there; placing a task well raises it least (the
fragmentation gradient). What is not modelled: GPU memory per task, NVLink or PCIe
topology, per-node pod-count limits.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np
import numpy.typing as npt

from laminar_base.demand import MILLI_PER_GPU, Demand, HostCap, host_share

#: Largest value of the Kubernetes-style node score.
MAX_NODE_SCORE = 100
MILLI = 1000

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class PodShape:
    """The resources one task asks for; two tasks with equal shapes place alike.

    ``gpu_milli`` is per GPU: a task with ``num_gpu == 1`` and ``gpu_milli <
    1000`` shares one GPU; ``num_gpu > 1`` takes whole GPUs. ``gpu_models`` lists
    the GPU models the task accepts; empty means any (a task that needs no GPU
    can still run on any node).
    """

    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_models: tuple[str, ...] = ()

    @property
    def is_shared(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < MILLI

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    def accepts(self, model: str) -> bool:
        """Whether a node whose GPUs are ``model`` may host this task."""
        if self.num_gpu == 0 or not self.gpu_models:
            return True
        return model in self.gpu_models


@dataclass(frozen=True, slots=True)
class NodeState:
    """What one node has left; ``gpu_left`` is per device in the slicing's units."""

    model: str
    cpu_left_milli: int
    memory_left_mib: int
    gpu_left: tuple[int, ...]


class GpuSlicing(Protocol):
    """How a GPU's free capacity is represented and carved up."""

    name: str
    #: Free state of an untouched GPU.
    full: int
    #: A padding state that fits nothing and frees nothing (for fixed-width arrays).
    empty: int

    def request(self, gpu_milli: int) -> int:
        """A task's per-GPU request in this slicing's units."""
        ...

    def fits(self, left: int, request: int) -> bool: ...

    def take(self, left: int, request: int) -> int:
        """The GPU's free state after placing ``request`` (which must fit)."""
        ...

    def free_milli(self, left: int) -> float:
        """Free capacity in milli-GPUs, for fragmentation and scores."""
        ...

    def request_milli(self, request: int) -> float:
        """A per-GPU request in milli-GPUs (what the task really takes)."""
        ...

    def fits_array(self, left: IntArray, request: int) -> BoolArray:
        """Vectorized :meth:`fits` over an array of GPU states."""
        ...


class MilliSlicing:
    """Fractional sharing by ``gpu_milli``: a GPU has 1000 units and any amount fits."""

    name = "milli"
    full = MILLI
    empty = -1

    def request(self, gpu_milli: int) -> int:
        return gpu_milli

    def fits(self, left: int, request: int) -> bool:
        return left >= request

    def take(self, left: int, request: int) -> int:
        return left - request

    def free_milli(self, left: int) -> float:
        return float(left) if left > 0 else 0.0

    def request_milli(self, request: int) -> float:
        return float(request)

    def fits_array(self, left: IntArray, request: int) -> BoolArray:
        return left >= request


MILLI_SLICING = MilliSlicing()


def gpu_request(pod: PodShape, slicing: GpuSlicing) -> int:
    """The pod's per-GPU request in the slicing's units (whole GPUs take a full GPU)."""
    if pod.num_gpu == 0:
        return 0
    return slicing.request(min(pod.gpu_milli, MILLI))


def fits(node: NodeState, pod: PodShape, slicing: GpuSlicing) -> bool:
    """Whether the pod can be placed on the node now (CPU, memory, GPU model and GPUs)."""
    if node.cpu_left_milli < pod.cpu_milli or node.memory_left_mib < pod.memory_mib:
        return False
    if pod.num_gpu == 0:
        return True
    if not pod.accepts(node.model):
        return False
    request = gpu_request(pod, slicing)
    return sum(1 for left in node.gpu_left if slicing.fits(left, request)) >= pod.num_gpu


def free_gpu_milli(node: NodeState, slicing: GpuSlicing) -> float:
    return sum(slicing.free_milli(left) for left in node.gpu_left)


def place(node: NodeState, pod: PodShape, gpus: Sequence[int], slicing: GpuSlicing) -> NodeState:
    """The node's state after placing ``pod`` on devices ``gpus`` (which must fit)."""
    left = list(node.gpu_left)
    request = gpu_request(pod, slicing)
    for index in gpus:
        left[index] = slicing.take(left[index], request)
    return NodeState(
        node.model,
        node.cpu_left_milli - pod.cpu_milli,
        node.memory_left_mib - pod.memory_mib,
        tuple(left),
    )


# ---------------------------------------------------------------------------
# Node-local GPU choice


def exclusive_gpus(node: NodeState, pod: PodShape, slicing: GpuSlicing) -> tuple[int, ...] | None:
    """Lowest-index fully free GPUs for a whole-GPU task, or None."""
    chosen = tuple(i for i, left in enumerate(node.gpu_left) if left == slicing.full)
    if len(chosen) < pod.num_gpu:
        return None
    return chosen[: pod.num_gpu]


# ---------------------------------------------------------------------------
# Fragmentation (the paper's measure) and FGD


@dataclass(frozen=True)
class TargetWorkload:
    """Typical task shapes with their probabilities (summing to 1).

    The paper's target workload: the most frequent shapes of the original task
    list, in decreasing count, until they cover a share (95%) of its tasks,
    renormalized. Memory is not part of a shape here: fragmentation looks at
    CPU and GPUs only.
    """

    shapes: tuple[PodShape, ...]
    probabilities: tuple[float, ...]

    @cached_property
    def _arrays(self) -> tuple[IntArray, IntArray, IntArray, npt.NDArray[np.float64]]:
        cpu = np.array([s.cpu_milli for s in self.shapes], dtype=np.int64)
        num = np.array([s.num_gpu for s in self.shapes], dtype=np.int64)
        milli = np.array([s.gpu_milli for s in self.shapes], dtype=np.int64)
        prob = np.array(self.probabilities, dtype=np.float64)
        return cpu, num, milli, prob


def node_fragmentation_milli(node: NodeState, target: TargetWorkload, slicing: GpuSlicing) -> float:
    """Expected milli-GPUs of this node that a task drawn from ``target`` could not use.

    For each typical task: if it can run here (CPU left, GPU model accepted and
    enough GPUs each with room for its per-GPU share), the fragment is the free
    capacity of the GPUs too small for that share; otherwise every free GPU
    unit on the node is a fragment to it. A task that needs no GPU cannot use
    any, so all free GPU capacity counts for it.
    """
    free = [slicing.free_milli(left) for left in node.gpu_left]
    total_free = sum(free)
    if total_free <= 0:
        return 0.0
    result = 0.0
    for shape, prob in zip(target.shapes, target.probabilities, strict=True):
        if (
            shape.num_gpu == 0
            or not shape.accepts(node.model)
            or node.cpu_left_milli < shape.cpu_milli
        ):
            result += prob * total_free
            continue
        request = gpu_request(shape, slicing)
        fitting = 0
        small = 0.0
        for left, amount in zip(node.gpu_left, free, strict=True):
            if slicing.fits(left, request):
                fitting += 1
            else:
                small += amount
        result += prob * (small if fitting >= shape.num_gpu else total_free)
    return result


def gradient_score(delta_milli: float) -> float:
    """A fragmentation change as a score in (0, 1), higher is better: ``1 / (1 + e^(d/1000))``.

    Unquantized, so that the router's ranking, the agent's GPU choice and late binding
    compare placements on one scale; 0.5 is "no change"."""
    return 1.0 / (1.0 + math.exp(min(700.0, delta_milli / 1000.0)))


def fgd_score(delta_milli: float) -> int:
    """Kubernetes-style 0..100 score of a fragmentation change (lower change scores higher)."""
    return int(gradient_score(delta_milli) * MAX_NODE_SCORE)


@dataclass(frozen=True, slots=True)
class _ShapeGroup:
    """The target's GPU shapes that differ only in CPU: one GPU request, count and models.

    ``cpus`` ascending; ``beyond[i]`` is the probability of the group's shapes from ``i``
    on, so the shapes a node's CPU left cannot hold weigh ``beyond[bisect_right(cpus,
    cpu_left)]``."""

    num_gpu: int
    request: int
    models: tuple[str, ...]
    cpus: tuple[int, ...]
    beyond: tuple[float, ...]

    def accepts(self, model: str) -> bool:
        return not self.models or model in self.models


def _shape_groups(target: TargetWorkload, slicing: GpuSlicing) -> tuple[float, list[_ShapeGroup]]:
    """The probability of the target's shapes that take no GPU, and its GPU shapes grouped
    by (GPU count, per-GPU request, models), for :func:`_grouped_fragmentation_milli`."""
    no_gpu = 0.0
    by_key: dict[tuple[int, int, tuple[str, ...]], list[tuple[int, float]]] = {}
    for shape, prob in zip(target.shapes, target.probabilities, strict=True):
        if shape.num_gpu == 0:
            no_gpu += prob
            continue
        key = (shape.num_gpu, gpu_request(shape, slicing), shape.gpu_models)
        by_key.setdefault(key, []).append((shape.cpu_milli, prob))
    groups = []
    for (num_gpu, request, models), members in by_key.items():
        members.sort()
        beyond = [0.0] * (len(members) + 1)
        for i in range(len(members) - 1, -1, -1):
            beyond[i] = beyond[i + 1] + members[i][1]
        groups.append(
            _ShapeGroup(num_gpu, request, models, tuple(c for c, _ in members), tuple(beyond))
        )
    return no_gpu, groups


def _grouped_fragmentation_milli(
    node: NodeState, no_gpu: float, groups: Sequence[_ShapeGroup], slicing: GpuSlicing
) -> float:
    """:func:`node_fragmentation_milli` over shapes grouped by :func:`_shape_groups`: equal
    up to float rounding, with one pass over the GPUs per group instead of per shape, so a
    target of every observed shape (:data:`TYPICAL_COVERAGE_RATIO`) costs about what the
    paper's 95% cut does (shapes differ mostly in CPU)."""
    free = [slicing.free_milli(left) for left in node.gpu_left]
    total_free = sum(free)
    if total_free <= 0:
        return 0.0
    unusable = no_gpu  # probability of the shapes that can use none of the node's GPUs
    result = 0.0
    for group in groups:
        if not group.accepts(node.model):
            unusable += group.beyond[0]
            continue
        fitting = 0
        small = 0.0
        for left, amount in zip(node.gpu_left, free, strict=True):
            if slicing.fits(left, group.request):
                fitting += 1
            else:
                small += amount
        short = group.beyond[bisect.bisect_right(group.cpus, node.cpu_left_milli)]
        if fitting >= group.num_gpu:
            unusable += short
            result += (group.beyond[0] - short) * small
        else:
            unusable += group.beyond[0]
    return result + unusable * total_free


class FragmentationCache:
    """Memo of :func:`node_fragmentation_milli` by node state (order of GPUs ignored).

    A node's fragmentation changes only when the node changes, and many nodes
    share states, so a run computes each distinct state once.
    """

    def __init__(self, target: TargetWorkload, slicing: GpuSlicing) -> None:
        self.target = target
        self.slicing = slicing
        self._no_gpu, self._groups = _shape_groups(target, slicing)
        self._memo: dict[tuple[str, int, tuple[int, ...]], float] = {}
        self._scores: dict[tuple[str, int, tuple[int, ...], int, int, int], int | None] = {}

    def __call__(self, node: NodeState) -> float:
        key = (node.model, node.cpu_left_milli, tuple(sorted(node.gpu_left)))
        value = self._memo.get(key)
        if value is None:
            value = _grouped_fragmentation_milli(node, self._no_gpu, self._groups, self.slicing)
            self._memo[key] = value
        return value

    def node_score(self, node: NodeState, pod: PodShape) -> int | None:
        """FGD's 0..100 node score (:func:`fgd_score`) of the placement of ``pod`` on ``node``
        that raises fragmentation least (None: its GPUs cannot take it), memoized by what it
        depends on: the node's model, CPU left and GPUs' free states in any order, and the
        pod's CPU and GPU request (memory is not part of the measure). What the router ranks
        hosts by: quantized as FGD's is, so that many hosts tie and the router's fixed host
        order breaks the ties (:meth:`laminar_zone.view.ZoneView.first_in_order`), which is
        what makes FGD pack (``sim fgd``, one zone, seeds 42-51, the default list: 5.69%
        unallocated unquantized, 5.01 on 200 levels, 4.83 on FGD's 100, 4.78 on 50 but
        gpushare40 6.27 against 6.10; docs/benchmarks.md, "2026-11-30"). The memo is
        emptied when it holds :data:`SCORE_MEMO_ENTRIES`, so it stays bounded on a
        long-lived router."""
        key = (
            node.model,
            node.cpu_left_milli,
            tuple(sorted(node.gpu_left)),
            pod.cpu_milli,
            pod.num_gpu,
            pod.gpu_milli,
        )
        try:
            return self._scores[key]
        except KeyError:
            pass
        best = least_fragmenting_delta(node, pod, self)
        if len(self._scores) >= SCORE_MEMO_ENTRIES:
            self._scores.clear()
        score = self._scores[key] = None if best is None else fgd_score(best[1])
        return score


#: Entries :meth:`FragmentationCache.node_score` memoizes before starting afresh.
SCORE_MEMO_ENTRIES = 1 << 16


def fgd_delta_milli(
    node: NodeState, pod: PodShape, gpus: Sequence[int], frag: FragmentationCache
) -> float:
    """Increase of the node's fragmentation if ``pod`` goes onto ``gpus``."""
    return frag(place(node, pod, gpus, frag.slicing)) - frag(node)


def placements(
    node: NodeState, pod: PodShape, frag: FragmentationCache
) -> Iterator[tuple[tuple[int, ...], float]]:
    """Each way ``pod`` can go onto the node's GPUs, with the fragmentation change it causes.

    A shared task tries every GPU with room, lowest index first; whole-GPU tasks take the
    lowest-index free GPUs, as any free GPU leaves the node in the same state up to GPU
    order; a task with no GPU takes none. Nothing is yielded when the GPUs cannot take it.
    """
    slicing = frag.slicing
    if not pod.is_shared:
        chosen = () if pod.num_gpu == 0 else exclusive_gpus(node, pod, slicing)
        if chosen is not None:
            yield chosen, fgd_delta_milli(node, pod, chosen, frag)
        return
    request = gpu_request(pod, slicing)
    before = frag(node)
    for i, left in enumerate(node.gpu_left):
        if slicing.fits(left, request):
            yield (i,), frag(place(node, pod, (i,), slicing)) - before


#: Weight of how full a node's GPUs already are in :func:`placement_score`, the agent's
#: score of a lease (what late binding compares when a try probes more than one host).
#: Fragmentation deltas are often equal (0 for many hosts); this term prefers the fuller
#: host among them. Measured with the router ranking by it too (before it ranked by FGD's
#: quantized score and a fixed host order): d = 2, default pod list, seed 42, 16
#: candidates, weights 0, 1e-4, 0.02, 0.1, 0.3 and 1 gave 9.6, 7.0, 6.8, 5.9, 5.7 and 6.0%
#: unallocated; with d = 1, seeds 42-51, 0.1 beat 0.3 on all six pod lists of
#: docs/benchmarks.md. Since a one-member try commits on its probe (d = 1) and the router
#: ranks by FGD's score alone, it orders only gangs' leases: the weight does not move the
#: agent's choice of a GPU (``used`` is the host's before placing, the same for each) and
#: 0 gives ``sim fgd`` the same figures seed by seed (docs/benchmarks.md, "2026-11-30").
PACKING_WEIGHT = 0.1


def placement_score(node: NodeState, delta_milli: float, slicing: GpuSlicing) -> float:
    """A placement's score in [0, 1], higher is better: the fragmentation gradient
    (:func:`gradient_score` of ``delta_milli``) blended with how used the node's GPUs
    already are (:data:`PACKING_WEIGHT`). What the agent answers a probe with, so late
    binding compares leases on one scale."""
    capacity = MILLI * len(node.gpu_left)
    free = sum(slicing.free_milli(left) for left in node.gpu_left)
    used = 1.0 - free / capacity if capacity else 0.0
    return (gradient_score(delta_milli) + PACKING_WEIGHT * used) / (1.0 + PACKING_WEIGHT)


def least_fragmenting_delta(
    node: NodeState, pod: PodShape, frag: FragmentationCache
) -> tuple[tuple[int, ...], float] | None:
    """The placement that raises fragmentation least (lowest GPU index on equal changes) and
    that change in milli-GPUs; None when the GPUs cannot take the pod."""
    best: tuple[tuple[int, ...], float] | None = None
    for gpus, delta in placements(node, pod, frag):
        if best is None or delta < best[1]:
            best = (gpus, delta)
    return best


def fgd_gpus(
    node: NodeState, pod: PodShape, frag: FragmentationCache
) -> tuple[tuple[int, ...], int] | None:
    """FGD's node-local choice: the GPUs whose use raises fragmentation least, and its score
    on the paper's quantized 0..100 scale (lowest index wins equal scores). None when the
    pod does not fit the node's GPUs."""
    best: tuple[tuple[int, ...], int] | None = None
    for gpus, delta in placements(node, pod, frag):
        score = fgd_score(delta)
        if best is None or score > best[1]:
            best = (gpus, score)
    return best


#: Share of the tasks the most frequent shapes must cover to make the target workload (the
#: FGD paper's cut; a learned target's too, :meth:`ObservedWorkload.cache`). Every shape
#: (1.0) for the learned target, one zone, seeds 42-51: default list 4.66% unallocated
#: against 4.83 (FGD 4.77), but cpu250 7.00 against 6.74 (FGD 6.98) and gpushare100 13.34
#: against 13.29 (FGD 13.32); shrinking each GPU request's CPU mix toward the whole mix's
#: helped neither the default list nor gpushare40 (docs/benchmarks.md, "2026-11-29:
#: shrinkage and the learned target's cut (issue 16)"; both knobs since removed).
TYPICAL_COVERAGE_RATIO = 0.95


def typical_workload(
    counts: Mapping[PodShape, int], coverage_ratio: float = TYPICAL_COVERAGE_RATIO
) -> TargetWorkload:
    """Most frequent shapes (memory ignored) until they cover ``coverage_ratio`` of tasks.

    Shapes are taken in decreasing count, equal counts larger shape first, so the cut is
    deterministic; probabilities are renormalized to sum to 1.
    """
    merged = _merged(counts)
    if not merged:
        raise ValueError("typical_workload needs at least one task")
    return _typical(merged, coverage_ratio)


_Key = tuple[int, int, int, tuple[str, ...]]  # (cpu_milli, gpu_milli, num_gpu, gpu_models)


def _merged(counts: Mapping[PodShape, int]) -> Counter[_Key]:
    merged: Counter[_Key] = Counter()
    for shape, count in counts.items():
        merged[(shape.cpu_milli, shape.gpu_milli, shape.num_gpu, shape.gpu_models)] += count
    return merged


def _typical(merged: Mapping[_Key, float], coverage_ratio: float) -> TargetWorkload:
    """:func:`typical_workload` over counts by shape key."""
    ordered = sorted(merged.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    needed = coverage_ratio * sum(merged.values())
    chosen: list[tuple[_Key, float]] = []
    covered = 0.0
    for key, count in ordered:
        if covered >= needed:
            break
        chosen.append((key, count))
        covered += count
    shapes = tuple(PodShape(cpu, 0, num, milli, models) for (cpu, milli, num, models), _ in chosen)
    return TargetWorkload(shapes, tuple(count / covered for _, count in chosen))


#: Observations a router waits for before it ranks tasks of one GPU or none by the target
#: it learned (:attr:`ObservedWorkload.min_observed`; the zone's default too).
MIN_OBSERVED = 512


@dataclass
class ObservedWorkload:
    """The target workload learned from the tasks a router has seen (the zone's own mix).

    FGD needs the shapes tasks come in and how often; a router knows them from what it is
    asked to place. Counts are kept for at most ``max_shapes`` distinct shapes (a new shape
    past that replaces none), and :meth:`cache` rebuilds the target and its memo only when
    the count of observations doubled since the last build (then every ``refresh_every``),
    so the cost per placement stays bounded and memoized fragmentation is reused. Before
    ``min_observed`` observations a task of one GPU or none is ranked by no target: the
    router draws in its fixed host order (first fit); see :meth:`cache`.
    """

    slicing: GpuSlicing
    max_shapes: int = 256
    max_peers: int = 64
    #: Observations between rebuilds once past the doublings.
    refresh_every: int = 256
    #: Observations before the router ranks a shape of one GPU or none by the target (0:
    #: from the first); shapes of several GPUs, and the agents' measure, take it from the
    #: first. Measured, ``sim fgd``, learned, seeds 42-51, % unallocated at 100% arrived,
    #: median (mean): 512 with ``refresh_every`` = 256 gave the default list 4.83 (4.87)
    #: against 5.01 (5.02) at 0 and 1,024, gpushare40 6.07 against 6.18, the other lists
    #: within their seeds' spread (multigpu50 3.07 against 3.04); a wait for every shape
    #: and for the agents too cost multigpu50 3.12 (docs/benchmarks.md, "learned workload
    #: (issue 16)").
    min_observed: int = MIN_OBSERVED
    counts: Counter[PodShape] = field(default_factory=Counter)
    observed: int = 0
    _built_at: int = 0
    _cache: FragmentationCache | None = None

    #: What this router itself observed (``counts`` adds its peers' to it): what it tells
    #: its peers, so no count travels twice.
    own: Counter[PodShape] = field(default_factory=Counter)
    _peers: dict[str, Counter[PodShape]] = field(default_factory=dict)

    def _admitted(self, shape: PodShape, count: int) -> PodShape | None:
        """The key ``count`` tasks of ``shape`` are counted under (host memory is not part
        of the measure), or None when they are not counted: no tasks, or a new shape past
        ``max_shapes``."""
        key = _target_key(shape)
        if count > 0 and (key in self.counts or len(self.counts) < self.max_shapes):
            return key
        return None

    def observe(self, shape: PodShape, count: int = 1) -> None:
        """Count ``count`` tasks of ``shape`` that this router was asked to place (more than
        one: what it had observed before a restart, from its journal)."""
        key = self._admitted(shape, count)
        if key is not None:
            self.counts[key] += count
            self.own[key] += count
        self.observed += max(0, count)

    def add_prior(self, counts: Mapping[PodShape, int]) -> None:
        """Start from a mix known before (such as the workload a router learned before):
        counted in the target, not told to peers (each has its own prior). Its shapes are
        admitted most frequent first, so where the prior holds more than ``max_shapes``
        the rarest are the ones left out (in the file's order, gpuspec33's prior of 320
        shapes lost 18 of its 95% cut's 124)."""
        merged: Counter[PodShape] = Counter()
        for shape, count in counts.items():
            if count > 0:
                merged[_target_key(shape)] += count
        for shape, count in merged.most_common():
            key = self._admitted(shape, count)
            if key is not None:
                self.counts[key] += count
                self.observed += count

    def note_peer(self, peer: str, counts: Mapping[PodShape, int]) -> None:
        """A peer zone's own observations as of its last summary (they replace the ones it
        sent before): a router learns the mix from every zone's arrivals, not a third of
        them (measured, ``sim fgd`` default list, seeds 42-45: 5.36% unallocated learning
        alone, 4.98 with every zone's arrivals at once). At most ``max_peers`` peers and
        ``max_shapes`` shapes are kept; ``observed`` only grows, so :attr:`version` names a
        new build."""
        old = self._peers.get(peer)
        if old is None and len(self._peers) >= self.max_peers:
            return
        fresh: Counter[PodShape] = Counter()
        for shape, count in counts.items():
            key = self._admitted(shape, count)
            if key is not None:
                fresh[key] += count
                self.counts[key] += count
        for shape, count in (old or Counter()).items():
            self.counts[shape] -= count
            if self.counts[shape] <= 0:
                del self.counts[shape]
        self._peers[peer] = fresh
        self.observed += max(0, sum(fresh.values()) - sum((old or Counter()).values()))

    @property
    def version(self) -> int:
        """Names the target the last :meth:`cache` built (0: none yet); it changes when the
        target is rebuilt, so agents that score by it know when to take the new one."""
        return self._built_at if self._cache is not None else 0

    def cache(self, shape: PodShape | None = None) -> FragmentationCache | None:
        """The fragmentation measure over the current target, for ranking ``shape`` (None:
        the measure agents score by); None without observations, or for a shape of one GPU
        or none before ``min_observed`` of them (a prior counts): the router then draws in
        its fixed host order (first fit). Built on the same schedule either way."""
        if not self.counts:
            return None
        since = self.observed - self._built_at
        if self._cache is None or since >= min(self.refresh_every, max(1, self._built_at)):
            target = typical_workload(self.counts)
            self._cache = FragmentationCache(target, self.slicing)
            self._built_at = self.observed
        if shape is not None and shape.num_gpu <= 1 and self.observed < self.min_observed:
            return None
        return self._cache


#: Most shapes a workload file (a router's prior, or its journaled observations) holds.
MAX_WORKLOAD_ROWS = 4096


def workload_rows(counts: Mapping[PodShape, int]) -> list[dict[str, object]]:
    """A workload as plain rows (JSON): the shapes a router observes, with their counts."""
    return [
        {
            "cpu_milli": shape.cpu_milli,
            "num_gpu": shape.num_gpu,
            "gpu_milli": shape.gpu_milli,
            "gpu_models": list(shape.gpu_models),
            "count": count,
        }
        for shape, count in counts.items()
        if count > 0
    ]


def workload_from_rows(rows: object, where: str) -> Counter[PodShape]:
    """The counts :func:`workload_rows` wrote; ``ValueError`` naming ``where`` and the row
    on anything else (a file an operator wrote, or a damaged journal value)."""
    if not isinstance(rows, list):
        raise ValueError(f"{where}: must be a list of shapes, got {type(rows).__name__}")
    if len(rows) > MAX_WORKLOAD_ROWS:
        raise ValueError(f"{where}: at most {MAX_WORKLOAD_ROWS} shapes, got {len(rows)}")
    counts: Counter[PodShape] = Counter()
    limits = {"cpu_milli": 1 << 40, "num_gpu": 1024, "gpu_milli": MILLI, "count": 1 << 53}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{where}[{i}]: must be an object with {', '.join(limits)}")
        values: dict[str, int] = {}
        for key, high in limits.items():
            value = row.get(key, 0)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
                raise ValueError(f"{where}[{i}].{key}: must be an integer in 0..{high}")
            values[key] = value
        models = row.get("gpu_models", [])
        if not isinstance(models, list) or not all(
            isinstance(m, str) and 0 < len(m) <= 64 for m in models
        ):
            raise ValueError(f"{where}[{i}].gpu_models: must be a list of GPU model names")
        if values["num_gpu"] and not values["gpu_milli"]:
            raise ValueError(f"{where}[{i}].gpu_milli: must be > 0 when num_gpu is")
        shape = PodShape(
            values["cpu_milli"], 0, values["num_gpu"], values["gpu_milli"], tuple(models)
        )
        counts[shape] += values["count"]
    return counts


def host_node(model: str, host: HostCap) -> NodeState:
    """A host as the measure sees it: what its agent reports free (a resource the agent
    does not arbitrate counts as unlimited). Router and agent read a host alike."""
    return NodeState(
        model,
        host.cpu_free_milli if host.cpu_total_milli else 1 << 40,
        (host.memory_free_bytes if host.memory_total_bytes else 1 << 60) >> 20,
        host.gpu_free_milli,
    )


def demand_pod(need: Demand, host: HostCap) -> PodShape:
    """One member of ``need`` as a task shape, with the CPU and memory it reserves on
    ``host`` (:func:`laminar_base.demand.host_share`)."""
    cpu, memory = host_share(need, host.cpu_total_milli, host.memory_total_bytes, host.gpus_total)
    # A MIG profile is measured as the share of a GPU its compute slices are.
    share = need.gpu_milli or (round(need.gpu_units * MILLI_PER_GPU) if need.mig_profile else 0)
    gpus = need.gpus or (1 if share else 0)
    return PodShape(cpu, memory >> 20, gpus, share or (MILLI_PER_GPU if gpus else 0))


def _target_key(shape: PodShape) -> PodShape:
    """The shape a target counts ``shape`` under: host memory is not part of the measure."""
    return PodShape(shape.cpu_milli, 0, shape.num_gpu, shape.gpu_milli, shape.gpu_models)
