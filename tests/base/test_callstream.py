"""The serving end of a call stream: concurrent calls, bounded, answered as they end;
what happens to the calls in hand when the stream goes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from laminar_base.callstream import CallServer


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
