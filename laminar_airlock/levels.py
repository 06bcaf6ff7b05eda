"""Pressure levels with hysteresis.

A memory signal that hovers around a mark must not make Airlock flap between
suspending and resuming, so a level rises at once when a high mark is crossed
but falls only after the signal has stayed below a lower mark for a hold time.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field


class Level(enum.IntEnum):
    """Pressure level; values match proto laminar.v1.PressureLevel."""

    NORMAL = 1
    ELEVATED = 2
    CRITICAL = 3


@dataclass(frozen=True)
class Marks:
    """Thresholds for one signal.

    Ratios are fractions of the total. The optional absolute byte marks apply in
    addition: a level is entered when either the ratio or the byte mark is
    reached, and left only when the signal is below both lower marks.
    Leaving CRITICAL needs the signal below the elevated mark; leaving ELEVATED
    needs it below the clear mark; both for ``hold_seconds``.
    """

    elevated_ratio: float = 0.85
    critical_ratio: float = 0.95
    clear_ratio: float = 0.80
    hold_seconds: float = 1.0
    elevated_bytes: int | None = None
    critical_bytes: int | None = None
    clear_bytes: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.clear_ratio <= self.elevated_ratio <= self.critical_ratio <= 1.0:
            raise ValueError(
                "marks: need 0 < clear_ratio <= elevated_ratio <= critical_ratio <= 1, got "
                f"clear_ratio={self.clear_ratio} elevated_ratio={self.elevated_ratio} "
                f"critical_ratio={self.critical_ratio}"
            )
        if self.hold_seconds < 0:
            raise ValueError(f"hold_seconds: must be >= 0, got {self.hold_seconds}")
        for name in ("elevated_bytes", "critical_bytes", "clear_bytes"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name}: must be >= 0, got {value}")

    def critical_threshold(self, total_bytes: int) -> float:
        """Bytes at which the signal is CRITICAL."""
        return self._threshold(self.critical_ratio, self.critical_bytes, total_bytes)

    def _threshold(self, ratio: float, absolute: int | None, total_bytes: int) -> float:
        by_ratio = ratio * total_bytes
        return by_ratio if absolute is None else min(by_ratio, float(absolute))

    def raw_level(self, used_bytes: int, total_bytes: int) -> Level:
        """Level the signal justifies on the high marks alone (used for rising)."""
        if used_bytes >= self._threshold(self.critical_ratio, self.critical_bytes, total_bytes):
            return Level.CRITICAL
        if used_bytes >= self._threshold(self.elevated_ratio, self.elevated_bytes, total_bytes):
            return Level.ELEVATED
        return Level.NORMAL

    def floor_level(self, used_bytes: int, total_bytes: int) -> Level:
        """Lowest level the signal allows on the lower marks (used for falling)."""
        if used_bytes < self._threshold(self.clear_ratio, self.clear_bytes, total_bytes):
            return Level.NORMAL
        if used_bytes < self._threshold(self.elevated_ratio, self.elevated_bytes, total_bytes):
            return Level.ELEVATED
        return Level.CRITICAL


@dataclass
class _KeyState:
    level: Level = Level.NORMAL
    below_since: float | None = None
    total_bytes: int = 0
    #: (time, used bytes) of the samples within the trend window, oldest first.
    samples: deque[tuple[float, int]] = field(default_factory=deque)


#: How far back the trend of a signal looks.
TREND_WINDOW_SECONDS = 1.0


class LevelTracker:
    """Tracks the hysteresis state of many signals (one per GPU, MIG instance or host), and
    the recent trend of each, from which :meth:`seconds_to_critical` projects when the
    critical mark will be reached."""

    def __init__(
        self, marks: Marks | None = None, trend_window_seconds: float = TREND_WINDOW_SECONDS
    ) -> None:
        self._marks = marks if marks is not None else Marks()
        self._states: dict[str, _KeyState] = {}
        self._trend_window = trend_window_seconds

    @property
    def marks(self) -> Marks:
        return self._marks

    def level(self, key: str) -> Level:
        """Current level of ``key`` (NORMAL for a key never updated)."""
        state = self._states.get(key)
        return Level.NORMAL if state is None else state.level

    def forget(self, key: str) -> None:
        """Drop the state of a signal that went away (a GPU removed, a MIG instance destroyed)."""
        self._states.pop(key, None)

    def update(self, key: str, used_bytes: int, total_bytes: int, now: float) -> Level:
        """Feed one sample and return the level after it.

        A total of 0 (device gone or not yet read) counts as NORMAL pressure.
        """
        state = self._states.setdefault(key, _KeyState())
        self._sample(state, used_bytes, total_bytes, now)
        if total_bytes <= 0:
            raw = floor = Level.NORMAL
        else:
            raw = self._marks.raw_level(used_bytes, total_bytes)
            floor = self._marks.floor_level(used_bytes, total_bytes)
        if raw > state.level:
            state.level = raw
            state.below_since = None
            return state.level
        target = max(raw, floor)
        if target >= state.level:
            state.below_since = None
            return state.level
        if state.below_since is None:
            state.below_since = now
        if now - state.below_since >= self._marks.hold_seconds:
            state.level = target
            state.below_since = None
        return state.level

    def _sample(self, state: _KeyState, used_bytes: int, total_bytes: int, now: float) -> None:
        samples = state.samples
        if samples and (total_bytes != state.total_bytes or now < samples[-1][0]):
            samples.clear()  # another device behind the key, or a clock that went back
        state.total_bytes = total_bytes
        samples.append((now, used_bytes))
        while now - samples[0][0] > self._trend_window + 1e-9:
            samples.popleft()

    def bytes_per_second(self, key: str) -> float | None:
        """Slope of the signal over the trend window (newest against oldest sample there),
        None with fewer than two samples in it (a signal not polled lately has no trend)."""
        state = self._states.get(key)
        if state is None or len(state.samples) < 2:
            return None
        (t0, u0), (t1, u1) = state.samples[0], state.samples[-1]
        if t1 - t0 <= 0:
            return None
        return (u1 - u0) / (t1 - t0)

    def seconds_to_critical(self, key: str) -> float | None:
        """When the signal reaches its critical mark if it keeps its trend (a first-order
        Taylor projection from the newest sample): 0 at or above the mark, ``math.inf`` when
        flat or falling, None when there is no trend (see :meth:`bytes_per_second`).

        What it does not see: a rise that starts after the newest sample, or one that stops
        before the mark (a projection of a ramp that ends at 90% still predicts the mark)."""
        state = self._states.get(key)
        rate = self.bytes_per_second(key)
        if state is None or rate is None or state.total_bytes <= 0:
            return None
        used = state.samples[-1][1]
        critical = self._marks.critical_threshold(state.total_bytes)
        if used >= critical:
            return 0.0
        if rate <= 0:
            return math.inf
        return (critical - used) / rate

    def next_change(self, key: str) -> float | None:
        """The earliest time at which the same used bytes could give another level or trend
        (a hold running out, the oldest differing sample leaving the trend window); None if
        none. A driver whose signal stays flat may skip its updates until then."""
        state = self._states.get(key)
        if state is None:
            return None
        times: list[float] = []
        if state.below_since is not None:
            times.append(state.below_since + self._marks.hold_seconds)
        samples = state.samples
        if len(samples) >= 2 and any(u != samples[-1][1] for _, u in samples):
            times.append(samples[0][0] + self._trend_window + 1e-6)  # dropped just after
        return min(times) if times else None
