"""The `laminar` command. Errors print one readable line; exit code 2 for usage and bad input."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from rich.console import Console
from rich.table import Table

from cli.cluster import LocalCluster
from laminar_agent.errors import InvalidArgument, LaminarError
from laminar_agent.grpcutil import channel_options
from laminar_agent.units import format_size, parse_duration, parse_size
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2

DEMO_AGENTS = (
    "H100-80GB:mig=3g.40gb+2g.20gb+1g.10gb,2xH100-80GB",
    "2xA100-40GB",
    "A100-80GB:shared",
)


class UsageError(Exception):
    """Bad command-line input: one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse prints usage; we want one line and exit 2
        raise UsageError(message)


def _agent_stub(address: str) -> tuple[grpc.Channel, agent_pb2_grpc.AgentStub]:
    channel = grpc.insecure_channel(address, options=channel_options())
    return channel, agent_pb2_grpc.AgentStub(channel)


def inventory_table(inv: agent_pb2.Inventory) -> Table:
    table = Table(title=f"{inv.agent_id} ({inv.backend}{', draining' if inv.draining else ''})")
    for col in ("GPU", "model", "device", "memory used", "memory total", "mode"):
        table.add_column(col)
    for gpu in inv.gpus:
        mode = "MIG" if gpu.mig_enabled else ("shared" if gpu.shared else "whole")
        table.add_row(
            str(gpu.index),
            gpu.model,
            gpu.uuid,
            format_size(gpu.memory_used_bytes),
            format_size(gpu.memory_total_bytes),
            mode,
        )
        for mig in gpu.mig_instances:
            table.add_row(
                "",
                f"  {mig.profile}",
                mig.uuid,
                format_size(mig.memory_used_bytes),
                format_size(mig.memory_total_bytes),
                f"slots {mig.start}-{mig.start + mig.size - 1}",
            )
    return table


def cmd_inventory(args: argparse.Namespace, console: Console) -> int:
    channel, stub = _agent_stub(args.agent)
    with channel:
        inv = stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10)
    if args.output == "json":
        print(json_format.MessageToJson(inv))
    else:
        console.print(inventory_table(inv))
    return 0


def cmd_pressure(args: argparse.Namespace, console: Console) -> int:
    used = parse_size(args.used, field="--used")
    duration = parse_duration(args.for_, field="--for") if args.for_ else 0.0
    channel, stub = _agent_stub(args.agent)
    with channel:
        reply = stub.InjectLoad(
            agent_pb2.InjectLoadRequest(
                gpu_index=args.gpu,
                slice_id=args.slice or "",
                used_bytes=used,
                duration_seconds=duration,
            ),
            timeout=10,
        )
    console.print(f"injected {format_size(reply.injected_bytes)} on GPU {args.gpu}")
    return 0


DEMO_JOBS: tuple[tuple[str, common_pb2.Resources, float], ...] = (
    ("train-a", common_pb2.Resources(gpus=1), 1.5),
    ("train-b", common_pb2.Resources(gpus=2), 1.0),
    ("eval-mig", common_pb2.Resources(mig_profile="3g.40gb"), 1.0),
    ("notebook-mig", common_pb2.Resources(mig_profile="1g.10gb"), 0.5),
    ("share-1", common_pb2.Resources(gpu_milli=500, gpu_memory_bytes=20 * 1024**3), 1.0),
    ("share-2", common_pb2.Resources(gpu_milli=250, gpu_memory_bytes=10 * 1024**3), 1.0),
)


def _demo_command(name: str, seconds: float) -> list[str]:
    code = (
        "import os, time; "
        f"time.sleep({seconds}); "
        f"print('{name} ran on', os.environ.get('CUDA_VISIBLE_DEVICES', 'cpu'))"
    )
    return [sys.executable, "-c", code]


def _place_direct(
    stubs: Sequence[tuple[str, agent_pb2_grpc.AgentStub]],
    name: str,
    resources: common_pb2.Resources,
    seconds: float,
) -> tuple[str, common_pb2.Subjob] | None:
    """Ask each agent in turn to commit if it fits (until the zone router does placement)."""
    for agent_id, stub in stubs:
        reply = stub.Probe(
            agent_pb2.ProbeRequest(
                probe_id=f"demo-{name}",
                job_id=name,
                resources=resources,
                commit_if_fits=True,
                spec=common_pb2.SubjobSpec(
                    subjob_id=f"{name}-0", job_id=name, command=_demo_command(name, seconds)
                ),
            ),
            timeout=10,
        )
        if reply.WhichOneof("outcome") == "lease":
            return agent_id, reply.subjob
    return None


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """Start agents on simulated GPUs, run real processes on their slices, stop cleanly."""
    with tempfile.TemporaryDirectory(prefix="laminar-demo-") as tmp:
        root = Path(args.state_dir) if args.state_dir else Path(tmp)
        with LocalCluster(root) as cluster:
            for i, spec in enumerate(DEMO_AGENTS[: args.agents]):
                agent = cluster.start_agent(f"host-{i}", spec)
                console.print(f"started agent {agent.agent_id} on {agent.address} ({spec})")
            channels = [
                grpc.insecure_channel(a.address, options=channel_options()) for a in cluster.agents
            ]
            stubs = [
                (a.agent_id, agent_pb2_grpc.AgentStub(c))
                for a, c in zip(cluster.agents, channels, strict=True)
            ]
            try:
                first_id, first = stubs[0]
                first.InjectLoad(
                    agent_pb2.InjectLoadRequest(gpu_index=1, used_bytes=parse_size("30GiB")),
                    timeout=10,
                )
                console.print(f"injected 30.0GiB of simulated load on {first_id} GPU 1")
                placed: list[tuple[str, str, agent_pb2_grpc.AgentStub]] = []
                for name, resources, seconds in DEMO_JOBS:
                    where = _place_direct(stubs, name, resources, seconds)
                    if where is None:
                        console.print(
                            f"{name}: no agent has room now (the zone router will queue it)"
                        )
                        continue
                    agent_id, subjob = where
                    stub = dict(stubs)[agent_id]
                    placed.append((name, subjob.spec.subjob_id, stub))
                    console.print(
                        f"{name}: running on {agent_id} {','.join(subjob.slice_ids) or 'cpu'}"
                    )
                for _, stub in stubs:
                    console.print(
                        inventory_table(
                            stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10)
                        )
                    )
                table = Table(title="demo jobs")
                for col in ("job", "agent", "slices", "state", "exit", "run time", "output"):
                    table.add_column(col)
                for name, subjob_id, stub in placed:
                    final = _wait_terminal(stub, subjob_id)
                    out = stub.ReadLogs(agent_pb2.ReadLogsRequest(subjob_id=subjob_id), timeout=10)
                    table.add_row(
                        name,
                        final.agent_id,
                        ",".join(final.slice_ids),
                        common_pb2.SubjobState.Name(final.state).lower(),
                        str(final.exit_code),
                        f"{final.run_seconds:.1f}s",
                        out.data.decode(errors="replace").strip(),
                    )
                console.print(table)
            finally:
                for channel in channels:
                    channel.close()
            codes = cluster.stop()
        if any(code != 0 for code in codes):
            console.print(f"[red]agents exited with {codes}[/red]")
            return 1
        console.print(f"all {len(codes)} agents stopped cleanly")
    return 0


def _wait_terminal(stub: agent_pb2_grpc.AgentStub, subjob_id: str) -> common_pb2.Subjob:
    terminal = {common_pb2.SUCCEEDED, common_pb2.FAILED, common_pb2.KILLED, common_pb2.LOST}
    for event in stub.WatchSubjobs(agent_pb2.WatchSubjobsRequest(), timeout=60):
        if event.subjob.spec.subjob_id == subjob_id and event.subjob.state in terminal:
            break
    return stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id=subjob_id), timeout=10)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="laminar", description="Laminar GPU-cluster scheduler")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    demo = sub.add_parser("demo", help="run a local cluster on simulated GPUs")
    demo.add_argument(
        "--agents", type=int, default=len(DEMO_AGENTS), choices=range(1, len(DEMO_AGENTS) + 1)
    )
    demo.add_argument("--state-dir", help="keep state here instead of a temporary folder")
    inv = sub.add_parser("inventory", help="show one agent's GPUs and slices")
    inv.add_argument("--agent", required=True, help="agent HOST:PORT")
    inv.add_argument("-o", "--output", choices=["table", "json"], default="table")
    pressure = sub.add_parser("pressure", help="inject simulated GPU memory load (fake backend)")
    pressure.add_argument("--agent", required=True, help="agent HOST:PORT")
    pressure.add_argument("--gpu", type=int, required=True, help="GPU index")
    pressure.add_argument("--slice", help="MIG instance UUID")
    pressure.add_argument("--used", required=True, help="size, e.g. 30GiB")
    pressure.add_argument("--for", dest="for_", help="duration, e.g. 30s")
    return parser


COMMANDS = {"demo": cmd_demo, "inventory": cmd_inventory, "pressure": cmd_pressure}


def main(argv: Sequence[str] | None = None) -> int:
    console = Console()
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args, console)
    except UsageError as exc:
        print(f"laminar: {exc}", file=sys.stderr)
        return 2
    except InvalidArgument as exc:
        print(f"laminar: {exc.message}", file=sys.stderr)
        return 2
    except LaminarError as exc:
        print(f"laminar: {exc.message}", file=sys.stderr)
        return 1
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        print(f"laminar: {details} ({code.name if code else 'error'})", file=sys.stderr)
        return 2 if code == grpc.StatusCode.INVALID_ARGUMENT else 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
