"""An agent restart: the core is rebuilt from the journal's live rows, then each subjob is
re-adopted (its process still runs), ended as its exit file says (it ended while the agent
was down), or lost (gone without a record).

Re-adopting holds the subjob's capacity again; capacity the ledger cannot hold (the
inventory changed under it) is killed rather than overcommitted, as the core decides.
"""

from __future__ import annotations

import json
import logging
import time

from laminar_agent.carrier import Carrier, SpecFacts
from laminar_agent.core import LIVE_STATES, RestoredSubjob
from laminar_agent.journal import SubjobRow
from laminar_agent.launch import Launches
from laminar_agent.ledger import Allocation
from laminar_api.v1 import common_pb2
from laminar_base.wire import demand_of

log = logging.getLogger("laminar.agent.node")


def restored(row: SubjobRow, spec: common_pb2.SubjobSpec) -> RestoredSubjob:
    """A live journal row as the core takes it back (an old row's class defaults)."""
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
    )


def recover(carrier: Carrier, launches: Launches) -> tuple[int, int]:
    """Re-adopt subjobs still running after an agent restart; mark the rest with a reason.
    Returns how many were re-adopted and how many were not (ended or lost)."""
    core, executor = carrier.core, carrier.executor
    adopted = lost = 0
    for row in carrier.journal.subjobs(states=list(LIVE_STATES)):
        spec = common_pb2.SubjobSpec.FromString(row.spec_blob)
        core.restore(restored(row, spec))
        carrier.facts[row.subjob_id] = SpecFacts.of(spec)
        if row.pid and executor.adopt(
            row.subjob_id, row.pid, row.started_unix, pid_started_unix=row.pid_started_unix
        ):
            allocations = [Allocation(**a) for a in json.loads(row.allocations_json or "[]")]
            # The host CPU and memory it holds: what its demand takes here, as at its probe.
            cpu, memory = core.ledger.host_need(demand_of(spec.resources))
            refused = core.adopt(
                row.subjob_id,
                allocations,
                row.priority or common_pb2.BATCH,
                cpu_milli=cpu,
                host_memory_bytes=memory,
            )
            carrier.apply(refused)  # its capacity cannot be held: it is stopped
            if refused:
                lost += 1
            else:
                adopted += 1
                log.info("re-adopted subjob %s (pid %d)", row.subjob_id, row.pid)
            continue
        info = executor.read_exit(row.subjob_id)
        if info is not None:
            launches.record_exit(row.subjob_id, info, "ended while the agent was down")
        else:
            carrier.apply(core.lose(row.subjob_id, time.time()))
        lost += 1
    return adopted, lost
