"""Jobs that log their own life, and the reading of those logs: how the fault tests and
the fault soak tell, from what the copies of a job themselves did, whether two ran at
once and whether each ran to its end (the daemons' records are what is being checked,
so they cannot be the evidence)."""

from __future__ import annotations

import itertools
from pathlib import Path

#: ``python -c JOB OUT SECONDS``: appends ``<subjob id> <unix time> start|tick|end`` lines
#: to OUT while it runs for SECONDS (a tick every 50 ms).
JOB = """
import os, sys, time
out, seconds = sys.argv[1], float(sys.argv[2])
me = os.environ["LAMINAR_SUBJOB_ID"]
def note(what):
    with open(out, "a") as f:
        f.write(f"{me} {time.time():.3f} {what}\\n")
note("start")
end = time.time() + seconds
while time.time() < end:
    time.sleep(0.05)
    note("tick")
note("end")
"""


def copies(out: Path) -> dict[str, tuple[float, float, bool]]:
    """subjob id -> (first line, last line, ran to its end) from a job's own file; a
    torn last line (a copy killed mid-write) is ignored."""
    seen: dict[str, list[float]] = {}
    ended: set[str] = set()
    if not out.exists():
        return {}
    for line in out.read_text().splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        try:
            at = float(parts[1])
        except ValueError:
            continue
        seen.setdefault(parts[0], []).append(at)
        if parts[2] == "end":
            ended.add(parts[0])
    return {s: (min(t), max(t), s in ended) for s, t in seen.items()}


def overlapping(out: Path) -> list[tuple[str, str]]:
    """Pairs of copies of one job that ran at the same time (empty: never two at once)."""
    spans = sorted((first, last, s) for s, (first, last, _) in copies(out).items())
    return [(a, b) for (_, last, a), (first, _, b) in itertools.pairwise(spans) if first <= last]
