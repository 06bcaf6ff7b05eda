"""What the router keeps and shows: journal writes and their watchers, recovery from the
journal, the learned target workload, and the gauges.

:class:`Persistence` writes jobs in one transaction with their usage rows (the ledger's
rows first), then tells each job's watchers (and its array's); reloads live jobs and
known agents after a restart (the core decides what each becomes,
:meth:`~laminar_zone.core.ZoneCore.recovered`); journals the task shapes the placer
observed, so a restarted router ranks by what it learned; and sets the gauges from the
core's :meth:`~laminar_zone.core.ZoneCore.census`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from laminar_api.v1 import zone_pb2
from laminar_base.causes import TERMINAL_JOB_STATES
from laminar_base.fragmentation import workload_from_rows, workload_rows
from laminar_base.wire import demand_of
from laminar_zone.atomizer import is_atomized
from laminar_zone.entry import Entry
from laminar_zone.placements import fresh

if TYPE_CHECKING:
    from laminar_zone.zone_parts import ZoneParts

log = logging.getLogger("laminar.zone.jobs")

#: Journal meta key of the task shapes this router observed (its target workload).
WORKLOAD_META = "workload"
#: Least time between two gauge refreshes by queue passes (the sweep refreshes always).
GAUGE_SECONDS = 0.5


class Persistence:
    """The journal's side of the router's jobs, their watchers, and the gauges."""

    def __init__(self, state: ZoneParts) -> None:
        self.state = state
        self._gauges_at = -math.inf
        #: Grouped writes waiting for the tick's commit, by job id (see :meth:`save_many`).
        self._grouped: dict[str, Entry] = {}
        #: Those of them whose watchers are told: any write of the job so far not quiet.
        self._told: set[str] = set()
        #: New jobs' records waiting for it (:meth:`journal_new`), by job id, and by
        #: (tenant, client_request_id) for Submit's idempotency lookup.
        self._new: dict[str, zone_pb2.Job] = {}
        self._new_requests: dict[tuple[str, str], zone_pb2.Job] = {}
        #: Resolved once what waits now is committed (None: nobody waits for it).
        self._committed: asyncio.Future[None] | None = None
        self._flush_handle: asyncio.Handle | None = None
        #: The target workload's count of observations last journaled (sweep).
        self._workload_saved = 0

    def save_many(
        self, entries: Sequence[Entry], *, grouped: bool = False, quiet: bool = False
    ) -> None:
        """Journal jobs in one write (usage rows first), then tell their watchers.

        ``grouped`` (group commit, :class:`~laminar_zone.core.Journal`): the jobs are
        written with the other grouped writes of this loop tick, in one commit at its end
        (:meth:`flush`); a write not grouped commits those waiting with its own, so the
        journal never holds a job older than one written after it. ``quiet``: their
        watchers are not told (unless a write of the same job in the same commit is not
        quiet)."""
        if grouped:
            for entry in entries:
                self._grouped[entry.job.job_id] = entry
                if not quiet:
                    self._told.add(entry.job.job_id)
            self._flush_soon()
            return
        self._commit(entries, quiet)

    def journal_new(self, jobs: Sequence[zone_pb2.Job]) -> asyncio.Future[None]:
        """Journal new jobs (Submit) in this tick's group commit; the future resolves once
        they are committed, with its error if it failed: a Submit awaits it before it
        answers (acknowledged only once durable), and concurrent Submits share one commit.
        Taken at once, so a Submit repeated in the same tick finds the job by its key
        (:meth:`new_by_request`) and, with no jobs, gets the same commit to wait for."""
        for job in jobs:
            self._new[job.job_id] = job
            if job.client_request_id:
                self._new_requests[(job.spec.tenant, job.client_request_id)] = job
        if self._committed is None:
            self._committed = asyncio.get_running_loop().create_future()
        done = self._committed
        self._flush_soon()
        return done

    def new_by_request(self, tenant: str, client_request_id: str) -> zone_pb2.Job | None:
        """A new job waiting for the tick's commit with this idempotency key (a Submit
        repeated before the first one was answered: the same job, once committed)."""
        return self._new_requests.get((tenant, client_request_id))

    def flush(self) -> None:
        """Commit the writes waiting (the tick's end, a probe about to leave, a read of the
        journal, shutdown); nothing when none wait."""
        if self._grouped or self._new or self._committed is not None:
            self._commit(())

    def _flush_soon(self) -> None:
        if self._flush_handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to end a tick (embedded use): commit now
            self.flush()
            return
        self._flush_handle = loop.call_soon(self.flush)

    def _commit(self, entries: Sequence[Entry], quiet: bool = False) -> None:
        """Write ``entries`` (``quiet``: told to no watcher) with everything waiting for the
        group commit, in one commit."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()  # a no-op when it is the one running
            self._flush_handle = None
        waiting, new, done = list(self._grouped.values()), list(self._new.values()), self._committed
        ids = {e.job.job_id for e in entries}
        told = self._told if quiet else self._told | ids
        self._grouped.clear()
        self._told = set()
        self._new.clear()
        self._new_requests.clear()
        self._committed = None
        entries = [*(e for e in waiting if e.job.job_id not in ids), *entries]
        try:
            if entries or new:
                self._write(entries, new, told)
        except Exception as exc:
            # Written by the next commit, but for jobs whose Submit fails now (dropped).
            failed = {job.job_id for job in new}
            for entry in waiting:
                job_id = entry.job.job_id
                if job_id not in failed and job_id not in self._grouped:
                    self._grouped[job_id] = entry
                    if job_id in told:
                        self._told.add(job_id)
            if done is not None and not done.done():
                done.set_exception(exc)
            raise
        if done is not None and not done.done():
            done.set_result(None)

    def _write(
        self,
        entries: Sequence[Entry],
        new: Sequence[zone_pb2.Job],
        told: set[str],
    ) -> None:
        """Journal ``entries`` and ``new`` in one commit, then tell the watchers of the
        entries in ``told``."""
        state = self.state
        jobs = [e.job for e in entries]
        ids = {job.job_id for job in jobs}
        with state.store.transaction():  # one commit for the usage rows and the jobs
            usage = state.usage_ledger.write(jobs, time.time())
            state.store.put_many([*jobs, *(job for job in new if job.job_id not in ids)])
        state.usage_ledger.written(usage)
        for entry in entries:
            if entry.job.job_id in told:
                self.publish(entry)
            state.forget_if_done(entry)

    def publish(self, entry: Entry) -> None:
        """Tell the job's watchers what it is now, and its array's that it changed."""
        array_watchers = self.state.array_watchers
        for queue in array_watchers.get(entry.job.array_id, ()) if entry.job.array_id else ():
            queue.put_nowait(entry.job)  # a wake-up: the watcher reads the array afresh
        if not entry.watchers:
            return
        snapshot = fresh(entry.job)
        for queue in entry.watchers:
            queue.put_nowait(snapshot)

    def recover(self) -> int:
        """Reload live jobs from the journal; returns how many."""
        state = self.state
        now = time.monotonic()
        self.restore_workload()
        for job in state.store.live():
            if job.spec.array:  # an array's record: its counts of ended elements
                state.core.recover_array(job)
                continue
            entry = Entry(job=job, need=demand_of(job.spec.resources), submitted_mono=now)
            state.usage_ledger.ends_known(job)
            atomized = is_atomized(job.spec)
            if atomized and job.state not in TERMINAL_JOB_STATES:
                state.atomizer.admit(job)
            state._do(state.core.recovered(entry, atomized, now))
        state.core.recalled_agents(state.store.known_agents(), time.time(), now)
        state.queue_wake.set()
        return len(state.entries)

    def save_workload(self) -> None:
        """Journal the task shapes this router observed when they changed (at most once a
        sweep): a restarted router ranks by what it learned, not from nothing."""
        workload = self.state.placer.workload
        if workload.observed == self._workload_saved:
            return
        self.state.store.set_meta(WORKLOAD_META, json.dumps(workload_rows(workload.own)))
        self._workload_saved = workload.observed

    def restore_workload(self) -> None:
        workload = self.state.placer.workload
        text = self.state.store.get_meta(WORKLOAD_META)
        if not text:
            return
        try:
            counts = workload_from_rows(json.loads(text), f"journal meta {WORKLOAD_META!r}")
        except (json.JSONDecodeError, ValueError) as exc:  # learned again from arrivals
            log.warning("ignoring the journaled target workload: %s", exc)
            return
        for shape, count in counts.items():
            workload.observe(shape, count)
        self._workload_saved = workload.observed
        log.info(
            "target workload restored from the journal: %d shapes, %d tasks",
            len(counts),
            sum(counts.values()),
        )

    def update_gauges(self, *, force: bool = False) -> None:
        """Set the job, queue and agent gauges: a scan of every live job and agent, so a
        pass (one per event) refreshes them at most every :data:`GAUGE_SECONDS`; the
        sweep (once per heartbeat period, at most 1 s) always does."""
        now = time.monotonic()
        if not force and now - self._gauges_at < GAUGE_SECONDS:
            return
        self._gauges_at = now
        census = self.state.core.census()
        metrics = self.state.metrics
        for state, count in census.jobs.items():
            metrics.jobs.labels(state).set(count)
        for priority, count in census.queued.items():
            metrics.queue_length.labels(priority).set(count)
        for status, count in census.agents.items():
            metrics.agents.labels(status).set(count)
