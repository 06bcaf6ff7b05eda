"""Parsing and formatting of sizes and durations (sizes are int bytes, durations float seconds)."""

from __future__ import annotations

import re

from laminar_base.errors import InvalidArgument

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")
_DURATION_UNITS = {
    "": 1.0,
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
_DURATION_RE = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|s|min|m|h|d)?")

#: Upper bound for any size we accept (1 PiB): larger values are typos or attacks.
MAX_SIZE_BYTES = 1024**5


def parse_size(text: str | int, *, field: str = "size") -> int:
    """Parse ``"10GiB"``, ``"512MiB"``, ``"80GB"`` or a plain byte count into int bytes."""
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(str(text))
        if not match:
            raise InvalidArgument(f"cannot parse size {text!r} (try 10GiB, 512MiB)", field=field)
        unit = match.group(2).lower()
        if unit not in _SIZE_UNITS:
            raise InvalidArgument(f"unknown size unit {match.group(2)!r} in {text!r}", field=field)
        value = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if value < 0:
        raise InvalidArgument(f"size must not be negative, got {value}", field=field)
    if value > MAX_SIZE_BYTES:
        raise InvalidArgument(f"size {value} bytes is larger than 1 PiB", field=field)
    return value


def format_size(num_bytes: float) -> str:
    """Human form with binary units: ``format_size(42949672960) == '40.0GiB'``."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}TiB"  # pragma: no cover - loop always returns


def parse_duration(text: str | float | int, *, field: str = "duration") -> float:
    """Parse ``"30s"``, ``"1.5m"``, ``"2h30m"``, ``"250ms"`` or plain seconds into float seconds."""
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        raw = str(text).strip()
        pos = 0
        seconds = 0.0
        matched = False
        while pos < len(raw):
            match = _DURATION_RE.match(raw, pos)
            if not match:
                raise InvalidArgument(f"cannot parse duration {text!r} (try 30s, 5m)", field=field)
            seconds += float(match.group(1)) * _DURATION_UNITS[match.group(2) or ""]
            pos = match.end()
            matched = True
        if not matched:
            raise InvalidArgument("duration is empty", field=field)
    if seconds < 0 or seconds != seconds:
        raise InvalidArgument(f"duration must be a non-negative number, got {text!r}", field=field)
    return seconds
