"""Leases a tenant keeps through ProbeJob(keep_leases): forgotten at their expiry (a
CommitJob naming one is refused), taken at most once, and bookkeeping bounded by the
leases still kept, however many were kept and committed before."""

from __future__ import annotations

import random
from pathlib import Path
from typing import cast

import pytest
from corekit import FakeAgent, FakeClients
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_base.causes import EndCause
from laminar_base.errors import InvalidArgument, PermissionDenied
from laminar_zone.client_leases import ClientLeases
from laminar_zone.config import ZoneConfig
from laminar_zone.jobs import ZoneState
from laminar_zone.kept import KeptLease, KeptLeases
from laminar_zone.membership import Membership
from laminar_zone.metrics import ZoneMetrics
from laminar_zone.placer import AgentClients
from laminar_zone.store import JobStore

ONE_GPU = common_pb2.Resources(gpus=1).SerializeToString(deterministic=True)


def _lease(tenant: str, expires: float, resources: bytes = ONE_GPU) -> KeptLease:
    return KeptLease(tenant=tenant, resources=resources, gang_size=1, expires_mono=expires)


def test_a_kept_lease_commits_once_for_its_tenant_until_it_expires() -> None:
    kept = KeptLeases()
    kept.keep("short", _lease("t", 5.0))
    kept.keep("long", _lease("t", 60.0))
    kept.check(["short"], "t", ONE_GPU, 1, now=4.0)
    with pytest.raises(PermissionDenied, match="has expired") as info:
        kept.check(["short"], "t", ONE_GPU, 1, now=5.0)
    assert info.value.field == "leases[0]"
    with pytest.raises(PermissionDenied) as info:  # another tenant's: the same answer
        kept.check(["long"], "u", ONE_GPU, 1, now=5.0)
    assert info.value.field == "leases[0]"
    two_gpus = common_pb2.Resources(gpus=2).SerializeToString(deterministic=True)
    with pytest.raises(InvalidArgument) as bad:
        kept.check(["long"], "t", two_gpus, 1, now=5.0)
    assert bad.value.field == "spec.resources"
    kept.check(["long"], "t", ONE_GPU, 1, now=5.0)
    kept.take(["long"])
    with pytest.raises(PermissionDenied):
        kept.check(["long"], "t", ONE_GPU, 1, now=5.0)
    assert len(kept) == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["keep", "take", "tick"]), st.floats(0.1, 30.0)),
        max_size=400,
    )
)
def test_bookkeeping_matches_a_scan_and_stays_bounded(ops: list[tuple[str, float]]) -> None:
    """Against a plain dict swept by a full scan: the same leases kept after every step,
    and at most twice the leases kept (plus a constant) entries held for expiry."""
    kept, plain = KeptLeases(), {}
    now = 0.0
    for n, (op, amount) in enumerate(ops):
        if op == "keep":
            kept.keep(f"l{n}", _lease("t", now + amount))
            plain[f"l{n}"] = now + amount
        elif op == "take" and plain:
            lease_id = sorted(plain)[int(amount) % len(plain)]
            kept.take([lease_id])
            del plain[lease_id]
        else:
            now += amount
        kept.sweep(now)
        plain = {k: v for k, v in plain.items() if v > now}
        assert len(kept) == len(plain)
        for lease_id in plain:
            kept.check([lease_id], "t", ONE_GPU, 1, now)
        assert kept.bookkeeping <= 2 * len(plain) + 65


async def test_the_router_commits_kept_leases_and_refuses_used_ones(tmp_path: Path) -> None:
    """Through the router's own ProbeJob and CommitJob: many leases kept and committed one
    after another leave only the one never committed, and a committed lease cannot be
    named again."""
    agent = FakeAgent("a0", 2)
    store = JobStore(tmp_path / "zone.db")
    zone = ZoneState(
        ZoneConfig(),
        store,
        ZoneMetrics(),
        rng=random.Random(1),
        clients=cast(AgentClients, FakeClients({"a0": agent})),
    )
    leases = ClientLeases(zone)
    spec = zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1), tenant="t")

    async def keep() -> agent_pb2.Lease:
        reply = await leases.probe(
            zone_pb2.ProbeJobRequest(spec=spec, keep_leases=True, lease_ttl_seconds=60)
        )
        (host,) = reply.hosts
        assert host.fits and host.lease.lease_id
        return host.lease

    try:
        zone.recover()
        membership = Membership(zone)

        def heartbeat() -> None:
            request = agent.heartbeat()
            agent.heard(membership.on_heartbeat(request), request.has_live_subjob_ids)

        heartbeat()
        held = await keep()  # never committed
        for _ in range(200):
            lease = await keep()
            job = await leases.commit_leases(zone_pb2.CommitJobRequest(spec=spec, leases=[lease]))
            assert job.state == zone_pb2.JOB_RUNNING
            for subjob in agent.live():
                agent.end(subjob.spec.subjob_id, common_pb2.SUCCEEDED, EndCause.EXITED, "ok")
            heartbeat()  # the router sees the GPU free again
        with pytest.raises(PermissionDenied):
            await leases.commit_leases(zone_pb2.CommitJobRequest(spec=spec, leases=[lease]))
        assert len(zone.kept_leases) == 1 and held.lease_id
        assert zone.kept_leases.bookkeeping <= 2 * len(zone.kept_leases) + 64
    finally:
        await zone.close()
        store.close()
