"""Shared fixtures. Daemons are started for real on 127.0.0.1:0 inside tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TRACES_DIR = REPO_ROOT.parent / "shared" / "traces"


@pytest.fixture
def traces_dir() -> Path:
    """../shared/traces when present (tests that need it skip with a reason otherwise)."""
    if not TRACES_DIR.is_dir():
        pytest.skip(f"trace folder {TRACES_DIR} is not present")
    return TRACES_DIR


@pytest.fixture
def python_exe() -> str:
    return sys.executable
