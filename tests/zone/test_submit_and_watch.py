"""SubmitAndWatch through a real router and agents: one call submits a job and streams its
states to the end, with Submit's idempotency and input checks."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import grpc
import pytest
from waiting import gate_code, wait_for
from zonekit import TERMINAL, Zone

from laminar_api.v1 import common_pb2, zone_pb2


def _request(code: str, request_id: str = "") -> zone_pb2.SubmitRequest:
    return zone_pb2.SubmitRequest(
        spec=zone_pb2.JobSpec(
            command=[sys.executable, "-c", code], resources=common_pb2.Resources(gpus=1)
        ),
        client_request_id=request_id,
    )


def test_streams_the_submitted_job_to_its_terminal_state(zone: Zone) -> None:
    events = list(zone.stub.SubmitAndWatch(_request("print('streamed')"), timeout=30))
    jobs = [e.job for e in events]
    first = jobs[0]
    assert first.job_id.startswith("j-") and first.zone == "a"
    assert first.state not in TERMINAL  # Submit's answer: accepted, not ended
    assert {j.job_id for j in jobs} == {first.job_id}
    assert jobs[-1].state == zone_pb2.JOB_SUCCEEDED
    assert all(j.state not in TERMINAL for j in jobs[:-1])  # one terminal event, the last
    assert all(a != b for a, b in itertools.pairwise(jobs))  # no repeated record
    assert jobs[-1].placements[0].state == common_pb2.SUCCEEDED
    assert zone.get(first.job_id).state == zone_pb2.JOB_SUCCEEDED  # the router agrees


def test_first_event_is_the_durable_job_and_a_resend_streams_the_same_job(
    zone: Zone, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    request = _request(gate_code(gate), request_id="saw-1")
    stream = zone.stub.SubmitAndWatch(request, timeout=60)
    first = next(stream).job
    assert zone.get(first.job_id).job_id == first.job_id  # acknowledged: the router has it
    wait_for(lambda: zone.get(first.job_id).state == zone_pb2.JOB_RUNNING)
    again = zone.stub.SubmitAndWatch(request, timeout=60)
    resent_first = next(again).job
    assert resent_first.job_id == first.job_id  # the earlier job, not a second one
    gate.touch()
    rest = [e.job for e in stream]
    resent_rest = [e.job for e in again]
    assert rest[-1].state == zone_pb2.JOB_SUCCEEDED
    assert resent_rest[-1].state == zone_pb2.JOB_SUCCEEDED
    assert {j.job_id for j in rest + resent_rest} == {first.job_id}
    # The running job Submit answered is not sent again when the watch starts on it.
    resent = [resent_first, *resent_rest]
    assert all(a != b for a, b in itertools.pairwise(resent)), [j.state for j in resent]
    listed = zone.stub.ListJobs(zone_pb2.ListJobsRequest(), timeout=10).jobs
    assert sum(1 for j in listed if j.client_request_id == "saw-1") == 1


def test_a_resent_request_of_an_ended_job_streams_its_end_and_stops(zone: Zone) -> None:
    request = _request("print('once')", request_id="saw-ended")
    done = list(zone.stub.SubmitAndWatch(request, timeout=30))
    assert done[-1].job.state == zone_pb2.JOB_SUCCEEDED
    (again,) = list(zone.stub.SubmitAndWatch(request, timeout=30))
    assert again.job.job_id == done[0].job.job_id
    assert again.job.state == zone_pb2.JOB_SUCCEEDED


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (zone_pb2.JobSpec(resources=common_pb2.Resources(gpus=1)), "spec.command"),
        (
            zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpu_milli=5000)),
            "spec.resources.gpu_milli",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_keeps_nothing(
    zone: Zone, spec: zone_pb2.JobSpec, field: str
) -> None:
    before = len(zone.stub.ListJobs(zone_pb2.ListJobsRequest(), timeout=10).jobs)
    with pytest.raises(grpc.RpcError) as err:
        list(zone.stub.SubmitAndWatch(zone_pb2.SubmitRequest(spec=spec), timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (err.value.details() or "")
    assert len(zone.stub.ListJobs(zone_pb2.ListJobsRequest(), timeout=10).jobs) == before


def test_an_array_streams_its_own_record_until_every_element_ended(zone: Zone) -> None:
    request = zone_pb2.SubmitRequest(
        spec=zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1), array="0-2")
    )
    jobs = [e.job for e in zone.stub.SubmitAndWatch(request, timeout=30)]
    assert {j.job_id for j in jobs} == {jobs[0].job_id}  # the array's record, not an element's
    assert jobs[-1].state == zone_pb2.JOB_SUCCEEDED
    for index in range(3):
        assert zone.get(f"{jobs[0].job_id}_{index}").state == zone_pb2.JOB_SUCCEEDED
