"""Both daemons' /metrics, scraped from real processes, follow Prometheus naming rules.

Parsed with the Prometheus text parser of prometheus_client. Where the ``promtool``
binary is on PATH, ``promtool check metrics`` must pass too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for

from laminar_cli.cluster import LocalCluster

#: Collectors prometheus_client registers by itself; they follow their own conventions.
STANDARD_PREFIXES = ("python_", "process_")
SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def naming_problems(text: str) -> list[str]:
    problems = []
    families = list(text_string_to_metric_families(text))
    for family in families:
        name = family.name
        if name.startswith(STANDARD_PREFIXES):
            continue
        if name.endswith("_created") or any(s.name.endswith("_created") for s in family.samples):
            problems.append(f"{name}: a _created series (disabled: nobody reads them)")
        if not name.startswith(("laminar_agent_", "laminar_zone_", "laminar_airlock_")):
            problems.append(f"{name}: not laminar_<subsystem>_")
        if not SNAKE.match(name):
            problems.append(f"{name}: not lower snake_case")
        if not family.documentation:
            problems.append(f"{name}: no help text")
        if family.type == "counter":
            samples = {s.name for s in family.samples}
            if samples and not any(s.endswith("_total") for s in samples):
                problems.append(f"{name}: counter without _total")
        elif name.endswith("_total"):
            problems.append(f"{name}: _total on a {family.type}")
        words = name.split("_")
        if {"seconds", "duration", "wait", "time"} & set(words) and not name.endswith(
            ("_seconds", "_seconds_total")
        ):
            problems.append(f"{name}: a time not in _seconds")
        # Memory x time is one compound base unit (byte-seconds), like Prometheus' joules.
        if {"bytes", "memory"} & set(words) and not name.endswith(
            ("_bytes", "_bytes_total", "_byte_seconds", "_byte_seconds_total")
        ):
            problems.append(f"{name}: a size not in _bytes")
    return problems


def test_metrics_of_both_daemons_follow_the_naming_rules(tmp_path: Path) -> None:
    with LocalCluster(tmp_path) as cluster:
        zone = cluster.start_zone("a", heartbeat_seconds=0.2)
        agent = cluster.start_agent("h1", "1xA100-80GB:shared", zone=zone.address)
        done = tmp_path / "done"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "laminar_cli.main",
                "--zone",
                zone.address,
                "submit",
                "--gpus",
                "1",
                "--",
                sys.executable,
                "-c",
                f"open({str(done)!r}, 'w').close()",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_for(done.exists)
        texts = {"zone": scrape(zone.metrics_address), "agent": scrape(agent.metrics_address)}
    problems = [f"{who}: {p}" for who, text in texts.items() for p in naming_problems(text)]
    assert not problems, "\n".join(problems)
    families = {f.name for text in texts.values() for f in text_string_to_metric_families(text)}
    assert "laminar_zone_placements" in families  # counters parse without their _total
    assert "laminar_airlock_actions" in families
    for who, text in texts.items():  # one series to join dashboards on, per daemon
        info = [
            s
            for f in text_string_to_metric_families(text)
            if f.name == f"laminar_{who}_build_info"
            for s in f.samples
        ]
        assert len(info) == 1 and info[0].value == 1 and info[0].labels["version"], info
    promtool = shutil.which("promtool")
    if promtool is None:
        print("promtool is not on PATH: `promtool check metrics` skipped")
        return
    for who, text in texts.items():
        result = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, f"{who}: {result.stdout}{result.stderr}"


def test_the_checker_catches_bad_names() -> None:
    bad = (
        "# HELP laminar_zone_waitTime wait\n# TYPE laminar_zone_waitTime gauge\n"
        "laminar_zone_waitTime 1\n"
        "# HELP foo_memory x\n# TYPE foo_memory gauge\nfoo_memory 1\n"
        "# HELP laminar_zone_things_total x\n# TYPE laminar_zone_things_total gauge\n"
        "laminar_zone_things_total 1\n"
    )
    problems = naming_problems(bad)
    assert any("snake_case" in p for p in problems)
    assert any("foo_memory: not laminar" in p for p in problems)
    assert any("a size not in _bytes" in p for p in problems)
    assert any("_total on a gauge" in p for p in problems)
    with pytest.raises(AssertionError):
        assert not problems
