"""A subjob's start and end on this agent: commit -> executor -> launched or void, and exit.

A commit checks the spec, applies a MIG layout the lease needs
(:mod:`laminar_agent.mig_driver`), lets the core commit the lease (the subjob is journaled
STARTING), and has the executor launch it: the core then records it RUNNING, or FAILED
with ``launch_failed`` when the launch raised or its Commit call was cancelled. An exit
(the executor's callback, or an exit file found at a restart) is decided by the core; the
driver only reads what an atomized subjob's checkpoint covers to go with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from laminar_agent.carrier import Carrier, SpecFacts
from laminar_agent.core import SUCCEEDED, EndDecision, NewRow, TransitionRefused
from laminar_agent.executor import (
    ExitInfo,
    LaunchRefused,
    LaunchSpec,
    check_subjob_id,
    units_from_checkpoint,
)
from laminar_agent.inventory.fake import FakeGpuBackend
from laminar_agent.mig_driver import MigLayouts
from laminar_agent.subjob_reads import SubjobReads
from laminar_api.v1 import common_pb2
from laminar_base.errors import FailedPrecondition, InvalidArgument
from laminar_base.grpcutil import check_str
from laminar_base.wire import check_spec

log = logging.getLogger("laminar.agent.node")


def validate_spec(spec: common_pb2.SubjobSpec) -> None:
    check_subjob_id(spec.subjob_id, "spec.subjob_id", required=False)
    check_str(spec.job_id, "spec.job_id")
    check_str(spec.checkpoint_dir, "spec.checkpoint_dir", max_chars=4096)
    if spec.unit_count > 0 and not spec.checkpoint_dir.startswith("/"):
        raise InvalidArgument(
            "an atomized subjob (unit_count > 0) needs an absolute checkpoint directory",
            field="spec.checkpoint_dir",
        )
    check_spec(spec)


class Launches:
    """Commits leases to subjobs, launches them and records their exits."""

    def __init__(self, carrier: Carrier, mig: MigLayouts, reads: SubjobReads) -> None:
        self.carrier = carrier
        self.core = carrier.core
        self.mig = mig
        self.reads = reads

    async def commit(
        self,
        lease_id: str,
        spec: common_pb2.SubjobSpec,
        caller: str = "",
        *,
        checked: bool = False,
    ) -> common_pb2.Subjob:
        """``checked``: ``spec`` passed :func:`validate_spec` already (a probe that commits)."""
        check_str(lease_id, "lease_id", required=True)
        if not checked:
            validate_spec(spec)
        if not spec.subjob_id:
            spec.subjob_id = f"s-{uuid.uuid4().hex[:12]}"
        carrier = self.carrier
        if carrier.journal.has_subjob(spec.subjob_id):  # an ended one, too
            raise TransitionRefused(
                f"subjob {spec.subjob_id} already exists", field="spec.subjob_id"
            )
        carrier.expire()
        await self.mig.apply_for(lease_id)
        instructions = self.core.commit(
            lease_id,
            spec.subjob_id,
            spec.job_id,
            caller=caller,
            priority=int(spec.priority),
            lifecycle=int(spec.lifecycle) or common_pb2.LONG,
            now=time.monotonic(),
            now_unix=time.time(),
        )
        carrier.apply(instructions, spec)
        carrier.facts[spec.subjob_id] = SpecFacts.of(spec)
        new_row = next(i for i in instructions if isinstance(i, NewRow))
        devices = [carrier.devices[a.slice_id] for a in new_row.lease.allocations]
        if isinstance(carrier.backend, FakeGpuBackend) and devices:
            carrier.backend.attach_subjob(
                spec.subjob_id,
                devices,
                spec.resources.gpu_memory_bytes,
                carrier.executor.gpu_mem_file(spec.subjob_id),
            )
        try:
            pid = await carrier.executor.launch(
                LaunchSpec(
                    subjob_id=spec.subjob_id,
                    job_id=new_row.job_id,
                    command=list(spec.command),
                    env=dict(spec.env),
                    workdir=spec.workdir,
                    tenant=spec.tenant,
                    fenced=not spec.run_through_partitions,
                    device_uuids=devices,
                    unit_start=spec.unit_start,
                    unit_count=spec.unit_count,
                    checkpoint_dir=spec.checkpoint_dir,
                    grace_seconds=spec.grace_seconds or 10.0,
                    array_job_id=spec.array_job_id,
                    array_index=spec.array_index,
                )
            )
        except (Exception, asyncio.CancelledError) as exc:
            # Cancelled too (its Commit call ended): the executor voided the launch, and
            # the subjob is recorded failed rather than left neither launched nor ended.
            why = str(exc) or "the launch was cancelled (its Commit call ended)"
            carrier.apply(self.core.launch_failed(spec.subjob_id, why, time.time()))
            if isinstance(exc, LaunchRefused):
                # Surely not started: the router may place the job again at once, and
                # its reason reads why (not "internal error" and a confirmation).
                raise FailedPrecondition(f"subjob {spec.subjob_id} could not start: {why}") from exc
            raise
        # Its start is when the answer came; the process's identity goes with it for
        # a restart's adopt (the answer lags it under load, by seconds).
        pid_start = carrier.executor.pid_start(spec.subjob_id)
        carrier.apply(self.core.launched(spec.subjob_id, pid, time.time(), pid_start))
        # The one INFO line of a start (the executor's own is DEBUG); its end has one too.
        log.info(
            "subjob %s of job %s running as pid %d on %s%s",
            spec.subjob_id,
            new_row.job_id,
            pid,
            [a.slice_id for a in new_row.lease.allocations],
            f", units {spec.unit_start}+{spec.unit_count}" if spec.unit_count else "",
        )
        return self.reads.message(spec.subjob_id)

    async def on_exit(self, subjob_id: str, info: ExitInfo) -> None:
        """The executor's callback when a subjob's process ends."""
        try:
            self.record_exit(subjob_id, info, "")
        except TransitionRefused as exc:  # its end is recorded already
            log.debug("exit of subjob %s not recorded: %s", subjob_id, exc.message)

    def record_exit(self, subjob_id: str, info: ExitInfo, context: str) -> None:
        """The core decides the end; an atomized subjob's reason also says what its
        checkpoint covers."""
        self.record_end(subjob_id, self.core.decide_exit(subjob_id, info, context), info)

    def record_end(self, subjob_id: str, decision: EndDecision, info: ExitInfo) -> None:
        """Record the end the core decided for ``info``, with what an atomized subjob's
        checkpoint covers (read here)."""
        # Every live subjob has its facts: set in the step that makes it live (commit,
        # restart), dropped when it ends; decide_exit refused an ended one above.
        facts = self.carrier.facts[subjob_id]
        units_done, note = 0, ""
        if facts.unit_count > 0:
            units_done, note = units_from_checkpoint(
                facts.checkpoint_dir,
                facts.unit_start,
                facts.unit_count,
                decision.state == SUCCEEDED,
                owner_uid=self.carrier.executor.owner_uid(facts.tenant),
            )
        self.carrier.apply(
            self.core.exited(
                subjob_id, decision, info, time.time(), units_done=units_done, note=note
            )
        )
