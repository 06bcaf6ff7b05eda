"""One exception hierarchy for Laminar; each class says what happened and whether a retry helps.

Servicers never leak tracebacks: :mod:`laminar_base.grpcutil` maps these to
gRPC status codes, and the CLI turns them into one readable line.
"""

from __future__ import annotations


class LaminarError(Exception):
    """Base of every error Laminar raises on purpose."""

    #: gRPC status code name this error maps to.
    code_name = "INTERNAL"
    #: Whether the same call may succeed if retried later.
    retryable = False

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        self.message = f"{field}: {message}" if field else message
        super().__init__(self.message)

    def within(self, prefix: str) -> LaminarError:
        """The same error, its field named inside ``prefix`` (``requests[3]``): for a
        request that carries many items."""
        had = self.field
        self.field = f"{prefix}.{had}" if had else prefix
        self.message = f"{prefix}.{self.message}" if had else f"{prefix}: {self.message}"
        self.args = (self.message,)
        return self


class InvalidArgument(LaminarError):
    """The request is malformed; the message names the field."""

    code_name = "INVALID_ARGUMENT"


class ConfigError(InvalidArgument):
    """Invalid configuration; the message names the key."""


class NotFound(LaminarError):
    code_name = "NOT_FOUND"


class AlreadyExists(LaminarError):
    code_name = "ALREADY_EXISTS"


class FailedPrecondition(LaminarError):
    """The request is valid but the current state does not allow it."""

    code_name = "FAILED_PRECONDITION"


class ResourceExhausted(LaminarError):
    """A quota, rate limit or capacity limit was hit; retry later."""

    code_name = "RESOURCE_EXHAUSTED"
    retryable = True

    def __init__(
        self, message: str, *, field: str | None = None, retry_after_seconds: float = 0.0
    ) -> None:
        super().__init__(message, field=field)
        self.retry_after_seconds = retry_after_seconds


class Unavailable(LaminarError):
    """A peer or the daemon itself cannot serve now (draining, down); retry helps."""

    code_name = "UNAVAILABLE"
    retryable = True


class Aborted(LaminarError):
    """A race was lost (lease expired, concurrent change); retrying may succeed."""

    code_name = "ABORTED"
    retryable = True


class PermissionDenied(LaminarError):
    code_name = "PERMISSION_DENIED"


class Unauthenticated(LaminarError):
    code_name = "UNAUTHENTICATED"


class InternalError(LaminarError):
    code_name = "INTERNAL"
