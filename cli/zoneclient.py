"""Talking to a zone router from the command line: where it is, one stub, shared options.

The router address comes from ``--zone`` or ``LAMINAR_ZONE`` (read once by
:func:`cli.main.main`), else :data:`DEFAULT_ZONE`.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Mapping

import grpc

from laminar_agent.grpcutil import channel_options
from laminar_api.v1 import zone_pb2_grpc

DEFAULT_ZONE = "127.0.0.1:7400"
ZONE_ENV = "LAMINAR_ZONE"
#: Deadline of one unary call to the router.
RPC_TIMEOUT_SECONDS = 10.0


def resolve_zone_address(flag: str | None, env: Mapping[str, str]) -> str:
    return flag or env.get(ZONE_ENV, "").strip() or DEFAULT_ZONE


@contextlib.contextmanager
def zone_stub(address: str) -> Iterator[zone_pb2_grpc.ZoneStub]:
    with grpc.insecure_channel(address, options=channel_options()) as channel:
        yield zone_pb2_grpc.ZoneStub(channel)


def zone_options() -> argparse.ArgumentParser:
    """``--zone`` on every command that talks to a router (also accepted before the command)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--zone",
        default=argparse.SUPPRESS,
        metavar="HOST:PORT",
        help=f"zone router address (default ${ZONE_ENV} or {DEFAULT_ZONE})",
    )
    return parent


def output_options() -> argparse.ArgumentParser:
    """``-o table|json`` on every read command."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "-o",
        "--output",
        choices=["table", "json"],
        default="table",
        help="human table (default) or protobuf JSON",
    )
    return parent
