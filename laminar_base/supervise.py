"""Guarded root tasks: each daemon's long-running loops, watched by one supervisor.

A root loop that raises is logged with its traceback and restarted after a
backoff (0.1 s doubling to 30 s; back to 0.1 s once a run lasted a minute), or,
when it is marked fatal, the daemon is asked to stop and exits non-zero. A loop
that returns without being asked to stop counts as a failure too. Each loop
calls the ``beat`` it is given once per pass; the daemon is healthy only while
every loop is running (not waiting out a backoff) and has beaten within its own
quiet time. A (re)started loop counts as having made progress at its start.

:meth:`Supervisor.check` is the decision, free of I/O: it takes the time and
says whether health changed and whether the systemd watchdog is due.
:meth:`Supervisor.watch` is the driver that carries those out from the event
loop, so a wedged event loop or a quiet loop both starve the watchdog.
The clock and the sleep are injected, so tests need neither real time nor sleeps.

Not covered: a loop that blocks the event loop itself (a synchronous call that
never returns) is seen by no one inside the process; the systemd watchdog,
starved by the same blocked loop, is what restarts the daemon then.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from collections.abc import Awaitable, Callable

#: A loop's body: called with the ``beat`` it reports progress with.
LoopBody = Callable[[Callable[[], None]], Awaitable[None]]


class LoopState(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    BACKOFF = "backoff"
    FAILED = "failed"
    STOPPED = "stopped"


class RootLoopFailed(Exception):
    """A fatal root loop failed: the daemon stopped and exits with status 1."""


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Restart delays: ``initial_seconds`` doubling (``factor``) up to ``cap_seconds``;
    a run that lasted ``reset_after_seconds`` before it failed starts over at
    ``initial_seconds``."""

    initial_seconds: float = 0.1
    factor: float = 2.0
    cap_seconds: float = 30.0
    reset_after_seconds: float = 60.0

    def next_delay(self, previous_seconds: float | None, ran_seconds: float) -> float:
        """The delay before the next restart, given the last one (None: none yet) and how
        long the failed run lasted."""
        if previous_seconds is None or ran_seconds >= self.reset_after_seconds:
            return min(self.initial_seconds, self.cap_seconds)
        return min(previous_seconds * self.factor, self.cap_seconds)


@dataclasses.dataclass
class RootLoop:
    """One supervised loop and what the supervisor knows of it."""

    name: str
    body: LoopBody
    #: Longest a running loop may go without a beat and still count as healthy.
    quiet_seconds: float
    #: Whether a failure ends the daemon instead of a restart.
    fatal: bool = False
    state: LoopState = LoopState.CREATED
    started_at: float = 0.0
    last_beat: float = 0.0
    failures: int = 0
    delay_seconds: float | None = None
    restart_at: float = 0.0
    task: asyncio.Task[None] | None = None


@dataclasses.dataclass(frozen=True)
class Check:
    """What :meth:`Supervisor.check` decided at one instant."""

    healthy: bool
    #: Health differs from the last check (the first check counts as a change only if
    #: unhealthy, as daemons start SERVING).
    changed: bool
    #: Send WATCHDOG=1 now.
    ping_watchdog: bool
    #: One line per loop that is not healthy, with the numbers behind it.
    problems: tuple[str, ...]


class Supervisor:
    def __init__(
        self,
        log: logging.Logger,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        backoff: Backoff = Backoff(),
        on_fatal: Callable[[str], None] | None = None,
        watchdog_interval_seconds: float | None = None,
    ) -> None:
        """``on_fatal`` is called with one line when a fatal loop fails (the daemon sets
        its stop event there); ``watchdog_interval_seconds`` is how often WATCHDOG=1 is
        due (None: no watchdog)."""
        self._log = log
        self._clock = clock
        self._sleep = sleep
        self.backoff = backoff
        self._on_fatal = on_fatal
        self.watchdog_interval_seconds = watchdog_interval_seconds
        self.loops: dict[str, RootLoop] = {}
        self.failure: str | None = None
        self._stopping = False
        self._healthy = True
        self._last_watchdog: float | None = None
        self._watch_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ loops

    def add(
        self, name: str, body: LoopBody, *, quiet_seconds: float, fatal: bool = False
    ) -> RootLoop:
        """Register a root loop; :meth:`start` starts it (or it starts at once if the
        supervisor already runs)."""
        if name in self.loops:
            raise ValueError(f"root loop {name} added twice")
        loop = self.loops[name] = RootLoop(name, body, quiet_seconds, fatal)
        return loop

    def start(self) -> None:
        """Start every loop not yet started, each as a named asyncio task."""
        for loop in self.loops.values():
            if loop.task is None:
                loop.task = asyncio.create_task(self._guard(loop), name=loop.name)

    def beat(self, name: str) -> None:
        """The loop ``name`` made progress now."""
        self.loops[name].last_beat = self._clock()

    async def _guard(self, loop: RootLoop) -> None:
        def beat() -> None:
            loop.last_beat = self._clock()

        while True:
            loop.state = LoopState.RUNNING
            loop.started_at = loop.last_beat = self._clock()
            try:
                await loop.body(beat)
            except asyncio.CancelledError:
                loop.state = LoopState.STOPPED
                raise
            except Exception:
                ran = self._clock() - loop.started_at
                loop.failures += 1
                if loop.fatal:
                    self._log.exception(
                        "root loop %s failed after %.1f s: it is fatal, the daemon stops",
                        loop.name,
                        ran,
                    )
                else:
                    delay = self._next_delay(loop, ran)
                    self._log.exception(
                        "root loop %s failed after %.1f s (failure %d): restarting in %.1f s",
                        loop.name,
                        ran,
                        loop.failures,
                        delay,
                    )
            else:
                if self._stopping:
                    loop.state = LoopState.STOPPED
                    return
                ran = self._clock() - loop.started_at
                loop.failures += 1
                if loop.fatal:
                    self._log.error(
                        "root loop %s ended after %.1f s without being asked to: it is "
                        "fatal, the daemon stops",
                        loop.name,
                        ran,
                    )
                else:
                    delay = self._next_delay(loop, ran)
                    self._log.error(
                        "root loop %s ended after %.1f s without being asked to "
                        "(failure %d): restarting in %.1f s",
                        loop.name,
                        ran,
                        loop.failures,
                        delay,
                    )
            if loop.fatal:
                loop.state = LoopState.FAILED
                self._fail(f"root loop {loop.name} failed")
                return
            assert loop.delay_seconds is not None
            loop.state = LoopState.BACKOFF
            loop.restart_at = self._clock() + loop.delay_seconds
            try:
                await self._sleep(loop.delay_seconds)
            except asyncio.CancelledError:
                loop.state = LoopState.STOPPED
                raise
            if self._stopping:
                loop.state = LoopState.STOPPED
                return
            self._log.info("root loop %s restarting (failure %d)", loop.name, loop.failures)

    def _next_delay(self, loop: RootLoop, ran_seconds: float) -> float:
        loop.delay_seconds = self.backoff.next_delay(loop.delay_seconds, ran_seconds)
        return loop.delay_seconds

    def _fail(self, why: str) -> None:
        if self.failure is None:
            self.failure = why
            if self._on_fatal is not None:
                self._on_fatal(why)

    # ------------------------------------------------------------ health

    def problems(self, now: float) -> list[str]:
        """One line per loop that is not healthy at ``now`` (empty: healthy)."""
        out = []
        for loop in self.loops.values():
            if loop.state is LoopState.BACKOFF:
                out.append(
                    f"{loop.name}: failed {loop.failures} time(s), restarting in "
                    f"{max(0.0, loop.restart_at - now):.1f} s"
                )
            elif loop.state is LoopState.RUNNING:
                quiet = now - loop.last_beat
                if quiet > loop.quiet_seconds:
                    out.append(
                        f"{loop.name}: no progress for {quiet:.1f} s "
                        f"(allowed {loop.quiet_seconds:.1f} s)"
                    )
            else:
                out.append(f"{loop.name}: {loop.state.value}")
        return out

    def is_healthy(self, now: float | None = None) -> bool:
        """True only while every loop runs and beat within its quiet time."""
        return not self.problems(self._clock() if now is None else now)

    def check(self, now: float) -> Check:
        """Decide, at ``now``, whether health changed and whether WATCHDOG=1 is due: the
        watchdog is fed only while healthy, at most once per interval."""
        problems = tuple(self.problems(now))
        healthy = not problems
        changed = healthy != self._healthy
        self._healthy = healthy
        ping = (
            healthy
            and self.watchdog_interval_seconds is not None
            and (
                self._last_watchdog is None
                or now - self._last_watchdog >= self.watchdog_interval_seconds
            )
        )
        if ping:
            self._last_watchdog = now
        return Check(healthy, changed, ping, problems)

    def start_watch(
        self,
        name: str,
        period_seconds: float,
        set_health: Callable[[bool], Awaitable[None]],
        ping_watchdog: Callable[[], None],
    ) -> None:
        """Run :meth:`watch` as the named task ``name``; :meth:`stop` ends it."""
        self._watch_task = asyncio.create_task(
            self.watch(period_seconds, set_health, ping_watchdog), name=name
        )

    async def watch(
        self,
        period_seconds: float,
        set_health: Callable[[bool], Awaitable[None]],
        ping_watchdog: Callable[[], None],
    ) -> None:
        """The driver of :meth:`check`: every ``period_seconds`` flip health when it
        changed (with the reasons in the log) and feed the watchdog when due. Runs until
        cancelled or :meth:`begin_stop`. Should it fail itself, the watchdog starves and
        systemd restarts the daemon."""
        while not self._stopping:
            await self.watch_once(set_health, ping_watchdog)
            await self._sleep(period_seconds)

    async def watch_once(
        self, set_health: Callable[[bool], Awaitable[None]], ping_watchdog: Callable[[], None]
    ) -> Check:
        """One pass of :meth:`watch`: check now and carry out what was decided."""
        result = self.check(self._clock())
        if result.changed:
            if result.healthy:
                self._log.info("all root loops healthy again: health SERVING")
            else:
                self._log.error(
                    "health NOT_SERVING, watchdog held back: %s", "; ".join(result.problems)
                )
            await set_health(result.healthy)
        if result.ping_watchdog:
            ping_watchdog()
        return result

    # ------------------------------------------------------------ shutdown

    def begin_stop(self) -> None:
        """From now on a loop that returns has been asked to, nothing restarts, and
        :meth:`watch` neither changes health nor feeds the watchdog."""
        self._stopping = True

    async def stop(self) -> None:
        """Cancel every loop and wait for them to end."""
        self.begin_stop()
        tasks = [loop.task for loop in self.loops.values() if loop.task is not None]
        if self._watch_task is not None:
            tasks.append(self._watch_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["Backoff", "Check", "LoopState", "RootLoop", "RootLoopFailed", "Supervisor"]
