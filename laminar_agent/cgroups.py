"""One cgroup (v2) per subjob, so a stop reaches every process a subjob started.

A process group is not enough: a subjob's grandchild may call ``setsid`` and leave the
group, then survive a cancel and keep holding GPU memory. A cgroup cannot be left by an
unprivileged process, ``cgroup.kill`` ends all of it at once, and its ``memory.peak``
(where the memory controller is enabled) is the subjob's own accounting.

Layout: ``<root>/<agent>/<subjob_id>``, where ``root`` is ``executor.cgroup_root``
(``auto``: the agent's own cgroup on the cgroup2 mount, which is what systemd hands a
unit with ``Delegate=yes``) and ``<agent>`` keeps agents that share a root apart. The
shim's child joins its cgroup before it drops privileges; the shim itself stays out, so
``cgroup.kill`` never takes the process that records the exit status.

Where there is no writable cgroup2 hierarchy (an unprivileged agent, a container without
one), :func:`open_cgroups` returns None, the agent says so once at start, and subjobs are
stopped through their process group as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
from pathlib import Path

from laminar_agent import shim

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> Path | None:
    """Where the cgroup2 hierarchy is mounted, or None."""
    try:
        with open(mountinfo, encoding="utf-8") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return Path(left.split(" ")[4])
    except OSError:
        return None
    return None


def own_cgroup(proc_cgroup: str = "/proc/self/cgroup") -> str:
    """This process's cgroup2 path (the ``0::`` line), e.g. ``/system.slice/x.service``."""
    try:
        with open(proc_cgroup, encoding="utf-8") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return "/"


class SubjobCgroups:
    """Names, reads and removes the subjobs' cgroups under one agent's folder (each
    subjob's supervisor creates its own: :func:`laminar_agent.shim.prepare`)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._prefix = f"{base}{os.sep}"

    def path(self, subjob_id: str) -> Path:
        return self.base / subjob_id

    def path_text(self, subjob_id: str) -> str:
        """:meth:`path` as text (each launch and each end use it: no Path per call)."""
        return f"{self._prefix}{subjob_id}"

    def pids(self, subjob_id: str) -> list[int]:
        try:
            text = (self.path(subjob_id) / "cgroup.procs").read_text(encoding="ascii")
        except OSError:
            return []
        return [int(line) for line in text.split() if line.isdigit()]

    def kill(self, subjob_id: str) -> bool:
        """SIGKILL every process in the subjob's cgroup; False if there is none."""
        try:
            (self.path(subjob_id) / "cgroup.kill").write_text("1", encoding="ascii")
        except OSError:
            return False
        return True

    def kill_all(self, subjob_id: str) -> None:
        """SIGKILL every process in the subjob's cgroup, through ``cgroup.kill`` or, on a
        kernel without it, one by one (:func:`shim.signal_cgroup`)."""
        shim.signal_cgroup(self.path_text(subjob_id), signal.SIGKILL)

    def remove(self, subjob_id: str) -> None:
        with contextlib.suppress(OSError):
            self.path(subjob_id).rmdir()

    def remove_base(self) -> None:
        """The agent stops: its folder goes if no subjob's cgroup is left in it (the kernel
        refuses to remove a cgroup with children or processes, so a subjob that outlives
        the agent keeps it, and a restarted agent makes it again)."""
        with contextlib.suppress(OSError):
            self.base.rmdir()

    def clear(self, subjob_id: str) -> None:
        """After a subjob's end: SIGKILL what still runs in its cgroup and remove it. The
        removal is tried first: an ended subjob's cgroup is empty (or gone, its launcher
        removed it), and reading ``cgroup.procs`` first cost every end three system calls.
        A cgroup that cannot be removed is read, its processes killed, and removed if it
        can be by then."""
        try:
            os.rmdir(self.path_text(subjob_id))
            return
        except FileNotFoundError:
            return
        except OSError:  # busy: processes still in it (or another reason to find out)
            pass
        self.kill_all(subjob_id)
        self.remove(subjob_id)


def open_cgroups(setting: str, agent_name: str) -> SubjobCgroups | None:
    """The subjob cgroups for ``executor.cgroup_root`` (``auto``, a path, or empty for
    none); None, logged with the reason, where they cannot be used."""
    if not setting:
        log.info("subjob cgroups off (executor.cgroup_root is empty): stops use process groups")
        return None
    if setting == "auto":
        mount = cgroup2_mount()
        if mount is None:
            log.warning("no cgroup2 hierarchy mounted: subjob stops use process groups")
            return None
        root = mount / own_cgroup().lstrip("/")
    else:
        root = Path(setting)
    base = root / ("laminar." + _UNSAFE.sub("_", agent_name))
    try:
        base.mkdir(mode=0o755, exist_ok=True)
        probe = base / ".probe"
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except OSError as exc:
        log.warning(
            "cannot create subjob cgroups under %s (%s; executor.cgroup_root): "
            "subjob stops use process groups",
            root,
            exc.strerror or exc,
        )
        return None
    _enable_controllers(base)
    log.info("subjob cgroups under %s", base)
    return SubjobCgroups(base)


def _enable_controllers(base: Path) -> None:
    """Best effort: offer cpu/memory/pids to subjob cgroups where the parent has them
    (:func:`shim.offer_controllers`, which a launch repeats if the folder went)."""
    wanted, error = shim.offer_controllers(str(base))
    if not wanted and error is None:
        # The shipped unit's case: the agent runs in the cgroup above, and cgroup v2 lets a
        # cgroup that holds processes enable no controller for its children.
        log.info(
            "subjob cgroups without %s accounting (%s offers none of them)",
            ",".join(shim.CONTROLLERS),
            base.parent,
        )
    elif wanted and error is not None:
        log.info("subjob cgroups without %s accounting (%s)", ",".join(wanted), error.strerror)
