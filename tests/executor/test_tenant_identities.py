"""Tenant -> uid assignment (executor.uid_pool, executor.tenant_users) over the real journal.

A tenant keeps its uid of the pool for good, journaled, so an agent that restarts never
hands a uid still held by a live tenant's subjobs to another tenant (which could then
signal them or read their /proc/PID/environ). No root needed: assignment is bookkeeping;
the privilege drop itself is exercised in tests/security/test_privilege.py.
"""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from laminar_agent.config import parse_uid_pool
from laminar_agent.executor import RunAs, TenantIdentities
from laminar_agent.journal import Journal
from laminar_base.errors import ConfigError, InvalidArgument

NOBODY = RunAs("nobody", 65534, 65534, (65534,), "/")


def _free_uids(first: int, count: int) -> list[int]:
    """``count`` uids from ``first`` up that this host's passwd does not know."""
    found: list[int] = []
    uid = first
    while len(found) < count:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            found.append(uid)
        uid += 1
    return found


def test_a_restarted_agent_never_gives_a_live_tenants_uid_to_another(tmp_path: Path) -> None:
    first, second = _free_uids(61000, 2)
    pool = range(first, second + 1)
    journal = Journal(tmp_path)
    before = TenantIdentities(NOBODY, pool=pool, store=journal)
    alice = before.for_tenant("alice")
    assert alice is not None and alice.uid in pool and alice.uid != NOBODY.uid
    assert alice.gid == alice.uid and alice.groups == (alice.uid,)
    journal.close()  # the agent dies; its successor reads the same journal

    journal = Journal(tmp_path)
    after = TenantIdentities(NOBODY, pool=pool, store=journal)
    bob = after.for_tenant("bob")
    again = after.for_tenant("alice")
    assert again is not None and again.uid == alice.uid  # same uid across the restart
    assert bob is not None and bob.uid in pool and bob.uid != alice.uid
    # The pool is now full: a third tenant is refused naming the field, never doubled up.
    with pytest.raises(InvalidArgument) as refused:
        after.for_tenant("carol")
    assert refused.value.field == "tenant"
    assert journal.tenant_uids() == {"alice": alice.uid, "bob": bob.uid}
    journal.close()


def test_uids_this_host_knows_are_never_handed_out(tmp_path: Path) -> None:
    """A pool that overlaps real accounts (root, nobody) skips them."""
    journal = Journal(tmp_path)
    known = sorted({0, pwd.getpwnam("nobody").pw_uid})
    identities = TenantIdentities(NOBODY, pool=range(known[0], known[0] + 1), store=journal)
    with pytest.raises(InvalidArgument):
        identities.for_tenant("mallory")  # the only uid is root's
    journal.close()


def test_tenant_users_win_over_the_pool_and_no_root_means_no_switch(tmp_path: Path) -> None:
    (uid,) = _free_uids(62000, 1)
    mapped = RunAs("svc", 4242, 4242, (4242,), "/srv")
    identities = TenantIdentities(NOBODY, users={"ml": mapped}, pool=range(uid, uid + 1))
    assert identities.is_isolating
    assert identities.for_tenant("ml") == mapped
    other = identities.for_tenant("other")
    assert other is not None and other.uid == uid
    # An agent that is not root runs everything as itself: no pool, no map applies.
    unprivileged = TenantIdentities(None, users={"ml": mapped}, pool=range(uid, uid + 1))
    assert not unprivileged.is_isolating
    assert unprivileged.for_tenant("ml") is None and unprivileged.for_tenant("x") is None
    # Only run_as_user: every tenant shares it (the documented fallback).
    shared = TenantIdentities(NOBODY)
    assert not shared.is_isolating
    assert shared.for_tenant("a") == shared.for_tenant("b") == NOBODY


@pytest.mark.parametrize("text", ["60999-60000", "abc", "-5-10", "500-2000", "0-99999999999"])
def test_a_bad_uid_pool_is_a_config_error_naming_the_key(text: str) -> None:
    with pytest.raises(ConfigError) as bad:
        parse_uid_pool(text)
    assert bad.value.field == "executor.uid_pool"


def test_an_empty_uid_pool_means_none() -> None:
    assert parse_uid_pool("") is None
    assert parse_uid_pool("60000-60999") == range(60000, 61000)
