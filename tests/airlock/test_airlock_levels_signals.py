"""Hysteresis of LevelTracker and the host memory sources."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_airlock.levels import Level, LevelTracker, Marks
from laminar_airlock.signals import (
    HostMemory,
    HostMemorySource,
    PsutilHostMemory,
    StaticHostMemory,
    parse_psi_some_avg10,
)

TOTAL = 1000


def test_rises_immediately_and_falls_after_hold() -> None:
    tracker = LevelTracker(Marks(hold_seconds=2.0))
    assert tracker.update("gpu0", 500, TOTAL, now=0.0) == Level.NORMAL
    assert tracker.update("gpu0", 860, TOTAL, now=0.1) == Level.ELEVATED
    assert tracker.update("gpu0", 960, TOTAL, now=0.2) == Level.CRITICAL
    # Below the elevated mark, but not yet for the hold time.
    assert tracker.update("gpu0", 700, TOTAL, now=1.0) == Level.CRITICAL
    assert tracker.update("gpu0", 700, TOTAL, now=2.9) == Level.CRITICAL
    assert tracker.update("gpu0", 700, TOTAL, now=3.0) == Level.NORMAL


def test_critical_falls_to_elevated_when_between_clear_and_elevated() -> None:
    tracker = LevelTracker(Marks(hold_seconds=1.0))
    tracker.update("g", 990, TOTAL, now=0.0)
    assert tracker.update("g", 820, TOTAL, now=1.0) == Level.CRITICAL
    assert tracker.update("g", 820, TOTAL, now=2.0) == Level.ELEVATED
    # 820 is above the clear mark (800): stays elevated however long.
    assert tracker.update("g", 820, TOTAL, now=100.0) == Level.ELEVATED


def test_oscillation_around_mark_does_not_flap() -> None:
    tracker = LevelTracker(Marks(hold_seconds=1.0))
    levels = []
    for i in range(200):
        used = 870 if i % 2 == 0 else 790  # crosses both elevated and clear marks
        levels.append(tracker.update("g", used, TOTAL, now=i * 0.5))
    assert levels[0] == Level.ELEVATED
    assert all(level == Level.ELEVATED for level in levels)


def test_oscillation_between_elevated_and_clear_marks_stays_elevated() -> None:
    tracker = LevelTracker(Marks(hold_seconds=0.0))
    tracker.update("g", 900, TOTAL, now=0.0)
    levels = {tracker.update("g", 849 if i % 2 else 851, TOTAL, now=float(i)) for i in range(50)}
    assert levels == {Level.ELEVATED}


def test_dip_resets_hold_timer() -> None:
    tracker = LevelTracker(Marks(hold_seconds=2.0))
    tracker.update("g", 900, TOTAL, now=0.0)
    tracker.update("g", 700, TOTAL, now=1.0)
    tracker.update("g", 880, TOTAL, now=2.0)  # back above: timer restarts
    assert tracker.update("g", 700, TOTAL, now=3.5) == Level.ELEVATED
    assert tracker.update("g", 700, TOTAL, now=5.5) == Level.NORMAL


def test_keys_are_independent_and_forgettable() -> None:
    tracker = LevelTracker()
    tracker.update("a", 990, TOTAL, now=0.0)
    tracker.update("b", 100, TOTAL, now=0.0)
    assert tracker.level("a") == Level.CRITICAL
    assert tracker.level("b") == Level.NORMAL
    tracker.forget("a")
    assert tracker.level("a") == Level.NORMAL


def test_absolute_byte_marks_apply_too() -> None:
    tracker = LevelTracker(Marks(elevated_bytes=500, critical_bytes=600, clear_bytes=400))
    assert tracker.update("g", 550, TOTAL, now=0.0) == Level.ELEVATED
    assert tracker.update("g", 650, TOTAL, now=0.1) == Level.CRITICAL


def test_zero_total_is_normal() -> None:
    assert LevelTracker().update("g", 10, 0, now=0.0) == Level.NORMAL


def test_level_values_match_proto() -> None:
    from laminar_api.v1 import common_pb2  # test-only: airlock itself never imports it

    assert int(Level.NORMAL) == int(common_pb2.NORMAL)
    assert int(Level.ELEVATED) == int(common_pb2.ELEVATED)
    assert int(Level.CRITICAL) == int(common_pb2.CRITICAL_PRESSURE)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"clear_ratio": 0.9}, "clear_ratio"),
        ({"critical_ratio": 0.8}, "critical_ratio"),
        ({"hold_seconds": -1.0}, "hold_seconds"),
        ({"elevated_bytes": -5}, "elevated_bytes"),
    ],
)
def test_bad_marks_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Marks(**kwargs)  # type: ignore[arg-type]


def test_parse_psi() -> None:
    text = (
        "some avg10=1.25 avg60=0.50 avg300=0.10 total=12345\n"
        "full avg10=0.75 avg60=0.20 avg300=0.00 total=999\n"
    )
    assert parse_psi_some_avg10(text) == 1.25
    assert parse_psi_some_avg10("") is None
    assert parse_psi_some_avg10("some avg10=bad") is None


def test_static_source() -> None:
    source: HostMemorySource = StaticHostMemory(10, 100)
    assert source.read() == HostMemory(10, 100, None)
    assert isinstance(source, StaticHostMemory)
    source.set(50, 100, 2.5)
    assert source.read() == HostMemory(50, 100, 2.5)


def test_psutil_source_reads_real_host(tmp_path: Path) -> None:
    psi = tmp_path / "memory"
    psi.write_text("some avg10=3.00 avg60=0 avg300=0 total=1\n")
    sample = PsutilHostMemory(psi_path=psi).read()
    assert 0 < sample.used_bytes <= sample.total_bytes
    assert sample.psi_some_avg10 == 3.0
    missing = PsutilHostMemory(psi_path=tmp_path / "absent").read()
    assert missing.psi_some_avg10 is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, TOTAL), min_size=1, max_size=60))
def test_property_falls_only_after_hold_below_lower_mark(samples: list[int]) -> None:
    """A fall happens only if every sample in the last hold window (and this one) was below
    the lower mark of the level being left; a rise happens only on a high mark."""
    marks = Marks(hold_seconds=2.0)
    tracker = LevelTracker(marks)
    history: list[tuple[float, int]] = []
    previous = Level.NORMAL
    for i, used in enumerate(samples):
        now = i * 0.5
        history.append((now, used))
        level = tracker.update("g", used, TOTAL, now)
        if level > previous:
            assert marks.raw_level(used, TOTAL) == level
        if level < previous:
            window = [u for t, u in history if t >= now - marks.hold_seconds]
            assert all(marks.floor_level(u, TOTAL) < previous for u in window)
        previous = level


# ---- the trend: a first-order projection of when the critical mark is reached ----


def test_rising_signal_projects_the_critical_mark() -> None:
    tracker = LevelTracker(Marks(), trend_window_seconds=1.0)
    assert tracker.seconds_to_critical("g") is None  # never seen
    tracker.update("g", 800, TOTAL, now=0.0)
    assert tracker.seconds_to_critical("g") is None  # one sample: no trend
    tracker.update("g", 850, TOTAL, now=0.5)
    assert tracker.bytes_per_second("g") == pytest.approx(100.0)
    # 950 critical - 850 now = 100 bytes at 100 bytes/s
    assert tracker.seconds_to_critical("g") == pytest.approx(1.0)
    tracker.update("g", 960, TOTAL, now=1.0)
    assert tracker.seconds_to_critical("g") == 0.0  # at the mark


def test_flat_or_falling_signal_never_reaches_the_mark() -> None:
    tracker = LevelTracker(Marks(), trend_window_seconds=1.0)
    tracker.update("g", 900, TOTAL, now=0.0)
    tracker.update("g", 900, TOTAL, now=0.1)
    assert tracker.seconds_to_critical("g") == math.inf
    tracker.update("g", 880, TOTAL, now=0.2)
    assert tracker.seconds_to_critical("g") == math.inf


def test_trend_forgets_samples_older_than_its_window() -> None:
    tracker = LevelTracker(Marks(), trend_window_seconds=1.0)
    tracker.update("g", 500, TOTAL, now=0.0)
    tracker.update("g", 900, TOTAL, now=0.5)  # a fast rise ...
    tracker.update("g", 900, TOTAL, now=0.9)
    assert tracker.bytes_per_second("g") == pytest.approx(400 / 0.9)
    tracker.update("g", 900, TOTAL, now=1.6)  # ... that left the window: flat now
    assert tracker.bytes_per_second("g") == 0.0
    tracker.update("g", 900, TOTAL, now=10.0)  # polls stopped for a while: no trend
    assert tracker.seconds_to_critical("g") is None


def test_next_change_names_the_hold_and_the_window() -> None:
    tracker = LevelTracker(Marks(hold_seconds=2.0), trend_window_seconds=1.0)
    tracker.update("g", 900, TOTAL, now=0.0)
    assert tracker.next_change("g") is None  # flat, no hold running
    tracker.update("g", 700, TOTAL, now=0.5)  # below the clear mark: the hold starts
    assert tracker.next_change("g") == pytest.approx(1.0)  # the 900 sample leaves the window
    tracker.update("g", 700, TOTAL, now=1.2)
    assert tracker.next_change("g") == pytest.approx(2.5)  # the hold ends
    assert tracker.update("g", 700, TOTAL, now=2.5) == Level.NORMAL
    assert tracker.next_change("g") is None
