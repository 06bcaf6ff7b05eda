"""The queue walk the router and the simulators share, with no sockets: random queues and
random placement outcomes, checked against EASY backfill's promise and per-family blocking."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_base.demand import Demand
from laminar_zone.queue import QueueItem, QueueWalk, Waiting

#: Three families: whole GPUs and shares compete for the same GPUs, MIG slices and CPU do not.
FAMILIES = (Demand(gpus=1), Demand(mig_profile="1g.10gb"), Demand())


def item(i: int, family: int, expected: float) -> QueueItem:
    return QueueItem(f"j{i}", 3, "t", float(i), FAMILIES[family], 1, expected)


def test_the_first_job_that_waits_blocks_its_family_only() -> None:
    walk = QueueWalk(now=100.0)
    a, b, c = item(1, 0, 0.0), item(2, 0, 0.0), item(3, 1, 0.0)
    assert walk.may_try(a)
    head = walk.waits(a, lambda ahead: 500.0)
    assert head.is_head and head.position == 1 and head.expected_start == 500.0
    assert not walk.may_try(b)  # declares no run time: cannot prove it ends in time
    assert walk.may_try(c)  # another family is not blocked
    behind = walk.waits(b, lambda ahead: 600.0 + ahead)
    assert behind == type(behind)(2, 601.0, "j1", False)


def test_backfill_only_when_the_job_ends_before_the_head_starts() -> None:
    walk = QueueWalk(now=100.0)
    walk.waits(item(1, 0, 0.0), lambda ahead: 200.0)
    assert walk.may_try(item(2, 0, 100.0))  # ends at 200: in time
    assert not walk.may_try(item(3, 0, 100.5))
    assert not QueueWalk(now=100.0, backfill=False, heads=walk.heads).may_try(item(2, 0, 1.0))


def test_a_job_the_zone_can_never_hold_blocks_nobody() -> None:
    walk = QueueWalk(now=0.0)
    big = item(1, 0, 0.0)
    assert not walk.may_try(big, never=True)
    wait = walk.waits(big, lambda ahead: 1.0, never=True)
    assert not wait.is_head and wait.expected_start is None
    assert walk.may_try(item(2, 0, 0.0))


@settings(max_examples=300, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from([0.0, 5.0, 50.0, 500.0]), st.booleans()),
        max_size=40,
    ),
    now=st.floats(0.0, 1000.0),
    backfill=st.booleans(),
)
def test_no_job_starts_that_would_delay_a_blocked_head(
    jobs: list[tuple[int, float, bool]], now: float, backfill: bool
) -> None:
    walk = QueueWalk(now=now, backfill=backfill)
    positions = {f: 0 for f in range(len(FAMILIES))}
    heads: dict[int, float | None] = {}
    for i, (family, expected, fits) in enumerate(jobs):
        it = item(i, family, expected)
        tries = walk.may_try(it)
        if family in heads:
            start = heads[family]
            # EASY: behind a head, only a job that surely ends before the head's start tries.
            assert tries == (
                backfill and start is not None and expected > 0 and now + expected <= start
            )
        else:
            assert tries
        if tries and fits:
            continue
        wait = walk.waits(it, lambda ahead, i=i: now + 10.0 * (i + 1) + ahead)
        positions[family] += 1
        assert wait.position == positions[family]
        assert wait.is_head == (family not in heads)
        if wait.is_head:
            heads[family] = wait.expected_start
    assert {FAMILIES[f].family for f in heads} == set(walk.heads)


def test_a_restarted_job_claims_the_slices_that_fit_it_head_or_not() -> None:
    """A job requeued after a memory kill (its peak as its need) keeps a claim, (memory,
    expected start), even behind its family's head; other jobs behind a head claim nothing
    and are not even estimated."""
    gib = 1 << 30
    mig = Demand(mig_profile="3g.40gb", gpu_memory_bytes=30 * gib)
    walk = QueueWalk(now=0.0)
    asked: list[str] = []

    def estimate(name: str, start: float) -> Callable[[float], float]:
        def at(ahead: float) -> float:
            asked.append(name)
            return start + ahead

        return at

    def waits(item: QueueItem, start: float, never: bool = False) -> Waiting:
        return walk.waits(item, estimate(item.job_id, start), never=never, estimate_all=False)

    waits(QueueItem("head", 3, "t", 0.0, mig, 2, 0.0), 100.0)
    waits(QueueItem("plain", 3, "t", 1.0, mig, 2, 0.0), 200.0)
    wait = waits(QueueItem("killed", 3, "t", 2.0, mig, 4, 0.0, is_restarted=True), 300.0)
    assert asked == ["head", "killed"]
    start = 300.0 + 2 * 2 * 3 / 7  # behind two gangs of two 3g slices (3/7 GPU each)
    assert wait.expected_start == start and not wait.is_head
    assert walk.claims == [(30 * gib, start)]
    never = QueueItem("never", 3, "t", 3.0, mig, 9, 0.0, is_restarted=True)
    waits(never, 0.0, never=True)  # it can never start: no claim
    assert walk.claims == [(30 * gib, start)]
