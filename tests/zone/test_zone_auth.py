"""Token table and access checks (pure part of submitter auth; the server wiring is still to come)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from laminar_base.errors import ConfigError, PermissionDenied, Unauthenticated
from laminar_zone.auth import (
    Guard,
    Principal,
    Role,
    TokenTable,
    bearer_from_metadata,
    check_tenant_access,
    credential_copy_warning,
    hash_token,
    new_token,
    require_admin,
)
from laminar_zone.limits import RateLimiter


def write_tokens(path: Path, rows: list[tuple[str, str, str]]) -> None:
    body = "".join(f'[[token]]\ntenant = "{t}"\nrole = "{r}"\nhash = "{h}"\n\n' for t, r, h in rows)
    path.write_text(body)


def test_known_token_maps_to_its_tenant_and_others_are_refused(tmp_path: Path) -> None:
    alice, root = new_token(), new_token()
    path = tmp_path / "tokens.toml"
    write_tokens(path, [("alice", "tenant", hash_token(alice)), ("ops", "admin", hash_token(root))])
    table = TokenTable.load(path)
    assert alice not in path.read_text()
    assert table.authenticate(alice) == Principal("alice", Role.TENANT)
    assert table.authenticate(root).is_admin
    with pytest.raises(Unauthenticated):
        table.authenticate("wrong")
    with pytest.raises(Unauthenticated):
        table.authenticate(None)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('[[token]]\ntenant = "a"\nhash = "plaintext"\n', "token[0].hash"),
        ('[[token]]\ntenant = ""\nhash = "sha256:' + "0" * 64 + '"\n', "token[0].tenant"),
        (
            '[[token]]\ntenant = "a"\nrole = "root"\nhash = "sha256:' + "0" * 64 + '"\n',
            "token[0].role",
        ),
        ("not toml [", "auth.tokens_file"),
    ],
)
def test_bad_tokens_file_names_the_field(tmp_path: Path, body: str, field: str) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        TokenTable.load(path)
    assert info.value.field == field


def test_access_rules() -> None:
    alice = Principal("alice", Role.TENANT)
    admin = Principal("ops", Role.ADMIN)
    check_tenant_access(alice, "alice")
    check_tenant_access(admin, "bob")
    check_tenant_access(None, "bob")
    with pytest.raises(PermissionDenied):
        check_tenant_access(alice, "bob")
    require_admin(admin, "drain")
    with pytest.raises(PermissionDenied):
        require_admin(alice, "drain")


def test_bearer_header_parsing() -> None:
    assert bearer_from_metadata((("authorization", "Bearer abc"),)) == "abc"
    assert bearer_from_metadata((("authorization", b"bearer xyz"),)) == "xyz"
    assert bearer_from_metadata((("authorization", "Basic abc"),)) is None
    assert bearer_from_metadata(None) is None


async def test_a_stream_that_starts_waiting_after_a_reload_still_sees_it(tmp_path: Path) -> None:
    """A stream checks its caller, then waits for the next reload: one that lands between
    the two (a SIGHUP as the stream opens) is not missed (the old wait, on the event of the
    moment, missed it, and a revoked token's stream stayed open)."""
    path = tmp_path / "tokens.toml"
    write_tokens(path, [("alice", "tenant", hash_token(new_token()))])
    guard = Guard(
        str(path),
        submit_limiter=RateLimiter("Submit", 0.0, 1),
        probe_limiter=RateLimiter("ProbeJob", 0.0, 1),
    )
    checked_against = guard.generation
    write_tokens(path, [("bob", "tenant", hash_token(new_token()))])
    assert guard.reload()[0]
    waiting = asyncio.ensure_future(guard.wait_reloaded(checked_against))
    await asyncio.sleep(0)  # one turn of the loop: it returns without waiting
    assert waiting.done() and waiting.result() == checked_against + 1
    again = asyncio.ensure_future(guard.wait_reloaded(waiting.result()))
    await asyncio.sleep(0)
    assert not again.done()  # nothing new: it waits for the next reload
    assert guard.reload()[0]
    assert await again == checked_against + 2


def test_a_tokens_file_that_is_a_systemd_credential_copy_is_named_at_reload() -> None:
    """systemd copies a LoadCredential= file only at start: a SIGHUP that rereads the copy
    keeps a revoked token working, so the router says so instead of only counting tokens.
    A file read in place (the shipped unit's /etc/laminar/tokens.toml) gets no warning."""
    copy = "/run/credentials/laminar-zone.service/tokens.toml"
    warning = credential_copy_warning(copy)
    assert warning is not None and copy in warning and "restart" in warning
    assert credential_copy_warning("/etc/laminar/tokens.toml") is None
    assert credential_copy_warning("") is None
