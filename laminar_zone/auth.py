"""Submitter authentication: a table of per-tenant bearer tokens, stored only as SHA-256 hashes.

The table is pure data (no gRPC): the server's interceptor asks :meth:`TokenTable.authenticate`
for the caller and the servicer asks :func:`check_tenant_access` before touching a job. A bad
file raises :class:`ConfigError` naming the entry, so a SIGHUP reload can keep the old table.
Not covered here: router<->agent and peer trust (shared secret / mTLS).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import tomllib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from laminar_base.errors import ConfigError, PermissionDenied, Unauthenticated
from laminar_zone.limits import RateLimiter

TOKEN_PREFIX = "sha256:"
#: The tenant of a job that names none when the router authenticates nobody.
DEFAULT_TENANT = "default"
#: Where systemd puts a unit's LoadCredential= copies. It copies them only when the unit
#: starts (RefreshOnReload= needs systemd 260), so a SIGHUP rereads the copy, not the file
#: an admin edited: a token added or revoked there takes effect only at the next restart.
CREDENTIALS_ROOT = "/run/credentials/"


class Role(StrEnum):
    TENANT = "tenant"
    ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant name and its role."""

    tenant: str
    role: Role

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN


def hash_token(token: str) -> str:
    """The stored form of a token; tokens are random, so a plain SHA-256 needs no salt."""
    return TOKEN_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random bearer token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


class TokenTable:
    """Token hash -> principal; lookups compare hashes, never plaintext."""

    def __init__(self, entries: dict[str, Principal]) -> None:
        self._by_hash = dict(entries)

    def __len__(self) -> int:
        return len(self._by_hash)

    @classmethod
    def load(cls, path: Path) -> TokenTable:
        """Read a TOML file of ``[[token]]`` tables with ``tenant``, ``role`` and ``hash``."""
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"tokens file {path}: {exc}", field="auth.tokens_file") from exc
        rows = data.get("token", [])
        if not isinstance(rows, list):
            raise ConfigError(
                f"tokens file {path}: 'token' must be an array of tables", field="token"
            )
        entries: dict[str, Principal] = {}
        for i, row in enumerate(rows):
            where = f"token[{i}]"
            if not isinstance(row, dict):
                raise ConfigError(f"{where} must be a table", field=where)
            tenant = row.get("tenant")
            if not isinstance(tenant, str) or not tenant:
                raise ConfigError(
                    f"{where}.tenant must be a non-empty string", field=f"{where}.tenant"
                )
            try:
                role = Role(row.get("role", "tenant"))
            except ValueError as exc:
                raise ConfigError(
                    f"{where}.role must be tenant or admin", field=f"{where}.role"
                ) from exc
            digest = row.get("hash")
            if (
                not isinstance(digest, str)
                or not digest.startswith(TOKEN_PREFIX)
                or len(digest) != len(TOKEN_PREFIX) + 64
            ):
                raise ConfigError(
                    f"{where}.hash must be 'sha256:' + 64 hex digits (plaintext is refused)",
                    field=f"{where}.hash",
                )
            if digest in entries:
                raise ConfigError(f"{where}.hash repeats an earlier entry", field=f"{where}.hash")
            entries[digest] = Principal(tenant=tenant, role=role)
        if not entries:
            # An empty table would refuse every caller, the admin included.
            raise ConfigError(
                f"tokens file {path} has no [[token]] entry: it would lock every caller out",
                field="auth.tokens_file",
            )
        return cls(entries)

    def authenticate(self, token: str | None) -> Principal:
        """The caller behind a bearer token; UNAUTHENTICATED when missing or unknown."""
        if not token:
            raise Unauthenticated("missing bearer token (set LAMINAR_TOKEN)")
        digest = hash_token(token)
        for known, principal in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return principal
        raise Unauthenticated("unknown bearer token")


def credential_copy_warning(tokens_file: str) -> str | None:
    """What a reload of ``tokens_file`` cannot do when it is a systemd credential copy (the
    line the router logs at SIGHUP), or None for a file read in place."""
    if not tokens_file.startswith(CREDENTIALS_ROOT):
        return None
    return (
        f"auth.tokens_file {tokens_file} is systemd's LoadCredential= copy, made when the "
        "unit started: tokens added or revoked in the original since then are not seen "
        "until a restart (read /etc/laminar/tokens.toml in place: docs/ops.md)"
    )


def bearer_from_metadata(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str | None:
    """The token from an ``authorization: Bearer <token>`` header, if any."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def check_tenant_access(principal: Principal | None, job_tenant: str) -> None:
    """Refuse a tenant acting on another tenant's job; admins and auth-off (None) pass."""
    if principal is None or principal.is_admin:
        return
    if principal.tenant != job_tenant:
        raise PermissionDenied(f"tenant {principal.tenant!r} may not act on jobs of another tenant")


def require_admin(principal: Principal | None, action: str) -> None:
    """Refuse administrative actions (drain, pressure injection, all-tenant usage) to tenants."""
    if principal is not None and not principal.is_admin:
        raise PermissionDenied(
            f"{action} needs the admin role; caller is tenant {principal.tenant!r}"
        )


class Guard:
    """What the router's servicer asks before acting: who calls, and may they now.

    ``table`` is None when no tokens file is configured (every caller passes, as one
    anonymous principal ``None``). :meth:`reload` rereads the file and keeps the old
    table when the new one is bad, so a SIGHUP never locks everyone out.
    """

    def __init__(
        self,
        tokens_file: str,
        *,
        submit_limiter: RateLimiter,
        probe_limiter: RateLimiter,
        max_queued_per_tenant: int = 0,
    ) -> None:
        self.tokens_file = tokens_file
        self.table: TokenTable | None = TokenTable.load(Path(tokens_file)) if tokens_file else None
        self.submit_limiter = submit_limiter
        self.probe_limiter = probe_limiter
        self.max_queued_per_tenant = max_queued_per_tenant
        #: Set (and replaced) whenever the table changes: open streams recheck their caller.
        self._reloaded = asyncio.Event()
        #: Counts the table's replacements (a stream knows which table it checked against).
        self.generation = 0

    @property
    def enabled(self) -> bool:
        return self.table is not None

    def reload(self) -> tuple[bool, str]:
        """Reread the tokens file; (applied, a line for the log saying what happened). A
        broken or empty file is refused and the old table stays."""
        if not self.tokens_file:
            return False, "no auth.tokens_file configured; nothing to reload"
        try:
            table = TokenTable.load(Path(self.tokens_file))
        except ConfigError as exc:
            return False, f"tokens file not reloaded, the old table stays: {exc.message}"
        self.table = table
        self.generation += 1
        changed, self._reloaded = self._reloaded, asyncio.Event()
        changed.set()
        return True, f"tokens file reloaded: {len(table)} token(s)"

    async def wait_reloaded(self, since: int) -> int:
        """Return the table's generation once it is not ``since`` (at once if a reload
        came in between: a stream never misses one)."""
        while self.generation == since:
            await self._reloaded.wait()
        return self.generation

    def caller(self, metadata: tuple[tuple[str, str | bytes], ...] | None) -> Principal | None:
        """The authenticated caller, or None with auth off; UNAUTHENTICATED otherwise."""
        if self.table is None:
            return None
        return self.table.authenticate(bearer_from_metadata(metadata))

    def submit_tenant(self, principal: Principal | None, tenant: str) -> str:
        """The tenant a new job belongs to: the caller's; another one only for an admin;
        without authentication, the one named or :data:`DEFAULT_TENANT`."""
        if principal is None:
            return tenant or DEFAULT_TENANT
        if tenant and tenant != principal.tenant and not principal.is_admin:
            raise PermissionDenied(
                f"tenant {principal.tenant!r} may not submit for tenant {tenant!r}"
            )
        return tenant or principal.tenant


def open_guard() -> Guard:
    """No authentication and no limits (tests and embedded use)."""
    return Guard(
        "",
        submit_limiter=RateLimiter("Submit", 0.0, 1),
        probe_limiter=RateLimiter("ProbeJob", 0.0, 1),
    )
