"""What the router's live jobs hold (laminar_zone.holdings.Holdings), kept as the core
changes them, against the plain walk of every live job (tests/zone/holdings_scan.py).

Hypothesis draws sequences of events over one core, no sockets: submits of several
tenants, shares and families (fractional units, so a sum in another order shows in its
last bits), estimates or none, atomized jobs (taken in by the market after the core
admits them, their pieces started and ended by the driver, as the atomizer does); states
written through the core, placement tries begun and ended, new attempts, a family's mean
run changing, jobs ending and leaving memory, dropped, admitted again, and a new entry set
behind the core's back (as some tests do). After every event the kept tenant usage and
every family's release curve equal the walk's, bit for bit. A mark the core forgets
(a state it writes without telling its holdings) fails it."""

from __future__ import annotations

import itertools

from holdings_scan import assert_holdings_match, bits, scan_usage
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.demand import Demand
from laminar_base.wire import demand_of
from laminar_zone.core import ZoneCore
from laminar_zone.entry import Entry
from laminar_zone.view import ZoneView

GIB = 1 << 30
NOW = 1_700_000_000.0
TENANTS = ("", "a", "b")
SHAPES = (
    Demand(gpu_milli=333, gpu_memory_bytes=20 * GIB),
    Demand(gpu_milli=250),
    Demand(gpu_milli=100, gpu_memory_bytes=7 * GIB),
    Demand(gpus=1),
    Demand(mig_profile="1g.10gb"),
)
FAMILIES = tuple(sorted({s.family for s in SHAPES}))
ESTIMATES = (0.0, 300.0, 123.4, 0.1)
STATES = (
    zone_pb2.PENDING,
    zone_pb2.QUEUED,
    zone_pb2.WAITING,
    zone_pb2.JOB_RUNNING,
    zone_pb2.JOB_SUSPENDED,
)
_ids = itertools.count()


def _resources(need: Demand) -> common_pb2.Resources:
    return common_pb2.Resources(
        gpus=need.gpus,
        gpu_milli=need.gpu_milli,
        gpu_memory_bytes=need.gpu_memory_bytes,
        mig_profile=need.mig_profile,
    )


class Driver:
    """One core and the jobs given to it; each event changes them as the core's callers
    do (through the core, but for what drivers write themselves: pieces)."""

    def __init__(self) -> None:
        self.atoms: set[str] = set()
        self.core = ZoneCore(ZoneView(3.0), {}, atoms=self.atoms, demand_of=demand_of)
        self.jobs: list[Entry] = []
        self.clock = NOW

    def pick(self, index: int) -> Entry | None:
        live = [e for e in self.jobs if e.job.job_id in self.core.entries]
        return live[index % len(live)] if live else None

    def submit(self, tenant: int, shape: int, gang: int, estimate: int, atomized: bool) -> None:
        need = SHAPES[shape]
        job = zone_pb2.Job(
            job_id=f"h-{next(_ids)}",
            spec=zone_pb2.JobSpec(
                command=["true"],
                tenant=TENANTS[tenant],
                resources=_resources(need),
                gang_size=gang,
                expected_seconds=ESTIMATES[estimate],
            ),
            state=zone_pb2.PENDING,
            submitted_unix=self.clock,
            attempts=1,
        )
        entry = Entry(job=job, need=need)
        self.core.admit(entry)
        if atomized:  # the market takes it in after the core admitted it
            self.atoms.add(job.job_id)
        self.jobs.append(entry)

    def step(self, event: tuple[object, ...]) -> None:
        kind = event[0]
        self.clock += 1.5
        if kind == "submit":
            tenant, shape, gang, estimate, atomized = event[1:]
            assert isinstance(tenant, int) and isinstance(shape, int) and isinstance(gang, int)
            assert isinstance(estimate, int)
            self.submit(tenant, shape, gang, estimate, bool(atomized))
            return
        if kind == "mean":
            family, run = event[1], event[2]
            assert isinstance(family, int) and isinstance(run, float)
            self.core.mean_run_seconds[FAMILIES[family]] = run
            return
        pick = event[1]
        assert isinstance(pick, int)
        entry = self.pick(pick)
        if entry is None:
            return
        job = entry.job
        if kind == "state":
            state = STATES[int(str(event[2]))]
            self.core.set_state(entry, state)
            if state in (zone_pb2.JOB_RUNNING, zone_pb2.JOB_SUSPENDED):
                job.started_unix = job.started_unix or self.clock
        elif kind == "placing":
            self.core.set_placing(entry, bool(event[2]))
        elif kind == "retry":  # a new attempt: its item is made again
            job.attempts += 1
            self.core.set_state(entry, zone_pb2.PENDING)
        elif kind == "end":
            self.core.set_placing(entry, False)
            for p in job.placements:
                p.state = common_pb2.SUCCEEDED
            self.core.set_state(entry, zone_pb2.JOB_SUCCEEDED)
            self.core.forget_if_done(entry)
        elif kind == "drop":
            self.core.drop(job.job_id)
        elif kind == "admit_again":  # set again: it keeps its place
            self.core.admit(entry)
        elif kind == "behind_the_back":  # a new job set in entries, as some tests do
            self.submit(pick % len(TENANTS), pick % len(SHAPES), 1, 0, atomized=False)
            new = self.jobs[-1]
            self.core.drop(new.job.job_id)
            self.core.entries[new.job.job_id] = new
            self.core.set_state(new, zone_pb2.JOB_RUNNING)
        elif kind == "piece" and job.job_id in self.atoms:
            shape = SHAPES[int(str(event[2])) % 3]  # shares
            job.placements.add(
                subjob_id=f"{job.job_id}-p{len(job.placements)}",
                state=common_pb2.RUNNING,
                resources=_resources(shape),
                window_end_unix=self.clock + 60.0 * (1 + pick % 5),
            )
        elif kind == "piece_ends" and job.job_id in self.atoms and job.placements:
            job.placements[pick % len(job.placements)].state = common_pb2.SUCCEEDED


events = st.one_of(
    st.tuples(
        st.just("submit"),
        st.integers(0, len(TENANTS) - 1),
        st.integers(0, len(SHAPES) - 1),
        st.integers(1, 3),
        st.integers(0, len(ESTIMATES) - 1),
        st.sampled_from([False] * 4 + [True]),
    ),
    st.tuples(st.just("state"), st.integers(0, 30), st.integers(0, len(STATES) - 1)),
    st.tuples(st.just("placing"), st.integers(0, 30), st.booleans()),
    st.tuples(st.just("retry"), st.integers(0, 30)),
    st.tuples(st.just("end"), st.integers(0, 30)),
    st.tuples(st.just("drop"), st.integers(0, 30)),
    st.tuples(st.just("admit_again"), st.integers(0, 30)),
    st.tuples(st.just("behind_the_back"), st.integers(0, 30)),
    st.tuples(st.just("piece"), st.integers(0, 30), st.integers(0, 2)),
    st.tuples(st.just("piece_ends"), st.integers(0, 30)),
    st.tuples(
        st.just("mean"),
        st.integers(0, len(FAMILIES) - 1),
        st.floats(0.0, 5000.0, allow_nan=False),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(events, min_size=1, max_size=80))
def test_kept_holdings_equal_the_walk_after_every_event(ops: list[tuple[object, ...]]) -> None:
    driver = Driver()
    for event in ops:
        driver.step(event)
        assert_holdings_match(driver.core, FAMILIES)


def test_a_tenants_units_are_summed_in_entry_order() -> None:
    """Jobs that start in another order than they were admitted are summed as the walk
    sums them, in entry order: 0.1 + 0.2 + 0.3 differs from 0.3 + 0.2 + 0.1 in its last
    bits, and the kept sum has the walk's bits."""
    driver = Driver()
    for _ in range(3):
        driver.submit(tenant=0, shape=2, gang=1, estimate=0, atomized=False)
    a, b, c = driver.jobs
    for entry, milli in ((a, 100), (b, 200), (c, 300)):
        entry.need = Demand(gpu_milli=milli)
        entry.job.attempts += 1  # its item is made again with the new need
    for entry in (c, b, a):
        driver.core.set_state(entry, zone_pb2.JOB_RUNNING)
    units, _ = driver.core.tenant_usage()
    assert bits(units) == bits({"": 0.1 + 0.2 + 0.3})
    assert units[""] != 0.3 + 0.2 + 0.1
    assert bits(driver.core.tenant_usage()) == bits(scan_usage(driver.core))


def test_a_state_written_without_the_core_is_not_seen() -> None:
    """The kept readings know only what the core marks: a state written past
    :meth:`ZoneCore.set_state` leaves them stale (so every writer goes through it, and
    the property above would catch one that does not)."""
    driver = Driver()
    driver.submit(tenant=0, shape=0, gang=1, estimate=1, atomized=False)
    (entry,) = driver.jobs
    assert driver.core.tenant_usage() == ({}, {})
    entry.job.state = zone_pb2.JOB_RUNNING  # not through the core
    assert driver.core.tenant_usage() == ({}, {})
    assert scan_usage(driver.core) != ({}, {})
    driver.core.holdings.touch(entry)
    assert driver.core.tenant_usage() == scan_usage(driver.core)
