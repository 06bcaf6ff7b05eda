"""`laminar submit` rides out a router restart (the request id makes a resend safe) and
runs the command where it was submitted from."""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
from waiting import wait_for

from laminar_api.v1 import zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster
from laminar_cli.main import main as cli_main
from laminar_cli.zoneclient import RETRY_SECONDS, ResendWhileUnavailable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_submit_retries_while_the_router_restarts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{_free_port()}"
    with LocalCluster(tmp_path / "run") as cluster:
        zone = cluster.start_zone("a", listen=address)
        zone.process.send_signal(signal.SIGKILL)
        zone.process.wait(10)
        codes: list[int] = []
        monkeypatch.chdir(tmp_path)
        submitter = threading.Thread(
            target=lambda: codes.append(cli_main(["--zone", address, "submit", "--", "true"]))
        )
        submitter.start()
        cluster.start_zone("a", listen=address)  # back while the CLI is retrying
        submitter.join(60)
        assert codes == [0]
        captured = capsys.readouterr()
        job_id = captured.out.strip().splitlines()[-1]
        # While it waited, the submitter was told why nothing happened, once, on stderr.
        assert captured.err.count(f"router at {address} is unavailable; retrying") == 1
        with grpc.insecure_channel(address) as channel:
            stub = zone_pb2_grpc.ZoneStub(channel)
            wait_for(lambda: bool(stub.ListJobs(zone_pb2.ListJobsRequest(), timeout=5).jobs))
            job = stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), timeout=5)
        assert job.spec.workdir == str(tmp_path)
        assert len(stub_jobs(address)) == 1


def stub_jobs(address: str) -> list[zone_pb2.Job]:
    with grpc.insecure_channel(address) as channel:
        return list(
            zone_pb2_grpc.ZoneStub(channel).ListJobs(zone_pb2.ListJobsRequest(), timeout=5).jobs
        )


def test_job_and_cancel_retry_while_the_router_restarts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing jobs, reading one and cancelling it are idempotent, so they resend while the
    router is down."""
    address = f"127.0.0.1:{_free_port()}"
    monkeypatch.chdir(tmp_path)
    with LocalCluster(tmp_path / "run") as cluster:
        zone = cluster.start_zone("a", listen=address)
        assert cli_main(["--zone", address, "submit", "--", "sleep", "600"]) == 0
        job_id = capsys.readouterr().out.strip().splitlines()[-1]
        zone.process.send_signal(signal.SIGKILL)
        zone.process.wait(10)
        codes: list[int] = []

        def job_then_cancel() -> None:
            codes.append(cli_main(["--zone", address, "jobs", "-o", "json"]))
            codes.append(cli_main(["--zone", address, "job", job_id, "-o", "json"]))
            codes.append(cli_main(["--zone", address, "cancel", job_id]))

        client = threading.Thread(target=job_then_cancel)
        client.start()
        cluster.start_zone("a", listen=address)  # back while the CLI is retrying
        client.join(60)
        assert codes == [0, 0, 0]
        out = capsys.readouterr().out
        assert job_id in out and f"{job_id}: cancelled" in out


class _Outcome:
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


class _Details:
    def __init__(self, method: str) -> None:
        self.method = method


def _resend(
    method: str,
    codes: list[grpc.StatusCode],
    cap: float | None = None,
    notices: list[float] | None = None,
) -> tuple[int, list[float], Any]:
    """Drive the interceptor over outcomes ``codes``: (calls made, pauses, final outcome)."""
    pauses: list[float] = []
    calls = iter(codes)
    made = []

    def continuation(details: Any, request: Any) -> _Outcome:
        made.append(details.method)
        return _Outcome(next(calls))

    outcome = ResendWhileUnavailable(
        sleep=pauses.append,
        clock=lambda: sum(pauses),
        cap=cap,
        notice=(notices if notices is not None else []).append,
    ).intercept_unary_unary(continuation, _Details(method), object())
    return len(made), pauses, outcome


def test_safe_calls_resend_with_backoff_only_while_unavailable() -> None:
    down, up = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK
    made, pauses, outcome = _resend("/laminar.api.v1.Zone/ListAgents", [down, down, down, up])
    assert (made, outcome.code()) == (4, up)
    assert pauses == [0.2, 0.4, 0.8]
    # Another error is final at once; so is anything from a call that is not safe to repeat.
    made, _, outcome = _resend("/laminar.api.v1.Zone/GetJob", [grpc.StatusCode.NOT_FOUND])
    assert (made, outcome.code()) == (1, grpc.StatusCode.NOT_FOUND)
    for unsafe in ("ProbeJob", "CommitJob", "SubmitBatch", "InjectPressure"):
        made, pauses, outcome = _resend(f"/laminar.api.v1.Zone/{unsafe}", [down, up])
        assert (made, pauses, outcome.code()) == (1, [], down), unsafe


def test_resending_stops_within_the_budget() -> None:
    """The pauses never add up past the call's budget (they double up to 2 s)."""
    down = grpc.StatusCode.UNAVAILABLE
    for method, budget in RETRY_SECONDS.items():
        made, pauses, outcome = _resend(f"/laminar.api.v1.Zone/{method}", [down] * 100)
        assert outcome.code() == down and made == len(pauses) + 1
        assert max(pauses) == 2.0 and sum(pauses) <= budget, (method, pauses)


def test_the_wait_is_announced_once_and_capped_by_the_environment() -> None:
    down, up = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK
    notices: list[float] = []
    made, pauses, outcome = _resend("/laminar.api.v1.Zone/Submit", [down] * 3 + [up], None, notices)
    assert (made, outcome.code(), notices) == (4, up, [RETRY_SECONDS["Submit"]])
    # A router that answers at once is never announced.
    notices.clear()
    assert _resend("/laminar.api.v1.Zone/Submit", [up], None, notices)[0] == 1 and not notices
    # LAMINAR_RETRY_SECONDS caps the budget; 0 sends once and says nothing.
    notices.clear()
    made, pauses, outcome = _resend("/laminar.api.v1.Zone/Submit", [down] * 100, 1.0, notices)
    assert outcome.code() == down and sum(pauses) <= 1.0 and notices == [1.0]
    notices.clear()
    made, pauses, _ = _resend("/laminar.api.v1.Zone/GetJob", [down, up], 0.0, notices)
    assert (made, pauses, notices) == (1, [], [])


def test_retry_seconds_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No router listening: with LAMINAR_RETRY_SECONDS=0 the CLI says so without waiting;
    a value that is not seconds is a usage error naming the variable."""
    address = f"127.0.0.1:{_free_port()}"
    monkeypatch.setenv("LAMINAR_RETRY_SECONDS", "0")
    assert cli_main(["--zone", address, "jobs"]) == 3
    err = capsys.readouterr().err
    assert f"cannot reach {address}" in err and "retrying" not in err
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv("LAMINAR_RETRY_SECONDS", bad)
        assert cli_main(["--zone", address, "jobs"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("laminar: LAMINAR_RETRY_SECONDS=") and len(err.splitlines()) == 1


def test_submit_wait_follows_the_job_through_a_router_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`submit --wait` outlives a router SIGKILLed while it waits: it reconnects to the
    restarted router and ends with the job's end as recorded there (here a cancel made
    after the restart), exit 1 naming it; the job is neither lost nor submitted twice."""
    address = f"127.0.0.1:{_free_port()}"
    monkeypatch.chdir(tmp_path)
    with LocalCluster(tmp_path / "run") as cluster:
        zone = cluster.start_zone("a", listen=address)  # no agent: the job stays queued
        codes: list[int] = []
        waiter = threading.Thread(
            target=lambda: codes.append(
                cli_main(["--zone", address, "submit", "--wait", "--", "sleep", "600"])
            )
        )
        waiter.start()
        wait_for(lambda: len(stub_jobs(address)) == 1)
        (job,) = stub_jobs(address)
        zone.process.send_signal(signal.SIGKILL)
        zone.process.wait(10)
        assert waiter.is_alive()  # still waiting for the job, not failed on the lost stream
        cluster.start_zone("a", listen=address)
        with grpc.insecure_channel(address) as channel:
            zone_pb2_grpc.ZoneStub(channel).CancelJob(
                zone_pb2.CancelJobRequest(job_id=job.job_id), timeout=10
            )
        waiter.join(60)
        assert not waiter.is_alive() and codes == [1]
        captured = capsys.readouterr()
        assert captured.out.strip().splitlines()[-1] == job.job_id
        assert f"{job.job_id} cancelled" in captured.err, captured.err
        assert [j.job_id for j in stub_jobs(address)] == [job.job_id]
