"""Per-tenant rate and queue limits (pure part; the servicer wiring is still to come)."""

from __future__ import annotations

import pytest

from laminar_base.errors import ResourceExhausted
from laminar_zone.limits import RateLimiter, check_queued


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bucket_engages_and_recovers_per_tenant() -> None:
    clock = FakeClock()
    limiter = RateLimiter("Submit", rate_per_second=2.0, burst=2, clock=clock)
    limiter.take("alice")
    limiter.take("alice")
    with pytest.raises(ResourceExhausted) as info:
        limiter.take("alice")
    assert info.value.retry_after_seconds == pytest.approx(0.5)
    assert "retry in" in str(info.value)
    limiter.take("bob")  # another tenant has its own bucket
    clock.now += 0.5
    limiter.take("alice")
    with pytest.raises(ResourceExhausted):
        limiter.take("alice")


def test_zero_rate_means_unlimited() -> None:
    limiter = RateLimiter("Submit", rate_per_second=0.0, burst=0)
    for _ in range(100):
        limiter.take("alice")


def test_queued_cap() -> None:
    check_queued("alice", 2, 3)
    check_queued("alice", 50, 0)
    with pytest.raises(ResourceExhausted):
        check_queued("alice", 3, 3)
