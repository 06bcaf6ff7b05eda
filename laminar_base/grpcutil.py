"""gRPC plumbing shared by both daemons: error mapping, input limits, health and reflection.

Servicers stay translation-only: they validate, call policy/state code, and
let :func:`map_errors` turn :class:`LaminarError` into a status code with a short
message. Unexpected exceptions become INTERNAL with no traceback on the wire
(the traceback goes to the log).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
    Sized,
)
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import grpc

from laminar_base.configlib import MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    from grpc_health.v1._async import HealthServicer
from laminar_base.errors import InvalidArgument, LaminarError, ResourceExhausted

log = logging.getLogger("laminar.grpc")

F = TypeVar("F", bound=Callable[..., Any])
Req = TypeVar("Req")
Rep = TypeVar("Rep")

#: Default limit for an identifier-like string field.
MAX_ID_CHARS = 128
#: Default limit for free text (reasons, names).
MAX_TEXT_CHARS = 4096


def status_code(error: LaminarError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, error.code_name, grpc.StatusCode.INTERNAL)


def error_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status and details a handler that raised ``exc`` answers with (an error
    Laminar did not raise on purpose is logged with its traceback and is INTERNAL)."""
    if isinstance(exc, LaminarError):
        return status_code(exc), exc.message
    log.error("internal error in RPC handler", exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}"


def rpc_error(code_name: str, details: str) -> grpc.aio.AioRpcError:
    """The exception a call that failed with ``code_name`` raises on the client: for one
    item of a batched reply that carries its own status, so that callers treat it as the
    same item failing alone."""
    code = getattr(grpc.StatusCode, code_name, grpc.StatusCode.UNKNOWN)
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, "")


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
    if isinstance(exc, ResourceExhausted) and exc.retry_after_seconds > 0:
        context.set_trailing_metadata((("retry-after-seconds", f"{exc.retry_after_seconds:.3f}"),))
    code, details = error_status(exc)
    await context.abort(code, details)


def map_errors(method: F) -> F:
    """Decorate an async servicer method (unary or server-streaming) to map exceptions."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream_wrapper(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for item in method(self, request, context):
                    yield item
            except LaminarError as exc:
                await _abort(context, exc)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await _abort(context, exc)

        return stream_wrapper  # type: ignore[return-value]

    @functools.wraps(method)
    async def unary_wrapper(self: Any, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except LaminarError as exc:
            await _abort(context, exc)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return unary_wrapper  # type: ignore[return-value]


class _Failed(Generic[Rep]):
    """What ends :func:`answer_concurrently`'s replies: the reader's end (``error`` None) or
    an error the reader or an ``answer`` raised."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


async def answer_concurrently(
    requests: AsyncIterable[Req],
    answer: Callable[[Req], Awaitable[Rep]],
    *,
    max_in_flight: int,
    name: str,
) -> AsyncIterator[Rep]:
    """The replies of a bidi stream of independent calls, each as it completes: ``answer``
    runs for every request in a task of its own (named ``name``), at most ``max_in_flight``
    at once (beyond that no request is read until one finishes, so a client cannot queue
    unbounded work), and one writer (the caller iterating this) sends their replies.

    ``answer`` turns a call's own failure into its reply; an exception it raises anyway
    ends the stream with that exception, as a failed request read does. When the client
    stops sending, the calls in hand are answered and then the replies end. When the
    replies are closed early (the call was cancelled: the client went away, its deadline
    passed, the stream's authorization ended), the calls in hand are cancelled and awaited:
    nobody can read their replies, and no task outlives the call."""
    replies: asyncio.Queue[Rep | _Failed[Rep]] = asyncio.Queue()
    slots = asyncio.Semaphore(max_in_flight)
    tasks: set[asyncio.Task[None]] = set()

    async def one(request: Req) -> None:
        try:
            replies.put_nowait(await answer(request))
        except Exception as exc:
            replies.put_nowait(_Failed(exc))
        finally:
            slots.release()

    async def read() -> None:
        try:
            items = aiter(requests)
            while True:
                await slots.acquire()
                try:
                    request = await anext(items)
                except StopAsyncIteration:
                    break
                task = asyncio.create_task(one(request), name=name)
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:  # the client is done sending: answer what it sent
                await asyncio.wait(set(tasks))
        except Exception as exc:
            replies.put_nowait(_Failed(exc))
        else:
            replies.put_nowait(_Failed(None))

    reader = asyncio.create_task(read(), name=f"{name}-reader")
    try:
        while True:
            item = await replies.get()
            if isinstance(item, _Failed):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        reader.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(reader, *tasks, return_exceptions=True)


def check_str(
    value: str, field: str, *, max_chars: int = MAX_ID_CHARS, required: bool = False
) -> str:
    """Validate a string field's presence and length."""
    if required and not value:
        raise InvalidArgument("is required", field=field)
    if len(value) > max_chars:
        raise InvalidArgument(
            f"is {len(value)} characters, at most {max_chars} allowed", field=field
        )
    if "\x00" in value:
        raise InvalidArgument("contains a NUL character", field=field)
    return value


#: What one subjob's command line and environment may add up to, in bytes as execve counts
#: them (each string plus its NUL, ``KEY=VALUE`` per variable): well under Linux's ARG_MAX
#: (2 MiB with an 8 MiB stack), leaving room for the agent's own variables.
MAX_EXEC_BYTES = 512 * 1024
#: Linux refuses any single argument or variable longer than this (MAX_ARG_STRLEN).
MAX_EXEC_STRING_BYTES = 128 * 1024 - 1


def check_exec_size(command: Sequence[str], env: Mapping[str, str], field: str) -> None:
    """Refuse, naming the field, a command and environment execve would refuse (E2BIG):
    such a job can never start, and each retry would only carry it around again."""
    total = 0
    for i, arg in enumerate(command):
        size = len(arg.encode()) + 1
        if size > MAX_EXEC_STRING_BYTES:
            raise InvalidArgument(
                f"argument {i} is {size - 1} bytes, at most {MAX_EXEC_STRING_BYTES - 1}",
                field=f"{field}.command",
            )
        total += size
    for key, value in env.items():
        size = len(key.encode()) + len(value.encode()) + 2
        if size > MAX_EXEC_STRING_BYTES:
            raise InvalidArgument(
                f"{key} is {size - 2} bytes, at most {MAX_EXEC_STRING_BYTES - 2}",
                field=f"{field}.env",
            )
        total += size
    if total > MAX_EXEC_BYTES:
        raise InvalidArgument(
            f"command and environment add up to {total} bytes, at most {MAX_EXEC_BYTES}",
            field=f"{field}.command",
        )


def check_count(items: Sized, field: str, *, max_items: int) -> None:
    """Validate the length of a repeated or map field."""
    if len(items) > max_items:
        raise InvalidArgument(f"has {len(items)} entries, at most {max_items} allowed", field=field)


def check_number(value: float, field: str, *, low: float = 0.0, high: float | None = None) -> float:
    """Validate a finite number in [low, high]."""
    if value != value or value in (float("inf"), float("-inf")):
        raise InvalidArgument(f"must be a finite number, got {value}", field=field)
    if value < low:
        raise InvalidArgument(f"must be >= {low}, got {value}", field=field)
    if high is not None and value > high:
        raise InvalidArgument(f"must be <= {high}, got {value}", field=field)
    return value


def server_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    """Server options: messages over ``max_message_bytes`` either way get RESOURCE_EXHAUSTED."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]


def channel_options() -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.enable_retries", 0),
    ]


def add_health_and_reflection(
    server: grpc.aio.Server, service_names: Iterable[str]
) -> HealthServicer:
    """Serve grpc.health.v1 and reflection; returns the health servicer (starts NOT_SERVING).

    Imported here, not at the top: the CLI imports this module for its channel options
    and should not pay for the server side."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_health.v1._async import HealthServicer
    from grpc_reflection.v1alpha import reflection

    servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    names = [
        *service_names,
        reflection.SERVICE_NAME,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    ]
    reflection.enable_server_reflection(names, server)
    return servicer


async def set_serving(
    servicer: HealthServicer, service_names: Iterable[str], serving: bool
) -> None:
    from grpc_health.v1 import health_pb2

    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ["", *service_names]:
        await servicer.set(name, status)
