"""``laminar sim fgd`` through a parser of our own (laminar_cli/main.py calls the same ``register``)."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from laminar_base.configlib import load_config
from laminar_base.errors import InvalidArgument
from laminar_base.fragmentation import ObservedWorkload
from laminar_sim import fgd, traces
from laminar_sim.cli import register
from laminar_sim.policies import MILLI_SLICING, MigSlicing
from laminar_zone.config import ZoneConfig


def run_cli(argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="laminar")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    out = io.StringIO()
    code = args.func(args, Console(file=out, width=160))
    return code, out.getvalue()


def fgd_json(argv: list[str]) -> dict[str, Any]:
    code, out = run_cli(["sim", "fgd", *argv, "-o", "json"])
    assert code == 0
    report: dict[str, Any] = json.loads(out)
    return report


def test_json_shape_on_a_tiny_trace(tiny_trace: Path) -> None:
    report = fgd_json(["--trace-dir", str(tiny_trace), "--workload", "tiny", "--seeds", "1-3"])
    assert report["experiment"] == "fgd" and report["seeds"] == [1, 2, 3]
    assert report["nodes"] == 16 and report["cluster_gpus"] == 128
    assert set(report["policies"]) == {"fgd", "bestfit", "dotprod", "random", "laminar"}
    assert report["policies"]["laminar"]["messages_per_placement"] > 0
    for summary in report["policies"].values():
        at100 = summary["unallocated_pct_at_100"]
        assert set(at100) >= {"median", "mean", "per_seed"} and len(at100["per_seed"]) == 3
        assert at100["median"] == sorted(at100["per_seed"])[1]
        for key in ("frag_amount_pct_at_100", "frag_ratio_pct_at_100"):
            assert set(summary[key]) >= {"median", "mean"}
        for key in ("unallocated_pct_curve", "frag_amount_pct_curve", "frag_ratio_pct_curve"):
            rows = summary[key]
            assert rows and all(75 <= r["arrived_pct"] <= 130 for r in rows)
            assert all(set(r) == {"arrived_pct", "median", "mean"} for r in rows)
    assert report["paper_unallocated_pct_at_100"] is None  # not a workload of the paper
    assert report["events_processed"] > 0


def test_json_is_deterministic_and_mig_is_reported_separately(tiny_trace: Path) -> None:
    argv = ["--trace-dir", str(tiny_trace), "--workload", "tiny", "--seeds", "5", "--policies"]
    plain = fgd_json([*argv, "fgd,random"])
    again = fgd_json([*argv, "fgd,random"])
    assert (
        plain["policies"]["random"]["unallocated_pct_curve"]
        == (again["policies"]["random"]["unallocated_pct_curve"])
    )
    mig = fgd_json([*argv, "bestfit", "--mig"])
    assert mig["mig"] is True and list(mig["policies"]) == ["bestfit"]


def tiny_args(trace: Path, *more: str) -> list[str]:
    return ["--trace-dir", str(trace), "--workload", "tiny", "--seeds", "1", *more]


def test_laminar_line_says_how_the_nodes_were_split_into_zones(tiny_trace: Path) -> None:
    """By default the trace's nodes are one zone (one router is sized for more hosts than
    the trace has); a smaller ``--zone-hosts`` splits them, and forwards appear."""
    args = tiny_args(tiny_trace, "--policies", "laminar")
    code, out = run_cli(["sim", "fgd", *args])
    assert code == 0 and "1 zone of 16 hosts" in out
    one = fgd_json(args)
    assert one["policies"]["laminar"]["forwards_per_placement"] == 0
    code, out = run_cli(["sim", "fgd", *args, "--zone-hosts", "6"])
    assert code == 0 and "3 zones of up to 6 hosts" in out


def test_table_output_and_plot(tiny_trace: Path, tmp_path: Path) -> None:
    plot = tmp_path / "curves.png"
    code, out = run_cli(
        ["sim", "fgd", *tiny_args(tiny_trace, "--policies", "bestfit,fgd", "--plot", str(plot))]
    )
    assert code == 0
    assert "Unallocated GPU % at 100% arrived" in out and "bestfit" in out and "fgd" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_paper_figures_sit_next_to_ours(tmp_path: Path, make_trace: Any, tiny_trace: Path) -> None:
    expected = tmp_path / "fgd-atc23-expected-results"
    expected.mkdir()
    (expected / "headline_summary.csv").write_text(
        "workload,policy,metric,arrived_pct,median,mean,std,min,max,count\n"
        "openb_pod_list_tiny,FGD,unallocated_gpu_pct,100,4.77,4.773,0.1,4.6,4.9,10\n"
        "openb_pod_list_tiny,FGD,unallocated_gpu_pct,90,9.0,9.0,0.1,4.6,4.9,10\n"
    )
    argv = tiny_args(tiny_trace, "--policies", "fgd", "--expected-dir", str(expected))
    report = fgd_json(argv)
    assert report["paper_unallocated_pct_at_100"] == {"fgd": {"median": 4.77, "mean": 4.773}}
    code, out = run_cli(["sim", "fgd", *argv])
    assert code == 0 and "4.77" in out


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--trace-dir", "/nonexistent/laminar-traces"], "--trace-dir"),
        (["--policies", "fgd,tetris"], "--policies"),
        (["--policies", "fgd,fgd"], "--policies"),
        (["--policies", ""], "--policies"),
        (["--seeds", "51-42"], "--seeds"),
        (["--seeds", "4x"], "--seeds"),
        (["--seeds", "-3"], "--seeds"),
        (["--workload", "gpushare40"], "--trace-dir"),
        (["--tune-ratio", "0"], "--tune-ratio"),
        (["--plot", "curves.pdf"], "--plot"),
    ],
)
def test_bad_input_names_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        run_cli(["sim", "fgd", *argv])
    assert err.value.field == flag
    assert err.value.message.startswith(flag)


def test_unknown_workload_lists_what_exists(tiny_trace: Path) -> None:
    with pytest.raises(InvalidArgument) as err:
        run_cli(["sim", "fgd", "--trace-dir", str(tiny_trace), "--workload", "nope"])
    assert err.value.field == "--workload" and "available: tiny" in err.value.message


def test_bad_trace_rows_surface_as_invalid_input(tmp_path: Path, make_trace: Any) -> None:
    folder = make_trace(
        tmp_path / "bad", ["n0,1000,1024,1,T4\n"], ["p0,1000,1024,3,200,,LS,R,0,1,0\n"], "bad"
    )
    with pytest.raises(InvalidArgument, match=r"openb_pod_list_bad\.csv:2"):
        run_cli(["sim", "fgd", "--trace-dir", str(folder), "--workload", "bad", "--seeds", "1"])


def test_laminar_runs_in_mig_mode_beside_the_baselines(tiny_trace: Path) -> None:
    argv = ["--trace-dir", str(tiny_trace), "--workload", "tiny", "--seeds", "1", "--mig"]
    report = fgd_json([*argv, "--policies", "laminar,fgd"])
    assert set(report["policies"]) == {"laminar", "fgd"}
    assert report["mig"] is True
    assert report["policies"]["laminar"]["messages_per_placement"] > 0


def test_workload_prior_is_a_laminar_option_that_the_report_names(tiny_trace: Path) -> None:
    argv = ["--trace-dir", str(tiny_trace), "--workload", "tiny", "--seeds", "1"]
    plain = fgd_json([*argv, "--policies", "laminar"])
    prior = fgd_json([*argv, "--policies", "laminar", "--workload-prior"])
    assert plain["laminar_workload_prior"] is False
    assert prior["laminar_workload_prior"] is True
    assert prior["policies"]["laminar"]["messages_per_placement"] > 0
    code, out = run_cli(["sim", "fgd", *argv, "--policies", "laminar", "--workload-prior"])
    assert code == 0 and "routers start from the pod list's workload" in out


@pytest.mark.parametrize("mig", [False, True])
def test_write_prior_gives_a_live_router_the_simulators_prior(
    tiny_trace: Path, tmp_path: Path, mig: bool
) -> None:
    """``--write-prior FILE`` writes the prior ``--workload-prior`` gives the simulator's
    routers (MIG profiles with ``--mig``) as a file a router's config loads, and runs no
    simulation."""
    path = tmp_path / "prior.json"
    argv = ["sim", "fgd", "--trace-dir", str(tiny_trace), "--workload", "tiny"]
    code, out = run_cli([*argv, *(["--mig"] if mig else []), "--write-prior", str(path)])
    assert code == 0 and "Unallocated" not in out and str(path) in out.replace("\n", "")
    pods = [p.shape for p in traces.read_pods(traces.pod_list_path(tiny_trace, "tiny"))]
    slicing = MigSlicing() if mig else MILLI_SLICING
    simulated = ObservedWorkload(slicing)
    simulated.add_prior(fgd.laminar_workload_prior(pods, slicing))  # as sim routers start
    config = load_config(ZoneConfig, overrides={"placement.workload_prior_file": str(path)})
    assert config.workload_prior() == simulated.counts
    assert simulated.observed == len(pods) == 12
    other = ObservedWorkload(slicing)
    other.add_prior(fgd.laminar_workload_prior(pods, MILLI_SLICING if mig else MigSlicing()))
    assert config.workload_prior() != other.counts  # --mig decides the shapes


def test_write_prior_to_an_unwritable_path_names_the_flag(tiny_trace: Path, tmp_path: Path) -> None:
    argv = ["sim", "fgd", "--trace-dir", str(tiny_trace), "--workload", "tiny"]
    with pytest.raises(InvalidArgument) as caught:
        run_cli([*argv, "--write-prior", str(tmp_path / "none" / "prior.json")])
    assert caught.value.field == "--write-prior"
