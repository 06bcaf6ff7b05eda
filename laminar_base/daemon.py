"""What both daemons share around their lifecycle: signal handling and the event-loop runner.

Signal handlers only set the stop event; a second signal forces exit. Exit
codes: 0 clean, 2 bad configuration or input, 1 any other failure to run
(a fatal root loop included, see :mod:`laminar_base.supervise`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from laminar_base.errors import ConfigError, LaminarError
from laminar_base.supervise import RootLoopFailed


async def serve_until_signalled(
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[None]],
    stop_event: asyncio.Event,
    log: logging.Logger,
    what_survives: str,
) -> None:
    """Start, wait for SIGTERM/SIGINT (or the stop event), stop; a second signal exits at once."""
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            log.warning("second signal %d: exiting now", signum)
            os._exit(1)
        log.info("signal %d: shutting down (%s)", signum, what_survives)
        stop_event.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    await start()
    await stop_event.wait()
    await stop()


def run_daemon(prog: str, main: Coroutine[Any, Any, None]) -> int:
    """Run a daemon's main coroutine on uvloop; map failures to one line and an exit code."""
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency
        runner = asyncio.run  # type: ignore[assignment]
    try:
        runner(main)
    except LaminarError as exc:
        print(f"{prog}: {exc.message}", file=sys.stderr)
        return 2
    except (OSError, RootLoopFailed) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    return 0


def prepare_state_dir(state_dir: Path, mode: int = 0o700) -> Path:
    """Create the state directory (absolute) with ``mode``; one ConfigError naming
    ``server.state_dir`` when it cannot be (a file in the way, no permission)."""
    state_dir = state_dir.absolute()
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(state_dir, mode)
        probe = state_dir / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"cannot use {state_dir} as the state directory: {exc.strerror or exc}",
            field="server.state_dir",
        ) from None
    return state_dir


def setup_logging(level: str) -> None:
    """Daemon log format: one line per record, level names as given on the command line."""
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
