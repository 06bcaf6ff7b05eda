"""``laminar sim ...``: simulator experiments on the command line.

:func:`register` adds the ``sim`` command to the ``laminar`` parser. Each leaf
parser sets ``func`` to a handler ``(args, console) -> exit code``. Bad input
raises :class:`~laminar_base.errors.InvalidArgument` naming the flag; the
``laminar`` entry point prints it as one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from laminar_airlock import traces as airlock_traces
from laminar_base.errors import FailedPrecondition, InvalidArgument
from laminar_sim import airlock_sim, atomized, fgd, traces
from laminar_sim.load import LoadSpec, run_load
from laminar_sim.policies import MILLI_SLICING, MigSlicing
from laminar_sim.replay import ReplaySpec, read_jobs, run_replay
from laminar_zone.market import DEFAULT_POLICY as DEFAULT_MARKET_POLICY
from laminar_zone.market import DEFAULT_STARVATION_FLOOR_SECONDS, DEFAULT_STARVATION_RATIO
from laminar_zone.market import POLICIES as MARKET_POLICIES
from laminar_zone.view import ProbeLimits

EXPECTED_RESULTS_DIR_NAME = "fgd-atc23-expected-results"
SUMMARY_LEVELS = (75, 90, 100, 110, 120, 130)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``sim`` and its experiments to a ``laminar`` sub-command set."""
    sim = subparsers.add_parser("sim", help="trace-driven simulator experiments")
    experiments = sim.add_subparsers(dest="sim_command", required=True)
    exp = experiments.add_parser(
        "fgd",
        help="placement quality on the Alibaba openb trace, against the FGD paper (ATC'23)",
        description=(
            "Fill a cluster to 130%% of its GPU capacity with the pods of a trace "
            "(no departures, no retries) under each policy and report the unallocated "
            "GPU share at 100%% arrived, as the FGD paper does."
        ),
    )
    exp.add_argument(
        "--trace-dir",
        type=Path,
        help="folder with openb_node_list_gpu_node.csv and openb_pod_list_NAME.csv "
        "(default: the bundled copy, which has the 'default' workload only)",
    )
    exp.add_argument(
        "--workload", default="default", help="pod list NAME (openb_pod_list_NAME.csv)"
    )
    exp.add_argument(
        "--policies",
        help=f"comma-separated, from {', '.join(fgd.FGD_POLICIES)} (default: all)",
    )
    exp.add_argument("--seeds", default="42-51", help="seeds: 42-51, 42,43 or 42")
    exp.add_argument(
        "--mig", action="store_true", help="round shares up to MIG profiles with placement rules"
    )
    exp.add_argument(
        "--tune-ratio",
        type=float,
        default=fgd.TUNE_RATIO,
        help="requested GPU as a multiple of capacity (default: 1.3)",
    )
    exp.add_argument(
        "--expected-dir",
        type=Path,
        help="the paper's published results (default: TRACE_DIR/../"
        + EXPECTED_RESULTS_DIR_NAME
        + " when present)",
    )
    _add_probes_flag(exp, "laminar: ")
    exp.add_argument(
        "--zone-hosts",
        type=int,
        default=fgd.LAMINAR_ZONE_HOSTS,
        help=f"laminar: hosts per zone (default {fgd.LAMINAR_ZONE_HOSTS}, what one router is "
        "sized for: the trace's nodes make one zone; 500 gives the 3 zones of before)",
    )
    exp.add_argument(
        "--workload-prior",
        action="store_true",
        help="laminar: routers start from the pod list's mix as their target workload "
        "(FGD is given it; a live router: placement.workload_prior_file), instead of "
        "learning it from the arrivals alone",
    )
    exp.add_argument(
        "--write-prior",
        type=Path,
        metavar="FILE",
        help="write the pod list's mix as routers observe it (MIG profiles with --mig) to "
        "FILE, a live router's placement.workload_prior_file, and simulate nothing",
    )
    exp.add_argument("-o", "--output", choices=["table", "json"], default="table")
    exp.add_argument("--plot", type=Path, help="save the unallocated-GPU curves to this PNG")
    exp.set_defaults(func=cmd_fgd)

    ld = experiments.add_parser(
        "load",
        help="the placement hot path at scale: Laminar's routers against one central queue",
        description=(
            "Open-loop Poisson arrivals of small transient and large rigid tasks on equal "
            "hosts at a given load; Laminar (zones, sampled probing, agents' ledgers, network "
            "delay/loss, stale views) and a central best-fit queue run on the same arrivals."
        ),
    )
    ld.add_argument("--hosts", type=int, required=True, help="hosts (1,000 to 32,000)")
    ld.add_argument("--load", type=float, required=True, help="offered load, 0.4-0.9")
    ld.add_argument("--seed", type=int, default=1)
    ld.add_argument("--jobs", type=int, default=0, help="tasks (default: --window-seconds of them)")
    ld.add_argument(
        "--window-seconds", type=float, default=10.0, help="arrival window (default 10 s)"
    )
    ld.add_argument(
        "--warmup-seconds",
        type=float,
        default=2.0,
        help="arrivals before this are run but not measured (default 2 s)",
    )
    ld.add_argument("--zone-hosts", type=int, default=1000, help="hosts per zone (default 1000)")
    _add_probes_flag(ld)
    ld.add_argument(
        "--net-delay-ms", type=float, default=0.5, help="one-way message delay (default 0.5 ms)"
    )
    ld.add_argument("--loss", type=float, default=0.0, help="message loss ratio (default 0)")
    ld.add_argument(
        "--heartbeat-seconds",
        type=float,
        default=1.0,
        help="agents' heartbeat period: how stale the routers' views get (default 1 s)",
    )
    ld.add_argument(
        "--event-gap-seconds",
        type=float,
        default=None,
        help="least time between two heartbeats subjob events wake on one host (default: "
        "the agent's zone.heartbeat_event_gap_seconds default)",
    )
    ld.add_argument(
        "--policies", default="laminar,central", help="laminar, central or both (default)"
    )
    ld.add_argument("-o", "--output", choices=["table", "json"], default="table")
    ld.add_argument("--plot", type=Path, help="save the latency CDF of each policy to this PNG")
    ld.set_defaults(func=cmd_load)

    rp = experiments.add_parser(
        "replay",
        help="time-based replay of the Philly trace: queue time, JCT, utilization, fragmentation",
        description=(
            "Replay philly_jobs_pollux.csv (arrivals, GPU counts, durations) on equal 8-GPU "
            "hosts under Laminar's zone queue (EASY backfill, probe path, agents' ledgers) and "
            "a strict FIFO baseline, on the same jobs. With --mode rigid,atomized: the same "
            "jobs on MIG-partitioned hosts, with GenAI memory profiles, placed rigidly or run "
            "as subjobs the atomization market clears."
        ),
    )
    rp.add_argument(
        "--trace", type=Path, required=True, help="philly-pollux folder or its CSV file"
    )
    rp.add_argument("--cluster", default="", help="one of the trace's clusters (default: all)")
    rp.add_argument("--limit-jobs", type=int, default=2000, help="first N jobs (0 = all)")
    rp.add_argument(
        "--hosts",
        type=int,
        default=16,
        help="hosts of 8 GPUs (with atomized: of --mig-layout) (default 16)",
    )
    rp.add_argument(
        "--speedup", type=float, default=1.0, help="divide arrival times by this (default 1)"
    )
    rp.add_argument(
        "--mode",
        default="rigid",
        help="rigid (default: laminar against fifo on whole GPUs), or rigid,atomized / atomized: "
        "rigid placement against the atomization market on MIG hosts, same jobs",
    )
    rp.add_argument(
        "--genai-trace",
        type=Path,
        help="with atomized: alibaba-genai-v2026 folder or its memory CSV (default: beside "
        "--trace's folder)",
    )
    rp.add_argument(
        "--mig-layout",
        default=atomized.DEFAULT_MIG_LAYOUT,
        help="with atomized: one host's GPUs in the agent's fake_gpus syntax "
        "(default: a mix of H100-80GB MIG layouts)",
    )
    rp.add_argument(
        "--memory-scale",
        type=float,
        default=0.5,
        help="with atomized: factor on the GenAI memory curves (default 0.5: 48 GB GPUs to 24 GB)",
    )
    rp.add_argument(
        "--horizon-seconds", type=float, default=3600.0, help="with atomized: longest window"
    )
    rp.add_argument(
        "--checkpoint-seconds",
        type=float,
        default=30.0,
        help="with atomized: checkpoint overhead per subjob (default 30 s)",
    )
    rp.add_argument(
        "--hysteresis",
        type=float,
        default=None,
        help="with atomized: how much better a bid of a piece's own class must score to take "
        "its slice at its window's end (default the market's, 0.1)",
    )
    rp.add_argument(
        "--starvation-ratio",
        type=float,
        default=None,
        help="with atomized: srpt's starvation guard, a job in the system longer than this "
        "times (its work left + --starvation-floor-seconds) outranks the others; 0: pure srpt "
        f"(default the market's, {DEFAULT_STARVATION_RATIO:g})",
    )
    rp.add_argument(
        "--starvation-floor-seconds",
        type=float,
        default=None,
        help="with atomized: added to the work left in the starvation guard's patience "
        f"(default the market's, {DEFAULT_STARVATION_FLOOR_SECONDS:g} s)",
    )
    rp.add_argument(
        "--no-incumbency",
        action="store_true",
        help="with atomized: every piece checkpoints and stops at its window's end",
    )
    rp.add_argument(
        "--market-gangs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with atomized (the default; --no-market-gangs for the before): gangs bid in the "
        "market for one window per member, all or nothing, and run as pieces instead of rigid "
        "jobs, as the router runs atomized gangs",
    )
    rp.add_argument(
        "--no-pool-calibration",
        action="store_true",
        help="with atomized: each job's calibrator learns alone, not pooled with its family",
    )
    rp.add_argument(
        "--calibrator-min-samples",
        type=int,
        default=None,
        help="with atomized: subjobs a job's calibrator observes before it may shrink the "
        "declared profile (default: the market's, ceil(1/epsilon) - 1)",
    )
    rp.add_argument("--epsilon", type=float, default=0.05, help="with atomized: contract epsilon")
    rp.add_argument(
        "--clearing-policy",
        default=DEFAULT_MARKET_POLICY,
        choices=list(MARKET_POLICIES),
        help=f"with atomized: the market's clearing policy (default {DEFAULT_MARKET_POLICY})",
    )
    rp.add_argument("--seed", type=int, default=1)
    rp.add_argument("-o", "--output", choices=["table", "json"], default="table")
    rp.add_argument(
        "--plot",
        type=Path,
        help="save the queue-time CDF of each policy (with atomized: the JCT CDF of each mode) "
        "to this PNG",
    )
    rp.set_defaults(func=cmd_replay)

    al = experiments.add_parser(
        "airlock",
        help="the Airlock ladder against an OOM killer on many shared GPUs (GenAI curves)",
        description=(
            "Each GPU hosts a sharing group of subjobs replaying real GenAI memory curves "
            "that cross the critical mark; the ladder (laminar_airlock.policy.decide on "
            "laminar_airlock.levels) and the OOM-killer baseline run on the same GPUs, curves, "
            "classes and seed, polled every --poll-seconds of simulated time."
        ),
    )
    al.add_argument(
        "--trace-dir",
        type=Path,
        required=True,
        help="alibaba-genai-v2026 folder or its pod_gpu_memory_used_bytes_anon.csv",
    )
    al.add_argument("--gpus", type=int, default=1000, help="shared 80 GiB GPUs (default 1000)")
    al.add_argument("--seed", type=int, default=1)
    al.add_argument(
        "--poll-seconds", type=float, default=0.1, help="Airlock poll per GPU (default 0.1 s)"
    )
    al.add_argument("--members", type=int, default=3, help="subjobs per GPU (default 3)")
    al.add_argument(
        "--window", type=int, default=60, help="trace samples per group, 57 s each (default 60)"
    )
    al.add_argument(
        "--peak-above-ratio",
        type=float,
        default=airlock_sim.AirlockSimSpec.peak_above_ratio,
        help="a group's summed curve must exceed this share of the GPU (default: the critical "
        "mark, 0.95)",
    )
    al.add_argument(
        "--ramp-seconds",
        type=float,
        default=5.0,
        help="time memory takes between two trace samples (default 5 s)",
    )
    al.add_argument(
        "--oom-grace-seconds",
        type=float,
        default=0.2,
        help="an allocation that does not fit stalls this long, then the process dies of "
        "CUDA OOM (default 0.2 s)",
    )
    al.add_argument(
        "--readdress-delay-seconds",
        type=float,
        default=airlock_sim.AirlockSimSpec.readdress_delay_seconds,
        help="the agent's heartbeat period, which carries Airlock's move requests to the "
        "router (default 1 s, the agent's zone.heartbeat_seconds)",
    )
    al.add_argument(
        "--checkpoint-seconds",
        type=float,
        default=600.0,
        help="checkpoint period of restartable subjobs (default 600 s)",
    )
    al.add_argument(
        "--stop-frees-share",
        type=float,
        default=airlock_sim.AirlockSimSpec.stop_frees_share,
        help="share of the subjobs without the release signal whose stop frees their GPU "
        "memory (cuda-checkpoint on a whole GPU; the rest are reclaimed when picked; "
        "default 1.0, what the agent does where it finds cuda-checkpoint)",
    )
    al.add_argument(
        "--requeue-delay-seconds",
        type=float,
        default=airlock_sim.AirlockSimSpec.requeue_delay_seconds,
        help="the router's queue pass period while re-runs wait (default 1 s, the router's "
        "queue.retry_seconds)",
    )
    al.add_argument(
        "--horizon-seconds",
        type=float,
        default=0.0,
        help="simulated time the run stops at; what has not completed is unfinished "
        "(default 0: twice the window)",
    )
    al.add_argument(
        "--policies", default="ladder,oom-killer", help="ladder, oom-killer or both (default)"
    )
    al.add_argument("-o", "--output", choices=["table", "json"], default="table")
    al.add_argument("--plot", type=Path, help="save work lost and kills by class to this PNG")
    al.set_defaults(func=cmd_airlock)


def _add_probes_flag(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """``--probes``: d, hosts probed per attempt, defaulting to the router's."""
    d = ProbeLimits().probes_per_attempt
    parser.add_argument(
        "--probes",
        type=int,
        default=d,
        help=f"{prefix}hosts probed per attempt, d (default: the router's, {d}); with 1 a "
        "one-member task's probe carries the commit",
    )


def cmd_fgd(args: argparse.Namespace, console: Console) -> int:
    """Run the ``fgd`` experiment and print a table or JSON."""
    trace_dir, expected_dir = _trace_dirs(args)
    if args.write_prior is not None:
        return _write_prior(trace_dir, args, console)
    policies = list(fgd.FGD_POLICIES) if args.policies is None else _policies(args.policies)
    seeds = _seeds(args.seeds)
    ratio = float(args.tune_ratio)
    if not 0 < ratio <= 10:
        raise InvalidArgument(f"must be in (0, 10], got {ratio}", field="--tune-ratio")
    if args.plot is not None:
        _check_plot_target(args.plot)
    if not 1 <= args.probes <= 64:
        raise InvalidArgument(f"must be between 1 and 64, got {args.probes}", field="--probes")
    if args.zone_hosts < 1:
        raise InvalidArgument(f"must be at least 1, got {args.zone_hosts}", field="--zone-hosts")

    total = len(policies) * len(seeds)
    progress = _progress("sim fgd")
    with progress:
        task = progress.add_task(f"{args.workload}", total=total)

        def advance(policy: str, seed: int) -> None:
            progress.update(task, advance=1, description=f"{args.workload} {policy} seed {seed}")

        report = fgd.run_experiment(
            trace_dir,
            args.workload,
            policies,
            seeds,
            mig=bool(args.mig),
            ratio=ratio,
            expected_dir=expected_dir,
            progress=advance,
            zone_hosts=args.zone_hosts,
            limits=replace(ProbeLimits(), probes_per_attempt=args.probes),
            workload_prior=bool(args.workload_prior),
        )
    report["trace_dir"] = str(trace_dir)
    return emit(report, args, console, render_fgd, lambda path: save_plot(report, path))


def _write_prior(trace_dir: Path, args: argparse.Namespace, console: Console) -> int:
    """``sim fgd --write-prior FILE``: the pod list's prior file for a live router."""
    pods = [p.shape for p in traces.read_pods(traces.pod_list_path(trace_dir, args.workload))]
    path = Path(args.write_prior)
    text = fgd.workload_prior_text(pods, MigSlicing() if args.mig else MILLI_SLICING)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InvalidArgument(
            f"cannot write {path}: {exc.strerror}", field="--write-prior"
        ) from None
    console.print(f"wrote {path}: the {args.workload} pod list's {len(pods)} pods as a prior")
    return 0


def _zones_text(nodes: int, zone_hosts: int | None) -> str:
    """How the run split the nodes: "1 zone of 1213 hosts", "3 zones of up to 500 hosts"."""
    per_zone = zone_hosts or fgd.LAMINAR_ZONE_HOSTS
    zones = max(1, math.ceil(nodes / per_zone))
    if zones == 1:
        return f"1 zone of {nodes} hosts"
    return f"{zones} zones of up to {per_zone} hosts"


def render_fgd(report: dict[str, Any], console: Console) -> None:
    """The human summary: ours next to the paper's, then the curve at a few levels."""
    paper = report.get("paper_unallocated_pct_at_100") or {}
    mode = "MIG profiles" if report["mig"] else "gpu_milli sharing"
    table = Table(
        title=(
            f"Unallocated GPU % at 100% arrived: {report['workload']}, {report['nodes']} nodes, "
            f"{report['cluster_gpus']} GPUs, {mode}, seeds {_seed_text(report['seeds'])}"
        )
    )
    columns = ("policy", "median", "mean", "paper med", "paper mean", "diff", "frag%gpu")
    for column in (*columns, "frag%idle", "failed"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for policy, summary in report["policies"].items():
        at100 = summary["unallocated_pct_at_100"] or {}
        ours = at100.get("median")
        theirs = paper.get(policy, {})
        diff = None if ours is None or "median" not in theirs else ours - theirs["median"]
        table.add_row(
            policy,
            fgd.fmt_pct(ours),
            fgd.fmt_pct(at100.get("mean")),
            fgd.fmt_pct(theirs.get("median")),
            fgd.fmt_pct(theirs.get("mean")),
            "-" if diff is None else f"{diff:+.2f}",
            fgd.fmt_pct((summary["frag_amount_pct_at_100"] or {}).get("median")),
            fgd.fmt_pct((summary["frag_ratio_pct_at_100"] or {}).get("median")),
            f"{summary['failed_pods_mean']:.0f}",
        )
    console.print(table)
    laminar = report["policies"].get("laminar")
    if laminar is not None and "messages_per_placement" in laminar:
        console.print(
            f"laminar: {laminar['messages_per_placement']:.2f} messages per placement "
            f"({laminar['probes_per_placement']:.2f} probes, "
            f"{laminar['bounces_per_placement']:.2f} bounces, "
            f"{laminar['forwards_per_placement']:.3f} forwards; plus "
            f"{laminar['exchange_messages_per_placement']:.2f} zone-summary exchange messages); "
            f"{_zones_text(report['nodes'], report.get('laminar_zone_hosts'))}, "
            f"d={report.get('laminar_probes_per_attempt', 1)} probes per attempt"
            + (
                " (a probe carries the commit)"
                if report.get("laminar_probes_per_attempt") == 1
                else ""
            )
            + (
                "; routers start from the pod list's workload"
                if report.get("laminar_workload_prior")
                else ""
            )
        )

    curve = Table(title="Unallocated GPU % (median over seeds) by arrived GPU % of capacity")
    curve.add_column("policy")
    for level in SUMMARY_LEVELS:
        curve.add_column(f"{level}%", justify="right")
    for policy, summary in report["policies"].items():
        by_level = {row["arrived_pct"]: row["median"] for row in summary["unallocated_pct_curve"]}
        curve.add_row(policy, *(fgd.fmt_pct(by_level.get(level)) for level in SUMMARY_LEVELS))
    console.print(curve)
    console.print(
        f"{len(report['policies'])} policies x {len(report['seeds'])} seeds in "
        f"{report['run_seconds']:.1f} s; {report['events_processed']} simulated events "
        f"({report['events_per_second']:.0f} per second)"
    )


def save_plot(report: dict[str, Any], path: Path) -> None:
    """Unallocated GPU % against arrived GPU %, ours solid and the paper's dashed."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    paper = report.get("paper_unallocated_pct_curve") or {}
    for index, (policy, summary) in enumerate(report["policies"].items()):
        color = f"C{index}"
        rows = summary["unallocated_pct_curve"]
        ax.plot(
            [r["arrived_pct"] for r in rows],
            [r["median"] for r in rows],
            color=color,
            label=f"{policy} (ours)",
        )
        if policy in paper:
            ax.plot(
                [r["arrived_pct"] for r in paper[policy]],
                [r["median"] for r in paper[policy]],
                color=color,
                linestyle="--",
                label=f"{policy} (paper)",
            )
    ax.set_xlabel("arrived GPU request, % of cluster GPU capacity")
    ax.set_ylabel("unallocated GPU, % of capacity")
    mode = " (MIG)" if report["mig"] else ""
    ax.set_title(f"FGD fill-up, workload {report['workload']}{mode}, median over seeds")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or a FailedPrecondition naming --plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in the dev and plots extras
        raise FailedPrecondition(
            "--plot needs matplotlib (pip install 'laminar[plots]')", field="--plot"
        ) from None
    return plt


def save_cdf(
    report: dict[str, Any],
    key: str,
    xlabel: str,
    title: str,
    path: Path,
    group: str = "policies",
) -> None:
    """The CDF of ``key`` percentiles (1..100) of each entry of ``report[group]``, log x axis."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for policy, figures in report[group].items():
        values = figures.get(key) or []
        if values:
            ax.plot([max(v, 1e-3) for v in values], list(range(1, len(values) + 1)), label=policy)
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("percentile")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _trace_dirs(args: argparse.Namespace) -> tuple[Path, Path | None]:
    if args.trace_dir is None:
        if args.workload != "default":
            raise InvalidArgument(
                f"is required for workload {args.workload!r} (only 'default' is bundled)",
                field="--trace-dir",
            )
        trace_dir = traces.bundled_trace_dir()
    else:
        trace_dir = Path(args.trace_dir)
        if not trace_dir.is_dir():
            raise InvalidArgument(f"{trace_dir} is not a folder", field="--trace-dir")
    if not traces.node_list_path(trace_dir).is_file():
        raise InvalidArgument(f"{trace_dir} has no {traces.NODE_LIST_FILE}", field="--trace-dir")
    pod_list = traces.pod_list_path(trace_dir, args.workload)
    if not pod_list.is_file():
        known = ", ".join(traces.available_workloads(trace_dir)) or "none"
        raise InvalidArgument(
            f"no {pod_list.name} in {trace_dir} (available: {known})", field="--workload"
        )
    expected = args.expected_dir
    if expected is not None:
        if not Path(expected).is_dir():
            raise InvalidArgument(f"{expected} is not a folder", field="--expected-dir")
    elif args.trace_dir is not None:
        candidate = trace_dir.resolve().parent / EXPECTED_RESULTS_DIR_NAME
        expected = candidate if candidate.is_dir() else None
    return trace_dir, expected


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise InvalidArgument("no policy given", field="--policies")
    for name in names:
        if name not in fgd.FGD_POLICIES:
            raise InvalidArgument(
                f"unknown policy {name!r} (known: {', '.join(fgd.FGD_POLICIES)})",
                field="--policies",
            )
    if len(set(names)) != len(names):
        raise InvalidArgument("a policy is listed twice", field="--policies")
    return names


def _seeds(text: str) -> list[int]:
    try:
        seeds = fgd.parse_seeds(text)
    except ValueError as exc:
        raise InvalidArgument(
            f"{exc} (expected e.g. 42-51, 42,43 or 42)", field="--seeds"
        ) from None
    if any(seed < 0 for seed in seeds):
        raise InvalidArgument("seeds must be >= 0", field="--seeds")
    return seeds


def _check_plot_target(path: Path) -> None:
    if path.suffix.lower() != ".png":
        raise InvalidArgument(f"{path} must end in .png", field="--plot")
    if not path.parent.resolve().is_dir():
        raise InvalidArgument(f"folder {path.parent} does not exist", field="--plot")


def _seed_text(seeds: list[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(str(s) for s in seeds)


def cmd_load(args: argparse.Namespace, console: Console) -> int:
    """Run the ``load`` experiment and print a table or JSON."""
    spec = LoadSpec(
        hosts=args.hosts,
        load=args.load,
        seed=args.seed,
        jobs=args.jobs,
        window_seconds=args.window_seconds,
        warmup_seconds=args.warmup_seconds,
        zone_hosts=args.zone_hosts,
        probes_per_attempt=args.probes,
        net_delay_seconds=args.net_delay_ms / 1000.0,
        loss_ratio=args.loss,
        heartbeat_seconds=args.heartbeat_seconds,
        **({} if args.event_gap_seconds is None else {"event_gap_seconds": args.event_gap_seconds}),
        policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()),
    )
    try:
        spec.validate()
    except ValueError as exc:
        flag, _, message = str(exc).partition(": ")
        raise InvalidArgument(message, field=flag) from None
    if args.plot is not None:
        _check_plot_target(args.plot)
    progress = _progress("sim load")
    with progress:
        task = progress.add_task("arrivals", total=spec.task_count)

        def advance(policy: str, done: int, total: int) -> None:
            progress.update(task, description=policy, completed=done, total=total)

        report = run_load(spec, advance)
    title = f"sim load: {report['hosts']} hosts, load {report['load']:g}, seed {report['seed']}"
    return emit(
        report,
        args,
        console,
        render_load,
        lambda path: save_cdf(
            report, "latency_percentiles_ms", "arrival to start (ms, log)", title, path
        ),
    )


def render_load(report: dict[str, Any], console: Console) -> None:
    table = Table(
        title=(
            f"load {report['load']:g} on {report['hosts']} hosts x {report['gpus_per_host']} GPUs "
            f"({report['zones']} zones), {report['measured_tasks']} measured tasks at "
            f"{report['arrival_rate_per_second']:.0f}/s, seed {report['seed']}"
        )
    )
    rows = [
        ("start success", "start_success_ratio", "{:.4f}"),
        ("large tasks started", "large_start_success_ratio", "{:.4f}"),
        ("latency p50 (ms)", "latency_p50_ms", "{:.2f}"),
        ("latency p99 (ms)", "latency_p99_ms", "{:.2f}"),
        ("probes / placement", "probes_per_placement", "{:.2f}"),
        ("bounces / placement", "bounces_per_placement", "{:.3f}"),
        ("messages / placement", "messages_per_placement", "{:.2f}"),
        ("view lookups / placement", "view_lookups_per_placement", "{:.2f}"),
        ("hosts scanned / placement", "hosts_scanned_per_placement", "{:.0f}"),
        ("router CPU / placement (us)", "router_seconds_per_placement", "{:.1f}"),
        ("simulated events / s", "events_per_second", "{:.0f}"),
    ]
    policies = report["policies"]
    table.add_column("figure")
    for name in policies:
        table.add_column(name, justify="right")
    for label, key, fmt in rows:
        cells = []
        for figures in policies.values():
            value = figures.get(key)
            if key == "router_seconds_per_placement" and value is not None:
                value = value * 1e6
            cells.append("-" if value is None else fmt.format(value))
        table.add_row(label, *cells)
    console.print(table)
    console.print(f"mix: {report['mix']['small']}; {report['mix']['large']}", highlight=False)
    if "central" in policies:
        cost = policies["central"]["decision_seconds_measured"] * 1e6
        console.print(
            f"central: one best-fit decision over {report['hosts']} hosts measured at "
            f"{cost:.1f} us on this machine; its decisions are serialized",
            highlight=False,
        )


def emit(
    report: dict[str, Any],
    args: argparse.Namespace,
    console: Console,
    render: Callable[[dict[str, Any], Console], None],
    plot: Callable[[Path], None] | None = None,
) -> int:
    """The end of every experiment: the plot when asked (its path goes into the report),
    then the report as JSON or as the human summary."""
    if args.plot is not None and plot is not None:
        plot(args.plot)
        report["plot"] = str(args.plot)
    if args.output == "json":
        console.out(json.dumps(report, indent=2), highlight=False)
    else:
        render(report, console)
    return 0


def cmd_replay(args: argparse.Namespace, console: Console) -> int:
    """Run the ``replay`` experiment and print a table or JSON."""
    if not args.trace.exists():
        raise InvalidArgument(f"{args.trace} does not exist", field="--trace")
    if not 1 <= args.hosts <= 100_000:
        raise InvalidArgument(f"must be in 1..100000, got {args.hosts}", field="--hosts")
    if not 0 < args.speedup <= 10_000:
        raise InvalidArgument(f"must be in (0, 10000], got {args.speedup}", field="--speedup")
    if args.limit_jobs < 0:
        raise InvalidArgument(f"must be >= 0, got {args.limit_jobs}", field="--limit-jobs")
    if args.plot is not None:
        _check_plot_target(args.plot)
    modes = _modes(args.mode)
    if "atomized" in modes:
        return cmd_replay_mig(args, modes, console)
    spec = ReplaySpec(
        trace=args.trace,
        cluster=args.cluster,
        limit_jobs=args.limit_jobs,
        hosts=args.hosts,
        speedup=args.speedup,
        seed=args.seed,
    )
    progress = _progress("sim replay")
    with progress:
        task = progress.add_task("jobs", total=None)

        def advance(policy: str, done: int, total: int) -> None:
            progress.update(task, description=policy, completed=done, total=total)

        try:
            report = run_replay(spec, advance)
        except (ValueError, KeyError, OSError) as exc:
            raise InvalidArgument(str(exc).removeprefix("--trace: "), field="--trace") from None
    title = f"sim replay: {report['jobs']} jobs ({report['cluster']}) on {report['hosts']} hosts"
    return emit(
        report,
        args,
        console,
        render_replay,
        lambda path: save_cdf(
            report, "queue_percentiles_seconds", "queue time (s, log)", title, path
        ),
    )


def render_replay(report: dict[str, Any], console: Console) -> None:
    """The human summary of the whole-GPU replay: one column per policy."""
    table = Table(
        title=(
            f"replay of {report['jobs']} jobs ({report['cluster']}) on {report['hosts']} hosts x "
            f"{report['gpus_per_host']} GPUs, offered load {report['offered_load']:.2f}"
        )
    )
    table.add_column("figure")
    for name in report["policies"]:
        table.add_column(name, justify="right")
    rows = [
        ("queue time mean / p50 / p99 (s)", "queue_seconds"),
        ("JCT mean / p50 / p99 (s)", "jct_seconds"),
    ]
    for label, key in rows:
        table.add_row(
            label,
            *(
                f"{f[key]['mean']:.0f} / {f[key]['p50']:.0f} / {f[key]['p99']:.0f}"
                for f in report["policies"].values()
            ),
        )
    for label, key in (
        ("GPU utilization", "gpu_utilization_ratio"),
        ("fragmentation (share of GPUs)", "fragmentation_ratio"),
        ("simulated events / s", "events_per_second"),
    ):
        table.add_row(label, *(f"{f[key]:.4g}" for f in report["policies"].values()))
    console.print(table)


def cmd_airlock(args: argparse.Namespace, console: Console) -> int:
    """Run the ``airlock`` experiment and print a table or JSON."""
    spec = airlock_sim.AirlockSimSpec(
        gpus=args.gpus,
        seed=args.seed,
        poll_seconds=args.poll_seconds,
        members=args.members,
        window=args.window,
        peak_above_ratio=args.peak_above_ratio,
        ramp_seconds=args.ramp_seconds,
        oom_grace_seconds=args.oom_grace_seconds,
        readdress_delay_seconds=args.readdress_delay_seconds,
        checkpoint_seconds=args.checkpoint_seconds,
        stop_frees_share=args.stop_frees_share,
        requeue_delay_seconds=args.requeue_delay_seconds,
        horizon_seconds=args.horizon_seconds,
        policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()),
    )
    try:
        spec.validate()
    except ValueError as exc:
        flag, _, message = str(exc).partition(": ")
        raise InvalidArgument(message, field=flag) from None
    if not airlock_traces.trace_file(args.trace_dir).is_file():
        raise InvalidArgument(
            f"no {airlock_traces.GENAI_MEMORY_FILE} at {args.trace_dir}", field="--trace-dir"
        )
    if args.plot is not None:
        _check_plot_target(args.plot)
    progress = _progress("sim airlock")
    with progress:
        task = progress.add_task("groups", total=spec.gpus)

        def advance(stage: str, done: int, total: int) -> None:
            progress.update(task, description=stage, completed=done, total=total)

        try:
            curves = airlock_traces.load_memory_curves(args.trace_dir)
            plans = airlock_sim.build_workload(curves, spec, advance)
        except (ValueError, OSError) as exc:
            raise InvalidArgument(str(exc), field="--trace-dir") from None
        report = airlock_sim.run_airlock_sim(spec, plans, advance)
    report["trace"] = str(args.trace_dir)
    return emit(report, args, console, render_airlock, lambda p: save_airlock_plot(report, p))


def render_airlock(report: dict[str, Any], console: Console) -> None:
    """The human summary: one column per policy."""
    policies = report["policies"]
    table = Table(
        title=(
            f"Airlock on {report['gpus']} shared {report['gpu_total_gib']:.0f} GiB GPUs, "
            f"{report['subjobs']} subjobs ({report['members_per_gpu']} per GPU), "
            f"poll {report['poll_seconds']:g} s, horizon {report['horizon_seconds']:,.0f} s, "
            f"seed {report['seed']}"
        )
    )
    table.add_column("figure")
    for name in policies:
        table.add_column(name, justify="right")

    def row(label: str, cell: Any) -> None:
        table.add_row(label, *(cell(f) for f in policies.values()))

    row("completion ratio", lambda f: f"{f['completion_ratio']:.4f}")
    for mark in next(iter(policies.values()))["completion_ratio_by_time"]:
        row(
            f"  completed by {mark}",
            lambda f, m=mark: f"{f['completion_ratio_by_time'][m]:.4f}",
        )
    row(
        "completed at p50 / p99 (s)",
        lambda f: (
            f"{f['completed_at_p50_seconds'] or 0:,.0f} / {f['completed_at_p99_seconds'] or 0:,.0f}"
        ),
    )
    row(
        "killed (reclaimed + OOM)",
        lambda f: (
            f"{f['killed']} ("
            + f"{sum(k['reclaimed'] for k in f['killed_by_class'].values())} + "
            + f"{sum(k['oom'] for k in f['killed_by_class'].values())})"
        ),
    )
    for cls in airlock_sim.CLASS_NAMES:
        row(
            f"  {cls} killed (reclaimed + OOM)",
            lambda f, c=cls: (
                f"{f['killed_by_class'][c]['reclaimed']} + {f['killed_by_class'][c]['oom']}"
            ),
        )
    row(
        "high-priority work lost (GPU-s)",
        lambda f: f"{f['high_priority_work_lost_gpu_seconds']:,.0f}",
    )
    row("all work lost (GPU-s)", lambda f: f"{f['work_lost_gpu_seconds']:,.0f}")
    for cls in airlock_sim.CLASS_NAMES:
        row(
            f"  {cls} work lost (GPU-s)",
            lambda f, c=cls: f"{f['work_lost_gpu_seconds_by_class'][c]:,.0f}",
        )
    for cls in airlock_sim.CLASS_NAMES:
        row(
            f"{cls} suspended (s)",
            lambda f, c=cls: f"{f['suspended_seconds_by_class'][c]:,.0f}",
        )
    row(
        "actions susp/rel/res/readdr/recl",
        lambda f: "/".join(str(v) for v in f["actions_by_step"].values()),
    )
    row(
        "moved / router found no room",
        lambda f: f"{f['moved']} / {f['move_retries_no_room']}",
    )
    row(
        "critical stopped while lower ran",
        lambda f: (
            f"{f['critical_stopped_while_lower_ran']} "
            f"({f['critical_suspended_while_lower_ran_seconds']:,.0f} s)"
        ),
    )
    row("GPU-s above critical mark", lambda f: f"{f['above_critical_gpu_seconds']:,.0f}")
    row("polls run", lambda f: f"{f['polls']:,}")
    row("simulated events / s", lambda f: f"{f['events_per_second'] or 0:,.0f}")
    console.print(table)


def save_airlock_plot(report: dict[str, Any], path: Path) -> None:
    """Work lost and subjobs killed by class, one bar per policy."""
    plt = _pyplot()
    classes = list(airlock_sim.CLASS_NAMES)
    policies = report["policies"]
    width = 0.8 / max(1, len(policies))
    fig, (lost_ax, killed_ax) = plt.subplots(1, 2, figsize=(10, 4.2))
    for n, (name, figures) in enumerate(policies.items()):
        xs = [i + n * width for i in range(len(classes))]
        lost = [figures["work_lost_gpu_seconds_by_class"][c] / 3600.0 for c in classes]
        killed = [
            figures["killed_by_class"][c]["reclaimed"] + figures["killed_by_class"][c]["oom"]
            for c in classes
        ]
        lost_ax.bar(xs, lost, width, label=name)
        killed_ax.bar(xs, killed, width, label=name)
    for ax, ylabel in (
        (lost_ax, "work lost (GPU-hours)"),
        (killed_ax, "runs killed (reclaimed + CUDA OOM)"),
    ):
        ax.set_xticks([i + width * (len(policies) - 1) / 2 for i in range(len(classes))])
        ax.set_xticklabels(classes)
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"sim airlock: {report['gpus']} GPUs, {report['subjobs']} subjobs, seed {report['seed']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _modes(text: str) -> tuple[str, ...]:
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    if not names:
        raise InvalidArgument("no mode given", field="--mode")
    for name in names:
        if name not in atomized.MODES:
            raise InvalidArgument(
                f"unknown mode {name!r} (known: {', '.join(atomized.MODES)})", field="--mode"
            )
    if len(set(names)) != len(names):
        raise InvalidArgument("a mode is listed twice", field="--mode")
    return names


def _genai_trace(args: argparse.Namespace) -> Path:
    if args.genai_trace is not None:
        path = Path(args.genai_trace)
    else:
        folder = args.trace if args.trace.is_dir() else args.trace.parent
        path = folder.resolve().parent / "alibaba-genai-v2026"
    if not airlock_traces.trace_file(path).is_file():
        raise InvalidArgument(
            f"no {airlock_traces.GENAI_MEMORY_FILE} at {path}", field="--genai-trace"
        )
    return path


def cmd_replay_mig(args: argparse.Namespace, modes: tuple[str, ...], console: Console) -> int:
    """Rigid against atomized on MIG hosts: the same Philly jobs, GenAI memory profiles."""
    if not 0 < args.memory_scale <= 10:
        raise InvalidArgument(
            f"must be in (0, 10], got {args.memory_scale}", field="--memory-scale"
        )
    if not 0 < args.epsilon < 0.5:
        raise InvalidArgument(f"must be in (0, 0.5), got {args.epsilon}", field="--epsilon")
    if not 60 <= args.horizon_seconds <= 30 * 86400:
        raise InvalidArgument(
            f"must be in 60..2592000 s, got {args.horizon_seconds}", field="--horizon-seconds"
        )
    if not 0 <= args.checkpoint_seconds < args.horizon_seconds:
        raise InvalidArgument(
            f"must be in [0, --horizon-seconds), got {args.checkpoint_seconds}",
            field="--checkpoint-seconds",
        )
    if args.calibrator_min_samples is not None and not 1 <= args.calibrator_min_samples <= 10_000:
        raise InvalidArgument(
            f"must be in 1..10000, got {args.calibrator_min_samples}",
            field="--calibrator-min-samples",
        )
    if args.hysteresis is not None and not 0 <= args.hysteresis <= 1:
        raise InvalidArgument(f"must be in [0, 1], got {args.hysteresis}", field="--hysteresis")
    if args.starvation_ratio is not None and not 0 <= args.starvation_ratio <= 1000:
        raise InvalidArgument(
            f"must be in [0, 1000], got {args.starvation_ratio}", field="--starvation-ratio"
        )
    if args.starvation_floor_seconds is not None and args.starvation_floor_seconds < 0:
        raise InvalidArgument(
            f"must be >= 0, got {args.starvation_floor_seconds}",
            field="--starvation-floor-seconds",
        )
    starvation: dict[str, float] = {}
    if args.starvation_ratio is not None:
        starvation["starvation_ratio"] = args.starvation_ratio
    if args.starvation_floor_seconds is not None:
        starvation["starvation_floor_seconds"] = args.starvation_floor_seconds
    genai = _genai_trace(args)
    spec = atomized.AtomizeSpec(
        hosts=args.hosts,
        mig_layout=args.mig_layout,
        seed=args.seed,
        epsilon=args.epsilon,
        checkpoint_overhead_seconds=args.checkpoint_seconds,
        horizon_seconds=args.horizon_seconds,
        memory_scale=args.memory_scale,
        clearing_policy=args.clearing_policy,
        calibrator_min_samples=args.calibrator_min_samples,
        modes=modes,
        incumbency=not args.no_incumbency,
        pool_calibration=not args.no_pool_calibration,
        market_gangs=args.market_gangs,
        **({} if args.hysteresis is None else {"hysteresis": args.hysteresis}),
        **starvation,
    )
    try:
        hosts = atomized.build_hosts(atomized.AtomizeSpec(hosts=1, mig_layout=args.mig_layout))
    except (InvalidArgument, ValueError) as exc:
        message = exc.message if isinstance(exc, InvalidArgument) else str(exc)
        raise InvalidArgument(message, field="--mig-layout") from None
    gpus = len({s.gpu_index for s in hosts[0].ledger.slices.values()})
    trace_spec = ReplaySpec(
        trace=args.trace,
        cluster=args.cluster,
        limit_jobs=args.limit_jobs,
        hosts=args.hosts,
        gpus_per_host=gpus,
        speedup=args.speedup,
        seed=args.seed,
    )
    progress = _progress("sim replay")
    with progress:
        task = progress.add_task("jobs", total=None)

        def advance(mode: str, done: int, total: int) -> None:
            progress.update(task, description=mode, completed=done, total=total)

        try:
            jobs = read_jobs(trace_spec)
            largest = max(s.memory_total_bytes for s in hosts[0].ledger.slices.values())
            profiles = atomized.load_profiles(genai, args.memory_scale, largest)
        except (ValueError, KeyError, OSError) as exc:
            raise InvalidArgument(str(exc).removeprefix("--trace: "), field="--trace") from None
        if not profiles:
            raise InvalidArgument(
                f"no pod curve of {genai} has 5 hours of samples peaking within "
                f"{largest / 2**30:.0f} GiB at --memory-scale {args.memory_scale:g}",
                field="--genai-trace",
            )
        try:
            body = atomized.run_experiment(spec, jobs, profiles, advance)
        except ValueError as exc:
            raise InvalidArgument(str(exc), field="--trace") from None
    report: dict[str, Any] = {
        "experiment": "replay",
        "mode": ",".join(modes),
        "trace": str(args.trace),
        "genai_trace": str(genai),
        "cluster": args.cluster or "all",
        "speedup": args.speedup,
        "seed": args.seed,
        **body,
    }
    title = (
        f"sim replay: {report['jobs']} jobs ({report['cluster']}), "
        f"{report['hosts']} MIG hosts, rigid vs atomized"
    )
    return emit(
        report,
        args,
        console,
        render_replay_mig,
        lambda path: save_cdf(
            report,
            "jct_percentiles_seconds",
            "job completion time (s, log)",
            title,
            path,
            group="modes",
        ),
    )


def render_replay_mig(report: dict[str, Any], console: Console) -> None:
    """The human summary of rigid against atomized."""
    modes = report["modes"]
    table = Table(
        title=(
            f"replay of {report['jobs']} jobs ({report['cluster']}, speedup {report['speedup']:g}) "
            f"on {report['hosts']} MIG hosts ({report['compute_slices']} compute slices), "
            f"offered compute load {report['offered_compute_load']:.2f}, seed {report['seed']}"
        )
    )
    table.add_column("figure")
    for name in modes:
        table.add_column(name, justify="right")

    def triple(figures: dict[str, float]) -> str:
        return f"{figures['mean']:,.0f} / {figures['p50']:,.0f} / {figures['p99']:,.0f}"

    table.add_row("JCT mean / p50 / p99 (s)", *(triple(f["jct_seconds"]) for f in modes.values()))
    table.add_row(
        "queue mean / p50 / p99 (s)", *(triple(f["queue_seconds"]) for f in modes.values())
    )
    for klass, _, _ in atomized.CLASSES:
        table.add_row(
            f"queue {klass} mean / p99 (s)",
            *(
                f"{f['queue_by_class_seconds'][klass]['mean']:,.0f} / "
                f"{f['queue_by_class_seconds'][klass]['p99']:,.0f}"
                for f in modes.values()
            ),
        )
    for label, key in (
        ("GPU utilization", "gpu_utilization_ratio"),
        ("useful share of busy time", "useful_work_ratio"),
        ("fragmentation (share of free)", "fragmentation_ratio"),
        ("safety violations", "violation_ratio"),
        ("subjobs per job", "subjobs_per_job"),
        ("window fill", "window_fill_ratio"),
    ):
        table.add_row(label, *("-" if f[key] is None else f"{f[key]:.4g}" for f in modes.values()))
    table.add_row("violations counted over", *(str(f["violation_basis"]) for f in modes.values()))
    console.print(table)
    console.print(
        f"{report['single_gpu_jobs']} of {report['jobs']} jobs use one GPU (atomizable); "
        f"epsilon {report['epsilon']}, checkpoint {report['checkpoint_overhead_seconds']:g} s, "
        f"horizon {report['horizon_seconds']:g} s, clearing {report['clearing_policy']}, "
        f"calibrator min samples {report['calibrator_min_samples']}",
        highlight=False,
    )


def _progress(title: str) -> Progress:
    """A transient progress bar on stderr, shown only on a terminal."""
    return Progress(
        TextColumn(f"[bold]{title}[/bold] {{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not sys.stderr.isatty(),
    )
