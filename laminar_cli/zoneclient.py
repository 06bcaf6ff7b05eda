"""Talking to a zone router from the command line: where it is, one stub, shared options.

The router address comes from ``--zone`` or ``LAMINAR_ZONE`` (read once by
:func:`laminar_cli.main.main`), else :data:`DEFAULT_ZONE`. With TLS configured on the
daemons, ``--ca-file``/``--cert-file``/``--key-file`` (or the daemons' own
``LAMINAR_TLS_*`` variables) give the CLI its certificate; ``--secret-file`` (or
``LAMINAR_CONTROL_SHARED_SECRET_FILE``) the shared secret for calls to agents.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from laminar_api.v1 import zone_pb2, zone_pb2_grpc
from laminar_base.errors import InvalidArgument
from laminar_base.grpcutil import channel_options
from laminar_base.security import INSECURE, Trust
from laminar_base.settings import ControlSettings, TlsSettings

DEFAULT_ZONE = "127.0.0.1:7400"
ZONE_ENV = "LAMINAR_ZONE"
TOKEN_ENV = "LAMINAR_TOKEN"
TOKEN_FILE_ENV = "LAMINAR_TOKEN_FILE"
#: Caps how long a call safe to repeat is resent while the router is unavailable
#: (seconds; ``0`` fails at once). Unset: each call's own budget (:data:`RETRY_SECONDS`).
RETRY_ENV = "LAMINAR_RETRY_SECONDS"
#: Deadline of one unary call to the router.
RPC_TIMEOUT_SECONDS = 10.0


def resolve_zone_address(flag: str | None, env: Mapping[str, str]) -> str:
    return flag or env.get(ZONE_ENV, "").strip() or DEFAULT_ZONE


#: The bearer token every call carries, set once by :func:`laminar_cli.main.main` (None: no auth).
_token: str | None = None


def set_token(token: str | None) -> None:
    global _token
    _token = token


#: The cap on resending from ``LAMINAR_RETRY_SECONDS`` (None: each call's own budget).
_retry_cap: float | None = None


def resolve_retry_cap(env: Mapping[str, str]) -> float | None:
    """``LAMINAR_RETRY_SECONDS`` as seconds (InvalidArgument naming it when it is not a
    number >= 0); None when unset."""
    text = env.get(RETRY_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise InvalidArgument(f"{RETRY_ENV}={text!r}: expected seconds, a number >= 0")
    return value


def set_retry_cap(cap: float | None) -> None:
    global _retry_cap
    _retry_cap = cap


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


#: How the CLI authenticates to daemons (mTLS, shared secret), set once by :func:`laminar_cli.main.main`.
_trust: Trust = INSECURE


def set_trust(trust: Trust) -> None:
    global _trust
    _trust = trust


def current_trust() -> Trust:
    return _trust


#: Environment names of the CLI's security settings: the daemons' own config keys.
CA_FILE_ENV = "LAMINAR_TLS_CA_FILE"
CERT_FILE_ENV = "LAMINAR_TLS_CERT_FILE"
KEY_FILE_ENV = "LAMINAR_TLS_KEY_FILE"
SECRET_FILE_ENV = "LAMINAR_CONTROL_SHARED_SECRET_FILE"


def security_settings(
    args: argparse.Namespace, env: Mapping[str, str]
) -> tuple[TlsSettings, ControlSettings]:
    """``--ca-file``/``--cert-file``/``--key-file``/``--secret-file``, else the environment."""

    def pick(flag: str, name: str) -> str:
        value = getattr(args, flag, None)
        return str(value) if value else env.get(name, "").strip()

    tls = TlsSettings(
        ca_file=pick("ca_file", CA_FILE_ENV),
        cert_file=pick("cert_file", CERT_FILE_ENV),
        key_file=pick("key_file", KEY_FILE_ENV),
    )
    return tls, ControlSettings(shared_secret_file=pick("secret_file", SECRET_FILE_ENV))


def security_env(tls: TlsSettings, control: ControlSettings) -> dict[str, str]:
    """The same settings as environment for daemons the CLI starts (``laminar up``)."""
    pairs = (
        (CA_FILE_ENV, tls.ca_file),
        (CERT_FILE_ENV, tls.cert_file),
        (KEY_FILE_ENV, tls.key_file),
        (SECRET_FILE_ENV, control.shared_secret_file),
    )
    return {name: str(Path(value).resolve()) for name, value in pairs if value}


def agent_channel(address: str) -> grpc.Channel:
    """A channel to an agent, carrying the control credentials (mTLS and/or shared secret)."""
    return _trust.channel(address, channel_options())


#: How long a call that is safe to repeat keeps being resent while the router is
#: unavailable (restarting): reads and idempotent changes, and Submit, whose client request
#: id makes a resend return the same job. ProbeJob (leases), CommitJob, SubmitBatch and
#: InjectPressure are sent once.
RETRY_SECONDS = {
    "Submit": 30.0,
    **dict.fromkeys(
        (
            "GetJob",
            "ListJobs",
            "CancelJob",
            "GetLogs",
            "ListAgents",
            "DrainAgent",
            "UndrainAgent",
            "GetAgentAirlock",
            "GetUsage",
        ),
        15.0,
    ),
}
#: First pause between resends; it doubles up to :data:`MAX_RETRY_DELAY_SECONDS`.
FIRST_RETRY_DELAY_SECONDS = 0.2
MAX_RETRY_DELAY_SECONDS = 2.0


if TYPE_CHECKING:  # the stubs make it generic; at run time it is a plain class
    _UnaryInterceptor = grpc.UnaryUnaryClientInterceptor[Any, Any]
else:
    _UnaryInterceptor = grpc.UnaryUnaryClientInterceptor


class ResendWhileUnavailable(_UnaryInterceptor):
    """Resend a call of :data:`RETRY_SECONDS` with backoff while it fails UNAVAILABLE, for
    at most its budget (or ``cap``, when smaller); other outcomes, and other calls, pass at
    once. Before the first resend, ``notice(budget)`` says that it waits (once per call)."""

    def __init__(
        self,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        *,
        cap: float | None = None,
        notice: Callable[[float], None] = lambda budget: None,
    ) -> None:
        self._sleep = sleep
        self._clock = clock
        self._cap = cap
        self._notice = notice

    def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Any], grpc.CallFuture[Any]],
        client_call_details: grpc.ClientCallDetails,
        request: Any,
    ) -> grpc.CallFuture[Any]:
        budget = RETRY_SECONDS.get(str(client_call_details.method).rpartition("/")[2])
        if budget is None:
            return continuation(client_call_details, request)
        if self._cap is not None:
            budget = min(budget, self._cap)
        deadline = self._clock() + budget
        delay = FIRST_RETRY_DELAY_SECONDS
        noticed = False
        while True:
            outcome = continuation(client_call_details, request)
            if outcome.code() != grpc.StatusCode.UNAVAILABLE:
                return outcome
            if self._clock() + delay > deadline:
                return outcome
            if not noticed:
                noticed = True
                self._notice(budget)
            self._sleep(delay)  # backoff between resends to a router that is not answering
            delay = min(2 * delay, MAX_RETRY_DELAY_SECONDS)


@contextlib.contextmanager
def zone_stub(address: str) -> Iterator[zone_pb2_grpc.ZoneStub]:
    """The submitter API: TLS when configured and the bearer token; never the shared secret.
    Calls safe to repeat are resent while the router is unavailable (:data:`RETRY_SECONDS`)."""
    bearer = (("authorization", f"Bearer {_token}"),) if _token else ()
    transport = dataclasses.replace(_trust, secret=None)
    with transport.channel(address, channel_options(), extra_headers=bearer) as channel:
        resending = grpc.intercept_channel(
            channel,
            ResendWhileUnavailable(cap=_retry_cap, notice=functools.partial(_say_waiting, address)),
        )
        yield zone_pb2_grpc.ZoneStub(resending)


def one_line(text: str) -> str:
    """``text`` on one line (error details from gRPC may hold newlines)."""
    return " ".join(str(text).split())


def _say_waiting(address: str, budget: float) -> None:
    """One line on stderr while a call waits for a router that does not answer, so a
    submitter knows why nothing happens (stdout stays the command's output)."""
    print(
        f"laminar: router at {address} is unavailable; retrying for up to {budget:g} s "
        f"(Ctrl-C stops; {RETRY_ENV}=0 fails at once)",
        file=sys.stderr,
        flush=True,
    )


def list_jobs(
    stub: zone_pb2_grpc.ZoneStub, request: zone_pb2.ListJobsRequest, wanted: int
) -> list[zone_pb2.Job]:
    """Up to ``wanted`` jobs matching ``request``, following the router's page tokens.

    Each reply stays under the gRPC message limit (the router cuts pages by size), so a
    listing of any length arrives in several calls; ``request`` is not changed."""
    page_request = zone_pb2.ListJobsRequest()
    page_request.CopyFrom(request)
    page_request.limit = wanted
    jobs: list[zone_pb2.Job] = []
    while len(jobs) < wanted:
        page = stub.ListJobs(page_request, timeout=RPC_TIMEOUT_SECONDS)
        jobs.extend(page.jobs[: wanted - len(jobs)])
        if not page.next_page_token:
            break
        page_request.page_token = page.next_page_token
        page_request.limit = wanted - len(jobs)
    return jobs


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
        choices=["table", "wide", "json"],
        default="table",
        help="human table (default; cut to the terminal), wide (every column, full text) "
        "or protobuf JSON",
    )
    return parent
