"""SubmitAndWatchMany through a real router and agents: many SubmitAndWatch calls over one
stream, each named by its call_id, each followed to its end, a bad call failing alone."""

from __future__ import annotations

import queue
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
from waiting import gate_code, wait_for
from zonekit import TERMINAL, Zone

from laminar_api.v1 import common_pb2, zone_pb2


def _call(call_id: int, code: str, request_id: str = "") -> zone_pb2.SubmitCall:
    spec = zone_pb2.JobSpec(
        command=[sys.executable, "-c", code], resources=common_pb2.Resources(gpus=1)
    )
    return zone_pb2.SubmitCall(
        call_id=call_id,
        request=zone_pb2.SubmitRequest(spec=spec, client_request_id=request_id),
    )


def _by_call(
    messages: list[zone_pb2.SubmitCallEvents],
) -> dict[int, list[zone_pb2.SubmitCallEvent]]:
    calls: dict[int, list[zone_pb2.SubmitCallEvent]] = {}
    for message in messages:
        for event in message.events:
            calls.setdefault(event.call_id, []).append(event)
    return calls


class _Requests:
    """Requests sent as the test puts them; None half-closes the stream."""

    def __init__(self) -> None:
        self._queue: queue.Queue[zone_pb2.SubmitCall | None] = queue.Queue()

    def put(self, call: zone_pb2.SubmitCall | None) -> None:
        self._queue.put(call)

    def __iter__(self) -> Iterator[zone_pb2.SubmitCall]:
        while (call := self._queue.get()) is not None:
            yield call


def test_every_call_is_followed_to_its_end_and_a_bad_one_fails_alone(zone: Zone) -> None:
    before = len(zone.stub.ListJobs(zone_pb2.ListJobsRequest(), timeout=10).jobs)
    bad = zone_pb2.SubmitCall(
        call_id=99,
        request=zone_pb2.SubmitRequest(
            spec=zone_pb2.JobSpec(resources=common_pb2.Resources(gpus=1))
        ),
    )
    calls = [_call(i, f"print({i})", request_id=f"many-{i}") for i in range(1, 5)]
    messages = list(zone.stub.SubmitAndWatchMany(iter([*calls, bad]), timeout=60))
    by_call = _by_call(messages)
    assert set(by_call) == {1, 2, 3, 4, 99}
    (failed,) = by_call[99]  # its error, and nothing else
    assert failed.WhichOneof("outcome") == "error" and failed.last
    assert failed.error.code == "INVALID_ARGUMENT" and "spec.command" in failed.error.message
    for call_id in range(1, 5):
        events = by_call[call_id]
        jobs = [e.event.job for e in events]
        assert {j.job_id for j in jobs} == {jobs[0].job_id}
        assert jobs[0].state not in TERMINAL  # Submit's answer first
        assert [e.last for e in events] == [False] * (len(events) - 1) + [True]
        assert jobs[-1].state == zone_pb2.JOB_SUCCEEDED
        assert zone.get(jobs[0].job_id).state == zone_pb2.JOB_SUCCEEDED
    # One job per good call; the bad one kept nothing.
    after = zone.stub.ListJobs(zone_pb2.ListJobsRequest(), timeout=10).jobs
    assert len(after) == before + 4
    # Resent on a new stream, a call's client_request_id finds the job it made.
    again = _by_call(
        list(zone.stub.SubmitAndWatchMany(iter([_call(5, "print(1)", "many-1")]), timeout=30))
    )
    assert again[5][0].event.job.job_id == by_call[1][0].event.job.job_id
    assert again[5][-1].last and again[5][-1].event.job.state == zone_pb2.JOB_SUCCEEDED


def test_calls_are_answered_while_others_run_and_a_half_close_ends_after_them(
    zone: Zone, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    requests = _Requests()
    stream = zone.stub.SubmitAndWatchMany(iter(requests), timeout=60)
    replies = (event for message in stream for event in message.events)
    requests.put(_call(1, gate_code(gate)))
    first = next(replies)
    assert first.call_id == 1 and not first.last
    job_id = first.event.job.job_id
    wait_for(lambda: zone.get(job_id).state == zone_pb2.JOB_RUNNING)
    requests.put(_call(2, "print('quick')"))
    seen: dict[int, list[zone_pb2.SubmitCallEvent]] = {}
    while not (seen.get(2) and seen[2][-1].last):
        event = next(replies)
        seen.setdefault(event.call_id, []).append(event)
    assert seen[2][-1].event.job.state == zone_pb2.JOB_SUCCEEDED
    assert all(not e.last for e in seen.get(1, []))  # call 1 still followed, still running
    assert zone.get(job_id).state == zone_pb2.JOB_RUNNING
    # Half-closed: call 1 is followed to its end, then the stream ends OK.
    requests.put(None)
    gate.touch()
    rest = list(replies)
    assert [e.call_id for e in rest] == [1] * len(rest) and rest[-1].last
    assert rest[-1].event.job.state == zone_pb2.JOB_SUCCEEDED
    assert stream.code() == grpc.StatusCode.OK


def test_a_call_id_still_in_hand_ends_the_stream_naming_the_field(
    zone: Zone, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    requests = _Requests()
    stream = zone.stub.SubmitAndWatchMany(iter(requests), timeout=60)
    requests.put(_call(1, gate_code(gate), request_id="dup-1"))
    first = next(iter(stream)).events[0]
    requests.put(_call(1, "print('again')"))
    try:
        for _ in stream:
            pass
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "call_id" in (exc.details() or "")
    else:
        raise AssertionError("the stream ended OK")
    finally:
        requests.put(None)
    # The first call's job was durable before its answer: it runs on to its end.
    gate.touch()
    wait_for(lambda: zone.get(first.event.job.job_id).state == zone_pb2.JOB_SUCCEEDED)
