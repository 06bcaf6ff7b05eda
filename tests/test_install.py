"""Install: example configs that match the config dataclasses, Makefile install targets that
write only under DESTDIR, and systemd units that read /etc/laminar/*.toml and verify."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

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


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), *args],
        capture_output=True,
        text=True,
        timeout=60,
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
    edited = tmp_path / "etc" / "laminar" / "agent.toml"
    edited.write_text('[zone]\nzone = "router:7400"\n')
    result = _make("install-config", f"DESTDIR={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "keeping" in result.stdout
    assert edited.read_text() == '[zone]\nzone = "router:7400"\n'


def test_make_install_takes_prefix_and_destdir() -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not on PATH")
    result = _make("-n", "install", "PREFIX=/opt/laminar", "DESTDIR=/tmp/stage", "PYTHON=python3")
    assert result.returncode == 0, result.stderr
    assert "pip install --prefix /opt/laminar --root /tmp/stage ." in result.stdout
    plain = _make("-n", "install", "PYTHON=python3")
    assert "python3 -m pip install" in plain.stdout and "--root" not in plain.stdout


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
