"""An atomized subjob, as a template: does its units, checkpointing after each one.

Run by Laminar as one piece of an atomized job (docs/atomization.md); the tests use it
to check that every unit is done exactly once across pieces.

For each unit ``u`` in ``LAMINAR_UNIT_START .. +LAMINAR_UNIT_COUNT``: work for
``seconds`` (argv[1]), then, with SIGTERM held off so the two writes are one step,
append ``u SUBJOB`` to ``units.log`` and move the checkpoint (``progress``: the next
unit) forward. A subjob stopped mid-unit loses only that unit's work; a unit that is
logged twice means someone redid checkpointed work.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    seconds = float(sys.argv[1])
    start = int(os.environ["LAMINAR_UNIT_START"])
    count = int(os.environ["LAMINAR_UNIT_COUNT"])
    checkpoint = Path(os.environ["LAMINAR_CHECKPOINT_DIR"])
    subjob = os.environ["LAMINAR_SUBJOB_ID"]
    for unit in range(start, start + count):
        time.sleep(seconds)  # the unit's work
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        with (checkpoint / "units.log").open("a") as log:
            log.write(f"{unit} {subjob}\n")
            log.flush()
            os.fsync(log.fileno())
        tmp = checkpoint / "progress.tmp"
        tmp.write_text(str(unit + 1))
        os.replace(tmp, checkpoint / "progress")
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    return 0


if __name__ == "__main__":
    sys.exit(main())
