"""Talking to a zone router from the command line: where it is, one stub, shared options.

The router address comes from ``--zone`` or ``LAMINAR_ZONE`` (read once by
:func:`cli.main.main`), else :data:`DEFAULT_ZONE`.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from laminar_agent.errors import InvalidArgument
from laminar_agent.grpcutil import channel_options
from laminar_api.v1 import zone_pb2_grpc

DEFAULT_ZONE = "127.0.0.1:7400"
ZONE_ENV = "LAMINAR_ZONE"
TOKEN_ENV = "LAMINAR_TOKEN"
TOKEN_FILE_ENV = "LAMINAR_TOKEN_FILE"
#: Deadline of one unary call to the router.
RPC_TIMEOUT_SECONDS = 10.0


def resolve_zone_address(flag: str | None, env: Mapping[str, str]) -> str:
    return flag or env.get(ZONE_ENV, "").strip() or DEFAULT_ZONE


#: The bearer token every call carries, set once by :func:`cli.main.main` (None: no auth).
_token: str | None = None


def set_token(token: str | None) -> None:
    global _token
    _token = token


def resolve_token(env: Mapping[str, str]) -> str | None:
    """``LAMINAR_TOKEN``, else the file ``LAMINAR_TOKEN_FILE`` or ~/.config/laminar/token.

    A token file readable by group or others is refused (InvalidArgument): a leaked
    token acts as its tenant.
    """
    token = env.get(TOKEN_ENV, "").strip()
    if token:
        return token
    named = env.get(TOKEN_FILE_ENV, "").strip()
    home = env.get("HOME", "")
    path = (
        Path(named) if named else (Path(home) / ".config" / "laminar" / "token" if home else None)
    )
    if path is None or not path.is_file():
        if named:
            raise InvalidArgument(f"token file {path} does not exist", field=TOKEN_FILE_ENV)
        return None
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise InvalidArgument(
            f"token file {path} is readable by others (mode {mode:03o}); run chmod 600 {path}",
            field=TOKEN_FILE_ENV,
        )
    return path.read_text().strip() or None


if TYPE_CHECKING:  # the stubs make these generic; at run time they are plain classes
    _UnaryBase = grpc.UnaryUnaryClientInterceptor[Any, Any]
    _StreamBase = grpc.UnaryStreamClientInterceptor[Any, Any]
else:
    _UnaryBase = grpc.UnaryUnaryClientInterceptor
    _StreamBase = grpc.UnaryStreamClientInterceptor


class _BearerAuth(_UnaryBase, _StreamBase):
    """Adds ``authorization: Bearer <token>`` to every call."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: Any) -> Any:
        metadata = [*(details.metadata or []), self._header]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


@contextlib.contextmanager
def zone_stub(address: str) -> Iterator[zone_pb2_grpc.ZoneStub]:
    with grpc.insecure_channel(address, options=channel_options()) as channel:
        if _token:
            yield zone_pb2_grpc.ZoneStub(grpc.intercept_channel(channel, _BearerAuth(_token)))
        else:
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
