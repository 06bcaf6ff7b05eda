"""Job arrays: the syntax, the %N limit, and an array driven through the router with no
sockets (in-process agents, tests/zone/corekit.py)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_zone_core_props import Harness

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_base.causes import LIVE_SUBJOB_STATES, TERMINAL_JOB_STATES, EndCause
from laminar_base.errors import InvalidArgument
from laminar_zone.arrays import MAX_ARRAY_SIZE, ArrayProgress, parse_array


def test_the_syntax_is_slurms() -> None:
    assert parse_array("0-3").indices == (0, 1, 2, 3)
    assert parse_array("1,3,5-7").indices == (1, 3, 5, 6, 7)
    spec = parse_array("0-8:4%2")
    assert spec.indices == (0, 4, 8) and spec.limit == 2
    assert parse_array("5,5,1").indices == (1, 5)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "expected indices"),
        ("3-1", "must go up"),
        ("0-9%0", "whole number >= 1"),
        ("0-9%x", "whole number >= 1"),
        ("a", "is not an index"),
        ("0-5:0", "must go up"),
        (f"0-{MAX_ARRAY_SIZE}", f"at most {MAX_ARRAY_SIZE}"),
        ("0-2000000", "indices go up to"),
    ],
)
def test_bad_arrays_name_the_field(text: str, says: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_array(text, "--array")
    assert refused.value.field == "--array" and says in refused.value.message


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(0, 4),
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 9)), max_size=60),
)
def test_the_limit_is_never_exceeded(limit: int, steps: list[tuple[bool, int]]) -> None:
    progress = ArrayProgress(total=10, limit=limit)
    ended: set[str] = set()
    for start, index in steps:
        element = f"a_{index}"
        if element in ended:
            continue
        if start:
            allowed = progress.may_start(element)
            if limit:
                assert allowed == (element in progress.active)
        elif element in progress.active:
            progress.ended_as(element, "succeeded")
            ended.add(element)
        assert not limit or len(progress.active) <= limit
        assert progress.held == 10 - len(ended) - len(progress.active)
    assert progress.done == (len(ended) == 10)


async def _run_array(cancel_after: int | None) -> tuple[zone_pb2.Job, list[int], set[str]]:
    with tempfile.TemporaryDirectory() as root:
        harness = Harness(Path(root))
        try:
            await harness.flush()
            spec = zone_pb2.JobSpec(
                command=["true"], resources=common_pb2.Resources(gpus=1), array="0-4%2"
            )
            array = await harness.zone.submit(spec, "array-1")
            assert array.array.total == 5 and array.array.limit == 2
            again = await harness.zone.submit(spec, "array-1")  # resent: the same array
            assert again.job_id == array.job_id
            most_under_way: list[int] = []
            indices: set[str] = set()
            for round_ in range(20):
                await harness.call(harness.zone.queue_pass())
                elements = [harness.zone.get(f"{array.job_id}_{i}") for i in range(5)]
                under_way = [
                    e for e in elements if e.state not in (*TERMINAL_JOB_STATES, zone_pb2.WAITING)
                ]
                most_under_way.append(len(under_way))
                if cancel_after is not None and round_ == cancel_after:
                    await harness.zone.cancel(array.job_id, "enough")
                for agent in harness.agents.values():
                    for subjob in agent.live():
                        indices.add(str(subjob.spec.array_index))
                        agent.end(
                            subjob.spec.subjob_id, common_pb2.SUCCEEDED, EndCause.EXITED, "ok"
                        )
                await harness.flush()
                if harness.zone.get(array.job_id).state in TERMINAL_JOB_STATES:
                    break
            harness.check_always()
            assert all(
                s.state not in LIVE_SUBJOB_STATES
                for a in harness.agents.values()
                for s in a.subjobs.values()
            )
            return harness.zone.get(array.job_id), most_under_way, indices
        finally:
            await harness.close()


def test_the_arrays_record_sums_up_its_elements_and_ends_with_the_last() -> None:
    progress = ArrayProgress(total=3, limit=2)
    record = zone_pb2.Job(job_id="j-a")
    assert progress.may_start("j-a_0") and progress.may_start("j-a_1")
    progress.sum_up(record, any_running=False, now_unix=10.0)
    assert record.state == zone_pb2.QUEUED and record.array.under_way == 2
    assert record.array.held == 1 and record.reason_code == zone_pb2.REASON_ARRAY
    progress.sum_up(record, any_running=True, now_unix=11.0)
    assert record.state == zone_pb2.JOB_RUNNING and not record.ended_unix
    for element, state in (("j-a_0", zone_pb2.JOB_SUCCEEDED), ("j-a_1", zone_pb2.JOB_FAILED)):
        progress.element_ended(zone_pb2.Job(job_id=element, state=state))
    assert progress.may_start("j-a_2")
    progress.element_ended(zone_pb2.Job(job_id="j-a_2", state=zone_pb2.JOB_SUCCEEDED))
    progress.sum_up(record, any_running=False, now_unix=12.0)
    # One failed element fails the array, when its last element ended.
    assert record.state == zone_pb2.JOB_FAILED and record.ended_unix == 12.0
    assert (record.array.succeeded, record.array.failed, record.array.cancelled) == (2, 1, 0)
    assert record.reason == "2 of 3 elements succeeded, 1 failed, 0 cancelled"


def test_an_array_runs_every_index_at_most_two_at_a_time() -> None:
    done, most_under_way, indices = asyncio.run(_run_array(cancel_after=None))
    assert done.state == zone_pb2.JOB_SUCCEEDED, done
    assert done.array.succeeded == 5 and done.array.under_way == 0
    assert max(most_under_way) == 2
    assert indices == {"0", "1", "2", "3", "4"}


def test_cancelling_the_array_cancels_the_elements_left() -> None:
    done, _, indices = asyncio.run(_run_array(cancel_after=0))
    assert done.state == zone_pb2.JOB_CANCELLED, done
    assert done.array.succeeded + done.array.cancelled == 5 and done.array.cancelled >= 3
    assert len(indices) < 5


def test_an_element_that_ends_while_its_array_is_cancelled_does_not_fail_the_cancel() -> None:
    """What a cancel of an array stops is decided at once (ZoneCore.cancel_job): an element
    whose exit is reported while the stop of another is awaited is already cancelled, and
    the cancel goes on (cancelling it then, one element at a time, found it ended and
    failed the whole call, the elements after it left running)."""

    async def scenario() -> None:
        with tempfile.TemporaryDirectory() as root:
            harness = Harness(Path(root))
            try:
                await harness.flush()
                spec = zone_pb2.JobSpec(
                    command=["true"], resources=common_pb2.Resources(gpus=1), array="0-1"
                )
                array = await harness.zone.submit(spec, "array-race")
                await harness.call(harness.zone.queue_pass())
                await harness.flush()
                running = {
                    s.spec.array_index: (agent, s)
                    for agent in harness.agents.values()
                    for s in agent.live()
                }
                assert set(running) == {0, 1}
                first_agent, first = running[0]
                other_agent, other = running[1]
                stop = first_agent.SignalSubjob

                async def stop_while_the_other_ends(
                    request: agent_pb2.SignalSubjobRequest, timeout: float = 0
                ) -> common_pb2.Subjob:
                    if request.subjob_id == first.spec.subjob_id:
                        other_agent.end(
                            other.spec.subjob_id, common_pb2.SUCCEEDED, EndCause.EXITED, "ok"
                        )
                        harness.heartbeat(other_agent)  # its exit reaches the router now
                    return await stop(request, timeout)

                first_agent.SignalSubjob = stop_while_the_other_ends  # type: ignore[method-assign]
                record = await harness.zone.cancel(array.job_id, "enough")
                await harness.flush()
                elements = [harness.zone.get(f"{array.job_id}_{i}") for i in range(2)]
                assert [e.state for e in elements] == [zone_pb2.JOB_CANCELLED] * 2
                assert first_agent.subjobs[first.spec.subjob_id].state == common_pb2.KILLED
                assert record.array.cancelled == 2
                assert harness.zone.get(array.job_id).state == zone_pb2.JOB_CANCELLED
                assert harness.failures == []
            finally:
                await harness.close()

    asyncio.run(scenario())


def test_a_batch_is_all_or_nothing_and_names_the_bad_request() -> None:
    async def scenario() -> None:
        with tempfile.TemporaryDirectory() as root:
            harness = Harness(Path(root))
            try:
                good = zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1))
                bad = zone_pb2.JobSpec(command=["true"], array="9-1")
                with pytest.raises(InvalidArgument) as refused:
                    await harness.zone.submit_many([(good, "a"), (bad, "b")])
                assert refused.value.field == "requests[1].spec.array"
                assert harness.zone.store.by_request("default", "a") is None
                jobs = await harness.zone.submit_many([(good, "a"), (good, "c"), (good, "a")])
                assert jobs[0].job_id == jobs[2].job_id != jobs[1].job_id
                await harness.settle()
            finally:
                await harness.close()

    asyncio.run(scenario())
