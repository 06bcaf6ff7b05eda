"""Subjob launcher and shim: start subjobs, record how each ended in
``<subjob_dir>/exit.json``.

The agent normally starts one launcher (``python -I -S shim.py --serve``,
:func:`serve`): a long-lived process that starts every subjob of its agent itself (one
fork each; the subjob's process leads its own process group, in the launcher's session)
and supervises them all from one loop: it reaps them (``wait4``), writes ``exit.json`` (how a
re-adopting agent learns the exit status after a restart), enforces the agent's fence
(a subjob whose agent lost touch with its router is stopped, see ``FENCE_FILE``) and,
with cgroups, stops whatever a command left behind. It outlives its agent (see
:class:`_Launcher`). Where the launcher cannot be used the agent starts a shim per
subjob (``python -I -S shim.py <subjob_dir>``, :func:`run`): it forks the command, waits
for it and writes ``exit.json`` the same way.

Trust boundary: when the agent is root the launcher (and a shim) stays root (it writes
``exit.json`` in a folder the subjob cannot touch), so it must never run anything of the
job's. It starts with a fixed clean environment: ``-I`` ignores every ``PYTHON*``
variable and the user site, ``-S`` skips ``site``, and the job's environment never
reaches its own process (no ``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``PYTHONPATH``,
``PYTHONSTARTUP``); it reads the job's environment only as data to hand to ``execve``.
What to run is the agent's launch record: one line on the launcher's stdin, or, for a
shim, ``<subjob_dir>/launch.json`` in a folder only root can write. The launcher (or
shim) creates the subjob's folder and cgroup (:func:`prepare`: paths the agent chose,
under its own state directory and cgroup, never the job's; a cgroup that still holds
processes fails the launch) and opens its logs there. The forked child joins the
subjob's cgroup, drops privileges (groups, gid, uid), and only then applies anything of
the job: its working directory, the folders it creates, and its environment, which goes
straight to ``execve``.

It imports the standard library only, and little of it: its start-up is on the path of
the first launch (and of every launch through a shim).
"""

from __future__ import annotations

# The signal module's C core. The module's wrappers turn every number into an enum
# member, which runs enum code on each call: in a freshly forked supervisor that touches
# (so copies) pages shared with the launcher. On a launch's path the core is called with
# plain numbers instead; it is the same function underneath.
import _signal  # type: ignore[import-not-found]
import gc
import json
import os
import select
import signal
import sys
import time

TYPE_CHECKING = False  # typing costs the shim's start-up 10 ms; mypy reads this name
if TYPE_CHECKING:
    import ctypes
    from collections.abc import Callable

EXIT_FILE = "exit.json"
LAUNCH_FILE = "launch.json"
#: In a subjob's folder: the agent gave up on this launch (its launcher did not answer in
#: time, or the launch was cancelled) and recorded it failed. A launch that starts late
#: finds it after its child joined the cgroup and runs nothing of the job; the
#: agent, having written it, kills whatever already joined the cgroup (one of the two
#: always sees the other).
VOID_FILE = "void"
#: The agent's fence, in its state directory: a CLOCK_MONOTONIC deadline the agent moves
#: forward while its router hears from it. Past it, fenced subjobs are stopped.
FENCE_FILE = "fence"
EXEC_FAILED_CODE = 127
#: Controllers enabled for subjob cgroups where the agent's cgroup folder has them.
CONTROLLERS = ("cpu", "memory", "pids")
#: The stop signals a supervisor holds back until its child exists (see :func:`run`).
STOPS = (int(signal.SIGTERM), int(signal.SIGINT))
_SIG_DFL, _SIG_IGN = int(signal.SIG_DFL), int(signal.SIG_IGN)
#: Signals a supervisor or the launcher ignores or catches that a subjob must start with
#: at their default (``exec`` keeps an ignored signal ignored): the stops, SIGUSR1 (the
#: agent's "release memory"), SIGHUP, SIGPIPE and SIGXFSZ (Python ignores the last two),
#: SIGCHLD.
_CHILD_DEFAULTS = (
    *STOPS,
    int(signal.SIGUSR1),
    int(signal.SIGHUP),
    int(signal.SIGPIPE),
    int(signal.SIGXFSZ),
    int(signal.SIGCHLD),
)
_SIG_BLOCK, _SIG_UNBLOCK = int(signal.SIG_BLOCK), int(signal.SIG_UNBLOCK)
#: How often a fenced subjob's shim looks at the fence file (issue: at least every 0.5 s).
FENCE_POLL_SECONDS = 0.5
#: SIGTERM -> SIGKILL under an expired fence, at most (the job's own grace if shorter):
#: the router counts on a fenced copy being gone within about 2 s of the deadline.
FENCE_GRACE_SECONDS = 1.0
#: How long the shim waits for a cgroup to empty after ``cgroup.kill``.
CGROUP_DRAIN_SECONDS = 5.0
PR_SET_CHILD_SUBREAPER = 36
#: libc through ctypes, for ``prctl`` (loaded once by the launcher; else on first use).
_libc: ctypes.CDLL | None = None


def write_exit(subjob_dir: str, record: dict[str, object]) -> None:
    """Write ``exit.json`` atomically (tmp + rename) so readers never see half a file.

    Not fsynced: the record has to outlive the agent (a SIGKILLed agent re-adopting
    reads it from the page cache), not the machine, whose crash ends the subjob too and
    leaves the journal's last (synchronous=NORMAL) commits just as unsure."""
    tmp = os.path.join(subjob_dir, EXIT_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, _record_json(record).encode())
    finally:
        os.close(fd)
    os.replace(tmp, os.path.join(subjob_dir, EXIT_FILE))


def _record_json(record: dict[str, object]) -> str:
    """``json.dumps`` of an exit record (numbers, None, booleans; strings rarely, for an
    error): the JSON encoder's per-call set-up costs a fresh supervisor dozens of page
    copies, this formatting none. Other values go through ``json.dumps``."""
    items = []
    for key, value in record.items():
        if value is None:
            text = "null"
        elif value is True or value is False:
            text = "true" if value else "false"
        elif type(value) is int or type(value) is float:
            text = repr(value)
        else:
            text = json.dumps(value)
        items.append(f'"{key}": {text}')
    return "{" + ", ".join(items) + "}"


def fence_expired(path: str, now: float) -> bool:
    """True once the agent's fence deadline (a CLOCK_MONOTONIC float) has passed.

    No file means no fencing. A file that is present but unreadable or garbled counts as
    expired: when in doubt, the copy stops rather than risk running twice."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        text = os.read(fd, 64)
    except OSError:
        return True
    finally:
        os.close(fd)
    try:
        return now > float(text.strip())
    except ValueError:
        return True


def _read_small(path: str) -> bytes:
    """A small kernel file (cgroup), with two syscalls and no file object."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def cgroup_pids(cgroup: str) -> list[int]:
    try:
        return [int(line) for line in _read_small(os.path.join(cgroup, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux ``prctl``), so a
    ``setsid`` grandchild whose parent exits is re-parented here, not to init, and can be
    found and stopped without cgroups. False where ``prctl`` is unavailable."""
    global _libc
    try:
        if _libc is None:  # the launcher loads it once, before it forks supervisors
            import ctypes

            _libc = ctypes.CDLL(None, use_errno=True)
        return int(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root`` (a /proc scan of parent pids)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found: list[int] = []
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def has_children() -> bool:
    """Whether this process still has a child (live or unreaped); reaps none."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def kill_leftovers() -> None:
    """Without cgroups: SIGKILL what the command left behind (descendants re-parented
    here as subreaper, ``setsid`` ones included) and reap them, as a cgroup's
    ``cgroup.kill`` would."""
    deadline = time.monotonic() + CGROUP_DRAIN_SECONDS
    while has_children() and time.monotonic() < deadline:
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            return
        time.sleep(0.01)


def signal_cgroup(cgroup: str, sig: int) -> bool:
    """``sig`` to every process in ``cgroup`` (SIGKILL through ``cgroup.kill`` where the
    kernel has it); False when it reached nobody (no ``cgroup.kill``, nobody listed). A
    process it may not signal (a setuid one, for a launcher that is not root) is skipped."""
    if sig == signal.SIGKILL and _kill_cgroup(cgroup):
        return True
    pids = cgroup_pids(cgroup)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    return bool(pids)


def signal_subjob(cgroup: str, pgid: int, child: int, sig: int) -> None:
    """Send ``sig`` to every process of the subjob but the shim itself: the whole cgroup
    where there is one (descendants that left the process group too), else the group."""
    if cgroup:
        signal_cgroup(cgroup, sig)
        return
    if sig == signal.SIGKILL:
        try:  # the group minus the shim: the child, then any process left in the group
            os.kill(child, sig)
        except ProcessLookupError:
            pass
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != os.getpid():
                try:
                    if os.getpgid(int(name)) == pgid:
                        os.kill(int(name), sig)
                except (ProcessLookupError, PermissionError):
                    pass
    else:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
    for pid in descendants(os.getpid()):  # those that left the group (setsid)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def finish_cgroup(cgroup: str) -> int:
    """Stop what the command left in its cgroup, remove it; the cgroup's peak memory."""
    peak = 0
    try:
        peak = int(_read_small(os.path.join(cgroup, "memory.peak")).strip() or 0)
    except (OSError, ValueError):
        pass
    if cgroup_pids(cgroup):
        signal_cgroup(cgroup, int(signal.SIGKILL))
    deadline = time.monotonic() + CGROUP_DRAIN_SECONDS
    while not _remove_cgroup(cgroup) and time.monotonic() <= deadline:
        time.sleep(0.01)
    return peak


class CgroupBusy(OSError):
    """The subjob's cgroup already holds processes: not this launch's, so it is not
    started (see :func:`prepare`)."""


def offer_controllers(base: str) -> tuple[list[str], OSError | None]:
    """Best effort: enable for the children of the agent's cgroup folder ``base`` the
    :data:`CONTROLLERS` it has. The ones it has, and the error that kept them from the
    children (None when enabled, or when it has none)."""
    try:
        available = set(_read_small(os.path.join(base, "cgroup.controllers")).decode().split())
    except OSError as exc:
        return [], exc
    wanted = [c for c in CONTROLLERS if c in available]
    if not wanted:
        return [], None
    try:
        fd = os.open(os.path.join(base, "cgroup.subtree_control"), os.O_WRONLY)
        try:
            os.write(fd, " ".join("+" + c for c in wanted).encode())
        finally:
            os.close(fd)
    except OSError as exc:
        return wanted, exc
    return wanted, None


def _make_cgroup(cgroup: str) -> None:
    """The subjob's cgroup; the agent's folder above it made again first if it went (an
    agent with the same id on this host removed it as it stopped with nothing running),
    with its controllers as the agent's start enables them."""
    try:
        os.mkdir(cgroup, 0o755)
    except FileNotFoundError:
        base = os.path.dirname(cgroup)
        try:
            os.mkdir(base, 0o755)
        except FileExistsError:
            pass
        offer_controllers(base)
        os.mkdir(cgroup, 0o755)


def prepare(subjob_dir: str, spec: dict[str, object]) -> str:
    """Before anything of the job runs: the subjob's cgroup and folder (root's, 0700; with a
    user, 0711 and a ``scratch`` folder that user alone owns). Both paths come from the
    agent (its delegated cgroup, its state directory), never from the job. A folder left by
    an earlier run of the same id loses its exit record. A cgroup that cannot be made is
    left out of ``spec`` (the subjob runs in its process group) and named in the warning
    returned ("" when none).

    An existing cgroup is reused only while empty (left by a run that ended, say before an
    agent crash): one that still holds processes (another agent with the same id on this
    host, or an earlier run of this subjob still alive) would have every stop, signal and
    ``cgroup.kill`` meant for this subjob reach them too, so :class:`CgroupBusy` is raised
    before the folder is touched. ``cgroup.procs`` is read only then (the usual launch
    makes a new cgroup). Not covered: two launches that make the same cgroup at once (the
    second finds it empty before the first's child has joined it).

    Raises OSError when the folder cannot be made (a cgroup made for it is removed)."""
    warning = ""
    cgroup = str(spec.get("cgroup") or "")
    made = False
    if cgroup:
        try:
            _make_cgroup(cgroup)
            made = True
        except FileExistsError:
            held = len(cgroup_pids(cgroup))
            if held:
                raise CgroupBusy(
                    f"cgroup {cgroup} still holds {held} process{'es' if held != 1 else ''} "
                    "(another agent with the same id on this host, or an earlier run still "
                    "alive); not starting"
                ) from None
        except OSError as exc:
            spec["cgroup"] = ""
            warning = f"runs without a cgroup: {exc.strerror or exc}"
    try:
        _make_folder(subjob_dir, spec)
    except Exception:
        if made:
            try:
                os.rmdir(cgroup)
            except OSError:
                pass
        raise
    return warning


def _make_folder(subjob_dir: str, spec: dict[str, object]) -> None:
    """:func:`prepare`'s folder (and its ``scratch`` for a user)."""
    try:
        os.mkdir(subjob_dir, 0o700)  # a fresh folder holds nothing stale
    except FileNotFoundError:  # the first subjob: "subjobs" itself is new
        os.makedirs(subjob_dir, 0o700, exist_ok=True)
    except FileExistsError:
        # A launch.json left by an earlier run would make an adopting agent take this
        # subjob's process for a shim (the launcher writes none; a shim's is written after
        # this).
        for stale in (EXIT_FILE, "exec_error", LAUNCH_FILE):
            try:
                os.unlink(os.path.join(subjob_dir, stale))
            except FileNotFoundError:
                pass
    user = spec.get("user")
    if isinstance(user, dict):
        # The subjob folder stays root's (traverse only) and so do its logs (the subjob
        # writes them through inherited descriptors): it cannot swap them for links.
        os.chmod(subjob_dir, 0o711)
        scratch = os.path.join(subjob_dir, "scratch")
        try:
            os.mkdir(scratch, 0o700)
        except FileExistsError:
            pass
        os.chown(scratch, int(user["uid"]), int(user["gid"]), follow_symlinks=False)
        os.chmod(scratch, 0o700, follow_symlinks=False)


class Exec:
    """What the child needs, prepared by the launcher (or shim) from the launch record
    before the fork (parsed by the same root process; nothing of it is applied there):
    the child then runs the fewest Python lines between fork and exec. Each line there
    touches (so copies) pages it shares with its parent."""

    __slots__ = (
        "argv",
        "cgroup_procs",
        "cwd",
        "env",
        "gid",
        "groups",
        "mkdirs",
        "paths",
        "uid",
        "void",
    )

    def __init__(self, spec: dict[str, object], subjob_dir: str) -> None:
        cgroup = str(spec.get("cgroup") or "")
        self.cgroup_procs = os.path.join(cgroup, "cgroup.procs") if cgroup else ""
        self.void = os.path.join(subjob_dir, VOID_FILE)
        user = spec.get("user")
        self.uid = self.gid = -1
        self.groups: list[int] = []
        if isinstance(user, dict):
            self.groups = [int(g) for g in user["groups"]]
            self.gid = int(user["gid"])
            self.uid = int(user["uid"])
        self.cwd = str(spec["cwd"])
        self.mkdirs = [str(d) for d in spec.get("mkdirs") or ()]  # type: ignore[attr-defined]
        self.argv = [str(a) for a in spec["command"]]  # type: ignore[attr-defined]
        self.env = {str(k): str(v) for k, v in spec["env"].items()}  # type: ignore[attr-defined]
        # execvpe's search, as strings only: the job's PATH, tried in the child.
        name = self.argv[0]
        if os.path.dirname(name):
            self.paths = [name]
        else:
            # os.get_exec_path(), without its warnings filters (costly in a fresh fork).
            path = self.env.get("PATH")
            dirs = (os.defpath if path is None else path).split(os.pathsep)
            self.paths = [os.path.join(d, name) for d in dirs]


def _child(job: Exec, errors_w: int) -> None:
    """In the forked child: join the cgroup, drop privileges, then apply the job."""
    for sig in _CHILD_DEFAULTS:
        _signal.signal(sig, _SIG_DFL)
    _signal.pthread_sigmask(_SIG_UNBLOCK, STOPS)  # a pending stop ends it here
    step = "cgroup"
    try:
        if job.cgroup_procs:
            fd = os.open(job.cgroup_procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        # After joining the cgroup, before anything of the job: an agent that gave up on
        # this launch wrote the void mark before killing the cgroup's processes, so either
        # this sees the mark or the agent's kill sees this process (VOID_FILE).
        step = "launch"
        if os.path.lexists(job.void):
            raise ValueError("the agent gave up on it (no answer in time); nothing of it ran")
        if job.uid >= 0:
            step = "user"
            os.setgroups(job.groups)
            os.setgid(job.gid)
            os.setuid(job.uid)
        # From here on the process has the job's identity; only now is anything of the
        # job's applied.
        step = "workdir " + job.cwd
        os.chdir(job.cwd)
        for directory in job.mkdirs:
            try:
                os.makedirs(directory, exist_ok=True)
            except OSError as exc:
                os.write(2, f"laminar: cannot create {directory}: {exc.strerror}\n".encode())
        step = job.argv[0]
        saved: OSError | None = None
        last: OSError = FileNotFoundError(2, "No such file or directory")
        for path in job.paths:  # as os.execvpe: the first error but "not there", or the last
            try:
                os.execve(path, job.argv, job.env)
            except (FileNotFoundError, NotADirectoryError) as exc:
                last = exc
            except OSError as exc:
                last = exc
                saved = saved or exc
        raise saved or last
    except (OSError, KeyError, TypeError, ValueError) as exc:
        text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        try:
            os.write(errors_w, f"{step}: {text}".encode(errors="replace"))
        finally:
            os._exit(EXEC_FAILED_CODE)


FENCE_NOTE = b"laminar: fence expired (agent out of touch); stopping subjob\n"
_SIGCONT, _SIGTERM, _SIGKILL = int(signal.SIGCONT), int(signal.SIGTERM), int(signal.SIGKILL)


def fence_step(
    fenced_at: float, expired: bool, grace_seconds: float, now: float
) -> tuple[float, tuple[int, ...]]:
    """One look at a fenced subjob, by the shim's wait and the launcher's loop alike: (when
    its fence stop began, 0.0 while none has; the signals to send it now). Past the fence
    (``expired``, which the caller reads only while no stop began): SIGCONT then SIGTERM,
    once; SIGKILL once its grace (at most FENCE_GRACE_SECONDS) is over."""
    if not fenced_at:
        return (now, (_SIGCONT, _SIGTERM)) if expired else (0.0, ())
    if now - fenced_at > min(grace_seconds, FENCE_GRACE_SECONDS):
        return fenced_at, (_SIGKILL,)
    return fenced_at, ()


def _wait(pid: int, fence: str, cgroup: str, grace_seconds: float) -> tuple[int, object, bool]:
    """Wait for the child; stop it when the fence expires. (status, rusage, fenced)."""
    if not fence:
        _, status, rusage = os.wait4(pid, 0)
        return status, rusage, False
    pidfd = os.pidfd_open(pid)
    fenced_at = 0.0
    try:
        while True:
            select.select(
                [pidfd], [], [], FENCE_POLL_SECONDS / 2 if fenced_at else FENCE_POLL_SECONDS
            )
            done, status, rusage = os.wait4(pid, os.WNOHANG)
            if done == pid:
                return status, rusage, fenced_at > 0
            now = time.monotonic()
            was = fenced_at
            expired = not was and fence_expired(fence, now)
            fenced_at, signals = fence_step(was, expired, grace_seconds, now)
            if fenced_at and not was:
                os.write(2, FENCE_NOTE)
            for sig in signals:
                signal_subjob(cgroup, os.getpgid(0), pid, sig)
    finally:
        os.close(pidfd)


def run(subjob_dir: str, spec: dict[str, object]) -> int:
    """Run the command ``spec`` describes, wait for it, write ``exit.json``."""
    # A stop can arrive before the command exists, and would find only the shim. So the
    # stop signals are blocked (held pending, not lost) until the fork: the parent then
    # ignores them and passes on any that came early; the child restores the defaults and
    # unblocks, so a pending stop ends it before it execs. (Python-level handlers cannot
    # do this: CPython drops a child's tripped-but-unrun handlers at fork.)
    _signal.signal(int(signal.SIGUSR1), _SIG_IGN)
    _signal.pthread_sigmask(_SIG_BLOCK, STOPS)
    started = time.monotonic()
    try:
        job = Exec(spec, subjob_dir)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        write_exit(subjob_dir, _failed_record(started, f"bad {LAUNCH_FILE}: {exc!r}"))
        return EXEC_FAILED_CODE
    cgroup = str(spec.get("cgroup") or "")
    # Without a cgroup, descendants that leave the process group (setsid) are found as
    # this process's re-parented children instead.
    reaper = not cgroup and become_subreaper()
    errors_r, errors_w = os.pipe()
    os.set_inheritable(errors_w, False)
    try:
        pid = os.fork()
    except OSError as exc:
        write_exit(subjob_dir, _failed_record(started, f"fork failed: {exc}"))
        return EXEC_FAILED_CODE
    if pid == 0:
        os.close(errors_r)
        _child(job, errors_w)
    early = _signal.sigpending()
    for sig in STOPS:  # from now on a stop sent to the group reaches the child itself
        _signal.signal(sig, _SIG_IGN)
    for sig in STOPS:
        if sig in early:
            os.kill(pid, sig)
    _signal.pthread_sigmask(_SIG_UNBLOCK, STOPS)
    os.close(errors_w)
    error = _read_all(errors_r).decode(errors="replace")
    fence = str(spec.get("fence") or "") if spec.get("fenced", True) else ""
    grace = float(spec.get("grace_seconds") or 10.0)  # type: ignore[arg-type]
    status, rusage, fenced = _wait(pid, fence, cgroup, grace)
    run_seconds = time.monotonic() - started
    ended_unix = time.time()
    peak = int(rusage.ru_maxrss) * 1024  # type: ignore[attr-defined]
    if cgroup:
        peak = max(peak, finish_cgroup(cgroup))
    elif reaper:
        kill_leftovers()
    write_exit(subjob_dir, exit_record(status, peak, ended_unix, run_seconds, error, fenced))
    return 0


def exit_record(
    status: int, peak: int, ended_unix: float, run_seconds: float, error: str, fenced: bool
) -> dict[str, object]:
    """The ``exit.json`` of a subjob that ended with wait status ``status`` (a shim's and
    the launcher's alike). ``ended_unix`` and ``run_seconds`` are taken when it ended, not
    when its cgroup had drained."""
    record: dict[str, object] = {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "peak_rss_bytes": peak,
        "ended_unix": ended_unix,
        "run_seconds": run_seconds,
    }
    if error:
        record["error"] = error
    if fenced:
        record["fenced"] = True
    return record


def _read_all(fd: int) -> bytes:
    """Read a pipe to its end (the child's exec closes it, or the child writes and exits)."""
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _failed_record(started: float, error: str) -> dict[str, object]:
    return {
        "exit_code": EXEC_FAILED_CODE,
        "signal": None,
        "peak_rss_bytes": 0,
        "ended_unix": time.time(),
        "run_seconds": time.monotonic() - started,
        "error": error,
    }


USAGE = (
    "usage: python -I -S shim.py <subjob_dir>   (reads <subjob_dir>/launch.json)\n"
    "       python -I -S shim.py --serve        (launcher: launch records on stdin, pids out)"
)


def serve() -> int:
    """The launcher: one long-lived copy of this module, started by the agent with the
    same clean environment, that starts every subjob of its agent itself and supervises
    them all from one loop. No Python process per subjob: a launch is one fork of this
    small process (the child joins the cgroup, drops privileges, applies the job and
    execs), and a subjob's end is one ``wait4`` here. See :class:`_Launcher`."""
    global _libc
    import ctypes  # once here (become_subreaper)
    import resource  # noqa: F401 - os.wait4 imports it (a dlopen) at the first reap otherwise

    try:
        _libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        pass
    return _Launcher().run()


_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW


class _Job:
    """One subjob the launcher started: the job's own process, its group's leader (pid ==
    pgid)."""

    __slots__ = (
        "cgroup",
        "dir",
        "drain_until",
        "ended",
        "ended_unix",
        "error",
        "errors",
        "fence",
        "fenced_at",
        "grace_seconds",
        "peak",
        "pid",
        "pidfd",
        "started",
    )

    def __init__(self, pid: int, pidfd: int, subjob_dir: str, spec: dict[str, object]) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.dir = subjob_dir
        self.cgroup = str(spec.get("cgroup") or "")
        self.fence = str(spec.get("fence") or "") if spec.get("fenced", True) else ""
        self.grace_seconds = float(spec.get("grace_seconds") or 10.0)  # type: ignore[arg-type]
        self.started = time.monotonic()
        self.error = ""
        self.errors = -1  # the pipe its child reports an exec failure on
        self.fenced_at = 0.0
        self.peak = 0
        self.drain_until = 0.0
        #: When it was seen ended (its zombie kept until it is recorded); 0.0 while it runs.
        self.ended = 0.0
        self.ended_unix = 0.0


class _Launcher:
    """The one loop that starts and supervises an agent's subjobs.

    On stdin, one launch record per line (the JSON of ``launch.json`` with the subjob's
    folder as ``dir``); on stdout, per launch in order, the job's pid, a space and a
    warning if any, or ``error ...``; and, once a subjob's ``exit.json`` is written, ``x
    PID ID`` (ID: the subjob's folder's name, so a notice is never taken for a later subjob
    given the same pid; the journaled exit: the record is on disk before the agent is
    told).

    Per launch: the folder and cgroup (:func:`prepare`), the logs opened, one fork; the
    child leads its own process group (set on both sides of the fork, so it is before
    the pid is answered: a stop the agent sends the group at once reaches it), joins the
    cgroup, drops privileges and only then applies the job (:func:`_child`). The answer
    does not wait for the exec (an exec failure comes back on a pipe, read in the loop):
    joining a cgroup can take milliseconds of wall time, and launches would queue
    behind it. Per poll: every ended child
    seen (``waitid`` with ``WNOWAIT``, or its pidfd readable) but not yet reaped, the fence
    read once for all fenced subjobs, cgroups emptied and removed without blocking (one
    still draining is retried on the next polls, until it is gone or for at most
    :data:`CGROUP_DRAIN_SECONDS`); only then is the subjob reaped (``wait4``: status and
    rusage) and its ``exit.json`` written at once. Until then its zombie keeps its pid, so
    an agent that restarts meanwhile finds it ended, with this launcher as its parent, and
    waits for the record instead of taking the subjob as lost. A zombie kept while its
    cgroup drains hides the children that ended after it from ``waitid``: a descendant
    re-parented here is reaped once it is recorded, and a subjob without a pidfd (kernels
    before 5.3) is seen ended then too.

    A handler that raises is reported on stderr and the loop goes on: one process carries
    every subjob's record.

    It is the child subreaper of its subjobs' descendants: without cgroups, what a subjob
    leaves in its process group is killed when it ends, and descendants that left the
    group (``setsid``, double forks) are re-parented here and killed once no subjob
    without a cgroup is running (they cannot be told apart from such a subjob's own).

    Durability: it outlives its agent. On stdin EOF (the agent ended, was SIGKILLed, or
    is reloading) or SIGTERM it stops taking launches and goes on reaping and writing
    ``exit.json`` until no subjob is left, then exits; a restarted agent starts a new
    launcher and re-adopts running subjobs by pid (start time against pid reuse) and
    this ``exit.json``. A launcher that is SIGKILLed leaves its subjobs running,
    re-parented to init; their exit status is then unknown, and the agent records them
    ended with that cause when they end (never lost, never started again)."""

    def __init__(self) -> None:
        self.jobs: dict[int, _Job] = {}  # by pid, until recorded (ended ones included)
        self.by_errors: dict[int, _Job] = {}
        self.by_pidfd: dict[int, _Job] = {}
        self.fenced = 0  # how many of the jobs are fenced
        self.loose = 0  # how many of the jobs have no cgroup
        self.draining: list[_Job] = []
        self.accepting = True
        self.inbox: bytes | None = b""  # None once stdin is closed
        self.outbox = bytearray()
        self.out_waiting = False  # stdout registered for EPOLLOUT
        self.agent_gone = False  # stdout's reader is gone: answers and notices dropped
        self.epoll = select.epoll()
        self.next_fence = 0.0
        self.orphans_possible = False
        self.null = os.open(os.devnull, os.O_RDWR)
        self.is_subreaper = become_subreaper()
        self.own_cgroup = b""
        try:
            self.own_cgroup = _read_small("/proc/self/cgroup")
        except OSError:
            pass

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        for fd in (wake_r, wake_w, 0, 1):
            os.set_blocking(fd, False)
        # A child's end or SIGTERM wakes the loop (the handlers themselves do nothing).
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, _ignore)
        signal.signal(signal.SIGTERM, self._stop_accepting)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.epoll.register(0, select.EPOLLIN)
        self.epoll.register(wake_r, select.EPOLLIN)
        # Every object of the start-up into the permanent generation: the collector never
        # walks them, here or in a fresh child (whose pages it would copy).
        gc.freeze()
        guarded = self._guarded
        while self.accepting or self.jobs:
            for fd, _events in self.epoll.poll(self._timeout()):
                if fd == 0:
                    guarded(self._read_launches)
                elif fd == 1:
                    guarded(self._flush)
                elif fd in self.by_errors:
                    guarded(self._read_errors, self.by_errors[fd])
                elif fd in self.by_pidfd:
                    guarded(self._end, self.by_pidfd[fd])
                elif fd == wake_r:
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
            if not self.accepting:
                guarded(self._close_stdin)
            guarded(self._reap)
            if self.draining:
                guarded(self._drain)
            if self.fenced:
                guarded(self._check_fence)
            if self.orphans_possible:
                guarded(self._sweep, final=False)
            guarded(self._flush)
        guarded(self._sweep, final=True)
        return 0

    def _guarded(self, handler: Callable[..., None], *args: object, **kwargs: object) -> None:
        """One handler of the loop: what it raises is reported on stderr, and the loop
        goes on (it carries the other subjobs' records)."""
        try:
            handler(*args, **kwargs)
        except Exception as exc:
            import traceback  # only on this path: the launcher's start-up stays small

            try:
                text = "".join(traceback.format_exception(exc))
                os.write(2, f"laminar launcher: {handler.__name__} failed: {text}".encode())
            except Exception:
                pass

    def _stop_accepting(self, signum: int, frame: object) -> None:
        self.accepting = False

    def _close_stdin(self) -> None:
        """No more launches: both pipes closed, so the agent's next record fails at once
        (it starts a shim or a fresh launcher) and whoever waits on this one's exit
        notices hears it ended (the agent then reads ``exit.json`` as this process writes
        it, as for a subjob it re-adopted)."""
        if self.agent_gone and self.inbox is None:
            return
        for fd in (0, 1):
            try:
                self.epoll.unregister(fd)
            except (OSError, ValueError):
                pass
        self._flush()
        for fd in (0, 1):
            os.dup2(self.null, fd)  # the pipes closed; the fds stay taken
        self.outbox.clear()
        self.out_waiting = False
        self.agent_gone = True
        self.inbox = None

    def _timeout(self) -> float:
        """Seconds to the next poll's work: a draining cgroup, the next fence check."""
        if self.draining or (self.orphans_possible and self.loose == 0):
            return 0.01
        if self.fenced:
            return max(0.0, self.next_fence - time.monotonic())
        return -1.0

    def _read_launches(self) -> None:
        try:
            chunk = os.read(0, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # the agent is gone (or closed us): no more launches
            self.accepting = False
            return
        self.inbox = (self.inbox or b"") + chunk
        while self.accepting and self.inbox and b"\n" in self.inbox:
            line, _, self.inbox = self.inbox.partition(b"\n")
            self._launch(line)
            self._flush()

    def _say(self, text: str) -> None:
        if not self.agent_gone:
            self.outbox += text.replace("\n", " ").encode(errors="replace") + b"\n"

    def _flush(self) -> None:
        if self.agent_gone:
            return
        while self.outbox:
            try:
                written = os.write(1, self.outbox)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: nobody reads any more
                self.outbox.clear()
                self.agent_gone = True
                break
            del self.outbox[:written]
        waiting = bool(self.outbox)
        if waiting != self.out_waiting:
            if waiting:
                self.epoll.register(1, select.EPOLLOUT)
            else:
                self.epoll.unregister(1)
            self.out_waiting = waiting

    def _launch(self, line: bytes) -> None:
        """Start one subjob and answer its pid (or why not)."""
        logs: list[int] = []
        try:
            spec = json.loads(line)
            if not isinstance(spec, dict) or not spec.get("command") or not spec.get("dir"):
                raise ValueError("no command or no dir")
            subjob_dir = str(spec["dir"])
            warning = prepare(subjob_dir, spec)
            job = Exec(spec, subjob_dir)
            entry = _Job(0, -1, subjob_dir, spec)  # before the fork: nothing after it raises
            for name in ("stdout", "stderr"):
                logs.append(os.open(os.path.join(subjob_dir, name), _APPEND, 0o600))
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            for fd in logs:
                os.close(fd)
            self._say(f"error supervisor: {exc}")
            return
        try:
            errors_r, errors_w = os.pipe()
        except OSError as exc:  # EMFILE: the agent starts a shim for it instead
            for fd in logs:
                os.close(fd)
            self._say(f"error pipe: {exc}")
            return
        # Held pending across the fork: a stop that reaches the child before it has reset
        # its handlers runs after the reset, so it ends the child instead of a copy of this
        # loop's handler.
        _signal.pthread_sigmask(_SIG_BLOCK, STOPS)
        try:
            pid = os.fork()
        except OSError as exc:
            _signal.pthread_sigmask(_SIG_UNBLOCK, STOPS)
            for fd in (*logs, errors_r, errors_w):
                os.close(fd)
            self._say(f"error fork failed: {exc}")
            return
        if pid == 0:  # pragma: no cover - the child execs or exits
            try:
                os.setpgid(0, 0)
                os.dup2(self.null, 0)
                os.dup2(logs[0], 1)
                os.dup2(logs[1], 2)
                _child(job, errors_w)
            finally:
                os._exit(EXEC_FAILED_CODE)
        # Its own group from here on (it sets it too, whichever runs first), so a signal the
        # agent sends the group as soon as it has the pid reaches it; before it has joined
        # its cgroup the agent's signals go to the group (the cgroup lists nobody yet).
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass  # it has exec'd already (EACCES) or died: either way it set its group
        _signal.pthread_sigmask(_SIG_UNBLOCK, STOPS)
        for fd in (*logs, errors_w):
            os.close(fd)
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = -1  # its SIGCHLD wakes the loop instead
        entry.pid, entry.pidfd, entry.started = pid, pidfd, time.monotonic()
        if pidfd >= 0:
            try:
                self.epoll.register(pidfd, select.EPOLLIN)
                self.by_pidfd[pidfd] = entry
            except OSError:
                os.close(pidfd)
                entry.pidfd = -1
        # Nothing after the fork may raise before the job is tracked: an untracked job
        # would run with nobody to record it.
        self.jobs[pid] = entry
        # Why it could not exec, if it could not: read as it comes (the pipe closes at
        # exec), not waited for, so the next launch does not wait on this one's cgroup join.
        try:
            os.set_blocking(errors_r, False)
            self.epoll.register(errors_r, select.EPOLLIN)
            entry.errors = errors_r
            self.by_errors[errors_r] = entry
        except OSError:  # ENOMEM, ENOSPC: its exec error, if any, is not read
            os.close(errors_r)
        self.fenced += bool(entry.fence)
        self.loose += not entry.cgroup
        if entry.fence:
            self.next_fence = min(self.next_fence, entry.started + FENCE_POLL_SECONDS)
        self._say(f"{pid} {warning}" if warning else str(pid))

    def _read_errors(self, job: _Job) -> None:
        """What the child said before it exec'd (nothing) or failed (why); closed at EOF."""
        try:
            while chunk := os.read(job.errors, 4096):
                job.error += chunk.decode(errors="replace")
        except BlockingIOError:
            return
        except OSError:
            pass
        self.epoll.unregister(job.errors)
        del self.by_errors[job.errors]
        os.close(job.errors)
        job.errors = -1

    def _reap(self) -> None:
        """Every ended child, oldest first, none reaped before it is recorded: a subjob
        is ended (:meth:`_end`); a descendant re-parented here is reaped. Stops at a
        subjob whose cgroup still drains (its zombie hides the later ones)."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            job = self.jobs.get(info.si_pid)
            if job is None:  # a descendant re-parented here (subreaper), now ended
                try:
                    os.waitpid(info.si_pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                continue
            if not job.ended:
                self._end(job)
            if job.pid not in self.jobs:  # recorded
                continue
            if job in self.draining:  # its cgroup drains: kept till then
                return
            self._record(job)  # its end was cut short (a handler raised): recorded now

    def _end(self, job: _Job) -> None:
        """A subjob's process has ended (a zombie, not reaped: its pid stays taken): stop
        what it left (its cgroup, else its process group, which the zombie keeps from
        being reused), then record it, or once its cgroup has drained."""
        if job.ended:
            return
        job.ended = time.monotonic()
        job.ended_unix = time.time()
        self.fenced -= bool(job.fence)
        self.loose -= not job.cgroup
        if job.pidfd >= 0:  # readable from now on: out of the poll
            del self.by_pidfd[job.pidfd]
            self.epoll.unregister(job.pidfd)
            os.close(job.pidfd)
            job.pidfd = -1
        if job.errors >= 0:  # it has ended: all it wrote is in the pipe
            self._read_errors(job)
        if job.cgroup:
            try:
                job.peak = int(_read_small(os.path.join(job.cgroup, "memory.peak")).strip() or 0)
            except (OSError, ValueError):
                pass
            if cgroup_pids(job.cgroup):
                self._signal(job, int(signal.SIGKILL))
            if not _remove_cgroup(job.cgroup):
                job.drain_until = job.ended + CGROUP_DRAIN_SECONDS
                self.draining.append(job)
                return
        else:
            try:  # what it left in its group
                os.killpg(job.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.orphans_possible = self.is_subreaper
        self._record(job)

    def _drain(self) -> None:
        now = time.monotonic()
        for job in list(self.draining):
            if _remove_cgroup(job.cgroup) or now > job.drain_until:
                self.draining.remove(job)
                self._record(job)

    def _record(self, job: _Job) -> None:
        """The journaled exit: reaped, ``exit.json`` written with nothing in between,
        then the agent is told."""
        del self.jobs[job.pid]
        error = job.error
        try:
            _, status, rusage = os.wait4(job.pid, 0)  # a zombie: at once
            peak = max(job.peak, int(rusage.ru_maxrss) * 1024)
        except ChildProcessError:  # cannot be (it was our zombie); recorded as unknown
            status, peak = -1, job.peak
            error = error or "reaped elsewhere: exit status unknown"
        record = exit_record(
            status, peak, job.ended_unix, job.ended - job.started, error, job.fenced_at > 0
        )
        if status == -1:
            record["exit_code"] = record["signal"] = None
        try:
            write_exit(job.dir, record)
        except OSError:
            pass  # the agent finds no record and says so
        self._say(f"x {job.pid} {os.path.basename(job.dir)}")

    def _signal(self, job: _Job, sig: int) -> None:
        """``sig`` to every process of the subjob: its cgroup where it has one, else its
        process group."""
        if job.cgroup and signal_cgroup(job.cgroup, sig):
            return
        try:
            os.killpg(job.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _check_fence(self) -> None:
        """Once per poll period, for every fenced subjob at once: past the fence, SIGTERM
        (after a SIGCONT), then SIGKILL after its grace (at most FENCE_GRACE_SECONDS)."""
        now = time.monotonic()
        if now < self.next_fence:
            return
        read: dict[str, bool] = {}  # each fence file read once per look

        def past(fence: str) -> bool:
            if fence not in read:
                read[fence] = fence_expired(fence, now)
            return read[fence]

        stopping = False
        for job in self.jobs.values():
            if not job.fence or job.ended:
                continue
            was = job.fenced_at
            expired = not was and past(job.fence)
            job.fenced_at, signals = fence_step(was, expired, job.grace_seconds, now)
            if job.fenced_at and not was:
                _note(job.dir, FENCE_NOTE)
            for sig in signals:
                self._signal(job, sig)
            stopping = stopping or bool(job.fenced_at)
        self.next_fence = now + (FENCE_POLL_SECONDS / 2 if stopping else FENCE_POLL_SECONDS)

    def _orphans(self) -> list[int]:
        """This process's children that are no subjob: descendants re-parented here."""
        me = os.getpid()
        try:
            text = _read_small(f"/proc/{me}/task/{me}/children")
            children = [int(pid) for pid in text.split()]
        except (OSError, ValueError):
            children = [pid for pid in descendants(me) if _parent(pid) == me]
        return [pid for pid in children if pid not in self.jobs]

    def _sweep(self, *, final: bool) -> None:
        """Kill what subjobs without a cgroup left behind outside their groups, once none
        of them runs (the leftovers of one cannot be told from another's processes); a
        descendant in a cgroup of its own is its subjob's (``cgroup.kill`` ends it).
        ``final``: the launcher is about to exit; wait (a little) until they are gone."""
        if self.loose:
            return
        deadline = time.monotonic() + (CGROUP_DRAIN_SECONDS if final else 0.0)
        while True:
            self.orphans_possible = False
            for pid in self._orphans():
                try:
                    if self.own_cgroup and _read_small(f"/proc/{pid}/cgroup") != self.own_cgroup:
                        continue
                    os.kill(pid, signal.SIGKILL)
                    self.orphans_possible = True  # its own children come here next
                except OSError:
                    pass
            self._reap()
            if not final or not self.orphans_possible or time.monotonic() > deadline:
                return
            time.sleep(0.01)


def _ignore(signum: int, frame: object) -> None:
    """A handler that does nothing: the signal only wakes the loop (its wakeup fd)."""


def _parent(pid: int) -> int:
    try:
        return int(_read_small(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _remove_cgroup(cgroup: str) -> bool:
    """Remove an empty cgroup; False while it still holds processes."""
    try:
        os.rmdir(cgroup)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _kill_cgroup(cgroup: str) -> bool:
    try:
        fd = os.open(os.path.join(cgroup, "cgroup.kill"), os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, b"1")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _note(subjob_dir: str, text: bytes) -> None:
    """A line in the subjob's ``stderr`` log (the launcher's own notes on it)."""
    try:
        fd = os.open(os.path.join(subjob_dir, "stderr"), _APPEND, 0o600)
    except OSError:
        return
    try:
        os.write(fd, text)
    except OSError:
        pass
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--serve"]:
        return serve()
    if len(args) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    subjob_dir = args[0]
    try:
        fd = os.open(os.path.join(subjob_dir, LAUNCH_FILE), os.O_RDONLY | os.O_NOFOLLOW)
        try:  # raw reads: no file object, fewer pages touched in a fresh fork
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
        finally:
            os.close(fd)
        spec = json.loads(b"".join(chunks))
        if not isinstance(spec, dict) or not spec.get("command"):
            raise ValueError("no command")
    except (OSError, ValueError) as exc:
        write_exit(subjob_dir, _failed_record(time.monotonic(), f"bad {LAUNCH_FILE}: {exc}"))
        return EXEC_FAILED_CODE
    return run(subjob_dir, spec)


if __name__ == "__main__":
    sys.exit(main())
