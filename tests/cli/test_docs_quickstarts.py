"""The docs' quick starts run as written (issue 19). Every fenced block opened with
```` ```sh quickstart ```` in docs/*.md runs in bash (``-euo pipefail``) from the
repository root, with the venv's scripts first on PATH (what ``. .venv/bin/activate``
gives a reader), a fresh HOME, and no LAMINAR_* variables, against the cluster the
README's own `laminar up --agents 3` starts; each block must exit 0. README.md's commands
have their own test (test_readme_commands.py).
"""

from __future__ import annotations

import itertools
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from docskit import ROOT

QUICKSTART = "```sh quickstart"
#: The guides a newcomer starts from: each must keep at least one quick start.
GUIDES = ("user-guide.md", "ops.md")


def quickstarts() -> list[tuple[str, int, str]]:
    """(file, line of the opening fence, the block's text) of every quick start in docs/."""
    found: list[tuple[str, int, str]] = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        start = 0
        body: list[str] = []
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not start and line.strip() == QUICKSTART:
                start, body = number, []
            elif start and line.startswith("```"):
                found.append((path.name, start, "\n".join(body)))
                start = 0
            elif start:
                body.append(line)
        assert not start, f"docs/{path.name}:{start}: quick start never closed"
    return found


def as_reader(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` from the repository root as a reader with the venv active would:
    the venv's scripts first on PATH, no LAMINAR_* of this shell, plus ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")}
    clean["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{clean.get('PATH', '')}"
    return subprocess.run(
        argv,
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_each_guide_keeps_a_quick_start() -> None:
    names = {name for name, _, _ in quickstarts()}
    assert set(GUIDES) <= names, f"no ```sh quickstart block in {set(GUIDES) - names}"


@pytest.mark.timeout(300)
def test_every_docs_quick_start_runs_as_written(
    up_cluster: list[list[str]], tmp_path: Path
) -> None:
    bash = shutil.which("bash")
    if bash is None:
        print("bash is not installed here: the quick starts are bash")
        pytest.skip("bash is not installed here: the quick starts are bash")
    for name, line, script in quickstarts():
        result = as_reader([bash, "-euo", "pipefail", "-c", script], HOME=str(tmp_path))
        assert result.returncode == 0, (
            f"docs/{name}:{line}: the quick start exited {result.returncode}\n"
            f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        )
    # The completion quick start wrote where bash-completion looks.
    completion = tmp_path / ".local/share/bash-completion/completions/laminar"
    assert "complete" in completion.read_text()


def sample_errors() -> list[tuple[str, int, str, str]]:
    """(file, line, command, the error line the docs show for it): a fenced ``$ laminar``
    line followed by a ``laminar:`` line."""
    found = []
    for path in sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")]):
        lines = path.read_text().splitlines()
        for number, (line, after) in enumerate(itertools.pairwise(lines), 1):
            if line.startswith("$ laminar ") and after.startswith("laminar: "):
                found.append((path.name, number, line.removeprefix("$ "), after))
    return found


def test_the_docs_sample_errors_are_the_real_ones() -> None:
    """The user guide's sample error text used to differ from the real one (issue 19). Each
    is refused before anything is sent: no router is reachable here."""
    samples = sample_errors()
    assert len(samples) >= 3, samples
    for name, line, command, shown in samples:
        # Nothing listens on port 1: a sample that needed a router would fail differently.
        result = as_reader(shlex.split(command, comments=True), LAMINAR_ZONE="127.0.0.1:1")
        assert (result.returncode, result.stderr.strip()) == (2, shown), f"docs/{name}:{line}"
