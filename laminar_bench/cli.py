"""``laminar bench ...``: live benchmarks of the real daemons on loopback.

:func:`register` adds the ``bench`` command to the ``laminar`` parser. Each
leaf parser sets ``func`` to a handler ``(args, console) -> exit code``. Bad
input raises :class:`~laminar_base.errors.InvalidArgument` naming the flag;
the ``laminar`` entry point prints it as one line and exits 2. A benchmark
never fails on a number: it reports (exit 0), and fails (exit 1) only when
its cluster cannot be started.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from laminar_bench.airlock import AirlockBenchSpec, run_airlock_bench
from laminar_bench.heartbeats import (
    DEFAULT_AGENTS_PER_PROCESS,
    TRANSPORTS,
    HeartbeatBenchSpec,
    run_heartbeat_bench,
)
from laminar_bench.placement import (
    DEFAULT_AGENT_POLL_SECONDS,
    DEFAULT_FAKE_GPUS,
    DEFAULT_GPU_MILLI,
    PROBE_CALL_MODES,
    WATCH_MODES,
    BenchSpec,
    run_bench,
)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``bench`` and its benchmarks to a ``laminar`` sub-command set."""
    bench = subparsers.add_parser("bench", help="live benchmarks of the real daemons on loopback")
    benchmarks = bench.add_subparsers(dest="bench_command", required=True)
    p = benchmarks.add_parser(
        "placement",
        help="placements per second and latency of a router with N agents",
        description=(
            "Start a zone router and N agents (fake GPUs) on loopback and place M jobs: "
            "by default two-phase probes that keep a lease (no process starts), with "
            "--launch real jobs running `true`. Reports, never fails on a number."
        ),
    )
    p.add_argument("--agents", type=int, required=True, help="N agents")
    p.add_argument("--jobs", type=int, required=True, help="M jobs")
    p.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="open-loop Poisson arrivals, jobs/s (default: burst)",
    )
    p.add_argument(
        "--launch", action="store_true", help="submit real jobs (`true`); each starts a process"
    )
    p.add_argument(
        "--watch",
        choices=WATCH_MODES,
        default="together",
        help="launch mode: follow each job in its SubmitAndWatch call (together, default) "
        "or with Submit and then WatchJob (separately: two calls per job)",
    )
    p.add_argument(
        "--submitters", type=int, default=32, help="concurrent submitters in a burst (default 32)"
    )
    p.add_argument(
        "--probe-calls",
        choices=PROBE_CALL_MODES,
        default="stream",
        help="placement mode: ProbeJob calls over ProbeJobs streams (stream, default; a router "
        "without them gets unary calls, and the report says so) or one unary call each",
    )
    p.add_argument(
        "--probe-streams",
        type=int,
        default=0,
        help="placement mode with streams: how many streams carry the calls (default 0: one "
        "per submitter, the cheapest for the router)",
    )
    p.add_argument(
        "--fake-gpus",
        default=DEFAULT_FAKE_GPUS,
        help=f"every agent's fake GPUs (default {DEFAULT_FAKE_GPUS})",
    )
    p.add_argument(
        "--gpu-milli",
        type=int,
        default=DEFAULT_GPU_MILLI,
        help=f"GPU share per job in 1/1000 (default {DEFAULT_GPU_MILLI}; 0 = one whole GPU)",
    )
    p.add_argument(
        "--agents-per-process",
        type=int,
        default=0,
        help="agents hosted per process (default: 1 up to 8 agents, else 32)",
    )
    _add_heartbeat_flag(p)
    p.add_argument(
        "--agent-poll-seconds",
        type=float,
        default=DEFAULT_AGENT_POLL_SECONDS,
        help=f"agents' Airlock poll period (default {DEFAULT_AGENT_POLL_SECONDS:g} s)",
    )
    p.add_argument(
        "--lease-ttl",
        type=float,
        default=2.0,
        help="placement mode: TTL of each kept lease in seconds (default 2)",
    )
    p.add_argument(
        "--timeout", type=float, default=300.0, help="measurement deadline in seconds (default 300)"
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the open-loop arrivals")
    p.add_argument(
        "--probes",
        type=int,
        default=0,
        help="the router's placement.probes_per_attempt, d (default: the router's; with 1 "
        "a launched job's probe carries the commit)",
    )
    _add_output_flags(p)
    p.set_defaults(func=cmd_placement)
    a = benchmarks.add_parser(
        "airlock",
        help="Airlock against an OOM-killer baseline: work lost, kills, reaction time",
        description=(
            "Run the same subjobs and the same GPU-memory pressure on two real agents (fake "
            "GPU), one with Airlock and one with the OOM-killer baseline (kill the largest "
            "process at 100%%). Reports, never fails on a number."
        ),
    )
    a.add_argument("--trials", type=int, default=10, help="injected-pressure trials (default 10)")
    a.add_argument(
        "--trace-dir",
        type=Path,
        help="Alibaba GenAI 2026 trace folder: also replay real pods' memory curves",
    )
    a.add_argument(
        "--genai-groups", type=int, default=3, help="sharing groups replayed (default 3)"
    )
    a.add_argument(
        "--poll-seconds",
        type=float,
        default=0.1,
        help="agents' Airlock poll period (default 0.1 s, the agent's default)",
    )
    _add_output_flags(a)
    a.set_defaults(func=cmd_airlock)
    h = benchmarks.add_parser(
        "heartbeats",
        help="an idle router's CPU for membership with N agents heartbeating",
        description=(
            "Start a zone router and N heartbeat-only agents (the agent's heartbeat client, "
            "multiplexed in pool processes) on loopback and read the router's CPU while "
            "nothing but heartbeats happens. Reports, never fails on a number."
        ),
    )
    h.add_argument("--agents", type=int, required=True, help="N agents")
    h.add_argument(
        "--seconds", type=float, default=20.0, help="measurement window in seconds (default 20)"
    )
    h.add_argument(
        "--agents-per-process",
        type=int,
        default=DEFAULT_AGENTS_PER_PROCESS,
        help=f"agents per pool process (default {DEFAULT_AGENTS_PER_PROCESS})",
    )
    h.add_argument(
        "--transport",
        choices=[*TRANSPORTS, "both"],
        default="both",
        help=(
            "stream: the Heartbeats stream; unary: one Heartbeat call per period; both "
            "(default): unary then stream, one after the other in this run"
        ),
    )
    _add_heartbeat_flag(h)
    _add_output_flags(h)
    h.set_defaults(func=cmd_heartbeats)
    s = benchmarks.add_parser(
        "submit",
        help="jobs/s a router takes into its durable queue: Submit against SubmitBatch",
        description=(
            "Start a zone router with no agents on loopback; send jobs one Submit each "
            "(baseline), then in SubmitBatch calls; report jobs/s and the router's CPU per "
            "job for both. Reports, never fails on a number."
        ),
    )
    s.add_argument("--jobs", type=int, default=10_000, help="jobs sent in batches (default 10000)")
    s.add_argument("--batch", type=int, default=500, help="jobs per SubmitBatch (default 500)")
    s.add_argument(
        "--single", type=int, default=500, help="jobs sent one Submit each (default 500)"
    )
    s.add_argument(
        "--cli-runs",
        type=int,
        default=20,
        help="`laminar submit` processes timed against `python -c pass` (default 20; 0: none)",
    )
    s.add_argument(
        "--instructions",
        action="store_true",
        help="also count the instructions of one run of each with valgrind (load-independent)",
    )
    _add_output_flags(s)
    s.set_defaults(func=cmd_submit)


def _add_heartbeat_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--heartbeat-seconds",
        type=float,
        default=0.0,
        help="heartbeat period the router asks for (default: the router's default)",
    )


def _add_output_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--work-dir", type=Path, help="keep state dirs and daemon logs here (default: temporary)"
    )
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table")


def cmd_placement(args: argparse.Namespace, console: Console) -> int:
    """Run ``bench placement`` and print a table or JSON."""
    spec = BenchSpec(
        agents=args.agents,
        jobs=args.jobs,
        rate=args.rate,
        launch=bool(args.launch),
        watch=args.watch,
        submitters=args.submitters,
        fake_gpus=args.fake_gpus,
        gpu_milli=args.gpu_milli,
        agents_per_process=args.agents_per_process,
        heartbeat_seconds=args.heartbeat_seconds,
        agent_poll_seconds=args.agent_poll_seconds,
        lease_ttl_seconds=args.lease_ttl,
        timeout_seconds=args.timeout,
        seed=args.seed,
        probes=args.probes,
        probe_calls=args.probe_calls,
        probe_streams=args.probe_streams,
        work_dir=args.work_dir,
    )
    spec.validate()
    report = _with_progress("bench placement", spec.agents, lambda p: run_bench(spec, p))
    return _emit(report, args.output, console, render)


def cmd_submit(args: argparse.Namespace, console: Console) -> int:
    from laminar_bench.submit import SubmitBenchSpec, run_submit_bench

    spec = SubmitBenchSpec(
        jobs=args.jobs,
        batch=args.batch,
        single=args.single,
        cli_runs=args.cli_runs,
        instructions=bool(args.instructions),
        work_dir=args.work_dir,
    )
    spec.validate()
    report = run_submit_bench(spec)
    if args.output == "json":
        print(json.dumps(report, indent=2))
        return 0
    table = Table(title=f"laminar bench submit ({report['cpus']} CPUs)")
    for column in ("call", "jobs", "jobs/s", "router CPU ms/job"):
        table.add_column(column)
    for name, row in (("Submit", report["submit"]), ("SubmitBatch", report["submit_batch"])):
        table.add_row(
            name,
            str(row["jobs"]),
            f"{row['jobs_per_second']:g}",
            f"{row['router_cpu_ms_per_job']:g}",
        )
    console.print(table)
    console.print(f"SubmitBatch / Submit: {report['batch_over_single']}x jobs/s")
    cli = report["cli"]
    if cli:
        labels = {
            "python_floor": "python -c pass",
            "library_floor": "python + grpc + messages",
            "submit": "laminar submit",
        }
        counts = cli.get("instructions") or {}
        for name, label in labels.items():
            row = cli[name]
            count = counts.get(name)
            console.print(
                f"{label}: wall {row['wall_ms_median']} ms median, {row['wall_ms_p90']} ms p90, "
                f"CPU {row['cpu_ms_median']} ms ({row['runs']} runs)"
                + (f", {count / 1e6:.0f} M instructions" if count else "")
            )
        console.print(f"laminar submit / python floor: {cli['submit_over_floor']}x wall")
    return 0


def render(report: dict[str, Any], console: Console) -> None:
    """The human summary: the figures, the baseline and what was measured."""
    console.print(
        f"[bold]bench placement[/bold]  mode {report['mode']}, {report['arrivals']}"
        + (
            f" at {report['rate']:g} jobs/s"
            if report["rate"]
            else f", {report['submitters']} submitters"
        )
        + f"; {report['agents']} agents in {report['agent_processes']} process(es) "
        f"(up to {report['agents_per_process']} per process); {report['jobs']} jobs",
        markup=True,
    )
    _print_environment(report, console)
    table = Table(show_header=True, header_style="bold")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("placed / jobs", f"{report['placed']} / {report['jobs']}"),
        ("jobs that queued", str(report["jobs_queued"])),
        ("placements per second", f"{report['placements_per_second']:.1f}"),
        ("latency p50 (ms)", f"{report['latency_p50_ms']:.2f}"),
        ("latency p90 (ms)", f"{report['latency_p90_ms']:.2f}"),
        ("latency p99 (ms)", f"{report['latency_p99_ms']:.2f}"),
        ("latency max (ms)", f"{report['latency_max_ms']:.2f}"),
    ]
    if report["observed_running_p50_ms"] is not None:
        rows.append(("client saw running, p50 (ms)", f"{report['observed_running_p50_ms']:.2f}"))
    rows += [
        ("calls to the router per job", f"{report['zone_calls_per_job']:.2f}"),
        ("probes per placement", f"{report['probes_per_placement']:.2f}"),
        ("bounces per placement", f"{report['bounces_per_placement']:.2f}"),
        (
            "router CPU per placement (ms)",
            f"{1000 * report['router_cpu_seconds_per_placement']:.3f}",
        ),
        (
            "router CPU per placement, net of idle (ms)",
            f"{1000 * report['router_cpu_seconds_per_placement_net_of_idle']:.3f}",
        ),
        ("router CPU when idle (ratio of a core)", f"{report['router_idle_cpu_ratio']:.3f}"),
        (
            "agents CPU per placement (ms)",
            f"{1000 * report['agents_cpu_seconds_per_placement']:.3f}",
        ),
        ("machine CPU busy during the run (ratio)", f"{report['machine_cpu_busy_ratio']:.2f}"),
        ("health check p50, baseline (ms)", f"{report['health_p50_ms']:.3f}"),
        ("latency p50 / health p50", f"{report['latency_p50_to_health_p50_ratio']:.1f}"),
        ("processes started", str(report["processes_started"])),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    console.print(f"latency: {report['latency_definition']}", highlight=False)
    console.print(f"probes: {report['probes_source']}", highlight=False)
    if report["errors"]:
        console.print(f"not placed: {'; '.join(report['errors'])}", highlight=False)


def cmd_airlock(args: argparse.Namespace, console: Console) -> int:
    """Run ``bench airlock`` and print a table or JSON."""
    spec = AirlockBenchSpec(
        trials=args.trials,
        trace_dir=args.trace_dir,
        genai_groups=args.genai_groups,
        poll_seconds=args.poll_seconds,
        work_dir=args.work_dir,
    )
    spec.validate()
    report = _with_progress("bench airlock", None, lambda p: run_airlock_bench(spec, p))
    return _emit(report, args.output, console, render_airlock)


def render_airlock(report: dict[str, Any], console: Console) -> None:
    console.print(
        f"[bold]bench airlock[/bold]  {report['trials']} injected-pressure trials"
        + (f", {len(report['genai_groups'])} GenAI replays" if report["genai_trace"] else "")
        + f" on {report['gpu']}, poll {report['poll_seconds']:g} s",
        markup=True,
    )
    _print_environment(report, console)
    table = Table(show_header=True, header_style="bold")
    table.add_column("scenario")
    table.add_column("policy")
    for column in ("killed (crit/prod/batch/opp)", "suspended", "high-prio lost GPU-s"):
        table.add_column(column, justify="right")
    table.add_column("all lost GPU-s", justify="right")
    table.add_column("reaction p50/p99 ms", justify="right")
    for policy, entry in report["policies"].items():
        for scenario, figures in entry.items():
            k = figures["killed_by_class"]
            reaction = (
                f"{figures['reaction_p50_ms']:.0f} / {figures['reaction_p99_ms']:.0f}"
                if figures["reaction_p50_ms"] is not None
                else "-"
            )
            table.add_row(
                scenario,
                policy,
                f"{figures['killed']} ({k['critical']}/{k['production']}/{k['batch']}/"
                f"{k['opportunistic']})",
                str(figures["suspended"]),
                f"{figures['high_priority_work_lost_gpu_seconds']:.2f}",
                f"{figures['all_work_lost_gpu_seconds']:.2f}",
                reaction,
            )
    console.print(table)
    console.print(f"reaction: {report['reaction_definition']}", highlight=False)
    console.print(f"work lost: {report['work_lost_definition']}", highlight=False)


def cmd_heartbeats(args: argparse.Namespace, console: Console) -> int:
    """Run ``bench heartbeats`` and print a table or JSON."""
    transports = TRANSPORTS[::-1] if args.transport == "both" else (args.transport,)
    specs = [
        HeartbeatBenchSpec(
            agents=args.agents,
            seconds=args.seconds,
            agents_per_process=args.agents_per_process,
            heartbeat_seconds=args.heartbeat_seconds,
            work_dir=args.work_dir / transport if args.work_dir else None,
            transport=transport,
        )
        for transport in transports
    ]
    for spec in specs:
        spec.validate()
    runs = [
        _with_progress(
            f"bench heartbeats ({spec.transport})",
            spec.agents,
            lambda p, spec=spec: run_heartbeat_bench(spec, p),  # type: ignore[misc]
        )
        for spec in specs
    ]
    report = runs[0] if len(runs) == 1 else {"benchmark": "heartbeats", "runs": runs}
    return _emit(report, args.output, console, render_heartbeats)


def render_heartbeats(report: dict[str, Any], console: Console) -> None:
    """The router's CPU for membership, per run (one per transport)."""
    for run in report.get("runs", [report]):
        _render_heartbeat_run(run, console)


def _render_heartbeat_run(report: dict[str, Any], console: Console) -> None:
    console.print(
        f"[bold]bench heartbeats ({report['transport']})[/bold]  {report['agents']} agents in "
        f"{report['agent_processes']} process(es), period {report['heartbeat_seconds']:g} s, "
        f"{report['measured_seconds']:.1f} s measured",
        markup=True,
    )
    _print_environment(report, console)
    table = Table(show_header=True, header_style="bold")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("router CPU (ratio of a core)", f"{report['router_cpu_ratio']:.3f}"),
        (
            "router CPU per agent per second (us)",
            f"{report['router_cpu_us_per_agent_second']:.1f}",
        ),
        ("router CPU per heartbeat (ms)", f"{report['router_cpu_ms_per_heartbeat']:.4f}"),
        ("router connections", f"{report['router_connections']}"),
        (
            "agents ready at start / end",
            f"{report['agents_ready_at_start']} / {report['agents_ready_at_end']}",
        ),
        ("heartbeats per second seen", f"{report['heartbeats_per_second']:.0f}"),
        ("heartbeats per second, nominal", f"{report['nominal_heartbeats_per_second']:.0f}"),
        ("heartbeats with a full summary", f"{report['heartbeats_with_summary']}"),
        (
            "router CPU at the nominal rate (ratio of a core)",
            f"{report['router_cpu_ratio_at_nominal_rate']:.3f}",
        ),
        ("agent pools CPU (ratio of a core)", f"{report['agents_cpu_ratio']:.3f}"),
        ("machine CPU busy (ratio)", f"{report['machine_cpu_busy_ratio']:.2f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    console.print(f"cpu: {report['cpu_definition']}", highlight=False)


def _print_environment(report: dict[str, Any], console: Console) -> None:
    env = report["environment"]
    console.print(
        f"{env['machine']}, {env['cores']} cores ({env['cpu_model'] or 'unknown CPU'}), "
        f"Python {env['python']}, grpcio {env['grpcio']}, {report['date']}",
        highlight=False,
    )


def _emit(
    report: dict[str, Any],
    output: str,
    console: Console,
    render_table: Callable[[dict[str, Any], Console], None],
) -> int:
    """Print the report as JSON or as the benchmark's table; the exit code (0)."""
    if output == "json":
        console.out(json.dumps(report, indent=2), highlight=False)
    else:
        render_table(report, console)
    return 0


def _with_progress(
    title: str,
    total: int | None,
    run: Callable[[Callable[[str, int, int], None]], dict[str, Any]],
) -> dict[str, Any]:
    """Run a benchmark with a progress bar it advances (``what, done, total``)."""
    progress = _progress(title)
    with progress:
        task = progress.add_task("starting", total=total)

        def advance(what: str, done: int, total: int) -> None:
            progress.update(task, description=what, completed=done, total=total)

        return run(advance)


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
