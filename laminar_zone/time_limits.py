"""The time-limit clock of rigid jobs (``JobSpec.time_limit_seconds``, Slurm's ``--time``):
which running subjob is past its limit, with no I/O; the router stops each one it names
(SIGTERM, its grace, SIGKILL) with ``EndCause.TIME_LIMIT``, and its job then fails with no
retry (:data:`laminar_base.causes.FINAL_CAUSES`).

A run's clock starts when its subjob started. Time Airlock held it suspended does not
count, as far as its agent last reported (``Placement.suspended_seconds``), and a subjob
suspended right now is looked at again a period later. Each subjob is on the clock at
most once and named at most once; a stop its agent did not take is the router's to ask
again (its owed stops), not the clock's."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import LIVE_SUBJOB_STATES
from laminar_zone.placements import placement_of


class TimeLimits:
    def __init__(self, recheck_seconds: float) -> None:
        #: How long after now a subjob suspended at its limit is looked at again.
        self.recheck_seconds = recheck_seconds
        #: (when it is due, unix time; job id; subjob id), earliest first.
        self._heap: list[tuple[float, str, str]] = []
        self._watched: set[str] = set()
        self._named: set[str] = set()

    def watch(self, job: zone_pb2.Job, current: Iterable[zone_pb2.Placement]) -> None:
        """Put the started, live subjobs of ``job``'s current attempt on the clock (a job
        with a limit; each subjob once)."""
        limit = job.spec.time_limit_seconds
        if not limit:
            return
        for p in current:
            if (
                p.state in LIVE_SUBJOB_STATES
                and p.started_unix
                and p.subjob_id not in self._watched
            ):
                self._watched.add(p.subjob_id)
                due = p.started_unix + limit + p.suspended_seconds
                heapq.heappush(self._heap, (due, job.job_id, p.subjob_id))

    def due(
        self, now_unix: float, job_of: Callable[[str], zone_pb2.Job | None]
    ) -> list[tuple[zone_pb2.Placement, str]]:
        """The live subjobs past their limit at ``now_unix``, each with the reason to give
        (named once); ``job_of`` reads a live job by id (None: gone)."""
        out: list[tuple[zone_pb2.Placement, str]] = []
        while self._heap and self._heap[0][0] <= now_unix:
            _, job_id, subjob_id = heapq.heappop(self._heap)
            job = job_of(job_id)
            placement = placement_of(job, subjob_id)
            if job is None or placement is None or placement.state not in LIVE_SUBJOB_STATES:
                self._watched.discard(subjob_id)
                continue
            limit = job.spec.time_limit_seconds
            due = placement.started_unix + limit + placement.suspended_seconds
            if placement.state == common_pb2.SUSPENDED or due > now_unix:
                later = max(due, now_unix + self.recheck_seconds)
                heapq.heappush(self._heap, (later, job_id, subjob_id))
                continue
            if subjob_id in self._named:
                continue
            self._named.add(subjob_id)
            ran = now_unix - placement.started_unix - placement.suspended_seconds
            out.append(
                (
                    placement,
                    f"time limit: ran {ran:.0f} s, past its limit of {limit:g} s "
                    "(spec.time_limit_seconds)",
                )
            )
        return out

    def forget(self, subjob_ids: Iterable[str]) -> None:
        """The job is done with these subjobs (it ended and is forgotten)."""
        for subjob_id in subjob_ids:
            self._watched.discard(subjob_id)
            self._named.discard(subjob_id)
