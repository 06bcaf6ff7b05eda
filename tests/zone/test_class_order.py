"""The one pass over all waiting work (laminar_zone.queue.class_order), with no sockets: per
priority class, highest first, the queue walk of its rigid jobs and then its clearing round;
the router and the simulators only carry out its instructions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_base.demand import Demand
from laminar_zone.queue import (
    Admit,
    Bidding,
    Clear,
    QueueItem,
    QueueWalk,
    Waiting,
    bids_ahead,
    class_order,
    drive,
    order_key,
    walk_queue,
)

GPU = Demand(gpus=1)
MIG = Demand(mig_profile="1g.10gb")


def item(name: str, priority: int, need: Demand = GPU, expected: float = 0.0) -> QueueItem:
    return QueueItem(name, priority, "t", 0.0, need, 1, expected)


def trace(
    jobs: list[QueueItem],
    market: set[int] | list[int | Bidding],
    starts: set[str],
    **kwargs: object,
) -> tuple[list[str], list[QueueItem]]:
    """The instructions as a log ("start j" / "clear p heads"), and the jobs kept waiting."""
    log: list[str] = []

    def start(job: QueueItem) -> bool:
        log.append(f"start {job.job_id}")
        return job.job_id in starts

    def clear(step: Clear) -> None:
        part = "" if step.jobs is None else f" part {sorted(step.jobs)}"
        log.append(f"clear {step.priority} {sorted(step.heads.items())}{part}")

    steps = class_order(
        QueueWalk(now=0.0),
        jobs,
        lambda j: j,
        lambda j, ahead: 100.0 + ahead,
        market,
        **kwargs,  # type: ignore[arg-type]
    )
    return log, drive(steps, start, clear)


def test_each_class_walks_its_rigid_jobs_then_clears_before_the_next_class() -> None:
    jobs = [item("p1", 1), item("b1", 2), item("b2", 2, MIG), item("o1", 3)]
    log, kept = trace(jobs, market={1, 2, 3}, starts={"p1", "b2"})
    assert log == [
        "start p1",
        "clear 1 []",  # no blocked head of class 1: windows run to their horizon
        "start b1",  # waits: the head of the GPU family from here on
        "start b2",
        "clear 2 [('gpu', 100.0)]",  # class 2's round is cut at its own head
        "clear 3 [('gpu', 100.0)]",  # o1 may not try: its family is blocked, no backfill
    ]
    assert [j.job_id for j in kept] == ["b1", "o1"]


def test_a_higher_class_round_comes_before_a_lower_rigid_job_and_its_heads() -> None:
    """Production atomized work clears before any batch rigid job tries: a batch job can
    never take the slice a waiting production bid would win in the same pass, and a batch
    head does not cut production windows."""
    log, kept = trace([item("b1", 2), item("b2", 2)], market={1}, starts=set())
    assert log == ["clear 1 []", "start b1"]
    assert [j.job_id for j in kept] == ["b1", "b2"]


def test_classes_with_market_work_only_are_cleared_in_order_after_the_walk() -> None:
    log, _ = trace([item("p1", 1)], market={3, 2}, starts={"p1"})
    assert log == ["start p1", "clear 2 []", "clear 3 []"]


def test_without_interleaving_all_rigid_work_goes_first_then_one_round() -> None:
    jobs = [item("p1", 1), item("o1", 3, MIG)]
    log, _ = trace(jobs, market={1, 3}, starts=set(), interleave=False)
    assert log == ["start p1", "start o1", "clear None [('gpu', 100.0), ('mig:1g.10gb', 100.0)]"]


def test_skipped_jobs_are_not_walked_and_never_jobs_block_nobody() -> None:
    jobs = [item("skip", 1), item("huge", 1), item("b1", 1)]
    heard: list[tuple[str, Waiting]] = []

    def admit(job: QueueItem) -> Admit:
        return {"skip": Admit.SKIP, "huge": Admit.NEVER}.get(job.job_id, Admit.WALK)

    log, kept = trace(
        jobs,
        market=set(),
        starts=set(),
        admit=admit,
        waited=lambda j, w: heard.append((j.job_id, w)),
        estimate_all=True,
    )
    assert log == ["start b1"]  # never tried: skip (not in the pass) and huge (cannot fit)
    assert [j.job_id for j in kept] == ["huge", "b1"]
    assert [name for name, _ in heard] == ["huge", "b1"]
    assert not heard[0][1].is_head and heard[1][1].is_head


def test_within_a_class_atomized_jobs_bid_ahead_of_the_rigid_jobs_behind_them() -> None:
    """One queue order within a class: a waiting atomized job met in the walk bids (a part
    of its class's round) before the next rigid job of its class is walked; the class's full
    round, with the pieces whose window ends and the bids that won nothing, follows."""
    jobs = [
        item("p1", 1),
        item("a1", 2),
        item("a2", 2),
        item("b1", 2),
        item("a3", 2),
        item("b2", 2, MIG),
        item("a4", 2),
        item("o1", 3, MIG),
    ]
    market: list[int | Bidding] = [Bidding(n, 2) for n in ("a1", "a2", "a3", "a4", "a5")]
    log, kept = trace(jobs, market=[*market, 3], starts={"p1"})
    assert log == [
        "start p1",
        "clear 2 [] part ['a1', 'a2']",  # ahead of b1 in queue order: they bid first
        "start b1",  # waits: the head of the GPU family
        "clear 2 [('gpu', 100.0)] part ['a3']",  # cut at the head found so far
        "start b2",
        # a4 follows the last rigid job of its class, a5 is not in the walk: the full round
        "clear 2 [('gpu', 100.0), ('mig:1g.10gb', 100.0)]",
        "clear 3 [('gpu', 100.0), ('mig:1g.10gb', 100.0)]",  # o1 backfills nothing
    ]
    assert [j.job_id for j in kept] == ["b1", "b2", "o1"]  # never a bidding


def test_the_router_s_skipped_atomized_jobs_bid_in_their_place_too() -> None:
    """The router's walk skips its atomized jobs (``admit``: SKIP); those the market names
    still take their place in the order. Without interleaving they wait for the one round."""
    jobs = [item("a1", 2), item("b1", 2), item("x", 2), item("b2", 2)]
    market: list[int | Bidding] = [Bidding("a1", 2)]

    def admit(job: QueueItem) -> Admit:
        return Admit.SKIP if job.job_id in {"a1", "x"} else Admit.WALK

    log, _ = trace(jobs, market=market, starts={"b1", "b2"}, admit=admit)
    assert log == ["clear 2 [] part ['a1']", "start b1", "start b2", "clear 2 []"]
    log, _ = trace(jobs, market=market, starts={"b1", "b2"}, admit=admit, interleave=False)
    assert log == ["start b1", "start b2", "clear None []"]


def test_shorter_first_walks_a_gang_ahead_of_longer_atomized_work_submitted_before_it() -> None:
    """``shorter_first`` (the default): a bidding met in the walk bids before a rigid job
    behind it only if its work left is no longer than that job's run time; a longer one
    waits for the next rigid job it is no longer than, or the class's full round. Unknown
    work (0) on either side keeps queue order."""
    jobs = [
        item("a1", 2),  # long single-GPU work
        item("a2", 2),  # short
        item("g1", 2, expected=500.0),  # a gang of 500 s
        item("a3", 2),  # unknown work
        item("g2", 2, expected=5000.0),
        item("a4", 2),
        item("g3", 2, expected=0.0),  # declares no run time
    ]
    market: list[int | Bidding] = [
        Bidding("a1", 2, 2000.0),
        Bidding("a2", 2, 100.0),
        Bidding("a3", 2, 0.0),
        Bidding("a4", 2, 9000.0),
    ]
    log, _ = trace(jobs, market=market, starts={"g1", "g2", "g3"}, shorter_first=True)
    assert log == [
        "clear 2 [] part ['a2']",  # a1 (2000 s) is longer than g1 (500 s): g1 goes first
        "start g1",
        "clear 2 [] part ['a1', 'a3']",  # a1 no longer than g2; a3's work is unknown
        "start g2",
        "clear 2 [] part ['a4']",  # g3 declares no run time: queue order
        "start g3",
        "clear 2 []",
    ]
    log, _ = trace(jobs, market=market, starts={"g1", "g2", "g3"}, shorter_first=False)
    assert log[:2] == ["clear 2 [] part ['a1', 'a2']", "start g1"]  # queue order alone


def test_a_bidding_longer_than_every_gang_of_its_class_bids_in_the_full_round() -> None:
    jobs = [item("a1", 2), item("g1", 2, expected=50.0), item("o1", 3, expected=10.0)]
    market: list[int | Bidding] = [Bidding("a1", 2, 1000.0), 3]
    log, _ = trace(jobs, market=market, starts={"g1", "o1"}, shorter_first=True)
    # a1 never bids in a part: the class's full round has it, before the lower class's walk
    assert log == ["start g1", "clear 2 []", "start o1", "clear 3 []"]


def test_walk_queue_is_the_pass_without_a_market() -> None:
    jobs = [item("a", 3, expected=50.0), item("b", 3, expected=500.0), item("c", 3, expected=5)]
    tried: list[str] = []

    def start(j: QueueItem) -> bool:
        tried.append(j.job_id)
        return j.job_id != "a"

    kept = walk_queue(QueueWalk(now=0.0), jobs, lambda j: j, start, lambda j, a: 100.0)
    assert tried == ["a", "c"]  # b would end after a's expected start: no backfill
    assert [j.job_id for j in kept] == ["a", "b"]


@settings(max_examples=200, deadline=None)
@given(
    rigid=st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.booleans()), max_size=20),
    market=st.sets(st.integers(0, 3)),
)
def test_every_step_of_a_class_comes_before_any_step_of_a_lower_class(
    rigid: list[tuple[int, bool, bool]], market: set[int]
) -> None:
    jobs = sorted(
        (item(f"j{i}", prio, MIG if mig else GPU) for i, (prio, mig, _) in enumerate(rigid)),
        key=lambda j: order_key(j, {}, {}),
    )
    starts = {f"j{i}" for i, (_, _, ok) in enumerate(rigid) if ok}
    classes: list[int] = []
    cleared: list[int] = []
    started: set[str] = set()

    def start(job: QueueItem) -> bool:
        classes.append(job.priority)
        if job.job_id in starts:
            started.add(job.job_id)
        return job.job_id in starts

    def clear(step: Clear) -> None:
        assert step.priority is not None
        classes.append(step.priority)
        cleared.append(step.priority)

    steps = class_order(QueueWalk(now=0.0), jobs, lambda j: j, lambda j, a: 10.0, market)
    kept = drive(steps, start, clear)
    assert classes == sorted(classes)
    assert cleared == sorted(market)  # one round per class with market work, none else
    assert [j.job_id for j in kept] == [j.job_id for j in jobs if j.job_id not in started]


@settings(max_examples=200, deadline=None)
@given(
    work=st.lists(
        st.tuples(st.booleans(), st.integers(2, 3), st.sampled_from([0.0, 10.0, 100.0, 1000.0])),
        max_size=16,
    ),
)
def test_shorter_first_bids_each_job_once_and_never_ahead_of_shorter_rigid_work(
    work: list[tuple[bool, int, float]],
) -> None:
    """With ``shorter_first`` every bidding met in the walk bids in at most one part of its
    class's round, only before a rigid job of its class it is no longer than (or where either
    is unknown), and a longer one is never dropped: the class's full round follows."""
    jobs: list[QueueItem] = []
    market: list[int | Bidding] = []
    biddings: dict[str, Bidding] = {}
    for i, (atomized, prio, seconds) in enumerate(work):
        jobs.append(item(f"j{i}", prio, expected=0.0 if atomized else seconds))
        if atomized:
            biddings[f"j{i}"] = Bidding(f"j{i}", prio, seconds)
    market.extend(biddings.values())
    jobs.sort(key=lambda j: order_key(j, {}, {}))
    parts: list[frozenset[str]] = []
    full: list[int] = []
    pending: list[frozenset[str]] = []

    def start(job: QueueItem) -> bool:
        for part in pending:
            for name in part:
                assert biddings[name].priority == job.priority
                assert bids_ahead(biddings[name], job)
        pending.clear()
        return True

    def clear(step: Clear) -> None:
        assert step.priority is not None
        if step.jobs is None:
            full.append(step.priority)
        else:
            parts.append(step.jobs)
            pending.append(step.jobs)

    steps = class_order(
        QueueWalk(now=0.0), jobs, lambda j: j, lambda j, a: 10.0, market, shorter_first=True
    )
    drive(steps, start, clear)
    named = [name for part in parts for name in part]
    assert len(named) == len(set(named))  # at most one part each
    assert full == sorted({b.priority for b in biddings.values()})  # and every class's round
