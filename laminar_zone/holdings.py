"""What the router's live jobs hold, kept as they change instead of scanned every pass.

Two readings of every queue pass walked every live job: each tenant's GPU units and
memory (quotas and fair share, :meth:`ZoneCore.tenant_usage`) and, per family, the
expected ends of the running jobs (EASY's estimates, :meth:`ZoneCore.expected_start`),
once more after each start. Both grew with jobs x passes. :class:`Holdings` keeps the
rigid jobs that hold GPUs (running, or placing) and gives the same readings, bit for bit:

- a tenant's units are summed in the order of the core's ``entries`` (float addition is
  not associative), from a list kept in that order, again only once the tenant changed;
- a family's ends are kept sorted (a curve reads them sorted); a curve is made again only
  once the family changed.

What it does not keep: an atomized job's pieces (their states and windows are written by
the drivers that start and end them), read at each reading from the atomized entries, and
the family's mean run (``mean_run_seconds``) of running jobs with no estimate, applied at
each reading. The core marks an entry *touched* wherever it changes what is read here
(its state, ``placing``, its need, its start time) and where it joins or leaves
``entries``; a reading evaluates the touched entries again from the entries themselves.
A change of ``entries`` that bypassed the core (its length or the dict itself changed
behind it) makes it start over from a full walk; a key taken out and set again behind
its back (moved last in the dict's order, same length) is not seen: ``entries`` changes
through the core (``admit``, ``drop``, ``forget_if_done``). Which entries are atomized
is looked at again when the market's jobs (``atoms``) change in number.
``tests/zone/test_holdings.py`` holds it to the plain walk after every event of random
sequences."""

from __future__ import annotations

import bisect
import functools
import operator
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from laminar_api.v1 import common_pb2
from laminar_base.causes import LIVE_SUBJOB_STATES, RUNNING_JOB_STATES
from laminar_base.demand import Demand
from laminar_zone.entry import Entry
from laminar_zone.placement import ReleaseCurve

#: What a piece's resources ask (the core's ``demand_of``).
DemandOf = Callable[[common_pb2.Resources], Demand]
#: An atomized job's live pieces on a family's slices: (window end, GPU units) of each.
PieceEndsOf = Callable[[Entry, str], list[tuple[float, float]]]


@dataclass(frozen=True)
class _Held:
    """What one rigid job holds, as its entry read when last touched."""

    seq: int
    tenant: str
    units: float
    memory_bytes: int
    family: str
    #: Its end is a release (running or suspended); else it holds while placing only.
    is_running: bool
    started_unix: float
    expected_seconds: float

    def fixed_end(self) -> tuple[float, float] | None:
        """(expected end, units) when its own estimate says when it ends (None: the
        family's mean says, or, with a negative estimate, nothing does)."""
        if self.expected_seconds > 0:
            return (self.started_unix + self.expected_seconds, self.units)
        return None


class Holdings:
    """The rigid jobs that hold GPUs, per tenant in entry order and per family by end."""

    def __init__(self, demand_of: DemandOf, piece_ends_of: PieceEndsOf) -> None:
        self._demand_of = demand_of
        self._piece_ends_of = piece_ends_of
        self._reset(None)

    def _reset(self, entries: Mapping[str, Entry] | None) -> None:
        #: The entries dict last walked (a new one is walked again).
        self._entries = entries
        self._next_seq = 0
        #: job id -> its place in ``entries`` (insertion order, as the dict keeps it)
        self._seq: dict[str, int] = {}
        self._touched: set[str] = set()
        self._held: dict[str, _Held] = {}
        #: job id -> seq of the entries read as atomized (their pieces are read each time)
        self._atomized: dict[str, int] = {}
        #: How many jobs the market held at the last reading.
        self._atoms_count = 0
        # Per tenant: seqs of its holders ascending, their units, memory summed.
        self._order: dict[str, list[int]] = {}
        self._units: dict[str, dict[int, float]] = {}
        self._memory: dict[str, int] = {}
        self._sums: dict[str, float] = {}
        self._stale_sums: set[str] = set()
        # Per family: running holders' (end, units) with an estimate, sorted; those
        # without one (job id -> (start, units)); the curve made from them while valid.
        self._fixed: dict[str, list[tuple[float, float]]] = {}
        self._open: dict[str, dict[str, tuple[float, float]]] = {}
        #: family -> (the mean run it was made with, 0 if none counted; the curve)
        self._curves: dict[str, tuple[float, ReleaseCurve]] = {}

    # ---------------------------------------------------------------- the core's marks

    def admitted(self, job_id: str) -> None:
        """``job_id`` was set in ``entries`` (a new key goes last; a key kept keeps its
        place, as a dict does)."""
        if job_id not in self._seq:
            self._seq[job_id] = self._next_seq
            self._next_seq += 1
        self._touched.add(job_id)

    def removed(self, job_id: str) -> None:
        """``job_id`` left ``entries``."""
        self._drop(job_id)
        self._seq.pop(job_id, None)
        self._touched.discard(job_id)

    def touch(self, entry: Entry) -> None:
        """Something read here may have changed for ``entry``."""
        self._touched.add(entry.job.job_id)

    # ---------------------------------------------------------------- readings

    def usage(
        self, entries: Mapping[str, Entry], atoms: Collection[str]
    ) -> tuple[dict[str, float], dict[str, int]]:
        """GPU units and memory each tenant's running and placing jobs hold, as a walk of
        ``entries`` in order sums them (new dicts: the caller may change them)."""
        self._sync(entries, atoms)
        if self._atomized:
            return self._usage_with_pieces(entries)
        for tenant in self._stale_sums:
            units = self._units[tenant]
            self._sums[tenant] = functools.reduce(
                operator.add, map(units.__getitem__, self._order[tenant]), 0.0
            )
        self._stale_sums.clear()
        # A walk meets the tenants in the order of their first holder.
        tenants = sorted(self._order, key=lambda t: self._order[t][0])
        return {t: self._sums[t] for t in tenants}, {t: self._memory[t] for t in tenants}

    def release_curve(
        self,
        family: str,
        mean_run_seconds: float,
        entries: Mapping[str, Entry],
        atoms: Collection[str],
    ) -> ReleaseCurve:
        """The expected ends of ``family``'s running work: rigid jobs at their start plus
        their estimate (else the family's mean run), atomized pieces at their windows'
        ends."""
        self._sync(entries, atoms)
        opened = self._open.get(family)
        mean = mean_run_seconds if opened and mean_run_seconds > 0 else 0.0
        kept = self._curves.get(family)
        if kept is not None and kept[0] == mean and not self._atomized:
            return kept[1]
        ends = self._fixed.get(family, [])
        if mean:
            assert opened is not None
            ends = ends + [(started + mean, units) for started, units in opened.values()]
        pieces = [
            end for job_id in self._atomized for end in self._piece_ends_of(entries[job_id], family)
        ]
        curve = ReleaseCurve(ends + pieces if pieces else ends)
        if not self._atomized:  # pieces are read each time
            self._curves[family] = (mean, curve)
        return curve

    # ---------------------------------------------------------------- keeping up

    def _sync(self, entries: Mapping[str, Entry], atoms: Collection[str]) -> None:
        if entries is not self._entries or len(entries) != len(self._seq):
            self._walk_again(entries)
        # An entry's kind is read when it is touched. One that changed kind since (the
        # market took it in after the core admitted it, or let it go) is read again once
        # the market's jobs changed in number: they are walked only then.
        if len(atoms) != self._atoms_count:
            self._atoms_count = len(atoms)
            for job_id in self._atomized:
                if job_id not in atoms:
                    self._touched.add(job_id)
            for job_id in atoms:
                if job_id in self._seq and job_id not in self._atomized:
                    self._touched.add(job_id)
        if not self._touched:
            return
        for job_id in self._touched:
            self._drop(job_id)
            entry = entries.get(job_id)
            seq = self._seq.get(job_id)
            if entry is None or seq is None:
                continue
            if job_id in atoms:
                self._atomized[job_id] = seq
                continue
            if entry.job.state in RUNNING_JOB_STATES or entry.placing:
                self._add(job_id, entry, seq)
        self._touched.clear()

    def _walk_again(self, entries: Mapping[str, Entry]) -> None:
        """Start over from ``entries`` as they stand: every one in order, touched."""
        self._reset(entries)
        for job_id in entries:
            self.admitted(job_id)

    def _add(self, job_id: str, entry: Entry, seq: int) -> None:
        job = entry.job
        item = entry.item  # its tenant is the spec's
        held = _Held(
            seq=seq,
            tenant=item.tenant,
            units=item.units,
            memory_bytes=item.memory_bytes,
            family=entry.need.family,
            is_running=job.state in RUNNING_JOB_STATES,
            started_unix=job.started_unix,
            expected_seconds=item.expected_seconds,
        )
        self._held[job_id] = held
        tenant = held.tenant
        bisect.insort(self._order.setdefault(tenant, []), seq)
        self._units.setdefault(tenant, {})[seq] = held.units
        self._memory[tenant] = self._memory.get(tenant, 0) + held.memory_bytes
        self._stale_sums.add(tenant)
        if not held.is_running:
            return
        end = held.fixed_end()
        if end is not None:
            bisect.insort(self._fixed.setdefault(held.family, []), end)
            self._curves.pop(held.family, None)
        elif not held.expected_seconds:
            self._open.setdefault(held.family, {})[job_id] = (held.started_unix, held.units)
            self._curves.pop(held.family, None)

    def _drop(self, job_id: str) -> None:
        self._atomized.pop(job_id, None)
        held = self._held.pop(job_id, None)
        if held is None:
            return
        tenant = held.tenant
        order = self._order[tenant]
        del order[bisect.bisect_left(order, held.seq)]
        del self._units[tenant][held.seq]
        self._memory[tenant] -= held.memory_bytes
        if order:
            self._stale_sums.add(tenant)
        else:
            del self._order[tenant], self._units[tenant], self._memory[tenant]
            self._sums.pop(tenant, None)
            self._stale_sums.discard(tenant)
        if not held.is_running:
            return
        end = held.fixed_end()
        if end is not None:
            fixed = self._fixed[held.family]
            del fixed[bisect.bisect_left(fixed, end)]
            self._curves.pop(held.family, None)
        elif not held.expected_seconds:
            del self._open[held.family][job_id]
            self._curves.pop(held.family, None)

    def _usage_with_pieces(
        self, entries: Mapping[str, Entry]
    ) -> tuple[dict[str, float], dict[str, int]]:
        """With atomized jobs about: their live pieces and the rigid holders, in one walk
        of ``entries`` (pieces are read there anyway; a merge in entry order cost more)."""
        units: dict[str, float] = {}
        memory: dict[str, int] = {}
        atomized, held, demand_of = self._atomized, self._held, self._demand_of
        for job_id, entry in entries.items():
            if job_id in atomized:
                tenant = entry.job.spec.tenant
                for p in entry.job.placements:
                    if p.state in LIVE_SUBJOB_STATES:
                        piece = demand_of(p.resources)
                        units[tenant] = units.get(tenant, 0.0) + piece.gpu_units
                        memory[tenant] = memory.get(tenant, 0) + piece.memory_bytes
            elif (h := held.get(job_id)) is not None:
                units[h.tenant] = units.get(h.tenant, 0.0) + h.units
                memory[h.tenant] = memory.get(h.tenant, 0) + h.memory_bytes
        return units, memory
