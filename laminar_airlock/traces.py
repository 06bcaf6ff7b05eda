"""Real GPU-memory curves for driving Airlock: the Alibaba GenAI 2026 trace.

``pod_gpu_memory_used_bytes_anon.csv`` (cluster-trace-v2026-GenAI, read from a path the
user gives; it is not bundled) holds one GPU-memory sample per pod every 57 s for about
a day. A *sharing group* is a few pods whose curves, replayed together on one GPU, start
below the pressure mark and later cross it, which is what Airlock must survive. The
choice is a pure, seeded function of the curves, so a test or benchmark that names the
seed replays the same pressure every time.

Pure code (CSV reading and arithmetic only): the agent, the benchmarks and the
simulator can all use it.
"""

from __future__ import annotations

import csv
import itertools
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: File name of the per-pod GPU-memory series inside the trace folder.
GENAI_MEMORY_FILE = "pod_gpu_memory_used_bytes_anon.csv"


@dataclass(frozen=True)
class MemoryCurve:
    """One pod's GPU memory on a common time grid (``None`` where it has no sample)."""

    pod: str
    step_seconds: float
    used_bytes: tuple[int | None, ...]

    def window(self, start: int, length: int) -> tuple[int, ...]:
        """``length`` samples from ``start``, gaps filled with the previous value (or 0)."""
        out: list[int] = []
        last = 0
        for value in self.used_bytes[start : start + length]:
            last = value if value is not None else last
            out.append(last)
        return tuple(out)


@dataclass(frozen=True)
class SharingGroup:
    """Curves chosen to share one GPU, cut to the same window of the trace."""

    pods: tuple[str, ...]
    start_index: int
    step_seconds: float
    #: Per member, the window's samples in bytes.
    curves: tuple[tuple[int, ...], ...]

    def total_at(self, index: int) -> int:
        return sum(curve[index] for curve in self.curves)

    @property
    def length(self) -> int:
        return len(self.curves[0]) if self.curves else 0

    def first_crossing(self, limit_bytes: float) -> int | None:
        """Index of the first sample whose summed usage exceeds ``limit_bytes``."""
        for index in range(self.length):
            if self.total_at(index) > limit_bytes:
                return index
        return None


def trace_file(trace_dir: Path) -> Path:
    """The memory CSV inside a GenAI trace folder (the folder itself may be given)."""
    path = Path(trace_dir)
    return path / GENAI_MEMORY_FILE if path.is_dir() else path


def load_memory_curves(trace_dir: Path, min_samples: int = 100) -> list[MemoryCurve]:
    """All pods with at least ``min_samples`` samples, on the trace's common grid, by pod id."""
    samples: dict[str, dict[float, int]] = defaultdict(dict)
    with trace_file(trace_dir).open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or header[:3] != ["timestamp_anon", "value", "container_ip"]:
            raise ValueError(f"{trace_file(trace_dir)}: not a GenAI pod memory file: {header}")
        for row in reader:
            if len(row) < 3 or not row[2]:
                continue
            samples[row[2]][float(row[0])] = max(0, int(float(row[1])))
    grid = sorted({t for series in samples.values() for t in series})
    if len(grid) < 2:
        return []
    step = min(b - a for a, b in itertools.pairwise(grid))
    return [
        MemoryCurve(pod, step, tuple(series.get(t) for t in grid))
        for pod, series in sorted(samples.items())
        if len(series) >= min_samples
    ]


def choose_sharing_group(
    curves: Sequence[MemoryCurve],
    *,
    members: int,
    gpu_total_bytes: int,
    window: int,
    seed: int,
    start_below_ratio: float = 0.75,
    peak_above_ratio: float = 0.90,
    tries: int = 5000,
) -> SharingGroup:
    """Seeded choice of ``members`` pods and a ``window`` of samples such that together
    they start below ``start_below_ratio`` of the GPU and later exceed ``peak_above_ratio``.

    Raises ``ValueError`` if no such group turns up in ``tries`` random draws.
    """
    if members < 1 or window < 2:
        raise ValueError("members must be >= 1 and window >= 2")
    usable = [c for c in curves if len(c.used_bytes) >= window]
    if len(usable) < members:
        raise ValueError(f"only {len(usable)} curves have {window} samples; {members} wanted")
    rng = random.Random(seed)
    for _ in range(tries):
        group = rng.sample(usable, members)
        start = rng.randrange(0, len(group[0].used_bytes) - window + 1)
        cut = tuple(c.window(start, window) for c in group)
        if any(min(curve) <= 0 for curve in cut):
            continue  # a pod that was not running for part of the window
        first = sum(curve[0] for curve in cut)
        peak = max(sum(curve[i] for curve in cut) for i in range(window))
        if (
            first < start_below_ratio * gpu_total_bytes
            and peak > peak_above_ratio * gpu_total_bytes
        ):
            return SharingGroup(
                pods=tuple(c.pod for c in group),
                start_index=start,
                step_seconds=group[0].step_seconds,
                curves=cut,
            )
    raise ValueError(
        f"no group of {members} pods crosses {peak_above_ratio:.0%} of "
        f"{gpu_total_bytes / 2**30:.0f} GiB from below {start_below_ratio:.0%} in {tries} draws"
    )
