"""Issue 13, items 1, 5 and 6, re-enacted against a real agent running as root.

A malicious tenant's job tries to run its code as root through the environment
(PYTHONPATH, LD_PRELOAD, LD_LIBRARY_PATH, PYTHONSTARTUP), to wedge or inform the agent
through the files it controls (a FIFO or a link as its progress file), to outlive a
cancel (a ``setsid`` grandchild), and to reach another tenant's subjob (signal it, read
its environment). Each must fail for the attacker, checked from the outside, with the
agent healthy afterwards. Root-only: skipped with a printed reason elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from waiting import is_gone, wait_for

from laminar_agent.cgroups import cgroup2_mount
from laminar_agent.executor import RUN_AS_ENV
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from laminar_cli.cluster import AgentProcess, LocalCluster

TERMINAL = {common_pb2.SUCCEEDED, common_pb2.FAILED, common_pb2.KILLED, common_pb2.LOST}
IS_ROOT = os.geteuid() == 0


def _skip(reason: str) -> None:
    print(reason)
    pytest.skip(reason)


def _need_root() -> None:
    if not IS_ROOT:
        _skip(f"needs root: the agent drops privileges only as root (uid {os.geteuid()})")


def _python_for_others() -> str:
    """A Python another user may execute (ours may sit under a root-only folder)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        path = Path(candidate).resolve()
        if path.exists() and all(p.stat().st_mode & stat.S_IXOTH for p in (path, *path.parents)):
            return candidate
    _skip(f"no Python that another user may run ({sys.executable} is root's only)")
    raise AssertionError("unreachable")


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every user may traverse (pytest's tmp_path is root's only)."""
    path = Path(tempfile.mkdtemp(prefix="laminar-sec-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agent(open_dir: Path) -> Iterator[AgentProcess]:
    """A real root agent whose tenants each get a uid of the default pool."""
    _need_root()
    (open_dir / "cluster").mkdir(mode=0o755)
    with LocalCluster(open_dir / "cluster", env={RUN_AS_ENV: "nobody"}) as cluster:
        yield cluster.start_agent("sec", "4xH100-80GB")


def _stub(agent: AgentProcess) -> agent_pb2_grpc.AgentStub:
    return agent_pb2_grpc.AgentStub(grpc.insecure_channel(agent.address))


def _start(
    stub: agent_pb2_grpc.AgentStub,
    subjob_id: str,
    command: list[str],
    *,
    tenant: str = "mallory",
    env: dict[str, str] | None = None,
    unit_count: int = 0,
    checkpoint_dir: str = "",
) -> None:
    spec = common_pb2.SubjobSpec(
        subjob_id=subjob_id,
        job_id=f"job-{subjob_id}",
        tenant=tenant,
        command=command,
        env=env or {},
        unit_count=unit_count,
        checkpoint_dir=checkpoint_dir,
    )
    reply = stub.Probe(
        agent_pb2.ProbeRequest(
            job_id=spec.job_id,
            resources=common_pb2.Resources(gpus=1),
            commit_if_fits=True,
            spec=spec,
        ),
        timeout=10,
    )
    assert reply.HasField("lease"), reply


def _subjob(stub: agent_pb2_grpc.AgentStub, subjob_id: str) -> common_pb2.Subjob:
    return stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id=subjob_id), timeout=10)


def _final(stub: agent_pb2_grpc.AgentStub, subjob_id: str) -> common_pb2.Subjob:
    wait_for(lambda: _subjob(stub, subjob_id).state in TERMINAL)
    return _subjob(stub, subjob_id)


def _healthy(stub: agent_pb2_grpc.AgentStub) -> bool:
    stub.GetSummary(agent_pb2.GetSummaryRequest(), timeout=5)
    return True


def _world_writable(path: Path) -> Path:
    path.mkdir()
    path.chmod(0o1777)
    return path


PAYLOAD = "import os\nopen(os.path.join({marks!r}, 'py-%d-%d' % (os.getuid(), os.getpid())), 'w')\n"


def _compile_preload(open_dir: Path, marks: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    source = open_dir / "preload.c"
    source.write_text(
        "#include <stdio.h>\n#include <unistd.h>\n"
        "__attribute__((constructor)) static void hit(void) {\n"
        '  char p[512]; snprintf(p, sizeof p, "%s/so-%d-%d", '
        f'"{marks}", (int)getuid(), (int)getpid());\n'
        '  FILE *f = fopen(p, "w"); if (f) fclose(f);\n}\n'
    )
    library = open_dir / "payload.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    library.chmod(0o755)
    return library


def test_a_tenants_environment_never_runs_anything_as_root(
    agent: AgentProcess, open_dir: Path
) -> None:
    """PYTHONPATH (sitecustomize.py), LD_PRELOAD, LD_LIBRARY_PATH and PYTHONSTARTUP in a
    job's environment: the payload runs, but only ever as the job's own uid, and the
    launcher that stays root starts with none of it."""
    python = _python_for_others()
    marks = _world_writable(open_dir / "marks")
    payload = open_dir / "payload"
    payload.mkdir(mode=0o755)
    (payload / "sitecustomize.py").write_text(PAYLOAD.format(marks=str(marks)))
    (payload / "startup.py").write_text(PAYLOAD.format(marks=str(marks)))
    env = {
        "PYTHONPATH": str(payload),
        "PYTHONSTARTUP": str(payload / "startup.py"),
        "LD_LIBRARY_PATH": str(payload),
    }
    library = _compile_preload(open_dir, marks)
    if library is not None:
        env["LD_PRELOAD"] = str(library)
    else:
        print("no C compiler: the LD_PRELOAD payload is not built (the others still run)")
    gate = marks / "gate"
    code = f"import os,time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)\n"
    stub = _stub(agent)
    _start(stub, "evil", [python, "-c", code], env=env)
    wait_for(lambda: _subjob(stub, "evil").pid > 0)
    job_pid = _subjob(stub, "evil").pid
    # The job's own process, started by the launcher, which stays root. (The pid is
    # answered right after the fork: the child drops privileges before it execs.)
    wait_for(lambda: Path(f"/proc/{job_pid}/status").read_text().count("Uid:\t0\t") == 0)
    launcher_pid = int(Path(f"/proc/{job_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert b"--serve" in Path(f"/proc/{launcher_pid}/cmdline").read_bytes()
    launcher_env = Path(f"/proc/{launcher_pid}/environ").read_bytes().split(b"\0")
    launcher_keys = {item.partition(b"=")[0].decode() for item in launcher_env if item}
    assert Path(f"/proc/{launcher_pid}/status").read_text().count("Uid:\t0\t") == 1
    assert not launcher_keys & {"PYTHONPATH", "PYTHONSTARTUP", "LD_LIBRARY_PATH", "LD_PRELOAD"}
    gate.write_text("")
    subjob = _final(stub, "evil")
    assert subjob.state == common_pb2.SUCCEEDED, subjob.reason
    hits = sorted(p.name for p in marks.iterdir() if p.name != "gate")
    # The payload did run (so this test can fail), and never as root.
    assert any(name.startswith("py-") for name in hits), hits
    if library is not None:
        assert any(name.startswith("so-") for name in hits), hits
    uids = {int(name.split("-")[1]) for name in hits}
    assert 0 not in uids, hits
    assert _healthy(stub)


def test_a_fifo_or_a_link_as_progress_file_neither_wedges_nor_informs_the_agent(
    agent: AgentProcess, open_dir: Path
) -> None:
    python = _python_for_others()
    stub = _stub(agent)
    shared = _world_writable(open_dir / "ckpt")
    for name, make in (
        ("fifo", "os.mkfifo(p)"),
        ("link", "os.symlink('/etc/shadow', p)"),
    ):
        ckpt = shared / name
        code = f"import os\nos.makedirs({str(ckpt)!r}, exist_ok=True)\np = {str(ckpt / 'progress')!r}\n{make}\n"
        _start(
            stub,
            f"prog-{name}",
            [python, "-c", code],
            unit_count=4,
            checkpoint_dir=str(ckpt),
        )
        subjob = _final(stub, f"prog-{name}")
        assert "refused" in subjob.reason, subjob.reason
        assert "root:" not in subjob.reason
        assert subjob.units_done == 0
        assert _healthy(stub)


def _cgroups_writable() -> bool:
    mount = cgroup2_mount()
    if mount is None:
        return False
    probe = mount / "laminar-test-probe"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return False
    return True


def test_cancel_ends_a_setsid_grandchild(agent: AgentProcess, open_dir: Path) -> None:
    if not _cgroups_writable():
        _skip("no writable cgroup2 hierarchy here: a setsid grandchild escapes process groups")
    python = _python_for_others()
    marks = _world_writable(open_dir / "marks")
    pid_file = marks / "grandchild"
    code = (
        "import subprocess, time\n"
        "p = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(300)\n"
    )
    stub = _stub(agent)
    _start(stub, "escaper", [python, "-c", code])
    wait_for(lambda: pid_file.exists() and pid_file.read_text() != "")
    grandchild = int(pid_file.read_text())
    assert not is_gone(grandchild)
    stub.SignalSubjob(
        agent_pb2.SignalSubjobRequest(
            subjob_id="escaper", signal=agent_pb2.TERMINATE, reason="cancel", grace_seconds=1
        ),
        timeout=10,
    )
    assert _final(stub, "escaper").state == common_pb2.KILLED
    wait_for(lambda: is_gone(grandchild), timeout_seconds=10)
    assert _healthy(stub)


def test_tenants_cannot_signal_or_read_each_other(agent: AgentProcess, open_dir: Path) -> None:
    python = _python_for_others()
    marks = _world_writable(open_dir / "marks")
    alice_pid = marks / "alice.pid"
    gate = marks / "gate"
    alice_log = str(Path(agent.state_dir) / "subjobs" / "alice" / "stdout")
    alice = (
        "import os, time\n"
        "print('alice-private', flush=True)\n"
        f"open({str(alice_pid)!r}, 'w').write(str(os.getpid()))\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.02)\n"
    )
    bob = (
        "import json, os, time\n"
        f"while not os.path.exists({str(alice_pid)!r}) or not open({str(alice_pid)!r}).read(): time.sleep(0.02)\n"
        f"pid = int(open({str(alice_pid)!r}).read())\n"
        "out = {'uid': os.getuid()}\n"
        "try:\n    os.kill(pid, 0); out['kill'] = 'allowed'\n"
        "except PermissionError: out['kill'] = 'denied'\n"
        "try:\n    open('/proc/%d/environ' % pid).read(); out['environ'] = 'read'\n"
        "except PermissionError: out['environ'] = 'denied'\n"
        f"try:\n    open({alice_log!r}).read(); out['log'] = 'read'\n"
        "except PermissionError: out['log'] = 'denied'\n"
        "print(json.dumps(out))\n"
    )
    stub = _stub(agent)
    _start(stub, "alice", [python, "-c", alice], tenant="alice", env={"SECRET": "a-secret"})
    _start(stub, "bob", [python, "-c", bob], tenant="bob")
    bob_end = _final(stub, "bob")
    assert bob_end.state == common_pb2.SUCCEEDED, bob_end.reason
    out = stub.ReadLogs(agent_pb2.ReadLogsRequest(subjob_id="bob", stream="stdout"), timeout=10)
    seen = json.loads(out.data)
    assert seen == {"uid": seen["uid"], "kill": "denied", "environ": "denied", "log": "denied"}
    assert seen["uid"] not in (0, os.stat(alice_pid).st_uid)
    gate.write_text("")
    assert _final(stub, "alice").state == common_pb2.SUCCEEDED
    assert _healthy(stub)


def test_the_journal_logs_and_state_folder_are_private(agent: AgentProcess, open_dir: Path) -> None:
    python = _python_for_others()
    stub = _stub(agent)
    _start(stub, "quiet", [python, "-c", "print('hello')"], env={"TOKEN": "s3cret"})
    assert _final(stub, "quiet").state == common_pb2.SUCCEEDED
    state = Path(agent.state_dir)
    assert stat.S_IMODE(state.stat().st_mode) & 0o066 == 0
    for name in ("agent.db", "agent.db-wal"):
        if (state / name).exists():
            assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name
    sdir = state / "subjobs" / "quiet"
    for name in ("stdout", "stderr", "exit.json"):
        assert stat.S_IMODE((sdir / name).stat().st_mode) == 0o600, name
        assert (sdir / name).stat().st_uid == 0
    # The launch record (the job's environment) went to the launcher through its pipe.
    assert not (sdir / "launch.json").exists()
