"""The serving end of a call stream: concurrent calls, bounded, answered as they end;
what happens to the calls in hand when the stream goes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from laminar_base.callstream import CallClient, CallServer, StreamTasks
from laminar_base.errors import Unavailable
from laminar_base.grpcutil import rpc_error


@dataclass
class Call:
    call_id: int
    done: asyncio.Event = field(default_factory=asyncio.Event)
    fails: bool = False


@dataclass
class Reply:
    call_id: int


class Requests:
    """A caller's requests; counts how many the server has read."""

    def __init__(self, calls: list[Call], *, close_after: bool = True) -> None:
        self.calls = calls
        self.read = 0
        self.close_after = close_after
        self.hold = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[Call]:
        for call in self.calls:
            self.read += 1
            yield call
        if not self.close_after:
            await self.hold.wait()  # the caller keeps the stream open


async def handle(call: Call) -> Reply:
    await call.done.wait()
    if call.fails:
        raise RuntimeError("a bug in the handler")
    return Reply(call.call_id)


async def _collect(server: CallServer[Any, Any], requests: Requests, out: list[int]) -> None:
    async for reply in server.serve(requests):  # type: ignore[arg-type]
        out.append(reply.call_id)


async def test_calls_run_together_and_answer_as_they_end_then_the_half_closed_stream_ends() -> None:
    calls = [Call(1), Call(2), Call(3)]
    kept: set[asyncio.Task[Any]] = set()
    out: list[int] = []
    server = CallServer(handle, keep_running=kept)
    serving = asyncio.ensure_future(_collect(server, Requests(calls), out))
    for ended, call in enumerate((calls[2], calls[0], calls[1]), 1):  # each ends while
        call.done.set()  # the others still run
        while len(out) < ended:
            await asyncio.sleep(0)
    await asyncio.wait_for(serving, 10)  # requests ended: the stream ends once all answered
    assert out == [3, 1, 2]
    assert not kept


async def test_at_most_limit_calls_in_hand() -> None:
    calls = [Call(1), Call(2), Call(3)]
    requests = Requests(calls, close_after=False)
    out: list[int] = []
    serving = asyncio.ensure_future(_collect(CallServer(handle, limit=2), requests, out))
    while requests.read < 2:
        await asyncio.sleep(0)
    for _ in range(20):  # the third is not read while two are in hand
        await asyncio.sleep(0)
    assert requests.read == 2
    calls[0].done.set()  # its room goes to the third
    while requests.read < 3:
        await asyncio.sleep(0)
    calls[1].done.set()
    calls[2].done.set()
    requests.hold.set()
    await asyncio.wait_for(serving, 10)
    assert sorted(out) == [1, 2, 3]


async def test_a_handler_that_raises_ends_the_stream_with_it() -> None:
    calls = [Call(1, fails=True), Call(2)]
    out: list[int] = []
    serving = asyncio.ensure_future(
        _collect(CallServer(handle), Requests(calls, close_after=False), out)
    )
    calls[0].done.set()
    with pytest.raises(RuntimeError, match="a bug in the handler"):
        await asyncio.wait_for(serving, 10)
    assert out == []


@dataclass
class ErrorReply:
    call_id: int
    code: str
    details: str


async def test_a_failed_call_answers_with_its_error_reply_and_the_stream_goes_on() -> None:
    calls = [Call(1, fails=True), Call(2)]
    replies: list[Any] = []

    def error_reply(call: Call, code: str, details: str) -> Any:
        return ErrorReply(call.call_id, code, details)

    server = CallServer(handle, error_reply=error_reply)
    for call in calls:
        call.done.set()
    async for reply in server.serve(Requests(calls)):  # type: ignore[arg-type]
        replies.append(reply)
    # Not a LaminarError: INTERNAL with the type's name, as a unary call's status.
    assert ErrorReply(1, "INTERNAL", "internal error: RuntimeError") in replies
    assert Reply(2) in replies and len(replies) == 2


async def test_a_stream_gone_leaves_its_calls_to_finish_held_when_asked() -> None:
    calls = [Call(1)]
    requests = Requests(calls, close_after=False)
    kept: set[asyncio.Task[Any]] = set()
    out: list[int] = []
    serving = asyncio.ensure_future(_collect(CallServer(handle, keep_running=kept), requests, out))
    while requests.read < 1:
        await asyncio.sleep(0)
    serving.cancel()  # the caller went
    await asyncio.gather(serving, return_exceptions=True)
    assert len(kept) == 1  # still running, still referenced
    (task,) = kept
    calls[0].done.set()
    await task
    assert not kept and out == []


async def test_a_stream_gone_cancels_its_calls_otherwise() -> None:
    calls = [Call(1)]
    requests = Requests(calls, close_after=False)
    out: list[int] = []
    serving = asyncio.ensure_future(_collect(CallServer(handle), requests, out))
    while requests.read < 1:
        await asyncio.sleep(0)
    for _ in range(5):  # the call is in hand, waiting
        await asyncio.sleep(0)
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)
    handlers = [t for t in asyncio.all_tasks() if t.get_name() == "call"]
    assert handlers == []  # cancelled and awaited, none left


async def test_a_caller_that_reads_no_replies_holds_at_most_limit_of_them() -> None:
    calls = [Call(i) for i in range(50)]
    for call in calls:
        call.done.set()
    requests = Requests(calls, close_after=False)
    replies = CallServer(handle, limit=3).serve(requests)  # type: ignore[arg-type]
    first = await anext(replies)  # the writer takes one reply, then stops reading
    for _ in range(50):
        await asyncio.sleep(0)
    assert first.call_id == 0
    # The reply taken counts until the writer comes back for the next (its write done):
    # three in hand, none more read however long the caller reads nothing.
    assert requests.read == 3
    await replies.aclose()


# -- the calling end ----------------------------------------------------------------------


@dataclass
class Request:
    call_id: int = 0


class PeerStream:
    """A peer's stream in memory: writes can be held; replies and the stream's end are
    the test's to give; a write after the end raises as gRPC's does."""

    def __init__(self, *, hold_writes: bool = False) -> None:
        self.written: list[int] = []
        self.replies: asyncio.Queue[Any] = asyncio.Queue()
        self.hold_writes = hold_writes
        self.cancelled = False
        self.ended = False

    async def write(self, request: Request) -> None:
        if self.ended:
            raise asyncio.InvalidStateError("RPC already finished.")
        if self.hold_writes:
            await asyncio.Event().wait()  # a peer that reads nothing: flow control holds
        self.written.append(request.call_id)

    async def read(self) -> Any:
        item = await self.replies.get()
        if isinstance(item, BaseException):
            self.ended = True
            raise item
        return item

    def end(self, code: grpc.StatusCode) -> None:
        self.replies.put_nowait(rpc_error(code.name, "ended by the test"))

    def cancel(self) -> bool:
        self.cancelled = True
        self.end(grpc.StatusCode.CANCELLED)
        return True


class Peer:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.streams: list[PeerStream] = []

    def open(self) -> PeerStream:
        self.streams.append(PeerStream(**self.kwargs))
        return self.streams[-1]


async def test_calls_are_answered_by_id_in_any_order() -> None:
    peer = Peer()
    client: CallClient[Request, Reply] = CallClient(peer.open)
    calls = [asyncio.ensure_future(client.call(Request(), 10)) for _ in range(3)]
    while not peer.streams or len(peer.streams[0].written) < 3:
        await asyncio.sleep(0)
    for call_id in (3, 1, 2):
        peer.streams[0].replies.put_nowait(Reply(call_id))
    assert [(await c).call_id for c in calls] == [1, 2, 3]
    await client.close()


async def test_a_peer_that_reads_nothing_times_calls_out_and_its_stream_is_ended() -> None:
    peer = Peer(hold_writes=True)
    client: CallClient[Request, Reply] = CallClient(peer.open)
    outcomes = await asyncio.gather(
        *(client.call(Request(), 0.05) for _ in range(5)), return_exceptions=True
    )
    # Each call ended at its deadline, not behind the held write.
    assert all(
        isinstance(o, grpc.aio.AioRpcError) and o.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        for o in outcomes
    ), outcomes
    assert peer.streams[0].cancelled  # the write was held past a call's timeout
    peer.kwargs["hold_writes"] = False
    later = asyncio.ensure_future(client.call(Request(), 10))
    while len(peer.streams) < 2 or not peer.streams[1].written:
        await asyncio.sleep(0)
    peer.streams[1].replies.put_nowait(Reply(peer.streams[1].written[0]))
    assert (await later).call_id == peer.streams[1].written[0]
    await client.close()


async def test_a_cancelled_caller_leaves_the_stream_and_the_others_alone() -> None:
    peer = Peer()
    client: CallClient[Request, Reply] = CallClient(peer.open)
    gone = asyncio.ensure_future(client.call(Request(), 10))
    kept = asyncio.ensure_future(client.call(Request(), 10))
    await asyncio.sleep(0)
    gone.cancel()
    while not peer.streams or not peer.streams[0].written:
        await asyncio.sleep(0)
    assert peer.streams[0].written == [2]  # the gone caller's request was never sent
    peer.streams[0].replies.put_nowait(Reply(2))
    assert (await kept).call_id == 2
    assert not peer.streams[0].cancelled
    await client.close()


@pytest.mark.parametrize(
    ("ended", "seen"),
    [
        (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNIMPLEMENTED),  # nothing handled
        (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.PERMISSION_DENIED),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE),  # may have been
        (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE),
    ],
)
async def test_a_stream_that_ends_fails_its_calls_with_what_its_end_says_of_them(
    ended: grpc.StatusCode, seen: grpc.StatusCode
) -> None:
    peer = Peer()
    client: CallClient[Request, Reply] = CallClient(peer.open)
    first = asyncio.ensure_future(client.call(Request(), 10))
    while not peer.streams or not peer.streams[0].written:
        await asyncio.sleep(0)
    peer.streams[0].end(ended)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await first
    assert failed.value.code() == seen
    await client.close()


async def test_a_write_after_the_stream_ended_fails_with_the_streams_own_status() -> None:
    """The race of an older peer: the stream has ended UNIMPLEMENTED before the write
    (which gRPC then refuses as 'RPC already finished'); the call still reads
    UNIMPLEMENTED, the status that lets its caller send it another way."""
    peer = Peer()
    client: CallClient[Request, Reply] = CallClient(peer.open)
    call = asyncio.ensure_future(client.call(Request(), 10))
    await asyncio.sleep(0)
    peer.streams[0].ended = True  # the write below fails as on a finished RPC
    peer.streams[0].end(grpc.StatusCode.UNIMPLEMENTED)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await call
    assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED
    await client.close()


async def _numbers(cleaned: list[str]) -> AsyncIterator[int]:
    """0, 1, 2, ... each when asked; says when it was closed."""
    try:
        n = 0
        while True:
            yield n
            n += 1
    finally:
        cleaned.append("closed")


async def test_a_shutdown_lets_a_send_under_way_finish_then_ends_the_stream() -> None:
    """gRPC sends each item after the servicer's ``yield``, outside the generator: a cancel
    landing in that send would end the call with no status and hold the server's grace."""
    streams = StreamTasks("shutting down")
    cleaned: list[str] = []
    sent: list[int] = []
    sending, send_done = asyncio.Event(), asyncio.Event()

    async def handler() -> None:  # as gRPC drives a servicer: take an item, then send it
        async for item in streams.serve(_numbers(cleaned)):
            sending.set()
            await send_done.wait()  # the send
            sent.append(item)

    task = asyncio.ensure_future(handler())
    await sending.wait()
    assert streams.stop_all() == 1
    send_done.set()
    with pytest.raises(Unavailable, match="shutting down"):
        await task
    assert sent == [0]  # the send under way finished; nothing went after it
    assert cleaned == ["closed"] and len(streams) == 0


async def test_a_shutdown_ends_a_waiting_stream_and_refuses_new_ones() -> None:
    streams = StreamTasks("shutting down")
    cleaned: list[str] = []
    first = asyncio.Event()

    async def quiet() -> AsyncIterator[int]:  # one item, then nothing, ever
        try:
            yield 1
            await asyncio.Event().wait()
            yield 2
        finally:
            cleaned.append("closed")

    async def handler() -> list[int]:
        got = []
        async for item in streams.serve(quiet()):
            got.append(item)
            first.set()
        return got

    task = asyncio.ensure_future(handler())
    await first.wait()  # the handler went on to wait for the next item
    assert streams.stop_all() == 1
    with pytest.raises(Unavailable):
        await task
    assert cleaned == ["closed"] and len(streams) == 0
    assert not task.cancelled()  # the cancel was answered, not left on the task
    late = streams.serve(_numbers(cleaned))
    with pytest.raises(Unavailable):
        await anext(late)  # opened after the shutdown began
