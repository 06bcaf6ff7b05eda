"""Independent calls over one long-lived gRPC stream, both ends.

A unary gRPC call has a fixed cost on both ends (a new HTTP/2 stream, headers, status,
the call objects): in grpc.aio about 0.4-0.5 ms of server CPU and 0.3 ms of client CPU
on a 2-core VM, against 0.1-0.2 ms each for a message on a stream that stays open.
A caller that makes many small calls to one peer (the router's probes and releases to an
agent) sends them as messages of one stream instead: each request carries a
``call_id``, each reply names the call it answers, replies come in the order the calls
end. A call's failure is its reply's error; the stream's status is the stream's own.

:class:`CallServer` is the serving end (an async generator, as the servicer of a
bidirectional method must be under the auth interceptors); :class:`CallClient` the
calling end, one per peer, which opens the stream on first use and again after it ends.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

import grpc

from laminar_base.errors import Unavailable
from laminar_base.grpcutil import error_status, rpc_error

log = logging.getLogger("laminar.grpc.calls")

#: Calls one stream may have in hand at once; beyond it the server reads no more
#: requests until one ends (gRPC's flow control then holds the caller back).
MAX_CALLS_IN_FLIGHT = 256


class _HasCallId(Protocol):
    call_id: int


Q = TypeVar("Q", bound=_HasCallId)
R = TypeVar("R", bound=_HasCallId)
T = TypeVar("T")


class CallServer(Generic[Q, R]):
    """Serves one stream: each request is handled in a task of its own; at most
    ``limit`` calls are in hand at a time, a call counting until its reply has been
    written (beyond that no request is read, so that gRPC's flow control holds the
    caller back, and a caller that reads no replies holds at most ``limit`` of them);
    each reply goes out when its call ends, from one writer (the servicer iterating
    :meth:`serve`). A call's own failure is its reply: ``error_reply`` builds it from the
    call and the status name and details :func:`error_status` reads from the exception,
    as a unary call's status would carry them. Without ``error_reply``, or if it raises,
    the exception ends the stream with it, as a failed read of the requests does.

    When the caller half-closes, the calls in hand finish and answer before the stream
    ends. When the stream goes first (caller gone, deadline, authorization ended), what
    happens to the calls in hand is the caller's choice: with ``keep_running`` (a set)
    they run to their end held there, as a unary handler that already acted would (an
    agent's commit that started launches, and is reported by heartbeat); without, they
    are cancelled and awaited (nobody reads their replies). Either way no task is left
    unreferenced."""

    def __init__(
        self,
        handle: Callable[[Q], Coroutine[Any, Any, R]],
        *,
        error_reply: Callable[[Q, str, str], R] | None = None,
        limit: int = MAX_CALLS_IN_FLIGHT,
        keep_running: set[asyncio.Task[Any]] | None = None,
        name: str = "call",
    ) -> None:
        self._handle = handle
        self._error_reply = error_reply
        self._limit = limit
        self._keep_running = keep_running
        self._name = name
        self._reader: asyncio.Task[None] | None = None
        self._reading = False
        #: Set by :meth:`stop`: the stream ended with the calls read answered, the rest
        #: unread (the servicer then ends the call UNAVAILABLE).
        self.stopped = False

    def stop(self) -> None:
        """Shutting down: read no more calls; those in hand finish and answer, then
        :meth:`serve` ends (with :attr:`stopped` set)."""
        self.stopped = True
        if self._reading and self._reader is not None:
            self._reader.cancel()

    async def serve(self, requests: AsyncIterator[Q]) -> AsyncIterator[R]:
        replies: asyncio.Queue[Any] = asyncio.Queue()
        room = asyncio.Semaphore(self._limit)
        in_hand: set[asyncio.Task[None]] = set()

        async def one(request: Q) -> None:
            try:
                reply = await self._answer(request)
            except asyncio.CancelledError:
                room.release()
                raise
            except Exception as exc:
                replies.put_nowait(_Ended(exc))
            else:
                replies.put_nowait(reply)  # its room is freed once written

        async def read() -> None:
            try:
                incoming = aiter(requests)
                self._reading = not self.stopped
                try:
                    while self._reading:
                        await room.acquire()
                        try:
                            request = await anext(incoming)
                        except StopAsyncIteration:
                            break
                        task = asyncio.create_task(one(request), name=self._name)
                        in_hand.add(task)
                        task.add_done_callback(in_hand.discard)
                except asyncio.CancelledError:
                    if not self.stopped:
                        raise
                finally:
                    self._reading = False
                while in_hand:  # half-closed or stopped: answer what was read
                    await asyncio.wait(set(in_hand))
            except Exception as exc:
                replies.put_nowait(_Ended(exc))
            else:
                replies.put_nowait(_Ended(None))

        reader = self._reader = asyncio.create_task(read(), name=f"{self._name}-reader")
        try:
            while not isinstance(item := await replies.get(), _Ended):
                yield item
                room.release()  # written: a reply unread by the caller holds its room
            if item.error is not None:
                raise item.error
        finally:
            reader.cancel()
            if self._keep_running is None:
                for task in in_hand:
                    task.cancel()
                await asyncio.gather(reader, *in_hand, return_exceptions=True)
            else:
                for task in in_hand:
                    self._keep_running.add(task)
                    task.add_done_callback(self._keep_running.discard)
                await asyncio.gather(reader, return_exceptions=True)

    async def _answer(self, request: Q) -> R:
        try:
            return await self._handle(request)
        except Exception as exc:  # this call's failure, not the stream's
            if self._error_reply is None:
                raise
            code, details = error_status(exc)
            return self._error_reply(request, code.name, details)


class CallServers:
    """A servicer's open call streams, so that a shutdown can end them all
    (:meth:`stop_all`): each answers the calls it has read and ends, instead of holding
    the server's grace to its end and taking new calls during it. A stream served
    through :meth:`serve` is refused, or ends, with ``Unavailable(shutting_down)``."""

    def __init__(self, shutting_down: str) -> None:
        self._open: set[CallServer[Any, Any]] = set()
        self._shutting_down = shutting_down
        self.is_stopping = False

    async def serve(self, server: CallServer[Q, R], requests: AsyncIterator[Q]) -> AsyncIterator[R]:
        """``server``'s replies to ``requests``, the stream counted open meanwhile."""
        if self.is_stopping:
            raise Unavailable(self._shutting_down)
        self._open.add(server)
        try:
            async for reply in server.serve(requests):
                yield reply
        finally:
            self._open.discard(server)
        if server.stopped:
            raise Unavailable(self._shutting_down)

    def stop_all(self) -> int:
        """How many were open."""
        self.is_stopping = True
        for server in self._open:
            server.stop()
        return len(self._open)


class StreamTasks:
    """A servicer's open server streams that end only when their client goes (watches,
    heartbeats), so that a shutdown can end them all (:meth:`stop_all`): each stream served
    through :meth:`serve` ends with ``Unavailable(shutting_down)`` instead of holding the
    server's grace to its end. A stream opened after it is refused the same way.

    Only a stream waiting for its next item is cancelled. One whose handler task is sending
    an item (gRPC writes it after the ``yield``, outside the generator; a cancel landing
    there ends the call with no status and holds the grace) is left to finish the send,
    and ends when it comes back for the next item."""

    def __init__(self, shutting_down: str) -> None:
        self._open: set[asyncio.Task[Any]] = set()
        #: The open streams' tasks now waiting for their source's next item.
        self._waiting: set[asyncio.Task[Any]] = set()
        self._shutting_down = shutting_down
        self.is_stopping = False

    async def serve(self, items: AsyncIterator[T]) -> AsyncIterator[T]:
        """``items``, the stream counted open meanwhile; iterate it from the handler's own
        task."""
        task = asyncio.current_task()
        assert task is not None  # grpc runs each call in a task
        source = aiter(items)
        self._open.add(task)
        try:
            while True:
                if self.is_stopping:
                    raise Unavailable(self._shutting_down)
                self._waiting.add(task)
                try:
                    item = await anext(source)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    if not self.is_stopping:
                        raise  # the client went away
                    task.uncancel()  # the cancel was ours, and it is answered here
                    raise Unavailable(self._shutting_down) from None
                finally:
                    self._waiting.discard(task)
                yield item
        finally:
            self._open.discard(task)
            aclose = getattr(source, "aclose", None)
            if aclose is not None:  # its own cleanup now, not when it is collected
                await aclose()

    def __len__(self) -> int:
        """How many are open."""
        return len(self._open)

    def stop_all(self) -> int:
        """How many were open."""
        self.is_stopping = True
        for task in self._waiting:
            task.cancel()
        return len(self._open)


class _Ended:
    """What ends :meth:`CallServer.serve`'s replies: the requests' end (``error`` None) or
    what a read or a handler raised."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class _Stream(Protocol):
    async def write(self, request: Any) -> None: ...
    async def read(self) -> Any: ...
    def cancel(self) -> bool: ...


#: A stream's own end that says nothing of its calls was handled: the peer does not
#: serve the method, or refused the caller before reading anything.
_UNHEARD = frozenset(
    {
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)


class CallClient(Generic[Q, R]):
    """The calling end of one peer's stream. :meth:`call` queues a request with a fresh
    ``call_id`` and waits for the reply that names it, at most ``timeout`` seconds (then
    DEADLINE_EXCEEDED, as a unary call's deadline; a late reply is dropped). One writer
    task sends the queued requests in order, skipping those whose caller has gone or
    whose time is up, so a caller never waits on a write (a peer that reads nothing
    holds back the writer, not the callers) and a cancelled caller never cancels the
    stream. A writer held by one write longer than that call's timeout ends the stream.

    The stream opens on the first call and again on the first call after it ended; when
    it ends, every call waiting on it fails. The status they fail with is the stream's
    when it says nothing was handled (UNIMPLEMENTED: the peer serves no such stream, so
    the caller may send those calls another way; UNAUTHENTICATED, PERMISSION_DENIED),
    else UNAVAILABLE naming it: a call in the peer's hands may have been carried out."""

    def __init__(self, open_stream: Callable[[], _Stream], *, name: str = "call-stream") -> None:
        self._open = open_stream
        self._name = name
        self._stream: _Stream | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._outgoing: asyncio.Queue[tuple[Q, asyncio.Future[R]]] = asyncio.Queue()
        self._waiting: dict[int, asyncio.Future[R]] = {}
        self._ids = itertools.count(1)
        #: When the write under way began (None: none under way).
        self._writing_since: float | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def call(self, request: Q, timeout: float) -> R:
        if self._stream is None:
            self._start()
        call_id = request.call_id = next(self._ids)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._waiting[call_id] = future
        self._outgoing.put_nowait((request, future))
        deadline = loop.call_later(timeout, self._expire, future, timeout)
        try:
            return await future
        finally:
            deadline.cancel()
            self._waiting.pop(call_id, None)

    def _start(self) -> None:
        stream = self._stream = self._open()
        self._outgoing = asyncio.Queue()  # what waited for an ended stream failed with it
        self._tasks = [
            asyncio.create_task(self._write(stream), name=f"{self._name}-writer"),
            asyncio.create_task(self._read(stream), name=f"{self._name}-reader"),
        ]

    def _expire(self, future: asyncio.Future[R], timeout: float) -> None:
        if not future.done():
            future.set_exception(rpc_error("DEADLINE_EXCEEDED", f"no reply within {timeout:g}s"))
        since, stream = self._writing_since, self._stream
        held = since is not None and asyncio.get_running_loop().time() - since >= timeout
        if held and stream is not None:
            log.warning("call stream %s: a write held %gs or more: ending it", self._name, timeout)
            stream.cancel()  # the peer reads nothing: its reader ends the calls

    async def _write(self, stream: _Stream) -> None:
        loop = asyncio.get_running_loop()
        outgoing = self._outgoing
        try:
            while True:
                request, future = await outgoing.get()
                if future.done():  # its caller went, or its time is up: never sent
                    continue
                self._writing_since = loop.time()
                try:
                    await stream.write(request)
                finally:
                    self._writing_since = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the stream ended under the write: its reader says how
            log.debug("call stream %s: write failed: %r", self._name, exc)
            stream.cancel()  # a no-op once the call has its status

    async def _read(self, stream: _Stream) -> None:
        error: BaseException = rpc_error("UNAVAILABLE", "call stream ended")
        try:
            while (reply := await stream.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
                future = self._waiting.get(reply.call_id)
                if future is not None and not future.done():
                    future.set_result(reply)
        except asyncio.CancelledError:
            error = rpc_error("UNAVAILABLE", "call stream closed")
            raise
        except grpc.aio.AioRpcError as exc:
            error = exc if exc.code() in _UNHEARD else _unavailable(exc)
        except Exception as exc:  # a reply that cannot be read ends the stream
            log.warning("call stream %s failed: %r", self._name, exc)
            error = rpc_error("UNAVAILABLE", f"call stream failed: {exc!r}")
            stream.cancel()
        finally:
            self._ended(stream, error)

    def _ended(self, stream: _Stream, error: BaseException) -> None:
        if self._stream is not stream:
            return
        self._stream = None
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()  # the writer: nothing more goes on this stream
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)

    async def close(self) -> None:
        """End the stream (calls still waiting fail UNAVAILABLE)."""
        if self._stream is not None:
            self._stream.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _unavailable(exc: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
    code = exc.code()
    return rpc_error(
        "UNAVAILABLE", f"call stream ended: {code.name if code else '?'}: {exc.details()}"
    )


__all__ = ["MAX_CALLS_IN_FLIGHT", "CallClient", "CallServer", "CallServers", "StreamTasks"]
