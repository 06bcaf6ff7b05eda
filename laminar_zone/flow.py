"""Flow splitting at a router: which zone takes a fresh job, decided once.

The router's :class:`~laminar_zone.peers.PeerRouter` (which exchanges summaries and sends
the forward over gRPC) and the simulators (``sim fgd``, ``sim load``) both call
:func:`split_flow` with the summaries they hold; the exchange, the clock and the forward
itself stay with them. Pure: no I/O, no clock (a summary's age comes in), no randomness
but the ``rng`` given.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from laminar_base.demand import Demand
from laminar_zone.placement import ShapeCap, choose_weighted, split_weights


@dataclass(frozen=True)
class PeerSummary:
    """A peer zone's last summary as a router holds it: its free capacity per shape
    (None: never heard from), heat, and how old the summary is."""

    key: str
    shapes: Mapping[str, ShapeCap] | None
    heat: float
    age_seconds: float


@dataclass(frozen=True)
class Split:
    """Where a fresh job goes: ``target`` is the key of the zone drawn (the local key:
    keep it), with every zone's weight ``W_z`` for the record."""

    target: str
    weights: list[tuple[str, float]]
    is_local: bool


def split_flow(
    need: Demand,
    local: tuple[str, Mapping[str, ShapeCap], float],
    peers: Iterable[PeerSummary],
    *,
    gamma: float,
    fresh_for_seconds: float,
    rng: random.Random,
) -> Split:
    """Flow splitting over the router's own zone (``local``: key, free shapes, heat) and
    its ``peers``, in the order given: ``W_z = (1 + S_z) / (1 + H_z)^gamma`` each
    (:func:`~laminar_zone.placement.split_weights`), a peer whose summary is older than
    ``fresh_for_seconds`` (or missing) weighing 0, and one zone drawn by weight
    (:func:`~laminar_zone.placement.choose_weighted`). The local zone has weight >= 1, so
    a draw always succeeds."""
    key = local[0]
    zones: list[tuple[str, Mapping[str, ShapeCap] | None, float]] = [local]
    for peer in peers:
        if peer.shapes is None or peer.age_seconds > fresh_for_seconds:
            zones.append((peer.key, None, 0.0))
        else:
            zones.append((peer.key, peer.shapes, peer.heat))
    weights = split_weights(need, zones, gamma)
    target = choose_weighted(weights, rng)
    return Split(target, weights, target == key)
