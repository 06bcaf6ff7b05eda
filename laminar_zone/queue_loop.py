"""The queue's root loop and its passes, driven: the steps of
:func:`laminar_zone.trying.pass_steps` carried out with awaits.

:class:`QueueLoop` runs a pass per wake or period, paced by
:func:`laminar_zone.core.pass_gap`; a pass walks every class, highest first, placing the
rigid jobs the walk starts (each awaited until its try waits on the network, then left to
finish beside the pass: :class:`laminar_zone.trying.PassTry`; a clearing round first waits
for the tries it must know of, :class:`laminar_zone.trying.SettleStarts`) and having the
atomizer clear that class's round. Which jobs start, and in what order, is the core's (:class:`laminar_zone.core.PassBook`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from laminar_zone.atomizer import MarketRound
from laminar_zone.core import pass_gap
from laminar_zone.entry import Entry
from laminar_zone.try_driver import CLOCK
from laminar_zone.trying import (
    ClearMarket,
    CloseRound,
    DoInstructions,
    OpenRound,
    SettleStarts,
    StartJob,
    pass_steps,
)

if TYPE_CHECKING:
    from laminar_zone.zone_parts import ZoneParts


class QueueLoop:
    """The queue's loop and one pass at a time (the queue's loop and the market's both run
    passes)."""

    def __init__(self, state: ZoneParts) -> None:
        self.state = state
        #: One pass at a time: the queue's loop and the market's both run queue_pass.
        self._pass_lock = asyncio.Lock()

    async def run(self, stop: asyncio.Event, beat: Callable[[], None] = lambda: None) -> None:
        """The queue's root loop: a pass (``ZoneState.queue_pass``) per wake or period. A
        pass that raises ends the loop; its supervisor logs it and restarts it
        (laminar_base.supervise).

        Passes start at least ``queue.min_pass_seconds`` apart, and a pass that took longer
        than that (a long queue) is followed by as long a pause: the event loop's CPU then
        goes at most half to queue passes, and placements, heartbeats and calls keep the
        rest (:func:`laminar_zone.core.pass_gap`)."""
        state = self.state
        period = state.config.queue.retry_seconds
        least = state.config.queue.min_pass_seconds
        next_at = -math.inf
        while not stop.is_set():
            beat()
            try:
                await asyncio.wait_for(state.queue_wake.wait(), period)
            except TimeoutError:
                pass
            early = next_at - time.monotonic()
            if early > 0:
                # Right after a pass: wakes until then are served by one.
                await asyncio.sleep(early)
            state.queue_wake.clear()
            started, cpu = time.monotonic(), time.thread_time()
            await state.queue_pass()
            next_at = started + pass_gap(least, time.thread_time() - cpu)

    async def one_pass(self) -> None:
        """One pass over all waiting work in one class order, the simulator's too
        (laminar_zone.queue.class_order): per priority class, highest first, the walk of its
        rigid jobs (each try awaited only until it waits on the network, without delaying a
        blocked head) and then its
        clearing round (the atomizer's), so a lower class's rigid job never takes a slice a
        higher class's bid would win. One pass at a time."""
        async with self._pass_lock:
            await self._one_pass()

    async def _one_pass(self) -> None:
        """Drive :func:`laminar_zone.trying.pass_steps`: the walk's starts are placed here
        (pipelined: :meth:`TryDriver.start_from_pass`), and the market's rounds cleared by the atomizer."""
        state = self.state
        steps = pass_steps(
            state.core,
            shares=state.shares,
            backfill=state.config.queue.backfill,
            rng=state.rng,
            clock=CLOCK,
        )
        answer: Any = None
        tries: dict[str, asyncio.Task[bool]] = {}  # the pass's pipelined tries, by job
        try:
            while True:
                try:
                    step = steps.send(answer)
                except StopIteration:
                    break
                answer = None
                match step:
                    case DoInstructions(instructions):
                        state._do(instructions)
                    case OpenRound(units, memory):
                        answer = await state.atomizer.open_round(units, memory)
                    case StartJob(entry):
                        answer, tries[entry.job.job_id] = await state.tries.start_from_pass(entry)
                    case SettleStarts(entries):
                        answer = await settled(entries, tries)
                    case ClearMarket(market, clear):
                        await state.atomizer.clear_class(cast(MarketRound, market), clear)
                    case CloseRound(market):
                        await state.atomizer.close_round(cast(MarketRound, market))
                    case _:
                        raise AssertionError(f"a pass step the router does not know: {step}")
        finally:
            steps.close()
        state.persistence.update_gauges()


async def settled(entries: Sequence[Entry], tries: Mapping[str, asyncio.Task[bool]]) -> list[Entry]:
    """The entries whose pass try placed them, once every one of those tries ended (one
    that raised placed nothing; its error is logged where the task ends)."""
    tasks = [tries[e.job.job_id] for e in entries]
    if tasks:
        await asyncio.wait(tasks)
    return [
        e
        for e, task in zip(entries, tasks, strict=True)
        if not task.cancelled() and task.exception() is None and task.result()
    ]
