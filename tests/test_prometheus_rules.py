"""The example alerting rules (docs/prometheus/alerts.yml) are valid and fire when they should,
and the metrics they use exist in the daemons' registries.

Needs ``promtool`` (Debian/Ubuntu: ``apt-get install prometheus``); without it the
promtool checks skip with the reason printed. ``promtool check metrics`` on metrics
scraped from real daemons is in tests/test_metrics_naming.py; here it runs on the
registries directly, which is cheap.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from laminar_agent.metrics import AgentMetrics
from laminar_zone.metrics import ZoneMetrics

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "docs" / "prometheus" / "alerts.yml"
RULE_TESTS = REPO / "tests" / "prometheus" / "alerts_test.yml"


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        reason = "promtool is not on PATH (apt-get install prometheus): rules not checked"
        print(reason)
        pytest.skip(reason)
    return tool


def _exposition() -> str:
    return b"".join(generate_latest(m.registry) for m in (AgentMetrics(), ZoneMetrics())).decode()


def test_every_metric_the_rules_use_exists() -> None:
    exposed = set(re.findall(r"^# TYPE (\S+) (\S+)", _exposition(), re.M))
    names = {name for name, _ in exposed}
    names |= {f"{name}_total" for name, kind in exposed if kind == "counter"}
    names |= {f"{name}_bucket" for name, kind in exposed if kind == "histogram"}
    used = set(re.findall(r"\b(laminar_[a-z_]+)", RULES.read_text()))
    assert used, "the rules use no laminar metric"
    assert used <= names, sorted(used - names)


def test_promtool_checks_the_rules_and_their_unit_tests() -> None:
    tool = _promtool()
    for argv in ([tool, "check", "rules", str(RULES)], [tool, "test", "rules", str(RULE_TESTS)]):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_checks_the_metrics() -> None:
    tool = _promtool()
    result = subprocess.run(
        [tool, "check", "metrics"], input=_exposition(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
