"""A live job in the router's memory: the journaled message plus what placement needs."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause, end_cause
from laminar_base.demand import Demand
from laminar_zone.queue import QueueItem


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

    @functools.cached_property
    def item(self) -> QueueItem:
        """What the queue reads of the job: made once (its spec, need, id and submission
        time never change), since every queue pass and usage count reads it per job."""
        return queue_item(self.job.spec, self.need, self.job.job_id, self.job.submitted_unix)

    def current(self) -> list[zone_pb2.Placement]:
        """This attempt's subjobs, without copies that were moved elsewhere (re-addressed)."""
        return [
            p
            for p in self.job.placements
            if p.attempt == self.job.attempts and end_cause(p.end_cause) is not EndCause.READDRESSED
        ]
