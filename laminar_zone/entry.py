"""A live job in the router's memory: the journaled message plus what placement needs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause, end_cause
from laminar_base.demand import Demand
from laminar_zone.queue import QueueItem

if TYPE_CHECKING:
    import asyncio


def queue_item(
    spec: zone_pb2.JobSpec, need: Demand, job_id: str = "", submitted_unix: float = 0.0
) -> QueueItem:
    """What queue order, backfill and quotas read of a job (a new one: no id, no time yet)."""
    return QueueItem(
        job_id=job_id,
        priority=spec.priority or common_pb2.BATCH,
        tenant=spec.tenant,
        submitted_unix=submitted_unix,
        need=need,
        gang_size=max(1, spec.gang_size),
        # A declared limit bounds the run when no estimate is given (as Slurm backfills).
        expected_seconds=spec.expected_seconds or spec.time_limit_seconds,
    )


def reclaimed_before(job: zone_pb2.Job) -> bool:
    """Whether the job's previous attempt ended because Airlock reclaimed a member under
    GPU-memory pressure (it is placed again, and may be killed again where pieces crowd)."""
    previous = job.attempts - 1
    return previous >= 1 and any(
        p.attempt == previous and end_cause(p.end_cause) is EndCause.RECLAIMED
        for p in job.placements
    )


@dataclass
class Entry:
    """A live job in memory: the journaled message plus what placement needs."""

    job: zone_pb2.Job
    need: Demand
    placing: bool = False
    queued_at: float = 0.0  # monotonic, when it last entered the queue
    submitted_mono: float = 0.0
    watchers: list[asyncio.Queue[zone_pb2.Job]] = field(default_factory=list)
    #: The submitter's bearer token, in memory only: a peer zone that takes the job by
    #: flow splitting authenticates the tenant with it, as its own Submit would.
    bearer: str = ""

    #: The item made for attempt ``_item_attempt`` (every queue pass and usage count reads
    #: it per job; its spec, need, id and submission time never change).
    _item: QueueItem | None = field(default=None, repr=False, compare=False)
    _item_attempt: int = field(default=-1, repr=False, compare=False)

    @property
    def item(self) -> QueueItem:
        """What the queue reads of the job, made once per attempt: a job whose last
        attempt Airlock reclaimed under GPU-memory pressure waits as restarted, keeping a
        claim on the slices that fit it (``QueueItem.is_restarted``), as the simulator's
        jobs requeued after a memory kill do."""
        if self._item is None or self._item_attempt != self.job.attempts:
            item = queue_item(self.job.spec, self.need, self.job.job_id, self.job.submitted_unix)
            if reclaimed_before(self.job):
                item = dataclasses.replace(item, is_restarted=True)
            self._item, self._item_attempt = item, self.job.attempts
        return self._item

    def current(self) -> list[zone_pb2.Placement]:
        """This attempt's subjobs, without copies that were moved elsewhere (re-addressed)."""
        return [
            p
            for p in self.job.placements
            if p.attempt == self.job.attempts and end_cause(p.end_cause) is not EndCause.READDRESSED
        ]
