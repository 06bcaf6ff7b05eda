"""The placement-try machine with no sockets: random interleavings of answers, failures,
timeouts and late replies, checked against the invariants the router relies on."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_base.demand import Demand
from laminar_zone.gather import Bind, Gather, GiveUp, Instruction, ProbeHost, Release, Unsure
from laminar_zone.placement import Offer, ShapeCap
from laminar_zone.view import ProbeLimits, ProbePlan, ZoneView


def make_view(free: list[int]) -> ZoneView:
    view = ZoneView(stale_after_seconds=1e9)
    for i, n in enumerate(free):
        shapes = {"gpu:A100": ShapeCap(n, 8, 0, 80 << 30)}
        view.update(f"h{i}", f"addr{i}", shapes, heat=0, draining=False, now=0.0)
    return view


#: Two hosts per round, late binding between them (d = 1 commits on probe: see below).
D2 = ProbeLimits(probes_per_attempt=2)


def machine(free: list[int], gang: int, seed: int, **kw: object) -> Gather:
    plan = ProbePlan(make_view(free), Demand(gpus=1), D2, random.Random(seed))
    return Gather(plan, gang, **kw)  # type: ignore[arg-type]


def grant(agent_id: str, member: int, seq: int) -> Offer:
    return Offer(f"{agent_id}-L{seq}", agent_id, member, 1.0)


def test_single_member_binds_the_best_lease_and_releases_the_other() -> None:
    g = machine([8, 8], gang=1, seed=1)
    first = g.start(0.0)
    assert [type(s) for s in first] == [ProbeHost, ProbeHost]
    a, b = (s for s in first if isinstance(s, ProbeHost))
    assert (
        g.answered(a.record.agent_id, a.round, [Offer("x", a.record.agent_id, 0, 0.2)], [], 0.0)
        == []
    )
    out = g.answered(b.record.agent_id, b.round, [Offer("y", b.record.agent_id, 0, 0.9)], [], 0.0)
    assert out == [
        Release((Offer("x", a.record.agent_id, 0, 0.2),)),
        Bind((Offer("y", b.record.agent_id, 0, 0.9),)),
    ]
    assert g.is_done and g.probes == 2
    # An answer after the end is given back, never bound.
    late = [Offer("z", a.record.agent_id, 0, 1.0)]
    assert g.answered(a.record.agent_id, a.round, late, [], 0.0) == [Release(tuple(late))]


def test_bounces_move_on_to_the_next_round_and_give_up_with_reasons() -> None:
    g = machine([1, 1, 1, 1, 1, 1], gang=1, seed=3)
    steps = g.start(0.0)
    rounds = 0
    while not g.is_done:
        rounds += 1
        nxt: list[Instruction] = []
        for s in steps:
            if isinstance(s, ProbeHost):
                nxt += g.answered(s.record.agent_id, s.round, [], ["no room"], 0.0)
        steps = nxt
    assert isinstance(g.outcome, GiveUp)
    assert rounds == g.rounds and 1 < rounds <= ProbeLimits().max_attempts
    assert g.bounces == g.probes and all(r.endswith(": no room") for r in g.outcome.reasons)


def test_the_budget_stops_new_rounds() -> None:
    g = machine([8, 8, 8, 8], gang=1, seed=2, deadline=5.0, budget_seconds=5.0)
    probes = [s for s in g.start(0.0) if isinstance(s, ProbeHost)]
    g.failed(probes[0].record.agent_id, probes[0].round, "UNAVAILABLE", 1.0)
    out = g.failed(probes[1].record.agent_id, probes[1].round, "UNAVAILABLE", 6.0)
    assert isinstance(g.outcome, GiveUp) and out == [g.outcome]
    assert g.outcome.reasons[-1] == "probe budget of 5 s spent"


def test_a_timed_out_round_closes_with_what_arrived() -> None:
    g = machine([8, 8], gang=1, seed=4)
    a, _b = (s for s in g.start(0.0) if isinstance(s, ProbeHost))
    g.answered(a.record.agent_id, a.round, [grant(a.record.agent_id, 0, 1)], [], 0.0)
    out = g.timed_out(a.round, 0.5)
    assert out == [Bind((grant(a.record.agent_id, 0, 1),))]
    assert g.timed_out(a.round, 0.6) == []  # a second timer of the same round: nothing


def test_no_host_in_view_gives_up_at_once_with_the_plan_reason() -> None:
    g = machine([0, 0], gang=1, seed=5)
    assert g.start(0.0) == [GiveUp(("no host's summary shows room",))]


@settings(max_examples=300, deadline=None)
@given(
    free=st.lists(st.integers(0, 8), min_size=1, max_size=12),
    gang=st.integers(1, 6),
    seed=st.integers(0, 1000),
    script=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 100), st.integers(0, 8)), max_size=80
    ),
)
def test_every_lease_is_bound_or_released_exactly_once(
    free: list[int], gang: int, seed: int, script: list[tuple[int, int, int]]
) -> None:
    """Random interleavings: answers in any order, failures, timeouts, replies arriving late.

    Invariants: one outcome; a Bind names exactly one lease per member, each granted; every
    granted lease ends in exactly one of Bind or Release; nothing is probed after the end.
    """
    g = machine(free, gang, seed)
    outstanding: list[ProbeHost] = []
    granted: set[str] = set()
    bound: list[str] = []
    released: list[str] = []
    outcomes: list[Bind | GiveUp] = []
    seq = 0

    def carry(steps: list[Instruction]) -> None:
        for s in steps:
            if isinstance(s, ProbeHost):
                assert not outcomes, "probed after the try ended"
                assert 1 <= s.members <= gang
                outstanding.append(s)
            elif isinstance(s, Release):
                released.extend(o.lease_id for o in s.offers)
            else:
                outcomes.append(s)
                if isinstance(s, Bind):
                    bound.extend(o.lease_id for o in s.offers)

    carry(g.start(0.0))
    now = 0.0
    for action, pick, grants_n in script:
        if not outstanding:
            break
        now += 0.01
        probe = outstanding.pop(pick % len(outstanding))
        agent = probe.record.agent_id
        if action == 0:
            carry(g.failed(agent, probe.round, "UNAVAILABLE", now))
        elif action == 1:
            carry(g.timed_out(probe.round, now))
        else:
            n = min(grants_n, probe.members)
            offers = []
            for m in range(n):
                seq += 1
                offers.append(grant(agent, m, seq))
            granted.update(o.lease_id for o in offers)
            bounces = ["full"] * (probe.members - n)
            carry(g.answered(agent, probe.round, offers, bounces, now))
    # Whatever is still out answers late (or never); close the round if it is open.
    if not g.is_done:
        carry(g.timed_out(g.rounds, now + 1))
        while not g.is_done:
            for probe in list(outstanding):
                outstanding.remove(probe)
                carry(g.answered(probe.record.agent_id, probe.round, [], ["full"], now))
            if not g.is_done:
                carry(g.timed_out(g.rounds, now + 1))
    assert len(outcomes) == 1
    if isinstance(outcomes[0], Bind):
        assert len(bound) == gang
        assert set(bound) <= granted
    assert sorted(bound + released) == sorted(granted)
    assert not set(bound) & set(released)


def commit_machine(free: list[int], seed: int) -> Gather:
    limits = ProbeLimits(probes_per_attempt=1)
    plan = ProbePlan(make_view(free), Demand(gpus=1), limits, random.Random(seed))
    return Gather(plan, 1, commit_on_probe=True)


def test_commit_on_probe_binds_the_first_grant_as_committed_and_never_releases_it() -> None:
    g = commit_machine([8, 8, 8], seed=1)
    (first,) = g.start(0.0)
    assert isinstance(first, ProbeHost) and first.commit and first.members == 1
    # A bounce moves on to one other candidate, again carrying the commit.
    (second,) = g.answered(first.record.agent_id, first.round, [], ["full"], 0.0)
    assert isinstance(second, ProbeHost) and second.commit
    assert second.record.agent_id != first.record.agent_id
    won = Offer("L1", second.record.agent_id, 0, 0.5)
    assert g.answered(second.record.agent_id, second.round, [won], [], 0.0) == [
        Bind((won,), committed=True)
    ]
    assert g.is_done and g.probes == 2 and g.bounces == 1
    # The driver's timer does not close a round whose probe carries the commit.
    assert g.timed_out(second.round, 1.0) == []


def test_a_commit_probe_without_an_answer_ends_the_try_unsure() -> None:
    g = commit_machine([8, 8, 8], seed=2)
    (first,) = g.start(0.0)
    # Refused before it reached the agent: nothing ran, the next candidate is tried.
    (second,) = g.failed(first.record.agent_id, first.round, "refused", 0.0)
    assert isinstance(second, ProbeHost) and second.commit
    out = g.failed(second.record.agent_id, second.round, "deadline", 0.0, may_have_run=True)
    assert out == [Unsure(second.record.agent_id, "deadline")]
    assert g.is_done and g.outcome == out[0]


def test_commit_on_probe_is_for_one_member_only() -> None:
    plan = ProbePlan(make_view([8]), Demand(gpus=1), ProbeLimits(), random.Random(1))
    with pytest.raises(ValueError, match="gang"):
        Gather(plan, 2, commit_on_probe=True)
