"""The serving end of a stream of followed calls (FollowServer): each call's items until
its last, calls ready at once sent together, a failing call ending alone, bounded calls in
hand, and what happens to them when the stream goes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from laminar_base.callstream import FollowServer
from laminar_base.errors import InvalidArgument, PermissionDenied


@dataclass
class Call:
    call_id: int
    items: list[str] = field(default_factory=list)
    #: Set to let the call give its items (each item then waits for ``step``).
    go: asyncio.Event = field(default_factory=asyncio.Event)
    fails: Exception | None = None
    cancelled: bool = False


@dataclass(frozen=True)
class Event:
    call_id: int
    item: str
    last: bool


class Requests:
    """A caller's requests; counts how many the server has read; keeps the stream open
    until ``close`` is set when ``hold``."""

    def __init__(self, calls: list[Call], *, hold: bool = False) -> None:
        self.calls = calls
        self.read = 0
        self.hold = hold
        self.close = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[Call]:
        for call in self.calls:
            self.read += 1
            yield call
        if self.hold:
            await self.close.wait()


async def follow(call: Call) -> AsyncIterator[str]:
    try:
        await call.go.wait()
        for item in call.items:
            yield item
        if call.fails is not None:
            raise call.fails
    except asyncio.CancelledError:
        call.cancelled = True
        raise


def server(limit: int = 16) -> FollowServer[Call, str, Event, list[Event]]:
    return FollowServer(
        follow,
        reply=lambda call, item, last: Event(call.call_id, item, last),
        error_reply=lambda call, code, details: Event(call.call_id, f"{code}: {details}", True),
        is_last=lambda item: item.startswith("end"),
        batch=list,
        limit=limit,
    )


async def test_each_call_is_followed_to_its_last_item_and_ready_events_go_together() -> None:
    calls = [Call(1, ["a", "end1", "never"]), Call(2, ["b", "end2"])]
    for call in calls:
        call.go.set()
    batches = [batch async for batch in server().serve(Requests(calls))]  # type: ignore[arg-type]
    events = [event for batch in batches for event in batch]
    assert [e for e in events if e.call_id == 1] == [Event(1, "a", False), Event(1, "end1", True)]
    assert [e for e in events if e.call_id == 2] == [Event(2, "b", False), Event(2, "end2", True)]
    assert len(batches) < len(events)  # both calls' first items were ready at once


async def test_a_failing_call_ends_with_its_error_and_the_others_go_on() -> None:
    bad = Call(1, ["a"], fails=PermissionDenied("tenant: not yours"))
    good = Call(2, ["end"])
    bad.go.set()
    good.go.set()
    events = [e async for b in server().serve(Requests([bad, good])) for e in b]  # type: ignore[arg-type]
    assert [e for e in events if e.call_id == 1] == [
        Event(1, "a", False),
        Event(1, "PERMISSION_DENIED: tenant: not yours", True),
    ]
    assert [e for e in events if e.call_id == 2] == [Event(2, "end", True)]


async def test_items_that_end_without_a_last_one_close_the_call_with_the_latest_as_last() -> None:
    calls = [Call(1, ["a", "b"]), Call(2, [])]
    for call in calls:
        call.go.set()
    events = [e async for b in server().serve(Requests(calls)) for e in b]  # type: ignore[arg-type]
    assert [e for e in events if e.call_id == 1] == [
        Event(1, "a", False),
        Event(1, "b", False),
        Event(1, "b", True),
    ]
    assert [e for e in events if e.call_id == 2] == [
        Event(2, "INTERNAL: the call ended with no answer", True)
    ]


async def test_at_most_limit_calls_in_hand_and_a_half_close_waits_for_them() -> None:
    calls = [Call(i, [f"end{i}"]) for i in range(1, 4)]
    requests = Requests(calls)
    out: list[Event] = []

    async def collect() -> None:
        async for batch in server(limit=2).serve(requests):  # type: ignore[arg-type]
            out.extend(batch)

    task = asyncio.create_task(collect())
    while requests.read < 2:
        await asyncio.sleep(0)
    for _ in range(10):  # turns of the loop: the third is not read while two are in hand
        await asyncio.sleep(0)
    assert requests.read == 2 and not out
    calls[0].go.set()
    while requests.read < 3:
        await asyncio.sleep(0)
    calls[1].go.set()
    calls[2].go.set()
    await task  # half-closed: ends once every call in hand has ended
    assert sorted(e.call_id for e in out) == [1, 2, 3] and all(e.last for e in out)


async def test_a_call_id_in_hand_ends_the_stream_naming_the_field() -> None:
    first, again = Call(1, ["end"]), Call(1, ["end"])
    with pytest.raises(InvalidArgument) as err:
        async for _ in server().serve(Requests([first, again])):  # type: ignore[arg-type]
            pass
    assert err.value.field == "call_id"
    assert first.cancelled  # nobody reads its events any more


async def test_a_stream_gone_cancels_the_calls_in_hand() -> None:
    calls = [Call(1, ["end"]), Call(2, ["end"])]
    requests = Requests(calls, hold=True)
    stream = server().serve(requests)  # type: ignore[arg-type]
    waiting = asyncio.ensure_future(anext(stream))
    while requests.read < 2:
        await asyncio.sleep(0)
    waiting.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await stream.aclose()
    assert all(call.cancelled for call in calls)
