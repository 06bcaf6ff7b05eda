"""Job files and submit flags become one JobSpec; bad input is one line naming the key, exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_cli.jobs import spec_from_args
from laminar_cli.jobspec import describe_resources
from laminar_cli.main import build_parser, main

FULL_FILE = """
name = "resnet"
command = ["python", "train.py", "--epochs", "3"]
priority = "production"
lifecycle = "resident"
tenant = "vision"
gang = 2
after = ["j-1", "j-2"]
retries = 3
workdir = "/data/runs"
expected = "10m"
time = "2h"
restartable = true
grace = "30s"
env = { WANDB_MODE = "offline", SEED = 7 }

[resources]
mig = "3g.40gb"
gpu_mem = "20GiB"
gpu_model = "H100-80GB"
cpus = 6
mem = "32GiB"

[atomization]
total_units = 1000
seconds_per_unit = { p50 = 1.5, p95 = "3s" }
peak_memory = { p50 = "10GiB", p95 = "12GiB" }
checkpoint_overhead = "5s"
min_units = 10
max_units = 200
epsilon = 0.05
"""


def _spec(argv: list[str]) -> zone_pb2.JobSpec:
    args = build_parser().parse_args(argv)
    return spec_from_args(args, require_command=argv[0] == "submit")


def test_full_job_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(FULL_FILE)
    spec = _spec(["submit", "-f", str(path)])
    assert spec.name == "resnet"
    assert list(spec.command) == ["python", "train.py", "--epochs", "3"]
    assert spec.priority == common_pb2.PRODUCTION
    assert spec.lifecycle == common_pb2.RESIDENT
    assert spec.tenant == "vision" and spec.gang_size == 2 and spec.max_retries == 3
    assert list(spec.after) == ["j-1", "j-2"]
    assert spec.workdir == "/data/runs" and spec.restartable
    assert spec.expected_seconds == 600 and spec.grace_seconds == 30
    assert spec.time_limit_seconds == 7200
    assert dict(spec.env) == {"WANDB_MODE": "offline", "SEED": "7"}
    assert spec.resources.mig_profile == "3g.40gb"
    assert spec.resources.gpu_memory_bytes == 20 * 1024**3
    assert spec.resources.gpu_model == "H100-80GB"
    assert spec.resources.cpu_milli == 6000 and spec.resources.host_memory_bytes == 32 * 1024**3
    contract = spec.atomization
    assert contract.total_units == 1000 and contract.min_units == 10 and contract.max_units == 200
    assert [(q.q, q.value) for q in contract.seconds_per_unit] == [(0.5, 1.5), (0.95, 3.0)]
    assert [q.value for q in contract.peak_memory_bytes] == [10 * 1024**3, 12 * 1024**3]
    assert contract.checkpoint_overhead_seconds == 5 and contract.epsilon == pytest.approx(0.05)


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(FULL_FILE)
    spec = _spec(
        [
            "submit",
            "-f",
            str(path),
            "--gpus",
            "2",
            "--priority",
            "opportunistic",
            "--after",
            "j-9",
            "--env",
            "SEED=8",
            "--env",
            "EXTRA=x=y",
            "--",
            "echo",
            "hi",
            "--gpus",
        ]
    )
    # A shape flag replaces the file's whole shape; memory and model still come from the file.
    assert spec.resources.gpus == 2 and spec.resources.mig_profile == ""
    assert spec.resources.gpu_memory_bytes == 20 * 1024**3
    assert spec.priority == common_pb2.OPPORTUNISTIC
    assert list(spec.after) == ["j-9"]
    assert dict(spec.env) == {"WANDB_MODE": "offline", "SEED": "8", "EXTRA": "x=y"}
    assert list(spec.command) == ["echo", "hi", "--gpus"]  # flags after `--` belong to it
    assert spec.name == "resnet"


def test_flags_alone() -> None:
    spec = _spec(
        [
            "submit",
            "--gpu-milli",
            "250",
            "--gpu-mem",
            "512MiB",
            "--cpus",
            "2.5",
            "--mem",
            "8GiB",
            "--gang",
            "3",
            "--after",
            "a,b",
            "--after",
            "c",
            "--expected",
            "1m30s",
            "-t",
            "3m",
            "--restartable",
            "--",
            "/usr/bin/python3",
            "x.py",
        ]
    )
    assert spec.resources.gpu_milli == 250 and spec.resources.gpu_memory_bytes == 512 * 1024**2
    assert spec.resources.cpu_milli == 2500 and spec.resources.host_memory_bytes == 8 * 1024**3
    assert spec.gang_size == 3 and list(spec.after) == ["a", "b", "c"]
    assert spec.expected_seconds == 90 and spec.restartable
    assert spec.time_limit_seconds == 180
    assert spec.name == "python3"  # default name: the program
    assert spec.priority == common_pb2.PRIORITY_CLASS_UNSPECIFIED  # the router's default applies


def test_probe_needs_no_command() -> None:
    spec = _spec(["probe", "--mig", "1g.10gb", "--priority", "critical"])
    assert spec.resources.mig_profile == "1g.10gb" and not spec.command
    assert spec.priority == common_pb2.CRITICAL


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('command = ["x"]\nnmae = "typo"\n', "nmae: unknown key"),
        ('command = ["x"]\n[resources]\ngpu = 1\n', "resources.gpu: unknown key"),
        ('command = ["x"]\n[resources]\ngpus = "two"\n', "resources.gpus: expected an integer"),
        ('command = ["x"]\n[resources]\ngpus = true\n', "resources.gpus: expected an integer"),
        (
            'command = ["x"]\n[resources]\ngpu_mem = "lots"\n',
            "resources.gpu_mem: cannot parse size",
        ),
        (
            'command = ["x"]\n[resources]\ngpu_mem = "10XB"\n',
            "resources.gpu_mem: unknown size unit",
        ),
        (
            'command = ["x"]\n[resources]\ngpu_milli = 1500\n',
            "resources.gpu_milli: must be between",
        ),
        ('command = ["x"]\n[resources]\nmig = "big"\n', "resources.mig: expected a MIG profile"),
        (
            'command = ["x"]\n[resources]\ngpus = 1\nmig = "1g.10gb"\n',
            "resources.mig: give only one",
        ),
        ('command = ["x"]\nresources = 3\n', "resources: expected a [resources] table"),
        ('command = ["x"]\npriority = "urgent"\n', "priority: unknown value 'urgent'"),
        ('command = ["x"]\nlifecycle = 1\n', "lifecycle: expected a string"),
        ('command = ["x"]\ngang = 0\n', "gang: must be between 1"),
        ('command = ["x"]\nretries = -1\n', "retries: must be between 0"),
        ('command = ["x"]\nexpected = "soon"\n', "expected: cannot parse duration"),
        ('command = ["x"]\ntime = "forever"\n', "time: cannot parse duration"),
        ('command = ["x"]\nrestartable = "yes"\n', "restartable: expected true or false"),
        ('command = ["x"]\nenv = { "1BAD" = "x" }\n', "env.1BAD: not a valid environment"),
        ('command = ["x"]\nenv = { A = [1] }\n', "env.A: expected a string"),
        ("command = []\n", "command: the command is empty"),
        ("command = [1, 2]\n", "command: expected a list of strings"),
        ('name = "n"\n', "command: missing"),
        ('command = ["x"]\n[atomization]\nepsilon = 0.1\n', "atomization.total_units: required"),
        (
            'command = ["x"]\n[atomization]\ntotal_units = 10\nmax_unit = 3\n',
            "atomization.max_unit: unknown key",
        ),
        (
            'command = ["x"]\n[atomization]\ntotal_units = 10\npeak_memory = { p50 = "x" }\n',
            "atomization.peak_memory.p50: cannot parse size",
        ),
        (
            'command = ["x"]\n[atomization]\ntotal_units = 10\nseconds_per_unit = { median = 1 }\n',
            "atomization.seconds_per_unit.median: quantile keys",
        ),
        (
            'command = ["x"]\n[atomization]\ntotal_units = 10\nmin_units = 20\n',
            "atomization.min_units: must be between 1 and 10",
        ),
        ('command = ["x"\n', "-f: "),  # not TOML at all
    ],
)
def test_bad_job_file_is_one_line_naming_the_key(
    tmp_path: Path, content: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.toml"
    path.write_text(content)
    # The router address is never used: the file is refused before any call.
    assert main(["--zone", "127.0.0.1:1", "submit", "-f", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert needle in lines[0]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["submit", "--gpus", "x", "--", "true"], "--gpus: expected an integer"),
        (["submit", "--gpus", "1", "--mig", "1g.10gb", "--", "true"], "--mig: give only one"),
        (["submit", "--gpu-mem", "lots", "--", "true"], "--gpu-mem: cannot parse size"),
        (["submit", "--cpus", "many", "--", "true"], "--cpus: expected a number"),
        (["submit", "--cpus", "0", "--", "true"], "--cpus: must be between 0.001 and 1024"),
        (["submit", "--cpus", "5000", "--", "true"], "--cpus: must be between"),
        (["submit", "--mem", "lots", "--", "true"], "--mem: cannot parse size"),
        (["submit", "--mem", "0", "--", "true"], "--mem: must be between 1 byte"),
        (["submit", "--mem", "100TiB", "--", "true"], "--mem: must be between"),
        (["submit", "--priority", "urgent", "--", "true"], "--priority: unknown value"),
        (["submit", "--env", "NOEQUALS", "--", "true"], "--env: expected NAME=VALUE"),
        (["submit", "--retries", "1000", "--", "true"], "--retries: must be between"),
        (["submit", "--gpus", "1"], "command: missing"),
        (["submit", "-f", "/nonexistent/job.toml"], "does not exist"),
        (["jobs", "--state", "bogus"], "--state: unknown state 'bogus'"),
        (["jobs", "--limit", "many"], "--limit: invalid int value"),
        (["probe", "--max-hosts", "0"], "--max-hosts: must be between"),
        (["pressure", "--gpu", "0", "--used", "1GiB"], "HOST: name the host"),
        (["pressure", "h", "--gpu", "0", "--used", "lots"], "--used"),
        (["pressure", "h", "--gpu", "0", "--used", "1GiB", "--for", "soon"], "--for"),
        (["up", "--agents", "0"], "--agents: must be between"),
        (["up", "--zones", "99"], "--zones: must be between"),
        (["job"], "the following arguments are required: ID"),
        (["frobnicate"], "invalid choice"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--zone", "127.0.0.1:1", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err


def test_unreachable_router_is_one_line_and_exit_3(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAMINAR_RETRY_SECONDS", "0")  # no resends, so no "retrying" notice
    assert main(["--zone", "127.0.0.1:1", "jobs"]) == 3
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "cannot reach 127.0.0.1:1" in err


def test_zone_address_from_flag_env_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from laminar_cli.zoneclient import resolve_zone_address

    assert resolve_zone_address(None, {}) == "127.0.0.1:7400"
    assert resolve_zone_address(None, {"LAMINAR_ZONE": "10.0.0.1:9"}) == "10.0.0.1:9"
    assert resolve_zone_address("h:1", {"LAMINAR_ZONE": "10.0.0.1:9"}) == "h:1"
    # --zone is accepted before and after the command.
    assert build_parser().parse_args(["--zone", "a:1", "jobs"]).zone == "a:1"
    assert build_parser().parse_args(["jobs", "--zone", "b:2"]).zone == "b:2"


def test_describe_resources() -> None:
    assert describe_resources(common_pb2.Resources(gpus=2)) == "2 x GPU"
    assert describe_resources(common_pb2.Resources(mig_profile="3g.40gb")) == "MIG 3g.40gb"
    share = common_pb2.Resources(gpu_milli=500, gpu_memory_bytes=20 * 1024**3)
    assert describe_resources(share) == "0.5 GPU share, 20.0GiB"
    assert describe_resources(common_pb2.Resources()) == "CPU only"
    host = common_pb2.Resources(gpus=1, cpu_milli=4000, host_memory_bytes=8 * 1024**3)
    assert describe_resources(host) == "1 GPU, 4 CPU, 8.0GiB host memory"


def test_plugin_commands_dispatch_through_func(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A package's ``register(subparsers)`` adds commands (how ``laminar sim`` appears)."""
    import argparse
    import importlib.machinery
    import types

    from rich.console import Console

    def handler(args: argparse.Namespace, console: Console) -> int:
        print(f"simulated {args.hosts} hosts")
        return 7

    def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
        parser = sub.add_parser("simtest")
        leaf = parser.add_subparsers(dest="what", required=True).add_parser("run")
        leaf.add_argument("--hosts", type=int, default=1)
        leaf.set_defaults(func=handler)

    module = types.ModuleType("laminar_sim.cli")
    module.__spec__ = importlib.machinery.ModuleSpec("laminar_sim.cli", None)
    module.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "laminar_sim.cli", module)
    assert main(["simtest", "run", "--hosts", "12"]) == 7
    assert capsys.readouterr().out == "simulated 12 hosts\n"
