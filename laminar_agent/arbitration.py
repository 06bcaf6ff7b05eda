"""Probe batches and priority preemption, the driver's half: timing and waiting.

Probes arriving within one short batch window (``batch_seconds``, about 1 ms) are settled
together by the core in a deterministic order (priority class, then value, then arrival).

A probe with ``allow_preemption`` that bounces asks the core for strictly lower-priority
victims on slices that would then fit. The victims are reclaimed (SIGTERM, grace, SIGKILL)
while those slices are reserved for the probe; the lease is granted only once their
capacity is released in the ledger. Preemptions run one at a time. Which victims, why,
how long to wait and what a timeout answers are the core's
(:meth:`~laminar_agent.core.AgentCore.choose_preemption`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any

from laminar_agent.carrier import Carrier
from laminar_agent.ledger import Bounced, Granted, ProbeOrder

log = logging.getLogger("laminar.agent.node")

#: Stops a victim: (subjob id, the reason its stop journals) -> a coroutine that ends when
#: the stop has been carried out (the node's TERMINATE with cause PREEMPTED).
Reclaim = Callable[[str, str], Coroutine[Any, Any, None]]


class Arbiter:
    """Settles probes in batches and makes room for them by preemption."""

    def __init__(
        self,
        carrier: Carrier,
        reclaim: Reclaim,
        *,
        batch_seconds: float,
        preempt_grace_seconds: float,
        airlock_dry_run: bool,
    ) -> None:
        self.carrier = carrier
        self.core = carrier.core
        self.reclaim = reclaim
        self.batch_seconds = batch_seconds
        self.preempt_grace_seconds = preempt_grace_seconds
        #: Preemptions are only recorded, and the probe bounces (the server's reload sets it).
        self.airlock_dry_run = airlock_dry_run
        #: Probes waiting for their batch to be settled (summaries report it).
        self.pending_probes = 0
        self._pending: list[tuple[ProbeOrder, asyncio.Future[Granted | Bounced]]] = []
        # The batch collecting now settles when this timer fires (None: none collecting).
        self._batch_timer: asyncio.TimerHandle | None = None
        self._preempt_lock = asyncio.Lock()

    async def settle(self, order: ProbeOrder) -> Granted | Bounced:
        """``order``'s outcome in the batch it joins (one opens if none is collecting)."""
        future: asyncio.Future[Granted | Bounced] = asyncio.get_running_loop().create_future()
        self._pending.append((order, future))
        self.pending_probes += 1
        if self._batch_timer is None:  # collect concurrent probes into one batch
            self._batch_timer = asyncio.get_running_loop().call_later(
                self.batch_seconds, self._settle_batch
            )
        try:
            return await future
        finally:
            self.pending_probes -= 1

    def _settle_batch(self) -> None:
        """The batch window closed: the core settles what it collected. A timer callback,
        not a task sleeping through the window: no task, coroutine and sleep per batch.
        Should the core or the journal raise, each probe of the batch fails with it
        (rather than waiting for ever)."""
        self._batch_timer = None
        batch, self._pending = self._pending, []
        try:
            results, instructions = self.core.arbitrate(
                [order for order, _ in batch], time.monotonic(), time.time()
            )
            self.carrier.apply(instructions)
        except Exception as exc:
            log.exception("probe batch of %d not settled", len(batch))
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def preempt(self, order: ProbeOrder) -> tuple[Granted | Bounced, list[str]]:
        """Make room for ``order`` by reclaiming the holders the core chooses, then settle it.

        Returns the outcome and the victims' ids (empty when none were reclaimed).
        """
        async with self._preempt_lock:
            # Room may have appeared while an earlier preemption ran.
            again = await self.settle(replace(order, arrival_seq=self.core.next_arrival()))
            if isinstance(again, Granted):
                return again, []
            choice = self.core.choose_preemption(
                order,
                again,
                time.time(),
                dry_run=self.airlock_dry_run,
                grace_seconds=self.preempt_grace_seconds,
            )
            self.carrier.apply(choice.actions)
            if choice.bounce is not None:
                return choice.bounce, []
            victims = list(choice.victims)
            owner = f"preempt-{uuid.uuid4().hex[:12]}"
            self.core.reserve(owner, choice, time.monotonic())
            try:
                for victim in victims:
                    self.carrier.spawn(
                        self.reclaim(victim, choice.reasons[victim]), f"preempt-{victim}"
                    )
                if not await self._wait_ended(victims, choice.budget_seconds):
                    return self.core.preemption_timed_out(order, choice), victims
                result = await self.settle(
                    replace(order, arrival_seq=self.core.next_arrival(), owner=owner)
                )
            finally:
                self.core.unreserve(owner)
            log.info(
                "probe %s of job %s (%s): preempted %s on %s -> %s",
                order.probe_id,
                order.job_id,
                choice.priority_name,
                victims,
                list(choice.slice_ids),
                "lease" if isinstance(result, Granted) else f"bounce ({result.reason})",
            )
            return result, victims

    async def _wait_ended(self, subjob_ids: Sequence[str], timeout_seconds: float) -> bool:
        """Wait until every subjob is terminal, i.e. its capacity is released in the ledger."""
        waiter = asyncio.Event()
        self.carrier.waiters.add(waiter)
        deadline = time.monotonic() + timeout_seconds
        try:
            while any(self.core.subjob(s) is not None for s in subjob_ids):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                waiter.clear()
                try:
                    await asyncio.wait_for(waiter.wait(), left)
                except TimeoutError:
                    pass
            return True
        finally:
            self.carrier.waiters.discard(waiter)
