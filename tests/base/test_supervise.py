"""The root-loop supervisor on a fake clock and a fake sleep: restarts with backoff, fatal
loops, health and the watchdog gate. Nothing here waits on real time: a test moves on
when the supervisor asks to sleep (an event), and moves the clock itself."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from laminar_base.supervise import Backoff, LoopState, Supervisor

log = logging.getLogger("test.supervise")


class FakeTime:
    """A clock the test moves, and a sleep that waits until the test wakes it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._asked: asyncio.Queue[tuple[float, asyncio.Future[None]]] = asyncio.Queue()
        self._sleeper: asyncio.Future[None] | None = None

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        woken = asyncio.get_running_loop().create_future()
        await self._asked.put((seconds, woken))
        await woken

    async def next_sleep(self) -> float:
        """Wait until the supervisor sleeps; return how long it asked for."""
        seconds, self._sleeper = await asyncio.wait_for(self._asked.get(), 10)
        return seconds

    def wake(self, seconds: float) -> None:
        """Let the pending sleep end ``seconds`` later on the clock."""
        assert self._sleeper is not None
        self.now += seconds
        self._sleeper.set_result(None)
        self._sleeper = None


class Script:
    """A loop body: each run is announced, beats, then raises while ``failing`` runs are
    left (or, with ``advance``, after that many seconds of the fake clock), and otherwise
    waits until released."""

    def __init__(
        self, time: FakeTime, failing: int, advance: Callable[[int], float] = lambda n: 0.0
    ) -> None:
        self.time = time
        self.failing = failing
        self.advance = advance
        self.runs = 0
        self.started: asyncio.Queue[int] = asyncio.Queue()
        self.release = asyncio.Event()

    async def __call__(self, beat: Callable[[], None]) -> None:
        self.runs += 1
        beat()
        self.time.now += self.advance(self.runs)
        await self.started.put(self.runs)
        if self.runs <= self.failing:
            raise RuntimeError(f"NVML_ERROR_UNKNOWN on run {self.runs}")
        await self.release.wait()

    async def next_start(self) -> int:
        return await asyncio.wait_for(self.started.get(), 10)


def make(time: FakeTime, **kwargs: object) -> Supervisor:
    return Supervisor(log, clock=time.clock, sleep=time.sleep, **kwargs)  # type: ignore[arg-type]


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_long_run() -> None:
    backoff = Backoff(initial_seconds=0.1, factor=2.0, cap_seconds=30.0, reset_after_seconds=60.0)
    delays: list[float] = []
    delay = None
    for _ in range(12):
        delay = backoff.next_delay(delay, ran_seconds=1.0)
        delays.append(delay)
    assert delays[:4] == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert delays[-1] == 30.0 and max(delays) == 30.0
    assert backoff.next_delay(30.0, ran_seconds=60.0) == 0.1
    assert backoff.next_delay(30.0, ran_seconds=59.9) == 30.0


async def test_a_failing_loop_is_logged_and_restarted_with_growing_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time = FakeTime()
    sup = make(time)
    body = Script(time, failing=3)
    loop = sup.add("agent-tick", body, quiet_seconds=30.0)
    with caplog.at_level(logging.INFO, logger="test.supervise"):
        sup.start()
        assert loop.task is not None and loop.task.get_name() == "agent-tick"
        delays = []
        for run in (1, 2, 3):
            assert await body.next_start() == run
            delays.append(await time.next_sleep())
            # Waiting out the backoff, the loop is down: unhealthy, and says why.
            assert loop.state is LoopState.BACKOFF
            assert not sup.is_healthy()
            assert sup.problems(time.now) == [
                f"agent-tick: failed {run} time(s), restarting in {delays[-1]:.1f} s"
            ]
            time.wake(delays[-1])
        assert await body.next_start() == 4
    assert delays == pytest.approx([0.1, 0.2, 0.4])
    assert loop.state is LoopState.RUNNING and loop.failures == 3
    assert sup.is_healthy()
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 3
    assert all(r.exc_info and "NVML_ERROR_UNKNOWN" in str(r.exc_info[1]) for r in failures)
    assert "root loop agent-tick failed after 0.0 s (failure 3): restarting in 0.4 s" in (
        failures[-1].getMessage()
    )
    await sup.stop()
    assert loop.state is LoopState.STOPPED


async def test_backoff_starts_over_after_a_run_that_lasted() -> None:
    time = FakeTime()
    sup = make(time)
    # Runs 1-2 fail at once, run 3 fails after 100 s of good work, run 4 at once again.
    body = Script(time, failing=4, advance=lambda run: 100.0 if run == 3 else 0.0)
    sup.add("zone-queue", body, quiet_seconds=300.0)
    sup.start()
    delays = []
    for _ in range(4):
        await body.next_start()
        delays.append(await time.next_sleep())
        time.wake(delays[-1])
    await body.next_start()
    assert delays == pytest.approx([0.1, 0.2, 0.1, 0.2])
    await sup.stop()


async def test_a_fatal_loop_stops_the_daemon_instead_of_restarting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time = FakeTime()
    reasons: list[str] = []
    sup = make(time, on_fatal=reasons.append)
    body = Script(time, failing=1)
    other = Script(time, failing=0)
    loop = sup.add("zone-tick", body, quiet_seconds=30.0, fatal=True)
    sup.add("zone-peers", other, quiet_seconds=30.0)
    with caplog.at_level(logging.INFO, logger="test.supervise"):
        sup.start()
        assert loop.task is not None
        await asyncio.wait_for(loop.task, 10)
    assert loop.state is LoopState.FAILED and body.runs == 1
    assert reasons == ["root loop zone-tick failed"] and sup.failure == reasons[0]
    assert not sup.is_healthy()
    assert "zone-tick: failed" in sup.problems(time.now)[0]
    record = next(r for r in caplog.records if r.levelno == logging.ERROR)
    assert "it is fatal, the daemon stops" in record.getMessage() and record.exc_info
    await sup.stop()


async def test_a_loop_that_returns_unasked_is_restarted_and_one_asked_to_stop_is_not() -> None:
    time = FakeTime()
    sup = make(time)
    runs = asyncio.Queue[int]()

    async def returns(beat: Callable[[], None]) -> None:
        beat()
        await runs.put(1)

    loop = sup.add("zone-market", returns, quiet_seconds=30.0)
    sup.start()
    await asyncio.wait_for(runs.get(), 10)
    assert await time.next_sleep() == pytest.approx(0.1)
    assert loop.state is LoopState.BACKOFF and loop.failures == 1
    sup.begin_stop()
    time.wake(0.1)  # the backoff ends after the stop was asked: no restart
    assert loop.task is not None
    await asyncio.wait_for(loop.task, 10)
    assert loop.state is LoopState.STOPPED and runs.empty()


async def test_health_needs_every_loop_to_beat_within_its_own_quiet_time() -> None:
    time = FakeTime()
    sup = make(time)
    fast, slow = Script(time, failing=0), Script(time, failing=0)
    sup.add("agent-tick", fast, quiet_seconds=30.0)
    sup.add("agent-heartbeat", slow, quiet_seconds=60.0)
    assert not sup.is_healthy()  # added, not started
    sup.start()
    await fast.next_start()
    await slow.next_start()
    assert sup.is_healthy()
    time.now += 45.0
    assert sup.problems(time.now) == ["agent-tick: no progress for 45.0 s (allowed 30.0 s)"]
    sup.beat("agent-tick")
    assert sup.is_healthy()
    time.now += 20.0  # heartbeat quiet 65 s
    assert sup.problems(time.now) == ["agent-heartbeat: no progress for 65.0 s (allowed 60.0 s)"]
    await sup.stop()


async def test_watchdog_is_fed_once_per_interval_and_only_while_healthy() -> None:
    time = FakeTime()
    sup = make(time, watchdog_interval_seconds=10.0)
    body = Script(time, failing=0)
    sup.add("zone-tick", body, quiet_seconds=30.0)
    sup.start()
    await body.next_start()
    t0 = time.now
    first = sup.check(t0)
    assert first.healthy and not first.changed and first.ping_watchdog
    assert not sup.check(t0 + 5).ping_watchdog  # not yet due
    assert sup.check(t0 + 10).ping_watchdog
    quiet = sup.check(t0 + 31)  # no beat for 31 s: down, watchdog held back
    assert not quiet.healthy and quiet.changed and not quiet.ping_watchdog
    assert quiet.problems == ("zone-tick: no progress for 31.0 s (allowed 30.0 s)",)
    still = sup.check(t0 + 50)
    assert not still.changed and not still.ping_watchdog
    time.now = t0 + 51
    sup.beat("zone-tick")
    back = sup.check(t0 + 51)
    assert back.healthy and back.changed and back.ping_watchdog
    await sup.stop()


async def test_watch_flips_health_and_feeds_the_watchdog_as_checked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time = FakeTime()
    sup = make(time, watchdog_interval_seconds=1.0)
    body = Script(time, failing=1)
    sup.add("zone-queue", body, quiet_seconds=300.0)
    served: list[bool] = []
    pings: list[float] = []

    async def set_health(serving: bool) -> None:
        served.append(serving)

    def ping() -> None:
        pings.append(time.now)

    with caplog.at_level(logging.INFO, logger="test.supervise"):
        sup.start()
        await body.next_start()
        delay = await time.next_sleep()  # failed once: waiting out its backoff
        await sup.watch_once(set_health, ping)
        assert served == [False] and pings == []
        assert "health NOT_SERVING, watchdog held back: zone-queue: failed 1" in caplog.text
        time.wake(delay)
        await body.next_start()
        await sup.watch_once(set_health, ping)
        assert served == [False, True] and pings == [time.now]
        await sup.watch_once(set_health, ping)  # same instant: nothing new
        assert served == [False, True] and len(pings) == 1
    assert "all root loops healthy again" in caplog.text
    await sup.stop()


async def test_a_loop_is_added_once() -> None:
    sup = make(FakeTime())
    sup.add("zone-tick", Script(FakeTime(), failing=0), quiet_seconds=1.0)
    with pytest.raises(ValueError, match="zone-tick"):
        sup.add("zone-tick", Script(FakeTime(), failing=0), quiet_seconds=1.0)
