"""The `laminar` command.

Every command is a leaf parser with ``set_defaults(func=handler)``, where
``handler(args, console) -> int``; :func:`main` dispatches to it. Errors print
one readable line on stderr. Exit codes: 0 success; 1 failure (including a
watched job that failed or was cancelled); 2 usage or invalid input (ours or
INVALID_ARGUMENT from the router); 3 the router or agent cannot be reached;
130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import grpc

from laminar_base.errors import InvalidArgument, LaminarError
from laminar_base.security import load_trust
from laminar_cli.zoneclient import (
    CA_FILE_ENV,
    CERT_FILE_ENV,
    DEFAULT_ZONE,
    KEY_FILE_ENV,
    SECRET_FILE_ENV,
    ZONE_ENV,
    one_line,
    resolve_retry_cap,
    resolve_token,
    resolve_zone_address,
    security_env,
    security_settings,
    set_retry_cap,
    set_token,
    set_trust,
)

if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130
#: Table width when stdout is not a terminal (tables only take the width they need).
PIPE_WIDTH = 240
#: Usage errors from the router side map to exit code 2 like our own.
_USAGE_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT})
_UNREACHABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class UsageError(Exception):
    """Bad command-line input: one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse prints usage; we want one line and exit 2
        raise UsageError(message)


def _register_plugins(sub: argparse._SubParsersAction[Any]) -> None:
    """Commands from packages that may not be installed (the simulator's ``sim``, ``bench``)."""
    for package in ("laminar_sim", "laminar_bench"):
        if importlib.util.find_spec(package) is None:
            continue
        if importlib.util.find_spec(f"{package}.cli") is None:
            continue
        module = importlib.import_module(f"{package}.cli")
        register = getattr(module, "register", None)
        if callable(register):
            register(sub)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; with ``command``, only that command's module is imported."""
    parser = _Parser(
        prog="laminar",
        description="Laminar GPU-cluster scheduler: submit and follow jobs, run a local cluster.",
        epilog="exit codes: 0 ok, 1 failed, 2 bad input, 3 router unreachable, 130 interrupted",
    )
    parser.add_argument(
        "--zone",
        default=None,
        metavar="HOST:PORT",
        help=f"zone router address (default ${ZONE_ENV} or {DEFAULT_ZONE})",
    )
    for flag, env_name, text in (
        ("--ca-file", CA_FILE_ENV, "PEM CA of the daemons' certificates (TLS)"),
        ("--cert-file", CERT_FILE_ENV, "PEM client certificate signed by that CA"),
        ("--key-file", KEY_FILE_ENV, "PEM key of --cert-file"),
        ("--secret-file", SECRET_FILE_ENV, "shared secret for calls straight to agents"),
    ):
        parser.add_argument(flag, metavar="FILE", help=f"{text} (default ${env_name})")
    sub = parser.add_subparsers(
        dest="subcommand", metavar="COMMAND", required=True, parser_class=_Parser
    )
    if command in COMMAND_MODULES:  # only what this command needs: start-up time
        importlib.import_module(COMMAND_MODULES[command]).register(sub)
        return parser
    for module in dict.fromkeys(COMMAND_MODULES.values()):
        importlib.import_module(module).register(sub)
    _register_plugins(sub)
    return parser


#: The module that registers each command: `laminar CMD` imports that one alone, so a
#: submit does not pay for certificates, the simulator or the local-cluster code.
COMMAND_MODULES = {
    **dict.fromkeys(
        ("submit", "jobs", "job", "cancel", "logs", "watch", "probe"), "laminar_cli.jobs"
    ),
    **dict.fromkeys(
        ("agents", "drain", "undrain", "airlock", "inventory", "pressure"), "laminar_cli.agents"
    ),
    "usage": "laminar_cli.usage",
    "up": "laminar_cli.up",
    "demo": "laminar_cli.demo",
    "certs": "laminar_cli.certs",
    "token": "laminar_cli.token",
    "completion": "laminar_cli.completion",
}
#: Global options that take a value (skipped when looking for the command).
_VALUE_OPTIONS = ("--zone", "--ca-file", "--cert-file", "--key-file", "--secret-file")


def command_of(argv: Sequence[str]) -> str | None:
    """The command word of ``argv`` (after the global options), or None."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word in _VALUE_OPTIONS:
            skip = True
        elif not word.startswith("-"):
            return word
    return None


class _LazyConsole:
    """The rich console, made when a command first prints through it: commands that print
    a line (``submit`` prints the job id) never import rich, a sixth of their start-up."""

    def __init__(self, columns_set: bool) -> None:
        self._columns_set = columns_set
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            console = Console(markup=False, highlight=False)
            if not console.is_terminal and not self._columns_set:
                console.width = PIPE_WIDTH  # piped or captured: do not squeeze tables
            self._console = console
        return getattr(self._console, name)


def main(argv: Sequence[str] | None = None) -> int:
    env = dict(os.environ)  # read once; nothing below looks at the environment again
    console = cast("Console", _LazyConsole("COLUMNS" in env))
    address = DEFAULT_ZONE
    try:
        words = list(sys.argv[1:] if argv is None else argv)
        args = build_parser(command_of(words)).parse_args(words)
        set_token(resolve_token(env))
        set_retry_cap(resolve_retry_cap(env))
        if not getattr(args, "is_offline", False):  # certs init may create the files named
            tls, control = security_settings(args, env)
            set_trust(load_trust(tls, control))
            args.security_env = security_env(tls, control)
        address = resolve_zone_address(getattr(args, "zone", None), env)
        args.zone_address = address
        address = getattr(args, "agent", None) or address  # commands that bypass the router
        code: int = args.func(args, console)
        return code
    except UsageError as exc:
        print(f"laminar: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except InvalidArgument as exc:
        print(f"laminar: {one_line(exc.message)}", file=sys.stderr)
        return EXIT_USAGE
    except LaminarError as exc:
        print(f"laminar: {one_line(exc.message)}", file=sys.stderr)
        return EXIT_FAILURE
    except grpc.RpcError as exc:
        code_enum = exc.code() if hasattr(exc, "code") else None
        details = one_line((exc.details() if hasattr(exc, "details") else None) or str(exc))
        name = code_enum.name if code_enum is not None else "ERROR"
        if code_enum in _UNREACHABLE_CODES and "handshake" in details.lower():
            print(
                f"laminar: TLS handshake with {address} failed; check --ca-file, --cert-file "
                f"and --key-file (or LAMINAR_TLS_*) against the daemon's [tls] ({details})",
                file=sys.stderr,
            )
            return EXIT_UNREACHABLE
        if code_enum in _UNREACHABLE_CODES and "connect" in details.lower():
            print(
                f"laminar: cannot reach {address} ({details}); is a router running there? "
                f"`laminar up` starts a local one",
                file=sys.stderr,
            )
            return EXIT_UNREACHABLE
        print(f"laminar: {details} ({name})", file=sys.stderr)
        if code_enum in _USAGE_CODES:
            return EXIT_USAGE
        return EXIT_UNREACHABLE if code_enum in _UNREACHABLE_CODES else EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `laminar jobs | head`
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
