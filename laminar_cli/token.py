"""`laminar token new`: a submitter token and the line the router's tokens file needs.

The token is printed once, on stdout, for the person it is for; the tokens file holds
only its SHA-256 (a plaintext token there is refused at start). Offline: it talks to no
daemon.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from rich.console import Console

from laminar_base.errors import InvalidArgument
from laminar_zone.auth import hash_token, new_token

_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def cmd_token_new(args: argparse.Namespace, console: Console) -> int:
    if not _TENANT.fullmatch(args.tenant or ""):
        raise InvalidArgument("must be 1-64 of [A-Za-z0-9._-]", field="--tenant")
    token = new_token()
    print(token)
    print(
        f"# append to auth.tokens_file, then reload the router (SIGHUP):\n"
        f'[[token]]\ntenant = "{args.tenant}"\nrole = "{args.role}"\nhash = "{hash_token(token)}"'
    )
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    token = sub.add_parser("token", help="submitter tokens for the router's tokens file")
    token_sub = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    new = token_sub.add_parser(
        "new", help="print a new token (once) and its [[token]] line for auth.tokens_file"
    )
    new.add_argument("--tenant", required=True, help="whose token it is")
    new.add_argument("--role", choices=["tenant", "admin"], default="tenant")
    new.set_defaults(func=cmd_token_new, is_offline=True)
