"""A small seeded discrete-event engine with simulated time.

Events sit in a heap ordered by ``(time, sequence)``: two events due at the
same simulated instant run in the order they were scheduled, so a run is a
pure function of its seed and its inputs. Handlers are plain callables; they
read :attr:`Engine.now` and schedule more events. Nothing here sleeps or reads
the wall clock except :meth:`Engine.run`, which times itself to report events
per second.

Message delivery goes through an optional :class:`NetworkModel` hook
(:meth:`Engine.send`), so experiments that model network delay and loss share
one accounting of messages sent and lost. What is not covered: bandwidth,
reordering beyond what random delays cause, and clock skew between hosts.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

Handler = Callable[[], None]


@dataclass(order=True, slots=True)
class _Event:
    time_seconds: float
    seq: int
    handler: Handler = field(compare=False)
    cancelled: bool = field(default=False, compare=False)


@dataclass(frozen=True, slots=True)
class EventHandle:
    """Returned by :meth:`Engine.schedule`; pass it to :meth:`Engine.cancel`."""

    _event: _Event

    @property
    def time_seconds(self) -> float:
        return self._event.time_seconds


@dataclass(frozen=True, slots=True)
class RunStats:
    """What one :meth:`Engine.run` call did, for reports."""

    events_processed: int
    wall_seconds: float
    simulated_seconds: float

    @property
    def events_per_second(self) -> float:
        """Events handled per wall-clock second (0 when the run was too short to time)."""
        return self.events_processed / self.wall_seconds if self.wall_seconds > 0 else 0.0


class NetworkModel(Protocol):
    """Decides how long a message takes between two endpoints, or that it is lost."""

    def delay_seconds(self, rng: np.random.Generator, src: str, dst: str) -> float | None:
        """Seconds until delivery, or None when the message is lost."""
        ...


@dataclass(frozen=True, slots=True)
class FixedDelay:
    """Every message arrives after the same delay; none is lost."""

    seconds: float = 0.0

    def delay_seconds(self, rng: np.random.Generator, src: str, dst: str) -> float | None:
        return self.seconds


@dataclass(frozen=True, slots=True)
class LossyDelay:
    """Base delay plus exponential jitter; each message is lost with ``loss_ratio``."""

    base_seconds: float = 0.0005
    jitter_seconds: float = 0.0
    loss_ratio: float = 0.0

    def delay_seconds(self, rng: np.random.Generator, src: str, dst: str) -> float | None:
        if self.loss_ratio > 0 and rng.random() < self.loss_ratio:
            return None
        jitter = rng.exponential(self.jitter_seconds) if self.jitter_seconds > 0 else 0.0
        return self.base_seconds + float(jitter)


class Engine:
    """Heap of ``(time, seq, event)``; deterministic for a seed.

    ``rng`` is the one random stream handlers should draw from (directly or
    through generators spawned from it) so that a seed fixes the whole run.
    """

    def __init__(self, seed: int, network: NetworkModel | None = None) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.network: NetworkModel = network if network is not None else FixedDelay()
        self._heap: list[_Event] = []
        self._seq = 0
        self._now = 0.0
        self.events_processed = 0
        self.messages_sent = 0
        self.messages_lost = 0

    @property
    def now(self) -> float:
        """Simulated time in seconds."""
        return self._now

    @property
    def pending(self) -> int:
        """Events still queued (cancelled ones included until they surface)."""
        return len(self._heap)

    def schedule(self, delay_seconds: float, handler: Handler) -> EventHandle:
        """Run ``handler`` ``delay_seconds`` from now (0 runs after what is already due now)."""
        if delay_seconds < 0 or delay_seconds != delay_seconds:
            raise ValueError(f"delay_seconds must be >= 0, got {delay_seconds}")
        return self.schedule_at(self._now + delay_seconds, handler)

    def schedule_at(self, time_seconds: float, handler: Handler) -> EventHandle:
        """Run ``handler`` at absolute simulated time ``time_seconds`` (not in the past)."""
        if time_seconds < self._now:
            raise ValueError(f"cannot schedule at {time_seconds} before now ({self._now})")
        event = _Event(time_seconds, self._seq, handler)
        self._seq += 1
        heapq.heappush(self._heap, event)
        return EventHandle(event)

    def cancel(self, handle: EventHandle) -> None:
        """Drop a scheduled event; cancelling twice or after it ran is harmless."""
        handle._event.cancelled = True

    def send(self, src: str, dst: str, handler: Handler) -> EventHandle | None:
        """Deliver a message through the network model; None when it is lost."""
        self.messages_sent += 1
        delay = self.network.delay_seconds(self.rng, src, dst)
        if delay is None:
            self.messages_lost += 1
            return None
        return self.schedule(delay, handler)

    def run(self, until_seconds: float | None = None, max_events: int | None = None) -> RunStats:
        """Process events in order until the heap is empty, ``until_seconds`` or ``max_events``.

        Events due exactly at ``until_seconds`` still run; later ones stay queued
        and simulated time stops at ``until_seconds``.
        """
        started = time.perf_counter()
        start_sim = self._now
        processed = 0
        heap = self._heap
        while heap:
            if max_events is not None and processed >= max_events:
                break
            event = heap[0]
            if until_seconds is not None and event.time_seconds > until_seconds:
                break
            heapq.heappop(heap)
            if event.cancelled:
                continue
            self._now = event.time_seconds
            event.handler()
            processed += 1
        if (
            until_seconds is not None
            and until_seconds > self._now
            and (not heap or heap[0].time_seconds > until_seconds)
        ):
            self._now = until_seconds
        self.events_processed += processed
        return RunStats(processed, time.perf_counter() - started, self._now - start_sim)
