"""Airlock's per-subjob memory between polls, as the agent's driver and sim airlock keep it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_airlock.episodes import Episodes, Memory
from laminar_airlock.policy import (
    STEP_READDRESS,
    STEP_RECLAIM,
    STEP_RELEASE_MEMORY,
    STEP_RESUME,
    STEP_SUSPEND,
    Action,
)


def act(step: str, subjob_id: str = "s") -> Action:
    return Action(
        step=step, subjob_id=subjob_id, slice_id="gpu0", reason="t", expected_bytes_freed=0
    )


def test_a_suspension_counts_from_the_action_and_ends_with_the_resume() -> None:
    e = Episodes()
    e.applied(act(STEP_SUSPEND), 10.0)
    assert e.poll("s", suspended=True, calm=False, now=12.0).suspended_since == 10.0
    e.applied(act(STEP_RESUME), 13.0)
    assert e.poll("s", suspended=False, calm=False, now=14.0) == Memory(None, None, False)


def test_a_suspension_found_without_a_time_counts_from_the_poll() -> None:
    e = Episodes()  # an agent restarted while the subjob was stopped
    assert e.poll("s", suspended=True, calm=False, now=5.0).suspended_since == 5.0
    assert e.poll("s", suspended=True, calm=False, now=6.0).suspended_since == 5.0


def test_release_is_asked_once_per_pressure_episode() -> None:
    e = Episodes()
    e.applied(act(STEP_RELEASE_MEMORY), 1.0)
    assert e.poll("s", suspended=False, calm=False, now=2.0).release_requested_since == 1.0
    assert e.poll("s", suspended=False, calm=True, now=3.0).release_requested_since is None


def test_readdress_stays_pending_until_the_subjob_or_its_copy_is_gone() -> None:
    e = Episodes()
    e.applied(act(STEP_READDRESS), 1.0)
    assert e.poll("s", suspended=False, calm=True, now=2.0).readdress_requested
    e.prune({"other"})
    assert e.memory("s") == Memory(None, None, False)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(
                [STEP_SUSPEND, STEP_RESUME, STEP_RELEASE_MEMORY, STEP_READDRESS, STEP_RECLAIM]
            ),
            st.sampled_from(["a", "b"]),
            st.booleans(),
        ),
        max_size=40,
    )
)
def test_memory_follows_the_actions_and_a_reclaim_forgets_everything(
    steps: list[tuple[str, str, bool]],
) -> None:
    e = Episodes()
    suspended: dict[str, bool] = {}
    for now, (step, subjob_id, calm) in enumerate(steps):
        e.applied(act(step, subjob_id), float(now))
        if step == STEP_SUSPEND:
            suspended[subjob_id] = True
        elif step in (STEP_RESUME, STEP_RECLAIM):
            suspended[subjob_id] = False
        memory = e.poll(
            subjob_id,
            suspended=suspended.get(subjob_id, False),
            calm=calm,
            now=float(now),
        )
        assert (memory.suspended_since is not None) == suspended.get(subjob_id, False)
        if step == STEP_RECLAIM:
            assert memory == Memory(None, None, False)
        if calm:
            assert memory.release_requested_since is None
        if step == STEP_RELEASE_MEMORY and not calm:
            assert memory.release_requested_since == float(now)


def test_a_recalled_hand_off_goes_on() -> None:
    """An agent restarted after handing a suspended subjob to the zone router: the journal
    says so, and the subjob is still handed over (neither resumed nor handed over again)."""
    e = Episodes()
    e.recall("s", 3.0, readdressed_since=4.0)
    assert e.poll("s", suspended=True, calm=True, now=9.0) == Memory(3.0, None, True)
    e.recall("t", 5.0)
    assert e.poll("t", suspended=True, calm=True, now=9.0) == Memory(5.0, None, False)
