"""Subjob shim: runs one command and records how it ended in ``<subjob_dir>/exit.json``.

The agent starts the shim in a new session, so the shim is the process group leader.
The shim exists because after an agent restart the subjob is no longer the agent's
child: ``exit.json`` is how a re-adopting agent learns the exit status. It is also what
supervises the subjob outside the agent process: it enforces the agent's fence (a
subjob whose agent lost touch with its router is stopped, see ``FENCE_FILE``) and, with
cgroups, stops whatever the command left behind.

Trust boundary: when the agent is root the shim stays root (it writes ``exit.json`` in
a folder the subjob cannot touch), so it must never run anything of the job's. It is
started as ``python -I -S shim.py <subjob_dir>`` with a fixed clean environment: ``-I``
ignores every ``PYTHON*`` variable and the user site, ``-S`` skips ``site``, and the job's
environment never reaches the shim's own process (no ``LD_PRELOAD``,
``LD_LIBRARY_PATH``, ``PYTHONPATH``, ``PYTHONSTARTUP``). What to run is the agent's
launch record: one line on the launcher's stdin (:func:`serve`), or, for a shim the agent
starts directly, ``<subjob_dir>/launch.json`` in a folder only root can write. The
supervisor creates the subjob's folder and cgroup (:func:`prepare`: paths the agent
chose, under its own state directory and cgroup, never the job's). The child joins the
subjob's cgroup, drops privileges (groups, gid, uid), and only then applies anything of
the job: its working directory, the folders it creates, and its environment, which goes
straight to ``execve``.

It imports the standard library only, and little of it: its start-up is on every
launch's path.
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

EXIT_FILE = "exit.json"
LAUNCH_FILE = "launch.json"
#: In a subjob's folder: the agent gave up on this launch (its launcher did not answer in
#: time, or the launch was cancelled) and recorded it failed. A supervisor that starts
#: late finds it after its child joined the cgroup and runs nothing of the job; the
#: agent, having written it, kills whatever already joined the cgroup (one of the two
#: always sees the other).
VOID_FILE = "void"
#: The agent's fence, in its state directory: a CLOCK_MONOTONIC deadline the agent moves
#: forward while its router hears from it. Past it, fenced subjobs are stopped.
FENCE_FILE = "fence"
EXEC_FAILED_CODE = 127
#: The stop signals a supervisor holds back until its child exists (see :func:`run`).
STOPS = (int(signal.SIGTERM), int(signal.SIGINT))
_SIG_DFL, _SIG_IGN = int(signal.SIG_DFL), int(signal.SIG_IGN)
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


def signal_subjob(cgroup: str, pgid: int, child: int, sig: int) -> None:
    """Send ``sig`` to every process of the subjob but the shim itself: the whole cgroup
    where there is one (descendants that left the process group too), else the group."""
    if cgroup:
        if sig == signal.SIGKILL:
            try:
                with open(os.path.join(cgroup, "cgroup.kill"), "w", encoding="ascii") as f:
                    f.write("1")
                return
            except OSError:
                pass
        for pid in cgroup_pids(cgroup):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
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
        signal_subjob(cgroup, 0, 0, signal.SIGKILL)
    deadline = time.monotonic() + CGROUP_DRAIN_SECONDS
    while True:
        try:
            os.rmdir(cgroup)
            break
        except FileNotFoundError:
            break
        except OSError:
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
    return peak


def prepare(subjob_dir: str, spec: dict[str, object]) -> str:
    """Before anything of the job runs: the subjob's folder (root's, 0700; with a user, 0711
    and a ``scratch`` folder that user alone owns) and its cgroup. Both paths come from the
    agent (its state directory, its delegated cgroup), never from the job. A folder left by
    an earlier run of the same id loses its exit record. A cgroup that cannot be made is
    left out of ``spec`` (the subjob runs in its process group) and named in the warning
    returned ("" when none). Raises OSError when the folder cannot be made."""
    try:
        os.mkdir(subjob_dir, 0o700)  # a fresh folder holds nothing stale
    except FileNotFoundError:  # the first subjob: "subjobs" itself is new
        os.makedirs(subjob_dir, 0o700, exist_ok=True)
    except FileExistsError:
        for stale in (EXIT_FILE, "exec_error"):
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
    cgroup = str(spec.get("cgroup") or "")
    if cgroup:
        try:
            os.mkdir(cgroup, 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            spec["cgroup"] = ""
            return f"runs without a cgroup: {exc.strerror or exc}"
    return ""


class Exec:
    """What the child needs, prepared by the supervisor from ``launch.json`` before the
    fork (parsed as before, by the same root process; nothing of it is applied here):
    the child then runs the fewest Python lines between fork and exec. Each line there
    touches (so copies) pages it shares with its parent, which was a millisecond of CPU
    per launch."""

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
    for sig in (*STOPS, int(signal.SIGUSR1)):
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
            if fenced_at == 0.0 and fence_expired(fence, now):
                fenced_at = now
                os.write(2, b"laminar: fence expired (agent out of touch); stopping subjob\n")
                signal_subjob(cgroup, os.getpgid(0), pid, signal.SIGCONT)
                signal_subjob(cgroup, os.getpgid(0), pid, signal.SIGTERM)
            elif fenced_at and now - fenced_at > min(grace_seconds, FENCE_GRACE_SECONDS):
                signal_subjob(cgroup, os.getpgid(0), pid, signal.SIGKILL)
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
    peak = int(rusage.ru_maxrss) * 1024  # type: ignore[attr-defined]
    if cgroup:
        peak = max(peak, finish_cgroup(cgroup))
    elif reaper:
        kill_leftovers()
    record: dict[str, object] = {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "peak_rss_bytes": peak,
        "ended_unix": time.time(),
        "run_seconds": run_seconds,
    }
    if error:
        record["error"] = error
    if fenced:
        record["fenced"] = True
    write_exit(subjob_dir, record)
    return 0


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
    """The pre-forked launcher: one long-lived copy of this module, started by the agent
    with the same clean environment, that forks a supervisor per subjob instead of the
    agent starting a new interpreter for each (the interpreter's start-up was most of a
    launch's CPU). It reads one launch record per line on stdin (the JSON of
    ``launch.json`` with the subjob's folder as ``dir``) and answers per line on stdout
    the supervisor's pid, a space and a warning if any, or ``error ...``. The supervisor
    makes the folder and cgroup (:func:`prepare`: the agent's event loop no longer waits
    on those file-system calls) and is then exactly the shim above: a new session, logs
    on fds 1 and 2, ``run()``, ``exit.json``. It does not
    depend on the launcher: if the launcher ends (its agent died: stdin reaches EOF),
    running supervisors go on and a restarted agent re-adopts them as before."""
    # Reap supervisors as they end (waiting, not ignoring SIGCHLD, so their CPU time
    # counts in this process's children's time, where a benchmark can see it).
    signal.signal(signal.SIGCHLD, _reap_supervisors)
    global _libc
    import ctypes  # once here, not in each supervisor (become_subreaper)
    import resource  # noqa: F401 - os.wait4 imports it (a dlopen) in each supervisor otherwise

    try:
        _libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    # Every object of the start-up into the permanent generation: the collector then
    # never walks them, in here or in a supervisor, whose collections would otherwise
    # touch (and so copy-on-write) all their pages. Measured: ~0.45 ms less CPU per
    # launch (5.4 -> 5.0 ms for launcher, supervisor and `true`, 300 launches).
    gc.freeze()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while line := stdin.readline():
        ready_r, ready_w = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(ready_r)
            os.close(ready_w)
            stdout.write(f"error fork failed: {exc}\n".encode())
            stdout.flush()
            continue
        if pid == 0:
            os.close(ready_r)
            os._exit(_supervise(line, ready_w))
        os.close(ready_w)
        # Answer only once the supervisor leads its own session with the stop signals
        # held and its folder and cgroup exist: a stop the agent sends to the group right
        # away is then never lost. Its word: "ok", "ok WARNING" or "error WHY"; nothing
        # when it died first (its pid then ends without an exit record, which the agent
        # reports).
        said = os.read(ready_r, 4096)
        os.close(ready_r)
        if said.startswith(b"error"):
            stdout.write(said.replace(b"\n", b" ") + b"\n")
        else:
            stdout.write(f"{pid}".encode() + said[2:].replace(b"\n", b" ") + b"\n")
        stdout.flush()
    return 0


def _reap_supervisors(signum: int, frame: object) -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _supervise(line: bytes, ready_w: int) -> int:
    """In a forked supervisor: make the subjob's folder and cgroup (:func:`prepare`) from
    the launch record ``line`` (the agent's JSON, with the folder as ``dir``), then become
    what ``python -I -S shim.py DIR`` would have been."""
    subjob_dir = ""
    try:
        _signal.pthread_sigmask(_SIG_BLOCK, STOPS)
        _signal.signal(int(signal.SIGCHLD), _SIG_DFL)  # it waits for its own child
        os.setsid()
        try:
            spec = json.loads(line)
            if not isinstance(spec, dict) or not spec.get("command") or not spec.get("dir"):
                raise ValueError("no command or no dir")
            warning = prepare(str(spec["dir"]), spec)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            os.write(ready_w, f"error supervisor: {exc}".encode(errors="replace"))
            return EXEC_FAILED_CODE
        subjob_dir = str(spec["dir"])
        os.write(ready_w, f"ok {warning}".encode(errors="replace") if warning else b"ok")
        os.close(ready_w)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        append = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
        for fd, name in ((1, "stdout"), (2, "stderr")):
            log = os.open(os.path.join(subjob_dir, name), append, 0o600)
            os.dup2(log, fd)
            os.close(log)
        os.close(null)
        return run(subjob_dir, spec)
    except BaseException as exc:  # never return into the launcher's loop
        try:
            if subjob_dir:
                write_exit(subjob_dir, _failed_record(time.monotonic(), f"supervisor: {exc}"))
        except OSError:
            pass
        return EXEC_FAILED_CODE


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
