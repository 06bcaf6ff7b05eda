"""The agent's heartbeat client against a real ZoneControl server started in the test.

The test server records what arrives and acknowledges events and Airlock
actions only from the second heartbeat on, so the test sees that
unacknowledged ones are sent again and acknowledged ones are not.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from waiting import gate_code, until, wait_for

from laminar_agent import heartbeat
from laminar_agent.heartbeat import HeartbeatClient, write_fence
from laminar_agent.journal import EventRow
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.fragmentation import PodShape
from laminar_bench.heartbeat_pool import EmptyJournal, idle_summary
from laminar_cli.cluster import LocalCluster


class RecordingZone(zone_pb2_grpc.ZoneControlServicer):
    def __init__(self) -> None:
        self.requests: list[zone_pb2.HeartbeatRequest] = []
        self.lock = threading.Lock()

    def Heartbeat(
        self, request: zone_pb2.HeartbeatRequest, context: Any
    ) -> zone_pb2.HeartbeatReply:
        with self.lock:
            self.requests.append(request)
            later = len(self.requests) > 1
            ack = max((e.seq for e in request.events), default=0) if later else 0
            ack_actions = max((a.seq for a in request.airlock_actions), default=0) if later else 0
        return zone_pb2.HeartbeatReply(
            acked_seq=ack, period_seconds=0.2, zone="test", acked_action_seq=ack_actions
        )

    def snapshot(self) -> list[zone_pb2.HeartbeatRequest]:
        with self.lock:
            return list(self.requests)


@contextlib.contextmanager
def serving(servicer: zone_pb2_grpc.ZoneControlServicer) -> Iterator[str]:
    """A ZoneControl server on loopback for ``servicer``; its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    zone_pb2_grpc.add_ZoneControlServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@pytest.fixture
def zone() -> Iterator[tuple[str, RecordingZone]]:
    servicer = RecordingZone()
    with serving(servicer) as address:
        yield address, servicer


def test_heartbeats_carry_summary_and_events_until_acked(
    tmp_path: Path, zone: tuple[str, RecordingZone]
) -> None:
    address, recorder = zone
    with LocalCluster(tmp_path) as cluster:
        agent = cluster.start_agent("hb", "2xA100-40GB", zone=address)
        wait_for(lambda: len(recorder.requests) >= 1)
        first = recorder.requests[0]
        assert first.summary.agent_id == "hb" and first.summary.address == agent.address
        assert {s.shape: s.total for s in first.summary.shapes} == {"gpu:A100-40GB": 2}
        with grpc.insecure_channel(agent.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            stub.Probe(
                agent_pb2.ProbeRequest(
                    job_id="j",
                    resources=common_pb2.Resources(gpus=1),
                    commit_if_fits=True,
                    spec=common_pb2.SubjobSpec(
                        subjob_id="s", command=[sys.executable, "-c", "pass"]
                    ),
                ),
                timeout=10,
            )

        def saw_success() -> bool:
            return any(
                e.subjob.spec.subjob_id == "s" and e.subjob.state == common_pb2.SUCCEEDED
                for r in list(recorder.requests)
                for e in r.events
            )

        wait_for(saw_success)
        # Once acknowledged, events are not sent again.
        wait_for(lambda: len(recorder.requests) >= 3 and not recorder.requests[-1].events)
        for request in recorder.requests:
            seqs = [e.seq for e in request.events]
            assert seqs == sorted(set(seqs))  # in journal order, no duplicates within one


GIB = 1024**3


def test_readdress_ids_ride_heartbeats_until_the_router_ends_the_subjob(
    tmp_path: Path, zone: tuple[str, RecordingZone], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airlock hands a long-suspended restartable subjob to the zone router: its id is on
    every heartbeat until the router, having placed a copy, ends it with "readdressed:"."""
    monkeypatch.setenv("LAMINAR_AIRLOCK_READDRESS_AFTER_SECONDS", "0.3")
    address, recorder = zone
    gate = tmp_path / "gate"
    share = common_pb2.Resources(gpu_milli=400, gpu_memory_bytes=20 * GIB)
    with LocalCluster(tmp_path) as cluster:
        agent = cluster.start_agent("hb", "1xA100-80GB:shared", zone=address)
        with grpc.insecure_channel(agent.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            for subjob_id, priority in (
                ("crit", common_pb2.CRITICAL),
                ("mover", common_pb2.OPPORTUNISTIC),
            ):
                spec = common_pb2.SubjobSpec(
                    subjob_id=subjob_id,
                    job_id=f"job-{subjob_id}",
                    command=[sys.executable, "-c", gate_code(gate)],
                    priority=priority,  # type: ignore[arg-type]
                    resources=share,
                    restartable=True,
                )
                reply = stub.Probe(
                    agent_pb2.ProbeRequest(
                        job_id=spec.job_id, resources=share, commit_if_fits=True, spec=spec
                    ),
                    timeout=10,
                )
                assert reply.subjob.state == common_pb2.RUNNING
            stub.InjectLoad(
                agent_pb2.InjectLoadRequest(gpu_index=0, used_bytes=40 * GIB), timeout=10
            )

            def asked(n: int) -> bool:
                return sum("mover" in r.readdress_subjob_ids for r in recorder.snapshot()) >= n

            wait_for(lambda: asked(3))  # asked again and again, not once
            first = next(r for r in recorder.snapshot() if "mover" in r.readdress_subjob_ids)
            assert list(first.readdress_subjob_ids) == ["mover"]
            assert first.summary.suspended_subjobs == 1
            assert first.summary.pressure in (common_pb2.ELEVATED, common_pb2.CRITICAL_PRESSURE)
            sent_actions = [a for r in recorder.snapshot() for a in r.airlock_actions]
            readdress = [a for a in sent_actions if a.step == "readdress"]
            assert readdress and readdress[0].subjob_id == "mover"
            assert "attempt 1/2" in readdress[0].reason
            got = stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="mover"), timeout=10)
            assert got.state == common_pb2.SUSPENDED

            # The router placed a copy elsewhere and now ends the old one.
            stub.SignalSubjob(
                agent_pb2.SignalSubjobRequest(
                    subjob_id="mover",
                    signal=agent_pb2.TERMINATE,
                    reason="readdressed: copy mover-2 committed on agent hb2",
                ),
                timeout=30,
            )
            ended = stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="mover"), timeout=10)
            assert ended.state == common_pb2.KILLED
            assert ended.reason.startswith("readdressed: copy mover-2 committed on agent hb2")

            def told_and_dropped() -> bool:
                requests = recorder.snapshot()
                seen = [
                    i
                    for i, r in enumerate(requests)
                    for e in r.events
                    if e.subjob.spec.subjob_id == "mover" and e.subjob.state == common_pb2.KILLED
                ]
                return bool(seen) and "mover" not in requests[-1].readdress_subjob_ids

            wait_for(told_and_dropped)
            # Actions, once acknowledged, are not sent again.
            wait_for(lambda: not recorder.snapshot()[-1].airlock_actions)
            for request in recorder.snapshot():
                seqs = [a.seq for a in request.airlock_actions]
                assert seqs == sorted(set(seqs))  # in journal order, no duplicates within one
            crit = stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="crit"), timeout=10)
            assert crit.state == common_pb2.RUNNING
            gate.write_text("go")
            wait_for(
                lambda: (
                    stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="crit"), timeout=10).state
                    == common_pb2.SUCCEEDED
                )
            )


# ---------------------------------------------------------------- delta heartbeats
# The real HeartbeatClient in this process against a ZoneControl server started in the
# test, driven one heartbeat at a time (HeartbeatClient.beat): no sleeps, no timing.


class VersionedZone(RecordingZone):
    """Keeps the summary version of every full heartbeat, as the router does, and refreshes
    deltas only for the version it holds; ``old``: a router that knows no versions."""

    def __init__(self, *, old: bool = False) -> None:
        super().__init__()
        self.old = old
        self.versions: dict[str, int] = {}

    def Heartbeat(
        self, request: zone_pb2.HeartbeatRequest, context: Any
    ) -> zone_pb2.HeartbeatReply:
        with self.lock:
            self.requests.append(request)
            acked = max((e.seq for e in request.events), default=0)
            if self.old:
                return zone_pb2.HeartbeatReply(period_seconds=0.2, acked_seq=acked)
            if request.HasField("summary"):
                self.versions[request.summary.agent_id] = request.summary_version
                held = request.summary_version
            else:
                held = self.versions.get(request.agent_id, 0)
                if held != request.summary_version:
                    return zone_pb2.HeartbeatReply(period_seconds=0.2)  # send the summary
        return zone_pb2.HeartbeatReply(
            period_seconds=0.2, acked_seq=acked, fence_lease_seconds=25.0, summary_version=held
        )


class OneEventJournal(EmptyJournal):
    """A journal holding one subjob event until the router acknowledges it."""

    def __init__(self) -> None:
        super().__init__()
        self.pending = [EventRow(1, "s-1", "SUCCEEDED", "exited 0", 1.0, False)]

    def unacked_events(self, limit: int = 1000) -> list[EventRow]:
        return list(self.pending)

    def ack_events(self, up_to_seq: int) -> int:
        self.pending = [e for e in self.pending if e.seq > up_to_seq]
        return 1


@pytest.fixture
def versioned() -> Iterator[tuple[str, VersionedZone]]:
    servicer = VersionedZone()
    with serving(servicer) as address:
        yield address, servicer


def event(seq: int, subjob_id: str, state: str, reason: str, at: float) -> common_pb2.SubjobEvent:
    return common_pb2.SubjobEvent(seq=seq, subjob=common_pb2.Subjob(state=common_pb2.SUCCEEDED))


class Beats:
    """A heartbeat client with a summary the test changes (``free``), and its stub."""

    def __init__(self, address: str, tmp_path: Path, journal: EmptyJournal | None = None):
        self.free = 8
        self.fresh = idle_summary("d1", "127.0.0.1:9")  # new stamps on every call
        self.fence = tmp_path / "fence"
        self.client = HeartbeatClient(
            address, 0.2, self.summary, journal or EmptyJournal(), event, fence_file=self.fence
        )
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = zone_pb2_grpc.ZoneControlStub(self.channel)

    async def connect(self, address: str) -> None:
        """Send the next heartbeats to ``address`` (127.0.0.1:1: nothing listens)."""
        await self.channel.close(None)
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = zone_pb2_grpc.ZoneControlStub(self.channel)

    def summary(self) -> common_pb2.AgentSummary:
        message = self.fresh()
        message.shapes[0].free = self.free
        return message

    async def beat(self, times: int = 1) -> None:
        for _ in range(times):
            await self.client.beat(self.stub)
            await self.client.fence_settled()  # the file is written off the loop


async def test_an_unchanged_summary_is_sent_once_then_only_its_version(
    tmp_path: Path, versioned: tuple[str, VersionedZone]
) -> None:
    address, zone = versioned
    beats = Beats(address, tmp_path)
    await beats.beat(4)
    first, *rest = zone.snapshot()
    assert first.HasField("summary") and first.summary.agent_id == "d1"
    assert first.summary_version == 1 and not first.agent_id
    for request in rest:  # generation, generated_unix and window starts moved on
        assert not request.HasField("summary")
        assert (request.agent_id, request.summary_version) == ("d1", 1)
    assert beats.client.deltas == 3 and beats.client.sent == 4
    assert beats.fence.exists()  # every acknowledged delta renews the fence
    await beats.channel.close(None)


async def test_a_changed_summary_is_sent_with_a_new_version(
    tmp_path: Path, versioned: tuple[str, VersionedZone]
) -> None:
    address, zone = versioned
    beats = Beats(address, tmp_path)
    await beats.beat(2)
    beats.free = 7  # a subjob took a GPU
    await beats.beat(2)
    requests = zone.snapshot()
    assert [r.HasField("summary") for r in requests] == [True, False, True, False]
    assert [r.summary_version for r in requests] == [1, 1, 2, 2]
    assert requests[2].summary.shapes[0].free == 7
    await beats.channel.close(None)


async def test_a_router_that_lost_the_summary_gets_it_at_once_and_no_fence_renewal(
    tmp_path: Path, versioned: tuple[str, VersionedZone]
) -> None:
    """A router restart: the delta is refused, so the fence is left as it was and the
    heartbeat loop sends the summary next, at once."""
    address, zone = versioned
    beats = Beats(address, tmp_path)
    await beats.beat(2)
    fence_before = beats.fence.read_text()
    zone.versions.clear()  # the router restarted
    await beats.beat()
    assert not zone.snapshot()[-1].HasField("summary")
    assert beats.fence.read_text() == fence_before
    assert beats.client.more_events  # run() beats again without waiting a period
    await beats.beat(2)
    last = zone.snapshot()[-2:]
    assert last[0].HasField("summary") and last[0].summary_version == 1
    assert not last[1].HasField("summary")  # the router holds it again
    await beats.channel.close(None)


async def test_an_old_router_gets_the_summary_every_time(tmp_path: Path) -> None:
    old = VersionedZone(old=True)
    with serving(old) as address:
        beats = Beats(address, tmp_path)
        await beats.beat(2)
        await beats.connect("127.0.0.1:1")  # a failed heartbeat
        await beats.beat()
        await beats.connect(address)
        await beats.beat()
        assert len(old.snapshot()) == 3
        assert all(r.HasField("summary") for r in old.snapshot())
        assert beats.client.deltas == 0
        await beats.channel.close(None)


async def test_events_ride_with_the_summary(
    tmp_path: Path, versioned: tuple[str, VersionedZone]
) -> None:
    address, zone = versioned
    beats = Beats(address, tmp_path, OneEventJournal())
    await beats.beat(3)  # the event (acknowledged by the first reply), then deltas
    requests = zone.snapshot()
    assert requests[0].events and requests[0].HasField("summary")
    assert [r.HasField("summary") for r in requests[1:]] == [False, False]
    await beats.channel.close(None)


async def test_after_a_failed_summary_the_next_heartbeat_is_a_delta(
    tmp_path: Path, versioned: tuple[str, VersionedZone]
) -> None:
    """An overloaded router answers past the deadline but keeps the summary: the agent
    goes on with deltas, and a router that did not keep it refuses the delta."""
    address, zone = versioned
    beats = Beats(address, tmp_path)
    await beats.beat(2)
    beats.free = 7
    await beats.connect("127.0.0.1:1")  # nothing listens there
    await beats.beat()
    assert beats.client.failures == 1
    await beats.connect(address)
    await beats.beat()  # a delta naming version 2, which this router never got
    assert not zone.snapshot()[-1].HasField("summary")
    assert zone.snapshot()[-1].summary_version == 2 and beats.client.more_events
    await beats.beat(2)
    last = zone.snapshot()[-2:]
    assert last[0].HasField("summary") and last[0].summary.shapes[0].free == 7
    assert not last[1].HasField("summary") and last[1].summary_version == 2
    await beats.channel.close(None)


class WorkloadZone(VersionedZone):
    """Also shares a target workload (version 5) with an agent that does not hold it."""

    def Heartbeat(
        self, request: zone_pb2.HeartbeatRequest, context: Any
    ) -> zone_pb2.HeartbeatReply:
        reply = super().Heartbeat(request, context)
        if request.workload_version != 5:
            reply.workload_version = 5
            reply.workload.add(num_gpu=1, gpu_milli=500, count=7)
            reply.workload.add(num_gpu=2, gpu_milli=1000, gpu_models=["H100-80GB"], count=2)
        return reply


async def test_the_agent_takes_the_routers_workload_once_per_version(tmp_path: Path) -> None:
    servicer = WorkloadZone()
    taken: list[Counter[PodShape]] = []
    with serving(servicer) as address:
        beats = Beats(address, tmp_path)
        beats.client = HeartbeatClient(
            address, 0.2, beats.summary, EmptyJournal(), event, on_workload=taken.append
        )
        await beats.beat(3)
        await beats.channel.close(None)
    first, *rest = servicer.snapshot()
    assert first.workload_version == 0
    assert [r.workload_version for r in rest] == [5, 5]  # it says which it holds
    (counts,) = taken  # applied once, not on every heartbeat
    assert counts == {
        PodShape(0, 0, 1, 500): 7,
        PodShape(0, 0, 2, 1000, ("H100-80GB",)): 2,
    }


def fence_client(fence: Path) -> HeartbeatClient:
    return HeartbeatClient(
        "127.0.0.1:1",
        1.0,
        common_pb2.AgentSummary,
        EmptyJournal(),
        lambda *a: None,
        fence_file=fence,
    )


async def test_the_fence_moves_forward_by_a_tenth_of_the_lease_and_back_at_once(
    tmp_path: Path,
) -> None:
    """Rewriting the fence on every woken heartbeat fsyncs it per subjob event: a small
    extension is skipped (the deadline on disk only stops work sooner), a shorter lease is
    written at once (the deadline on disk must never be later than the router allows)."""
    fence = tmp_path / "fence"
    fence.write_text("5.0\n")  # an earlier process's fence: replaced, or removed when off
    client = fence_client(fence)

    async def on_disk() -> float:
        await client.fence_settled()
        return float(fence.read_text())

    client._renew_fence(100.0, 10.0)
    assert await on_disk() == 110.0
    client._renew_fence(100.5, 10.0)  # 0.5 s later: within a tenth of the lease
    assert await on_disk() == 110.0
    client._renew_fence(101.2, 10.0)
    assert await on_disk() == 111.2
    client._renew_fence(101.3, 2.0)  # the router shortened the lease: back at once
    assert await on_disk() == 103.3
    client._renew_fence(101.4, 0.0)  # fencing off
    await client.fence_settled()
    assert not fence.exists()
    fence.write_text("5.0\n")
    client._renew_fence(101.5, 0.0)  # off and already removed: nothing more to do
    await client.fence_settled()
    assert fence.exists()


async def test_a_fence_left_by_an_earlier_process_goes_when_the_router_turns_fencing_off(
    tmp_path: Path,
) -> None:
    fence = tmp_path / "fence"
    fence.write_text("5.0\n")
    client = fence_client(fence)
    client._renew_fence(100.0, 0.0)
    await client.fence_settled()
    assert not fence.exists()


async def test_the_fence_is_written_off_the_event_loop_the_newest_deadline_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fsync blocked the agent's loop for milliseconds; a write now runs in a thread.
    While one is under way the loop goes on and the file keeps the older (earlier)
    deadline; deadlines asked for meanwhile collapse into one write of the newest."""
    fence = tmp_path / "fence"
    client = fence_client(fence)
    entered = threading.Event()
    release = threading.Event()
    written: list[float] = []

    def slow_write(path: Path, deadline_mono: float) -> None:
        entered.set()
        assert release.wait(30)
        write_fence(path, deadline_mono)
        written.append(deadline_mono)

    monkeypatch.setattr(heartbeat, "write_fence", slow_write)
    client._renew_fence(100.0, 10.0)
    assert await asyncio.to_thread(entered.wait, 30)  # the write is under way, blocked
    client._renew_fence(102.0, 10.0)  # the loop is free: more acknowledged heartbeats
    client._renew_fence(104.0, 10.0)
    assert not fence.exists() and client.fence_written == 0.0  # nothing landed yet
    release.set()
    await client.fence_settled()
    assert written == [110.0, 114.0]  # 112 was overtaken before its turn
    assert float(fence.read_text()) == 114.0 == client.fence_written


async def test_a_failed_fence_write_is_tried_again_at_the_next_heartbeat(
    tmp_path: Path,
) -> None:
    fence = tmp_path / "missing" / "fence"  # no such directory: the write fails
    client = fence_client(fence)
    client._renew_fence(100.0, 10.0)
    await client.fence_settled()
    assert client.fence_written == 0.0
    fence.parent.mkdir()
    client._renew_fence(100.1, 10.0)  # within a tenth of the lease, but nothing is on disk
    await client.fence_settled()
    assert float(fence.read_text()) == 110.1


class EventJournal(EmptyJournal):
    """Subjob events the test adds, kept until the router acknowledges them."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[EventRow] = []

    def add(self, seq: int) -> None:
        self.pending.append(EventRow(seq, f"s-{seq}", "SUCCEEDED", "exited 0", 1.0, False))

    def unacked_events(self, limit: int = 1000) -> list[EventRow]:
        return list(self.pending)

    def ack_events(self, up_to_seq: int) -> int:
        self.pending = [e for e in self.pending if e.seq > up_to_seq]
        return 1


class AckingZone(RecordingZone):
    """Acknowledges every event at once; its period is long, so only events wake a beat."""

    def Heartbeat(
        self, request: zone_pb2.HeartbeatRequest, context: Any
    ) -> zone_pb2.HeartbeatReply:
        with self.lock:
            self.requests.append(request)
        return zone_pb2.HeartbeatReply(
            acked_seq=max((e.seq for e in request.events), default=0), period_seconds=60.0
        )


async def test_events_of_a_burst_share_one_heartbeat_and_a_quiet_spells_first_goes_at_once(
    tmp_path: Path,
) -> None:
    """A pass an event wakes within ``event_gap_seconds`` of the last one an event woke
    waits out the gap, so the events that arrive meanwhile ride together; after a quiet
    spell (the test's clock moves on) the first event is sent without waiting."""
    servicer = AckingZone()
    journal = EventJournal()
    now = [1000.0]
    with serving(servicer) as address:
        client = HeartbeatClient(
            address, 60.0, common_pb2.AgentSummary, journal, event, use_stream=False,
            event_gap_seconds=60.0, clock=lambda: now[0],
        )  # fmt: skip
        stop = asyncio.Event()
        run = asyncio.create_task(client.run(stop), name="test-heartbeat")

        async def beats_after(seq: int) -> list[list[int]]:
            journal.add(seq)
            client.wake.set()
            count = len(servicer.snapshot())
            await until(lambda: len(servicer.snapshot()) > count, 10.0)  # within 10 s, not 60
            return [[e.seq for e in r.events] for r in servicer.snapshot()]

        await until(lambda: len(servicer.snapshot()) == 1)  # the first beat, at start
        assert (await beats_after(1))[1:] == [[1]]  # the first event ever: at once
        now[0] += 61.0  # a quiet spell longer than the gap
        assert (await beats_after(2))[2:] == [[2]]  # at once again
        client.event_gap_seconds = 1.0  # the next woken beat waits one real second
        for seq in range(3, 8):  # five events, each after the client has run again
            journal.add(seq)
            client.wake.set()
            await asyncio.sleep(0)
        await until(lambda: len(servicer.snapshot()) == 4)
        stop.set()
        await run
    *_, last = servicer.snapshot()
    assert [e.seq for e in last.events] == [3, 4, 5, 6, 7]  # one beat, after the gap
    assert not journal.pending
