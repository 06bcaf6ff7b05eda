"""Ready agents' free capacity grouped by what a demand's member count reads, so that
:meth:`laminar_zone.view.ZoneView.free_for` and the "fits now" of
:meth:`~laminar_zone.view.ZoneView.counts` cost a few bisections per demand instead of a
walk over every host with room.

Why: a queue pass estimates each waiting job's start from the members of its demand free
now (:meth:`laminar_zone.core.ZoneCore.expected_start`), and a queue of re-runs is nearly
all distinct demands (each declares its own GPU memory), so per-demand caches do not help
and each pass cost waiting jobs x hosts with room (``sim airlock --gpus 1000``: most of its
27 minutes). What one host's summary gives a demand is
:func:`~laminar_zone.placement.members_fitting`: for a share, its largest free share
divided by the demand's, if its largest free GPU memory holds the declared memory; for
whole GPUs or a MIG profile, its free units divided by the demand's, on the same memory
condition. So hosts are grouped per shape by that one figure (largest free share, free
units), each group holding its hosts' largest free GPU memory sorted: a demand's answer is
a sum over the groups of its shapes of (members per host) x (hosts whose memory holds its
declaration), one bisection each. Kept as summaries change (O(log n) and a memory move per
shape of the changed agent), never rebuilt.

Hosts whose summary the grouping could misread are kept aside and counted by
:func:`members_fitting` itself: two shapes a demand of one kind could both use (two models
of whole GPUs or of shares: a model-less demand sums them per host), and figures no agent
sends (more free than total, a free share above a whole GPU or on no GPU), for which "a
member fits now" would no longer imply "a member fits ever". The view's property test
(tests/zone/test_view_counts_props.py) holds both answers to a plain scan of every agent.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping

from laminar_base.demand import MILLI_PER_GPU, Demand
from laminar_zone.placement import CPU_ONLY_CAPACITY, ShapeCap, members_fitting

#: Shape kinds a demand of one kind may sum over on one host (a model-less demand).
_SUMMED_KINDS = ("gpu", "share")


class FreeIndex:
    """Per shape, ready agents grouped by largest free share and by free units, with their
    largest free GPU memory sorted in each group; irregular summaries aside (see module)."""

    def __init__(self) -> None:
        #: shape -> largest free share (milli) -> largest free GPU memory of each agent.
        self._by_share: dict[str, dict[int, list[int]]] = {}
        #: shape -> free units -> largest free GPU memory of each agent.
        self._by_free: dict[str, dict[int, list[int]]] = {}
        #: Agents whose summary is counted by :func:`members_fitting` itself.
        self.irregular: dict[str, Mapping[str, ShapeCap]] = {}

    def add(self, agent_id: str, shapes: Mapping[str, ShapeCap]) -> None:
        """A ready agent's summary enters the index."""
        if not _is_regular(shapes):
            self.irregular[agent_id] = shapes
            return
        for shape, cap in shapes.items():
            if cap.max_free_milli > 0:
                mems = self._by_share.setdefault(shape, {}).setdefault(cap.max_free_milli, [])
                bisect.insort(mems, cap.max_free_memory_bytes)
            if cap.free > 0:
                mems = self._by_free.setdefault(shape, {}).setdefault(cap.free, [])
                bisect.insort(mems, cap.max_free_memory_bytes)

    def remove(self, agent_id: str, shapes: Mapping[str, ShapeCap]) -> None:
        """The summary ``shapes`` that :meth:`add` indexed for ``agent_id`` leaves."""
        if self.irregular.pop(agent_id, None) is not None:
            return
        for shape, cap in shapes.items():
            if cap.max_free_milli > 0:
                _drop(self._by_share, shape, cap.max_free_milli, cap.max_free_memory_bytes)
            if cap.free > 0:
                _drop(self._by_free, shape, cap.free, cap.max_free_memory_bytes)

    def free_members(self, need: Demand) -> int:
        """Free members of GPU demand ``need`` summed over the indexed agents, each host's
        capped at :data:`CPU_ONLY_CAPACITY` (as :meth:`ZoneView.free_for` sums them)."""
        total = sum(
            min(per_host, CPU_ONLY_CAPACITY) * hosts for per_host, hosts in self._groups(need)
        )
        return total + sum(
            min(members_fitting(need, shapes), CPU_ONLY_CAPACITY)
            for shapes in self.irregular.values()
        )

    def hosts_fitting(self, need: Demand) -> int:
        """Indexed agents whose summary holds a member of GPU demand ``need`` now (and so
        ever, on a regular summary)."""
        total = sum(hosts for _, hosts in self._groups(need))
        return total + sum(
            1
            for shapes in self.irregular.values()
            if members_fitting(need, shapes) >= 1 and members_fitting(need, shapes, total=True) >= 1
        )

    def _groups(self, need: Demand) -> Iterator[tuple[int, int]]:
        """(members one host holds, hosts that hold them) per group of ``need``'s shapes, for
        the groups that hold at least one member."""
        by_share = bool(need.gpu_milli)
        table = self._by_share if by_share else self._by_free
        per_member = need.gpu_milli if by_share else max(1, need.gpus)
        memory = need.gpu_memory_bytes
        for shape in self._shapes(need, table):
            for figure, mems in table[shape].items():
                per_host = figure // per_member
                if per_host:
                    hosts = len(mems) - bisect.bisect_left(mems, memory)
                    if hosts:
                        yield per_host, hosts

    @staticmethod
    def _shapes(need: Demand, table: dict[str, dict[int, list[int]]]) -> list[str]:
        """The shapes of ``table`` that :func:`members_fitting` reads for ``need``."""
        if need.mig_profile:
            shape = f"mig:{need.mig_profile}"
            return [shape] if shape in table else []
        kind = "share" if need.gpu_milli else "gpu"
        if need.gpu_model:
            shape = f"{kind}:{need.gpu_model}"
            return [shape] if shape in table else []
        return [s for s in table if s.split(":", 1)[0] == kind]


def _drop(table: dict[str, dict[int, list[int]]], shape: str, figure: int, memory: int) -> None:
    groups = table[shape]
    mems = groups[figure]
    del mems[bisect.bisect_left(mems, memory)]
    if not mems:
        del groups[figure]
        if not groups:
            del table[shape]


def _is_regular(shapes: Mapping[str, ShapeCap]) -> bool:
    """Whether the grouping reads ``shapes`` as :func:`members_fitting` does: at most one
    shape per summed kind, and figures an agent's ledger sends (free within total, a free
    share only on a GPU and at most a whole one)."""
    kinds: set[str] = set()
    for shape, cap in shapes.items():
        kind = shape.split(":", 1)[0]
        if kind in _SUMMED_KINDS:
            if kind in kinds:
                return False
            kinds.add(kind)
        if cap.free > cap.total or cap.free < 0:
            return False
        if cap.max_free_milli and not (0 < cap.max_free_milli <= MILLI_PER_GPU and cap.total >= 1):
            return False
    return True
