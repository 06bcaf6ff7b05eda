"""Placement policies of the FGD paper (USENIX ATC 2023) as pure functions of one node's state.

Every function here takes a :class:`NodeState` (what one node has left) and a
:class:`PodShape` (what one task asks for) and returns a number or a choice;
nothing here knows about other nodes, clocks or randomness it did not receive.
A centralized scheduler maps a score over all nodes and takes the best; a
decentralized one (Laminar's zones probing a sample of hosts) calls the same
functions on the hosts it sampled, and a host answers "which GPUs" with the
node-local :func:`choose_gpus` alone.

Scores follow the integer 0..100 scale of Kubernetes score plugins, which the
paper's simulator used: the truncation to integers creates ties between nodes,
and how ties are broken (a per-seed node rank) is part of the protocol whose
numbers we reproduce. :func:`fgd_delta_milli` gives the unquantized quantity
for callers that want it.

GPU capacity is expressed by a :class:`GpuSlicing`: plain GPU sharing in
thousandths of a GPU (``gpu_milli``), or MIG-style slices where a request is
rounded up to a legal profile and must sit at a legal offset. Fragmentation and
the best-fit/dot-product scores see a GPU's free capacity in milli-GPUs either
way.

What is not modelled: GPU memory per task (only the compute share), NVLink or
PCIe topology, and per-node pod-count limits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np
import numpy.typing as npt

MILLI = 1000
#: Largest node in the paper's normalization of best-fit and dot-product scores.
MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8_000
MAX_NODE_SCORE = 100

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


#: A100/H100-style MIG: 7 compute slices; legal profile sizes and their start offsets.
MIG_SLOTS = 7
MIG_PROFILE_OFFSETS: dict[int, tuple[int, ...]] = {
    1: (0, 1, 2, 3, 4, 5, 6),
    2: (0, 2, 4),
    3: (0, 4),
    4: (0,),
    7: (0,),
}


class MigSlicing:
    """MIG-style slicing: a GPU state is a bit mask of its 7 free slices.

    A task's share is rounded up to the smallest legal profile (1, 2, 3, 4 or
    7 slices of 7) and must sit at one of that profile's legal offsets; the
    lowest legal offset that is free is used. A whole-GPU task takes all 7.
    """

    name = "mig"
    full = (1 << MIG_SLOTS) - 1
    empty = 0

    def __init__(self) -> None:
        sizes = sorted(MIG_PROFILE_OFFSETS)
        self._sizes = sizes
        table = np.zeros((1 << MIG_SLOTS, MIG_SLOTS + 1), dtype=np.bool_)
        after = np.full((1 << MIG_SLOTS, MIG_SLOTS + 1), -1, dtype=np.int64)
        for mask in range(1 << MIG_SLOTS):
            for size in sizes:
                for offset in MIG_PROFILE_OFFSETS[size]:
                    bits = ((1 << size) - 1) << offset
                    if mask & bits == bits:
                        table[mask, size] = True
                        after[mask, size] = mask & ~bits
                        break
        self._fits = table
        self._after = after

    def request(self, gpu_milli: int) -> int:
        if gpu_milli <= 0:
            return 0
        slots = math.ceil(gpu_milli * MIG_SLOTS / MILLI - 1e-9)
        for size in self._sizes:
            if size >= slots:
                return size
        return MIG_SLOTS

    def fits(self, left: int, request: int) -> bool:
        return bool(self._fits[left, request])

    def take(self, left: int, request: int) -> int:
        result = int(self._after[left, request])
        if result < 0:
            raise ValueError(f"MIG request of {request} slices does not fit mask {left:07b}")
        return result

    def free_milli(self, left: int) -> float:
        return left.bit_count() * MILLI / MIG_SLOTS

    def request_milli(self, request: int) -> float:
        return request * MILLI / MIG_SLOTS

    def fits_array(self, left: IntArray, request: int) -> BoolArray:
        result: BoolArray = self._fits[left, request]
        return result


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


def best_fit_gpu(node: NodeState, pod: PodShape, slicing: GpuSlicing) -> tuple[int, ...] | None:
    """For a shared task the fitting GPU with the least free capacity (lowest index on ties)."""
    if pod.num_gpu == 0:
        return ()
    if not pod.is_shared:
        return exclusive_gpus(node, pod, slicing)
    request = gpu_request(pod, slicing)
    best: int | None = None
    best_free = math.inf
    for i, left in enumerate(node.gpu_left):
        if slicing.fits(left, request):
            free = slicing.free_milli(left)
            if free < best_free:
                best, best_free = i, free
    return None if best is None else (best,)


def random_gpu(
    node: NodeState, pod: PodShape, slicing: GpuSlicing, rng: np.random.Generator
) -> tuple[int, ...] | None:
    """For a shared task a uniformly random fitting GPU; whole GPUs lowest index first."""
    if pod.num_gpu == 0:
        return ()
    if not pod.is_shared:
        return exclusive_gpus(node, pod, slicing)
    request = gpu_request(pod, slicing)
    candidates = [i for i, left in enumerate(node.gpu_left) if slicing.fits(left, request)]
    if not candidates:
        return None
    return (candidates[int(rng.integers(len(candidates)))],)


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


def fgd_score(delta_milli: float) -> int:
    """Kubernetes-style 0..100 score of a fragmentation change (lower change scores higher)."""
    return int(1.0 / (1.0 + math.exp(delta_milli / 1000.0)) * MAX_NODE_SCORE)


class FragmentationCache:
    """Memo of :func:`node_fragmentation_milli` by node state (order of GPUs ignored).

    A node's fragmentation changes only when the node changes, and many nodes
    share states, so a run computes each distinct state once.
    """

    def __init__(self, target: TargetWorkload, slicing: GpuSlicing) -> None:
        self.target = target
        self.slicing = slicing
        self._memo: dict[tuple[str, int, tuple[int, ...]], float] = {}

    def __call__(self, node: NodeState) -> float:
        key = (node.model, node.cpu_left_milli, tuple(sorted(node.gpu_left)))
        value = self._memo.get(key)
        if value is None:
            value = node_fragmentation_milli(node, self.target, self.slicing)
            self._memo[key] = value
        return value


def fgd_delta_milli(
    node: NodeState, pod: PodShape, gpus: Sequence[int], frag: FragmentationCache
) -> float:
    """Increase of the node's fragmentation if ``pod`` goes onto ``gpus``."""
    return frag(place(node, pod, gpus, frag.slicing)) - frag(node)


def fgd_gpus(
    node: NodeState, pod: PodShape, frag: FragmentationCache
) -> tuple[tuple[int, ...], int] | None:
    """FGD's node-local choice: the GPUs whose use raises fragmentation least, and its score.

    A shared task tries every GPU with room (lowest index wins equal scores);
    whole-GPU tasks take the lowest-index free GPUs, as any free GPU leaves the
    node in the same state up to GPU order. Returns None when the pod does not
    fit the node's GPUs.
    """
    slicing = frag.slicing
    if not pod.is_shared:
        chosen = () if pod.num_gpu == 0 else exclusive_gpus(node, pod, slicing)
        if chosen is None:
            return None
        return chosen, fgd_score(fgd_delta_milli(node, pod, chosen, frag))
    request = gpu_request(pod, slicing)
    before = frag(node)
    best: tuple[tuple[int, ...], int] | None = None
    for i, left in enumerate(node.gpu_left):
        if not slicing.fits(left, request):
            continue
        score = fgd_score(frag(place(node, pod, (i,), slicing)) - before)
        if best is None or score > best[1]:
            best = ((i,), score)
    return best


# ---------------------------------------------------------------------------
# Node scores of the baselines (higher is better; 0..100 like Kubernetes)


def best_fit_score(node: NodeState, pod: PodShape, slicing: GpuSlicing) -> int:
    """Best fit: prefer the node left with the least CPU and GPU after placing (half weight each)."""
    gpu_left = free_gpu_milli(node, slicing) - _request_milli(pod, slicing)
    cpu_left = node.cpu_left_milli - pod.cpu_milli
    waste = 0.5 * cpu_left / MAX_SPEC_CPU_MILLI + 0.5 * gpu_left / MAX_SPEC_GPU_MILLI
    return int((1.0 - waste) * MAX_NODE_SCORE)


def dot_product_score(node: NodeState, pod: PodShape, slicing: GpuSlicing) -> int:
    """Tetris-style dot product of free and requested (CPU, GPU), normalized by the largest node.

    As in the paper's baseline, a smaller dot product scores higher.
    """
    free = (
        node.cpu_left_milli / MAX_SPEC_CPU_MILLI,
        free_gpu_milli(node, slicing) / MAX_SPEC_GPU_MILLI,
    )
    asked = (pod.cpu_milli / MAX_SPEC_CPU_MILLI, _request_milli(pod, slicing) / MAX_SPEC_GPU_MILLI)
    dot = (free[0] * asked[0] + free[1] * asked[1]) / 2.0
    return int((1.0 - dot) * MAX_NODE_SCORE)


def _request_milli(pod: PodShape, slicing: GpuSlicing) -> float:
    if pod.num_gpu == 0:
        return 0.0
    return pod.num_gpu * slicing.request_milli(gpu_request(pod, slicing))


# ---------------------------------------------------------------------------
# One entry point per policy: the node's score for the pod and the GPUs it would use

POLICIES = ("fgd", "bestfit", "dotprod", "random")


def score_node(
    policy: str, node: NodeState, pod: PodShape, frag: FragmentationCache
) -> tuple[int, tuple[int, ...]] | None:
    """``(score, gpus)`` of placing ``pod`` on ``node`` under a deterministic policy.

    Assumes CPU, memory and model were checked (:func:`fits`); returns None when
    the node's GPUs cannot take the pod. ``random`` has no score: callers pick a
    feasible node uniformly and then a GPU with :func:`random_gpu`.
    """
    slicing = frag.slicing
    if policy == "fgd":
        return _swap(fgd_gpus(node, pod, frag))
    gpus = best_fit_gpu(node, pod, slicing)
    if gpus is None:
        return None
    if policy == "bestfit":
        return best_fit_score(node, pod, slicing), gpus
    if policy == "dotprod":
        return dot_product_score(node, pod, slicing), gpus
    raise ValueError(f"policy {policy!r} has no node score")


def _swap(choice: tuple[tuple[int, ...], int] | None) -> tuple[int, tuple[int, ...]] | None:
    return None if choice is None else (choice[1], choice[0])
