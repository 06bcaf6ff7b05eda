"""A subjob workload whose GPU memory follows a recorded curve (fake GPU backend).

``python -m laminar_bench.memcurve CURVE.json [--gate FILE]`` writes each sample of the
curve (``{"step_seconds": s, "used_bytes": [...]}``) to ``$LAMINAR_GPU_MEM_FILE``, the
file through which a subjob on a fake-backend agent reports its GPU memory, one sample
every ``step_seconds``. After the last sample it holds the last value until ``--gate``
exists (or exits at once without a gate). It is what the Airlock chaos tests and
``laminar bench airlock`` run: real processes whose memory moves like real pods.

* SIGUSR1 (Airlock's cooperative "release memory") scales every later sample by
  ``--release-ratio`` (what a framework freeing its cache would do) and appends a line
  to ``released`` in the subjob directory.
* SIGSTOP/SIGCONT (suspend/resume) simply pause the replay.
* SIGTERM exits 143 at once. Progress (the index of the last sample written) is kept
  in ``progress`` next to the usage file, so a test can tell how far each copy got.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m laminar_bench.memcurve")
    parser.add_argument("curve", type=Path, help='JSON {"step_seconds": s, "used_bytes": [...]}')
    parser.add_argument("--gate", type=Path, help="hold the last sample until this file exists")
    parser.add_argument("--release-ratio", type=float, default=0.5, help="kept after SIGUSR1")
    args = parser.parse_args(argv)
    data = json.loads(args.curve.read_text())
    step = float(data["step_seconds"])
    samples = [int(v) for v in data["used_bytes"]]
    usage_path = os.environ.get("LAMINAR_GPU_MEM_FILE")
    if not usage_path:
        print("memcurve: LAMINAR_GPU_MEM_FILE is not set (run me as a subjob)", file=sys.stderr)
        return 2
    usage = Path(usage_path)
    progress = usage.parent / "progress"
    released = usage.parent / "released"
    scale = [1.0]

    def on_release(_signum: int, _frame: FrameType | None) -> None:
        scale[0] *= args.release_ratio
        with released.open("a") as handle:
            handle.write(f"{time.time()}\n")

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGUSR1, on_release)
    signal.signal(signal.SIGTERM, on_term)

    def write(index: int) -> None:
        tmp = usage.with_suffix(".tmp")
        tmp.write_text(str(int(samples[index] * scale[0])))
        tmp.replace(usage)  # the agent never reads a half-written number
        progress.write_text(str(index))

    next_at = time.monotonic()
    for index in range(len(samples)):
        write(index)
        next_at += step
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # the replay's own clock, not synchronization
        else:
            next_at = time.monotonic()  # resumed after a stop: do not rush through the backlog
    while args.gate is not None and not args.gate.exists():
        write(len(samples) - 1)
        time.sleep(step)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
