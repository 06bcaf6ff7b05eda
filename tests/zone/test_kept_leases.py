"""Leases a tenant keeps through ProbeJob(keep_leases): the router forgets each at its
expiry (a CommitJob naming it is refused) and its bookkeeping stays bounded by the leases
still kept, however many were probed and committed before."""

from __future__ import annotations

import random
import time
import types
from pathlib import Path
from typing import cast

import pytest
from corekit import FakeAgent, FakeClients

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause
from laminar_base.errors import PermissionDenied
from laminar_zone import jobs
from laminar_zone.config import ZoneConfig
from laminar_zone.jobs import ZoneState
from laminar_zone.membership import Membership
from laminar_zone.metrics import ZoneMetrics
from laminar_zone.placer import AgentClients
from laminar_zone.store import JobStore


def _spec() -> zone_pb2.JobSpec:
    return zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1), tenant="t")


async def _keep(zone: ZoneState, ttl: float) -> zone_pb2.Lease:
    reply = await zone.probe(
        zone_pb2.ProbeJobRequest(spec=_spec(), keep_leases=True, lease_ttl_seconds=ttl)
    )
    (host,) = reply.hosts
    assert host.fits and host.lease.lease_id
    return host.lease


async def test_kept_leases_expire_and_their_bookkeeping_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The router's clock, moved forward by the test (the event loop keeps the real one).
    skipped = [0.0]
    clock = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if n[0] != "_"})
    clock.monotonic = lambda: time.monotonic() + skipped[0]
    monkeypatch.setattr(jobs, "time", clock)
    agent = FakeAgent("a0", 4)
    store = JobStore(tmp_path / "zone.db")
    zone = ZoneState(
        ZoneConfig(),
        store,
        ZoneMetrics(),
        rng=random.Random(1),
        clients=cast(AgentClients, FakeClients({"a0": agent})),
    )
    try:
        zone.recover()
        membership = Membership(zone)

        def heartbeat() -> None:
            request = agent.heartbeat()
            agent.heard(membership.on_heartbeat(request), request.has_live_subjob_ids)

        heartbeat()

        short = await _keep(zone, 5.0)
        kept = [await _keep(zone, 60.0) for _ in range(2)]
        skipped[0] = 10.0  # past the short lease's TTL, well within the others'
        with pytest.raises(PermissionDenied, match="has expired"):
            await zone.commit_leases(zone_pb2.CommitJobRequest(spec=_spec(), leases=[short]))
        job = await zone.commit_leases(zone_pb2.CommitJobRequest(spec=_spec(), leases=[kept[0]]))
        assert job.state == zone_pb2.JOB_RUNNING

        # Many leases probed and committed one after another: what the router keeps for
        # expiry is bounded by the leases still kept, not by every lease ever kept.
        for _ in range(300):
            lease = await _keep(zone, 60.0)
            await zone.commit_leases(zone_pb2.CommitJobRequest(spec=_spec(), leases=[lease]))
            for subjob in agent.live():
                agent.end(subjob.spec.subjob_id, common_pb2.SUCCEEDED, EndCause.EXITED, "ok")
            heartbeat()  # the router sees the GPU free again
        assert len(zone._kept_leases) == 1  # kept[1], never committed
        assert len(zone._kept_expiries) <= 2 * len(zone._kept_leases) + 64
    finally:
        await zone.close()
        store.close()
