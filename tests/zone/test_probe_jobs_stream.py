"""ProbeJobs: ProbeJob calls over one stream, against the router's Zone service served on
127.0.0.1:0 in the test, over the router's own ZoneState and placer, with in-process agents
(``corekit``: the agent's real Ledger). Each call is answered by its call_id as the unary
ProbeJob would answer it (leases kept alike, its own INVALID_ARGUMENT or RESOURCE_EXHAUSTED,
the same refusal of a caller without a token); calls run concurrently; a stream the client
half-closes answers the calls in hand, and one it cancels leaves no task behind and no lease
unaccounted (the router keeps none of them; the agent's lapse at their TTL). A whole router
(``serverkit``) ends its open streams at shutdown and takes no new call."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from corekit import FakeAgent, FakeClients
from loopkit import eventually
from serverkit import zone_server

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.callstream import CallClient
from laminar_zone import service
from laminar_zone.auth import Guard, hash_token, open_guard
from laminar_zone.config import ZoneConfig
from laminar_zone.jobs import ZoneState
from laminar_zone.limits import RateLimiter
from laminar_zone.membership import Membership
from laminar_zone.metrics import ZoneMetrics
from laminar_zone.placer import AgentClients
from laminar_zone.service import ZoneService
from laminar_zone.store import JobStore

ONE_GPU = common_pb2.Resources(gpus=1)
TOKENS = {"alice": "alice-secret-token", "bob": "bob-secret-token"}


@dataclass
class HeldAgent(FakeAgent):
    """An agent that grants its leases at once but holds each probe's reply until ``gate``
    opens: the router's calls stay in flight with leases granted."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    probes_seen: int = 0
    #: Open ``gate`` once this many probes have reached the agents in ``company``.
    open_at: int = 0
    company: list[HeldAgent] = field(default_factory=list)
    #: When set, each held probe waits for a ticket of its own instead of ``gate``.
    tickets: asyncio.Semaphore | None = None
    holding: int = 0
    most_held: int = 0

    async def _hold(self, probes: int) -> None:
        """Hold a call of ``probes`` probes (the router sends those bound for one agent
        together while one of its calls is in flight)."""
        self.holding += probes
        self.most_held = max(self.most_held, self.holding)
        try:
            await (self.gate.wait() if self.tickets is None else self.tickets.acquire())
        finally:
            self.holding -= probes

    def _arrived(self, probes: int) -> None:
        self.probes_seen += probes
        if self.open_at and sum(a.probes_seen for a in self.company) >= self.open_at:
            for agent in self.company:
                agent.gate.set()

    async def Probe(
        self, request: agent_pb2.ProbeRequest, timeout: float = 0
    ) -> agent_pb2.ProbeReply:
        reply = await super().Probe(request, timeout)
        self._arrived(1)
        await self._hold(1)
        return reply

    async def ProbeBatch(
        self, request: agent_pb2.ProbeBatchRequest, timeout: float = 0
    ) -> agent_pb2.ProbeBatchReply:
        reply = await super().ProbeBatch(request, timeout)
        self._arrived(len(request.probes))
        await self._hold(len(request.probes))
        return reply


@dataclass
class Router:
    state: ZoneState
    guard: Guard
    stub: zone_pb2_grpc.ZoneAsyncStub


@asynccontextmanager
async def router(
    tmp_path: Path, agents: list[FakeAgent], guard: Guard | None = None
) -> AsyncIterator[Router]:
    store = JobStore(tmp_path / "zone.db")
    state = ZoneState(
        ZoneConfig(),
        store,
        ZoneMetrics(),
        rng=random.Random(1),
        clients=cast(AgentClients, FakeClients({a.agent_id: a for a in agents})),
    )
    guard = guard if guard is not None else open_guard()
    server = grpc.aio.server()
    try:
        state.recover()
        membership = Membership(state)
        for agent in agents:
            request = agent.heartbeat()
            agent.heard(membership.on_heartbeat(request), request.has_live_subjob_ids)
        zone_pb2_grpc.add_ZoneServicer_to_server(ZoneService(state, guard), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Router(state, guard, zone_pb2_grpc.ZoneStub(channel))
    finally:
        await server.stop(None)
        await state.close()
        store.close()


def probe(resources: common_pb2.Resources = ONE_GPU, tenant: str = "") -> zone_pb2.ProbeJobRequest:
    return zone_pb2.ProbeJobRequest(
        spec=zone_pb2.JobSpec(resources=resources, tenant=tenant),
        keep_leases=True,
        lease_ttl_seconds=30,
    )


def calls(
    *probes: zone_pb2.ProbeJobRequest, first_id: int = 100
) -> list[zone_pb2.ProbeJobsRequest]:
    return [zone_pb2.ProbeJobsRequest(call_id=first_id + i, probe=p) for i, p in enumerate(probes)]


async def exchange(
    stub: zone_pb2_grpc.ZoneAsyncStub,
    requests: list[zone_pb2.ProbeJobsRequest],
    metadata: list[tuple[str, str]] | None = None,
) -> dict[int, zone_pb2.ProbeJobsReply]:
    """Send every call, stop sending, read the stream to its end: replies by call_id."""
    stream = stub.ProbeJobs(metadata=metadata, timeout=30)
    for request in requests:
        await stream.write(request)
    await stream.done_writing()
    replies: dict[int, zone_pb2.ProbeJobsReply] = {}
    async for reply in stream:
        assert reply.call_id not in replies, f"call {reply.call_id} answered twice"
        replies[reply.call_id] = reply
    assert await stream.code() == grpc.StatusCode.OK
    return replies


def leases_of(reply: zone_pb2.ProbeJobReply) -> list[agent_pb2.Lease]:
    return [h.lease for h in reply.hosts if h.HasField("lease")]


async def test_calls_on_one_stream_run_together_and_are_answered_by_call_id_as_unary(
    tmp_path: Path,
) -> None:
    """Every probe is held at its agent until all six have reached the agents: only calls
    handled concurrently get there (one at a time, the first would wait forever)."""
    agents = [HeldAgent("a0", 4, open_at=6), HeldAgent("a1", 4, open_at=6)]
    for agent in agents:
        agent.company = agents
    async with router(tmp_path, list(agents)) as zone:
        replies = await exchange(zone.stub, calls(*(probe() for _ in range(6))))
        unary = await zone.stub.ProbeJob(probe(), timeout=30)
        assert set(replies) == set(range(100, 106))
        leased: list[str] = []
        for reply in replies.values():
            assert reply.WhichOneof("outcome") == "reply"
            answer = reply.reply
            assert (answer.hosts_total, answer.hosts_matching) == (
                unary.hosts_total,
                unary.hosts_matching,
            )
            (lease,) = leases_of(answer)
            (host,) = answer.hosts
            assert host.fits and host.agent_id == lease.agent_id in ("a0", "a1")
            leased.append(lease.lease_id)
        assert len(set(leased)) == 6  # six leases, one GPU each of eight
        (unary_lease,) = leases_of(unary)
        # Kept for the tenant as the unary call's: CommitJob may name any of them.
        assert len(zone.state.kept_leases) == 7
        resources = ONE_GPU.SerializeToString(deterministic=True)
        zone.state.kept_leases.check([*leased, unary_lease.lease_id], "default", resources, 1, 0.0)
        assert sum(a.ledger.pending_leases() for a in agents) == 7


@pytest.mark.parametrize(
    ("resources", "field_name"),
    [
        (common_pb2.Resources(gpu_milli=5000), "spec.resources.gpu_milli"),
        (common_pb2.Resources(gpus=1, mig_profile="1g.10gb"), "spec.resources.mig_profile"),
    ],
)
async def test_a_bad_call_fails_alone_naming_the_field(
    tmp_path: Path, resources: common_pb2.Resources, field_name: str
) -> None:
    async with router(tmp_path, [FakeAgent("a0", 2)]) as zone:
        replies = await exchange(zone.stub, calls(probe(), probe(resources), probe()))
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await zone.stub.ProbeJob(probe(resources), timeout=30)
    bad = replies.pop(101)
    assert bad.WhichOneof("outcome") == "error"
    assert bad.error.code == "INVALID_ARGUMENT" == unary.value.code().name
    assert field_name in bad.error.message
    assert bad.error.message == unary.value.details()
    for reply in replies.values():
        assert reply.WhichOneof("outcome") == "reply" and len(leases_of(reply.reply)) == 1


async def test_the_tenant_probe_limit_refuses_each_call_beyond_it(tmp_path: Path) -> None:
    """Rate 1/s, burst 2, a clock that stands still: two calls pass, the rest of the stream
    is refused call by call, and a unary ProbeJob draws from the same bucket."""
    guard = open_guard()
    guard.probe_limiter = RateLimiter("ProbeJob", 1.0, 2, clock=lambda: 0.0)
    async with router(tmp_path, [FakeAgent("a0", 4)], guard) as zone:
        replies = await exchange(zone.stub, calls(*(probe() for _ in range(4))))
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await zone.stub.ProbeJob(probe(), timeout=30)
        assert len(zone.state.kept_leases) == 2
    outcomes = sorted(r.WhichOneof("outcome") for r in replies.values())
    assert outcomes == ["error", "error", "reply", "reply"]
    for reply in replies.values():
        if reply.WhichOneof("outcome") == "error":
            assert reply.error.code == "RESOURCE_EXHAUSTED" == unary.value.code().name
            assert "ProbeJob rate limit for tenant 'default'" in reply.error.message


def write_tokens(path: Path, names: list[str]) -> None:
    path.write_text(
        "".join(
            f'[[token]]\ntenant = "{n}"\nrole = "tenant"\nhash = "{hash_token(TOKENS[n])}"\n\n'
            for n in names
        )
    )


def bearer(name: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {TOKENS[name]}")]


async def test_callers_are_checked_as_for_probe_job_and_a_revoked_token_ends_the_stream(
    tmp_path: Path,
) -> None:
    tokens = tmp_path / "tokens.toml"
    write_tokens(tokens, ["alice", "bob"])
    guard = Guard(
        str(tokens),
        submit_limiter=RateLimiter("Submit", 0.0, 1),
        probe_limiter=RateLimiter("ProbeJob", 0.0, 1),
    )
    async with router(tmp_path, [FakeAgent("a0", 4)], guard) as zone:
        for metadata in (None, [("authorization", "Bearer wrong")]):
            with pytest.raises(grpc.aio.AioRpcError) as unary:
                await zone.stub.ProbeJob(probe(), metadata=metadata, timeout=30)
            with pytest.raises(grpc.aio.AioRpcError) as streamed:
                await exchange(zone.stub, calls(probe()), metadata)
            assert streamed.value.code() == unary.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert len(zone.state.kept_leases) == 0
        # Alice's own calls pass, on her tenant; one for bob's tenant is refused alone.
        replies = await exchange(zone.stub, calls(probe(), probe(tenant="bob")), bearer("alice"))
        assert replies[100].WhichOneof("outcome") == "reply"
        assert replies[101].error.code == "PERMISSION_DENIED"
        assert "'alice' may not submit for tenant 'bob'" in replies[101].error.message
        resources = ONE_GPU.SerializeToString(deterministic=True)
        (lease,) = leases_of(replies[100].reply)
        zone.state.kept_leases.check([lease.lease_id], "alice", resources, 1, 0.0)
        # A stream open when alice's token is revoked ends UNAUTHENTICATED; bob's goes on.
        alice = zone.stub.ProbeJobs(metadata=bearer("alice"), timeout=30)
        bob = zone.stub.ProbeJobs(metadata=bearer("bob"), timeout=30)
        for stream in (alice, bob):
            await stream.write(calls(probe())[0])
            assert (await stream.read()).WhichOneof("outcome") == "reply"
        write_tokens(tokens, ["bob"])
        assert zone.guard.reload()[0]
        with pytest.raises(grpc.aio.AioRpcError) as revoked:
            await alice.read()
        assert revoked.value.code() == grpc.StatusCode.UNAUTHENTICATED
        await bob.write(calls(probe(), first_id=7)[0])
        assert (await bob.read()).call_id == 7
        await bob.done_writing()
        assert await bob.code() == grpc.StatusCode.OK


def probe_tasks() -> set[asyncio.Task[object]]:
    return {
        t
        for t in asyncio.all_tasks()
        if t.get_name().startswith("probe-jobs-call") and not t.done()
    }


async def held(agents: list[HeldAgent], count: int) -> None:
    async def arrived() -> bool:
        return sum(a.probes_seen for a in agents) >= count

    await eventually(arrived, f"{count} probes held at the agents")


async def test_a_half_closed_stream_answers_the_calls_in_hand(tmp_path: Path) -> None:
    agents = [HeldAgent("a0", 4)]
    async with router(tmp_path, list(agents)) as zone:
        stream = zone.stub.ProbeJobs(timeout=30)
        for request in calls(probe(), probe(), probe()):
            await stream.write(request)
        await held(agents, 3)
        await stream.done_writing()  # all three still wait for their agent
        agents[0].gate.set()
        replies = [reply async for reply in stream]
        assert await stream.code() == grpc.StatusCode.OK
        assert sorted(r.call_id for r in replies) == [100, 101, 102]
        assert all(len(leases_of(r.reply)) == 1 for r in replies)
        assert len(zone.state.kept_leases) == 3
        assert not probe_tasks()


async def test_a_cancelled_stream_leaves_no_task_behind_and_no_lease_unaccounted(
    tmp_path: Path,
) -> None:
    """Three calls wait at the agent, their leases granted, when the client cancels: the
    calls end with the stream, the router keeps none of those leases, and the agent's
    lapse at their TTL (as for a unary ProbeJob whose caller went away)."""
    now = [0.0]
    agent = HeldAgent("a0", 4, clock=lambda: now[0])
    async with router(tmp_path, [agent]) as zone:
        stream = zone.stub.ProbeJobs(timeout=30)
        for request in calls(probe(), probe(), probe()):
            await stream.write(request)
        await held([agent], 3)
        assert len(probe_tasks()) == 4  # three calls and the stream's reader
        assert agent.ledger.pending_leases() == 3
        stream.cancel()

        async def none_left() -> bool:
            return not probe_tasks()

        await eventually(none_left, "the cancelled stream's tasks ended")
        agent.gate.set()  # the agent's replies come too late for anyone
        assert len(zone.state.kept_leases) == 0
        now[0] = 31.0  # past the leases' 30 s TTL
        agent.ledger.expire(now[0])
        assert agent.ledger.pending_leases() == 0
        # The router still serves: a fresh stream gets a lease of the freed GPUs.
        replies = await exchange(zone.stub, calls(probe()))
        assert len(leases_of(replies[100].reply)) == 1


async def test_calls_beyond_the_bound_stay_unread_until_one_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a bound of two, four calls sent at once reach the agent two at a time: each
    held probe let go lets one more call be read."""
    monkeypatch.setattr(service, "MAX_PROBES_IN_FLIGHT", 2)
    agent = HeldAgent("a0", 4, tickets=asyncio.Semaphore(0))
    assert agent.tickets is not None
    async with router(tmp_path, [agent]) as zone:
        stream = zone.stub.ProbeJobs(timeout=30)
        for request in calls(*(probe() for _ in range(4))):
            await stream.write(request)
        await stream.done_writing()
        for arrived in (2, 3, 4):
            await held([agent], arrived)
            agent.tickets.release()
        agent.tickets.release()
        replies = [reply async for reply in stream]
        assert sorted(r.call_id for r in replies) == [100, 101, 102, 103]
        assert agent.most_held == 2  # probes held at once, never more than the bound


async def test_a_shutdown_ends_a_probe_jobs_stream_and_takes_no_new_call(tmp_path: Path) -> None:
    grace = 60.0  # what an open stream would hold the shutdown for
    async with (
        zone_server(tmp_path, **{"server.grace_seconds": grace}) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = zone_pb2_grpc.ZoneStub(channel)
        opener: Any = stub.ProbeJobs
        client: CallClient[zone_pb2.ProbeJobsRequest, zone_pb2.ProbeJobsReply] = CallClient(
            lambda: opener()
        )
        probe = zone_pb2.ProbeJobsRequest(
            probe=zone_pb2.ProbeJobRequest(
                spec=zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1))
            )
        )
        first = await client.call(probe, 10)
        assert first.WhichOneof("outcome") == "reply"  # open and serving (no hosts yet)
        stopping = asyncio.ensure_future(server.stop())
        assert server.submitters is not None
        while not server.submitters.streams_ending:
            await asyncio.sleep(0)  # the shutdown's first steps (loop turns, no timer)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.call(probe, 10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        await asyncio.wait_for(stopping, grace / 4)  # not held for the grace
        await client.close()
