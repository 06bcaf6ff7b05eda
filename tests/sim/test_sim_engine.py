"""The discrete-event engine: ordering, cancellation, stopping points, determinism per seed."""

from __future__ import annotations

from functools import partial

import pytest

from laminar_sim.engine import Engine, FixedDelay, LossyDelay


def test_events_run_by_time_then_by_insertion_order() -> None:
    engine = Engine(seed=1)
    seen: list[tuple[float, str]] = []

    def note(tag: str) -> None:
        seen.append((engine.now, tag))

    engine.schedule(2.0, lambda: note("c"))
    engine.schedule(1.0, lambda: note("a"))
    engine.schedule(1.0, lambda: note("b"))  # same time: after "a", scheduled later
    engine.schedule_at(0.5, lambda: note("first"))
    stats = engine.run()
    assert seen == [(0.5, "first"), (1.0, "a"), (1.0, "b"), (2.0, "c")]
    assert stats.events_processed == 4
    assert stats.simulated_seconds == 2.0
    assert engine.pending == 0


def test_handlers_can_schedule_more_and_zero_delay_runs_after_what_is_due() -> None:
    engine = Engine(seed=1)
    seen: list[str] = []

    def parent() -> None:
        seen.append("parent")
        engine.schedule(0.0, lambda: seen.append("child"))

    engine.schedule(1.0, parent)
    engine.schedule(1.0, lambda: seen.append("sibling"))
    engine.run()
    assert seen == ["parent", "sibling", "child"]


def test_cancel_until_and_max_events() -> None:
    engine = Engine(seed=1)
    seen: list[int] = []
    handle = engine.schedule(1.0, lambda: seen.append(1))
    for t in (2, 3, 4):
        engine.schedule(float(t), partial(seen.append, t))
    engine.cancel(handle)
    engine.cancel(handle)  # twice is harmless
    stats = engine.run(until_seconds=3.0)
    assert seen == [2, 3]
    assert stats.events_processed == 2
    assert engine.now == 3.0
    assert engine.run(max_events=0).events_processed == 0
    assert engine.run().events_processed == 1
    assert seen == [2, 3, 4]


def test_run_until_advances_time_when_nothing_is_due() -> None:
    engine = Engine(seed=1)
    engine.schedule(10.0, lambda: None)
    engine.run(until_seconds=5.0)
    assert engine.now == 5.0 and engine.pending == 1


def test_bad_times_are_rejected() -> None:
    engine = Engine(seed=1)
    engine.schedule(1.0, lambda: None)
    engine.run()
    with pytest.raises(ValueError, match="before now"):
        engine.schedule_at(0.5, lambda: None)
    with pytest.raises(ValueError, match="delay_seconds"):
        engine.schedule(-1.0, lambda: None)


def _trace(seed: int) -> list[tuple[float, int]]:
    """A small random workload: each event draws a value and schedules a follow-up."""
    engine = Engine(
        seed, network=LossyDelay(base_seconds=0.001, jitter_seconds=0.01, loss_ratio=0.2)
    )
    out: list[tuple[float, int]] = []

    def step(depth: int) -> None:
        out.append((engine.now, int(engine.rng.integers(1000))))
        if len(out) < 300 and depth < 60:  # a bounded tree of events
            engine.send("a", "b", lambda: step(depth + 1))
            engine.schedule(float(engine.rng.exponential(1.0)), lambda: step(depth + 2))

    engine.schedule(0.0, lambda: step(0))
    engine.run()
    return out


def test_same_seed_same_run_other_seed_other_run() -> None:
    first = _trace(7)
    assert len(first) >= 300
    assert first == _trace(7)
    assert first != _trace(8)


def test_send_counts_messages_and_losses() -> None:
    lossless = Engine(seed=3, network=FixedDelay(0.25))
    got: list[float] = []
    for _ in range(10):
        lossless.send("zone", "host", lambda: got.append(lossless.now))
    lossless.run()
    assert got == [0.25] * 10
    assert (lossless.messages_sent, lossless.messages_lost) == (10, 0)

    lossy = Engine(seed=3, network=LossyDelay(base_seconds=0.0, loss_ratio=1.0))
    assert lossy.send("zone", "host", lambda: None) is None
    assert (lossy.messages_sent, lossy.messages_lost) == (1, 1)
    assert lossy.run().events_processed == 0
