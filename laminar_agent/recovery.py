"""An agent restart: the core is rebuilt from the journal's live rows, then each subjob's
facts are gathered here (is its journaled pid still its process? did it leave an exit
record?) and the core decides (:meth:`~laminar_agent.core.AgentCore.recover`): re-adopted,
ended as its exit record says (it ended while the agent was down), or lost.

Re-adopting holds the subjob's capacity again; capacity the ledger cannot hold (the
inventory changed under it) is killed rather than overcommitted, as the core decides.
"""

from __future__ import annotations

import json
import logging
import time

from laminar_agent.carrier import Carrier, SpecFacts
from laminar_agent.core import LIVE_STATES, Restarted, RestartFacts, RestoredSubjob
from laminar_agent.journal import SubjobRow
from laminar_agent.launch import Launches
from laminar_agent.ledger import Allocation
from laminar_api.v1 import common_pb2
from laminar_base.wire import demand_of

log = logging.getLogger("laminar.agent.node")


def restored(
    row: SubjobRow, spec: common_pb2.SubjobSpec, stopped_since_unix: float = 0.0
) -> RestoredSubjob:
    """A live journal row as the core takes it back (an old row's class defaults);
    ``stopped_since_unix``: when a SUSPENDED row's suspension began."""
    return RestoredSubjob(
        subjob_id=row.subjob_id,
        job_id=row.job_id,
        state=row.state,
        reason=row.reason,
        lease_id=row.lease_id,
        slice_ids=tuple(json.loads(row.slice_ids_json)),
        priority=int(spec.priority) or row.priority or common_pb2.BATCH,
        lifecycle=int(spec.lifecycle) or common_pb2.LONG,
        started_unix=row.started_unix,
        end_cause=row.end_cause,
        peak_gpu_memory_bytes=row.peak_gpu_memory_bytes,
        stopped_since_unix=stopped_since_unix,
    )


def recover(carrier: Carrier, launches: Launches) -> tuple[int, int]:
    """Re-adopt subjobs still running after an agent restart; mark the rest with a reason.
    Returns how many were re-adopted and how many were not (ended or lost)."""
    core, executor = carrier.core, carrier.executor
    adopted = lost = 0
    for row in carrier.journal.subjobs(states=list(LIVE_STATES)):
        spec = common_pb2.SubjobSpec.FromString(row.spec_blob)
        since = 0.0
        if row.state == "SUSPENDED":  # its stop goes on: count it from its event, as before
            newest = carrier.journal.last_events(row.subjob_id, 1)
            since = newest[0].at_unix if newest and newest[0].state == "SUSPENDED" else 0.0
        core.restore(restored(row, spec, since))
        carrier.facts[row.subjob_id] = SpecFacts.of(spec)
        # The process check re-attaches the executor to a match; only a process that is
        # not running may have left its exit record.
        is_running = row.pid > 0 and executor.adopt(
            row.subjob_id, row.pid, row.started_unix, pid_start=row.pid_start
        )
        info = None if is_running else executor.read_exit(row.subjob_id)
        facts = RestartFacts(
            is_running=is_running,
            exit=info,
            allocations=tuple(Allocation(**a) for a in json.loads(row.allocations_json or "[]")),
            lease_priority=row.priority or common_pb2.BATCH,
            demand=demand_of(spec.resources),
        )
        outcome = core.recover(row.subjob_id, facts, time.time())
        if outcome.fate is Restarted.LOST:
            # Nothing of a lost subjob may run on (its job is retried elsewhere): one
            # launched but not yet journaled with its pid when the agent died (pid 0) runs
            # in its cgroup, and a late start of its launch must find it void.
            executor.void(row.subjob_id)
        carrier.apply(outcome.instructions)
        if outcome.end is not None and info is not None:
            launches.record_end(row.subjob_id, outcome.end, info)
        if outcome.fate is Restarted.READOPTED:
            adopted += 1
            log.info("re-adopted subjob %s (pid %d)", row.subjob_id, row.pid)
        else:
            lost += 1
            log.info("subjob %s not re-adopted: %s", row.subjob_id, outcome.fate.value)
    return adopted, lost
