"""Pressure levels with hysteresis.

A memory signal that hovers around a mark must not make Airlock flap between
suspending and resuming, so a level rises at once when a high mark is crossed
but falls only after the signal has stayed below a lower mark for a hold time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


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


class LevelTracker:
    """Tracks the hysteresis state of many signals (one per GPU, MIG instance or host)."""

    def __init__(self, marks: Marks | None = None) -> None:
        self._marks = marks if marks is not None else Marks()
        self._states: dict[str, _KeyState] = {}

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
