"""`laminar submit` imports only what a submit uses: start-up is most of its cost, and a
script that submits a thousand jobs pays it a thousand times."""

from __future__ import annotations

import os
import subprocess
import sys

#: Modules a plain `laminar submit -- CMD` must not import (each was measured at 2-30 ms of
#: start-up on the development VM: tables, certificates, the TOML parser, other layers).
NOT_FOR_A_SUBMIT = (
    "rich",
    "cryptography",
    "tomllib",
    "json",
    "uuid",
    "platform",
    "hmac",
    "laminar_zone",
    "laminar_agent",
    "laminar_sim",
    "laminar_bench",
    "laminar_base.demand",
    "psutil",
)

_PROGRAM = """
import sys
from laminar_cli.main import main
code = main(["--zone", "127.0.0.1:1", "submit", "--gpus", "1", "--", "true"])
print(code)
print(" ".join(sorted(sys.modules)))
"""


def test_a_submit_imports_none_of_the_heavy_modules() -> None:
    env = {**os.environ, "LAMINAR_RETRY_SECONDS": "0"}
    env.pop("LAMINAR_ZONE", None)
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=60
    )
    code, modules = done.stdout.splitlines()
    # Port 1 refuses the connection: the submit went all the way to the call (exit 3).
    assert code == "3", done.stderr
    assert "cannot reach 127.0.0.1:1" in done.stderr
    loaded = set(modules.split())
    assert "laminar_cli.jobspec" in loaded and "grpc" in loaded  # the path did run
    assert sorted(name for name in NOT_FOR_A_SUBMIT if name in loaded) == []
