"""The agent's decision core, driven directly: no sockets, no processes, no clock.

A hypothesis state machine feeds :class:`AgentCore` random interleavings of probe batches,
commits, releases, lease expiry, launches, exits (random codes, signals, fences), suspend
and resume, stops, priority preemptions and agent restarts (the core rebuilt from the rows
its own instructions journaled), and checks after every step that:

* no slice's committed plus leased use exceeds its capacity (milli and bytes);
* no subjob is committed or started twice;
* every ended subjob has exactly one end, recorded with one EndCause, and its end event is
  its last: nothing leaves an ended state;
* every lease is settled exactly once when it leaves the ledger, and not before:
  committed (then released with its subjob's end), released by its prober, expired, or
  (uncommitted) forgotten by an agent restart; the journaled leases are the ledger's;
* the core's live subjobs are exactly the journal's live rows, in the same states.

Unit tests below pin the refusals of illegal transitions one by one.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from laminar_agent.core import (
    FAILED,
    KILLED,
    LIVE_STATES,
    LOST,
    PREEMPT_MARGIN_SECONDS,
    RUNNING,
    STARTING,
    SUCCEEDED,
    SUSPENDED,
    TERMINAL_STATES,
    AgentCore,
    DropLease,
    EndDecision,
    Ended,
    GpuPressure,
    Instruction,
    KeepLease,
    Kill,
    NewRow,
    RecordEvent,
    RecordReclaim,
    Restarted,
    RestartFacts,
    RestoredSubjob,
    TransitionRefused,
    WriteRow,
)
from laminar_agent.ledger import (
    Allocation,
    Bounced,
    Granted,
    LeaseRecord,
    Ledger,
    ProbeOrder,
    Slice,
    SliceKind,
    counter_ids,
)
from laminar_airlock.levels import Level
from laminar_base.causes import EndCause, cause_from_token
from laminar_base.demand import Demand
from laminar_base.errors import LaminarError

GIB = 1 << 30
SLICES = [
    Slice("gpu0", SliceKind.WHOLE_GPU, 0, "GPU-0", "H100", 80 * GIB),
    Slice("gpu1", SliceKind.SHARED_GPU, 1, "GPU-1", "H100", 80 * GIB),
    Slice("gpu2/mig-3g.40gb@0", SliceKind.MIG, 2, "MIG-0", "A100", 40 * GIB, "3g.40gb"),
    Slice("gpu2/mig-3g.40gb@1", SliceKind.MIG, 2, "MIG-1", "A100", 40 * GIB, "3g.40gb"),
]
EPOCH_UNIX = 1_800_000_000.0

demands = st.sampled_from(
    [
        Demand(),
        Demand(gpus=1),
        Demand(gpus=2),
        Demand(gpus=1, gpu_memory_bytes=60 * GIB),
        Demand(mig_profile="3g.40gb"),
        Demand(gpu_milli=300, gpu_memory_bytes=8 * GIB),
        Demand(gpu_milli=700, gpu_memory_bytes=30 * GIB),
    ]
)
probes = st.tuples(
    demands,
    st.integers(1, 4),  # priority class
    st.floats(0.0, 10.0),  # value
    st.floats(0.5, 5.0),  # ttl seconds
    st.sampled_from(["", "", "gpu1"]),  # slice asked for
    st.sampled_from(["", "A"]),  # caller
)
#: Probes of the two most important classes, which lower-priority holders must make room for.
preempting_probes = st.tuples(
    demands,
    st.integers(1, 2),
    st.floats(0.0, 10.0),
    st.floats(0.5, 5.0),
    st.sampled_from(["", "gpu0", "gpu1"]),
    st.sampled_from(["", "A"]),
)
#: Airlock's readings: a GPU's name, or one MIG instance's.
pressure_keys = st.sampled_from(["gpu0", "gpu1", "gpu2", "gpu2/mig-3g.40gb@1"])
pressure_readings = st.builds(
    lambda level, used_gib, total_gib: GpuPressure(level, used_gib * GIB, total_gib * GIB),
    st.sampled_from(list(Level)),
    st.sampled_from([0, 10, 30, 60, 70, 79]),
    st.sampled_from([40, 80]),
)
causes = st.sampled_from(
    [EndCause.UNSPECIFIED, EndCause.TERMINATED, EndCause.CANCELLED, EndCause.READDRESSED]
)


@dataclass(frozen=True)
class Exit:
    """An exit as the executor reports one (``ExitInfo``'s decision-relevant part)."""

    exit_code: int | None
    signal: int | None
    fenced: bool = False
    error: str = ""


exits = st.builds(
    Exit,
    exit_code=st.one_of(st.none(), st.integers(0, 3)),
    signal=st.one_of(st.none(), st.sampled_from([9, 15])),
    fenced=st.booleans(),
    error=st.sampled_from(["", "boom"]),
)


class Journal:
    """What the daemon's journal would hold after carrying out the core's instructions."""

    def __init__(self) -> None:
        #: Subjob id -> journaled fields (loosely typed, as columns are).
        self.rows: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str, str]] = []
        self.leases: dict[str, tuple[str, tuple[Allocation, ...], int]] = {}
        self.ends: dict[str, list[EndCause]] = {}
        self.killed: list[str] = []
        self.reclaims: list[RecordReclaim] = []
        #: Every lease ever journaled, and how each was settled (committed, released,
        #: expired, forgotten at a restart; a committed one ended with its subjob).
        self.granted: set[str] = set()
        self.settled: dict[str, list[str]] = {}

    def apply(self, instructions: Iterable[Instruction]) -> None:
        for ins in instructions:
            if isinstance(ins, NewRow):
                assert ins.subjob_id not in self.rows, f"{ins.subjob_id} committed twice"
                self.rows[ins.subjob_id] = {
                    "job_id": ins.job_id,
                    "state": ins.state,
                    "reason": ins.reason,
                    "lease_id": ins.lease.lease_id,
                    "slice_ids": tuple(a.slice_id for a in ins.lease.allocations),
                    "started_unix": 0.0,
                    "end_cause": "",
                    "priority": ins.lease.priority,
                }
            elif isinstance(ins, WriteRow):
                assert ins.subjob_id in self.rows, f"write to unknown row {ins.subjob_id}"
                self.rows[ins.subjob_id].update(ins.fields)
            elif isinstance(ins, RecordEvent):
                self.events.append((ins.subjob_id, ins.state))
            elif isinstance(ins, KeepLease):
                self.granted.add(ins.lease.lease_id)
                if ins.subjob_id:
                    self.settled.setdefault(ins.lease.lease_id, []).append("committed")
                self.leases[ins.lease.lease_id] = (
                    ins.subjob_id,
                    ins.lease.allocations,
                    ins.lease.priority,
                )
            elif isinstance(ins, DropLease):
                assert ins.lease_id in self.leases, f"dropped unknown lease {ins.lease_id}"
                del self.leases[ins.lease_id]
                self.settled.setdefault(ins.lease_id, []).append(ins.why)
            elif isinstance(ins, Ended):
                self.ends.setdefault(ins.subjob_id, []).append(ins.cause)
            elif isinstance(ins, Kill):
                self.killed.append(ins.subjob_id)
            elif isinstance(ins, RecordReclaim):
                self.reclaims.append(ins)


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.generation = 0
        self.core = self._new_core()
        self.journal = Journal()
        self.now = 0.0
        self.ids = itertools.count()
        self.launches: Counter[str] = Counter()
        #: Subjob id -> the priority class it was committed with.
        self.priority: dict[str, int] = {}

    def _new_core(self) -> AgentCore:
        self.generation += 1
        ids = counter_ids()  # deterministic ids, so hypothesis can replay a run
        return AgentCore(Ledger(SLICES, lease_prefix=f"r{self.generation}-", lease_ids=ids))

    @property
    def now_unix(self) -> float:
        return EPOCH_UNIX + self.now

    def _known(self, data: st.DataObject) -> str:
        """Mostly a live subjob; else one the journal knows (ended too), or one nobody knows."""
        live = sorted(self.core.live_states)
        anyone = st.sampled_from([*sorted(self.journal.rows), "nobody"])
        return data.draw(st.one_of(st.sampled_from(live), anyone) if live else anyone)

    def _order(
        self, spec: tuple[Demand, int, float, float, str, str], owner: str = ""
    ) -> ProbeOrder:
        demand, priority, value, ttl, slice_id, caller = spec
        return ProbeOrder(
            probe_id=f"p{next(self.ids)}",
            job_id=f"j{next(self.ids)}",
            member=0,
            demand=demand,
            priority=priority,
            value=value,
            arrival_seq=self.core.next_arrival(),
            ttl_seconds=ttl,
            slice_id=slice_id,
            owner=owner,
            caller=caller,
        )

    def _arbitrate(self, orders: list[ProbeOrder]) -> list[Granted | Bounced]:
        results, instructions = self.core.arbitrate(orders, self.now, self.now_unix)
        assert len(results) == len(orders)
        for order, result in zip(orders, results, strict=True):
            if isinstance(result, Granted):  # never on a slice the pressure rule refuses
                slice_ids = [a.slice_id for a in result.lease.allocations]
                assert not self.core.pressure_refusal(order.demand.gpu_memory_bytes, slice_ids)
        self.journal.apply(instructions)
        return results

    # -- leases

    @rule(batch=st.lists(probes, min_size=1, max_size=4))
    def probe_batch(self, batch: list[tuple[Demand, int, float, float, str, str]]) -> None:
        self._arbitrate([self._order(spec) for spec in batch])

    @rule(readings=st.dictionaries(pressure_keys, pressure_readings, max_size=3))
    def airlock_polls(self, readings: dict[str, GpuPressure]) -> None:
        """Airlock's latest poll: what the ledger's choice of slices is filtered by."""
        self.core.note_pressure(readings)

    @rule(dt=st.floats(0.0, 3.0))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.journal.apply(self.core.expire(self.now))

    @rule(data=st.data(), caller=st.sampled_from(["", "A"]))
    def release(self, data: st.DataObject, caller: str) -> None:
        ids = data.draw(st.lists(st.sampled_from([*sorted(self.journal.leases), "nope"])))
        pending = {
            lid
            for lid in ids
            if (lease := self.core.ledger.lease(lid)) is not None
            and not lease.committed
            and lease.caller == caller
        }
        count, instructions = self.core.release(ids, caller)
        self.journal.apply(instructions)
        assert count == len(pending)
        assert all(self.core.ledger.lease(lid) is None for lid in pending)

    @rule(spec=probes, launch=st.booleans())
    def probe_and_commit(
        self, spec: tuple[Demand, int, float, float, str, str], launch: bool
    ) -> None:
        """The common path (commit-if-fits): a probe, its commit, and mostly its launch."""
        (result,) = self._arbitrate([self._order(spec)])
        if isinstance(result, Bounced):
            return
        subjob_id = f"s{next(self.ids)}"
        self.journal.apply(
            self.core.commit(
                result.lease.lease_id,
                subjob_id,
                "",
                caller=result.lease.caller,
                priority=0,
                lifecycle=2,
                now=self.now,
                now_unix=self.now_unix,
            )
        )
        if launch:
            self.journal.apply(self.core.launched(subjob_id, 100, self.now_unix))
            self.launches[subjob_id] += 1
            event("subjob launched")

    @rule(data=st.data(), caller=st.sampled_from(["", "A"]), reuse=st.booleans())
    def commit(self, data: st.DataObject, caller: str, reuse: bool) -> None:
        lease_id = data.draw(st.sampled_from([*sorted(self.journal.leases), "nope"]))
        live = sorted(self.core.live_states)
        subjob_id = live[0] if reuse and live else f"s{next(self.ids)}"
        self.journal.apply(self.core.expire(self.now))  # as the daemon does before a commit
        lease = self.core.ledger.lease(lease_id)
        is_pending = lease is not None and not lease.committed and lease.caller == caller
        try:
            instructions = self.core.commit(
                lease_id,
                subjob_id,
                "",
                caller=caller,
                priority=0,
                lifecycle=2,
                now=self.now,
                now_unix=self.now_unix,
            )
        except TransitionRefused:
            assert subjob_id in live, "only a live subjob's id is refused as a duplicate"
            return
        except LaminarError:
            assert not is_pending, "a pending lease of the same caller is committed"
            return
        assert subjob_id not in live
        assert lease is not None and is_pending
        self.journal.apply(instructions)
        self.priority[subjob_id] = lease.priority
        assert self.core.live_states[subjob_id] == STARTING

    # -- lifecycle

    @rule(data=st.data(), pid=st.integers(2, 99999))
    def launched(self, data: st.DataObject, pid: int) -> None:
        subjob_id = self._known(data)
        before = self.core.live_states.get(subjob_id)
        try:
            instructions = self.core.launched(subjob_id, pid, self.now_unix)
        except TransitionRefused:
            assert before != STARTING
            return
        assert before == STARTING
        self.launches[subjob_id] += 1
        event("subjob launched")
        self.journal.apply(instructions)
        assert self.core.live_states[subjob_id] == RUNNING

    @rule(data=st.data())
    def launch_failed(self, data: st.DataObject) -> None:
        subjob_id = self._known(data)
        before = self.core.live_states.get(subjob_id)
        try:
            instructions = self.core.launch_failed(subjob_id, "no such file", self.now_unix)
        except TransitionRefused:
            assert before != STARTING
            return
        self.journal.apply(instructions)
        assert self.journal.rows[subjob_id]["state"] == FAILED
        assert self.journal.ends[subjob_id] == [EndCause.LAUNCH_FAILED]

    @rule(data=st.data(), info=exits)
    def exited(self, data: st.DataObject, info: Exit) -> None:
        subjob_id = self._known(data)
        live = self.core.subjob(subjob_id)
        stop = live.stop_cause if live is not None else EndCause.UNSPECIFIED
        try:
            decision = self.core.decide_exit(subjob_id, info)
        except TransitionRefused:
            assert live is None, "only an exit of a subjob that is not live is refused"
            return
        assert live is not None
        self.journal.apply(self.core.end(subjob_id, decision, self.now_unix))
        row = self.journal.rows[subjob_id]
        event(f"exit ended {row['state']} ({row['end_cause']})")
        if info.fenced:
            assert (row["state"], row["end_cause"]) == (KILLED, "fenced")
        elif stop is not EndCause.UNSPECIFIED:
            assert (row["state"], row["end_cause"]) == (KILLED, stop.token)
        elif info.exit_code == 0:
            assert (row["state"], row["end_cause"]) == (SUCCEEDED, "exited")
        else:
            assert (row["state"], row["end_cause"]) == (FAILED, "exited")

    @rule(data=st.data(), resume=st.booleans())
    def suspend_or_resume(self, data: st.DataObject, resume: bool) -> None:
        subjob_id = self._known(data)
        live = self.core.subjob(subjob_id)
        allowed = live is not None and live.state in (RUNNING, SUSPENDED) and not live.is_stopping
        transition = self.core.resume if resume else self.core.suspend
        try:
            instructions = transition(subjob_id, "test", self.now_unix)
        except TransitionRefused:
            assert not allowed
            return
        assert allowed
        self.journal.apply(instructions)
        assert self.core.live_states[subjob_id] == (RUNNING if resume else SUSPENDED)

    @rule(data=st.data(), cause=causes)
    def stop(self, data: st.DataObject, cause: EndCause) -> None:
        subjob_id = self._known(data)
        was_live = self.core.subjob(subjob_id) is not None
        try:
            instructions = self.core.stop(subjob_id, "asked", cause)
        except TransitionRefused:
            assert not was_live
            return
        self.journal.apply(instructions)
        assert subjob_id in self.core.stopping
        expected = EndCause.TERMINATED if cause is EndCause.UNSPECIFIED else cause
        assert self.journal.rows[subjob_id]["end_cause"] == expected.token

    @rule(data=st.data(), used=st.integers(0, 100 * GIB))
    def gpu_memory_polled(self, data: st.DataObject, used: int) -> None:
        subjob_id = self._known(data)
        before = self.core.peak_gpu_memory_bytes(subjob_id)
        self.core.note_gpu_memory(subjob_id, used)
        if self.core.subjob(subjob_id) is not None:
            assert self.core.peak_gpu_memory_bytes(subjob_id) == max(before, used)

    # -- priority preemption

    @rule(spec=preempting_probes, dry_run=st.booleans())
    def preempting_probe(
        self, spec: tuple[Demand, int, float, float, str, str], dry_run: bool
    ) -> None:
        order = self._order(spec)
        (result,) = self._arbitrate([order])
        if isinstance(result, Granted) or not result.retryable:
            return
        choice = self.core.choose_preemption(
            order, result, self.now_unix, dry_run=dry_run, grace_seconds=5.0
        )
        self.journal.apply(choice.actions)
        if choice.bounce is not None:
            assert not choice.victims
            return
        assert choice.victims and set(choice.reasons) == set(choice.victims)
        event("preemption reclaimed victims")
        for victim in choice.victims:
            live = self.core.subjob(victim)
            assert live is not None and not live.is_stopping
            assert live.priority > order.priority, "only strictly lower classes are taken"
        owner = f"preempt-{next(self.ids)}"
        self.core.reserve(owner, choice, self.now)
        for victim in choice.victims:  # SIGTERM, then the process exits
            self.journal.apply(self.core.stop(victim, choice.reasons[victim], EndCause.PREEMPTED))
            decision = self.core.decide_exit(victim, Exit(exit_code=None, signal=15))
            self.journal.apply(self.core.end(victim, decision, self.now_unix))
            assert self.journal.ends[victim] == [EndCause.PREEMPTED]
        self._arbitrate([replace(order, arrival_seq=self.core.next_arrival(), owner=owner)])
        self.core.unreserve(owner)

    # -- agent restart

    @rule(data=st.data())
    def agent_restarts(self, data: st.DataObject) -> None:
        """The core is rebuilt from the journal's live rows; each is re-adopted (its
        process runs), ended with the exit file it left, or lost."""
        for lease_id, (subjob_id, _, _) in list(self.journal.leases.items()):
            if not subjob_id:  # an uncommitted lease dies with the agent's memory
                del self.journal.leases[lease_id]
                self.journal.settled.setdefault(lease_id, []).append("forgotten")
        self.core = self._new_core()
        for subjob_id, row in sorted(self.journal.rows.items()):
            if row["state"] not in LIVE_STATES:
                continue
            self.core.restore(
                RestoredSubjob(
                    subjob_id=subjob_id,
                    job_id=str(row["job_id"]),
                    state=str(row["state"]),
                    reason=str(row["reason"]),
                    lease_id=str(row["lease_id"]),
                    slice_ids=tuple(row["slice_ids"]),
                    priority=int(row["priority"]),
                    lifecycle=2,
                    started_unix=float(row["started_unix"]),
                    end_cause=str(row["end_cause"]),
                )
            )
            # What the driver finds: is its process still running, did it leave an exit
            # record? The core decides what becomes of it (AgentCore.recover).
            is_running = data.draw(st.booleans(), label=f"{subjob_id} runs")
            exit_record = data.draw(st.none() | exits, label=f"{subjob_id} exit record")
            _, allocations, lease_priority = self.journal.leases[str(row["lease_id"])]
            facts = RestartFacts(is_running, exit_record, tuple(allocations), lease_priority)
            outcome = self.core.recover(subjob_id, facts, self.now_unix)
            event(f"restart: {outcome.fate.name}")
            self.journal.apply(outcome.instructions)
            if outcome.fate is Restarted.ENDED:
                assert outcome.end is not None
                self.journal.apply(self.core.end(subjob_id, outcome.end, self.now_unix))
            assert (outcome.fate is Restarted.READOPTED) == is_running, (
                "capacity that fit before a restart fits after it"
            )
            if outcome.fate is Restarted.LOST:
                assert self.journal.rows[subjob_id]["state"] == LOST

    # -- invariants

    @invariant()
    def no_slice_over_capacity(self) -> None:
        ledger = self.core.ledger
        ledger.check_invariant()
        for s in SLICES:
            committed_milli, leased_milli, committed_bytes, leased_bytes = ledger.usage(s.slice_id)
            assert committed_milli + leased_milli <= s.capacity_milli
            assert committed_bytes + leased_bytes <= s.memory_total_bytes

    @invariant()
    def started_at_most_once(self) -> None:
        assert all(n == 1 for n in self.launches.values())
        started = Counter(sid for sid, state in self.journal.events if state == RUNNING)
        for subjob_id in self.launches:
            assert started[subjob_id] >= 1

    @invariant()
    def one_end_each_and_none_after_it(self) -> None:
        last_state: dict[str, str] = {}
        for subjob_id, state in self.journal.events:
            assert last_state.get(subjob_id) not in TERMINAL_STATES, (
                f"{subjob_id} left its end state for {state}"
            )
            last_state[subjob_id] = state
        for subjob_id, row in self.journal.rows.items():
            ended = row["state"] in TERMINAL_STATES
            assert ended == (subjob_id in self.journal.ends)
            if ended:
                (cause,) = self.journal.ends[subjob_id]
                assert cause is not EndCause.UNSPECIFIED
                assert cause_from_token(str(row["end_cause"])) is cause
                assert last_state[subjob_id] == row["state"]

    @invariant()
    def leases_settle_once(self) -> None:
        for lease_id, outcomes in self.journal.settled.items():
            if outcomes[0] == "committed":
                assert outcomes in (["committed"], ["committed", "ended"]), (lease_id, outcomes)
            else:
                assert len(outcomes) == 1 and outcomes[0] in ("released", "expired", "forgotten"), (
                    lease_id,
                    outcomes,
                )
        # The journal's leases are the ledger's (rows of restored subjobs not yet adopted
        # never linger: every restore is settled within the restart step).
        held = {lease.lease_id: lease for lease in self.core.ledger.leases()}
        assert set(self.journal.leases) == set(held)
        # Exactly once: a lease gone from the ledger was settled, one still pending was not.
        for lease_id in self.journal.granted:
            outcomes = self.journal.settled.get(lease_id, [])
            if lease_id not in held:
                assert outcomes and outcomes[-1] != "committed", (lease_id, outcomes)
            elif held[lease_id].committed:
                assert outcomes == ["committed"], (lease_id, outcomes)
            else:
                assert outcomes == [], (lease_id, outcomes)

    @invariant()
    def core_agrees_with_the_journal(self) -> None:
        journal_live = {
            sid: row["state"]
            for sid, row in self.journal.rows.items()
            if row["state"] in LIVE_STATES
        }
        assert self.core.live_states == journal_live
        for subjob_id in journal_live:
            live = self.core.subjob(subjob_id)
            assert live is not None
            lease = self.core.ledger.lease(live.lease_id)
            assert lease is not None and lease.committed and lease.subjob_id == subjob_id


CoreMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCoreMachine = CoreMachine.TestCase


# -- refusals, one by one -------------------------------------------------------------------------


def granted_lease(core: AgentCore, demand: Demand, slice_id: str = "") -> str:
    order = ProbeOrder("p", "j", 0, demand, 3, 1.0, core.next_arrival(), 5.0, slice_id)
    (granted,), _ = core.arbitrate([order], 0.0, EPOCH_UNIX)
    assert isinstance(granted, Granted)
    return granted.lease.lease_id


def commit(core: AgentCore, lease_id: str, subjob_id: str) -> list[Instruction]:
    return core.commit(
        lease_id,
        subjob_id,
        "j",
        caller="",
        priority=0,
        lifecycle=2,
        now=0.0,
        now_unix=EPOCH_UNIX,
    )


def started_core() -> tuple[AgentCore, str]:
    """A core with one subjob committed on gpu0 and running."""
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    lease_id = granted_lease(core, Demand(gpus=1), "gpu0")
    commit(core, lease_id, "s1")
    core.launched("s1", 42, EPOCH_UNIX)
    return core, lease_id


def ended_core() -> AgentCore:
    core, _ = started_core()
    core.end("s1", core.decide_exit("s1", Exit(exit_code=0, signal=None)), EPOCH_UNIX)
    return core


def test_an_end_releases_the_lease_and_is_journaled_with_its_cause() -> None:
    core, lease_id = started_core()
    instructions = core.end("s1", core.decide_exit("s1", Exit(0, None)), EPOCH_UNIX + 5)
    assert core.ledger.lease(lease_id) is None
    assert core.ledger.usage("gpu0") == (0, 0, 0, 0)
    assert DropLease(lease_id, "j", "ended") in instructions
    (row,) = [i for i in instructions if isinstance(i, WriteRow) and "end_cause" in i.fields]
    assert row.fields["end_cause"] == "exited"
    assert row.fields["ended_unix"] == EPOCH_UNIX + 5
    assert instructions[-1] == Ended("s1", SUCCEEDED, EndCause.EXITED, "exited 0")


@pytest.mark.parametrize(
    "event",
    [
        lambda core: core.decide_exit("s1", Exit(exit_code=1, signal=None)),
        lambda core: core.end("s1", EndDecision(KILLED, EndCause.TERMINATED, "x"), EPOCH_UNIX),
        lambda core: core.resume("s1", "why", EPOCH_UNIX),
        lambda core: core.suspend("s1", "why", EPOCH_UNIX),
        lambda core: core.stop("s1", "why", EndCause.TERMINATED),
        lambda core: core.launched("s1", 43, EPOCH_UNIX),
        lambda core: core.launch_failed("s1", "boom", EPOCH_UNIX),
        lambda core: core.lose("s1", EPOCH_UNIX),
        lambda core: core.check_release_memory("s1"),
    ],
    ids=[
        "exit",
        "end",
        "resume",
        "suspend",
        "stop",
        "launch",
        "launch-failed",
        "lose",
        "release-memory",
    ],
)
def test_an_ended_subjob_refuses_every_event(event: Callable[[AgentCore], object]) -> None:
    core = ended_core()
    with pytest.raises(TransitionRefused, match="not live"):
        event(core)
    assert core.live_states == {}


def test_a_second_launch_is_refused() -> None:
    core, _ = started_core()
    with pytest.raises(TransitionRefused, match="running, not starting"):
        core.launched("s1", 43, EPOCH_UNIX)
    assert core.live_states == {"s1": RUNNING}


def test_a_starting_subjob_cannot_be_suspended() -> None:
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    commit(core, granted_lease(core, Demand()), "s1")
    with pytest.raises(TransitionRefused, match="starting"):
        core.suspend("s1", "why", EPOCH_UNIX)
    assert core.live_states == {"s1": STARTING}


def test_a_stopping_subjob_refuses_suspend_and_resume_and_ends_killed_with_the_stop_cause() -> None:
    core, _ = started_core()
    core.stop("s1", "make room", EndCause.PREEMPTED)
    for signal in (core.suspend, core.resume):
        with pytest.raises(TransitionRefused, match="being stopped"):
            signal("s1", "why", EPOCH_UNIX)
    decision = core.decide_exit("s1", Exit(exit_code=0, signal=None))
    assert decision == EndDecision(KILLED, EndCause.PREEMPTED, "make room; exited 0")


def test_a_live_subjob_id_is_not_committed_twice() -> None:
    core, _ = started_core()
    lease_id = granted_lease(core, Demand())
    with pytest.raises(TransitionRefused, match="already exists"):
        commit(core, lease_id, "s1")
    lease = core.ledger.lease(lease_id)
    assert lease is not None and not lease.committed


def test_an_end_must_name_an_end_state_and_a_cause() -> None:
    core, _ = started_core()
    with pytest.raises(ValueError, match="not an end"):
        core.end("s1", EndDecision(RUNNING, EndCause.EXITED, "x"), EPOCH_UNIX)
    with pytest.raises(ValueError, match="not an end"):
        core.end("s1", EndDecision(KILLED, EndCause.UNSPECIFIED, "x"), EPOCH_UNIX)
    assert core.live_states == {"s1": RUNNING}


def test_an_ended_row_is_not_restored() -> None:
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    row = RestoredSubjob("s1", "j", SUCCEEDED, "exited 0", "l", (), 3, 2, EPOCH_UNIX)
    with pytest.raises(TransitionRefused, match="has ended"):
        core.restore(row)
    assert core.live_states == {}


def test_a_restored_stop_keeps_its_cause() -> None:
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    row = RestoredSubjob(
        "s1", "j", RUNNING, "terminating: drained", "l", ("gpu0",), 3, 2, EPOCH_UNIX, "cancelled"
    )
    core.restore(row)
    assert core.adopt("s1", [Allocation("gpu0", 1000, 80 * GIB)], 3) == []
    assert core.stopping == {"s1"}
    decision = core.decide_exit("s1", Exit(exit_code=None, signal=15), "ended while down")
    assert decision == EndDecision(
        KILLED, EndCause.CANCELLED, "drained; ended by signal 15; ended while down"
    )


def _restored_core() -> AgentCore:
    core = AgentCore(Ledger(SLICES, lease_prefix="t-", cpu_total_milli=8000))
    core.restore(RestoredSubjob("s1", "j", RUNNING, "", "l-s1", ("gpu0",), 3, 2, 1.0))
    return core


def test_a_restart_readopts_a_running_process_with_its_capacity_and_host_share() -> None:
    """Its process runs: it is re-adopted, its slice and host CPU share held again (the
    share its demand takes here, as at its probe), whatever exit record lies about."""
    core = _restored_core()
    facts = RestartFacts(
        is_running=True,
        exit=Exit(exit_code=0, signal=None),
        allocations=(Allocation("gpu0", 1000, 80 * GIB),),
        lease_priority=3,
        demand=Demand(gpus=1, cpu_milli=2000),
    )
    outcome = core.recover("s1", facts, EPOCH_UNIX)
    assert (outcome.fate, outcome.instructions, outcome.end) == (Restarted.READOPTED, [], None)
    assert core.live_states == {"s1": RUNNING}
    assert core.ledger.usage("gpu0")[0] == 1000
    assert core.ledger.host_free().cpu_free_milli == 6000


def test_a_restart_stops_a_running_process_whose_capacity_is_taken() -> None:
    core = _restored_core()
    core.restore(RestoredSubjob("s2", "j", RUNNING, "", "l-s2", ("gpu0",), 3, 2, 1.0))
    whole = (Allocation("gpu0", 1000, 80 * GIB),)
    assert core.recover("s1", RestartFacts(True, None, whole, 3), EPOCH_UNIX).fate is (
        Restarted.READOPTED
    )
    outcome = core.recover("s2", RestartFacts(True, None, whole, 3), EPOCH_UNIX)
    assert outcome.fate is Restarted.UNHELD and outcome.instructions[-1] == Kill("s2")
    assert core.stopping == {"s2"}


def test_a_restart_ends_a_gone_process_as_its_exit_record_says() -> None:
    core = _restored_core()
    outcome = core.recover("s1", RestartFacts(False, Exit(exit_code=3, signal=None)), EPOCH_UNIX)
    assert outcome.fate is Restarted.ENDED and outcome.instructions == []
    assert outcome.end == EndDecision(
        FAILED, EndCause.EXITED, "exited 3; ended while the agent was down"
    )
    assert core.live_states == {"s1": RUNNING}  # ended once the driver records it
    assert core.ledger.usage("gpu0") == (0, 0, 0, 0)  # nothing held again


def test_a_restart_loses_a_gone_process_that_left_no_record() -> None:
    core = _restored_core()
    outcome = core.recover("s1", RestartFacts(False), EPOCH_UNIX)
    assert outcome.fate is Restarted.LOST and outcome.end is None
    last = outcome.instructions[-1]
    assert isinstance(last, Ended) and (last.state, last.cause) == (LOST, EndCause.LOST)
    assert core.live_states == {}


def test_capacity_that_cannot_be_readopted_is_killed_not_held() -> None:
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    for sid in ("s1", "s2"):
        core.restore(RestoredSubjob(sid, "j", RUNNING, "", f"l-{sid}", ("gpu0",), 3, 2, 1.0))
    assert core.adopt("s1", [Allocation("gpu0", 1000, 80 * GIB)], 3) == []
    refused = core.adopt("s2", [Allocation("gpu0", 1000, 80 * GIB)], 3)
    assert DropLease("l-s2", "j", "not re-adopted") in refused
    assert refused[-1] == Kill("s2")
    assert core.stopping == {"s2"}
    core.ledger.check_invariant()
    # Its exit ends it as a stop, and gives back nothing it does not hold.
    ended = core.end("s2", core.decide_exit("s2", Exit(exit_code=None, signal=9)), 2.0)
    last = ended[-1]
    assert isinstance(last, Ended) and (last.state, last.cause) == (KILLED, EndCause.TERMINATED)
    assert last.reason.startswith("cannot re-adopt its capacity (")
    assert not any(isinstance(i, DropLease) for i in ended)
    assert core.live_states == {"s1": RUNNING}
    assert core.ledger.lease("l-s1") is not None


def test_readoption_holds_the_host_share_again_and_refuses_what_the_host_cannot_hold() -> None:
    ledger = Ledger(SLICES, lease_prefix="t-", cpu_total_milli=8000, memory_total_bytes=32 * GIB)
    core = AgentCore(ledger)
    for sid, slice_id in (("s1", "gpu0"), ("s2", "gpu1")):
        core.restore(RestoredSubjob(sid, "j", RUNNING, "", f"l-{sid}", (slice_id,), 3, 2, 1.0))
    alloc = [Allocation("gpu0", 1000, 80 * GIB)]
    assert core.adopt("s1", alloc, 3, cpu_milli=6000, host_memory_bytes=8 * GIB) == []
    assert ledger.host_free().cpu_free_milli == 2000
    refused = core.adopt(
        "s2", [Allocation("gpu1", 300, GIB)], 3, cpu_milli=4000, host_memory_bytes=GIB
    )
    assert refused[-1] == Kill("s2")
    assert ledger.host_free().cpu_free_milli == 2000
    ledger.check_invariant()


def test_a_readopted_lease_id_held_by_another_is_not_released_by_the_refused_one() -> None:
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    for sid in ("s1", "s2"):
        core.restore(RestoredSubjob(sid, "j", RUNNING, "", "same", ("gpu1",), 3, 2, 1.0))
    assert core.adopt("s1", [Allocation("gpu1", 300, GIB)], 3) == []
    refused = core.adopt("s2", [Allocation("gpu1", 300, GIB)], 3)
    assert not any(isinstance(i, DropLease) for i in refused)
    core.end("s2", core.decide_exit("s2", Exit(exit_code=0, signal=None)), 2.0)
    assert core.ledger.usage("gpu1") == (300, 0, GIB, 0)


# -- preemption choice ----------------------------------------------------------------------------


def two_low_priority_holders() -> AgentCore:
    """gpu0 and gpu1 each held by a running opportunistic subjob (s0, s1)."""
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    for i, slice_id in enumerate(["gpu0", "gpu1"]):
        order = ProbeOrder(f"p{i}", "low", 0, Demand(gpus=1), 4, 1.0, i, 5.0, slice_id)
        (granted,), _ = core.arbitrate([order], 0.0, EPOCH_UNIX)
        assert isinstance(granted, Granted)
        commit(core, granted.lease.lease_id, f"s{i}")
        core.launched(f"s{i}", 42 + i, EPOCH_UNIX)
    return core


def bounced_probe(core: AgentCore, priority: int) -> tuple[ProbeOrder, Bounced]:
    """A one-GPU probe of class ``priority`` that finds no free GPU."""
    order = ProbeOrder("hi", "high", 0, Demand(gpus=1), priority, 1.0, 9, 5.0)
    (bounce,), _ = core.arbitrate([order], 0.0, EPOCH_UNIX)
    assert isinstance(bounce, Bounced) and bounce.retryable
    return order, bounce


def test_a_preemption_takes_the_cheapest_lower_priority_holder_and_says_why() -> None:
    core = two_low_priority_holders()
    order, bounce = bounced_probe(core, 1)
    choice = core.choose_preemption(order, bounce, EPOCH_UNIX + 100, dry_run=False, grace_seconds=5)
    assert choice.bounce is None
    assert (choice.victims, choice.slice_ids) == (("s0",), ("gpu0",))  # WHOLE_GPU first
    assert choice.reasons["s0"].startswith("preempted: by job high (critical) needing gpu0")
    (action,) = choice.actions
    assert (action.subjob_id, action.cause, action.dry_run) == ("s0", EndCause.PREEMPTED, False)
    assert action.work_lost_gpu_seconds == 100.0  # one GPU for 100 s
    assert choice.budget_seconds == 5 + PREEMPT_MARGIN_SECONDS
    # The room is reserved for the preempting probe: another probe does not get it.
    core.reserve("owner", choice, 0.0)
    core.end("s0", core.decide_exit("s0", Exit(exit_code=None, signal=15)), EPOCH_UNIX)
    other = ProbeOrder("other", "j", 0, Demand(gpus=1), 1, 9.0, 10, 5.0)
    mine = replace(order, arrival_seq=11, owner="owner")
    (lost, won), _ = core.arbitrate([other, mine], 1.0, EPOCH_UNIX)
    assert isinstance(lost, Bounced) and isinstance(won, Granted)


def test_a_dry_run_preemption_records_its_choice_and_bounces() -> None:
    core = two_low_priority_holders()
    order, bounce = bounced_probe(core, 1)
    choice = core.choose_preemption(order, bounce, EPOCH_UNIX, dry_run=True, grace_seconds=5)
    assert choice.victims == ()
    assert choice.bounce is not None and "airlock dry-run: would preempt s0" in choice.bounce.reason
    assert [a.dry_run for a in choice.actions] == [True]
    assert core.live_states == {"s0": RUNNING, "s1": RUNNING}


def test_no_victim_among_equal_or_higher_classes_or_holders_being_stopped() -> None:
    core = two_low_priority_holders()
    order, bounce = bounced_probe(core, 4)
    choice = core.choose_preemption(order, bounce, EPOCH_UNIX, dry_run=False, grace_seconds=5)
    assert choice.victims == () and choice.bounce is not None
    assert "no lower-priority work to reclaim" in choice.bounce.reason
    core.stop("s0", "drain", EndCause.TERMINATED)
    core.stop("s1", "drain", EndCause.TERMINATED)
    urgent = replace(order, priority=1)
    choice = core.choose_preemption(urgent, bounce, EPOCH_UNIX, dry_run=False, grace_seconds=5)
    assert choice.victims == () and choice.bounce is not None


# -- the decisions the daemon's driver asks for (no sockets, no processes) -------------------------


def test_a_failed_gpus_victims_are_its_live_holders_not_already_being_stopped() -> None:
    core = two_low_priority_holders()
    assert core.holding({"gpu0"}) == ["s0"]
    assert core.holding({"gpu2/mig-3g.40gb@0"}) == []
    core.stop("s0", "drain", EndCause.TERMINATED)
    assert core.holding({"gpu0", "gpu1"}) == ["s1"]  # s0's stop is under way already
    core.end("s1", core.decide_exit("s1", Exit(exit_code=0, signal=None)), EPOCH_UNIX)
    assert core.holding({"gpu0", "gpu1"}) == []


def test_a_draining_agent_bounces_probes_for_good_and_only_retryable_bounces_preempt() -> None:
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    assert core.admit("p1", "a") is None
    core.is_draining = True
    refused = core.admit("p1", "a")
    assert refused == Bounced("p1", "agent a is draining", False)
    granted = Granted("p", LeaseRecord("l", "j", 0, (), 1.0, 5.0, 3))
    assert core.may_preempt(Bounced("p", "full", True), True)
    assert not core.may_preempt(Bounced("p", "full", True), False)  # not asked for
    assert not core.may_preempt(Bounced("p", "never fits", False), True)
    assert not core.may_preempt(granted, True)


@dataclass(frozen=True)
class ExitFigures:
    """An exit with the figures journaled at the end (``ExitInfo``'s shape)."""

    exit_code: int | None
    signal: int | None
    peak_rss_bytes: int = 0
    run_seconds: float = 0.0
    ended_unix: float = 0.0
    fenced: bool = False
    error: str = ""


def test_an_exit_journals_its_figures_and_what_its_checkpoint_covers() -> None:
    core, _ = started_core()
    info = ExitFigures(None, 9, peak_rss_bytes=1 << 20, run_seconds=7.5, ended_unix=EPOCH_UNIX + 7)
    decision = core.decide_exit("s1", info)
    instructions = core.exited(
        "s1", decision, info, EPOCH_UNIX + 8, units_done=3, note="checkpoint at unit 3"
    )
    (row,) = [i for i in instructions if isinstance(i, WriteRow) and "end_cause" in i.fields]
    assert {k: row.fields[k] for k in ("exit_code", "signal", "units_done")} == {
        "exit_code": -1,  # killed by a signal: no exit code of its own
        "signal": 9,
        "units_done": 3,
    }
    assert (row.fields["peak_rss_bytes"], row.fields["run_seconds"]) == (1 << 20, 7.5)
    assert row.fields["ended_unix"] == EPOCH_UNIX + 7  # when it ended, not when it was seen
    assert instructions[-1] == Ended(
        "s1", FAILED, EndCause.EXITED, "ended by signal 9; checkpoint at unit 3"
    )


def test_busy_slices_open_when_their_latest_started_holder_expects_to_end() -> None:
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    share = Demand(gpu_milli=300, gpu_memory_bytes=8 * GIB)
    for i, started in enumerate([EPOCH_UNIX, EPOCH_UNIX + 50, 0.0]):
        commit(core, granted_lease(core, share, "gpu1"), f"s{i}")
        if started:
            core.launched(f"s{i}", 40 + i, started)
    expected = {"s0": 100.0, "s1": 20.0, "s2": 500.0, "gone": 900.0}
    # s0 ends last (started + 100); s1 sooner; s2 has not started; "gone" is not live.
    assert core.busy_until(expected) == {"gpu1": EPOCH_UNIX + 100}
    assert core.busy_until({"s0": 0.0, "s1": 20.0}) == {"gpu1": EPOCH_UNIX + 70}


def test_capacity_ratios_count_allocated_and_stranded_gpu_capacity() -> None:
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    assert core.capacity_ratios() == (0.0, 0.0)
    total = sum(s.capacity_milli for s in core.ledger.slices.values())
    whole = core.ledger.slices["gpu0"].capacity_milli
    shared = core.ledger.slices["gpu1"].capacity_milli
    commit(core, granted_lease(core, Demand(gpus=1), "gpu0"), "s0")
    share = Demand(gpu_milli=300, gpu_memory_bytes=8 * GIB)
    commit(core, granted_lease(core, share, "gpu1"), "s1")
    allocated, stranded = core.capacity_ratios()
    assert allocated == pytest.approx((whole + 300) / total)
    assert stranded == pytest.approx((shared - 300) / total)  # gpu0 is full, not stranded


def test_a_pressured_slice_or_gpu_advertises_no_window() -> None:
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))

    def advertised(pressured: set[str]) -> set[str]:
        return {w.slice.slice_id for w in core.windows(EPOCH_UNIX, {}, 16, pressured)}

    everything = {s.slice_id for s in SLICES}
    assert advertised(set()) == everything
    assert advertised({"gpu1"}) == everything - {"gpu1"}
    # A GPU's name covers its MIG instances.
    assert advertised({"gpu2"}) == {"gpu0", "gpu1"}
    assert advertised({"gpu2/mig-3g.40gb@1"}) == everything - {"gpu2/mig-3g.40gb@1"}


def pressure_probe(core: AgentCore, demand: Demand, slice_id: str = "gpu1") -> Granted | Bounced:
    order = ProbeOrder("p", "j", 0, demand, 3, 1.0, core.next_arrival(), 5.0, slice_id)
    (result,), _ = core.arbitrate([order], 0.0, EPOCH_UNIX)
    return result


def test_new_work_is_refused_on_a_gpu_airlock_holds_pressured_or_that_it_would_take_critical() -> (
    None
):
    """Airlock's latest poll decides admission: a GPU it holds ELEVATED or CRITICAL, or one
    where memory in use, what suspended subjobs take back and the declaration come to more
    than Airlock's critical mark, bounces new work (retryable) and keeps no lease; a calm GPU with
    room grants it, past Airlock's target too (declarations may fill a GPU, not to the
    critical mark)."""
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    share = Demand(gpu_milli=300, gpu_memory_bytes=8 * GIB)
    assert isinstance(pressure_probe(core, share), Granted)  # no poll yet: nothing to refuse
    core.release(list_leases(core), "")
    core.note_pressure({"gpu1": GpuPressure(Level.ELEVATED, 60 * GIB, 80 * GIB)})
    bounced = pressure_probe(core, share)
    assert isinstance(bounced, Bounced) and bounced.retryable
    assert "ELEVATED" in bounced.reason
    assert core.ledger.usage("gpu1") == (0, 0, 0, 0)  # the lease was given back
    # Calm, but 68 + 8 GiB reaches the critical mark, 95 % of 80 GiB (76 GiB); 67 + 8 does
    # not (past the 80 % target: declarations may fill a GPU, growth is Airlock's to handle).
    core.note_pressure({"gpu1": GpuPressure(Level.NORMAL, 68 * GIB, 80 * GIB)})
    over = pressure_probe(core, share)
    assert isinstance(over, Bounced) and "at Airlock's critical mark 95%" in over.reason
    core.note_pressure({"gpu1": GpuPressure(Level.NORMAL, 67 * GIB, 80 * GIB)})
    assert isinstance(pressure_probe(core, share), Granted)
    # An idle GPU takes what its ledger admits, a declaration past the target too.
    core.release(list_leases(core), "")
    core.note_pressure({"gpu1": GpuPressure(Level.NORMAL, 0, 80 * GIB)})
    assert isinstance(pressure_probe(core, replace(share, gpu_memory_bytes=70 * GIB)), Granted)
    # Other GPUs are not held back by gpu1's pressure; a GPU's name covers its MIG slices.
    core.note_pressure({"gpu2": GpuPressure(Level.CRITICAL, 39 * GIB, 40 * GIB)})
    assert isinstance(pressure_probe(core, Demand(gpus=1), "gpu0"), Granted)
    mig = pressure_probe(core, Demand(mig_profile="3g.40gb"), "gpu2/mig-3g.40gb@0")
    assert isinstance(mig, Bounced) and "CRITICAL" in mig.reason


#: A host of two whole GPUs and two shared ones, for the pressure filter's tests.
TWO_BY_TWO = [
    Slice("gpu0", SliceKind.WHOLE_GPU, 0, "GPU-0", "H100", 80 * GIB),
    Slice("gpu1", SliceKind.WHOLE_GPU, 1, "GPU-1", "H100", 80 * GIB),
    Slice("gpu2", SliceKind.SHARED_GPU, 2, "GPU-2", "H100", 80 * GIB),
    Slice("gpu3", SliceKind.SHARED_GPU, 3, "GPU-3", "H100", 80 * GIB),
]


def test_a_calm_gpu_beside_a_pressured_one_takes_the_new_work() -> None:
    """The ledger chooses among the slices the pressure rule admits: a whole GPU and a share
    the ledger would rank first (the lower id; the fuller shared GPU) sit on GPUs Airlock
    holds pressured, so the probes go to the calm GPU beside each instead of bouncing."""
    core = AgentCore(Ledger(TWO_BY_TWO, lease_prefix="t-"))
    commit(core, granted_lease(core, Demand(gpu_milli=300), "gpu2"), "s1")
    core.note_pressure(
        {
            "gpu0": GpuPressure(Level.ELEVATED, 70 * GIB, 80 * GIB),
            "gpu2": GpuPressure(Level.NORMAL, 70 * GIB, 80 * GIB),  # 70 + 8 reaches 76 GiB
        }
    )
    whole = pressure_probe(core, Demand(gpus=1), "")
    assert isinstance(whole, Granted), whole
    assert [a.slice_id for a in whole.lease.allocations] == ["gpu1"]
    share = pressure_probe(core, Demand(gpu_milli=300, gpu_memory_bytes=8 * GIB), "")
    assert isinstance(share, Granted), share
    assert [a.slice_id for a in share.lease.allocations] == ["gpu3"]
    assert core.ledger.usage("gpu0") == (0, 0, 0, 0)
    assert core.ledger.usage("gpu2")[1] == 0  # nothing leased there beside s1
    # Without pressure the same share goes to the fuller shared GPU (what the filter changed).
    core.release(list_leases(core), "")
    core.note_pressure({})
    again = pressure_probe(core, Demand(gpu_milli=300, gpu_memory_bytes=8 * GIB), "")
    assert isinstance(again, Granted)
    assert [a.slice_id for a in again.lease.allocations] == ["gpu2"]


def test_a_probe_bounces_only_when_no_gpu_it_could_use_passes_the_pressure_rule() -> None:
    """Both whole GPUs pressured: the probe bounces, retryable, with the refusal of the GPU
    the ledger would have chosen, and keeps no lease. A demand for both GPUs bounces while
    one of them is pressured; one the host can never hold keeps the ledger's own reason."""
    core = AgentCore(Ledger(TWO_BY_TWO[:2], lease_prefix="t-"))
    core.note_pressure(
        {
            "gpu0": GpuPressure(Level.CRITICAL, 79 * GIB, 80 * GIB),
            "gpu1": GpuPressure(Level.NORMAL, 60 * GIB, 80 * GIB),
        }
    )
    demand = Demand(gpus=1, gpu_memory_bytes=20 * GIB)  # 60 + 20 reaches 76 GiB on gpu1
    both = pressure_probe(core, demand, "")
    assert isinstance(both, Bounced) and both.retryable
    assert both.reason == core.pressure_refusal(20 * GIB, ["gpu0"])
    assert "CRITICAL" in both.reason
    assert list_leases(core) == []
    core.note_pressure({"gpu0": GpuPressure(Level.ELEVATED, 70 * GIB, 80 * GIB)})
    assert isinstance(pressure_probe(core, Demand(gpus=1), ""), Granted)
    core.release(list_leases(core), "")
    pair = pressure_probe(core, Demand(gpus=2), "")
    assert isinstance(pair, Bounced) and pair.retryable
    assert pair.reason == core.pressure_refusal(0, ["gpu0"]) and "ELEVATED" in pair.reason
    assert list_leases(core) == []
    never = pressure_probe(core, Demand(gpus=3), "")
    assert isinstance(never, Bounced) and not never.retryable
    assert never.reason.startswith("needs 3 whole GPUs")


def test_a_suspended_subjob_s_memory_counts_against_new_work_until_it_resumes() -> None:
    """A subjob suspended (cuda-checkpoint: 0 bytes on the GPU) takes its last reading back
    on resume: new work that would leave no room for it is refused."""
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    commit(core, granted_lease(core, Demand(gpu_milli=300), "gpu1"), "s1")
    core.launched("s1", 42, EPOCH_UNIX)
    core.note_gpu_memory("s1", 30 * GIB)
    core.suspend("s1", "pressure", EPOCH_UNIX)
    core.note_gpu_memory("s1", 0)  # checkpointed: nothing on the GPU now
    core.note_pressure({"gpu1": GpuPressure(Level.NORMAL, 30 * GIB, 80 * GIB)})
    share = Demand(gpu_milli=300, gpu_memory_bytes=20 * GIB)  # 30 + 30 + 20 >= 76
    refused = pressure_probe(core, share)
    assert isinstance(refused, Bounced) and "30.0 to resume" in refused.reason
    core.resume("s1", "calm", EPOCH_UNIX)
    assert isinstance(pressure_probe(core, share), Granted)


def test_work_a_restart_loses_leaves_out_every_suspension() -> None:
    """Airlock's "least work lost" and its wait before moving or reclaiming a suspended
    subjob read the work a restart would lose: run time less the time it was stopped,
    whoever stopped it (an operator's suspend too), and it does not grow while stopped."""
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    commit(core, granted_lease(core, Demand(gpu_milli=300), "gpu1"), "s1")
    live = core.subjob("s1")
    assert live is not None and live.work_seconds(EPOCH_UNIX + 50) == 0.0  # not started
    core.launched("s1", 42, EPOCH_UNIX)
    assert live.work_seconds(EPOCH_UNIX + 100) == pytest.approx(100.0)
    core.suspend("s1", "operator", EPOCH_UNIX + 100)  # a SignalSubjob, say
    core.suspend("s1", "again", EPOCH_UNIX + 150)  # repeated: the stop began at 100
    assert live.work_seconds(EPOCH_UNIX + 400) == pytest.approx(100.0)  # no growth
    core.resume("s1", "operator", EPOCH_UNIX + 400)
    core.resume("s1", "again", EPOCH_UNIX + 450)  # repeated: nothing more was stopped
    assert live.work_seconds(EPOCH_UNIX + 500) == pytest.approx(200.0)  # 500 - 300 stopped
    core.suspend("s1", "pressure", EPOCH_UNIX + 500)
    assert live.work_seconds(EPOCH_UNIX + 900) == pytest.approx(200.0)


def test_a_restored_suspension_counts_from_its_event() -> None:
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    row = RestoredSubjob(
        "s1",
        "j",
        SUSPENDED,
        "suspended: x",
        "l",
        ("gpu0",),
        3,
        2,
        EPOCH_UNIX,
        "",
        0,
        stopped_since_unix=EPOCH_UNIX + 60,
    )
    core.restore(row)
    live = core.subjob("s1")
    assert live is not None and live.work_seconds(EPOCH_UNIX + 1000) == pytest.approx(60.0)
    core.restore(RestoredSubjob("s2", "j", RUNNING, "", "l2", ("gpu1",), 3, 2, EPOCH_UNIX))
    running = core.subjob("s2")
    assert running is not None and running.work_seconds(EPOCH_UNIX + 10) == pytest.approx(10.0)


def test_the_admitted_declarations_are_those_pressure_refusal_admits() -> None:
    """``admitted_declarations`` counts the ascending declarations ``pressure_refusal``
    admits (reading, resume memory and the critical mark read once, not per declaration):
    with a suspended subjob's memory to take back, on a calm and on an elevated GPU, and
    on a GPU Airlock does not watch."""
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    commit(core, granted_lease(core, Demand(gpu_milli=300), "gpu1"), "s1")
    core.launched("s1", 42, EPOCH_UNIX)
    core.note_gpu_memory("s1", 30 * GIB)
    core.suspend("s1", "pressure", EPOCH_UNIX)
    core.note_gpu_memory("s1", 0)
    declared = [g * GIB for g in (0, 1, 5, 10, 15, 16, 17, 20, 40, 76)]
    for level, used, slice_id in [
        (Level.NORMAL, 30 * GIB, "gpu1"),
        (Level.NORMAL, 0, "gpu1"),
        (Level.NORMAL, 0, "gpu0"),
        (Level.ELEVATED, 10 * GIB, "gpu1"),
    ]:
        core.note_pressure({"gpu1": GpuPressure(level, used, 80 * GIB)})
        plain = sum(1 for d in declared if not core.pressure_refusal(d, (slice_id,)))
        assert core.admitted_declarations(declared, (slice_id,)) == plain
    core.note_pressure({"gpu1": GpuPressure(Level.NORMAL, 30 * GIB, 80 * GIB)})
    assert core.admitted_declarations(declared, ("gpu1",)) == 5  # 30 + 30 + 16 reaches 76


def list_leases(core: AgentCore) -> list[str]:
    return [lease.lease_id for lease in core.ledger.leases() if not lease.committed]


def test_an_ended_subjob_s_memory_leaves_the_reading_new_work_is_admitted_by() -> None:
    """Airlock's reading lags an end by up to one poll: the core takes the ended subjob's
    last reading off its GPU at once, so new work is not refused for memory no one holds."""
    core = AgentCore(Ledger(SLICES, lease_prefix="t-"))
    commit(core, granted_lease(core, Demand(gpu_milli=300), "gpu1"), "s1")
    core.launched("s1", 42, EPOCH_UNIX)
    core.note_gpu_memory("s1", 70 * GIB)
    core.note_pressure({"gpu1": GpuPressure(Level.NORMAL, 70 * GIB, 80 * GIB)})
    share = Demand(gpu_milli=300, gpu_memory_bytes=20 * GIB)
    assert isinstance(pressure_probe(core, share), Bounced)  # 70 + 20 reaches 76 GiB
    core.end("s1", EndDecision(SUCCEEDED, EndCause.EXITED, "exited 0"), EPOCH_UNIX)
    assert core.pressure["gpu1"].used_bytes == 0
    assert isinstance(pressure_probe(core, share), Granted)


def test_the_restart_driver_leaves_each_subjob_s_fate_to_the_core() -> None:
    """laminar_agent.recovery gathers the facts (the process check, the exit record) and
    carries out what :meth:`AgentCore.recover` decides: of the core it calls only
    ``restore`` and ``recover``, never ``adopt``, ``lose`` or ``decide_exit`` itself."""
    import ast
    from pathlib import Path

    from laminar_agent import recovery

    tree = ast.parse(Path(recovery.__file__ or "").read_text())
    on_core = {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "core"
    }
    assert on_core == {"restore", "recover"}
