"""`laminar usage`: GPU-hours per tenant and slice kind (showback), through a zone router.

The router restricts a tenant token to its own rows; an admin token (or a router
without auth) sees every tenant, or the one named with ``--tenant``.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import Any

from rich.console import Console

from laminar_api.v1 import zone_pb2
from laminar_base.errors import InvalidArgument
from laminar_base.units import parse_duration
from laminar_cli import render
from laminar_cli.zoneclient import RPC_TIMEOUT_SECONDS, output_options, zone_options, zone_stub


def parse_since(text: str | None, now_unix: float) -> float:
    """``--since``: a duration back from now (``7d``, ``12h``) or an ISO time; 0 for all time.

    An ISO time without an offset is read as UTC, so the same command means the
    same window on every host.
    """
    if text is None or not text.strip():
        return 0.0
    raw = text.strip()
    if raw[0].isdigit() and ("-" in raw or "T" in raw):
        try:
            at = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidArgument(
                f"cannot parse time {text!r} (try 2026-11-01 or 2026-11-01T08:00:00Z)",
                field="--since",
            ) from None
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        since = at.timestamp()
        if since > now_unix:
            raise InvalidArgument(f"{text!r} is in the future", field="--since")
        return since
    try:
        seconds = parse_duration(raw, field="--since")
    except InvalidArgument:
        raise InvalidArgument(
            f"cannot parse {text!r}: give a duration (7d, 12h, 30m) or an ISO time "
            "(2026-11-01T08:00:00Z)",
            field="--since",
        ) from None
    return max(0.0, now_unix - seconds)


def cmd_usage(args: argparse.Namespace, console: Console) -> int:
    now = time.time()
    since = parse_since(args.since, now)
    request = zone_pb2.GetUsageRequest(tenant=args.tenant or "", since_unix=since)
    with zone_stub(args.zone_address) as stub:
        reply = stub.GetUsage(request, timeout=RPC_TIMEOUT_SECONDS)
    if args.output == "json":
        print(render.to_json(reply))
    else:
        console.print(render.usage_table(list(reply.records), since, now))
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    usage = sub.add_parser(
        "usage",
        parents=[zone_options(), output_options()],
        help="GPU-hours per tenant and slice kind (showback)",
        description=(
            "GPU-hours, GPU-memory GiB-hours and work lost to Airlock, per tenant and slice "
            "kind, of subjobs that ended or still run. A tenant token sees only its own rows."
        ),
    )
    usage.add_argument("--tenant", help="only this tenant (a tenant token implies its own)")
    usage.add_argument(
        "--since",
        metavar="DURATION|TIME",
        help="from this long ago (7d, 12h) or this ISO time (UTC if no offset); default all",
    )
    usage.set_defaults(func=cmd_usage)
