"""NVIDIA's ``cuda-checkpoint``: move a process's CUDA state to host memory and back, so a
suspended subjob gives its GPU memory back (driver R550 and later, whole GPUs; MIG is not
supported by the tool).

The agent (``AgentServer.start``, not the inventory package: the decision core imports that
and does no I/O) looks for the binary once at start (``inventory.cuda_checkpoint``: a path, empty
for ``cuda-checkpoint`` on the agent's own PATH, ``off`` for never), runs ``--help`` to see
that it runs and offers ``--toggle`` (and whether it offers ``--get-state``), and checks
the driver's major version. What it found
is reported in the inventory, a gauge and the start-up log. Where it is absent, Airlock
asks for the release signal and reclaims, as before.

Only the agent's own configuration and environment are read (never a subjob's), and the
binary runs with fixed argument lists: ``--toggle --pid PID``, ``--get-state --pid PID``,
``--action unlock --pid PID``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from dataclasses import dataclass

from laminar_agent.inventory.base import CheckpointSupport

#: The name looked up on PATH when no path is configured.
BINARY = "cuda-checkpoint"
#: ``inventory.cuda_checkpoint`` value that turns the integration off.
OFF = "off"
#: The first driver branch whose cuda-checkpoint toggles a process (R550).
MIN_DRIVER_MAJOR = 550
#: How long the start-up probe (``--help``) may take.
PROBE_TIMEOUT_SECONDS = 10.0
#: How long one toggle may take: it copies the process's device memory to the host or back.
TOGGLE_TIMEOUT_SECONDS = 120.0


class ToggleFailed(Exception):
    """A ``cuda-checkpoint --toggle`` failed: the process keeps its CUDA state where it was."""


#: States ``--get-state`` prints (R570 and later), as read on an H200 with driver 580:
#: CUDA in use, moved to host memory, or locked (a lock, or a restore not yet unlocked;
#: its memory is on the GPU either way).
STATE_RUNNING, STATE_CHECKPOINTED, STATE_LOCKED = "running", "checkpointed", "locked"


@dataclass(frozen=True)
class CudaCheckpoint:
    """The binary found at start; :meth:`to_state` moves one process's CUDA state."""

    path: str
    driver_version: str
    #: It offers ``--get-state`` (R570 and later): a process's state is read before it is
    #: moved, so a toggle never goes the wrong way (a restore of a process whose earlier
    #: restore ended unrecorded would otherwise check it out again, and its CUDA calls
    #: would wait forever). R550's tool only toggles.
    reads_state: bool = False

    async def to_state(self, pid: int, want: str) -> bool:
        """Bring ``pid``'s CUDA state to ``want`` (:data:`STATE_CHECKPOINTED` or
        :data:`STATE_RUNNING`); whether anything was done (False: it was there already).
        Never call it on a stopped process: the tool waits for it to run (seen on an H200)."""
        if not self.reads_state:
            await self.toggle(pid)
            return True
        state = await self.state(pid)
        done = False
        if state == STATE_LOCKED:
            await self._run(("--action", "unlock", "--pid", str(pid)), PROBE_TIMEOUT_SECONDS)
            state, done = STATE_RUNNING, True
        if state == want:
            return done
        if state not in (STATE_RUNNING, STATE_CHECKPOINTED):
            raise ToggleFailed(f"{self.path}: process {pid} is in CUDA state {state!r}")
        await self.toggle(pid)
        return True

    async def state(self, pid: int) -> str:
        """``--get-state``: running, checkpointed, locked (or what else the tool prints)."""
        output = await self._run(("--get-state", "--pid", str(pid)), PROBE_TIMEOUT_SECONDS)
        return output.strip().lower()

    async def toggle(self, pid: int, timeout_seconds: float = TOGGLE_TIMEOUT_SECONDS) -> None:
        """Checkpoint a running process's CUDA state to host memory, or restore it."""
        await self._run(("--toggle", "--pid", str(pid)), timeout_seconds)

    async def _run(self, args: tuple[str, ...], timeout_seconds: float) -> str:
        """Run the tool with ``args``; its output, or :class:`ToggleFailed`."""
        command = " ".join((self.path, *args))
        proc = await asyncio.create_subprocess_exec(
            self.path,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), timeout_seconds)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise ToggleFailed(f"{command}: no answer within {timeout_seconds:g} s") from None
        text = output.decode(errors="replace")
        if proc.returncode != 0:
            raise ToggleFailed(f"{command} exited {proc.returncode}: {text.strip()[-300:]}")
        return text


def _driver_major(driver_version: str) -> int | None:
    head = driver_version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def detect_cuda_checkpoint(
    configured: str, driver_version: str, *, search_path: str | None = None
) -> CheckpointSupport:
    """Find and probe cuda-checkpoint. ``configured`` is ``inventory.cuda_checkpoint``;
    ``search_path`` replaces the agent's PATH for the lookup (tests)."""
    if configured.strip().lower() == OFF:
        return CheckpointSupport(None, "turned off (inventory.cuda_checkpoint = off)")
    path = configured.strip() or shutil.which(BINARY, path=search_path)
    if not path:
        return CheckpointSupport(None, f"no {BINARY} binary on PATH")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return CheckpointSupport(None, f"{path} is not an executable file")
    major = _driver_major(driver_version)
    if major is None or major < MIN_DRIVER_MAJOR:
        return CheckpointSupport(
            None,
            f"driver {driver_version or 'unknown'} cannot toggle CUDA state "
            f"(needs R{MIN_DRIVER_MAJOR} or later)",
        )
    try:
        probe = subprocess.run(
            [path, "--help"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PROBE_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return CheckpointSupport(None, f"{path} --help failed: {exc}")
    text = (probe.stdout + probe.stderr).decode(errors="replace")
    if probe.returncode != 0 or "--toggle" not in text:
        return CheckpointSupport(
            None, f"{path} --help exited {probe.returncode} without offering --toggle"
        )
    reads_state = "--get-state" in text
    return CheckpointSupport(
        CudaCheckpoint(path, driver_version, reads_state),
        f"{path} (driver {driver_version}{'' if reads_state else ', toggle only'})",
    )
