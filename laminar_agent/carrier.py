"""The agent's I/O parts that every driver shares, and the one place where the decision core's
instructions are carried out.

:class:`Carrier` holds the core, the journal, the executor and the inventory backend, the
maps the API needs from them (slice -> device, device -> slice name, each live subjob's
:class:`SpecFacts`) and the watchers that subjob events wake. Its :meth:`Carrier.apply`
turns a list of :data:`~laminar_agent.core.Instruction` into journal writes (one
transaction a call), lease rows, Airlock reclaim records, kills and log lines, in order;
it decides nothing (``laminar_agent.core`` has every decision). It also keeps the subjob
rows it wrote as they were committed (:meth:`Carrier.row`), so that what the API and the
heartbeats show of a subjob is not read back from the journal it was just written to.

The drivers that feed the core events: :mod:`laminar_agent.arbitration` (probe batches
and preemption), :mod:`laminar_agent.launch` (commit, launch, exit),
:mod:`laminar_agent.recovery` (restart), :mod:`laminar_agent.mig_driver` (MIG layouts);
:mod:`laminar_agent.node` wires them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, assert_never

from laminar_agent.core import (
    AgentCore,
    DropLease,
    Ended,
    Instruction,
    KeepLease,
    Kill,
    NewRow,
    RecordEvent,
    RecordReclaim,
    WriteRow,
    merge_row_writes,
)
from laminar_agent.executor import Executor
from laminar_agent.inventory import GpuBackend
from laminar_agent.inventory.fake import FakeGpuBackend
from laminar_agent.journal import Journal, SubjobRow
from laminar_agent.ledger import LeaseRecord, Slice
from laminar_agent.metrics import AgentMetrics
from laminar_api.v1 import common_pb2

log = logging.getLogger("laminar.agent.node")

#: Ended subjobs whose rows :class:`Carrier` keeps in memory (their end event's heartbeat,
#: a GetSubjob after the end), newest kept; older ones are read from the journal.
ENDED_ROWS_KEPT = 1024
#: A row whose stored spec (command and environment, up to 512 KiB) is larger is not kept:
#: the kept rows stay within (live + :data:`ENDED_ROWS_KEPT`) x this, 16 MiB past the live.
KEPT_ROW_MAX_SPEC_BYTES = 16 * 1024


@dataclass(frozen=True)
class SpecFacts:
    """What the node reads from a live subjob's spec after its commit (its end, the windows
    of each heartbeat), kept from the commit or the restart so that nothing re-reads and
    re-parses the stored spec for it."""

    tenant: str
    unit_start: int
    unit_count: int
    checkpoint_dir: str
    expected_seconds: float

    @classmethod
    def of(cls, spec: common_pb2.SubjobSpec) -> SpecFacts:
        return cls(
            spec.tenant,
            spec.unit_start,
            spec.unit_count,
            spec.checkpoint_dir,
            spec.expected_seconds,
        )


@dataclass(frozen=True)
class _RowChange:
    """One change a batch makes to the journal's subjob rows (kept once it commits):
    ``key`` is the subjob's id, or the lease's for ``lease_dropped``; with neither ``new``
    nor ``fields`` nor ``lease_dropped``, the subjob ended."""

    key: str
    new: SubjobRow | None = None
    fields: Mapping[str, object] | None = None
    lease_dropped: bool = False


class Carrier:
    """The core with the I/O its instructions reach. ``devices`` (slice id -> device UUID)
    and ``slice_names`` (device UUID -> slice id) start from the inventory's ``slices``; a
    MIG layout applied on demand adds to both."""

    def __init__(
        self,
        core: AgentCore,
        journal: Journal,
        executor: Executor,
        backend: GpuBackend,
        slices: Sequence[Slice],
        metrics: AgentMetrics | None,
    ) -> None:
        self.core = core
        self.journal = journal
        self.executor = executor
        self.backend = backend
        self.metrics = metrics
        self.devices = {s.slice_id: s.device_uuid for s in slices}
        #: Device UUID -> slice name, for what Airlock shows (it reads memory per device).
        self.slice_names = {s.device_uuid: s.slice_id for s in slices}
        for gpu in backend.gpus():
            self.slice_names.setdefault(gpu.uuid, f"gpu{gpu.index}")
        #: Live subjobs' spec facts (:class:`SpecFacts`), dropped at their end.
        self.facts: dict[str, SpecFacts] = {}
        #: Set on every subjob transition (heartbeats and Watch streams wait on them).
        self.waiters: set[asyncio.Event] = set()
        self._background: set[asyncio.Task[None]] = set()
        #: The journal's rows of the subjobs this process wrote (every live one it committed,
        #: the last :data:`ENDED_ROWS_KEPT` ended), as they were committed: the reply to a
        #: commit and each event's message are built from them instead of read back from
        #: the journal. Subjobs re-adopted at a restart are not here (read from the journal).
        self._rows: dict[str, SubjobRow] = {}
        self._ended_rows: OrderedDict[str, SubjobRow] = OrderedDict()
        #: Kept rows by their journaled lease (the journal joins the lease's columns).
        self._lease_rows: dict[str, SubjobRow] = {}

    def apply(
        self, instructions: Iterable[Instruction], spec: common_pb2.SubjobSpec | None = None
    ) -> None:
        """Do what the core decided, in order; ``spec`` is the new subjob's, for a NewRow.
        The journal writes of one call commit as one transaction."""
        rows: list[_RowChange] = []
        nested = self.journal.in_batch
        with self.journal.batch():  # raises, rolled back: the kept rows stay as committed
            woken = self._carry_out(instructions, spec, rows)
        if nested:  # not committed yet, and the outer batch may roll back: keep none
            self._rows.clear()
            self._ended_rows.clear()
            self._lease_rows.clear()
        else:
            self._keep_rows(rows)
        if woken:
            for waiter in list(self.waiters):
                waiter.set()

    def expire(self) -> None:
        """Drop the uncommitted leases whose TTL has passed (nothing to carry out, most
        calls: no batch is opened for none)."""
        instructions = self.core.expire(time.monotonic())
        if instructions:
            self.apply(instructions)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``coro`` to completion even if the RPC that started it is cancelled."""
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def cancel_background(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    def row(self, subjob_id: str) -> SubjobRow | None:
        """The committed journal row of ``subjob_id`` as this process wrote it (None: not
        kept, read the journal). The caller must not change it."""
        row = self._rows.get(subjob_id)
        return self._ended_rows.get(subjob_id) if row is None else row

    def _keep_rows(self, rows: list[_RowChange]) -> None:
        """Bring the kept rows to what the batch just committed: a new row, a write to a
        kept row's fields, a dropped lease (the journal joins its columns no more), an end
        (the row moves to the ended ones)."""
        for change in rows:
            if change.new is not None:
                if len(change.new.spec_blob) <= KEPT_ROW_MAX_SPEC_BYTES:
                    self._rows[change.key] = change.new
                    self._lease_rows[change.new.lease_id] = change.new
            elif change.fields is not None:
                kept = self.row(change.key)
                if kept is not None:
                    for name, value in change.fields.items():
                        setattr(kept, name, value)
            elif change.lease_dropped:
                kept = self._lease_rows.pop(change.key, None)
                if kept is not None:
                    kept.allocations_json, kept.priority = "", 0
            else:
                kept = self._rows.pop(change.key, None)
                if kept is not None:
                    self._ended_rows[change.key] = kept
                    if len(self._ended_rows) > ENDED_ROWS_KEPT:
                        self._ended_rows.popitem(last=False)

    def _carry_out(
        self,
        instructions: Iterable[Instruction],
        spec: common_pb2.SubjobSpec | None,
        rows: list[_RowChange],
    ) -> bool:
        """The instructions, in order; whether any journaled an event (watchers wake).
        ``rows`` gains each change to a subjob row, kept once the batch commits."""
        woken = False
        for ins in merge_row_writes(instructions):
            if isinstance(ins, WriteRow):
                self.journal.update_subjob(ins.subjob_id, **ins.fields)
                rows.append(_RowChange(ins.subjob_id, fields=ins.fields))
            elif isinstance(ins, RecordEvent):
                self.journal.append_event(ins.subjob_id, ins.state, ins.reason, ins.at_unix)
                woken = True
            elif isinstance(ins, KeepLease):
                if ins.subjob_id:  # uncommitted leases live in memory only
                    joined = self._journal_lease(ins.lease, ins.subjob_id, ins.at_unix)
                    rows.append(_RowChange(ins.subjob_id, fields=joined))
            elif isinstance(ins, DropLease):
                if ins.journaled:
                    self.journal.delete_lease(ins.lease_id)
                    rows.append(_RowChange(ins.lease_id, lease_dropped=True))
                log.debug("lease %s for job %s %s", ins.lease_id, ins.job_id, ins.why)
            elif isinstance(ins, NewRow):
                assert spec is not None, "a new row needs its spec"
                row = self._new_row(ins, spec)
                self.journal.put_subjob(row)
                rows.append(_RowChange(ins.subjob_id, new=row))
            elif isinstance(ins, Ended):
                rows.append(_RowChange(ins.subjob_id))
                self.facts.pop(ins.subjob_id, None)
                if isinstance(self.backend, FakeGpuBackend):
                    self.backend.detach_subjob(ins.subjob_id)
                log.info(
                    "subjob %s %s (%s): %s",
                    ins.subjob_id,
                    ins.state.lower(),
                    ins.cause.token,
                    ins.reason,
                )
            elif isinstance(ins, Kill):
                log.error("stopping subjob %s: its capacity cannot be re-adopted", ins.subjob_id)
                self.executor.kill(ins.subjob_id)
            elif isinstance(ins, RecordReclaim):
                self._record_reclaim(ins)
            else:
                assert_never(ins)
        return woken

    def _new_row(self, ins: NewRow, spec: common_pb2.SubjobSpec) -> SubjobRow:
        slice_ids = [a.slice_id for a in ins.lease.allocations]
        return SubjobRow(
            subjob_id=ins.subjob_id,
            job_id=ins.job_id,
            spec_blob=spec.SerializeToString(),
            state=ins.state,
            reason=ins.reason,
            slice_ids_json=json.dumps(slice_ids),
            device_uuids_json=json.dumps([self.devices[s] for s in slice_ids]),
            created_unix=ins.created_unix,
            exit_code=0,
            signal=0,
            lease_id=ins.lease.lease_id,
        )

    def _journal_lease(
        self, lease: LeaseRecord, subjob_id: str, at_unix: float
    ) -> dict[str, object]:
        """Journal a committed lease; returns the columns the journal joins from it to its
        subjob's row."""
        allocations_json = json.dumps([a.__dict__ for a in lease.allocations])
        self.journal.put_lease(
            lease.lease_id,
            lease.job_id,
            lease.member,
            allocations_json,
            lease.score,
            lease.priority,
            bool(subjob_id),
            subjob_id,
            at_unix,
        )
        return {"allocations_json": allocations_json, "priority": lease.priority}

    def _record_reclaim(self, ins: RecordReclaim) -> None:
        self.journal.append_action(
            "reclaim",
            ins.subjob_id,
            ins.slice_id,
            ins.reason,
            ins.bytes_freed,
            ins.dry_run,
            end_cause=ins.cause.token,
        )
        log.info(
            "airlock %sreclaim subjob %s on %s: %s",
            "(dry-run) " if ins.dry_run else "",
            ins.subjob_id,
            ins.slice_id,
            ins.reason,
        )
        if self.metrics is not None:
            self.metrics.record_airlock_action(
                "reclaim",
                "preempted",
                resource="ledger",
                bytes_freed=ins.bytes_freed,
                work_lost_gpu_seconds=ins.work_lost_gpu_seconds,
                dry_run=ins.dry_run,
            )
