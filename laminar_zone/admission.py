"""New jobs in: Submit and SubmitBatch checked, journaled and started, and forwards to
peer zones carried out.

:class:`Admission` checks every request of a call before it takes any, answers a resent
request (same tenant and ``client_request_id``) with the job it made before, has the core
make and route the new jobs (:meth:`~laminar_zone.core.ZoneCore.new_entries`,
:meth:`~laminar_zone.core.ZoneCore.admit_new`, :meth:`~laminar_zone.core.ZoneCore.route`),
journals them in one write before the reply, and then starts them
(:meth:`~laminar_zone.core.ZoneCore.kick`): placed here, or offered to a peer by flow
splitting (the server's forwarder). Forwards unanswered at a restart are resent once the
server has its peers.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from laminar_api.v1 import zone_pb2
from laminar_base.errors import LaminarError
from laminar_base.grpcutil import check_count, check_str
from laminar_zone.atomizer import is_atomized
from laminar_zone.auth import DEFAULT_TENANT
from laminar_zone.core import NewJob
from laminar_zone.entry import Entry
from laminar_zone.placements import fresh
from laminar_zone.spec import MAX_BATCH_JOBS, validate_spec

log = logging.getLogger("laminar.zone")

if TYPE_CHECKING:
    from laminar_zone.zone_parts import ZoneParts

#: Resends a forward to the peer it names; True when the peer took the job.
Resume = Callable[[Entry, str], Coroutine[Any, Any, bool]]


class Admission:
    """Submissions and forwards of one router."""

    def __init__(self, state: ZoneParts) -> None:
        self.state = state
        #: Jobs whose forward to a peer was unanswered at a restart (the server resumes them).
        self.unanswered_forwards: list[Entry] = []

    async def submit(
        self,
        spec: zone_pb2.JobSpec,
        client_request_id: str,
        *,
        forwarded_from: str = "",
        allow_forward: bool = True,
        bearer: str = "",
    ) -> zone_pb2.Job:
        """Accept one job (Submit): as :meth:`submit_many`, its errors naming no item."""
        (job,) = await self.submit_many(
            [(spec, client_request_id)],
            forwarded_from=forwarded_from,
            allow_forward=allow_forward,
            bearer=bearer,
            name_items=False,
        )
        return job

    async def submit_many(
        self,
        requests: Sequence[tuple[zone_pb2.JobSpec, str]],
        *,
        forwarded_from: str = "",
        allow_forward: bool = True,
        bearer: str = "",
        name_items: bool = True,
    ) -> list[zone_pb2.Job]:
        """Accept jobs (Submit, SubmitBatch): every request is checked before any is taken
        (an error names ``requests[i]`` when ``name_items``), then all new jobs, array
        elements included, are journaled in one write and started. A request whose
        (tenant, client_request_id) was seen before returns that job again."""
        state, core = self.state, self.state.core
        check_count(requests, "requests", max_items=MAX_BATCH_JOBS)
        answers: list[zone_pb2.Job | list[Entry]] = []
        uncommitted = 0  # answers that are jobs another Submit is committing now
        taken: dict[tuple[str, str], int] = {}
        for i, (spec, request_id) in enumerate(requests):
            try:
                check_str(request_id, "client_request_id")
                if not spec.tenant:
                    spec.tenant = DEFAULT_TENANT
                if request_id and (spec.tenant, request_id) in taken:
                    answers.append(answers[taken[(spec.tenant, request_id)]])
                    continue
                existing = None
                if request_id:
                    existing = state.store.by_request(spec.tenant, request_id)
                    if existing is None:
                        existing = state.persistence.new_by_request(spec.tenant, request_id)
                        uncommitted += existing is not None
                if existing is not None:
                    answers.append(existing)
                    continue
                answers.append(self._new_entries(spec, request_id, forwarded_from, bearer))
                if request_id:
                    taken[(spec.tenant, request_id)] = i
            except LaminarError as exc:
                if name_items:
                    raise exc.within(f"requests[{i}]") from None
                raise
        new: list[Entry] = []
        seen: set[int] = set()
        for answer in answers:
            if isinstance(answer, list) and id(answer) not in seen:
                seen.add(id(answer))
                new.extend(answer)
        may_forward = allow_forward and state.forwarder is not None
        work: list[Entry] = []  # all but arrays' own records, whose elements are the work
        for entry in new:
            if not core.admit_new(entry, time.time()):
                continue
            if is_atomized(entry.job.spec):
                state.atomizer.admit(entry.job)
            state._do(core.route(entry, may_forward, time.monotonic()))
            work.append(entry)
        # The new jobs are in the core now: what comes of them (committed and started, or
        # dropped) must not hang on this caller, whose call may end (cancelled) while the
        # commit is awaited; a job committed but never started would wait until a restart.
        committed = None  # acknowledged once durable, in the tick's group commit
        if new or uncommitted:
            committed = state.persistence.journal_new([e.job for e in new])
        settled = asyncio.ensure_future(self._settle(new, work, committed, may_forward))
        settled.add_done_callback(_retrieved)
        await asyncio.shield(settled)
        return [fresh(answer[0].job if isinstance(answer, list) else answer) for answer in answers]

    async def _settle(
        self,
        new: list[Entry],
        work: list[Entry],
        committed: asyncio.Future[None] | None,
        may_forward: bool,
    ) -> None:
        """Acknowledge once durable (the tick's group commit the new jobs were handed to),
        then start the work; a failed commit drops the new jobs and raises."""
        state, core = self.state, self.state.core
        try:
            if committed is not None:
                await committed
        except Exception:
            for entry in new:
                core.drop(entry.job.job_id)
                state.atomizer.forget(entry.job.job_id)
            raise
        state.metrics.submitted.inc(len(work))
        for entry in work:
            state._do(core.kick(entry, may_forward))

    def _new_entries(
        self, spec: zone_pb2.JobSpec, request_id: str, forwarded_from: str, bearer: str
    ) -> list[Entry]:
        """Check one new job's input and let the core make its record (an array: its
        record, then its elements'); nothing is kept yet."""
        need = validate_spec(spec)
        for dep in spec.after:
            check_str(dep, "spec.after", required=True)
        return self.state.core.new_entries(
            spec,
            need,
            NewJob(
                job_id=f"j-{uuid.uuid4().hex[:10]}",
                zone=self.state.zone_name,
                request_id=request_id,
                forwarded_from=forwarded_from,
                bearer=bearer,
            ),
            time.time(),
            time.monotonic(),
        )

    # ---------------------------------------------------------------- forwards

    async def forward_or_place(self, entry: Entry) -> None:
        """Offer the job to a peer (flow splitting picks it); the core hears the answer."""
        state = self.state
        assert state.forwarder is not None
        taken = await state.forwarder(entry)
        await state._run(state.core.forwarded(entry, taken, time.monotonic()))

    def resume_forwards(self, resume: Resume) -> None:
        """Resend the forwards that were unanswered at a restart; a definite refusal places
        the job here."""
        pending, self.unanswered_forwards = self.unanswered_forwards, []
        for entry in pending:
            target = entry.job.forwarded_to.removeprefix("pending:")
            self.state.spawn(self._resume_forward(entry, target, resume), f"fwd-{entry.job.job_id}")

    async def _resume_forward(self, entry: Entry, target: str, resume: Resume) -> None:
        taken = await resume(entry, target)
        core = self.state.core
        await self.state._run(
            core.forwarded(entry, taken, time.monotonic())
            if taken
            else core.keep_here(entry, time.monotonic())
        )


def _retrieved(task: asyncio.Future[None]) -> None:
    """Read a settled submit's outcome, so one whose caller was cancelled is not reported
    as never retrieved; its error (a failed commit: the jobs were dropped) is logged."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("submitted jobs not kept: %s", exc)
