"""Per-tenant admission limits: token-bucket rates and a cap on queued jobs.

Pure and clock-injected so tests need no sleeps; the servicer calls :meth:`RateLimiter.take`
before Submit/ProbeJob and turns the :class:`ResourceExhausted` it raises into a status with a
``retry-after-seconds`` trailer (a call of a ProbeJobs stream is limited as ProbeJob; its
refusal is that call's reply, whose message says how long to wait, with no trailer). Not
covered: message size limits (gRPC max receive size).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from laminar_base.errors import ResourceExhausted


@dataclass
class _Bucket:
    tokens: float
    stamp_seconds: float


class RateLimiter:
    """One token bucket per tenant: ``burst`` calls at once, refilled at ``rate_per_second``."""

    def __init__(
        self,
        name: str,
        rate_per_second: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._name = name
        self._rate = rate_per_second
        self._burst = float(burst)
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, tenant: str) -> None:
        """Spend one token of ``tenant`` or raise RESOURCE_EXHAUSTED with the wait needed."""
        if self._rate <= 0.0:
            return
        now = self._clock()
        bucket = self._buckets.setdefault(tenant, _Bucket(self._burst, now))
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.stamp_seconds) * self._rate)
        bucket.stamp_seconds = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return
        wait = math.ceil((1.0 - bucket.tokens) / self._rate * 1000.0) / 1000.0
        raise ResourceExhausted(
            f"{self._name} rate limit for tenant {tenant!r}: "
            f"{self._rate:g}/s, burst {self._burst:g}; retry in {wait:.3f} s",
            field="tenant",
            retry_after_seconds=wait,
        )


def check_queued(tenant: str, queued: int, max_queued: int, adding: int = 1) -> None:
    """Refuse ``adding`` new jobs (an array's elements count each) when the tenant would
    have more than ``max_queued`` non-terminal jobs (0: no cap)."""
    if max_queued > 0 and queued + adding > max_queued:
        more = f" (and {adding} more asked for)" if adding > 1 else ""
        raise ResourceExhausted(
            f"tenant {tenant!r} has {queued} unfinished jobs{more}, limit {max_queued}",
            field="tenant",
            retry_after_seconds=1.0,
        )
