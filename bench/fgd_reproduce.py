"""Reproduce the FGD paper's fill-up results (USENIX ATC 2023) with our centralized baselines.

Runs ``laminar sim fgd`` for each workload (10 seeds x 4 policies by default),
prints our unallocated GPU % at 100% arrived next to the paper's published
figures, and writes everything as JSON with ``-o``. Numbers are reported,
never asserted: the last column says whether we are within 0.5 points.

    .venv/bin/python bench/fgd_reproduce.py [--workloads default,gpushare40] [--mig]
        [--seeds 42-51] [-o bench-out/fgd.json] [--plot bench-out/fgd_default.png]

The trace folder defaults to ../shared/traces/alibaba-gpu-v2023 beside the
repository and falls back to the bundled default lists.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from laminar_sim import fgd, traces  # noqa: E402
from laminar_sim.cli import render_fgd, save_plot  # noqa: E402
from laminar_sim.policies import POLICIES  # noqa: E402

SHARED_TRACES = REPO.parent / "shared" / "traces"
TOLERANCE_POINTS = 0.5


def environment() -> dict[str, Any]:
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
    }


def pair(ours: float | None, theirs: float | None) -> str:
    return f"{fgd.fmt_pct(ours)} / {fgd.fmt_pct(theirs)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-dir", type=Path, default=SHARED_TRACES / "alibaba-gpu-v2023")
    parser.add_argument(
        "--expected-dir", type=Path, default=SHARED_TRACES / "fgd-atc23-expected-results"
    )
    parser.add_argument("--workloads", default="default")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--mig", action="store_true", help="also run each workload in MIG mode")
    parser.add_argument("-o", "--output", type=Path, help="write the JSON report here")
    parser.add_argument("--plot", type=Path, help="PNG of the first workload's curves")
    args = parser.parse_args(argv)

    console = Console(width=max(Console().width, 110))
    trace_dir = args.trace_dir if args.trace_dir.is_dir() else traces.bundled_trace_dir()
    expected_dir = args.expected_dir if args.expected_dir.is_dir() else None
    seeds = fgd.parse_seeds(args.seeds)
    policies = [p for p in args.policies.split(",") if p]
    env = environment()
    console.print(
        f"{env['date_utc']} UTC, {env['cpus']} CPUs {env['machine']}, Python {env['python']}, "
        f"numpy {env['numpy']}; traces {trace_dir}"
    )

    reports: list[dict[str, Any]] = []
    started = time.perf_counter()
    for workload in [w for w in args.workloads.split(",") if w]:
        for mig in (False, True) if args.mig else (False,):
            report = fgd.run_experiment(
                trace_dir, workload, policies, seeds, mig=mig, expected_dir=expected_dir
            )
            render_fgd(report, console)
            reports.append(report)
    total_seconds = time.perf_counter() - started

    comparison = Table(title=f"Reproduction at 100% arrived, seeds {args.seeds}: ours / paper")
    for column in ("workload", "policy", "unalloc med", "unalloc mean", "frag%gpu", "frag%idle"):
        comparison.add_column(
            column, justify="left" if column in ("workload", "policy") else "right"
        )
    comparison.add_column(f"within {TOLERANCE_POINTS}", justify="center")
    for report in reports:
        paper = report["paper_unallocated_pct_at_100"] or {}
        paper_amount = report.get("paper_frag_amount_pct_at_100") or {}
        paper_ratio = report.get("paper_frag_ratio_pct_at_100") or {}
        for policy, summary in report["policies"].items():
            ours = summary["unallocated_pct_at_100"] or {}
            theirs = paper.get(policy, {})
            within = (
                "-"
                if "median" not in theirs or "median" not in ours
                else (
                    "yes"
                    if abs(ours["median"] - theirs["median"]) <= TOLERANCE_POINTS
                    and abs(ours["mean"] - theirs["mean"]) <= TOLERANCE_POINTS
                    else "NO"
                )
            )
            comparison.add_row(
                report["workload"] + (" (MIG)" if report["mig"] else ""),
                policy,
                pair(ours.get("median"), theirs.get("median")),
                pair(ours.get("mean"), theirs.get("mean")),
                pair(
                    (summary["frag_amount_pct_at_100"] or {}).get("median"),
                    paper_amount.get(policy, {}).get("median"),
                ),
                pair(
                    (summary["frag_ratio_pct_at_100"] or {}).get("median"),
                    paper_ratio.get(policy, {}).get("median"),
                ),
                within,
            )
    console.print(comparison)
    console.print(f"total run time {total_seconds:.1f} s")

    if args.plot is not None and reports:
        save_plot(reports[0], args.plot)
        console.print(f"plot saved to {args.plot}")
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        payload = {"environment": env, "total_seconds": total_seconds, "reports": reports}
        args.output.write_text(json.dumps(payload, indent=2))
        console.print(f"JSON written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
