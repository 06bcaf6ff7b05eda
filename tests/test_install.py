"""Install: example configs that match the config dataclasses, Makefile install targets that
write only under DESTDIR, and systemd units that read /etc/laminar/*.toml and verify."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_for

from laminar_agent.config import AgentConfig
from laminar_base.configlib import load_config, render_example
from laminar_zone.config import ZoneConfig

REPO = Path(__file__).resolve().parent.parent
EXAMPLES: list[tuple[str, Any, str]] = [
    ("agent", AgentConfig, "laminar-agent"),
    ("zone", ZoneConfig, "laminar-zone"),
]


@pytest.mark.parametrize(("name", "root", "daemon"), EXAMPLES)
def test_example_config_lists_every_key_at_its_default(name: str, root: Any, daemon: str) -> None:
    path = REPO / "etc" / "laminar" / f"{name}.toml"
    expected = render_example(root, f"{daemon}: /etc/laminar/{name}.toml")
    assert path.read_text() == expected, f"{path} is stale: run `make etc`"
    assert load_config(root, toml_path=path) == root()


def _make(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_install_config_and_units_write_under_destdir_and_keep_edited_files(
    tmp_path: Path,
) -> None:
    if shutil.which("make") is None or shutil.which("install") is None:
        pytest.skip("make or install(1) is not on PATH")
    result = _make("install-config", "install-units", f"DESTDIR={tmp_path}")
    assert result.returncode == 0, result.stderr
    for name, _, daemon in EXAMPLES:
        config = tmp_path / "etc" / "laminar" / f"{name}.toml"
        assert config.read_text() == (REPO / "etc" / "laminar" / f"{name}.toml").read_text()
        unit = tmp_path / "etc" / "systemd" / "system" / f"{daemon}.service"
        assert unit.read_text() == (REPO / "systemd" / f"{daemon}.service").read_text()
        # Documentation= names a file the same step installed.
        docs = [line for line in unit.read_text().splitlines() if line.startswith("Documentation=")]
        for doc in docs:
            path = doc.removeprefix("Documentation=file://")
            assert (tmp_path / path.lstrip("/")).is_file(), doc
    # The router's user: a sysusers.d line, made by systemd-sysusers (not run when staged).
    sysusers = (tmp_path / "etc" / "sysusers.d" / "laminar.conf").read_text()
    assert "\nu laminar-zone " in sysusers
    zone_unit = (REPO / "systemd" / "laminar-zone.service").read_text()
    keys = {line.partition("=")[0] for line in zone_unit.splitlines() if "=" in line}
    assert "User=laminar-zone\n" in zone_unit and not keys & {"DynamicUser", "LoadCredential"}
    # Another PREFIX: the units run the scripts `make install PREFIX=` linked there.
    staged = tmp_path / "usr-prefix"
    result = _make("install-units", f"DESTDIR={staged}", "PREFIX=/usr")
    assert result.returncode == 0, result.stderr
    for _, _, daemon in EXAMPLES:
        unit = (staged / "etc" / "systemd" / "system" / f"{daemon}.service").read_text()
        assert f"\nExecStart=/usr/bin/{daemon} " in unit and "/usr/local/" not in unit
    edited = tmp_path / "etc" / "laminar" / "agent.toml"
    edited.write_text('[zone]\nzone = "router:7400"\n')
    result = _make("install-config", f"DESTDIR={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "keeping" in result.stdout
    assert edited.read_text() == '[zone]\nzone = "router:7400"\n'


SCRIPTS = ("laminar", "laminar-agent", "laminar-zone")


def test_make_install_defaults_to_a_venv_under_usr_local_linked_into_its_bin() -> None:
    """The units run /usr/local/bin/laminar-*: a plain `make install` puts them there,
    as links into its own venv (never pip into the system Python, which Debian refuses)."""
    if shutil.which("make") is None:
        pytest.skip("make is not on PATH")
    result = _make("-n", "install", "PYTHON=python3")
    assert result.returncode == 0, result.stderr
    assert "python3 -m venv /usr/local/lib/laminar\n" in result.stdout
    assert "/usr/local/lib/laminar/bin/python -m pip install" in result.stdout
    assert "-c constraints.txt ." in result.stdout
    assert "ln -sfn /usr/local/lib/laminar/bin/$s /usr/local/bin/$s" in result.stdout
    assert "python3 -m pip install" not in result.stdout


@pytest.mark.slow
def test_make_install_stages_a_venv_whose_scripts_run_where_the_units_look(
    tmp_path: Path,
) -> None:
    """A real `make install PREFIX=... DESTDIR=...` (as a package would stage it), then the
    staged tree moved to PREFIX (as the package's install does): the three scripts are links
    in PREFIX/bin into the venv, nothing names the stage, the daemons start from there, and
    the venv holds the versions constraints.txt pins. On Debian 12's Python the old
    `pip install --prefix /usr/local` put them in /usr/local/local/bin (203/EXEC)."""
    if shutil.which("make") is None or shutil.which("install") is None:
        pytest.skip("make or install(1) is not on PATH")
    prefix, stage = tmp_path / "usr", tmp_path / "stage"
    result = _make(
        "install", f"PREFIX={prefix}", f"DESTDIR={stage}", f"PYTHON={sys.executable}", timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    staged = Path(f"{stage}{prefix}")
    home = prefix / "lib" / "laminar"
    for script in SCRIPTS:
        link = staged / "bin" / script
        assert link.is_symlink() and os.readlink(link) == f"{home}/bin/{script}", link
    named = [
        path.name
        for path in [*(staged / "lib" / "laminar" / "bin").iterdir(), staged / "lib" / "laminar" / "pyvenv.cfg"]
        if path.is_file() and not path.is_symlink() and str(stage) in path.read_text(errors="replace")
    ]  # fmt: skip
    assert not named, f"still naming the stage: {named}"
    staged.rename(prefix)
    for daemon in ("laminar-agent", "laminar-zone"):
        ran = subprocess.run(
            [str(prefix / "bin" / daemon), "--help"], capture_output=True, text=True, timeout=60
        )
        assert ran.returncode == 0 and "--config" in ran.stdout, ran.stderr
    probe = "import grpc, laminar_zone; print(laminar_zone.__file__); print(grpc.__version__)"
    ran = subprocess.run(
        [str(home / "bin" / "python"), "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # not the checkout: `-c` puts the current folder first on sys.path
    )
    where, grpc_version = ran.stdout.split()
    assert where.startswith(f"{home}/"), where
    pins = dict(
        line.split("==", 1)
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert grpc_version == pins["grpcio"]


@pytest.mark.parametrize(("name", "root", "daemon"), EXAMPLES)
def test_systemd_unit_reads_the_installed_config_and_verifies(
    tmp_path: Path, name: str, root: Any, daemon: str
) -> None:
    unit = REPO / "systemd" / f"{daemon}.service"
    text = unit.read_text()
    assert f"--config /etc/laminar/{name}.toml" in text
    assert f"ExecStart=/usr/local/bin/{daemon} " in text
    tool = shutil.which("systemd-analyze")
    if tool is None:
        print("systemd-analyze is not installed here: unit not verified")
        pytest.skip("systemd-analyze is not installed here")
    exe = Path(sys.executable).parent / daemon
    copy = tmp_path / f"{daemon}.service"
    copy.write_text(text.replace(f"/usr/local/bin/{daemon}", str(exe)))
    result = subprocess.run([tool, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    if result.returncode != 0 and "System has not been booted with systemd" in output:
        print("systemd-analyze cannot run without systemd as init here")
        pytest.skip("systemd-analyze cannot run without systemd as init here")
    errors = [
        line
        for line in output.splitlines()
        if f"{daemon}.service" in line and "Documentation" not in line
    ]
    assert not errors, errors


#: Ceilings of `systemd-analyze security` (0 = locked down, 10 = exposed): the router is
#: sandboxed; the agent runs as root with no filesystem sandbox, device list or
#: RestrictSUIDSGID= on purpose, since subjobs inherit them (docs/ops.md), and is confined
#: by users and cgroups.
EXPOSURE_CEILINGS = {"laminar-zone": 2.0, "laminar-agent": 9.4}


@pytest.mark.parametrize("daemon", sorted(EXPOSURE_CEILINGS))
def test_systemd_analyze_security_keeps_each_unit_under_its_ceiling(
    tmp_path: Path, daemon: str
) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        _skip("systemd-analyze is not installed here: exposure not measured")
    assert tool is not None
    exe = Path(sys.executable).parent / daemon
    copy = tmp_path / f"{daemon}.service"
    text = (REPO / "systemd" / f"{daemon}.service").read_text()
    copy.write_text(text.replace(f"/usr/local/bin/{daemon}", str(exe)))
    result = subprocess.run(
        [tool, "security", "--offline=true", "--no-pager", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    overall = [x for x in result.stdout.splitlines() if "Overall exposure level" in x]
    if not overall:
        _skip(f"systemd-analyze security --offline did not run here: {result.stderr.strip()}")
    exposure = float(overall[0].split(":")[1].split()[0])
    print(f"{daemon}: exposure {exposure}")
    assert exposure <= EXPOSURE_CEILINGS[daemon], overall[0]


def test_runtime_dependencies_are_ranges_that_constraints_txt_pins() -> None:
    """An installed Laminar fits beside other stacks (no exact pins: grpcio==1.85.1 used to
    clash), while CI and `make venv` stay reproducible: constraints.txt pins every runtime
    dependency to a version inside its range."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not NAME==VERSION"
            pins[canonicalize_name(name)] = version
    for text in project["dependencies"]:
        requirement = Requirement(text)
        assert not any(s.operator in ("==", "===") for s in requirement.specifier), text
        assert requirement.specifier, f"{text}: give a lower bound at least"
        pinned = pins.get(canonicalize_name(requirement.name))
        assert pinned is not None, f"constraints.txt does not pin {requirement.name}"
        assert requirement.specifier.contains(pinned), f"{requirement.name}=={pinned} vs {text}"


def test_the_distribution_claims_only_laminar_import_names() -> None:
    """An installed Laminar must not take generic top-level names (`cli`, `airlock`) from
    other packages: every package it installs, and every folder that holds one, is
    laminar_*."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert all(p.startswith("laminar") for p in patterns), patterns
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
    assert packages and all(name.startswith("laminar") for name in packages), packages
    for script in project["project"]["scripts"].values():
        assert script.startswith("laminar"), script


# --- Booting the units under a real systemd --------------------------------------------

#: Sandbox settings probed one by one before a boot (`test -r CONFIG` under each): one this
#: manager cannot set up even for `test`, or under which the test's own config is not
#: there (a container's odd mounts, a user manager without the device controller), says
#: nothing about Laminar, so the boot drops it and prints that it did.
SANDBOX_KEYS = (
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectControlGroups",
    "RestrictNamespaces",
    "RestrictSUIDSGID",
    "LockPersonality",
    "NoNewPrivileges",
    "User",
    "Group",
    "RemoveIPC",
    "LimitMEMLOCK",
    "TasksMax",
    "ProtectClock",
    "ProtectKernelLogs",
    "ProtectHostname",
    "ProtectProc",
    "RestrictRealtime",
    "SystemCallArchitectures",
    "SystemCallFilter",
    "RestrictAddressFamilies",
    "CapabilityBoundingSet",
)


#: What a setting must allow beyond the config being readable, checked under it.
PROBES = {"LimitMEMLOCK": ("sh", "-c", 'test "$(ulimit -l)" = unlimited')}


@dataclasses.dataclass
class _UserManager:
    """A running systemd user manager, driven with systemctl --user and systemd-run --user."""

    systemctl: str
    systemd_run: str
    runtime_dir: Path

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.systemctl, "--user", "--no-pager", *args],
            capture_output=True,
            text=True,
            timeout=90,
        )
        if check:
            assert result.returncode == 0, f"systemctl --user {' '.join(args)}: {result.stderr}"
        return result

    def show(self, unit: str, prop: str) -> str:
        return self.ctl("show", "-p", prop, "--value", unit).stdout.strip()

    def refuses(self, setting: str, command: tuple[str, ...] = ("true",)) -> bool:
        """Whether the manager fails to run ``command`` under ``setting``."""
        result = subprocess.run(
            [self.systemd_run, "--user", "--wait", "--quiet", "-p", setting, *command],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return result.returncode != 0


def _skip(reason: str) -> None:
    print(reason)
    pytest.skip(reason)


def _user_manager() -> _UserManager:
    """The user manager of this login, or a skip that prints why there is none."""
    systemctl, systemd_run = shutil.which("systemctl"), shutil.which("systemd-run")
    if systemctl is None or systemd_run is None:
        _skip("systemctl or systemd-run is not installed here: units not booted")
    assert systemctl is not None and systemd_run is not None
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    result = subprocess.run(
        [systemctl, "--user", "show", "-p", "SystemState", "--value"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    state = result.stdout.strip()
    if result.returncode != 0 or state not in ("running", "degraded") or not runtime:
        said = (result.stderr or result.stdout).strip() or "no XDG_RUNTIME_DIR"
        _skip(f"no systemd user manager to boot the units under (systemctl --user: {said})")
    return _UserManager(systemctl, systemd_run, Path(runtime))


def _boot_copy(manager: _UserManager, daemon: str, unit: str, tmp: Path) -> tuple[str, set[str]]:
    """The shipped unit as ``unit`` under a user manager: the venv's daemon, the test's
    config, the state in ``unit``'s own StateDirectory, output to a file,
    and without the sandbox settings this manager cannot set up (printed)."""
    exe = Path(sys.executable).parent / daemon
    name = "zone" if daemon == "laminar-zone" else "agent"
    text = (REPO / "systemd" / f"{daemon}.service").read_text()
    text = text.replace(f"/usr/local/bin/{daemon}", str(exe))
    config = tmp / f"{name}.toml"
    text = text.replace(f"/etc/laminar/{name}.toml", str(config))
    text = text.replace(f"--state-dir /var/lib/{daemon}", f"--state-dir %S/{unit}")
    text = text.replace(f"StateDirectory={daemon}", f"StateDirectory={unit}")
    kept, dropped = [], []
    for line in text.splitlines():
        key = line.partition("=")[0]
        probe = PROBES.get(key, ("test", "-r", str(config)))
        if key in SANDBOX_KEYS and manager.refuses(line, probe):
            dropped.append(line)
            continue
        kept.append(line)
        if line == "[Service]":
            kept.append(f"StandardOutput=append:{tmp / name}.log")
            kept.append(f"StandardError=append:{tmp / name}.log")
    if dropped:
        print(f"{unit}: booted without {', '.join(dropped)}: this manager cannot set them up")
    return "\n".join(kept) + "\n", {line.partition("=")[0] for line in dropped}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_units_boot_reload_and_run_a_subjob_under_systemd() -> None:
    """Issue 19: the shipped units, booted by a real systemd (a user manager: systemd-run
    --user's), not only verified: both reach READY=1 (Type=notify) with the router's tokens
    and certificates read in place; `systemctl reload` applies a key and leaves the daemon
    running, and rereads the tokens file (a revoked token is refused at once: a
    LoadCredential= copy, made only at start, was not); a subjob runs in its own cgroup below
    the agent's unit (Delegate=yes) with the unit's limits and without the agent's
    NOTIFY_SOCKET or WATCHDOG_USEC; a bad config exits 2 and is not restarted
    (RestartPreventExitStatus=2). What a user manager cannot show: User= takes effect only
    under the system manager (`systemd-analyze verify` checks it above); settings a manager
    cannot set up even for `test` are left out and printed."""
    manager = _user_manager()
    suffix = uuid.uuid4().hex[:8]
    # Not under /tmp: the router's PrivateTmp=true would hide its config there.
    tmp = manager.runtime_dir / f"laminar-boot-{suffix}"
    tmp.mkdir(mode=0o755)
    zone_unit, agent_unit = f"laminar-zone-t{suffix}", f"laminar-agent-t{suffix}"
    laminar = str(Path(sys.executable).parent / "laminar")
    certs = subprocess.run(
        [laminar, "certs", "init", "--dir", str(tmp / "pki"), "--hosts",
         "zone-router=router+peer,host-a=agent,ops=admin"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert certs.returncode == 0, certs.stderr
    minted = subprocess.run(
        [laminar, "token", "new", "--tenant", "ops", "--role", "admin"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    token = minted.stdout.splitlines()[0].strip()
    (tmp / "tokens.toml").write_text("[[token]]" + minted.stdout.partition("[[token]]")[2])
    port, pki = _free_port(), tmp / "pki"
    (tmp / "zone.toml").write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\n'
        f'[auth]\ntokens_file = "{tmp}/tokens.toml"\n'
        f'[tls]\nca_file = "{pki}/ca.pem"\ncert_file = "{pki}/zone-router.pem"\n'
        f'key_file = "{pki}/zone-router-key.pem"\n'
    )
    (tmp / "agent.toml").write_text(
        f'[server]\nlisten = "127.0.0.1:0"\nagent_id = "host-a"\n'
        f'[inventory]\ngpu_backend = "fake"\nfake_gpus = "2xH100-80GB"\n'
        f'[zone]\nzone = "127.0.0.1:{port}"\nheartbeat_seconds = 0.5\n'
        f'[tls]\nca_file = "{pki}/ca.pem"\ncert_file = "{pki}/host-a.pem"\n'
        f'key_file = "{pki}/host-a-key.pem"\n'
    )
    links = manager.runtime_dir / "systemd" / "user"
    units = {zone_unit: "laminar-zone", agent_unit: "laminar-agent"}
    dropped: set[str] = set()
    for unit, daemon in units.items():
        text, left_out = _boot_copy(manager, daemon, unit, tmp)
        dropped |= left_out if daemon == "laminar-agent" else set()
        (tmp / f"{unit}.service").write_text(text)
        manager.ctl("link", "--runtime", str(tmp / f"{unit}.service"))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")},
        "LAMINAR_ZONE": f"127.0.0.1:{port}",
        "LAMINAR_TOKEN": token,
        "LAMINAR_TLS_CA_FILE": str(pki / "ca.pem"),
        "LAMINAR_TLS_CERT_FILE": str(pki / "ops.pem"),
        "LAMINAR_TLS_KEY_FILE": str(pki / "ops-key.pem"),
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([laminar, *args], capture_output=True, text=True, timeout=60, env=env)

    try:
        for unit, daemon in units.items():  # `start` of Type=notify returns after READY=1
            started = manager.ctl("start", f"{unit}.service", check=False)
            log = (tmp / f"{daemon.removeprefix('laminar-')}.log").read_text()
            status = manager.ctl("status", f"{unit}.service", check=False).stdout
            assert started.returncode == 0, f"{started.stderr}\n{status}\n{log}"
            assert manager.show(unit, "ActiveState") == "active", unit
        assert "submitter auth on: 1 token(s)" in (tmp / "zone.log").read_text()
        wait_for(lambda: '"AGENT_READY"' in cli("agents", "-o", "json").stdout)

        # A subjob: its own cgroup below the agent's unit, the unit's limits, no sd_notify.
        probe = "cat /proc/self/cgroup; ulimit -l; echo notify=${NOTIFY_SOCKET:-none} watchdog=${WATCHDOG_USEC:-none}"
        submitted = cli("submit", "--gpus", "1", "--workdir", "/", "--", "/bin/sh", "-c", probe)
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip()
        watched = cli("watch", job)
        assert watched.returncode == 0, watched.stdout + watched.stderr
        out = cli("logs", job).stdout
        assert f"/{agent_unit}.service/" in out, out
        assert "notify=none watchdog=none" in out, out
        assert "LimitMEMLOCK" in dropped or "\nunlimited\n" in out, out

        # systemctl reload: SIGHUP, a key applied, the same process still serving.
        for unit, line in ((zone_unit, "limits.burst"), (agent_unit, "airlock.dry_run")):
            name = "zone" if unit == zone_unit else "agent"
            pid = manager.show(unit, "MainPID")
            section, _, key = line.partition(".")
            value = "3" if key == "burst" else "true"
            with (tmp / f"{name}.toml").open("a") as config:
                config.write(f"[{section}]\n{key} = {value}\n")
            manager.ctl("reload", f"{unit}.service")
            wait_for(lambda n=name: "SIGHUP: config reloaded" in (tmp / f"{n}.log").read_text())
            reloaded = (tmp / f"{name}.log").read_text().split("SIGHUP: config reloaded")[1]
            assert f"applied {line}" in reloaded.splitlines()[0]
            assert manager.show(unit, "MainPID") == pid
            assert manager.show(unit, "ActiveState") == "active"

        # A token revoked in the tokens file the unit names: refused after the reload.
        assert cli("jobs").returncode == 0
        minted = cli("token", "new", "--tenant", "ops", "--role", "admin").stdout
        (tmp / "tokens.toml").write_text("[[token]]" + minted.partition("[[token]]")[2])
        manager.ctl("reload", f"{zone_unit}.service")
        wait_for(lambda: (tmp / "zone.log").read_text().count("tokens file reloaded") == 2)
        refused = cli("jobs")
        assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr.upper(), refused

        # A bad config: exit 2, one line, and no restart loop.
        (tmp / "agent.toml").write_text("[airlock]\ntarget_ratio = 7\n")
        manager.ctl("restart", f"{agent_unit}.service", check=False)
        wait_for(lambda: manager.show(agent_unit, "ActiveState") == "failed")
        assert manager.show(agent_unit, "ExecMainStatus") == "2"
        assert manager.show(agent_unit, "NRestarts") == "0"
        assert "airlock.target_ratio" in (tmp / "agent.log").read_text().splitlines()[-1]
    finally:
        for unit in units:
            argv = manager.ctl("show", "-p", "ExecStart", f"{unit}.service", check=False).stdout
            manager.ctl("stop", f"{unit}.service", check=False)
            manager.ctl("clean", "--what=state", f"{unit}.service", check=False)
            manager.ctl("reset-failed", f"{unit}.service", check=False)
            (links / f"{unit}.service").unlink(missing_ok=True)
            state = argv.partition("--state-dir ")[2].split(" ", 1)[0]
            if state.endswith(unit):  # left by a clean that a subjob's files refused
                shutil.rmtree(state, ignore_errors=True)
        manager.ctl("daemon-reload", check=False)
        shutil.rmtree(tmp, ignore_errors=True)
