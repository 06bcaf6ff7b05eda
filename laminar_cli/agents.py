"""Host commands: agents, drain, undrain, airlock, pressure (through a router) and inventory.

``inventory`` and ``pressure --agent`` talk to one agent directly (they predate
the router and stay useful on a single host); everything else goes through the
zone router, which names hosts by agent id, hostname or address.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, zone_pb2
from laminar_base.errors import InvalidArgument
from laminar_base.units import format_size, parse_duration, parse_size
from laminar_cli import render
from laminar_cli.zoneclient import (
    RPC_TIMEOUT_SECONDS,
    agent_channel,
    output_options,
    zone_options,
    zone_stub,
)


def _agent_stub(address: str) -> tuple[grpc.Channel, agent_pb2_grpc.AgentStub]:
    channel = agent_channel(address)
    return channel, agent_pb2_grpc.AgentStub(channel)


def inventory_table(inv: agent_pb2.Inventory) -> Table:
    inv = render.printable(inv)
    table = Table(title=f"{inv.agent_id} ({inv.backend}{', draining' if inv.draining else ''})")
    for col in ("GPU", "model", "device", "memory used", "memory total", "mode"):
        table.add_column(col)
    held = {d.index: d for d in inv.degraded_gpus}
    for gpu in inv.gpus:
        mode = "MIG" if gpu.mig_enabled else ("shared" if gpu.shared else "whole")
        if gpu.index in held:
            down = held[gpu.index]
            mode += f"; {'failed' if down.failed else 'degraded'}: {down.reason}"
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
        inv = stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=RPC_TIMEOUT_SECONDS)
    if args.output == "json":
        print(render.to_json(inv))
    else:
        console.print(inventory_table(inv))
    return 0


def cmd_agents(args: argparse.Namespace, console: Console) -> int:
    with zone_stub(args.zone_address) as stub:
        reply = stub.ListAgents(zone_pb2.ListAgentsRequest(), timeout=RPC_TIMEOUT_SECONDS)
    if args.output == "json":
        print(render.to_json(reply))
    else:
        console.print(render.agents_table(list(reply.agents), time.time()))
    return 0


def _drain(args: argparse.Namespace, console: Console, *, drain: bool) -> int:
    request = zone_pb2.DrainAgentRequest(agent=args.host, reason=args.reason or "")
    with zone_stub(args.zone_address) as stub:
        call = stub.DrainAgent if drain else stub.UndrainAgent
        info = call(request, timeout=RPC_TIMEOUT_SECONDS)
    if args.output == "json":
        print(render.to_json(info))
    else:
        state = zone_pb2.AgentState.Name(info.state).removeprefix("AGENT_").lower()
        verb = "draining: takes no new work" if drain else "undrained: takes new work"
        console.print(
            f"{info.agent_id} ({info.address}) {verb}; state {state}, "
            f"{info.summary.running_subjobs} subjob(s) running",
            highlight=False,
        )
    return 0


def cmd_drain(args: argparse.Namespace, console: Console) -> int:
    return _drain(args, console, drain=True)


def cmd_undrain(args: argparse.Namespace, console: Console) -> int:
    return _drain(args, console, drain=False)


def cmd_airlock(args: argparse.Namespace, console: Console) -> int:
    if not 0 <= args.max_actions <= 10000:
        raise InvalidArgument("must be between 0 and 10000", field="--max-actions")
    with zone_stub(args.zone_address) as stub:
        state = stub.GetAgentAirlock(
            zone_pb2.GetAgentAirlockRequest(agent=args.host, max_actions=args.max_actions),
            timeout=RPC_TIMEOUT_SECONDS,
        )
    if args.output == "json":
        print(render.to_json(state))
    else:
        console.print(render.airlock_view(args.host, state, time.time()))
    return 0


def cmd_pressure(args: argparse.Namespace, console: Console) -> int:
    used = parse_size(args.used, field="--used")
    duration = parse_duration(args.for_, field="--for") if args.for_ else 0.0
    load = agent_pb2.InjectLoadRequest(
        gpu_index=args.gpu, slice_id=args.slice or "", used_bytes=used, duration_seconds=duration
    )
    if args.agent:
        if args.host:
            raise InvalidArgument(
                "give HOST (through the router) or --agent, not both", field="HOST"
            )
        channel, stub = _agent_stub(args.agent)
        with channel:
            reply = stub.InjectLoad(load, timeout=RPC_TIMEOUT_SECONDS)
        where = args.agent
    else:
        if not args.host:
            raise InvalidArgument(
                "name the host (agent id, through the zone router) or use --agent HOST:PORT",
                field="HOST",
            )
        with zone_stub(args.zone_address) as zone:
            reply = zone.InjectPressure(
                zone_pb2.InjectPressureRequest(agent=args.host, load=load),
                timeout=RPC_TIMEOUT_SECONDS,
            )
        where = args.host
    target = f"GPU {args.gpu}" + (f" slice {args.slice}" if args.slice else "")
    until = f" for {render.span(duration)}" if duration else ""
    console.print(
        f"injected {format_size(reply.injected_bytes)} on {where} {target}{until}", highlight=False
    )
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    zone, output = zone_options(), output_options()
    agents = sub.add_parser("agents", parents=[zone, output], help="list the router's agents")
    agents.set_defaults(func=cmd_agents)

    for name, func, text in (
        ("drain", cmd_drain, "stop placing new work on a host (running work continues)"),
        ("undrain", cmd_undrain, "let a drained host take new work again"),
    ):
        parser = sub.add_parser(name, parents=[zone, output], help=text)
        parser.add_argument("host", metavar="HOST", help="agent id, hostname or address")
        parser.add_argument("--reason")
        parser.set_defaults(func=func)

    airlock = sub.add_parser(
        "airlock",
        parents=[zone, output],
        help="a host's Airlock state: pressure per slice, suspended subjobs, recent actions",
    )
    airlock.add_argument("host", metavar="HOST", help="agent id, hostname or address")
    airlock.add_argument("--max-actions", type=int, default=20, metavar="N")
    airlock.set_defaults(func=cmd_airlock)

    inv = sub.add_parser("inventory", parents=[output], help="show one agent's GPUs and slices")
    inv.add_argument("--agent", required=True, help="agent HOST:PORT")
    inv.set_defaults(func=cmd_inventory)

    pressure = sub.add_parser(
        "pressure",
        parents=[zone],
        help="inject simulated GPU memory load (fake backend) on HOST or --agent HOST:PORT",
    )
    pressure.add_argument("host", nargs="?", metavar="HOST", help="agent id (through the router)")
    pressure.add_argument("--agent", help="agent HOST:PORT, bypassing the router")
    pressure.add_argument("--gpu", type=int, required=True, help="GPU index")
    pressure.add_argument("--slice", help="MIG instance UUID or slice id")
    pressure.add_argument("--used", required=True, help="size, e.g. 30GiB")
    pressure.add_argument("--for", dest="for_", metavar="DURATION", help="e.g. 30s")
    pressure.set_defaults(func=cmd_pressure)
