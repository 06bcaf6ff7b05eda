"""Pure placement policy shared by the router and the simulator: no I/O, no gRPC calls.

What a job needs is one :class:`Demand` (per gang member). Agents advertise free
capacity per shape (``gpu:<model>``, ``mig:<profile>``, ``share:<model>``);
:func:`members_fitting` reads an advertisement the way the agent's ledger
would decide, so a probe sent on its strength usually lands. The agent stays
the authority: a summary can be stale and a probe can still bounce.

Also here: lease choice (late binding), gang assignment (all members or
none), and the flow-splitting weight ``W_z = (1 + S_z) / (1 + H_z)^gamma``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from laminar_base.demand import MILLI_PER_GPU, Demand, HostCap
from laminar_base.fragmentation import (
    FragmentationCache,
    demand_pod,
    host_node,
)

#: Stand-in for "any number" of CPU-only members on one host.
CPU_ONLY_CAPACITY = 1_000_000


@dataclass(frozen=True)
class ShapeCap:
    """One agent's free capacity of one shape (``laminar.v1.ShapeCapacity``)."""

    free: int
    total: int
    max_free_milli: int = 0
    max_free_memory_bytes: int = 0


def _model_of(shape: str) -> str:
    return shape.split(":", 1)[1] if ":" in shape else ""


def _shapes_for(need: Demand, shapes: Mapping[str, ShapeCap]) -> Iterable[tuple[str, ShapeCap]]:
    for shape, cap in shapes.items():
        kind = shape.split(":", 1)[0]
        if need.mig_profile:
            if shape == f"mig:{need.mig_profile}":
                yield shape, cap
            continue
        wanted = "share" if need.gpu_milli else "gpu"
        if kind == wanted and (not need.gpu_model or _model_of(shape) == need.gpu_model):
            yield shape, cap


def members_fitting(need: Demand, shapes: Mapping[str, ShapeCap], *, total: bool = False) -> int:
    """How many members of ``need`` this host could take now (or ever, with ``total``)."""
    if need.family == "cpu":
        return CPU_ONLY_CAPACITY
    count = 0
    for _, cap in _shapes_for(need, shapes):
        slots = cap.total if total else cap.free
        if need.gpu_milli:
            if total:
                count += slots * (MILLI_PER_GPU // need.gpu_milli)
            elif cap.max_free_memory_bytes >= need.gpu_memory_bytes:
                # The summary gives the largest free share only: count what that GPU holds.
                count += cap.max_free_milli // need.gpu_milli
            continue
        if not total and need.gpu_memory_bytes > cap.max_free_memory_bytes and slots:
            continue
        count += slots // max(1, need.gpus)
    return count


#: Rank of a candidate whose summary carries no per-GPU state (an older agent): neither
#: preferred nor ruled out, as "no change" scores on FGD's 0..100 node score.
UNKNOWN_RANK = 50.0


def fragmentation_rank(
    need: Demand, host: HostCap | None, shapes: Mapping[str, ShapeCap], frag: FragmentationCache
) -> float | None:
    """FGD's 0..100 node score of placing one member of ``need`` on a host, from its summary
    alone.

    The host as its summary shows it (free CPU, memory and each GPU's free share) goes
    through :meth:`laminar_base.fragmentation.FragmentationCache.node_score` with the zone's
    observed workload, the same measure the agent chooses a GPU by. Quantized as FGD's
    score is, so equal scores are common and the router's fixed host order breaks them
    (:class:`laminar_zone.view.ProbePlan`). None when the summary shows it cannot take the
    member; :data:`UNKNOWN_RANK` when it carries no per-GPU state. A MIG demand is
    measured as the share of a GPU its profile's compute slices are, over each GPU's free
    share (a MIG GPU's: its unused instances', all of it while idle).
    """
    if host is None or (need.family != "cpu" and not host.gpu_free_milli):
        return UNKNOWN_RANK
    if not host.fits(need):
        return None
    models = {_model_of(shape) for shape in shapes if shape.startswith(("gpu:", "share:"))}
    model = need.gpu_model or (models.pop() if len(models) == 1 else "")
    score = frag.node_score(host_node(model, host), demand_pod(need, host))
    return None if score is None else float(score)


def free_units(shapes: Mapping[str, ShapeCap], need: Demand) -> float:
    """S in the flow-splitting weight: free capacity that fits the job's shape."""
    return float(min(members_fitting(need, shapes), CPU_ONLY_CAPACITY))


def flow_weight(free: float, heat: float, gamma: float) -> float:
    """``W_z = (1 + S_z) / (1 + H_z)^gamma``."""
    return float((1.0 + max(0.0, free)) / (1.0 + max(0.0, heat)) ** gamma)


def split_weights(
    need: Demand,
    zones: Iterable[tuple[str, Mapping[str, ShapeCap] | None, float]],
    gamma: float,
) -> list[tuple[str, float]]:
    """Flow splitting over (key, free shapes, heat) per zone: ``W_z`` each, in order.

    The first zone is the router's own; a peer whose summary is stale comes with no
    shapes and weighs 0 (it is never chosen). Heat is the zone's pending probes, live
    leases and placements in flight, so a zone busy placing draws less new work.
    """
    return [
        (key, 0.0 if shapes is None else flow_weight(members_fitting(need, shapes), heat, gamma))
        for key, shapes, heat in zones
    ]


def choose_weighted(weights: Sequence[tuple[str, float]], rng: random.Random) -> str:
    """Draw a key with probability proportional to its weight; zero weights never win."""
    total = sum(w for _, w in weights if w > 0)
    if total <= 0:
        raise ValueError("no positive weight")
    point = rng.random() * total
    for key, weight in weights:
        if weight <= 0:
            continue
        point -= weight
        if point < 0:
            return key
    return next(key for key, weight in reversed(weights) if weight > 0)


@dataclass(frozen=True)
class Offer:
    """A lease one agent granted for one gang member (``laminar.v1.Lease``, reduced)."""

    lease_id: str
    agent_id: str
    member: int
    score: float


def best_offers(offers: Iterable[Offer]) -> list[Offer]:
    """Late binding for a single member: the best lease first (score, then agent id)."""
    return sorted(offers, key=lambda o: (-o.score, o.agent_id, o.lease_id))


def assign_gang(offers: Iterable[Offer], gang_size: int) -> list[Offer] | None:
    """Pick one lease per member, preferring fewer hosts, then better scores; None if short.

    Agents are asked for every member, so one agent may offer several leases
    (one per member index). Hosts holding more offers come first, which packs a
    gang onto as few hosts as the offers allow.
    """
    by_agent: dict[str, dict[int, Offer]] = {}
    for offer in offers:
        slot = by_agent.setdefault(offer.agent_id, {})
        if offer.member not in slot or offer.score > slot[offer.member].score:
            slot[offer.member] = offer
    order = sorted(
        by_agent.items(),
        key=lambda kv: (-len(kv[1]), -max(o.score for o in kv[1].values()), kv[0]),
    )
    chosen: dict[int, Offer] = {}
    for _, member_offers in order:
        # Each lease was granted for its own member index, but members are
        # interchangeable: fill the lowest missing indexes with this host's leases.
        for offer in sorted(member_offers.values(), key=lambda o: -o.score):
            missing = [m for m in range(gang_size) if m not in chosen]
            if not missing:
                break
            chosen[missing[0]] = offer
    if len(chosen) < gang_size:
        return None
    return [chosen[m] for m in range(gang_size)]


def expected_start(
    now: float,
    free_units_now: float,
    releases: Sequence[tuple[float, float]],
    units_ahead: float,
    units_needed: float,
) -> float | None:
    """When cumulative freed capacity covers the queue ahead plus this job; None if unknown.

    ``releases`` are (expected end time, GPU-units freed) of running work of
    the same family. A coarse, honest estimate: it ignores which host frees
    what, so a gang needing one host can start later than this says.
    """
    return ReleaseCurve(releases).start(now, free_units_now, units_ahead, units_needed)


class ReleaseCurve:
    """Running work's expected ends (time, GPU-units freed), sorted once with their running
    sum, so that the many :func:`expected_start` questions of one queue pass (one per
    waiting job) are a bisection each instead of a sort and a scan."""

    def __init__(self, releases: Iterable[tuple[float, float]]) -> None:
        ends = sorted(releases)
        self._times = [at for at, _ in ends]
        self._freed = list(itertools.accumulate(units for _, units in ends))

    def start(
        self, now: float, free_units_now: float, units_ahead: float, units_needed: float
    ) -> float | None:
        """As :func:`expected_start` over these releases."""
        want = units_ahead + units_needed - free_units_now
        if want <= 1e-9:
            return now
        i = bisect.bisect_left(self._freed, want - 1e-9)
        return max(now, self._times[i]) if i < len(self._freed) else None


def sample_indexes(population: int, k: int, rng: random.Random) -> list[int]:
    """k distinct indexes out of ``population`` without touching the rest (O(k))."""
    if k >= population:
        return list(range(population))
    return rng.sample(range(population), k)


def ceil_div(a: float, b: float) -> int:
    return math.ceil(a / b) if b else 0
