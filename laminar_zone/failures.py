"""What a failed call to an agent means for the router's decisions: the gRPC status read
into a :class:`laminar_zone.core.Failure` (the core imports no gRPC)."""

from __future__ import annotations

import grpc

from laminar_zone.core import Failure
from laminar_zone.placer import rpc_reason

#: Answers after which the agent surely did not take the call (it refused, or never saw it
#: authenticated); any other failure (no answer in time, a dropped connection) may have
#: come after the agent acted.
_REFUSALS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def outcome_unknown(exc: BaseException) -> bool:
    """Whether a failed call may still have been carried out by the agent."""
    return not (isinstance(exc, grpc.aio.AioRpcError) and exc.code() in _REFUSALS)


def is_refused_input(exc: BaseException) -> bool:
    """A commit the agent refused as bad input: retrying the same spec cannot help."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.INVALID_ARGUMENT


def failure_of(exc: BaseException) -> Failure:
    """The core's view of a failed call: why, whether it may have been carried out, and
    whether the agent refused the spec itself."""
    details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    return Failure(rpc_reason(exc), outcome_unknown(exc), is_refused_input(exc), details or "")
