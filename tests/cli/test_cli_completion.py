"""`laminar completion bash|zsh`: the generated script completes commands and flags in a
real bash (zsh: the same functions through bashcompinit; checked where zsh exists)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from laminar_cli.main import main


def _script(shell: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["completion", shell]) == 0
    path = tmp_path / f"laminar.{shell}"
    path.write_text(capsys.readouterr().out)
    return path


def _complete(script: Path, *words: str) -> list[str]:
    line = " ".join(f"'{w}'" for w in words)
    program = (
        f"source {script}; COMP_WORDS=(laminar {line}); "
        f"COMP_CWORD={len(words)}; _laminar; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    out = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_bash_completes_commands_subcommands_and_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if shutil.which("bash") is None:
        print("bash is not installed here")
        pytest.skip("bash is not installed here")
    script = _script("bash", tmp_path, capsys)
    assert _complete(script, "jo") == ["job", "jobs"]
    assert _complete(script, "certs", "") == ["init", "--help"]
    assert "--watch" in _complete(script, "jobs", "--w")
    assert "--run-through-partitions" in _complete(script, "submit", "--run")
    assert _complete(script, "--zone", "x:1", "tok") == ["token"]


def test_zsh_script_loads_where_zsh_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script("zsh", tmp_path, capsys)
    assert script.read_text().startswith("#compdef laminar")
    if shutil.which("zsh") is None:
        print("zsh is not installed here: the script is checked as text only")
        pytest.skip("zsh is not installed here")
    subprocess.run(
        ["zsh", "-c", f"autoload -U compinit && compinit -u; source {script}"], check=True
    )
