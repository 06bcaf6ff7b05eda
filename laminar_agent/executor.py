"""Starts, signals and watches subjob processes.

The agent's launcher (:mod:`laminar_agent.shim`, ``--serve``) starts each subjob's
process itself, the leader of its own process group, so the pid the agent keeps is the
job's and also its process group id; where cgroups are available each subjob also has
its own cgroup (:mod:`laminar_agent.cgroups`), and signals go to every process in it.
The launcher supervises them all and writes each one's ``exit.json`` before telling the
agent. Subjobs outlive the agent, and so does the launcher: :meth:`Executor.close`
stops watching but never kills, and a restarted agent re-attaches with
:meth:`Executor.adopt` and learns the exit status from ``exit.json``. Where the
launcher cannot be used a shim per subjob (``shim.py DIR``) does the same for one
subjob; its pid is then the shim's.

Trust boundary: the launcher (and a shim) is started with a fixed clean environment and
``python -I -S`` (see the shim's docstring); the job's command, environment and working
directory travel in the launch record (a line on the launcher's stdin, or
``launch.json`` in a folder only root may write when the shim is started directly), and
are applied by the forked child after it has dropped privileges. Each tenant runs as its
own user (:class:`TenantIdentities`).

A launch on the event loop is a JSON dump and a pipe write: the subjob's folder and
cgroup are made by the launcher (:func:`laminar_agent.shim.prepare`), whose mkdirs took
about a millisecond of the loop's time each under load; its end is a line from the
launcher, not a pidfd per subjob.
"""

from __future__ import annotations

import array
import asyncio
import collections
import contextlib
import fcntl
import inspect
import json
import logging
import os
import pwd
import re
import signal
import sys
import termios
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from laminar_agent import shim
from laminar_agent.cgroups import SubjobCgroups
from laminar_agent.jobfiles import UnsafeJobFile, read_job_file, write_private
from laminar_agent.shim import EXIT_FILE, LAUNCH_FILE
from laminar_base.errors import ConfigError, InvalidArgument, NotFound

log = logging.getLogger(__name__)

ADOPT_POLL_SECONDS = 0.2
#: Where the kernel names this boot (a new random id at every boot).
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
#: How often the agent looks for the ``exit.json`` of a subjob that has ended while its
#: launcher, not connected to this agent, still runs (it writes the record after reaping).
EXIT_RECORD_POLL_SECONDS = 0.02
#: Subjob ids name a directory under the state dir, so they must be one safe path component.
_SAFE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
PROGRESS_FILE = "progress"
GPU_MEM_FILE = "gpu_mem"
_RESERVED_EXACT = frozenset({"CUDA_VISIBLE_DEVICES"})
_RESERVED_PREFIX = "LAMINAR_"

ExitCallback = Callable[[str, "ExitInfo"], Awaitable[None] | None]


@dataclass
class LaunchSpec:
    subjob_id: str
    job_id: str
    command: Sequence[str]
    #: User environment; keys CUDA_VISIBLE_DEVICES and LAMINAR_* are dropped.
    env: Mapping[str, str]
    workdir: str
    device_uuids: Sequence[str]
    unit_start: int = 0
    unit_count: int = 0
    checkpoint_dir: str = ""
    grace_seconds: float = 10.0
    #: Whose subjob this is: chooses the user it runs as (:class:`TenantIdentities`).
    tenant: str = ""
    #: Stopped by its shim when the agent's fence expires (a job that chose to run on
    #: through a partition launches with False).
    fenced: bool = True
    #: An element of a job array: its array's job id and its index.
    array_job_id: str = ""
    array_index: int = 0


#: The only environment the shim (root) starts with; nothing of the job's is in it.
SHIM_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
#: The shim as a file: run with ``-I -S`` it imports nothing from site-packages.
SHIM_PATH = str(Path(shim.__file__).resolve())
#: How long the launcher may take to answer a launch before the agent gives up on it.
LAUNCHER_TIMEOUT_SECONDS = 10.0
#: After the launcher fails, launches start the shim directly for this long, then a
#: fresh launcher is tried.
LAUNCHER_RETRY_SECONDS = 5.0
#: Bounds on the job files the agent reads (progress, usage reports).
JOB_FILE_MAX_BYTES = 64
#: What an agent strips from the environment it passes on: systemd's per-unit variables.
_AGENT_ONLY_ENV = (
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "GRPC_ENABLE_FORK_SUPPORT",  # set for the agent itself by laminar_base
)


@dataclass(frozen=True)
class RunAs:
    """The unprivileged identity subjob commands run as (the agent itself stays root)."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def shim_arg(self) -> str:
        """``UID:GID:G1,G2`` for the shim's ``--user`` option."""
        return f"{self.uid}:{self.gid}:{','.join(str(g) for g in self.groups)}"


#: The environment variable of ``executor.run_as_user``.
RUN_AS_ENV = "LAMINAR_EXECUTOR_RUN_AS_USER"


def local_run_as_env(*environments: Mapping[str, str]) -> dict[str, str]:
    """Environment for an agent a local tool starts (``laminar up``, benches): it runs
    subjobs as whoever runs the tool, root included, unless one of ``environments``
    already names a user (an installed agent defaults to nobody)."""
    if any(RUN_AS_ENV in env for env in environments):
        return {}
    return {RUN_AS_ENV: ""}


def resolve_run_as(user: str, *, euid: int | None = None) -> RunAs | None:
    """Who subjobs run as: ``user`` (name or uid) when the agent is root, else None (the
    agent's own identity). An empty ``user`` or ``root`` keeps root, which is only for
    single-tenant hosts. Raises ConfigError naming ``executor.run_as_user`` for an
    unknown user."""
    if (os.geteuid() if euid is None else euid) != 0 or user in ("", "root", "0"):
        return None
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, OverflowError):
        raise ConfigError(f"no user {user!r} on this host", field="executor.run_as_user") from None
    groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)


def parse_tenant_users(text: str) -> dict[str, RunAs]:
    """``executor.tenant_users`` ("tenant=user,tenant2=uid") resolved against this host."""
    users: dict[str, RunAs] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        tenant, sep, user = item.partition("=")
        if not sep or not tenant.strip() or not user.strip() or user.strip() in ("root", "0"):
            raise ConfigError(
                f"{item!r} must be tenant=user (a user that is not root)",
                field="executor.tenant_users",
            )
        run_as = resolve_run_as(user.strip(), euid=0)
        if run_as is None:  # pragma: no cover - root excluded above
            continue
        users[tenant.strip()] = run_as
    return users


class UidStore(Protocol):
    """Durable tenant -> uid assignments of the pool (the agent's journal)."""

    def tenant_uids(self) -> dict[str, int]: ...

    def put_tenant_uid(self, tenant: str, uid: int) -> None: ...


class TenantIdentities:
    """Who each tenant's subjobs run as when the agent is root, so that one tenant's
    subjob can neither signal another's nor read its files or ``/proc/PID/environ``.

    In order: ``executor.tenant_users`` (tenant -> an account of this host, for shared
    file systems), then a uid of ``executor.uid_pool`` kept for that tenant for good (the
    first free uid from a hash of the tenant's name, so hosts mostly agree; journaled, so
    a restart never gives a live tenant's uid to another; uids this host's passwd knows
    are skipped), then ``executor.run_as_user`` for every tenant. ``None`` everywhere
    means the agent's own identity (an agent that is not root, or ``run_as_user = ""``).
    """

    def __init__(
        self,
        default: RunAs | None,
        *,
        users: Mapping[str, RunAs] | None = None,
        pool: range | None = None,
        store: UidStore | None = None,
    ) -> None:
        self.default = default
        self.users = dict(users or {})
        self.pool = pool if default is not None else None
        self._store = store
        self._assigned: dict[str, int] = dict(store.tenant_uids()) if store else {}

    @property
    def is_isolating(self) -> bool:
        return self.default is not None and (self.pool is not None or bool(self.users))

    def for_tenant(self, tenant: str) -> RunAs | None:
        if self.default is None:
            return None
        if tenant in self.users:
            return self.users[tenant]
        if self.pool is None:
            return self.default
        uid = self._assigned.get(tenant)
        if uid is None:
            uid = self._allocate(tenant)
        return RunAs(f"laminar-{uid}", uid, uid, (uid,), "")

    def _allocate(self, tenant: str) -> int:
        assert self.pool is not None
        taken = set(self._assigned.values())
        size = len(self.pool)
        first = zlib.crc32(tenant.encode()) % size
        for step in range(size):
            uid = self.pool[(first + step) % size]
            if uid in taken or _uid_known(uid):
                continue
            self._assigned[tenant] = uid
            if self._store is not None:
                self._store.put_tenant_uid(tenant, uid)
            return uid
        raise InvalidArgument(
            f"no free uid left in executor.uid_pool for tenant {tenant!r}", field="tenant"
        )


def _uid_known(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


@dataclass
class ExitInfo:
    exit_code: int | None
    signal: int | None
    peak_rss_bytes: int
    ended_unix: float
    run_seconds: float
    error: str = ""
    #: Stopped by its shim because the agent's fence expired (out of touch with its router).
    fenced: bool = False


@dataclass
class _Tracked:
    pid: int
    grace_seconds: float
    #: The pid is the job's own process (its process group's leader), started by a
    #: launcher; False for a shim's pid (the shim leads the group and must outlive a kill).
    is_job: bool = False
    #: Its process's identity (:func:`_process_start`: this boot, its start tick), journaled
    #: for a restarted agent's adopt; "" when unknown.
    identity: str = ""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


def _reap(pid: int) -> int | None:
    """Non-blocking waitpid: the wait status once ``pid`` has ended, else None."""
    done_pid, status = os.waitpid(pid, os.WNOHANG)
    return status if done_pid == pid else None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _wait_child(pid: int) -> int | None:
    """Wait for ``pid`` to end without blocking the loop; its wait status when it is our
    child (reaped here), None when it is not (a subjob a launcher started, or one
    reaped elsewhere). Its pidfd tells when it has ended (a pidfd is readable once its
    process has exited, zombie or reaped), so nothing polls /proc on a launch's path;
    only without pidfds is it polled."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:  # gone and reaped already
        return _reap_ours(pid)
    except (AttributeError, OSError):
        return await _poll_child(pid)
    try:
        status = _reap_ours(pid)
        if status is None:
            loop = asyncio.get_running_loop()
            readable = loop.create_future()
            loop.add_reader(pidfd, _resolve, readable)
            try:
                await readable
            finally:
                loop.remove_reader(pidfd)
            status = _reap_ours(pid)
        return status
    finally:
        os.close(pidfd)


def _reap_ours(pid: int) -> int | None:
    """The wait status of our child ``pid`` once it has ended; None while it runs, or
    when it is not our child."""
    try:
        return _reap(pid)
    except ChildProcessError:
        return None


async def _poll_child(pid: int) -> int | None:
    """:func:`_wait_child` where pidfds are unavailable: a poll."""
    while True:
        try:
            status = _reap(pid)
        except ChildProcessError:
            status = None
            if not psutil.pid_exists(pid) or _is_zombie(pid):
                return None
        if status is not None:
            return status
        await asyncio.sleep(ADOPT_POLL_SECONDS)


def _kill_group_but_leader(pgid: int) -> None:
    """SIGKILL every process of process group ``pgid`` except its leader."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == pgid:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(int(name)) == pgid:
                os.kill(int(name), signal.SIGKILL)


def _is_zombie(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


class LaunchUnanswered(OSError):
    """The launch record reached the launcher and no answer came: the subjob may still
    start (the caller voids the launch: :meth:`Executor.void`)."""


class LaunchRefused(OSError):
    """The subjob surely did not start: its folder could not be made, or its cgroup still
    holds processes (:func:`shim.prepare`, in the launcher or here). The message says why."""


class Launcher:
    """The agent's end of its launcher (``shim.py --serve``, :class:`laminar_agent.shim._Launcher`):
    a long-lived clean-environment process that starts every subjob itself (one fork
    each) and supervises them all, so a launch costs a fork instead of a Python start-up
    and no Python process stays per subjob. Started on first use over two plain pipes
    (its stdin and stdout). Its stdout carries, in order, one answer per launch record
    and, interleaved, ``x PID ID`` once subjob ID's ``exit.json`` is written
    (:meth:`wait_exit`).

    If it cannot start or is dead before it reads the record, that launch falls back to
    starting the shim directly (:func:`_spawn`); if it does not answer a record it was
    sent, that launch fails and is void (:meth:`Executor.void`). Either way the next
    launches start shims directly until :data:`LAUNCHER_RETRY_SECONDS` have passed; then
    a fresh launcher is started. A launcher given up on is never killed (its subjobs
    run on under it): the pipes are closed, and it exits once its last subjob has."""

    def __init__(self, python: str) -> None:
        self._python = python
        self._pid = 0
        self._to = -1  # our end of its stdin
        self._from = -1  # our end of its stdout
        self._buffer = b""
        self._lines: collections.deque[str] = collections.deque()
        self._answered: asyncio.Future[None] | None = None  # wakes _readline
        self._eof = False
        #: By subjob id (never by pid: a pid the kernel reused would take an earlier
        #: subjob's notice for a later one's).
        self._exits: dict[str, asyncio.Future[bool]] = {}
        self._recorded: set[str] = set()  # "x PID ID" read before anyone waited for it
        self._retired: list[int] = []  # launchers stopped with subjobs: reaped once ended
        self._lock = asyncio.Lock()
        self._broken_until = 0.0  # monotonic: no launcher (direct shims) until then
        #: The running launcher as a process (its start time guards against pid reuse).
        self.process: psutil.Process | None = None
        self.starts = 0

    @property
    def is_broken(self) -> bool:
        return time.monotonic() < self._broken_until

    @property
    def pid(self) -> int:
        """The running launcher's pid, 0 when none is running."""
        return self._pid

    async def launch(self, record: str) -> tuple[int, str] | None:
        """The subjob's pid and its warning ("" if none) for the launch record ``record``
        (JSON, one line), or None when the subjob certainly did not start: the launcher
        was unusable before the record reached it, or it could not fork (use the shim).
        Raises :class:`LaunchUnanswered` once the record was sent but no answer came (a
        timeout, the launcher ending): the subjob may still start, so starting a shim for
        the same id would run it twice (the caller voids the launch instead); and OSError
        :class:`LaunchRefused` with the launcher's reason when it could not make the
        subjob's folder or found its cgroup still holding processes (:func:`shim.prepare`;
        a shim would fail the same way)."""
        if self.is_broken:
            return None
        async with self._lock:  # one request, one answer, in order
            try:
                if self._pid == 0:
                    self._start()
                elif self._eof:  # it ended since the last launch: nothing of this one
                    raise BrokenPipeError("the launcher ended")
                _write_all(self._to, record.encode() + b"\n")
            except OSError as exc:  # it never read the whole record: nothing started
                self._give_up(exc)
                return None
            try:
                # A timeout scope, not wait_for: no task per launch (15 -> 9 us idle).
                async with asyncio.timeout(LAUNCHER_TIMEOUT_SECONDS):
                    line = await self._readline()
            except (OSError, TimeoutError, EOFError) as exc:
                # Ended with part of the record still in its pipe: it never read the
                # whole line, so nothing started.
                unread = isinstance(exc, EOFError) and _unread_bytes(self._to) > 0
                self._give_up(exc)
                if unread:
                    return None
                why = (
                    f"within {LAUNCHER_TIMEOUT_SECONDS:.0f} s"
                    if isinstance(exc, TimeoutError)
                    else f"({exc!r})"
                )
                raise LaunchUnanswered(
                    f"the launcher gave no answer {why}; the launch is void (a late start "
                    "runs nothing of it)"
                ) from exc
            except BaseException:
                # Cancelled: its answer would be read as the next launch's. A fresh
                # launcher answers the next one.
                self._stop()
                raise
            head, _, warning = line.strip().partition(" ")
            if line.startswith("error supervisor:"):  # no folder, or its cgroup is busy
                raise LaunchRefused(line.strip())
            if not head.isdigit():  # it could not fork: nothing started
                log.warning("launcher answered %r; starting this shim directly", line.strip())
                return None
            return int(head), warning

    async def wait_exit(self, subjob_id: str) -> bool:
        """Wait until this launcher says it wrote ``subjob_id``'s ``exit.json`` (True),
        or until it is no longer heard from (False: it ended, or was given up on, with
        the subjob maybe still running)."""
        if subjob_id in self._recorded:
            self._recorded.discard(subjob_id)
            return True
        if self._from < 0 or self._eof:
            return False
        ended = asyncio.get_running_loop().create_future()
        self._exits[subjob_id] = ended
        try:
            return bool(await ended)
        finally:
            self._exits.pop(subjob_id, None)

    def _on_readable(self) -> None:
        """Its stdout: launch answers (to :meth:`_readline`) and exit notices."""
        try:
            chunk = os.read(self._from, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # it ended; whoever waits on it hears so
            self._eof = True
            asyncio.get_running_loop().remove_reader(self._from)
            self._wake()
            self._forget_exits()
            return
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, _, self._buffer = self._buffer.partition(b"\n")
            if line.startswith(b"x "):
                words = line.split()
                if len(words) != 3 or not words[1].isdigit():
                    log.warning("launcher said %r; ignored", line[:80])
                    continue
                subjob_id = words[2].decode(errors="replace")
                ended = self._exits.pop(subjob_id, None)
                if ended is None:
                    self._recorded.add(subjob_id)
                elif not ended.done():
                    ended.set_result(True)
            else:
                self._lines.append(line.decode(errors="replace"))
        if self._lines:
            self._wake()

    def _wake(self) -> None:
        if self._answered is not None and not self._answered.done():
            self._answered.set_result(None)

    def _forget_exits(self) -> None:
        for ended in self._exits.values():
            if not ended.done():
                ended.set_result(False)
        self._exits.clear()
        self._recorded.clear()

    def _give_up(self, exc: BaseException) -> None:
        """Stop using the launcher; launches start shims directly for a while."""
        log.warning(
            "launcher unusable (%r); starting shims directly for %.0f s",
            exc,
            LAUNCHER_RETRY_SECONDS,
        )
        self._stop()
        self._broken_until = time.monotonic() + LAUNCHER_RETRY_SECONDS

    def _start(self) -> None:
        self._reap_retired()
        child_in, self._to = os.pipe()
        self._from, child_out = os.pipe()
        for fd in (self._to, self._from):
            os.set_inheritable(fd, False)
        os.set_blocking(self._from, False)
        try:
            self._pid = os.posix_spawn(
                self._python,
                [self._python, "-I", "-S", SHIM_PATH, "--serve"],
                SHIM_ENV,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, child_in, 0),
                    (os.POSIX_SPAWN_DUP2, child_out, 1),
                    (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                ],
                setsid=True,
            )
        finally:
            os.close(child_in)
            os.close(child_out)
        self._eof = False
        try:
            self.process = psutil.Process(self._pid)
        except psutil.Error:
            self.process = None
        asyncio.get_running_loop().add_reader(self._from, self._on_readable)
        self.starts += 1
        log.info("launcher started as pid %d", self._pid)

    async def _readline(self) -> str:
        """The next launch answer."""
        while not self._lines:
            if self._eof:
                raise EOFError("the launcher ended")
            self._answered = asyncio.get_running_loop().create_future()
            try:
                await self._answered
            finally:
                self._answered = None
        return self._lines.popleft()

    def _stop(self) -> None:
        """Close its pipes (stdin's EOF: it takes no more launches, and exits once its
        subjobs have ended); never kill it. Whoever waits on an exit from it is told it
        is no longer heard from."""
        if self._from >= 0 and not self._eof:
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().remove_reader(self._from)
        for fd in (self._to, self._from):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._to = self._from = -1
        self._buffer = b""  # a stopped launcher's unread answers are nobody's
        self._lines.clear()
        self._eof = False
        self._forget_exits()
        if self._pid:
            self._retired.append(self._pid)
            self._pid = 0
            self.process = None
        self._reap_retired()

    def _reap_retired(self) -> None:
        for pid in list(self._retired):
            try:
                done = os.waitpid(pid, os.WNOHANG)[0] != 0
            except ChildProcessError:
                done = True
            if done:
                self._retired.remove(pid)

    async def close(self) -> None:
        async with self._lock:
            self._stop()


def _unread_bytes(fd: int) -> int:
    """How many bytes written to the pipe ``fd`` (either end) are still unread; 0 when
    that cannot be told."""
    count = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
    except OSError:
        return 0
    return count[0]


def _write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to a blocking pipe (a long record may take more than one write)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _spawn(python: str, argv: list[str], sdir: Path) -> int:
    """Start the shim in a new session, with the clean :data:`SHIM_ENV` and with
    stdout/stderr appended to files in ``sdir`` (a folder only the agent may write;
    the subjob writes them only through the descriptors it inherits).

    posix_spawn rather than asyncio subprocesses: the agent must be able to stop
    watching (close) without a transport killing the subjob or warning about it.
    """
    append = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
    return os.posix_spawn(
        python,
        argv,
        SHIM_ENV,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(sdir / "stdout"), append, 0o600),
            (os.POSIX_SPAWN_OPEN, 2, str(sdir / "stderr"), append, 0o600),
        ],
        setsid=True,
    )


def filter_user_env(env: Mapping[str, str]) -> dict[str, str]:
    """Drop keys the agent owns so a user cannot escape its GPU assignment."""
    return {
        k: v
        for k, v in env.items()
        if k not in _RESERVED_EXACT and not k.startswith(_RESERVED_PREFIX)
    }


class Executor:
    def __init__(
        self,
        state_dir: Path,
        *,
        python: str = sys.executable,
        base_env: Mapping[str, str] | None = None,
        on_exit: ExitCallback,
        run_as: RunAs | None = None,
        identities: TenantIdentities | None = None,
        cgroups: SubjobCgroups | None = None,
        fence_file: Path | None = None,
        use_launcher: bool = True,
    ) -> None:
        """``use_launcher``: start subjobs through the launcher (else start ``python -I -S
        shim.py`` for each subjob). ``identities``: who each tenant's subjobs run as (default: every tenant as
        ``run_as``, see :func:`resolve_run_as`; None runs them as the agent's own user).
        ``cgroups``: one cgroup per subjob, or None for process groups only.
        ``fence_file``: the agent's fence (see the shim), or None for no fencing."""
        self.identities = identities or TenantIdentities(run_as)
        self.cgroups = cgroups
        self.fence_file = fence_file
        self._state_dir = Path(state_dir)
        self._subjobs_dir = self._state_dir / "subjobs"
        #: ``subjob_dir`` as text, for the paths built on each launch and event.
        self._subjobs_prefix = f"{self._subjobs_dir}{os.sep}"
        self._python = python
        base = dict(os.environ if base_env is None else base_env)
        for key in _AGENT_ONLY_ENV:
            base.pop(key, None)
        self._base_env = base
        self._on_exit = on_exit
        self._tracked: dict[str, _Tracked] = {}
        self._launcher = Launcher(python) if use_launcher else None

    @property
    def run_as(self) -> RunAs | None:
        """The identity of tenants without a user of their own (None: the agent's)."""
        return self.identities.default

    def subjob_dir(self, subjob_id: str) -> Path:
        return self._subjobs_dir / subjob_id

    def log_path(self, subjob_id: str, stream: str) -> str:
        """Where the subjob's ``stdout`` or ``stderr`` is (text: no Path per call)."""
        return f"{self._subjobs_prefix}{subjob_id}{os.sep}{stream}"

    def _scratch_text(self, subjob_id: str) -> str:
        """Where the subjob itself may write (its usage file, progress notes), as text
        (the paths built on each launch).

        Without ``run_as`` that is the subjob directory. With it, a ``scratch`` folder the
        subjob's user owns: the subjob directory stays root's, so a subjob cannot swap its
        ``stdout`` or ``exit.json`` for a link to a file only root may read or write."""
        sdir = f"{self._subjobs_prefix}{subjob_id}"
        return sdir if self.run_as is None else f"{sdir}{os.sep}scratch"

    def gpu_mem_file(self, subjob_id: str) -> Path:
        """``$LAMINAR_GPU_MEM_FILE``: where a subjob on the fake backend reports its usage."""
        return Path(self._gpu_mem_text(subjob_id))

    def _gpu_mem_text(self, subjob_id: str) -> str:
        """:meth:`gpu_mem_file` as text (its environment, on each launch)."""
        return f"{self._scratch_text(subjob_id)}{os.sep}{GPU_MEM_FILE}"

    def owner_uid(self, tenant: str) -> int | None:
        """The uid whose files of a tenant's subjob the agent may read; None = any (the
        agent runs subjobs as itself, so they hold nothing it could not read anyway)."""
        user = self.identities.for_tenant(tenant)
        return None if user is None else user.uid

    def _build_env(self, spec: LaunchSpec, user: RunAs | None) -> dict[str, str]:
        env = dict(self._base_env)
        if user is not None:
            home = user.home or self._scratch_text(spec.subjob_id)
            env.update(USER=user.user, LOGNAME=user.user, HOME=home)
        env.update(filter_user_env(spec.env))
        env["CUDA_VISIBLE_DEVICES"] = ",".join(spec.device_uuids)
        env["LAMINAR_JOB_ID"] = spec.job_id
        env["LAMINAR_SUBJOB_ID"] = spec.subjob_id
        env["LAMINAR_UNIT_START"] = str(spec.unit_start)
        env["LAMINAR_UNIT_COUNT"] = str(spec.unit_count)
        if spec.unit_count > 0:
            env["LAMINAR_CHECKPOINT_DIR"] = spec.checkpoint_dir
            env["LAMINAR_PROGRESS_FILE"] = str(Path(spec.checkpoint_dir) / PROGRESS_FILE)
        env["LAMINAR_GPU_MEM_FILE"] = self._gpu_mem_text(spec.subjob_id)
        if spec.array_job_id:
            env["LAMINAR_ARRAY_JOB_ID"] = spec.array_job_id
            env["LAMINAR_ARRAY_INDEX"] = str(spec.array_index)
        return env

    async def launch(self, spec: LaunchSpec) -> int:
        """Start the subjob under the shim; return the shim pid (== process group id)."""
        check_subjob_id(spec.subjob_id, "subjob_id")
        if (
            not spec.command
            or not spec.command[0]
            or not all(isinstance(a, str) for a in spec.command)
        ):
            raise InvalidArgument("must be a non-empty list of strings", field="command")
        if spec.workdir and not Path(spec.workdir).is_absolute():
            raise InvalidArgument(f"{spec.workdir!r} must be absolute", field="workdir")
        if spec.subjob_id in self._tracked and not self._tracked[spec.subjob_id].done.is_set():
            raise InvalidArgument(f"{spec.subjob_id!r} is already running", field="subjob_id")
        user = self.identities.for_tenant(spec.tenant)
        sdir = f"{self._subjobs_prefix}{spec.subjob_id}"  # text: no Path per launch
        if spec.unit_count > 0 and not spec.checkpoint_dir:
            raise InvalidArgument("an atomized subjob needs one", field="checkpoint_dir")
        make_dirs: list[str] = []
        if spec.unit_count > 0:
            # Created by the subjob's own user in its child, so it is theirs; never
            # created or chowned by root at a path the job chose.
            make_dirs.append(spec.checkpoint_dir)
        # The launcher makes the folder (with the user's scratch folder) and the cgroup.
        cgroup = self.cgroups.path_text(spec.subjob_id) if self.cgroups is not None else ""
        launch: dict[str, object] = {
            "dir": sdir,
            "command": list(spec.command),
            "env": self._build_env(spec, user),
            "cwd": spec.workdir or self._scratch_text(spec.subjob_id),
            "mkdirs": make_dirs,
            "user": None
            if user is None
            else {"uid": user.uid, "gid": user.gid, "groups": list(user.groups)},
            "cgroup": cgroup,
            "fence": str(self.fence_file) if self.fence_file else "",
            "fenced": spec.fenced,
            "grace_seconds": spec.grace_seconds,
        }
        started = None
        launcher = self._launcher
        if launcher is not None:
            try:
                started = await launcher.launch(json.dumps(launch))
            except (LaunchUnanswered, asyncio.CancelledError):
                self.void(spec.subjob_id)
                raise
        if started is not None and launcher is not None:
            pid, warning = started
            tracked = _Tracked(pid, spec.grace_seconds, True, _process_start(pid))
            watch = self._watch_launched(spec.subjob_id, tracked, launcher, launcher.process)
        else:
            pid, warning = self._launch_shim(Path(sdir), launch)
            tracked = _Tracked(pid, spec.grace_seconds, False, _process_start(pid))
            watch = self._watch_child(spec.subjob_id, tracked)
        if warning:
            log.warning("subjob %s %s", spec.subjob_id, warning)
        self._tracked[spec.subjob_id] = tracked
        tracked.task = asyncio.create_task(watch, name=f"watch-{spec.subjob_id}")
        # DEBUG: the node logs each start once, at INFO (ops see one line per start and end).
        log.debug(
            "launched subjob %s pid=%d devices=%s units=%d+%d as %s%s",
            spec.subjob_id,
            pid,
            ",".join(spec.device_uuids),
            spec.unit_start,
            spec.unit_count,
            "the agent's user" if user is None else f"uid {user.uid}",
            f" in cgroup {cgroup}" if cgroup else "",
        )
        return pid

    def void(self, subjob_id: str) -> None:
        """Give up on a launch that may still start (its launcher did not answer, or the
        launch was cancelled after its record went out), so that nothing of it runs: the
        void mark in its folder first (a late start's child checks it
        after joining the cgroup, before anything of the job), then every process already
        in its cgroup killed. Without a cgroup, a child that passed its check before the
        mark was written is not found here (the subjob runs; the agent has recorded it
        failed)."""
        sdir = self.subjob_dir(subjob_id)
        try:
            os.makedirs(sdir, 0o700, exist_ok=True)
            os.close(
                os.open(sdir / shim.VOID_FILE, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            )
        except OSError as exc:
            log.error("subjob %s: cannot void its launch: %s", subjob_id, exc)
        if self.cgroups is not None:
            self.cgroups.kill_all(subjob_id)
        log.warning("subjob %s: launch void; nothing of it runs", subjob_id)

    def _launch_shim(self, sdir: Path, launch: dict[str, object]) -> tuple[int, str]:
        """Without a launcher: make the folder and cgroup here, as the launcher would,
        write ``launch.json`` and start ``python -I -S shim.py DIR`` (its pid, the warning).
        Raises :class:`LaunchRefused` when the folder cannot be made or the cgroup is busy."""
        try:
            warning = shim.prepare(str(sdir), launch)
        except OSError as exc:  # before anything of the subjob: it surely did not start
            raise LaunchRefused(str(exc)) from exc
        record = {key: value for key, value in launch.items() if key != "dir"}
        write_private(sdir / LAUNCH_FILE, json.dumps(record))
        argv = [self._python, "-I", "-S", SHIM_PATH, str(sdir)]
        return _spawn(self._python, argv, sdir), warning

    async def _watch_child(self, subjob_id: str, tracked: _Tracked) -> None:
        status = await _wait_child(tracked.pid)
        info = self.read_exit(subjob_id)
        if info is None:  # shim itself was killed (e.g. SIGKILL of the group)
            info = ExitInfo(
                exit_code=(
                    os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None
                ),
                signal=os.WTERMSIG(status)
                if status is not None and os.WIFSIGNALED(status)
                else None,
                peak_rss_bytes=0,
                ended_unix=time.time(),
                run_seconds=0.0,
                error="shim ended without writing exit.json",
            )
        await self._finish(subjob_id, tracked, info)

    async def _watch_launched(
        self,
        subjob_id: str,
        tracked: _Tracked,
        launcher: Launcher,
        writer: psutil.Process | None,
    ) -> None:
        """A subjob its launcher started: the launcher says when ``exit.json`` is written.
        If the launcher is no longer heard from first (it ended, or was given up on), the
        subjob is watched as an adopted one (:meth:`_wait_unrecorded`)."""
        if await launcher.wait_exit(subjob_id):
            info = self.read_exit(subjob_id) or _unknown_exit(
                "its launcher recorded no readable exit.json"
            )
        else:
            info = await self._wait_unrecorded(subjob_id, tracked, writer)
        await self._finish(subjob_id, tracked, info)

    async def _wait_unrecorded(
        self, subjob_id: str, tracked: _Tracked, writer: psutil.Process | None
    ) -> ExitInfo:
        """The end of a subjob whose launcher does not tell us (a previous agent's, or
        one given up on): its process's end (pidfd), then its ``exit.json``, written by
        ``writer`` (that launcher) once it has reaped it. A writer that is gone (SIGKILLed:
        the subjob was re-parented to init, whose reaping records nothing) leaves the exit
        status unknown, and the subjob ends with that cause."""
        if tracked.identity and _process_start(tracked.pid) == tracked.identity:
            # Else gone, its pid perhaps reused: nothing of it to wait for.
            await _wait_child(tracked.pid)
        deadline = time.monotonic() + shim.CGROUP_DRAIN_SECONDS + LAUNCHER_TIMEOUT_SECONDS
        while True:
            info = self.read_exit(subjob_id)
            if info is not None:
                return info
            if not _is_alive(writer) or time.monotonic() > deadline:
                break
            await asyncio.sleep(EXIT_RECORD_POLL_SECONDS)
        return self.read_exit(subjob_id) or _unknown_exit(
            "its launcher ended before recording how it ended: exit status unknown"
            if tracked.is_job
            else "adopted shim ended without writing exit.json"
        )

    async def _finish(self, subjob_id: str, tracked: _Tracked, info: ExitInfo) -> None:
        tracked.done.set()
        if self.cgroups is not None:  # the shim removes it; a killed shim cannot
            self.cgroups.clear(subjob_id)
        log.debug(  # the node logs the end, with its cause, at INFO
            "subjob %s ended exit_code=%s signal=%s peak_rss_bytes=%d run_seconds=%.3f%s",
            subjob_id,
            info.exit_code,
            info.signal,
            info.peak_rss_bytes,
            info.run_seconds,
            " (fenced)" if info.fenced else "",
        )
        try:
            result = self._on_exit(subjob_id, info)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("on_exit callback failed for subjob %s", subjob_id)

    def pid_start(self, subjob_id: str) -> str:
        """The tracked subjob's process identity as read at its launch (this boot's id and
        the process's start tick, :func:`_process_start`), what :meth:`adopt` compares after
        a restart; "" for a subjob not tracked or a process gone before it was read."""
        tracked = self._tracked.get(subjob_id)
        return tracked.identity if tracked is not None else ""

    def adopt(
        self,
        subjob_id: str,
        pid: int,
        started_unix: float,
        *,
        pid_start: str = "",
        grace_seconds: float = 10.0,
    ) -> bool:
        """Re-attach to a subjob started by a previous agent; False if it is already gone.

        ``pid`` is the subjob's own process (a launcher started it) or, from an older
        agent, its shim; its start must match, so a reused pid is never taken for it:
        ``pid_start`` (the identity read at the launch: this boot's id and the start tick,
        both fixed for the process's life and read alike by any agent) equal to the pid's
        now; without one (a row an older agent journaled), ``started_unix`` within a second
        of psutil's start time, which a launch answered late misses. The launcher
        that started it (its parent, while that runs) writes its ``exit.json`` once it has
        reaped it."""
        try:
            p = psutil.Process(pid)
            identity = _process_start(pid)
            if pid_start:
                alive = identity == pid_start
            else:
                alive = abs(p.create_time() - started_unix) <= 1.0
            ended = alive and p.status() == psutil.STATUS_ZOMBIE
            parent = p.parent() if alive else None
            writer = parent if parent is not None and _is_launcher(parent.cmdline()) else None
            # A shim of its own: one started directly has a launch.json (the launcher
            # writes none); an older agent's supervisors (forked by a launcher that ended
            # with that agent) say so on their command line. A launcher's child is the job.
            is_shim = (
                alive
                and not ended
                and (
                    os.path.lexists(f"{self._subjobs_prefix}{subjob_id}{os.sep}{LAUNCH_FILE}")
                    or (writer is None and _is_shim(p.cmdline()))
                )
            )
            if is_shim:
                writer = None
            # Ended but not yet reaped by its launcher, which writes its exit.json next:
            # adopted, so that record is waited for rather than the subjob taken as lost.
            alive = alive and (not ended or writer is not None)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            alive = False
        if not alive:
            return False
        tracked = _Tracked(pid, grace_seconds, not is_shim, identity)
        self._tracked[subjob_id] = tracked
        tracked.task = asyncio.get_running_loop().create_task(
            self._watch_adopted(subjob_id, tracked, writer), name=f"adopt-{subjob_id}"
        )
        log.info("adopted subjob %s pid=%d", subjob_id, pid)
        return True

    async def _watch_adopted(
        self, subjob_id: str, tracked: _Tracked, writer: psutil.Process | None
    ) -> None:
        info = await self._wait_unrecorded(subjob_id, tracked, writer)
        await self._finish(subjob_id, tracked, info)

    def read_exit(self, subjob_id: str) -> ExitInfo | None:
        """Read the shim's ``exit.json``; None when absent or unreadable."""
        try:
            data = read_job_file(
                f"{self._subjobs_prefix}{subjob_id}{os.sep}{EXIT_FILE}",
                max_bytes=1 << 16,
                owner_uid=os.geteuid(),
            )
            raw = json.loads(data)
        except (OSError, ValueError):
            return None
        if not isinstance(raw, dict):
            return None
        return ExitInfo(
            exit_code=raw.get("exit_code"),
            signal=raw.get("signal"),
            peak_rss_bytes=int(raw.get("peak_rss_bytes", 0)),
            ended_unix=float(raw.get("ended_unix", 0.0)),
            run_seconds=float(raw.get("run_seconds", 0.0)),
            error=str(raw.get("error", "")),
            fenced=bool(raw.get("fenced", False)),
        )

    def _get(self, subjob_id: str) -> _Tracked:
        try:
            return self._tracked[subjob_id]
        except KeyError:
            raise NotFound(f"unknown subjob {subjob_id!r}", field="subjob_id") from None

    def _signal_group(self, subjob_id: str, sig: int) -> None:
        """``sig`` to every process of the subjob: those in its cgroup where it has one
        (which holds the descendants that left the process group, and not the launcher
        or shim), else its process group: the job's own process leads it (a launcher
        started it), or the shim does (which ignores the stop signals)."""
        tracked = self._get(subjob_id)
        if sig == signal.SIGCONT:
            # A stop sent to a shim's group before its child joined the cgroup stopped the
            # shim too (SIGSTOP cannot be ignored): a continue must reach the group as well,
            # or the shim stays stopped and never records the subjob's end.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(tracked.pid, sig)
        if self.cgroups is not None:
            pids = self.cgroups.pids(subjob_id)
            if sig == signal.SIGKILL and pids and self.cgroups.kill(subjob_id):
                return  # the shim is outside the cgroup: it lives on to record the exit
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            if pids:
                return
        if tracked.is_job:  # the whole group, its leader too: the launcher records the end
            if sig != signal.SIGCONT:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(tracked.pid, sig)
            return
        if sig == signal.SIGKILL:
            # Everyone in the group but its leader, the shim: it lives on to record how
            # the subjob ended (it is not our child to wait for when the launcher forked it).
            _kill_group_but_leader(tracked.pid)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(tracked.pid, sig)

    def kill(self, subjob_id: str) -> None:
        """SIGKILL the whole subjob at once (capacity that cannot be accounted for)."""
        self._signal_group(subjob_id, signal.SIGKILL)

    def suspend(self, subjob_id: str) -> None:
        self._signal_group(subjob_id, signal.SIGSTOP)

    def resume(self, subjob_id: str) -> None:
        self._signal_group(subjob_id, signal.SIGCONT)

    def release_memory(self, subjob_id: str) -> None:
        """Ask the subjob to free cached GPU memory (SIGUSR1 to its group)."""
        self._signal_group(subjob_id, signal.SIGUSR1)

    async def terminate(self, subjob_id: str, grace_seconds: float | None = None) -> None:
        """SIGTERM the group, then SIGKILL it if it outlives the grace period."""
        tracked = self._get(subjob_id)
        if tracked.done.is_set():
            return
        grace = tracked.grace_seconds if grace_seconds is None else grace_seconds
        self._signal_group(subjob_id, signal.SIGCONT)
        self._signal_group(subjob_id, signal.SIGTERM)
        try:
            await asyncio.wait_for(tracked.done.wait(), timeout=grace)
        except TimeoutError:
            log.info("subjob %s outlived grace_seconds=%.1f; SIGKILL", subjob_id, grace)
            self._signal_group(subjob_id, signal.SIGKILL)
            await tracked.done.wait()
        # The shim only waits for its direct child; stragglers (grandchildren that
        # ignored SIGTERM) would keep holding GPU memory, so sweep the group.
        self._signal_group(subjob_id, signal.SIGKILL)

    async def wait(self, subjob_id: str) -> None:
        """Wait until the subjob's exit has been reported."""
        await self._get(subjob_id).done.wait()

    def pid_of(self, subjob_id: str) -> int | None:
        """Process group id (the shim's pid) of a subjob still running, else None."""
        tracked = self._tracked.get(subjob_id)
        return None if tracked is None or tracked.done.is_set() else tracked.pid

    def is_running(self, subjob_id: str) -> bool:
        tracked = self._tracked.get(subjob_id)
        return tracked is not None and not tracked.done.is_set()

    async def close(self) -> None:
        """Stop watchers and the launcher; subjobs keep running so a restarted agent can
        adopt them. The agent's cgroup folder is removed when none of them is left in it,
        so a host the agent stopped on leaves no empty cgroup behind."""
        if self._launcher is not None:
            await self._launcher.close()
        tasks = [t.task for t in self._tracked.values() if t.task is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tracked.clear()
        if self.cgroups is not None:
            self.cgroups.remove_base()


def check_subjob_id(subjob_id: str, field: str, *, required: bool = True) -> str:
    """A subjob id names a folder under the state dir: one safe path component, never a
    path (``..``, ``/``). Raises InvalidArgument naming ``field``."""
    if not subjob_id and not required:
        return subjob_id
    if not _SAFE_ID.fullmatch(subjob_id) or subjob_id in (".", ".."):
        raise InvalidArgument(f"{subjob_id[:64]!r} must be 1-128 of [A-Za-z0-9._-]", field=field)
    return subjob_id


def _is_shim(cmdline: Sequence[str]) -> bool:
    """A shim's command line: this version's (``shim.py``), an older agent's (``-m``), or
    a supervisor an older launcher forked (which kept the launcher's ``--serve``). Read
    only for a process whose parent is no launcher: a launcher's child not yet exec'd
    has the launcher's command line too."""
    return any(a.endswith("laminar_agent/shim.py") or a == "laminar_agent.shim" for a in cmdline)


def _is_launcher(cmdline: Sequence[str]) -> bool:
    """A launcher's command line (``shim.py --serve``)."""
    return "--serve" in cmdline and any(a.endswith("laminar_agent/shim.py") for a in cmdline)


def _is_alive(process: psutil.Process | None) -> bool:
    """Whether ``process`` still runs (a zombie does not; a reused pid is not it)."""
    if process is None:
        return False
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


_boot_id: str | None = None


def _this_boot() -> str:
    """This boot's id (:data:`BOOT_ID_PATH`, read once: it changes only with a reboot)."""
    global _boot_id
    if _boot_id is None:
        try:
            with open(BOOT_ID_PATH, encoding="ascii") as handle:
                _boot_id = handle.read().strip()
        except OSError:
            _boot_id = ""
    return _boot_id


def _process_start(pid: int) -> str:
    """Process ``pid``'s identity, from ``/proc/PID/stat`` alone: this boot's id and the
    process's ``starttime`` in clock ticks after boot. Both are fixed for the process's
    life and every reader sees the same two values, so they are compared for equality (a
    reused pid started in another tick; a reboot has another id). A wall-clock start time
    would not do: the kernel's boot time (``/proc/stat``'s ``btime``, whole seconds) is
    recomputed from the wall clock at each read, so two agent processes (or one, after the
    clock is stepped) may read a process's start a second or more apart; and it is not when
    the launch was answered, which a lagging loop reads late. "" for a process gone."""
    try:
        data = shim._read_small(f"/proc/{pid}/stat")
        ticks = int(data[data.rfind(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return ""
    return f"{_this_boot()}:{ticks}"


def _unknown_exit(why: str) -> ExitInfo:
    """The end of a subjob whose exit status nobody could record."""
    return ExitInfo(
        exit_code=None,
        signal=None,
        peak_rss_bytes=0,
        ended_unix=time.time(),
        run_seconds=0.0,
        error=why,
    )


def units_from_checkpoint(
    checkpoint_dir: str,
    unit_start: int,
    unit_count: int,
    exited_ok: bool,
    *,
    owner_uid: int | None = None,
) -> tuple[int, str]:
    """Units an atomized subjob's checkpoint covers, read from ``checkpoint_dir/progress``
    (the index of the next unit to do, written by the subjob after each checkpoint).

    A subjob that exited 0 without the file did all its units (the contract: do exactly
    your units, checkpoint, exit 0); one that was stopped without it did none that count.
    A value outside ``unit_start..unit_start+unit_count`` (a file from an earlier subjob,
    or garbage) counts as none. The file is the job's: it is read as
    :func:`~laminar_agent.jobfiles.read_job_file` reads, owned by ``owner_uid`` (links,
    FIFOs and other users' files are refused), and its content never reaches the reason.
    Returns the units and a note for the reason.
    """
    path = Path(checkpoint_dir) / PROGRESS_FILE
    try:
        raw = read_job_file(path, max_bytes=JOB_FILE_MAX_BYTES, owner_uid=owner_uid)
    except UnsafeJobFile as exc:
        return 0, f"checkpoint progress refused: {exc}"
    except OSError:
        return (unit_count, "") if exited_ok else (0, "no checkpoint progress")
    text = raw.decode("ascii", errors="replace").strip()
    try:
        next_unit = int(text)
    except ValueError:
        return 0, "unreadable checkpoint progress"
    done = next_unit - unit_start
    if not 0 <= done <= unit_count:
        return 0, f"checkpoint progress {next_unit} outside {unit_start}..{unit_start + unit_count}"
    return done, f"checkpoint covers {done} of {unit_count} unit(s)"
