"""The router's agent calls: what one event-loop tick sends an agent goes as one call,
over the agent's call stream, or unary calls to an agent that serves none (every test
runs both ways)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from corekit import FakeCallStream

from laminar_api.v1 import agent_pb2
from laminar_zone.placer import AgentCalls

#: How the stubs below serve: "stream" (the ``Calls`` stream), "unary" (an older agent:
#: its stream ends UNIMPLEMENTED).
TRANSPORT = ["stream", "unary"]


@pytest.fixture(params=TRANSPORT, autouse=True)
def transport(request: pytest.FixtureRequest) -> str:
    CountingStub.serves_stream = request.param == "stream"
    return str(request.param)


def lone(transport: str) -> str:
    """What a probe alone in its tick travels as."""
    return "ProbeBatch" if transport == "stream" else "Probe"


def _status(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, "")


class CountingStub:
    """An agent that grants every probe and records each call it receives."""

    serves_stream = True

    def __init__(
        self, fail: bool = False, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    ) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.fail = fail
        self.code = code
        #: probe id -> (status name, message): that probe of a batch fails on its own.
        self.refuse: dict[str, tuple[str, str]] = {}

    def _check(self) -> None:
        if self.fail:
            raise grpc.aio.AioRpcError(
                self.code, grpc.aio.Metadata(), grpc.aio.Metadata(), "down", ""
            )

    def _reply(self, request: agent_pb2.ProbeRequest) -> agent_pb2.ProbeReply:
        if request.probe_id in self.refuse:
            code, message = self.refuse[request.probe_id]
            return agent_pb2.ProbeReply(error=agent_pb2.ProbeError(code=code, message=message))
        return agent_pb2.ProbeReply(lease=agent_pb2.Lease(lease_id=f"l-{request.probe_id}"))

    async def Probe(self, request: agent_pb2.ProbeRequest, timeout: float = 0) -> Any:
        self.calls.append(("Probe", [request.probe_id]))
        self._check()
        return self._reply(request)

    async def ProbeBatch(self, request: agent_pb2.ProbeBatchRequest, timeout: float = 0) -> Any:
        self.calls.append(("ProbeBatch", [p.probe_id for p in request.probes]))
        self._check()
        return agent_pb2.ProbeBatchReply(replies=[self._reply(p) for p in request.probes])

    async def Release(self, request: agent_pb2.ReleaseRequest, timeout: float = 0) -> Any:
        self.calls.append(("Release", list(request.lease_ids)))
        self._check()
        return agent_pb2.ReleaseReply(released=len(request.lease_ids))

    def Calls(self) -> FakeCallStream:
        self.streams = getattr(self, "streams", [])
        self.streams.append(FakeCallStream(self, serves=self.serves_stream))
        return self.streams[-1]


class Clients:
    def __init__(self, stubs: dict[str, CountingStub]) -> None:
        self.stubs = stubs

    def stub(self, address: str) -> CountingStub:
        return self.stubs[address]


def _probe(probe_id: str, commit: bool = False) -> agent_pb2.ProbeRequest:
    return agent_pb2.ProbeRequest(probe_id=probe_id, job_id=probe_id, commit_if_fits=commit)


async def test_one_tick_of_probes_and_releases_is_one_call_per_agent(transport: str) -> None:
    a, b = CountingStub(), CountingStub()
    calls = AgentCalls(Clients({"a": a, "b": b}), lambda: 5.0)  # type: ignore[arg-type]
    replies = await asyncio.gather(
        calls.probe("a", _probe("p1")),
        calls.probe("b", _probe("p2")),
        calls.probe("a", _probe("p3")),
    )
    assert [r.lease.lease_id for r in replies] == ["l-p1", "l-p2", "l-p3"]
    assert a.calls == [("ProbeBatch", ["p1", "p3"])]
    assert b.calls == [(lone(transport), ["p2"])]  # alone: a plain Probe unary
    released = await asyncio.gather(calls.release("a", ["x"]), calls.release("a", ["y", "z"]))
    assert [r.released for r in released] == [3, 3]  # both answered by the one call
    assert a.calls[-1] == ("Release", ["x", "y", "z"])
    await calls.probe("a", _probe("p4"))  # a later tick: a call of its own
    assert a.calls[-1] == (lone(transport), ["p4"])


async def test_a_failed_call_fails_every_probe_in_it() -> None:
    down = CountingStub(fail=True)
    calls = AgentCalls(Clients({"a": down}), lambda: 5.0)  # type: ignore[arg-type]
    outcomes = await asyncio.gather(
        calls.probe("a", _probe("p1")), calls.probe("a", _probe("p2")), return_exceptions=True
    )
    assert all(isinstance(o, grpc.aio.AioRpcError) for o in outcomes)
    assert down.calls == [("ProbeBatch", ["p1", "p2"])]
    with pytest.raises(grpc.aio.AioRpcError):
        await calls.release("a", ["x"])


async def test_a_cancelled_caller_leaves_the_others_answered(transport: str) -> None:
    a = CountingStub()
    calls = AgentCalls(Clients({"a": a}), lambda: 5.0)  # type: ignore[arg-type]
    gone = asyncio.ensure_future(calls.probe("a", _probe("p1")))
    kept = asyncio.ensure_future(calls.probe("a", _probe("p2")))
    await asyncio.sleep(0)  # both queued
    gone.cancel()
    assert (await kept).lease.lease_id == "l-p2"
    assert a.calls == [(lone(transport), ["p2"])]


class GatedStub(CountingStub):
    """Holds every call until ``gate`` is set; ``arrived`` is set on each call."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.arrived = asyncio.Event()

    async def Probe(self, request: agent_pb2.ProbeRequest, timeout: float = 0) -> Any:
        self.calls.append(("Probe", [request.probe_id]))
        self.arrived.set()
        await self.gate.wait()
        return self._reply(request)

    async def ProbeBatch(self, request: agent_pb2.ProbeBatchRequest, timeout: float = 0) -> Any:
        self.calls.append(("ProbeBatch", [p.probe_id for p in request.probes]))
        self.arrived.set()
        await self.gate.wait()
        return agent_pb2.ProbeBatchReply(replies=[self._reply(p) for p in request.probes])


async def test_probes_wait_for_the_call_in_flight_then_go_together(transport: str) -> None:
    a = GatedStub()
    calls = AgentCalls(Clients({"a": a}), lambda: 5.0, hold_seconds=60)  # type: ignore[arg-type]
    first = asyncio.ensure_future(calls.probe("a", _probe("p1")))
    await asyncio.wait_for(a.arrived.wait(), 10)
    a.arrived.clear()
    later = [asyncio.ensure_future(calls.probe("a", _probe(f"p{i}"))) for i in (2, 3, 4)]
    await asyncio.sleep(0)  # they are queued behind p1's call, which has not returned
    assert a.calls == [(lone(transport), ["p1"])]
    a.gate.set()
    assert (await first).lease.lease_id == "l-p1"
    assert [(await f).lease.lease_id for f in later] == ["l-p2", "l-p3", "l-p4"]
    assert a.calls == [(lone(transport), ["p1"]), ("ProbeBatch", ["p2", "p3", "p4"])]


async def test_an_agent_slow_to_answer_holds_the_next_probes_only_so_long(
    transport: str,
) -> None:
    a = GatedStub()
    calls = AgentCalls(Clients({"a": a}), lambda: 5.0, hold_seconds=0.01)  # type: ignore[arg-type]
    first = asyncio.ensure_future(calls.probe("a", _probe("p1")))
    await asyncio.wait_for(a.arrived.wait(), 10)
    a.arrived.clear()
    second = asyncio.ensure_future(calls.probe("a", _probe("p2")))
    # p1's call never returns until the gate opens: p2 goes on its own after the hold.
    await asyncio.wait_for(a.arrived.wait(), 10)
    assert a.calls == [(lone(transport), ["p1"]), (lone(transport), ["p2"])]
    a.gate.set()
    assert [(await f).lease.lease_id for f in (first, second)] == ["l-p1", "l-p2"]


async def test_a_probe_the_agent_refuses_in_a_batch_fails_alone() -> None:
    a = CountingStub()
    a.refuse["p2"] = ("INVALID_ARGUMENT", "probes[1].spec.command: is required")
    calls = AgentCalls(Clients({"a": a}), lambda: 5.0)  # type: ignore[arg-type]
    outcomes = await asyncio.gather(
        calls.probe("a", _probe("p1", commit=True)),
        calls.probe("a", _probe("p2", commit=True)),
        calls.probe("a", _probe("p3")),
        return_exceptions=True,
    )
    assert a.calls == [("ProbeBatch", ["p1", "p2", "p3"])]
    first, refused, third = outcomes
    assert isinstance(first, agent_pb2.ProbeReply) and first.lease.lease_id == "l-p1"
    assert isinstance(third, agent_pb2.ProbeReply) and third.lease.lease_id == "l-p3"
    # The refusal reads as the same probe refused in a call of its own.
    assert isinstance(refused, grpc.aio.AioRpcError)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details() == "probes[1].spec.command: is required"


@pytest.mark.parametrize(
    ("code", "commit_unknown"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, True),  # an older agent: one probe's refusal
        (grpc.StatusCode.DEADLINE_EXCEEDED, True),
        (grpc.StatusCode.UNAUTHENTICATED, False),  # refused before any probe was handled
    ],
)
async def test_a_batch_failed_as_a_whole_leaves_its_commits_unknown(
    code: grpc.StatusCode, commit_unknown: bool
) -> None:
    """An agent that fails a whole batch may have committed some of its commit-carrying
    probes before another failed: those read as outcome unknown (not as the call's
    refusal), unless the call was refused before any handler ran."""
    down = CountingStub(fail=True, code=code)
    calls = AgentCalls(Clients({"a": down}), lambda: 5.0)  # type: ignore[arg-type]
    committing, plain = await asyncio.gather(
        calls.probe("a", _probe("c1", commit=True)),
        calls.probe("a", _probe("p2")),
        return_exceptions=True,
    )
    assert down.calls == [("ProbeBatch", ["c1", "p2"])]
    assert isinstance(plain, grpc.aio.AioRpcError) and plain.code() == code
    if commit_unknown:
        assert isinstance(committing, RuntimeError) and "outcome unknown" in str(committing)
    else:
        assert isinstance(committing, grpc.aio.AioRpcError) and committing.code() == code


async def test_the_hook_before_probes_runs_before_any_probe_leaves() -> None:
    """The router commits its grouped journal writes there (a commit on probe's intent);
    a hook that fails sends none of the call's probes and fails each, as the call would."""
    a = CountingStub()
    calls = AgentCalls(Clients({"a": a}), lambda: 5.0)  # type: ignore[arg-type]
    seen: list[int] = []
    calls.before_probes = lambda: seen.append(len(a.calls))
    await asyncio.gather(
        calls.probe("a", _probe("p1", commit=True)), calls.probe("a", _probe("p2"))
    )
    await calls.release("a", ["x"])
    assert seen == [0] and a.calls[0] == ("ProbeBatch", ["p1", "p2"])  # once, before it

    def broken() -> None:
        raise OSError("disk full")

    calls.before_probes = broken
    results = await asyncio.gather(calls.probe("a", _probe("p3")), return_exceptions=True)
    assert isinstance(results[0], OSError)
    assert [c for c in a.calls if "p3" in c[1]] == []


# -- the call stream itself (stream transport only) ------------------------------------

only_stream = pytest.mark.parametrize("transport", ["stream"])


@pytest.mark.parametrize("transport", ["unary"])
async def test_an_agent_without_the_stream_gets_unary_calls_without_asking_again(
    transport: str,
) -> None:
    CountingStub.serves_stream = False
    old = CountingStub()
    calls = AgentCalls(Clients({"a": old}), lambda: 5.0)  # type: ignore[arg-type]
    for tick in range(3):
        reply = await calls.probe("a", _probe(f"p{tick}"))
        assert reply.lease.lease_id == f"l-p{tick}"
    assert (await calls.release("a", ["x"])).released == 1
    assert old.calls == [
        ("Probe", ["p0"]),
        ("Probe", ["p1"]),
        ("Probe", ["p2"]),
        ("Release", ["x"]),
    ]
    assert len(old.streams) == 1  # refused once, then not asked again


@only_stream
async def test_a_stream_that_fails_fails_its_calls_and_the_next_opens_another(
    transport: str,
) -> None:
    CountingStub.serves_stream = True
    a = GatedStub()
    calls = AgentCalls(Clients({"a": a}), lambda: 5.0)  # type: ignore[arg-type]
    held = asyncio.ensure_future(calls.probe("a", _probe("p1")))
    await asyncio.wait_for(a.arrived.wait(), 10)
    a.streams[0].replies.put_nowait(_status(grpc.StatusCode.UNAVAILABLE, "agent gone"))
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await held
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    a.gate.set()
    assert (await calls.probe("a", _probe("p2"))).lease.lease_id == "l-p2"
    assert len(a.streams) == 2
    await calls.close()


@only_stream
async def test_a_call_unanswered_in_time_is_deadline_exceeded_and_its_late_reply_dropped(
    transport: str,
) -> None:
    CountingStub.serves_stream = True
    a = GatedStub()
    calls = AgentCalls(Clients({"a": a}), lambda: 0.05)  # type: ignore[arg-type]
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await calls.probe("a", _probe("p1"))
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    a.gate.set()
    await asyncio.gather(*a.streams[0].tasks)  # p1's reply arrives, to no one
    assert (await calls.probe("a", _probe("p2"))).lease.lease_id == "l-p2"
    assert len(a.streams) == 1  # the stream outlived the late call
    await calls.close()
