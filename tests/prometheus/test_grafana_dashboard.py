"""docs/grafana/laminar.json: every query names metrics the daemons export, with their
labels, so the dashboard cannot drift from the code."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from laminar_agent.metrics import AgentMetrics
from laminar_zone.metrics import ZoneMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "laminar.json"
#: Labels Prometheus adds or histograms carry.
AMBIENT = {"instance", "job", "le"}


def exported() -> dict[str, set[str]]:
    """Every series name the daemons' registries export (``_total``, ``_bucket``...
    included) and the labels its metric declares."""
    out: dict[str, set[str]] = {}
    for metrics in (AgentMetrics(CollectorRegistry()), ZoneMetrics(CollectorRegistry())):
        registry = metrics.registry
        for collector, names in registry._collector_to_names.items():
            labels = set(getattr(collector, "_labelnames", ()))
            for name in names:
                out[name] = labels
    return out


def test_every_query_names_an_exported_metric_and_its_labels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    series = exported()
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(queries) >= 10
    covered = set()
    for expr in queries:
        names = re.findall(r"laminar_[a-z0-9_]+", expr)
        assert names, expr
        labels: set[str] = set()
        for name in names:
            assert name in series, f"{name} in {expr!r} is not exported"
            labels |= series[name]
            covered.add(name)
        for group in re.findall(r"by \(([^)]*)\)", expr):
            for label in (g.strip() for g in group.split(",")):
                assert label in labels | AMBIENT, f"label {label} in {expr!r}"
    # the panels the operators asked for
    for needed in (
        "laminar_zone_placements_total",
        "laminar_zone_queue_wait_seconds_bucket",
        "laminar_agent_gpu_allocated_ratio",
        "laminar_agent_gpu_stranded_ratio",
        "laminar_airlock_actions_total",
        "laminar_agent_gpu_memory_used_bytes",
    ):
        assert needed in covered, needed
