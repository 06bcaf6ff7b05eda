"""Placement policies of the FGD paper (USENIX ATC 2023) as pure functions of one node's state.

Every function here takes a :class:`NodeState` (what one node has left) and a
:class:`PodShape` (what one task asks for) and returns a number or a choice;
nothing here knows about other nodes, clocks or randomness it did not receive.
A centralized scheduler maps a score over all nodes and takes the best; a
decentralized one (Laminar's zones probing a sample of hosts) calls the same
functions on the hosts it sampled, and a host answers "which GPUs" with the
node-local :func:`fgd_gpus` alone. The fragmentation measure and FGD's choice live in
:mod:`laminar_base.fragmentation`, shared with the router and the agent.

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

import numpy as np

from laminar_base.fragmentation import (
    MAX_NODE_SCORE,
    MILLI,
    MILLI_SLICING,
    BoolArray,
    FragmentationCache,
    GpuSlicing,
    IntArray,
    MilliSlicing,
    NodeState,
    PodShape,
    TargetWorkload,
    exclusive_gpus,
    fgd_delta_milli,
    fgd_gpus,
    fgd_score,
    fits,
    free_gpu_milli,
    gpu_request,
    node_fragmentation_milli,
    place,
)

__all__ = [
    "MILLI",
    "MILLI_SLICING",
    "POLICIES",
    "FragmentationCache",
    "GpuSlicing",
    "MigSlicing",
    "MilliSlicing",
    "NodeState",
    "PodShape",
    "TargetWorkload",
    "best_fit_gpu",
    "fgd_delta_milli",
    "fgd_gpus",
    "fgd_score",
    "fits",
    "gpu_request",
    "node_fragmentation_milli",
    "place",
    "random_gpu",
    "score_node",
]

#: Largest node in the paper's normalization of best-fit and dot-product scores.
MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8_000

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
